"""examples/python/tool_loop.py, a tool-calling agent, against a local
OpenAI-compatible server, driven as its users drive it: its tools run as
settle tasks and their results go back to the model; a tool that raises,
calls streamed in many pieces, interleaved or malformed, and a cancel of the
loop while a tool runs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import PATIENCE, piece, run_python
from sse_server import SseServer

openai = pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "tool_loop.py"


@pytest.fixture
def loop_example(monkeypatch):
    """The example as a module, its tools the test's to replace."""
    spec = importlib.util.spec_from_file_location("tool_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "TOOLS", dict(module.TOOLS))
    return module


def client(server: SseServer) -> "openai.AsyncOpenAI":
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def text(words):
    return [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in words]


def call(index, id, name, arguments):
    return [piece(index, id=id, name=name, arguments=""), piece(index, arguments=arguments)]


def tool_messages(body):
    return [m for m in body["messages"] if m["role"] == "tool"]


async def test_the_loop_runs_a_tool_and_sends_its_result_back(kernel, loop_example, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("the key is under the mat")
    asks = [*text(["Reading."]), *call(0, "call_1", "read_file", json.dumps({"path": str(note)}))]
    async with SseServer(replies=[asks, text(["Under ", "the mat."])], interval=0.01) as server:
        session = await kernel.register("agent")
        messages = [{"role": "user", "content": "where is the key?"}]
        answer = await loop_example.agent(session, client(server), "local", messages)
    assert answer == "Under the mat."
    assert server.requests == 2
    assert [t["function"]["name"] for t in server.bodies[0]["tools"]] == ["read_file", "sleep"]
    sent = server.bodies[1]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": "Reading.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": str(note)})}}],
    }
    assert sent[2] == {"role": "tool", "content": "the key is under the mat", "tool_call_id": "call_1"}
    turns = await session.transcript()
    assert [t["outcome"] for t in turns] == ["completed", "completed"]
    assert turns[1]["input"] == sent
    assert await session.finish() == "completed"


async def test_an_assistant_message_without_text_is_sent_with_null_content(kernel, loop_example):
    # What the openai SDK's own types spell: an assistant message that only
    # calls tools has `content: None`.
    async with SseServer(replies=[call(0, "call_1", "sleep", '{"seconds": 0}'), text(["Done."])], interval=0.01) as server:
        session = await kernel.register("agent")
        answer = await loop_example.agent(session, client(server), "local", [{"role": "user", "content": "nap"}])
    assert answer == "Done."
    assistant = server.bodies[1]["messages"][1]
    assert assistant["content"] is None and assistant["tool_calls"][0]["id"] == "call_1"
    turns = await session.transcript()
    assert turns[1]["input"][1]["tool_calls"] == assistant["tool_calls"]


async def test_a_tool_that_raises_gives_the_model_its_error(kernel, loop_example):
    async def broken(path: str) -> str:
        raise PermissionError(f"{path}: permission denied")

    loop_example.TOOLS["read_file"] = broken
    asks = call(0, "call_1", "read_file", '{"path": "/root/secret"}')
    async with SseServer(replies=[asks, text(["I cannot read it."])], interval=0.01) as server:
        session = await kernel.register("agent")
        answer = await loop_example.agent(session, client(server), "local", [{"role": "user", "content": "read"}])
    assert answer == "I cannot read it."
    [result] = tool_messages(server.bodies[1])
    assert result["tool_call_id"] == "call_1"
    assert "PermissionError: /root/secret: permission denied" in result["content"]
    assert (await session.state()) == "registered"


async def test_a_call_in_many_pieces_interleaved_with_another_runs_whole(kernel, loop_example):
    ran = []

    async def record(name, **arguments):
        ran.append((name, arguments))
        return f"{name} done"

    loop_example.TOOLS.update(
        read_file=lambda **a: record("read_file", **a), sleep=lambda **a: record("sleep", **a)
    )
    arguments = json.dumps({"path": "/etc/hostname"})
    asks = [piece(0, id="call_a", name="read_file", arguments=""), piece(1, id="call_b", name="sleep", arguments="")]
    for n, character in enumerate(arguments):  # one character a piece, the other call's between
        asks.append(piece(0, arguments=character))
        if n == 3:
            asks.append(piece(1, arguments='{"seconds"'))
        if n == 9:
            asks.append(piece(1, arguments=": 0.01}"))
    async with SseServer(replies=[asks, text(["Both done."])], interval=0.001) as server:
        session = await kernel.register("agent")
        answer = await loop_example.agent(session, client(server), "local", [{"role": "user", "content": "go"}])
    assert answer == "Both done."
    assert sorted(ran) == [("read_file", {"path": "/etc/hostname"}), ("sleep", {"seconds": 0.01})]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(server.bodies[1])] == [
        ("call_a", "read_file done"),
        ("call_b", "sleep done"),
    ]


async def test_malformed_pieces_fail_their_call_not_the_loop(kernel, loop_example):
    asks = [
        *call(0, "call_a", "read_file", '{"path": /etc/hostname'),  # garbage JSON
        piece(None, id="call_b", name="sleep", arguments='{"seconds": 0}'),  # no index
        piece(2, id="call_c", name="no_such_tool", arguments="{}"),
    ]
    async with SseServer(replies=[asks, text(["Noted."])], interval=0.01) as server:
        session = await kernel.register("agent")
        answer = await loop_example.agent(session, client(server), "local", [{"role": "user", "content": "go"}])
    assert answer == "Noted."
    results = {m["tool_call_id"]: m["content"] for m in tool_messages(server.bodies[1])}
    assert results["call_a"].startswith("error: JSONDecodeError")
    assert results["call_b"] == "slept 0 s"
    assert results["call_c"].startswith("error: KeyError")


async def test_cancelling_the_loop_while_a_tool_runs_cancels_the_tool(kernel, loop_example):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def stuck(seconds: float) -> str:
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "woke up"

    loop_example.TOOLS["sleep"] = stuck
    async with SseServer(replies=[call(0, "call_1", "sleep", '{"seconds": 3600}'), text(["never"])], interval=0.01) as server:
        session = await kernel.register("agent")
        loop = asyncio.create_task(loop_example.agent(session, client(server), "local", [{"role": "user", "content": "nap"}]))
        await asyncio.wait_for(started.wait(), PATIENCE)
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
        # Nobody but the loop's cancel asked the tool to stop.
        await asyncio.wait_for(cancelled.wait(), 5)
        assert server.requests == 1
    turns = await session.transcript()
    assert [t["outcome"] for t in turns] == ["completed"]
    for _ in range(1000):  # the tool's work ends once it has unwound
        if await session.state() == "registered":
            break
        await asyncio.sleep(0.01)
    assert await session.state() == "registered"
    assert await session.finish() == "completed"


async def test_the_example_runs_as_a_program(db, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("hello from a file")
    asks = call(0, "call_1", "read_file", json.dumps({"path": str(note)}))
    async with SseServer(replies=[asks, text(["It says hello."])], interval=0.01) as server:
        code, out, err = await run_python(str(EXAMPLE), "--base-url", server.base_url, "--db", db, "what is in the note?")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1] == "[answer] It says hello.", lines
    assert tool_messages(server.bodies[1])[0]["content"] == "hello from a file"
