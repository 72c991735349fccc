"""A turn's next chunk read in a task of its own: ``Turn.__anext__`` gives
a coroutine, as the streams of ``openai`` and ``aiohttp`` do, so that
``asyncio.create_task(turn.__anext__())`` and ``create_task(anext(turn))``
run it as they run any coroutine, and the read keeps what every read
promises: the chunk the store has (G7), and a cancel of its task cancelling
the turn and closing its stream once (G4). Both reads are checked: one that
waits for the kernel, and one of a chunk already there."""

from __future__ import annotations

import asyncio
import sys

import pytest

import settle
from conftest import Stream, eventually
from test_waiting_chunks import is_waiting_chunk

HOWS = ["__anext__"] + (["anext"] if sys.version_info >= (3, 10) else [])


def next_of(turn: settle.Turn, how: str):
    return turn.__anext__() if how == "__anext__" else anext(turn)  # noqa: F821


async def a_read(turn: settle.Turn, waiting: bool, how: str, seen: list):
    """A read of ``turn`` (the chunks read before it noted in ``seen``), not
    awaited: of a chunk already there when ``waiting``, else one that waits
    for the kernel."""
    for _ in range(500):
        pending = next_of(turn, how)
        if is_waiting_chunk(pending) == waiting:
            return pending
        seen.append((await pending).text)
        await asyncio.sleep(0.01)
    raise AssertionError("no read of the kind asked for")


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("waiting", [False, True], ids=["waits", "waiting_chunk"])
async def test_g7_a_turns_next_chunk_runs_as_a_task_of_its_own(kernel, how, waiting):
    session = await kernel.register("s")
    items = [f"c{n}" for n in range(200)]
    stream = Stream(items, delay=0.0 if waiting else 0.05)
    async with await session.turn(stream) as turn:
        seen: list = []
        pending = await a_read(turn, waiting, how, seen)
        # As it takes the coroutine an openai stream's `__anext__` gives.
        reader = asyncio.create_task(pending)
        chunk = await asyncio.wait_for(reader, 10)
        assert chunk.text == items[len(seen)]
        seen.append(chunk.text)
        # The chunk it gave is the reply's, as one awaited is.
        assert turn.reply()["text"] == "".join(seen)
        # And the next read goes on from there.
        assert (await turn.__anext__()).text == items[len(seen)]
        assert turn.outcome is None
    assert stream.closes == 1


@pytest.mark.parametrize("waiting", [False, True], ids=["waits", "waiting_chunk"])
async def test_g4_cancelling_the_task_of_a_next_chunk_cancels_the_turn_and_closes_its_stream_once(kernel, waiting):
    session = await kernel.register("s")
    stream = Stream(["a"], forever=True, delay=0.001 if waiting else 0.5)
    turn = await session.turn(stream)
    seen: list = []
    pending = await a_read(turn, waiting, "__anext__", seen)
    reader = asyncio.create_task(pending)
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    # As for a reader awaiting it: the cancel cancels the turn, and the
    # chunk the read had is stored, never seen, and no part of the reply.
    await eventually(lambda: turn.outcome is not None, "the turn's end")
    assert turn.outcome == "cancelled"
    await eventually(lambda: stream.closes, "the stream's close")
    await asyncio.sleep(0.05)
    assert stream.closes == 1
    assert turn.reply()["text"] == "".join(seen)
    await session.close()


async def test_the_task_of_a_read_past_the_turns_end_raises_stop_async_iteration(kernel):
    session = await kernel.register("s")
    stream = Stream(["a"])
    turn = await session.turn(stream)
    assert [c.text async for c in turn] == ["a"]
    reader = asyncio.create_task(turn.__anext__())
    with pytest.raises(StopAsyncIteration):
        await reader
    assert turn.outcome == "completed"
    assert stream.closes == 1
