"""How results reach the event loop: in batches, at most one wake of the
loop per iteration, not one ``call_soon_threadsafe`` (a self-pipe write and
a wake) per result. Counted, not timed."""

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
    wakes = iterations = 0
    call_soon_threadsafe, run_once = loop.call_soon_threadsafe, loop._run_once

    def counting_wakes(*args, **kwargs):
        nonlocal wakes
        wakes += 1
        return call_soon_threadsafe(*args, **kwargs)

    def counting_iterations():
        nonlocal iterations
        iterations += 1
        run_once()

    loop.call_soon_threadsafe = counting_wakes
    loop._run_once = counting_iterations
    try:
        await asyncio.wait_for(sessions[0].finish(), PATIENCE)
        await asyncio.wait_for(asyncio.gather(*readers), PATIENCE)
    finally:
        del loop.call_soon_threadsafe, loop._run_once
    assert {t.outcome for t in turns} == {"cancelled"}
    # Every pump cancelled and every reader resolved: 2 * n deliveries. A
    # wake is asked for only when the loop's mailbox has no drain pending,
    # so there is at most one per iteration of the loop (how many
    # iterations depends on how the kernel's threads interleave with the
    # loop, never on n); one call_soon_threadsafe per delivery made 2 * n.
    assert wakes <= iterations + 1, (wakes, iterations)


async def test_a_resolved_kernel_call_schedules_nothing_but_its_awaiter(kernel):
    # A bridged future's done callback only forwards a cancel; one the
    # kernel resolves has it taken off first, so that each kernel call costs
    # the loop one handle (the awaiting task's wake), not two.
    session = await kernel.register("s")
    loop = asyncio.get_running_loop()
    scheduled = []
    call_soon = loop.call_soon

    def counting(callback, *args, **kwargs):
        scheduled.append(type(callback).__name__)
        return call_soon(callback, *args, **kwargs)

    loop.call_soon = counting
    try:
        for _ in range(50):
            assert await session.state() == "registered"
        await kernel.sessions()
    finally:
        del loop.call_soon
    assert "CancelOnDone" not in scheduled, scheduled
    # Each awaiter's wake was counted: the check above looked at real
    # scheduling, not at a count that saw nothing.
    assert len(scheduled) >= 51, scheduled

