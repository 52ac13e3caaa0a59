"""What a child process may see and use (DESIGN §9): its environment, its resource limits, its user.

The Hand's policy is final, and these are the parts of it that travel into the child itself:

Environment - scrubbed by default. A child sees only an allowlist of the Hand's own environment
(`DEFAULT_ENV_ALLOW`, extended by `hand run --env-allow NAME[,NAME...]`, where a trailing `*` is a
prefix glob such as `CI_*`), then the run's own `env` on top. Whatever the Hand was started with
(cloud keys, tokens, `SSH_AUTH_SOCK`...) stays out of commands a remote Mind asks for, unless the
operator names it. `--env-inherit` turns scrubbing off; it is unsafe and documented as such. Two
things are removed even then, and even with `--env-allow '*'`: every `MINDHAND_*` variable of the
Hand (its own configuration: the credential path, the Mind URL, the Mind's home) and any variable
whose value contains one of the Hand's secrets (the credential). The run's own `env` is the
caller's data, not the Hand's, so it always applies as given.

Resource limits - per run (`limits` in the `exec`/`shell` arguments), capped by the Hand
(`--max-cpu-seconds`, `--max-address-space`, `--max-open-files`, `--max-processes`). A request over
a cap is refused before anything runs; a limit the request leaves out while the Hand has a cap gets
the cap (a cap that could be dodged by omission would not be one). They are applied with
`setrlimit` in the child between `fork` and `exec` (a `preexec_fn`): see `rlimit_plan` for what
each one means and where it falls short. The CPU limit is also a budget for the whole process tree
(`hand.system.cputime`), which is what normally ends a run `budget_exhausted`.

Why `preexec_fn` at all: it is documented as unsafe with threads (the forked child may find a lock
held by a thread that does not exist there), and the Hand has threads (`asyncio.to_thread`).
Everything else the child needs is done by `subprocess` itself in C (`start_new_session`, `user`,
`group`, `extra_groups`), so the preexec function is used only when a run has rlimits or a cgroup
of its own, and it only writes `0` to descriptors opened beforehand (joining the cgroup) and calls
`resource.setrlimit` with values computed in the parent: no imports, no allocation-heavy work, no
locks of ours, which is as safe as a Python preexec function gets. Without either no preexec
function is passed, and `subprocess` keeps its fast `vfork` path.

User - `hand run --run-as USER` (only when the Hand runs as root): children run with that user's
uid, primary gid and supplementary groups (set by `subprocess` in the child, after the session and
before `exec`), and see HOME, USER and LOGNAME for that user and a standard PATH (`RUN_AS_PATH`), not
the Hand's (root's) own. What the Hand writes itself (its
database, task logs, files written by `write_file`) stays the Hand's: the file tools run inside the
Hand, with its privileges, confined by the root directory (`hand.system.paths`), not by the user. Nothing
is chowned: the root directory must already be usable by that user (search permission for `cwd`,
write permission where commands write).
"""

from __future__ import annotations

import os
import pwd
import resource
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from pydantic import BaseModel, ConfigDict, Field

from hand.core.forwards import DEFAULT_FORWARD_ALLOW
from hand.system.cgroups import NO_CGROUPS, CgroupHost, CgroupLimits
from protocol import limits
from protocol.errors import MindhandError

DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
)
RUN_AS_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The PATH of a `--run-as` child whose run sets none. Not the Hand's own: a Hand started from a
root shell carries root's PATH (`/root/.local/bin`, a venv's `bin` under /root, ...), and a directory
the user may not search makes `execvp` answer EACCES for a command that exists nowhere, so a missing
command would end 126 "Permission denied" instead of 127 (issue 24 item 4). This is the PATH login
gives an ordinary user; a run that needs more passes `env={"PATH": ...}`."""
HAND_PREFIX = "MINDHAND_"
"""The Hand's own configuration variables: never passed to a child."""


