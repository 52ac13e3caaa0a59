"""`mind.store.coalesce.Coalescer`: concurrent calls of one statement answered by one call of it,
each caller getting its own answer, its own error, or nothing if it gave up."""

from __future__ import annotations

import asyncio

import pytest

from mind.store.coalesce import Coalescer


class Db:
    """A statement that doubles its items and takes `delay` (a round trip); records every batch."""

    def __init__(self, delay: float = 0.01) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.fail: Exception | None = None
        self.started = asyncio.Event()

    async def run(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.started.set()
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return [i * 2 for i in items]


async def test_a_lone_call_goes_at_once_and_concurrent_ones_share_a_batch():
    db = Db()
    c = Coalescer(db.run, lanes=1)
    assert await c(1) == 2
    assert db.batches == [[1]]
    db.started.clear()
    first = asyncio.ensure_future(c(0))
    await db.started.wait()  # in flight: the next nine wait for it, then go together
    got = await asyncio.gather(*(c(i) for i in range(1, 10)))
    assert await first == 0 and got == [i * 2 for i in range(1, 10)]
    assert db.batches[1:] == [[0], list(range(1, 10))]


async def test_batches_are_bounded_and_keep_arrival_order():
    db = Db()
    c = Coalescer(db.run, lanes=1, max_batch=4)
    got = await asyncio.gather(*(c(i) for i in range(11)))
    assert got == [i * 2 for i in range(11)]
    assert db.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]


async def test_two_lanes_overlap():
    db = Db(delay=0.05)
    c = Coalescer(db.run, lanes=2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = asyncio.ensure_future(c(1))
    await db.started.wait()  # one lane in flight: the next call takes the second lane at once
    assert await c(2) == 4 and await first == 2
    assert db.batches == [[1], [2]]
    assert loop.time() - t0 < 0.095  # both in flight at once, not one after the other


async def test_items_with_one_distinct_key_never_share_a_batch():
    db = Db()
    c = Coalescer(db.run, lanes=1, distinct=lambda i: i % 3)
    got = await asyncio.gather(*(c(i) for i in range(7)))
    assert got == [i * 2 for i in range(7)]
    for b in db.batches:
        assert len({i % 3 for i in b}) == len(b)
    assert db.batches == [[0, 1, 2], [3, 4, 5], [6]]


async def test_an_error_reaches_every_caller_of_its_batch_and_the_next_batch_goes_on():
    db = Db()
    c = Coalescer(db.run, lanes=1)
    first = asyncio.ensure_future(c(0))
    await db.started.wait()
    db.fail = OSError("the database went away")
    failing = [asyncio.ensure_future(c(i)) for i in (1, 2)]
    with pytest.raises(OSError):
        await first
    for f in failing:
        with pytest.raises(OSError, match="went away"):
            await f
    db.fail = None
    assert await c(5) == 10


async def test_a_caller_that_gave_up_is_dropped_and_the_others_are_answered():
    db = Db(delay=0.05)
    c = Coalescer(db.run, lanes=1)
    first = asyncio.ensure_future(c(0))
    await db.started.wait()
    quitter = asyncio.ensure_future(c(1))
    stayer = asyncio.ensure_future(c(2))
    await asyncio.sleep(0)
    quitter.cancel()
    assert await first == 0 and await stayer == 4
    assert quitter.cancelled()
    assert db.batches == [[0], [2]]


async def test_a_wrong_number_of_answers_fails_every_caller_rather_than_hang_one():
    async def short(items: list[int]) -> list[int]:
        return items[:-1]

    c = Coalescer(short, lanes=1)
    with pytest.raises(RuntimeError, match="answered with"):
        await asyncio.wait_for(c(1), 5)


async def test_aclose_cancels_the_batch_in_flight_and_its_callers():
    db = Db(delay=10)
    c = Coalescer(db.run, lanes=1)
    calls = [asyncio.ensure_future(c(i)) for i in range(3)]
    await db.started.wait()
    await asyncio.wait_for(c.aclose(), 5)
    for f in calls:
        with pytest.raises(asyncio.CancelledError):
            await f
