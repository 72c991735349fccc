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


async def test_by_default_no_session_a_program_holds_is_reclaimed_behind_its_back(db):
    """A Python program registers its sessions and ends them itself: the
    gateway's reclaimers (the LRU cap of 1,000 open sessions, the 30-minute
    idle reap) are off unless asked for, so the first of 1,001 sessions,
    idle between two turns, is still there for its next turn."""
    kernel = await settle.Kernel.open(db)
    try:
        first = await kernel.register("first")
        async with await first.turn(Stream(["one"])) as turn:
            assert [c.text async for c in turn] == ["one"]
        for i in range(1000):
            await kernel.register(f"agent-{i}")
        assert not first.closed
        assert await first.state() == "registered"
        async with await first.turn(Stream(["two"])) as turn:
            assert [c.text async for c in turn] == ["two"]
        assert turn.outcome == "completed"
    finally:
        await kernel.shutdown(0.0)
