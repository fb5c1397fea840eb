"""Fair turns (engine/run/turns.py) as a simulation on one event loop: whatever the arrivals, no client holds more
than its bound, no slot is lost, every waiter is served, and a cancelled waiter takes nothing with it."""

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from lensapp.engine.run import turns
from lensapp.engine.run.turns import Admission, FairSlots, OverShare

arrivals = st.lists(st.tuples(st.sampled_from([None, "a", "b", "c"]), st.floats(0, 0.01), st.floats(0, 0.01),
                              st.booleans(), st.sampled_from([0, 10, 100, 4000])), min_size=1, max_size=40)


@given(arrivals, st.integers(1, 4), st.integers(1, 3))
def test_slots_are_bounded_and_every_waiter_is_served(plan, size, per_client):
    """...and at most one big part (100 cells or more here) holds a slot at any time, brief parts or not."""
    async def main():
        turns.BIG_PATIENCE = 0.005                                   # the arrivals' own scale (see the finally)
        slots = FairSlots(size, per_client, big_cells=100)
        most, served, cancelled, big = {}, [], 0, [0]

        async def part(i, client, hold, cells):
            async with slots.hold(client, cells, brief=i % 2 == 0):      # a brief lens may hold the big turn back
                assert slots.free >= 0 and slots.big <= 1
                big[0] += cells >= 100
                try:
                    assert big[0] <= 1
                    if client is not None:
                        most[client] = max(most.get(client, 0), slots.held[client])
                    await asyncio.sleep(hold)
                finally:
                    big[0] -= cells >= 100
                served.append(i)

        tasks = []
        for i, (client, gap, hold, cancel, cells) in enumerate(plan):
            tasks.append(asyncio.ensure_future(part(i, client, hold, cells)))
            await asyncio.sleep(gap)
            if cancel and i % 3 == 0:
                tasks[-1].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
        assert slots.free == size and not slots.held and slots.waiting() == 0 and slots.big == 0   # nothing lost
        assert all(n <= per_client for n in most.values()), most
        assert len(served) + cancelled == len(plan)

    patience = turns.BIG_PATIENCE
    try:
        asyncio.run(main())
    finally:
        turns.BIG_PATIENCE = patience


def admitted(admission: Admission, client: str | None) -> int:
    """The requests `admission` holds for `client` now."""
    with admission._lock:
        return admission._admitted[client]


def test_admission_refuses_a_client_over_its_share_and_not_the_host():
    a = Admission(per_client=2)
    a.enter("x")
    a.enter("x")
    try:
        a.enter("x")
        raise AssertionError("a third request was admitted")
    except OverShare as e:
        assert "2 requests" in str(e) and "\n" not in str(e)
    for _ in range(10):
        a.enter(None)
    a.leave("x")
    a.enter("x")
    assert admitted(a, "x") == 2 and admitted(a, None) == 10


def test_small_parts_pass_a_big_one_waiting_for_its_turn():
    """Two big parts from one client and a small one from another, on three slots: the second big part waits for
    the first; the small one, asked for after both, runs beside the first at once."""
    async def main():
        slots, order = FairSlots(3, 2, big_cells=100), []
        first_done = asyncio.Event()

        async def part(name, client, cells, hold):
            async with slots.hold(client, cells):
                order.append(name)
                if isinstance(hold, asyncio.Event):
                    await hold.wait()
                else:
                    await asyncio.sleep(hold)
            if name == "big0":
                first_done.set()

        gate = asyncio.Event()
        tasks = [asyncio.ensure_future(part("big0", "a", 4000, gate)),
                 asyncio.ensure_future(part("big1", "a", 4000, 0))]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.ensure_future(part("small", "b", 10, 0)))
        await asyncio.sleep(0.01)
        assert order == ["big0", "small"], order
        gate.set()
        await asyncio.gather(*tasks)
        assert order == ["big0", "small", "big1"]

    asyncio.run(main())


def test_a_free_big_turn_waits_for_a_brief_lens_running_but_not_longer_than_the_patience(monkeypatch):
    """When the big turn comes free while a small lens (one engine step) runs, the next big part waits for that
    lens, so the lens's step is not also the big part's; with the lens still running after BIG_PATIENCE, it goes."""
    monkeypatch.setattr(turns, "BIG_PATIENCE", 0.2)

    async def main(lens_hold):
        slots, order = FairSlots(4, 2, big_cells=100), []
        big0_go, lens_go = asyncio.Event(), asyncio.Event()

        async def part(name, client, cells, brief, gate):
            async with slots.hold(client, cells, brief):
                order.append((name, "in"))
                await gate.wait()
            order.append((name, "out"))

        tasks = [asyncio.ensure_future(part("big0", "a", 4000, False, big0_go)),
                 asyncio.ensure_future(part("big1", "b", 4000, False, asyncio.Event())),
                 asyncio.ensure_future(part("lens", "c", 10, True, lens_go))]
        await asyncio.sleep(0.01)
        big0_go.set()                                  # the big turn comes free while the lens runs
        await asyncio.sleep(lens_hold)
        lens_go.set()
        await asyncio.sleep(0.01)
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return [step for step in order if step[0] != "big0"]

    # the lens ends first (0.05 s): big1 starts only then
    assert asyncio.run(main(0.05)) == [("lens", "in"), ("lens", "out"), ("big1", "in")]
    # the lens runs past the patience (0.2 s): big1 starts beside it
    assert asyncio.run(main(0.4)) == [("lens", "in"), ("big1", "in"), ("lens", "out")]
