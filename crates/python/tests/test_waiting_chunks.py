"""A reader behind its stream: the chunks the store already has are given
without a round trip through the kernel's threads, and such a read keeps
what every read promises: the chunks in order (G7), the loop passed once
per chunk so other tasks run, a cancel of the reading task or a collected
awaitable cancelling the turn and closing its stream once (G4), and a
chunk the reader never got being no part of the reply."""

from __future__ import annotations

import asyncio
import gc

import settle
from conftest import Stream, eventually


def is_waiting_chunk(pending) -> bool:
    """Whether a read's awaitable is that of a chunk that was already there:
    the bridged future of a read that waits is an ``asyncio`` future behind
    ``_bridge.Next``, a waiting chunk's is not."""
    return type(pending).__name__ == "Ready"


async def read_until_a_chunk_waits(turn: settle.Turn, seen: list):
    """Reads ``turn`` (noting each chunk in ``seen``) until a chunk is there
    before it is asked for; returns that read's awaitable, not awaited."""
    for _ in range(500):
        pending = turn.__anext__()
        if is_waiting_chunk(pending):
            return pending
        seen.append((await pending).text)
        await asyncio.sleep(0.01)
    raise AssertionError("no chunk ever waited for the reader")


async def test_g7_chunks_waiting_for_a_reader_come_in_order_and_the_loop_runs_between_them(kernel):
    session = await kernel.register("s")
    items = [f"c{n}" for n in range(40)]
    stream = Stream(items, delay=0.001)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    seen: list = []
    async with await session.turn(stream) as turn:
        first = await read_until_a_chunk_waits(turn, seen)
        seen.append((await first).text)
        # Let the rest reach the store and wait in the turn.
        await eventually(lambda: stream.sent == len(items), "the stream's end")
        await asyncio.sleep(0.2)
        background = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before, without_waiting = ticks, 0
        while True:
            pending = turn.__anext__()
            without_waiting += is_waiting_chunk(pending)
            try:
                seen.append((await pending).text)
            except StopAsyncIteration:
                break
        background.cancel()
    assert seen == items
    assert without_waiting > 0
    # Each read that did not wait still let the ticker run once.
    assert ticks - before >= without_waiting
    assert turn.outcome == "completed"
    assert turn.reply()["text"] == "".join(items)
    assert stream.closes == 1


async def test_g4_cancelling_a_reader_at_a_waiting_chunk_cancels_the_turn_and_closes_its_stream_once(kernel):
    for attempt in range(10):
        session = await kernel.register(f"s{attempt}")
        stream = Stream(["tick"], delay=0.001, forever=True)
        seen: list = []
        turn = await session.turn(stream)
        first = await read_until_a_chunk_waits(turn, seen)
        seen.append((await first).text)
        await asyncio.sleep(0.05)  # more chunks wait

        started = asyncio.Event()

        async def read() -> None:
            started.set()
            async for chunk in turn:
                seen.append(chunk.text)

        reader = asyncio.create_task(read())
        await started.wait()
        for _ in range(attempt % 4):
            await asyncio.sleep(0)
        reader.cancel()
        try:
            await reader
        except asyncio.CancelledError:
            pass
        await eventually(lambda: turn.outcome is not None, "the turn's end")
        assert turn.outcome == "cancelled", attempt
        await eventually(lambda: stream.closes, "the stream closed")
        await asyncio.sleep(0.05)
        assert stream.closes == 1, attempt
        # What the reader never got is stored, and no part of the reply.
        assert turn.reply()["text"] == "".join(seen), attempt
        stored = (await session.transcript())[-1]["text"]
        assert stored.startswith("".join(seen)), attempt
        await session.close()


async def test_g4_a_collected_awaitable_of_a_waiting_chunk_cancels_the_turn(kernel):
    session = await kernel.register("s")
    stream = Stream(["tick"], delay=0.001, forever=True)
    turn = await session.turn(stream)
    seen: list = []
    pending = await read_until_a_chunk_waits(turn, seen)
    del pending
    gc.collect()
    await eventually(lambda: turn.outcome is not None, "the turn's end")
    assert turn.outcome == "cancelled"
    await eventually(lambda: stream.closes, "the stream closed")
    await asyncio.sleep(0.05)
    assert stream.closes == 1
    # The chunk of the collected read is stored, and no part of the reply.
    assert turn.reply()["text"] == "".join(seen)
