"""Where a client's request is served: one pure decision per request (DESIGN §16, "Routing").

Why a core: with many Mind nodes a request may be served by this node's registry, relayed to the
node holding its Hand over a node link, found by asking the live peers, read from the shared
history, or be unknown. Written as branches inside the dispatcher, those rules were spread over
seven request kinds and could not be driven by the simulation; here they are one function of what
the node knows when the request arrives (`Facts`), so the shell asks once and performs the answer.

The rules, in the order they are tried:

1. **Here first.** A run this node's registry holds, or an `exec` for a Hand connected here (or one
   already refused by a check made here: its refusal is recorded and answered here), is served here.
   Else a run this connection named (`Exec.run_id`: its client knows the id at once) whose
   admission still waits on a lookup: a `run get`, cancel or attach for it is decided again once
   the admission is done, never answered `unknown_run` for a run about to exist.
2. **One hop at most.** A request another node relayed here (`on_behalf_of`) is never relayed
   again: a node that no longer holds the Hand answers for itself (`hand_offline`, unknown run).
3. **A run relayed through this node** is served by that run's authority over the same link
   (`run get`, cancel, attach; a detach only by the connection attached through the link).
4. **An `exec`** for a Hand not here goes at once over an open link to the node last known to
   hold it; not known without asking, it is looked up (`Lookup`: the holder asked of the database,
   then the credentials table says offline or unknown).
5. **A run nobody here knows** is asked of the live peers (`AskPeers`); on one Mind, `run get`
   reads the history (an ended run of this Mind before a restart), and an attach is served here,
   where a run not presented yet is waited for (its Hand may be on its way).

After an asynchronous step (a lookup, a question to the peers) the shell calls `after_find` with
what it learned: the second half of the same rules, so no branch lives in the shell.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """The requests whose place of service depends on where a Hand or a run is."""

    EXEC = "exec"
    GET = "get_run"
    CANCEL = "cancel_run"
    ATTACH = "attach"
    DETACH = "detach"


class Route(enum.Enum):
    HERE = "here"
    """This node's registry serves it (or records and answers its refusal)."""
    RELAY = "relay"
    """Over the node link already known for it (the run relayed here earlier, the Hand's cached holder)."""
    LOOKUP = "lookup"
    """An exec for a Hand not here: ask who holds it, then the credentials (offline or unknown)."""
    ASK_PEERS = "ask_peers"
    """A run nobody here knows: each live peer is asked whether it holds it."""
    HISTORY = "history"
    """Read from the shared history: an ended run of another node, or of this Mind before a restart."""
    UNKNOWN = "unknown"
    """No node has it for this client: `unknown_run`."""
    AFTER_ADMISSION = "after_admission"
    """A run this connection named whose admission is under way: decided again once it is done."""


@dataclass(frozen=True)
class Facts:
    """What the node knows about a request's target when it arrives, read from its tables."""

    kind: Kind
    clustered: bool = False
    """Mind nodes share a database (a router exists)."""
    relayed: bool = False
    """Another node relayed this request here (`on_behalf_of`): never relayed again."""
    here: bool = False
    """The run is in this node's registry; for an exec: its Hand is connected here."""
    refused: bool = False
    """An exec already refused by a check made here (scope, fleet, budget): answered here."""
    routed: bool = False
    """The run was relayed through this node (its authority is the node at the link's end)."""
    link_ready: bool = False
    """An exec: the node last known to hold the Hand, its link open now."""
    attached_through_link: bool = False
    """A detach: this connection is the run's attachment through the link."""
    history: bool = False
    """A shared history can be read (many nodes, or one Mind's durable endings)."""
    admitting: bool = False
    """A run this connection named, its admission waiting on a lookup (`Route.AFTER_ADMISSION`)."""


def decide(f: Facts) -> Route:
    """Rules 1-5 of the module docstring, for the moment the request arrives."""
    if f.kind is Kind.EXEC:
        if f.here or f.refused:
            return Route.HERE
        if f.clustered and not f.relayed and f.link_ready:
            return Route.RELAY
        return Route.LOOKUP
    if f.here:
        return Route.HERE
    if f.admitting and f.kind is not Kind.DETACH:
        return Route.AFTER_ADMISSION
    if f.kind is Kind.DETACH:
        # A detach needs no answer from elsewhere: through the link only by the attached connection.
        return Route.RELAY if f.clustered and f.routed and f.attached_through_link else Route.HERE
    if f.clustered and not f.relayed:
        return Route.RELAY if f.routed else Route.ASK_PEERS
    if f.kind is Kind.ATTACH:
        return Route.HERE  # waited for here: its Hand may present it (DESIGN §15)
    if f.kind is Kind.GET and f.history:
        return Route.HISTORY
    return Route.UNKNOWN


def after_find(kind: Kind, found: bool, here: bool, history: bool) -> Route:
    """The second half, once the peers were asked (`found`: a live node holds the run, or holds
    its ending) and the registry looked at again (`here`: the run was presented here meanwhile)."""
    if found:
        return Route.RELAY
    if kind is Kind.ATTACH:
        return Route.HERE
    if here:
        return Route.HERE
    if kind is Kind.GET and history:
        return Route.HISTORY
    return Route.UNKNOWN


def after_lookup(holder: bool, client_here: bool, hand_here: bool, relayed: bool = False) -> Route:
    """An exec's lookup came back (`holder`: another live node holds the Hand): relayed there
    while the client is still connected and the Hand did not connect here meanwhile, unless the
    request was itself relayed here (one hop at most); otherwise admitted here, where the
    credentials say offline or unknown (or the Hand is now here)."""
    if holder and not relayed and client_here and not hand_here:
        return Route.RELAY
    return Route.HERE
