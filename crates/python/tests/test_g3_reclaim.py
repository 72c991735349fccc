"""G3 from Python: the kernel's sweepers reclaim idle sessions, never one
whose turn is running."""

from __future__ import annotations

import asyncio

import settle
from conftest import Stream


async def test_g3_the_lru_cap_evicts_an_idle_session_never_a_running_one(db):
    kernel = await settle.Kernel.open(db, lru_cap=2)
    try:
        busy = await kernel.register("busy")
        stream = Stream(["tick"], delay=0.02, forever=True)
        turn = await busy.turn(stream)
        await asyncio.wait_for(stream.first_item.wait(), 10)
        idle = await kernel.register("idle")
        await kernel.register("newcomer")  # over the cap of 2
        assert await asyncio.wait_for(idle.finalized(), 10) == "lru_evict"
        assert not busy.closed
        assert await busy.state() == "running"
        await turn.aclose()
    finally:
        await kernel.shutdown(0.0)
