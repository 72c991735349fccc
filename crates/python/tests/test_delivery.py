"""How results reach the event loop: in batches, one wake of the loop per
batch, not one ``call_soon_threadsafe`` (a self-pipe write and a wake) per
result. Counted, not timed."""

from __future__ import annotations

import asyncio

import settle
from conftest import PATIENCE


async def forever():
    while True:
        await asyncio.sleep(3600)
        yield "never"


async def test_a_subtree_teardown_wakes_the_loop_per_batch_not_per_session(kernel):
    n = 200
    sessions = [await kernel.register("root")]
    for i in range(1, n):
        sessions.append(await kernel.register(f"agent-{i}", sessions[(i - 1) // 10]))
    turns = await asyncio.gather(*(s.turn(forever) for s in sessions))

    async def read(turn):
        async for _ in turn:
            pass

    readers = [asyncio.create_task(read(t)) for t in turns]
    await asyncio.sleep(0.2)  # every pump is mid-stream

    loop = asyncio.get_running_loop()
    wakes = 0
    original = loop.call_soon_threadsafe

    def counting(*args, **kwargs):
        nonlocal wakes
        wakes += 1
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counting
    try:
        await asyncio.wait_for(sessions[0].finish(), PATIENCE)
        await asyncio.wait_for(asyncio.gather(*readers), PATIENCE)
    finally:
        del loop.call_soon_threadsafe
    assert {t.outcome for t in turns} == {"cancelled"}
    # Every pump cancelled and every reader resolved: 2 * n deliveries,
    # which arrive in a few batches (the exact number depends on how the
    # kernel's threads interleave with the loop, never on n).
    assert wakes < n // 4, wakes
