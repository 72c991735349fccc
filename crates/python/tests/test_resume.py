"""``kernel.resume(id, name)``: a new session continues a finalized one, with
the conversation as it was sent and answered (``history``) and the tool calls
of its last reply that no tool has answered yet (``pending_tool_calls``)."""

from __future__ import annotations

import gc

import pytest

import settle
from conftest import Stream

WEATHER_CALL = [
    {"choices": [{"index": 0, "delta": {"content": "Checking."}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
]
PROMPT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"}]


async def run(session, items, input):
    async with await session.turn(Stream(items), input=input) as turn:
        async for _ in turn:
            pass
    assert turn.outcome == "completed"
    return turn


async def test_a_resumed_session_continues_a_finished_one_and_names_it(kernel):
    chat = await kernel.register("chat")
    await run(chat, ["Hello", ", you"], PROMPT)
    await chat.finish()

    resumed = await kernel.resume(chat.id, "again")
    assert isinstance(resumed, settle.Resumed)
    assert resumed.resumed_from == chat.id
    assert isinstance(resumed.session, settle.Session)
    assert resumed.session.id != chat.id and resumed.session.name == "again"
    assert not resumed.session.closed
    assert resumed.history == [*PROMPT, {"role": "assistant", "content": "Hello, you"}]
    assert resumed.pending_tool_calls == []
    rows = {row["id"]: row for row in await kernel.sessions()}
    assert rows[resumed.session.id]["resumed_from"] == chat.id
    assert rows[chat.id]["resumed_from"] is None

    # The history is what the next turn sends: it is stored as its input.
    follow_up = [*resumed.history, {"role": "user", "content": "and tomorrow?"}]
    await run(resumed.session, ["Same."], follow_up)
    assert (await resumed.session.transcript())[0]["input"] == follow_up
    await resumed.session.finish()


async def test_a_last_reply_with_tool_calls_gives_them_as_pending(kernel):
    chat = await kernel.register("chat")
    turn = await run(chat, WEATHER_CALL, PROMPT)
    await chat.finish()

    resumed = await kernel.resume(chat, "again")
    assert resumed.pending_tool_calls == turn.tool_calls() == [
        {"id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    ]
    assert resumed.history == [
        *PROMPT,
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            ],
        },
    ]

    # Their results go with the next turn, which the model answers.
    results = [{"role": "tool", "content": "18°C", "tool_call_id": call["id"]} for call in resumed.pending_tool_calls]
    await run(resumed.session, ["18°C in Paris."], [*resumed.history, *results])
    await resumed.session.finish()
    again = await kernel.resume(resumed.session.id, "third")
    assert again.pending_tool_calls == []
    assert again.history[-2:] == [*results, {"role": "assistant", "content": "18°C in Paris."}]


async def test_a_failed_last_turn_leaves_its_prompt_and_no_pending_calls(kernel):
    chat = await kernel.register("chat")
    async with await chat.turn(Stream(WEATHER_CALL, fail=RuntimeError("connection reset")), input=PROMPT) as turn:
        async for _ in turn:
            pass
    assert turn.outcome == "failed"
    assert len(turn.tool_calls()) == 1  # what it yielded before it failed
    await chat.finish()
    resumed = await kernel.resume(chat.id, "again")
    assert resumed.history == PROMPT
    assert resumed.pending_tool_calls == []


async def test_a_session_with_no_turn_resumes_with_an_empty_history(kernel):
    quiet = await kernel.register("quiet")
    await quiet.close()
    resumed = await kernel.resume(quiet.id, "again")
    assert resumed.history == [] and resumed.pending_tool_calls == []
    assert resumed.history is resumed.history  # the caller's to extend
    held = gc.get_referents(resumed)
    assert any(r is resumed.history for r in held) and any(r is resumed.session for r in held)


async def test_an_unknown_or_open_session_cannot_be_resumed(kernel):
    with pytest.raises(settle.BadInput, match="no session 987654"):
        await kernel.resume(987654, "again")
    live = await kernel.register("live")
    with pytest.raises(settle.BadInput, match="only a finalized session can be resumed"):
        await kernel.resume(live.id, "again")
    assert [row["id"] for row in await kernel.sessions()] == [live.id]


async def test_nothing_is_resumed_once_a_shutdown_began(kernel):
    done = await kernel.register("done")
    await done.finish()
    await kernel.shutdown(0.0)
    with pytest.raises(settle.ShuttingDown):
        await kernel.resume(done.id, "late")


async def test_a_message_s_name_is_kept_and_given_back(kernel):
    """Found from outside: a message's ``name`` (who of a chat room's users
    wrote it) was dropped from the stored input and from ``history``: after
    a restart the model saw who said what no more."""
    chat = await kernel.register("room")
    said = [{"role": "user", "name": "alice", "content": "I vote yes"}, {"role": "user", "name": "bob", "content": "I vote no"}]
    await run(chat, ["Tied."], said)
    assert (await chat.transcript())[0]["input"] == said
    await chat.finish()
    resumed = await kernel.resume(chat, "again")
    assert resumed.history == [*said, {"role": "assistant", "content": "Tied."}]
    await resumed.session.finish()
