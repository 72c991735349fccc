"""G3 from Python: the kernel's sweepers reclaim idle sessions, never one
whose turn is running."""

from __future__ import annotations

import asyncio

import pytest

import settle
from conftest import PATIENCE, Stream


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


async def test_g3_the_lru_cap_evicts_only_within_a_scope(db):
    """A program serving several tenants names each session's scope: at
    the cap a tenant's new session evicts only that tenant's idle ones
    (children are in their parent's scope), and raises rather than end
    another tenant's."""
    kernel = await settle.Kernel.open(db, lru_cap=3)
    try:
        hers = await kernel.register("hers", scope="alice")
        her_child = await hers.child("her child")
        his = await kernel.register("his", scope="bob")
        # Bob at the cap: his own idle session goes, though Alice's are older.
        again = await kernel.register("his again", scope="bob")
        assert await asyncio.wait_for(his.finalized(), 10) == "lru_evict"
        await again.hold("input")
        with pytest.raises(settle.Error, match="cap"):
            await kernel.register("his third", scope="bob")
        with pytest.raises(settle.Error, match="cap"):
            await kernel.register("nobody's")
        assert not hers.closed and not her_child.closed
        # Alice's child is in her scope: her next session evicts it.
        await kernel.register("hers too", parent=hers)
        assert await asyncio.wait_for(her_child.finalized(), 10) == "lru_evict"
        assert not hers.closed
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


async def test_g3_a_registration_whose_task_was_cancelled_is_not_left_live(kernel):
    """Found from outside: a ``register()`` (or ``child()``) whose task was
    cancelled (``asyncio.wait_for``) still registered its session: the
    caller never had it, and it stayed live until shutdown (138 of 138).
    Cancelling the task cancels the call, as the README says: a session it
    made meanwhile is cancelled once made."""
    root = await kernel.register("root")
    held = [root]
    given_up = 0
    for n in range(200):
        call = kernel.register(f"s{n}") if n % 2 else root.child(f"c{n}")
        try:
            held.append(await asyncio.wait_for(call, timeout=0 if n % 3 else 0.0005))
        except asyncio.TimeoutError:
            given_up += 1
    assert given_up > 0
    mine = {s.id for s in held}

    async def left() -> set:
        rows = await kernel.sessions()
        return {r["id"] for r in rows if r["state"] != "finalized"}

    rows: set = set()

    async def settled() -> bool:
        nonlocal rows
        rows = await left()
        return rows == mine

    deadline = asyncio.get_running_loop().time() + PATIENCE
    while not await settled():
        assert asyncio.get_running_loop().time() < deadline, (sorted(rows - mine), given_up)
        await asyncio.sleep(0.05)
    for session in held[1:]:
        await session.finish()
    await root.finish()
