"""The exceptions mindhand raises on purpose, and the one decoding untrusted input may raise.

Every exception class defined in `protocol`, `mind` and `hand` derives from `MindhandError`, so an
embedder (or a shell's last-resort guard) tells a refusal or a known failure of ours, which carries
a sentence a user can act on, from a bug, which carries a traceback. A test imports every module
and checks (`tests/protocol/test_error_hierarchy.py`). Some keep a second base because callers catch
them by it (`ValueError`).

    MindhandError
    ├── ProtocolError(code, message)   protocol/errors.py          a peer sent something we refuse
    │   └── PayloadRefused             protocol/envelope.py        its envelope in order, its payload refused unbuilt: answered
    ├── IllegalTransition              protocol/states.py          a state rule broken: a bug, not a peer's doing
    ├── RunAborted                     protocol/control.py         not an error: a run must stop at a checkpoint
    │   └── BudgetExceeded
    ├── ConfigError (ValueError)       protocol/io/settings.py     a setting the operator must fix
    ├── TLSConfigError (ValueError)    protocol/io/tls.py          a certificate, key, CA or pin unusable
    ├── TreeFrameError (ValueError)    protocol/treestream.py      a tree's stream (`mind cp -r`) that is not well formed
    ├── ClientError(code, message)     mind/errors.py              a client call could not be made or answered
    │   ├── RunFailed                  mind/client/run.py          a run that did not succeed, for `call`
    │   ├── EmptySelection             mind/client/fleet.py        a fleet selector that matches no Hand
    │   ├── CopyError                  mind/client/files.py        a copy (`mind cp`) that failed, was refused or lost
    │   └── ForwardError               mind/client/forward.py      a forward (`mind forward`) that could not be set up
    ├── StillRunning                   mind/client/run.py          not an error: a wait bound passed, the run goes on detached
    ├── Quit                           mind/cli/recordings.py      not an error: `q` during `mind play`
    ├── SelectorError                  mind/core/selector.py       a fleet selector or label that does not parse
    ├── LimitError                     mind/core/fleet.py          a --max-concurrency / --max-errors that is not N or P%
    ├── WsError, Invalid               mind/client/                the fast path: transport, reply checks
    ├── LocalRefused                   mind/client/localfs.py      this machine's side of a download refused or failed
    ├── StoreError                     mind/store/credentials.py   a credential change the store refuses
    ├── StoreUnavailable               mind/store/api.py           the shared database did not answer in time or is gone
    │   ├── NotLive                    mind/store/api.py           this node's lease passed: it claims and starts nothing
    │   └── Fenced                     mind/store/api.py           a write about a Hand another node claimed since: not written
    ├── SchemaTooNew                   mind/store/api.py           the database was migrated by a newer Mind: refused at start
    ├── RecordingKeyError              mind/store/recordings.py    the key that signs recordings cannot be read or is not private
    ├── CannotOpen                     mind/daemon/server.py       `mind serve` cannot open its state: the sentence and exit code
    ├── CommandFailed(message, code)   mind/commandline.py         a daemon's admin command could not do what it was asked
    ├── Refusal(status, error, message) mind/mcp/bearers.py        `mind mcp --listen` answered a request without a tool
    ├── OverBudget                     mind/mcp/budget.py          a run `mind mcp` will not follow: over its byte budget
    ├── FaultProxyError (RuntimeError) mind/testing/faultproxy/    the fault proxy refused a command or cannot be reached
    │   └── CommandError (ValueError)                              a command line it cannot perform
    ├── MindRefused(code, message)     hand/aio/agent.py           the Mind sent an `error` frame
    ├── PermanentError                 hand/aio/agent.py           a configuration error no retry heals: exit 2
    ├── Refusal(code, message)         hand/system/tools.py        a run refused before anything ran
    ├── ToolFailed                     hand/system/tools.py        a tool ran and failed
    ├── PathRefused                    hand/system/paths.py        a path the Hand will not touch
    ├── CopyFailed                     hand/system/copy.py         a copy's file work failed (the run's `ToolFailed`)
    ├── Interrupted                    hand/aio/copyrun.py         a copy run stopped before its stream ended
    ├── OverCap (ValueError)           hand/system/sandbox.py      a limit above the Hand's cap
    │   └── NotEnforceable                                         a limit this host has no cgroup controller for
    ├── CgroupError (OSError)          hand/system/cgroups.py      a run's cgroup could not be set up
    ├── TaskStoreError                 hand/system/taskdb.py       the Hand's task database cannot be used
    └── NotThisUser (OSError)          hand/system/fsuser.py       a file call on a thread not acting as the run's user

What the shells do with them (DESIGN §4): a `ProtocolError` on a connection is answered with an
`error` frame and, for connection-level codes, a close. Anything else raised while serving one
request ends that request with `internal_error`, is logged with its type, message and traceback,
and never stops a daemon or drops an unrelated peer.
"""

from protocol.codes import ErrorCode


class MindhandError(Exception):
    """The base of every exception mindhand defines."""


class ProtocolError(MindhandError):
    """A peer sent something we refuse. Carries a code and a sentence a user can act on.

    The connection layer turns it into an `error` frame and, for connection-level codes, a close.
    The message must never echo the offending bytes back (they may hold secrets or be huge).
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
