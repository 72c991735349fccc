"""Back-pressure: a turn whose reader is slow, or absent, slows its source,
as a Rust provider's stream is slowed (the kernel's `chunk_buffer`). The
pump stops pulling items once enough wait for the kernel, and goes on when
they are taken: memory never grows with what a fast source could give."""

from __future__ import annotations

import asyncio

from conftest import PATIENCE

#: Far above what the kernel lets wait (its chunk buffer and the pump's
#: own), far below what an unchecked pump pulls in the time it is given.
LIMIT = 2_000


async def test_a_turn_nobody_reads_stops_pulling_its_source_and_goes_on_when_read(kernel):
    session = await kernel.register("s")
    produced = 0

    async def fast():
        nonlocal produced
        while True:
            await asyncio.sleep(0)  # passes the loop, as a socket read would
            produced += 1
            yield "x"

    turn = await session.turn(fast())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    last = -1
    while produced != last:  # until the source stopped being pulled
        assert produced <= LIMIT, f"the pump pulled {produced} items nobody read"
        assert loop.time() < deadline, "the source never stopped being pulled"
        last = produced
        await asyncio.sleep(0.2)
    stalled = produced
    async with turn:
        read = 0
        async for _ in turn:
            read += 1
            if read == stalled + 100:
                break
    assert produced > stalled, "reading did not let the source go on"
    assert turn.outcome == "cancelled"


async def test_a_turn_nobody_reads_holds_a_few_large_chunks_not_a_count_of_them(kernel):
    # Chunks of 4 MiB: a bound in chunks alone (64 in the pump, 64 in the
    # kernel) let half a gigabyte wait for a reader that never came.
    session = await kernel.register("s")
    produced = 0
    big = "x" * (4 << 20)

    async def boulders():
        nonlocal produced
        while True:
            await asyncio.sleep(0)
            produced += 1
            yield big

    turn = await session.turn(boulders())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    last = -1
    while produced != last:
        assert loop.time() < deadline, "the source never stopped being pulled"
        last = produced
        await asyncio.sleep(0.3)
    # The pump's room and the kernel's take a chunk of this size each, or
    # two; one more is in the work's hands and one is being made.
    stalled = produced
    assert stalled <= 8, f"the pump pulled {stalled} chunks of 4 MiB nobody read"
    async with turn:
        read = 0
        async for chunk in turn:
            assert len(chunk.text) == len(big)
            read += 1
            if read == stalled + 3:
                break
    assert produced > stalled, "reading did not let the source go on"
    assert turn.outcome == "cancelled"
