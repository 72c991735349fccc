"""Kernel calls as tasks of their own: what a framework does with the
awaitables of any asyncio library (``asyncio.create_task(child.finish())``
to end its children together, ``TaskGroup.create_task``), with the same
guarantees as awaiting them in place."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

import settle
from conftest import Stream, eventually


async def test_g1_children_finished_as_tasks_of_their_own_are_finalized_and_their_streams_closed(kernel):
    root = await kernel.register("root")
    children = [await root.child(f"c{i}") for i in range(3)]
    running = [Stream(["x"], delay=0.05, forever=True) for _ in children]
    turns = [await child.turn(stream, input="go") for child, stream in zip(children, running)]
    await eventually(lambda: all(stream.sent for stream in running), "every child streaming")
    finishing = [asyncio.create_task(child.finish()) for child in children]
    await asyncio.gather(*finishing)
    for child in children:
        assert [t["outcome"] for t in await child.transcript()] == ["cancelled"]
    await asyncio.create_task(root.finish())
    assert [await child.state() for child in children] == ["finalized"] * 3
    assert await root.state() == "finalized"
    for stream in running:
        await eventually(lambda: stream.closes, "a child's stream closed")
        assert stream.closes == 1
    with pytest.raises(settle.SessionClosed):
        await asyncio.create_task(children[0].turn(Stream(["y"])))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup is Python 3.11's")
async def test_g1_a_task_group_takes_kernel_calls(kernel):
    root = await kernel.register("root")
    async with asyncio.TaskGroup() as group:
        made = [group.create_task(root.child(f"c{i}")) for i in range(3)]
    children = [task.result() for task in made]
    assert [await child.state() for child in children] == ["registered"] * 3
    async with asyncio.TaskGroup() as group:
        for child in children:
            group.create_task(child.finish())
    assert [await child.state() for child in children] == ["finalized"] * 3


async def test_g5_cancelling_the_task_of_a_turn_start_cancels_the_turn_and_the_next_start_waits(kernel):
    """The task ``create_task`` made of a turn's start is that start's
    caller: cancelled, the turn it made is cancelled (its stream closed
    once), and the session's next turn, asked in the same step, waits for
    that turn's end instead of being refused."""
    session = await kernel.register("s")
    cancelled = 0
    for passes in (0, 1, 2) * 3:
        running = Stream(["x"], delay=0.05, forever=True)
        starting = asyncio.create_task(session.turn(running, input="go"))
        for _ in range(passes):
            await asyncio.sleep(0)
        if starting.done():
            # Started and handed over already: nothing left to cancel.
            await starting.result().aclose()
            continue
        starting.cancel()
        cancelled += 1
        async with await session.turn(Stream(["a", "b"]), input="again") as turn:
            assert [chunk.text async for chunk in turn] == ["a", "b"]
        assert turn.outcome == "completed"
        try:
            started = await starting
        except asyncio.CancelledError:
            pass
        else:
            await started.aclose()
        await eventually(lambda: running.closes or not running.sent, "the cancelled start's stream closed")
        assert running.closes <= 1
    assert cancelled >= 6, cancelled


async def test_one_call_run_by_several_tasks_gives_each_its_result(kernel):
    """A call is a future: several tasks made of it, at once or one after
    another, each get its result (or its error), as several awaiting it do."""
    session = await kernel.register("s")
    call = session.state()
    together = await asyncio.gather(asyncio.create_task(call), asyncio.create_task(call))
    assert together == ["registered", "registered"]
    assert await asyncio.create_task(call) == "registered"
    assert await call == "registered"
    await session.finish()
    failing = session.finish()
    for _ in range(2):
        with pytest.raises(settle.AlreadyFinalized):
            await asyncio.create_task(failing)


async def _read_through(session, mode, stream):
    """A reader that awaits its turn's start through `mode`, as frameworks do."""
    if mode == "wait_for":
        turn = await asyncio.wait_for(session.turn(stream, input="go"), 10)
    elif mode == "create_task":
        turn = await asyncio.create_task(session.turn(stream, input="go"))
    elif mode == "task_group":
        async with asyncio.TaskGroup() as group:
            started = group.create_task(session.turn(stream, input="go"))
        turn = started.result()
    else:
        turn = await session.turn(stream, input="go")
    async with turn:
        async for _ in turn:
            pass


@pytest.mark.parametrize("mode", ["direct", "wait_for", "create_task", "task_group"])
async def test_g5_stop_then_next_through_cancel_turn_whatever_holds_the_turn(kernel, mode):
    """A chat's "stop" then the next message, where the stopped turn is held
    by a wrapper the session's owner does not reach (a task, a TaskGroup,
    wait_for): ``cancel_turn()``, called (not even awaited) before the next
    ``turn(...)``, stops the running turn and any start in flight, so the
    next turn waits for its end and is never refused ``TurnRunning``."""
    if mode == "task_group" and sys.version_info < (3, 11):
        pytest.skip("asyncio.TaskGroup is Python 3.11's")
    session = await kernel.register("chat")
    streams = []
    for passes in (0, 1, 2, 3, 5, 8) * 4:
        running = Stream(["x"], delay=0.005, forever=True)
        streams.append(running)
        reader = asyncio.create_task(_read_through(session, mode, running))
        for _ in range(passes):
            await asyncio.sleep(0)
        reader.cancel()
        stopping = session.cancel_turn()
        async with await session.turn(Stream(["a", "b"]), input="next") as turn:
            assert [chunk.text async for chunk in turn] == ["a", "b"]
        assert turn.outcome == "completed"
        assert await stopping in (True, False)
        with contextlib.suppress(asyncio.CancelledError, settle.Cancelled):
            await reader
    for stream in streams:
        await eventually(lambda: stream.closes or not stream.sent, "a stopped turn's stream closed")
        assert stream.closes <= 1
    outcomes = [t["outcome"] for t in await session.transcript()]
    assert outcomes.count("completed") == 24, outcomes
    assert set(outcomes) <= {"completed", "cancelled"}, outcomes


async def test_a_turn_asked_while_the_one_before_runs_raises_turn_running(kernel):
    session = await kernel.register("s")
    running = await session.turn(Stream(["x"], delay=0.01, forever=True), input="go")
    with pytest.raises(settle.TurnRunning, match="cancel_turn"):
        await session.turn(Stream(["y"]), input="again")
    assert await session.cancel_turn() is True
    assert await session.cancel_turn() is False
    async with await session.turn(Stream(["y"]), input="again") as turn:
        assert [chunk.text async for chunk in turn] == ["y"]
    await running.aclose()
    assert running.outcome == "cancelled"
    await session.finish()
    with pytest.raises(settle.AlreadyFinalized):
        await session.cancel_turn()
