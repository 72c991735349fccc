"""Seed 000: a root finishing while its children are mid-turn (G1, G4, G10).

strix closed the children's sessions underneath them on a clean finish; here
the root's finish cancels them, settles and finalizes them first."""

from __future__ import annotations

import asyncio

import pytest

import settle
from conftest import Stream, eventually


async def read_all(turn: settle.Turn) -> list:
    async with turn:
        return [chunk.text async for chunk in turn]


async def test_g1_root_finishing_cancels_children_mid_turn_and_finalizes_them_first(kernel):
    root = await kernel.register("root")
    children = [await root.child(f"child-{n}") for n in range(3)]
    streams = [Stream(["working"], delay=0.05, forever=True) for _ in children]
    turns = [await child.turn(stream) for child, stream in zip(children, streams)]
    readers = [asyncio.create_task(read_all(turn)) for turn in turns]
    for stream in streams:
        await asyncio.wait_for(stream.first_item.wait(), 10)

    assert await root.finish() == "completed"

    # When the root's finish returns, every child is already finalized.
    for child in children:
        assert child.closed
        assert await child.finalized() == "parent_finished"
    await asyncio.gather(*readers)
    assert [turn.outcome for turn in turns] == ["cancelled"] * 3
    await eventually(lambda: all(s.closes for s in streams), "every child's stream closed")
    assert [s.closes for s in streams] == [1, 1, 1]

    rows = {row["id"]: row for row in await kernel.sessions()}
    root_row = rows[root.id]
    for child in children:
        row = rows[child.id]
        assert row["state"] == "finalized"
        assert row["outcome"] == "cancelled"
        assert row["finalized_at"] <= root_row["finalized_at"]


async def test_g10_a_write_through_a_finished_child_raises_session_closed(kernel):
    root = await kernel.register("root")
    child = await root.child("child")
    turn = await child.turn(Stream(["x"], delay=0.05, forever=True))
    await root.finish()
    await turn.aclose()
    with pytest.raises(settle.SessionClosed):
        await child.turn(Stream())
    with pytest.raises(settle.SessionClosed):
        await child.child("grandchild")

    async def nothing() -> None:
        return None

    coroutine = nothing()
    with pytest.raises(settle.SessionClosed):
        await child.spawn(coroutine)
    # The refused coroutine was closed unawaited (no "never awaited" warning).
    await eventually(lambda: coroutine.cr_frame is None, "the coroutine closed")
    # Ending it again is a no-op that says so (G2).
    with pytest.raises(settle.AlreadyFinalized):
        await child.cancel()
    with pytest.raises(settle.AlreadyFinalized):
        await child.finish()
    assert await child.close() == "parent_finished"


async def test_g1_a_graceful_cancel_lets_the_childrens_turns_finish_before_the_root_closes(kernel):
    root = await kernel.register("root")
    children = [await root.child(f"child-{n}") for n in range(2)]
    streams = [Stream(["a", "b", "c"], delay=0.03) for _ in children]
    turns = [await child.turn(stream) for child, stream in zip(children, streams)]
    readers = [asyncio.create_task(read_all(turn)) for turn in turns]
    for stream in streams:
        await asyncio.wait_for(stream.first_item.wait(), 10)

    await root.cancel(immediate=False)

    # Each child's turn ran to its end, not cut at its first chunk.
    assert [await reader for reader in readers] == [["a", "b", "c"]] * 2
    assert [turn.outcome for turn in turns] == ["completed"] * 2
    assert await root.finalized() == "cancelled"
    rows = {row["id"]: row for row in await kernel.sessions()}
    for child in children:
        assert rows[child.id]["outcome"] == "completed"
        assert rows[child.id]["finalized_at"] <= rows[root.id]["finalized_at"]