# --- environment --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvAllow:
    """Names a child may inherit from the Hand: exact names, and prefixes (from `NAME*`)."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def allows(self, name: str) -> bool:
        return name in self.names or any(name.startswith(p) for p in self.prefixes)

    def extended(self, other: EnvAllow) -> EnvAllow:
        return EnvAllow(self.names | other.names, tuple(dict.fromkeys(self.prefixes + other.prefixes)))


def parse_env_allow(items: Iterable[str]) -> EnvAllow:
    """`["CI_*,GITHUB_TOKEN", "FOO"]` -> names {GITHUB_TOKEN, FOO}, prefixes (CI_,). A `*` is only
    allowed at the end (a prefix glob); a lone `*` allows every name. Raises ValueError."""
    names: set[str] = set()
    prefixes: list[str] = []
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            stem = part[:-1] if part.endswith("*") else part
            if "*" in stem or "=" in stem or "\x00" in stem or any(c.isspace() for c in stem):
                raise ValueError(f"{part!r} is not an environment name (a '*' may only end a prefix, as in CI_*)")
            if part.endswith("*"):
                prefixes.append(stem)
            else:
                names.add(stem)
    return EnvAllow(frozenset(names), tuple(dict.fromkeys(prefixes)))


DEFAULT_ALLOW = parse_env_allow(DEFAULT_ENV_ALLOW)


# --- resource limits -----------------------------------------------------------------------------


class ResourceLimits(BaseModel):
    """The `limits` argument of `exec` and `shell`; every field optional, every value > 0.

    - `cpu_seconds`: CPU time (user + system) of the whole process tree, a budget: when it is spent
      the tree is killed and the run ends `budget_exhausted` (a background task: `failed`).
    - `address_space`: bytes of virtual memory per process (RLIMIT_AS).
    - `open_files`: file descriptors per process (RLIMIT_NOFILE).
    - `processes`: processes of the child's user (RLIMIT_NPROC; see `rlimit_plan`).
    - `memory`: bytes of memory the whole run uses (its cgroup's; not address space). Past it the
      kernel kills a process of the run, and the run ends `failed`, `out_of_memory`.
    - `pids`: processes and threads of the run at once (its cgroup's); a fork past it fails.
    - `cpus`: the run's CPU share (its cgroup's quota): 0.5 is half of one CPU.
    The last three need a cgroup per run (`hand.system.cgroups`): a host without the controller
    refuses them (`NotEnforceable`), never ignores them.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    cpu_seconds: int | None = Field(default=None, gt=0, le=366 * 86400)
    address_space: int | None = Field(default=None, gt=0, le=1 << 62)
    open_files: int | None = Field(default=None, gt=0, le=1 << 30)
    processes: int | None = Field(default=None, gt=0, le=1 << 30)
    memory: int | None = Field(default=None, ge=1 << 20, le=1 << 62)
    pids: int | None = Field(default=None, gt=0, le=1 << 22)
    cpus: float | None = Field(default=None, ge=0.01, le=4096, allow_inf_nan=False)

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in LIMIT_FLAGS)


LIMIT_FLAGS: dict[str, str] = {
    "cpu_seconds": "--max-cpu-seconds",
    "address_space": "--max-address-space",
    "open_files": "--max-open-files",
    "processes": "--max-processes",
    "memory": "--max-memory",
    "pids": "--max-pids",
    "cpus": "--max-cpus",
}
_UNITS = {
    "cpu_seconds": " s",
    "address_space": " bytes",
    "open_files": "",
    "processes": "",
    "memory": " bytes",
    "pids": "",
    "cpus": " CPUs",
}


class OverCap(MindhandError, ValueError):
    """A requested limit is above the Hand's cap. The message is safe to send."""


class NotEnforceable(OverCap):
    """A requested limit this host cannot enforce (no cgroup controller for it): refused, never
    silently ignored. The message is safe to send."""


def cgroup_limits(limits: ResourceLimits | None) -> CgroupLimits:
    """The part of a run's limits its cgroup enforces."""
    if limits is None:
        return CgroupLimits()
    return CgroupLimits(memory=limits.memory, pids=limits.pids, cpus=limits.cpus)


