"""Seed 001: an ``openai.AsyncOpenAI`` stream from a local OpenAI-compatible
server, read as a turn: cancelling the reading task closes the connection
(G4), a cancel during the attach leaves nothing open, and a task that
swallows its cancel is detached at the settle deadline (G5)."""

from __future__ import annotations

import asyncio
import time

import pytest

import settle
from conftest import eventually
from sse_server import SseServer

openai = pytest.importorskip("openai")


def client(server: SseServer) -> "openai.AsyncOpenAI":
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "hello?"}]


async def test_g7_an_openai_stream_is_stored_chunk_by_chunk(kernel):
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "thinking"}}]},
        {"choices": [{"index": 0, "delta": {"content": "Checking."}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":\"Paris\"}"}}]}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}},
    ]
    async with SseServer(chunks=chunks, interval=0.01) as server:
        model = client(server)
        session = await kernel.register("chat")
        async with await session.turn(
            lambda: model.chat.completions.create(model="local", messages=MESSAGES, stream=True),
            input=MESSAGES,
        ) as turn:
            got = [(c.kind, c.data) async for c in turn]
    assert turn.outcome == "completed", turn.error
    assert [kind for kind, _ in got] == ["reasoning", "text", "tool_call", "tool_call", "usage"]
    assert got[1] == ("text", "Checking.")
    assert got[2][1]["function"]["name"] == "get_weather"
    assert got[4][1]["total_tokens"] == 13
    [stored] = await session.transcript()
    assert stored["input"] == MESSAGES
    assert [c.kind for c in stored["chunks"]] == [kind for kind, _ in got]


async def test_g4_cancelling_the_task_reading_an_openai_stream_closes_its_connection(kernel):
    async with SseServer(forever=True, interval=0.05) as server:
        model = client(server)
        session = await kernel.register("reader")
        first = asyncio.Event()

        async def read() -> None:
            async with await session.turn(
                lambda: model.chat.completions.create(model="local", messages=MESSAGES, stream=True),
                input=MESSAGES,
            ) as turn:
                async for _ in turn:
                    first.set()

        reader = asyncio.create_task(read())
        await asyncio.wait_for(first.wait(), 10)
        cancelled_at = asyncio.get_running_loop().time()
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        await eventually(lambda: server.closed_at, "the server to see its connection closed", timeout=5)
        assert server.closed_at[0] - cancelled_at < 1.0
        [stored] = await session.transcript()
        assert stored["outcome"] == "cancelled"


async def test_g4_a_cancel_during_the_attach_leaves_no_connection_open(kernel):
    async with SseServer(headers_delay=5.0) as server:
        model = client(server)
        session = await kernel.register("attach")
        turn = await session.turn(
            lambda: model.chat.completions.create(model="local", messages=MESSAGES, stream=True),
            input=MESSAGES,
        )
        await eventually(lambda: server.requests, "the request to reach the server", timeout=10)
        cancelled_at = asyncio.get_running_loop().time()
        await turn.aclose()  # the stream is still being opened: no headers yet
        assert turn.outcome == "cancelled"
        await eventually(lambda: server.closed_at, "the server to see its connection closed", timeout=5)
        assert server.closed_at[0] - cancelled_at < 1.0
        assert server.requests == 1


async def test_g5_a_task_swallowing_its_cancel_while_reading_openai_is_detached(db):
    kernel = await settle.Kernel.open(db, settle_timeout=0.3)
    try:
        async with SseServer(forever=True, interval=0.05) as server:
            model = client(server)
            session = await kernel.register("stubborn")
            reading = asyncio.Event()
            refused = []

            swallowed: list = []

            async def stubborn_reader() -> None:
                stream = await model.chat.completions.create(model="local", messages=MESSAGES, stream=True)
                chunks = stream.__aiter__()
                while True:
                    following = asyncio.ensure_future(chunks.__anext__())
                    while True:
                        try:
                            await asyncio.shield(following)
                            break
                        except asyncio.CancelledError:
                            # Swallowed, as the seed's SDK run loop did.
                            swallowed.append(time.monotonic())
                    reading.set()
                    if swallowed and time.monotonic() - swallowed[0] > 0.6:
                        try:
                            await session.child("late")
                        except settle.SessionClosed:
                            refused.append(True)
                        await stream.close()
                        return

            task = await session.spawn(stubborn_reader())
            await asyncio.wait_for(reading.wait(), 10)
            started = time.monotonic()
            await session.cancel()
            with pytest.raises(settle.Detached):
                await task
            assert time.monotonic() - started >= 0.25
            assert swallowed, "the task never saw its cancel"
            await eventually(lambda: refused, "the detached task's write refused")
            await eventually(lambda: server.closed_at, "the task to close its stream")
    finally:
        await kernel.shutdown(0.0)
