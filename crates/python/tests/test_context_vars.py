"""Context variables (request ids, tracing spans, tenants): a coroutine
given to ``spawn()`` and a turn's source run in a copy of the caller's
context, as an asyncio task runs in a copy of its creator's; what they set
stays theirs."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

import settle
from conftest import eventually
from settle import _bridge

REQUEST = contextvars.ContextVar("request", default="<unset>")


@pytest.fixture(params=["context=", "context.run"])
def task_start(request, monkeypatch):
    """Both ways a task is made in a given context: ``create_task``'s
    ``context=`` (Python 3.11 and after), and the call of ``create_task``
    within it (before)."""
    if request.param == "context.run":
        monkeypatch.setattr(_bridge, "_CREATE_TASK_TAKES_CONTEXT", False)
    return request.param


async def test_a_spawned_tool_sees_the_callers_context_variables(kernel, task_start):
    session = await kernel.register("s")

    async def tool() -> str:
        await asyncio.sleep(0)
        return REQUEST.get()

    REQUEST.set("request-42")
    task = await session.spawn(tool())
    assert await task == "request-42"


async def test_a_turn_source_sees_the_callers_context_variables(kernel, task_start):
    """The callable that makes the stream, the stream, and ``to_chunk``
    all run in the caller's context (a copy of it)."""
    session = await kernel.register("s")
    seen = []

    async def stream():
        seen.append(("stream", REQUEST.get()))
        yield "a"

    def make():
        seen.append(("make", REQUEST.get()))
        return stream()

    def to_chunk(item):
        seen.append(("to_chunk", REQUEST.get()))
        return item

    REQUEST.set("request-42")
    async with await session.turn(make, to_chunk=to_chunk) as turn:
        assert [chunk.text async for chunk in turn] == ["a"]
    async with await session.turn(stream()) as turn:
        assert [chunk.text async for chunk in turn] == ["a"]
    assert seen == [
        ("make", "request-42"),
        ("stream", "request-42"),
        ("to_chunk", "request-42"),
        ("stream", "request-42"),
    ]


async def test_a_value_a_tool_sets_reaches_neither_its_caller_nor_a_sibling(kernel):
    session = await kernel.register("s")
    set_it = asyncio.Event()

    async def setter() -> str:
        REQUEST.set("set-by-the-tool")
        set_it.set()
        await asyncio.sleep(0.05)
        return REQUEST.get()

    async def sibling() -> str:
        await set_it.wait()
        return REQUEST.get()

    REQUEST.set("set-by-the-caller")
    first = await session.spawn(setter())
    second = await session.spawn(sibling())
    assert await first == "set-by-the-tool"
    assert await second == "set-by-the-caller"
    assert REQUEST.get() == "set-by-the-caller"


async def test_a_tools_child_task_sees_the_tools_value(kernel):
    session = await kernel.register("s")

    async def read() -> str:
        return REQUEST.get()

    async def tool() -> "tuple[str, str]":
        REQUEST.set("set-by-the-tool")
        child = await session.spawn(read())
        return await child, await asyncio.create_task(read())

    REQUEST.set("set-by-the-caller")
    task = await session.spawn(tool())
    assert await task == ("set-by-the-tool", "set-by-the-tool")


async def test_a_turn_started_by_a_tool_is_not_that_tools_task(kernel):
    """The settle task a coroutine runs as is its own: a turn's source
    started by a tool sees the tool's variables, but not as that task (its
    writes are not refused when the tool is detached, G10)."""
    session = await kernel.register("s")
    seen = []

    async def stream():
        seen.append((REQUEST.get(), _bridge.CURRENT_TASK.get()))
        yield "a"

    async def tool() -> bool:
        REQUEST.set("set-by-the-tool")
        mine = _bridge.CURRENT_TASK.get()
        async with await session.turn(stream) as turn:
            assert [chunk.text async for chunk in turn] == ["a"]
        return mine is not None

    task = await session.spawn(tool())
    assert await task is True
    assert seen == [("set-by-the-tool", None)]


async def test_a_turn_source_never_opened_is_closed_in_the_callers_context(kernel):
    """A turn cancelled before the kernel opened its stream closes the
    stream all the same (G4), in the caller's context, as its pump would."""
    session = await kernel.register("s")
    closed_in = []

    class Unread:
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise StopAsyncIteration

        async def aclose(self):
            closed_in.append((REQUEST.get(), _bridge.CURRENT_TASK.get()))

    REQUEST.set("request-42")
    starting = asyncio.ensure_future(session.turn(Unread()))
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await eventually(lambda: closed_in, "the source closed")
    assert closed_in == [("request-42", None)]
