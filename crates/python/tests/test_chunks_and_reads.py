"""Chunks from str, OpenAI-shaped dicts, ``settle.Chunk`` and a caller's
``to_chunk``; and what Python wrote reads the same through ``settle show``
and ``settle export``."""

from __future__ import annotations

import json
import subprocess

import pytest

import settle
from conftest import PATIENCE, Stream, eventually, run_python, settle_bin, settle_json

OPENAI_DICTS = [
    {"choices": [{"index": 0, "delta": {"reasoning_content": "The user wants the weather"}}]},
    {"choices": [{"index": 0, "delta": {"content": "Checking."}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 9, "total_tokens": 13}},
]


async def test_g7_openai_shaped_dicts_give_reasoning_text_tool_calls_and_usage(kernel):
    session = await kernel.register("s")
    async with await session.turn(Stream(OPENAI_DICTS), input="weather in Paris?") as turn:
        got = [c async for c in turn]
    assert turn.outcome == "completed"
    assert [c.kind for c in got] == ["reasoning", "text", "tool_call", "tool_call", "usage"]
    assert got[0].data == "The user wants the weather"
    assert got[1].text == "Checking."
    assert got[2].data["function"]["name"] == "get_weather"
    assert got[4].data == {"completion_tokens": 4, "prompt_tokens": 9, "total_tokens": 13}
    assert [c.text for c in got] == [None, "Checking.", None, None, None]


async def test_an_openai_chunk_reads_as_the_rust_provider_reads_its_event(kernel):
    """Found from outside: a reply the model cut at its length limit
    (``finish_reason: "length"``) ended ``completed`` from Python and
    ``failed`` (truncated) through the gateway, and a chunk's ``error`` was
    not read at all. Both paths now read a chunk one way."""
    cases = [
        # Cut at the length limit: what was streamed is kept, the turn failed.
        (
            [
                {"choices": [{"index": 0, "delta": {"content": "pre "}}]},
                {"choices": [{"index": 0, "delta": {"content": "cut"}, "finish_reason": "length"}]},
                {"choices": [{"index": 0, "delta": {"content": " post"}}]},
            ],
            ["pre ", "cut"],
            ("failed", "truncated"),
        ),
        # An error in the stream fails the turn with its message.
        (
            [
                {"choices": [{"index": 0, "delta": {"content": "a"}}]},
                {"error": {"message": "the model is overloaded"}},
            ],
            ["a"],
            ("failed", "the model is overloaded"),
        ),
        # `"error": null` on every chunk, as some servers send, is no error.
        (
            [{"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}], "error": None}],
            ["fine"],
            ("completed", None),
        ),
    ]
    for items, texts, (outcome, says) in cases:
        session = await kernel.register("s")
        async with await session.turn(Stream(items)) as turn:
            got = [c.text async for c in turn]
        assert got == texts, items
        assert turn.outcome == outcome, (items, turn.error)
        if says is not None:
            assert says in " ".join(turn.error), turn.error


async def test_g7_an_openai_reply_that_never_said_it_was_done_fails_and_offers_no_cut_call(kernel):
    """Found from outside: a connection that dies mid-reply ends the
    ``openai`` package's stream quietly (no ``[DONE]``, no error), and the
    turn ended ``completed``: its cut text committed to memory, its cut
    tool call (``{"path": "/home/user``) given back as a call to run and,
    after ``resume``, as pending. A reply of OpenAI-shaped chunks whose
    stream ends before any of them said it was done (``finish_reason``)
    fails ``protocol``, as the Rust provider fails a stream that ends
    before ``data: [DONE]``."""
    cut = [
        {"choices": [{"index": 0, "delta": {"content": "Deleting. "}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "delete_files", "arguments": "{\"path\": \"/home/user"}}]}}]},
    ]
    session = await kernel.register("s")
    async with await session.turn(Stream(cut), input="tidy up") as turn:
        got = [c.kind async for c in turn]
    assert got == ["text", "tool_call"]
    assert turn.outcome == "failed", turn.error
    assert turn.error[0] == "protocol", turn.error
    assert "finish_reason" in turn.error[1], turn.error
    await session.finish()
    resumed = await kernel.resume(session, "again")
    assert resumed.pending_tool_calls == []
    await resumed.session.finish()
    # A whole reply says so, and the usage servers send after it still counts.
    whole = [*cut[:1], {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, {"choices": [], "usage": {"total_tokens": 3}}]
    session = await kernel.register("s")
    async with await session.turn(Stream(whole)) as turn:
        got = [c.kind async for c in turn]
    assert (got, turn.outcome) == (["text", "usage"], "completed"), turn.error
    await session.finish()


def _openai_chunk(**fields):
    """An ``openai`` ``ChatCompletionChunk`` as the package's own stream makes
    one from an event (built without validation: a field the event lacks is
    ``None``)."""
    from openai.types.chat import ChatCompletionChunk

    head = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return ChatCompletionChunk.construct(**{**head, **fields})


async def test_an_openai_chunk_without_choices_carries_nothing_as_the_rust_provider_reads_it(kernel):
    """Found from outside: an event with no ``choices`` (``{"id", "object":
    "chat.completion.chunk", "created", "model"}``, a keepalive some servers
    send) let the turn complete with its text through the Rust provider, and
    failed it through Python with ``BadInput``, since the ``openai`` chunk
    dumps without its ``choices: None``. Such a chunk, an ``openai`` object
    or the same as a dict, now carries nothing, as it does for the Rust
    provider; a dict of another shape is still refused."""
    pytest.importorskip("openai")

    async def chunks():
        yield _openai_chunk(choices=[{"index": 0, "delta": {"content": "a"}}])
        yield _openai_chunk()
        yield {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        yield _openai_chunk(choices=[{"index": 0, "delta": {"content": "b"}}])
        yield _openai_chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
        yield _openai_chunk(choices=[], usage={"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4})

    session = await kernel.register("s")
    async with await session.turn(chunks) as turn:
        got = [(c.kind, c.data) async for c in turn]
    assert turn.outcome == "completed", turn.error
    assert got == [
        ("text", "a"),
        ("text", "b"),
        ("usage", {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}),
    ]
    assert turn.reply()["text"] == "ab"

    # Not an OpenAI chunk: refused, saying to use to_chunk.
    async with await session.turn(Stream([{"id": "x", "model": "m"}])) as turn:
        assert [c async for c in turn] == []
    assert turn.outcome == "failed"
    assert "BadInput" in turn.error[1] and "to_chunk" in turn.error[1], turn.error


async def test_an_openai_stream_with_an_event_without_choices_completes(kernel):
    """The same keepalive through a real ``openai.AsyncOpenAI`` stream."""
    openai = pytest.importorskip("openai")
    from sse_server import SseServer

    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {},  # the server's id, object, created and model only
        {"choices": [{"index": 0, "delta": {"content": "b"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}},
    ]
    messages = [{"role": "user", "content": "hi"}]
    async with SseServer(chunks=chunks, interval=0.01) as server:
        model = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        session = await kernel.register("s")
        async with await session.turn(
            lambda: model.chat.completions.create(model="local", messages=messages, stream=True),
            input=messages,
        ) as turn:
            texts = [c.text async for c in turn if c.kind == "text"]
    assert turn.outcome == "completed", turn.error
    assert texts == ["a", "b"]
    [stored] = await session.transcript()
    assert stored["text"] == "ab"
    assert stored["error"] is None


async def test_g7_to_chunk_and_settle_chunks(kernel):
    session = await kernel.register("s")

    class Event:
        def __init__(self, text):
            self.text = text

    items = [Event("one"), Event("two"), None]
    to_chunk = lambda e: None if e is None else [settle.Chunk("data", {"seen": e.text}), e.text]
    async with await session.turn(Stream(items), to_chunk=to_chunk) as turn:
        got = [c async for c in turn]
    assert [(c.kind, c.data) for c in got] == [
        ("data", {"seen": "one"}),
        ("text", "one"),
        ("data", {"seen": "two"}),
        ("text", "two"),
    ]
    assert got[1] == settle.Chunk("text", "one")


async def test_g11_an_async_to_chunk_is_refused_when_the_turn_is_asked_for(kernel):
    """An ``async def`` to_chunk would return a coroutine per item: refused
    at once, saying so, the source closed (G4) and no turn started."""
    session = await kernel.register("s")

    async def to_chunk(item):
        return item

    stream = Stream(["a"])
    with pytest.raises(settle.BadInput, match="to_chunk is an async function"):
        await session.turn(stream, to_chunk=to_chunk)
    await eventually(lambda: stream.closes, "the source closed")
    assert await session.transcript() == []


async def test_what_python_wrote_reads_the_same_through_show_and_export(db, kernel):
    root = await kernel.register("root")
    child = await root.child("child")
    async with await child.turn(Stream(OPENAI_DICTS), input=[{"role": "user", "content": "weather in Paris?"}]) as turn:
        async for _ in turn:
            pass
    async with await root.turn(Stream(["Hello, ", "world"]), input="hi") as turn:
        async for _ in turn:
            pass
    await root.finish()

    ours = {row["id"]: row for row in await kernel.sessions()}
    listed = {row["id"]: row for row in settle_json(db, "sessions", "--json")}
    assert set(ours) == set(listed) == {root.id, child.id}
    for id, row in ours.items():
        # The same fields, none missing (the owner's address was).
        assert set(row) == set(listed[id]), id
        for field in ("name", "parent", "state", "outcome", "end_reason", "turns", "chunks", "owner"):
            assert listed[id][field] == row[field], (id, field)

    for session in (root, child):
        shown = settle_json(db, "show", str(session.id), "--json")
        transcript = await session.transcript()
        assert len(shown["turns"]) == len(transcript)
        for theirs, mine in zip(shown["turns"], transcript):
            assert theirs["outcome"] == mine["outcome"]
            assert theirs["text"] == mine["text"]
            assert theirs["input"] == mine["input"]
            expected = [c.text if c.kind == "text" else {"kind": c.kind, "data": c.data} for c in mine["chunks"]]
            assert theirs["chunks"] == expected

    exported = subprocess.run(
        [settle_bin(), "--db", db, "export", str(child.id), "--format", "jsonl"],
        capture_output=True, text=True, timeout=PATIENCE,
    )
    assert exported.returncode == 0, exported.stderr
    kinds = [e.get("kind") for e in map(json.loads, exported.stdout.splitlines()) if e.get("event") == "chunk"]
    assert kinds == ["reasoning", "text", "tool_call", "tool_call", "usage"]
    shown = subprocess.run(
        [settle_bin(), "--db", db, "show", str(child.id)], capture_output=True, text=True, timeout=PATIENCE
    )
    assert 'tool call: get_weather({"city":"Paris"})' in shown.stdout, shown.stdout
    assert "usage: completion_tokens=4 prompt_tokens=9 total_tokens=13" in shown.stdout


async def test_g7_a_transcript_gives_each_turn_all_it_was_sent(db, kernel):
    # The store keeps what each turn added; a read gives back what it was sent.
    chat = await kernel.register("chat")
    first = [{"role": "user", "content": "weather in Paris?"}]
    async with await chat.turn(Stream(OPENAI_DICTS), input=first) as turn:
        async for _ in turn:
            pass
    second = [
        *first,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "18°C", "tool_call_id": "call_1"},
    ]
    async with await chat.turn(Stream(["18°C."]), input=second) as turn:
        async for _ in turn:
            pass
    third = [*second, {"role": "assistant", "content": "18°C."}, {"role": "user", "content": "and tomorrow?"}]
    async with await chat.turn(Stream(["Rain."]), input=third) as turn:
        async for _ in turn:
            pass
    await chat.finish()
    transcript = await chat.transcript()
    assert [t["input"] for t in transcript] == [first, second, third]
    shown = settle_json(db, "show", str(chat.id), "--json")
    assert [t["input"] for t in shown["turns"]] == [first, second, third]


async def test_a_message_given_as_parts_is_stored_and_read_as_given(db, kernel):
    # The chat-completion spelling of a message with an image: a list of parts.
    parts = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    asked = [{"role": "user", "content": parts}]
    session = await kernel.register("vision")
    async with await session.turn(Stream(["A cat."]), input=asked) as turn:
        async for _ in turn:
            pass
    await session.finish()
    assert [t["input"] for t in await session.transcript()] == [asked]
    shown = settle_json(db, "show", str(session.id), "--json")
    assert [t["input"] for t in shown["turns"]] == [asked]
    text = subprocess.run(
        [settle_bin(), "--db", db, "show", str(session.id)], capture_output=True, text=True, timeout=PATIENCE
    )
    assert "What is in this picture?\n    [image_url]" in text.stdout, text.stdout


async def test_a_content_that_is_neither_text_nor_parts_is_bad_input(kernel):
    session = await kernel.register("s")
    with pytest.raises(settle.BadInput, match="a string or a list of parts"):
        await session.turn(Stream(["x"]), input=[{"role": "user", "content": 7}])



NESTED_CHUNKS = r'''
import asyncio, sys
import settle

def item(kind):
    if kind == "itself":
        x = []
        x.append(x)
        return x
    x = "leaf"
    for _ in range(100_000):
        x = [x] if kind == "deep" else (x,)
    return x

async def main(db, kind):
    async with await settle.Kernel.open(db) as kernel:
        session = await kernel.register("s")
        async def source():
            yield "before"
            yield item(kind)
        async with await session.turn(source, input="x") as turn:
            async for _ in turn:
                pass
        print(turn.outcome, type(turn.error).__name__, turn.error)
        # The session goes on.
        async def after():
            yield "after"
        async with await session.turn(after, input="y") as turn:
            print([c.text async for c in turn], turn.outcome)

asyncio.run(main(sys.argv[1], sys.argv[2]))
'''


@pytest.mark.parametrize("kind", ["itself", "deep", "deep_tuple"])
async def test_g11_a_list_that_holds_itself_or_nests_too_deep_fails_its_turn_not_the_process(tmp_path, kind):
    code, out, err = await run_python("-c", NESTED_CHUNKS, str(tmp_path / "n.db"), kind)
    assert code == 0, (code, out, err)
    first, second = out.strip().splitlines()
    assert first.startswith("failed"), out
    assert "deeper than 64" in first, out
    assert second == "['after'] completed", out


async def test_a_list_or_tuple_is_its_chunks_in_order_and_a_text_chunk_is_a_str(kernel):
    # Found from outside: ("text", "hi") read as two text chunks surprised a
    # user the docs had told "anything else goes through to_chunk"; the
    # docs now say so. Chunk("text", 5) was stored as "5": text is a str.
    session = await kernel.register("s")
    async with await session.turn(Stream([("text", "hi"), ["a", None, settle.Chunk("text", "b")]])) as turn:
        got = [c.text async for c in turn]
    assert got == ["text", "hi", "a", "b"]
    for data in (5, ["x"], {"text": "x"}, None):
        with pytest.raises(settle.BadInput, match="a text chunk carries a str"):
            settle.Chunk("text", data)
    assert settle.Chunk("data", 5).data == 5


async def test_g4_a_stream_class_given_as_the_source_is_made_and_closed_once(kernel):
    """Found from outside: a class of async iterators given as a turn's
    source (``session.turn(Replies)``, a factory as any callable is) was
    taken for a stream, since the class has ``__aiter__``: the turn failed
    and closing it logged an error. A class is called, as a factory is, and
    the stream it made is closed once."""
    made = []

    class Replies:
        def __init__(self) -> None:
            self.items = ["made ", "by a class"]
            self.closed = 0
            made.append(self)

        def __aiter__(self) -> "Replies":
            return self

        async def __anext__(self) -> str:
            if not self.items:
                raise StopAsyncIteration
            return self.items.pop(0)

        async def aclose(self) -> None:
            self.closed += 1

    session = await kernel.register("s")
    async with await session.turn(Replies) as turn:
        got = [c.text async for c in turn]
    assert turn.outcome == "completed", turn.error
    assert got == ["made ", "by a class"]
    await eventually(lambda: len(made) == 1 and made[0].closed == 1, "the stream made closed once")


async def test_a_sessions_row_names_its_live_owners_address_as_the_command_line_does(db, kernel):
    """``owner`` is where clients reach the live process that owns the
    session (the address it advertised), as ``settle sessions --json``
    says it; null once the session is finalized."""
    import sqlite3

    live = await kernel.register("live")
    done = await kernel.register("done")
    await done.finish()
    # The address a serving process advertises, given to this one's row.
    with sqlite3.connect(db, timeout=PATIENCE) as connection:
        connection.execute("UPDATE owners SET advertise = 'ws://10.0.0.7:8080'")
    ours = {row["id"]: row for row in await kernel.sessions()}
    listed = {row["id"]: row for row in settle_json(db, "sessions", "--json")}
    assert ours[live.id]["owner"] == listed[live.id]["owner"] == "ws://10.0.0.7:8080"
    assert ours[done.id]["owner"] is listed[done.id]["owner"] is None
