"""Fair turns (engine/run/turns.py) as a simulation on one event loop: whatever the arrivals, no client holds more
than its bound, no slot is lost, every waiter is served, and a cancelled waiter takes nothing with it."""

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from lensapp.engine.run.turns import Admission, FairSlots, OverShare

arrivals = st.lists(st.tuples(st.sampled_from([None, "a", "b", "c"]), st.floats(0, 0.01), st.floats(0, 0.01),
                              st.booleans()), min_size=1, max_size=40)


@given(arrivals, st.integers(1, 4), st.integers(1, 3))
def test_slots_are_bounded_and_every_waiter_is_served(plan, size, per_client):
    async def main():
        slots = FairSlots(size, per_client)
        most, served, cancelled = {}, [], 0

        async def part(i, client, hold):
            async with slots.hold(client):
                assert slots.free >= 0
                if client is not None:
                    most[client] = max(most.get(client, 0), slots.held[client])
                await asyncio.sleep(hold)
                served.append(i)

        tasks = []
        for i, (client, gap, hold, cancel) in enumerate(plan):
            tasks.append(asyncio.ensure_future(part(i, client, hold)))
            await asyncio.sleep(gap)
            if cancel and i % 3 == 0:
                tasks[-1].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
        assert slots.free == size and not slots.held and slots.waiting() == 0      # nothing lost
        assert all(n <= per_client for n in most.values()), most
        assert len(served) + cancelled == len(plan)

    asyncio.run(main())


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
    assert a.of("x") == 2 and a.of(None) == 10