def effective_limits(requested: ResourceLimits | None, caps: ResourceLimits) -> ResourceLimits | None:
    """The limits a run gets: what it asked for, refused above a cap, and the cap where it asked
    for nothing. None when there is nothing to limit."""
    requested = requested or ResourceLimits()
    values: dict[str, int | float | None] = {}
    for name, flag in LIMIT_FLAGS.items():
        want, cap = getattr(requested, name), getattr(caps, name)
        if want is not None and cap is not None and want > cap:
            raise OverCap(
                f"limits.{name} of {want}{_UNITS[name]} is over this hand's cap of {cap}{_UNITS[name]} ({flag})"
            )
        values[name] = want if want is not None else cap
    limits = ResourceLimits(**values)  # type: ignore[arg-type]
    return None if limits.empty else limits


CPU_BACKSTOP_S = 1
"""RLIMIT_CPU is set this much above the tree budget: the tree-wide poll normally ends the run
first (SIGTERM to the group, a grace, SIGKILL; `stage` set), and the kernel's per-process limit only
catches a process the Hand was too starved to poll in time."""

RlimitPlan = tuple[tuple[int, tuple[int, int]], ...]


def _tighter(value: int, current: int) -> int:
    return value if current == resource.RLIM_INFINITY else min(value, current)


def rlimit_plan(limits: ResourceLimits | None) -> RlimitPlan:
    """The `setrlimit` calls for the child, computed in the parent (the child only applies them).

    Limits only ever tighten: soft and hard are the smaller of the request and the Hand's own, so
    a child never gets more than the Hand has (raising a hard limit needs privilege anyway).
    - RLIMIT_CPU: per process, soft at budget + CPU_BACKSTOP_S (SIGXCPU), hard one second later
      (SIGKILL). A backstop only: the tree budget is enforced by polling (`hand.system.cputime`).
    - RLIMIT_AS: per process; an allocation past it fails (MemoryError in Python, ENOMEM in C), it
      does not kill. An `exec` whose image does not fit fails to start.
    - RLIMIT_NOFILE: per process; opening past it fails with EMFILE.
    - RLIMIT_NPROC: counts ALL processes of the child's real user, not just this tree. So it is
      meaningful with `--run-as` (a dedicated user); without it, it counts the Hand's user's
      processes too, and a user with CAP_SYS_RESOURCE/CAP_SYS_ADMIN (root) is not limited at all.
    """
    if limits is None:
        return ()
    wanted: list[tuple[int, int, int]] = []
    if limits.cpu_seconds is not None:
        soft = limits.cpu_seconds + CPU_BACKSTOP_S
        wanted.append((resource.RLIMIT_CPU, soft, soft + 1))
    if limits.address_space is not None:
        wanted.append((resource.RLIMIT_AS, limits.address_space, limits.address_space))
    if limits.open_files is not None:
        wanted.append((resource.RLIMIT_NOFILE, limits.open_files, limits.open_files))
    if limits.processes is not None:
        wanted.append((resource.RLIMIT_NPROC, limits.processes, limits.processes))
    plan = []
    for which, soft, hard in wanted:
        cur_soft, cur_hard = resource.getrlimit(which)
        hard = _tighter(hard, cur_hard)
        soft = min(_tighter(soft, cur_soft), hard)
        plan.append((which, (soft, hard)))
    return tuple(plan)


def _apply_rlimits(
    plan: RlimitPlan,
    cgroup_fds: tuple[int, ...],
    setrlimit: Callable[[int, tuple[int, int]], None],
    write: Callable[[int, bytes], int],
) -> None:
    """Runs in the forked child, before `exec`: enter the run's cgroup (writes to descriptors the
    parent opened: `hand.system.cgroups`), then the prepared `setrlimit` calls. Nothing else."""
    for fd in cgroup_fds:
        write(fd, b"0")
    for which, pair in plan:
        setrlimit(which, pair)


