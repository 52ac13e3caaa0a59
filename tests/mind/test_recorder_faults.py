"""The recorder against a store that fails (issue 38, DESIGN §19): whatever the interleaving of
output, flushes, failed writes and the end, the stored recording verifies as one unbroken signed
chain, every byte relayed is either kept (in order, exact) or counted in a gap that says why, and
the listing and the signed end count what is kept. The store is the real `recordings.db`; its
failures are real `OSError`s raised before a write reaches it (a full disk, as the store sees one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mind.core.recording import Mode, events_of, verify
from mind.core.runs import Run
from mind.daemon.recorder import Recorder, Settings
from mind.store.recordings import Batch, SqliteRecordings
from protocol.messages import Exec, RunEnd, Streams
from protocol.states import RunState

KEY = b"q" * 32


class Failing:
    """The real store, with writes that fail while `failing` is set (nothing reaches the file)."""

    def __init__(self, store: SqliteRecordings) -> None:
        self.store = store
        self.failing = False

    async def write(self, batch: Batch) -> None:
        if self.failing:
            raise OSError(28, "No space left on device")
        await self.store.write(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def run_of(run_id: str) -> Run:
    return Run(run_id, "box", "exec", "", "c1", "q1", "ann", True, 10_000, 1000, 0.0, 100.0, 1000.0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("out"), st.sampled_from(["stdout", "stderr"]), st.binary(min_size=1, max_size=2000)),
        st.tuples(st.just("flush"), st.booleans()),
    ),
    max_size=40,
)


@given(ops, st.booleans())
def test_a_failing_store_leaves_a_whole_chain_and_counts_every_byte(tmp_path_factory, script, fail_at_end):
    path: Path = tmp_path_factory.mktemp("rec") / "recordings.db"

    async def go() -> tuple[list, dict, Any]:
        store = Failing(SqliteRecordings(path, KEY))
        cancelled: list[str] = []
        rec = Recorder(Settings(Mode.ALL), store, lambda run_id, why: cancelled.append(run_id))
        req = Exec(hand="box", tool="exec", args={"argv": ["cat"]}, timeout_ms=10_000, streams=Streams())
        run = run_of("r1")
        rec.begin(run, req, "ann")
        relayed: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        for op in script:
            if op[0] == "out":
                rec.output("r1", op[1], op[2])
                relayed[op[1]] += op[2]
            else:
                store.failing = op[1]
                await rec.flush()
        run.state = RunState.SUCCEEDED
        run.end = RunEnd(run_id="r1", state=RunState.SUCCEEDED, exit_code=0, hand="box", tool="exec")
        rec.on_log("run_terminal", {"run_id": "r1"}, run)
        store.failing = fail_at_end
        await rec.flush()
        store.failing = False
        for _ in range(3):  # the store is back: what failed is written again
            await rec.flush()
        blocks = await store.blocks("r1")
        listing = await store.listing("r1")
        await store.close()
        assert not cancelled  # without --record-strict a failing store cancels nothing
        return blocks, relayed, listing

    blocks, relayed, listing = asyncio.run(go())
    check = verify("r1", blocks, KEY, {"hand": "box", "client": "ann", "tool": "exec", "state": "succeeded"})
    assert check.ok and check.complete, check
    events = list(events_of(blocks))
    for name, sent in relayed.items():
        kept = [e[3] for e in events if e[1] == "o" and e[2] == name]
        gaps = [e for e in events if e[1] == "g" and e[2] == name]
        assert {g[4] for g in gaps} <= {"store"}
        assert sum(len(k) for k in kept) + sum(g[3] for g in gaps) == len(sent)
        # in order: each kept chunk is the relayed bytes at its place, each gap stands where its
        # bytes were (a failed write's chunk becomes a gap in its own place)
        pos = 0
        for e in events:
            if e[1] == "o" and e[2] == name:
                assert sent[pos : pos + len(e[3])] == e[3]
                pos += len(e[3])
            elif e[1] == "g" and e[2] == name:
                pos += e[3]
        assert pos == len(sent)
    end = next(e[3] for e in events if e[1] == "m" and e[2] == "end")
    kept_total = sum(len(e[3]) for e in events if e[1] == "o")
    assert end["recorded"] == kept_total and end["relayed"] == {k: len(v) for k, v in relayed.items() if v}
    assert listing is not None and listing.bytes == kept_total and listing.state == "succeeded"
