"""The Mind's answers that only read: the run history (`list_runs`), the Hands (`list_hands`,
`select_hands`) and the one-screen `status`.

Every answer is one bounded frame whatever the fleet (`mind.core.paging`: pages bounded in count
and bytes, cursors that never repeat an item), and shows only what the client's scope allows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import structlog

from mind.core import runlist, selector
from mind.core.admission import touch_denial
from mind.core.paging import PAGE_ITEMS, page
from mind.core.runs import Run
from mind.core.scope import Scope
from mind.daemon.host import VERSION, Host
from mind.daemon.peer import Peer
from mind.store.credential_rows import CredentialRow
from protocol.codes import ErrorCode
from protocol.envelope import payload_size
from protocol.errors import MindhandError
from protocol.messages import (
    ConnectedNames,
    Error,
    HandClaims,
    HandInfo,
    HandsList,
    HandsSelected,
    ListHands,
    ListRuns,
    RunList,
    SelectedHand,
    SelectHands,
    StatusReply,
    WhichConnected,
)
from protocol.states import RUN_TERMINAL, RunState

log = structlog.get_logger(component="mind")

STATUS_LIST_MAX = 50
MATCH_ON_LOOP_MAX = 500
"""Hand rows a selector is matched against on the loop; more go to a thread (issue 23)."""
STATUS_FAILURES = 10
STATUS_LIST_BYTES = 256 << 10
"""Each list of `status` is cut at these (count, bytes), so the reply stays one bounded frame."""
FAILURE_STATES = RUN_TERMINAL - {RunState.SUCCEEDED}
UNKNOWN_NODES = "(the other nodes: the shared database did not say which are live)"
"""`missing_nodes` of a listing when the database could not name the live nodes to ask."""


class Views:
    def __init__(self, mind: Host) -> None:
        self.mind = mind

    def list_runs(self, peer: Peer, id_: str, msg: ListRuns) -> None:
        """One page of run history, newest first, bounded in count and bytes (`mind.core.paging`);
        the cursor is the admission number of the last run sent, so pages never repeat a run."""
        if msg.after is not None and not (msg.after.isascii() and msg.after.isdigit()):
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message="after: not a cursor of run_list"), id_)
            return
        scope, me = peer.scope, peer.ident.label
        before = None if msg.after is None else int(msg.after)
        runs = (
            (r, r.info())
            for r in self.mind.registry.history(msg.hand, msg.state, msg.since, before, msg.fleet)
            if scope.allows_hand(r.hand) and scope.may_touch(r.owner, me) and (not msg.unattended or unattended(r))
        )
        taken, more = page(runs, msg.limit, lambda item: payload_size(item[1]))
        cursor = str(taken[-1][0].seq) if more and taken else None
        peer.outbox.put(RunList(runs=[info for _, info in taken], next_after=cursor), id_)

    async def list_runs_of_nodes(self, peer: Peer, id_: str, msg: ListRuns, me: str) -> None:
        """`mind runs` with Mind nodes sharing a database (DESIGN §16): one page of every live
        node's runs, newest first, each run once (`mind.core.runlist`: the order and the cursor
        every node understands, and the merge). The other nodes are asked at once, each for the
        client (`on_behalf_of`) and bounded (`Router.ask`); one that does not answer is named in
        `missing_nodes`, never silently left out. A request another node relayed is answered from
        this node's own runs, under the client's scope read from the shared credentials (the
        client's owner rule, `read_others` included), and never relayed again."""
        m = self.mind
        assert m.router is not None and m.nodes is not None
        after = None if msg.after is None else runlist.parse_cursor(msg.after)
        if msg.after is not None and after is None:
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message="after: not a cursor of run_list"), id_)
            return
        scope = peer.scope
        if msg.on_behalf_of is not None:  # read as the door reads it (no stored scope: full)
            scope = Scope.from_json(await m.creds(m.store.scope, "client", me))
        mine = self._node_page(msg, scope, me, after, m.nodes.name)
        if msg.on_behalf_of is not None:
            last = runlist.cursor(mine.runs[-1]) if mine.more and mine.runs else None
            peer.outbox.put(RunList(runs=mine.runs, next_after=last), id_)
            return
        try:
            others = await m.router.nodes.peers(m.router.lease)
        except MindhandError as exc:
            log.warning("run_list_partial", node=None, error=str(exc))
            others, unknown = [], [UNKNOWN_NODES]
        else:
            unknown = []
        question = msg.model_copy(update={"on_behalf_of": me, "limit": min(msg.limit, PAGE_ITEMS)})
        answers = await asyncio.gather(*(m.router.ask(peer, url, question, me) for _, url in others))
        pages, missing = [mine], unknown
        for (name, url), got in zip(others, answers, strict=True):
            if isinstance(got, RunList):
                pages.append(runlist.Page(got.runs, got.next_after is not None))
            else:
                missing.append(name)
                why = got.message if isinstance(got, Error) else "no answer in time"
                log.warning("run_list_partial", node=name, url=url, error=why)
        taken, more = runlist.merge(pages, msg.limit, payload_size)
        last = runlist.cursor(taken[-1]) if more and taken else None
        peer.outbox.put(RunList(runs=taken, next_after=last, missing_nodes=missing), id_)

    def _node_page(self, msg: ListRuns, scope: Scope, me: str, after: runlist.Key | None, node: str) -> runlist.Page:
        """This node's newest runs below `after` that match and that `me` may see, newest first by
        (created_at, run_id), each named with this node; bounded as every page."""
        runs = (
            r
            for r in self.mind.registry.history(msg.hand, msg.state, msg.since, None, msg.fleet)
            if scope.allows_hand(r.hand) and scope.may_touch(r.owner, me) and (not msg.unattended or unattended(r))
        )
        count = min(msg.limit, PAGE_ITEMS) + 1  # one more than a page holds: whether more follow
        chosen = runlist.newest(runs, lambda r: (r.created_wall, r.run_id), after, count)
        taken, more = page((r.info().model_copy(update={"node": node}) for r in chosen), msg.limit, payload_size)
        return runlist.Page(taken, more)

    async def run_from_history(self, peer: Peer, id_: str, run_id: str) -> None:
        """`run get` of a run this node does not hold: the shared database's history (DESIGN §16),
        under the same scope rule as a run held here (its Hand and its owner)."""
        m = self.mind
        assert m.history is not None
        found = await m.history.get(run_id)
        if found is None:
            peer.outbox.put(Error(code=ErrorCode.UNKNOWN_RUN, message=f"no run {run_id}"), id_)
            return
        owner, info = found
        denial = touch_denial(peer.scope, peer.ident.label, info.hand, owner, f"read run {run_id}", run_id=run_id)
        if denial is not None:
            why = m.deny(peer, denial.what, **denial.fields)
            peer.outbox.put(Error(code=ErrorCode.DENIED_BY_SCOPE, message=why), id_)
            return
        peer.outbox.put(info, id_)

    async def select_hands(self, peer: Peer, id_: str, msg: SelectHands) -> None:
        """A fleet selector resolved here, over the credential table (names and the operator's
        labels, read afresh, so `mind hand label` applies at once) and the live connections; only
        Hands in the client's scope can match (DESIGN §12). A Hand's claims play no part."""
        m = self.mind
        try:
            sel = selector.parse(msg.selector)
        except selector.SelectorError as exc:
            peer.outbox.put(Error(code=ErrorCode.INVALID_PAYLOAD, message=str(exc)), id_)
            return
        after, scope = msg.after, peer.scope
        needs_labels = sel.needs_labels

        rows = await m.creds(m.store.list, "hand")

        def candidates() -> list[tuple[str, int, dict[str, str]]]:
            """Off the loop: the rows matched (issue 23: thousands of Hands' labels)."""
            out = []
            for row in rows:
                if row.revoked_at is not None or (after is not None and row.label <= after):
                    continue
                if not scope.allows_hand(row.label):
                    continue
                labels = row.label_map() if needs_labels else {}
                if sel.matches(row.label, labels):
                    out.append((row.label, row.generation, labels or row.label_map()))
            return out

        found = await asyncio.to_thread(candidates) if len(rows) > MATCH_ON_LOOP_MAX else candidates()
        elsewhere = await self._held_elsewhere([name for name, _, _ in found if name not in m.hands])

        def matching() -> Iterator[SelectedHand]:
            for name, generation, labels in found:
                live = m.hands.get(name)
                gen = live.gen if live else generation
                up = live is not None or name in elsewhere
                yield SelectedHand(name=name, connected=up, generation=gen, labels=labels)

        hands = matching()
        taken, more = page(hands, msg.limit, payload_size)
        peer.outbox.put(HandsSelected(hands=taken, next_after=taken[-1].name if more and taken else None), id_)

    async def _held_elsewhere(self, names: list[str]) -> set[str]:
        """Which of `names` another live node holds (DESIGN §16: a fleet member, or any run, for
        them is relayed there, so they count as connected). Empty without routing or with the
        database away (they read as offline, as before routing)."""
        m = self.mind
        if m.router is None or not names:
            return set()
        try:
            return await m.router.nodes.held_elsewhere(names, m.router.lease)
        except MindhandError as exc:
            log.warning("held_elsewhere_unavailable", error=str(exc))
            return set()

    async def which_connected(self, peer: Peer, id_: str, msg: WhichConnected) -> None:
        """Which of the names are connected here or held by another live node, in the client's scope."""
        m = self.mind
        names = [n for n in dict.fromkeys(msg.names) if peer.scope.allows_hand(n)]
        elsewhere = await self._held_elsewhere([n for n in names if n not in m.hands])
        peer.outbox.put(ConnectedNames(names=[n for n in names if n in m.hands or n in elsewhere]), id_)

    async def list_hands(self, peer: Peer, id_: str, msg: ListHands) -> None:
        """One page of the Hands, by name (the cursor is the last name sent)."""
        after, scope = msg.after, peer.scope
        hands = await self.hand_infos(lambda name: scope.allows_hand(name) and (after is None or name > after))
        taken, more = page(hands, msg.limit, payload_size)
        peer.outbox.put(HandsList(hands=taken, next_after=taken[-1].name if more and taken else None), id_)

    async def status(self, peer: Peer, id_: str) -> None:
        """One screen, bounded whatever the fleet: the first Hands and the longest-running runs, with
        their totals; `mind hands` and `mind runs` page through the rest."""
        m = self.mind
        scope, me = peer.scope, peer.ident.label
        visible = lambda r: scope.allows_hand(r.hand) and scope.may_touch(r.owner, me)
        failed = (r.info() for r in m.registry.history() if r.state in FAILURE_STATES and visible(r))
        failures, _ = page(failed, STATUS_FAILURES, payload_size, STATUS_LIST_BYTES)
        active = [r for r in m.registry.active() if visible(r)]
        active_infos, _ = page((r.info() for r in active), STATUS_LIST_MAX, payload_size, STATUS_LIST_BYTES)
        all_hands = list(await self.hand_infos(scope.allows_hand))
        first = sorted(all_hands, key=lambda h: not h.connected)  # (stable: by name within each)
        hands = sorted(page(first, STATUS_LIST_MAX, payload_size, STATUS_LIST_BYTES)[0], key=lambda h: h.name)
        if scope.read_others and scope.hands == ("*",):
            counts = await m.db(m.snapshots.counts_by_state)
            stale = await m.db(m.snapshots.count_stale)
        else:  # a scoped client counts only the tasks it could list (issue 13)
            counts, stale = await m.db(
                m.snapshots.counts_visible,
                lambda hand, owner: scope.allows_hand(hand) and scope.may_touch(owner, me),
            )
        peer.outbox.put(
            StatusReply(
                version=VERSION,
                mind_id=m.mind_id,
                uptime_s=round(time.time() - m.started, 3),
                hands=hands,
                active_runs=active_infos,
                recent_failures=failures,
                task_counts=counts,
                stale_snapshots=stale,
                retained_runs=len(m.registry),
                hands_total=len(all_hands),
                hands_connected=sum(1 for h in all_hands if h.connected),
                active_runs_total=len(active),
                node=m.nodes.name if m.nodes is not None else None,
                nodes=await m.nodes.node_infos() if m.nodes is not None else None,
                recording=m.recorder.status() if m.recorder is not None else None,
            ),
            id_,
        )

    async def hand_infos(self, keep: Callable[[str], bool]) -> Iterator[HandInfo]:
        """The Hands whose names `keep` keeps, by name, each made only when it is taken: a page of
        1,000 out of 3,000 Hands built all 3,000 (12 ms a list, which a client pipelining lists
        turned into seconds of the loop). With Mind nodes sharing a database, those held by any live
        node are connected, and `node` names the holder."""
        m = self.mind
        held: dict[str, str] = await m.nodes.holders() if m.nodes is not None else {}
        rows = await m.creds(m.store.list, "hand")
        return (
            self._hand_info(row, held)
            for row in rows
            if (row.revoked_at is None or row.label in m.hands) and keep(row.label)
        )

    def _hand_info(self, row: CredentialRow, held: dict[str, str]) -> HandInfo:
        m = self.mind
        live = m.hands.get(row.label)
        claims: HandClaims | None = live.ident.claims if live else None
        node = m.nodes.name if live is not None and m.nodes is not None else held.get(row.label)
        return HandInfo(
            name=row.label,
            connected=live is not None or node is not None,
            generation=live.gen if live else row.generation,
            since=live.since if live else (m.last_seen.get(row.label) or row.last_seen_at),
            claims=claims,
            running=m.registry.running_on(row.label),
            labels=row.label_map(),
            node=node,
        )


def unattended(run: Run) -> bool:
    """A run still going with a leg away: nobody attached (detached, or its client gone), or its
    Hand away, while the Mind's resume window (or the detach's keep) lasts (DESIGN §15)."""
    return not run.terminal and (run.client_away_since is not None or run.hand_away_since is not None)