def preexec_for(plan: RlimitPlan, cgroup_fds: tuple[int, ...] = ()) -> Callable[[], None] | None:
    """The `preexec_fn` applying `plan` and joining the run's cgroup, or None when there is nothing
    to do (no preexec function at all: see the module docstring)."""
    if not plan and not cgroup_fds:
        return None
    return partial(_apply_rlimits, plan, cgroup_fds, resource.setrlimit, os.write)


# --- user ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAs:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def popen_args(self) -> dict[str, object]:
        """What `subprocess` needs to switch the child to this user. `extra_groups` is always
        passed (possibly empty): otherwise the child would keep root's supplementary groups."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def lookup_user(name: str) -> RunAs:
    """The user named `name` (or a numeric uid), with its primary and supplementary groups.
    Raises ValueError for an unknown user."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise ValueError(f"unknown user {name!r}") from None
        try:
            pw = pwd.getpwuid(int(name))
        except KeyError:
            raise ValueError(f"unknown user id {name}") from None
    try:
        groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    except OSError:
        groups = (pw.pw_gid,)
    return RunAs(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, groups=groups, home=pw.pw_dir or "/")


# --- the whole policy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    """The Hand's sandbox policy for every child it starts (foreground runs and background tasks)."""

    env_allow: EnvAllow = DEFAULT_ALLOW
    """The full allowlist (the defaults included)."""
    env_inherit: bool = False
    """UNSAFE: pass the Hand's whole environment (still without MINDHAND_* and secrets)."""
    caps: ResourceLimits = field(default_factory=ResourceLimits)
    run_as: RunAs | None = None
    secrets: tuple[str, ...] = ()
    """Values that must never reach a child (the credential's secret, in hex)."""
    max_upload_bytes: int | None = None
    """The largest file `put_file` (`mind cp`) accepts; a larger one is refused before any write."""
    max_output_bytes: int = limits.OUTPUT_LIMIT_DEFAULT
    """`hand run --output-limit`: what a client's `output_limit` is capped at (issue 23)."""
    cgroups: CgroupHost = NO_CGROUPS
    """Where runs get a cgroup of their own (`hand.system.cgroups`), as found at start."""
    forward_allow: tuple[str, ...] = DEFAULT_FORWARD_ALLOW
    """`hand run --forward-allow`: where `forward` runs (`mind forward`) may connect."""

    def child_env(self, extra: Mapping[str, str] | None, parent: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a child: the allowed part of `parent` (the Hand's own environment,
        read now), the run-as identity, then the run's `extra` on top."""
        env = self._inherited() if parent is None else self._allowed(parent)
        if self.run_as is not None:
            env.update(HOME=self.run_as.home, USER=self.run_as.name, LOGNAME=self.run_as.name, PATH=RUN_AS_PATH)
        if extra:
            env.update(extra)
        return env

    def _allowed(self, parent: Mapping[str, str]) -> dict[str, str]:
        return {
            k: v
            for k, v in parent.items()
            if not k.startswith(HAND_PREFIX)
            and (self.env_inherit or self.env_allow.allows(k))
            and not any(s and s in v for s in self.secrets)
        }

    def _inherited(self) -> dict[str, str]:
        """`_allowed(os.environ)`, as of now, computed again only when the Hand's environment
        changed: reading `os.environ` decodes every name and value, and with the filter it was
        ~0.1 ms of every run's admission. The check is a comparison of the raw environment with
        the copy the answer was made from (bytes, no decoding)."""
        raw = getattr(os.environ, "_data", None)
        if not isinstance(raw, dict):
            return self._allowed(os.environ)
        cached = self.__dict__.get("_inherited_from")
        if cached is not None and cached[0] == raw:
            return dict(cached[1])
        env = self._allowed(os.environ)
        object.__setattr__(self, "_inherited_from", (dict(raw), env))  # a cache, not a field
        return dict(env)

    def limits_for(self, requested: ResourceLimits | None) -> ResourceLimits | None:
        """Raises `OverCap` (`NotEnforceable` for a limit this host has no cgroup controller for)."""
        granted = effective_limits(requested, self.caps)
        why = self.cgroups.refusal(cgroup_limits(granted))
        if why is not None:
            raise NotEnforceable(why)
        return granted
