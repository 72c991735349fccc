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
