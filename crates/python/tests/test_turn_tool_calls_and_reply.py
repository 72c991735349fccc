"""A turn's tool calls and reply, put together from the chunks it yielded:
``turn.tool_calls()`` assembles the streamed ``delta.tool_calls`` pieces by
index (as the runtime's turn does), and ``turn.reply()`` gives the whole
reply (text, reasoning, tool calls, usage, data)."""

from __future__ import annotations

import asyncio

import pytest

import settle
from conftest import Stream, piece


INTERLEAVED = [
    {"choices": [{"index": 0, "delta": {"reasoning_content": "two tools at once"}}]},
    {"choices": [{"index": 0, "delta": {"content": "Looking."}}]},
    piece(0, id="call_a", name="ls", arguments=""),
    piece(1, id="call_b", name="cat", arguments='{"f'),
    piece(0, arguments='{"path":'),
    piece(1, arguments='ile":"a.txt"}'),
    piece(0, arguments='"/tmp"}'),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"completion_tokens": 7, "prompt_tokens": 11, "total_tokens": 18}},
]


async def test_two_interleaved_tool_calls_are_put_together_by_index(kernel):
    session = await kernel.register("s")
    async with await session.turn(Stream(INTERLEAVED), input="list and read") as turn:
        kinds = [c.kind async for c in turn]
    assert turn.outcome == "completed"
    assert kinds.count("tool_call") == 5
    assert turn.tool_calls() == [
        {"id": "call_a", "name": "ls", "arguments": '{"path":"/tmp"}'},
        {"id": "call_b", "name": "cat", "arguments": '{"file":"a.txt"}'},
    ]


async def test_the_reply_holds_text_reasoning_tool_calls_and_usage(kernel):
    session = await kernel.register("s")
    async with await session.turn(Stream(INTERLEAVED), input="list and read") as turn:
        async for _ in turn:
            pass
    reply = turn.reply()
    assert reply == {
        "text": "Looking.",
        "reasoning": "two tools at once",
        "tool_calls": turn.tool_calls(),
        "usage": [{"completion_tokens": 7, "prompt_tokens": 11, "total_tokens": 18}],
        "data": [],
        "message": {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": '{"path":"/tmp"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "cat", "arguments": '{"file":"a.txt"}'}},
            ],
        },
    }


async def test_the_reply_message_goes_back_as_the_next_turns_history(kernel):
    # What a tool loop does: the reply's message, then each tool's answer,
    # sent as the next turn's input, stored as sent.
    session = await kernel.register("s")
    first = [{"role": "user", "content": "list and read"}]
    async with await session.turn(Stream(INTERLEAVED), input=first) as turn:
        async for _ in turn:
            pass
    answers = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in turn.tool_calls()]
    second = [*first, turn.reply()["message"], *answers]
    async with await session.turn(Stream(["Done."]), input=second) as turn:
        async for _ in turn:
            pass
    assert turn.reply()["message"] == {"role": "assistant", "content": "Done."}
    assert [t["input"] for t in await session.transcript()] == [first, second]


async def test_a_text_reply_has_no_tool_calls(kernel):
    session = await kernel.register("s")
    extra = settle.Chunk("data", {"step": 1})
    async with await session.turn(Stream(["Hello, ", "world", extra])) as turn:
        async for _ in turn:
            pass
    assert turn.tool_calls() == []
    reply = turn.reply()
    assert reply["text"] == "Hello, world"
    assert reply["tool_calls"] == []
    assert reply["data"] == [{"step": 1}]
    assert reply["reasoning"] == "" and reply["usage"] == []


async def test_before_the_end_they_hold_the_chunks_yielded_so_far(kernel):
    session = await kernel.register("s")
    items = [piece(0, id="call_a", name="ls", arguments='{"path":'), "Then ", piece(0, arguments='"/"}')]
    async with await session.turn(Stream(items)) as turn:
        assert turn.tool_calls() == []
        assert turn.reply()["text"] == ""
        seen = []
        async for chunk in turn:
            seen.append(chunk.kind)
            if len(seen) == 1:
                assert turn.tool_calls() == [{"id": "call_a", "name": "ls", "arguments": '{"path":'}]
                assert turn.outcome is None
            if len(seen) == 2:
                assert turn.reply()["text"] == "Then "
    assert turn.tool_calls() == [{"id": "call_a", "name": "ls", "arguments": '{"path":"/"}'}]


async def test_a_turn_closed_early_keeps_what_it_yielded(kernel):
    session = await kernel.register("s")
    items = [piece(0, id="call_a", name="ls", arguments="{}"), "never read"]
    async with await session.turn(Stream(items, delay=0.05, forever=True)) as turn:
        async for chunk in turn:
            assert chunk.kind == "tool_call"
            break
    assert turn.outcome == "cancelled"
    assert turn.tool_calls() == [{"id": "call_a", "name": "ls", "arguments": "{}"}]
    assert turn.reply()["text"] == ""


async def test_openai_chunk_objects_give_assembled_tool_calls(kernel):
    types = pytest.importorskip("openai.types.chat")
    chunks = [types.ChatCompletionChunk.model_validate(
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", **item}
    ) for item in INTERLEAVED]
    session = await kernel.register("s")
    async with await session.turn(Stream(chunks)) as turn:
        async for _ in turn:
            pass
    assert [call["name"] for call in turn.tool_calls()] == ["ls", "cat"]
    assert turn.reply()["tool_calls"][1]["arguments"] == '{"file":"a.txt"}'


async def test_tool_calls_go_back_as_input_with_the_assistants_content_none(kernel):
    # The chat-completion spelling of a reply that only calls tools, as the
    # `openai` package's own types write it: `content: None`.
    session = await kernel.register("s")
    async with await session.turn(Stream(INTERLEAVED[2:7]), input="list and read") as turn:
        async for _ in turn:
            pass
    calls = turn.tool_calls()
    sent = [
        {"role": "user", "content": "list and read"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
        ]},
        *({"role": "tool", "content": "ok", "tool_call_id": c["id"]} for c in calls),
    ]
    async with await session.turn(Stream(["Done."]), input=sent) as turn:
        async for _ in turn:
            pass
    assert turn.outcome == "completed"
    stored = (await session.transcript())[1]["input"]
    assert stored[1]["content"] == "" and stored[1]["tool_calls"] == sent[1]["tool_calls"]
    assert stored[2:] == sent[2:]


async def test_a_turn_cancelled_mid_stream_replies_with_what_it_yielded_only(kernel):
    # The cancel of the reading task lands while a next chunk is on its way:
    # that chunk is stored, never yielded, and not part of the reply.
    for attempt in range(40):
        session = await kernel.register(f"s{attempt}")
        seen, first = [], asyncio.Event()
        items = [piece(0, id="call_a", name="ls", arguments="{")] + [f"w{n} " for n in range(10_000)]
        stream = Stream(items, delay=0.0002)

        async def read(turn):
            async for chunk in turn:
                seen.append(chunk)
                first.set()

        async with await session.turn(stream) as turn:
            reader = asyncio.create_task(read(turn))
            await first.wait()
            for _ in range(attempt % 5):
                await asyncio.sleep(0)
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
        assert turn.outcome == "cancelled"
        assert turn.reply()["text"] == "".join(c.text or "" for c in seen), attempt
        assert turn.tool_calls() == [{"id": "call_a", "name": "ls", "arguments": "{"}]
        await session.close()
