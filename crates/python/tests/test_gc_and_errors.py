"""A garbage-collected awaitable leaves no turn running (the gap of
pyo3-async-runtimes' issue 64), and every error maps to its documented
class under ``settle.Error``."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import sys

import pytest

import settle
from conftest import Stream, eventually, run_script


async def ended_turns(session):
    for _ in range(2000):
        turns = await session.transcript()
        if turns and all(t["outcome"] is not None for t in turns):
            return turns
        await asyncio.sleep(0.01)
    raise AssertionError("a turn never ended")


async def test_g4_a_collected_next_chunk_awaitable_cancels_the_turn(kernel):
    session = await kernel.register("s")
    stream = Stream(["tick"], delay=0.05, forever=True)
    turn = await session.turn(stream)
    pending = turn.__anext__()
    del pending
    gc.collect()
    await eventually(lambda: turn.outcome is not None, "the turn's end")
    assert turn.outcome == "cancelled"
    await eventually(lambda: stream.closes, "the stream closed")
    assert stream.closes == 1


async def test_g4_a_collected_turn_start_awaitable_leaves_no_turn_running(kernel):
    session = await kernel.register("s")
    made = []

    def source():
        stream = Stream(["tick"], delay=0.05, forever=True)
        made.append(stream)
        return stream

    pending = session.turn(source)
    del pending
    gc.collect()
    # The session takes its next turn (its start waits for the cancelled
    # turn to have ended, if it has not yet).
    again = await session.turn(Stream(["next"]))
    async with again:
        assert [c.text async for c in again] == ["next"]
    # The collected start gave up where it was: before the kernel made its
    # turn (no turn), or after (that turn cancelled, its source closed once
    # if it was opened).
    outcomes = [turn["outcome"] for turn in await ended_turns(session)]
    assert outcomes in (["completed"], ["cancelled", "completed"]), outcomes
    await eventually(lambda: all(s.closes for s in made), "what was opened closed")
    assert [s.closes for s in made] in ([], [1])


async def test_a_joined_task_is_let_go_of_with_its_result(kernel):
    # The asyncio task keeps its control in its context; the control kept
    # the task, a cycle the collector could not see through.
    session = await kernel.register("s")

    async def job(i):
        await asyncio.sleep(0)
        return [i]

    def finished_settle_tasks():
        gc.collect()
        return sum(
            1
            for t in gc.get_objects()
            if isinstance(t, asyncio.Task) and t.done() and t.get_coro().__qualname__ == "_run_task"
        )

    # Earlier tests' tasks may linger (held by what they kept): count ours only.
    before = finished_settle_tasks()
    for i in range(50):
        task = await session.spawn(job(i))
        assert await task.join() == [i]
    del task
    await asyncio.sleep(0.05)
    after = finished_settle_tasks()
    assert after <= before, f"{after - before} finished asyncio tasks still alive"


def test_every_exception_is_a_settle_error():
    for cls in (
        settle.SessionClosed,
        settle.SessionClosing,
        settle.AlreadyFinalized,
        settle.ShuttingDown,
        settle.StoreError,
        settle.BadInput,
        settle.Detached,
        settle.Cancelled,
        settle.TurnRunning,
    ):
        assert issubclass(cls, settle.Error)
        assert cls.__doc__
    assert issubclass(settle.Error, Exception)


async def test_g11_bad_input_is_refused_before_anything_is_written(kernel, tmp_path):
    session = await kernel.register("s")
    with pytest.raises(settle.BadInput):
        session.turn(Stream(), input=42)
    with pytest.raises(settle.BadInput):
        await kernel.session(987654)
    with pytest.raises(settle.BadInput):
        await kernel.sessions(state="sleeping")
    with pytest.raises(settle.BadInput):
        await settle.Kernel.open(str(tmp_path / "no" / "such" / "folder" / "x.db"))
    with pytest.raises(settle.BadInput):
        await settle.Kernel.open(str(tmp_path / "y.db"), settle_timeout=-1.0)
    async def tool() -> None:
        pass

    with pytest.raises(settle.BadInput, match="not function"):
        session.spawn(tool)  # the function, not the coroutine its call makes
    with pytest.raises(settle.BadInput, match="path is empty"):
        await settle.Kernel.open("")  # an unset variable: SQLite's temporary database
    assert await session.transcript() == []


async def test_g11_a_number_out_of_range_or_a_lone_surrogate_is_bad_input_not_a_builtin_error(kernel, tmp_path):
    session = await kernel.register("s")
    surrogate = "bad \udc80 name"
    for call in (
        lambda: kernel.session(-1),
        lambda: kernel.session(2**70),
        lambda: kernel.register("x", -1),
        lambda: kernel.resume(-1, "r"),
        lambda: settle.Budget(turns=-1),
        lambda: settle.Budget(tokens=2**70),
        lambda: settle.Kernel.open(str(tmp_path / "z.db"), lru_cap=-1),
        lambda: kernel.register(surrogate),
        lambda: session.child(surrogate),
        lambda: session.hold(surrogate),
        lambda: session.turn(Stream(["x"]), input=surrogate),
        lambda: session.turn(Stream(["x"]), input=[{"role": "user", "content": surrogate}]),
        lambda: settle.Kernel.open(str(tmp_path / surrogate)),
    ):
        with pytest.raises(settle.BadInput) as refused:
            result = call()
            if hasattr(result, "__await__"):
                await result
        message = str(refused.value)
        assert "out of range" in message or "surrogate" in message, message
    assert await session.transcript() == []
    assert [row["name"] for row in await kernel.sessions()] == ["s"]


async def test_g11_a_lone_surrogate_in_a_state_filter_a_chunk_kind_or_a_values_str_is_bad_input(kernel):
    class Odd:
        def __str__(self) -> str:
            return "odd \udc80"

    for call in (
        lambda: kernel.sessions("\ud800"),
        lambda: settle.Chunk("\ud800", "x"),
        lambda: settle.Chunk("data", Odd()),
        lambda: settle.Chunk("data", {Odd(): 1}),
    ):
        with pytest.raises(settle.BadInput, match="surrogate"):
            result = call()
            if hasattr(result, "__await__"):
                await result


async def test_g11_a_lone_surrogate_is_named_where_it_is(kernel):
    """The message names the surrogate the string holds, and where, not an
    example of another one."""
    for text, said in (("ab\ud800", "'\\ud800' at character 2"), ("\udfff", "'\\udfff' at character 0")):
        with pytest.raises(settle.BadInput) as refused:
            await kernel.register(text)
        assert said in str(refused.value), str(refused.value)


async def test_g11_a_turn_whose_source_yields_a_lone_surrogate_fails_as_for_an_openai_shaped_chunk(kernel):
    session = await kernel.register("s")
    errors = []
    for items, to_chunk in (
        ([{"choices": [{"index": 0, "delta": {"content": "\udc80"}}]}], None),
        (["\udc80"], None),
        ([("\udc80", "ok")], None),
        ([1], lambda _: "\udc80"),
    ):
        async with await session.turn(Stream(items), to_chunk=to_chunk) as turn:
            assert [c async for c in turn] == []
        assert turn.outcome == "failed", (items, turn.error)
        errors.append(turn.error)
    assert "BadInput" in errors[0][1] and "surrogate" in errors[0][1], errors[0]
    assert errors == [errors[0]] * len(errors), errors


async def test_g7_a_character_split_across_two_items_is_joined(kernel):
    """Found from outside: a server (or a proxy) that cuts its text by UTF-16
    code units sends an emoji as a high surrogate in one event and its low
    surrogate in the next; the turn failed ``BadInput`` at the first half,
    where the ``openai`` package alone reads the reply. The high half a
    string ends with is joined to the low half the next string in the same
    place starts with: in ``str`` items, in a delta's content, in a tool
    call's arguments. A half nothing completes still fails."""

    def content(text, finish=None):
        return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}

    def arguments(text, index=0):
        call = {"index": index, "function": {"arguments": text}}
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    cases = [
        (["Hi \ud83d", "\ude00 there"], "text", ["Hi ", "\U0001f600 there"]),
        (["Hi \ud83d", "", "\ude00"], "text", ["Hi ", "\U0001f600"]),
        ([content("Hi "), content("\ud83d"), content("\ude00"), content(" there", "stop")], "text", ["Hi ", "\U0001f600", " there"]),
        (
            [arguments('{"face": "\ud83d'), arguments('\ude00"}'), content(None, "tool_calls")],
            "tool_call",
            None,
        ),
    ]
    for items, kind, texts in cases:
        session = await kernel.register("s")
        async with await session.turn(Stream(items)) as turn:
            got = [c async for c in turn]
        assert turn.outcome == "completed", (items, turn.error)
        assert {c.kind for c in got} == {kind}, got
        if texts is not None:
            assert [c.text for c in got] == texts
        else:
            assert turn.tool_calls()[0]["arguments"] == '{"face": "\U0001f600"}'
        await session.finish()
    # Halves of two different calls are no character, whichever list
    # position their pieces come at.
    other_call = [arguments('{"a": "\ud83d'), arguments('\ude00"}', index=1), content(None, "tool_calls")]
    for items in (["\ud83d", "no low half"], ["\ude00"], ["ends half-way \ud83d"], other_call):
        session = await kernel.register("s")
        async with await session.turn(Stream(items)) as turn:
            async for _ in turn:
                pass
        assert turn.outcome == "failed", (items, turn.error)
        assert "BadInput" in turn.error[1] and "surrogate" in turn.error[1], turn.error
        await session.finish()


async def test_g11_a_float_that_is_nan_or_infinite_fails_the_turn_instead_of_being_dropped(kernel):
    """Found from outside: a delta's content of NaN was taken for null and
    dropped, the turn ending completed, and a usage count of inf was kept
    as null. JSON has neither: the item is refused as bad input."""
    session = await kernel.register("s")
    for item in (
        {"choices": [{"index": 0, "delta": {"content": float("nan")}}]},
        {"choices": [], "usage": {"total_tokens": float("inf")}},
    ):
        async with await session.turn(Stream(["before", item])) as turn:
            assert [c.text async for c in turn] == ["before"]
        assert turn.outcome == "failed", (item, turn.error)
        assert "BadInput" in turn.error[1] and "no JSON form" in turn.error[1], turn.error


async def test_a_source_failing_with_a_lone_surrogate_in_its_message_fails_the_turn_at_once(kernel):
    session = await kernel.register("s")
    failing = Stream(["a"], fail=ValueError("bad \udc80 news"))
    async with await session.turn(failing, idle_timeout=10.0) as turn:
        assert [c.text async for c in turn] == ["a"]
    assert turn.outcome == "failed", turn.error
    assert turn.error[1] == "the provider reported an error: ValueError: bad \\udc80 news", turn.error
    assert failing.closes == 1


async def test_a_source_failing_with_an_exception_whose_str_raises_fails_the_turn_at_once(kernel):
    """Found from outside: a library exception whose ``__str__`` raises
    (it reads an attribute never set) killed the pump before it told the
    kernel, and the turn ran on until its idle timeout, or forever
    without one."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise AttributeError("never set")

    session = await kernel.register("s")
    failing = Stream(["a"], fail=Unprintable())
    async with await session.turn(failing, idle_timeout=0) as turn:
        texts = await asyncio.wait_for(_texts(turn), 10)
    assert texts == ["a"]
    assert turn.outcome == "failed", turn.error
    assert "Unprintable" in turn.error[1], turn.error
    assert failing.closes == 1


async def test_a_source_failing_with_an_exception_that_cannot_be_described_fails_the_turn(kernel):
    """Found from outside, again: an exception whose ``__str__`` raises
    ``CancelledError`` or ``GeneratorExit`` (neither an ``Exception``), or
    whose class's metaclass refuses to give its name, still killed the
    pump before it told the kernel, silently for ``CancelledError``, and
    the turn ran on. It fails, said as well as it can be."""

    class Meta(type):
        def __getattribute__(cls, name: str) -> object:
            if name in ("__qualname__", "__module__", "__name__"):
                raise RuntimeError("meta boom")
            return super().__getattribute__(name)

    class Nameless(Exception, metaclass=Meta):
        pass

    class StrCancels(Exception):
        def __str__(self) -> str:
            raise asyncio.CancelledError()

    class StrExits(Exception):
        def __str__(self) -> str:
            raise GeneratorExit()

    for error in [Nameless("x"), StrCancels("x"), StrExits("x")]:
        session = await kernel.register("s")
        failing = Stream(["a"], fail=error)
        async with await session.turn(failing, idle_timeout=0) as turn:
            texts = await asyncio.wait_for(_texts(turn), 10)
        assert texts == ["a"]
        assert turn.outcome == "failed", (error, turn.error)
        assert failing.closes == 1


async def test_a_failures_message_is_told_on_one_line_and_bounded(kernel):
    """Found from outside: a source's exception message (or a chunk's
    ``error``) with line breaks and terminal escapes, or of 50 MB, was kept
    and stored whole and raw; the gateway quotes its server's on one
    line, bounded. So does Python now."""
    raw = "first\r\nsecond \x1b[31mred " + "x" * 5_000_000
    cases = [
        Stream(["a"], fail=ValueError(raw)),
        Stream(["a", {"error": {"message": raw}}]),
    ]
    for source in cases:
        session = await kernel.register("s")
        async with await session.turn(source) as turn:
            assert await _texts(turn) == ["a"]
        assert turn.outcome == "failed", turn.error
        message = turn.error[1]
        assert "first second \\u{1b}[31mred" in message, message[:300]
        assert len(message) < 400, len(message)
        assert not any(ord(c) < 32 for c in message), message


async def test_bytes_inside_a_chunk_are_bad_input_not_their_repr(kernel):
    """Found from outside: bytes inside an OpenAI-shaped dict were stored
    as their repr (``"b'bytes'"``) and the turn completed."""
    for value in [b"bytes", bytearray(b"\xff")]:
        session = await kernel.register("s")
        chunk = {"choices": [{"index": 0, "delta": {"content": value}}]}
        async with await session.turn(Stream([chunk])) as turn:
            assert await _texts(turn) == []
        assert turn.outcome == "failed", turn.error
        assert "BadInput" in turn.error[1] and "bytes" in turn.error[1], turn.error


async def _texts(turn) -> list:
    return [c.text async for c in turn]


async def test_a_chunk_that_cannot_be_read_fails_the_turn_saying_to_use_to_chunk(kernel):
    session = await kernel.register("s")
    async with await session.turn(Stream([object()])) as turn:
        assert [c async for c in turn] == []
    assert turn.outcome == "failed"
    kind, message = turn.error
    assert "to_chunk" in message


async def test_g9_nothing_starts_once_a_shutdown_began(kernel):
    session = await kernel.register("s")
    kernel.begin_shutdown(0.0)  # does not wait
    await eventually(lambda: kernel.shutting_down, "the shutdown to begin")
    with pytest.raises(settle.ShuttingDown):
        await kernel.register("late")
    await kernel.stopped()
    with pytest.raises((settle.ShuttingDown, settle.SessionClosed)):
        await session.turn(Stream())
    assert await session.finalized() == "shutdown"


async def test_a_source_that_is_not_an_async_iterable_fails_the_turn_saying_so(kernel):
    session = await kernel.register("s")
    async with await session.turn(lambda: [1, 2]) as turn:
        assert [c async for c in turn] == []
    assert turn.outcome == "failed"
    assert "not an async iterable" in turn.error[1]


async def test_g11_a_source_that_cannot_stream_is_bad_input_at_the_call(kernel):
    """Found from outside: a list or a plain iterator handed as a turn's
    source became a stored turn ``failed``, the provider blamed. It is
    refused at the call, as a coroutine function handed to ``spawn`` is,
    and nothing starts."""
    session = await kernel.register("s")
    for source in ([1, 2], iter(["a"]), "text", 42):
        with pytest.raises(settle.BadInput, match="not an async iterable"):
            session.turn(source)  # type: ignore[arg-type]
    assert await session.state() == "registered"
    async with await session.turn(Stream(["ok"])) as turn:
        assert [c.text async for c in turn] == ["ok"]
    assert turn.no == 1, "a refused source took a turn's number"


def test_a_call_made_outside_an_event_loop_is_a_settle_error_saying_where_to_make_it(tmp_path):
    """Found from outside: ``asyncio.run(settle.Kernel.open(db))``, which
    type-checks, failed with asyncio's bare ``RuntimeError: no running
    event loop``. A settle call made from plain code says where it runs."""
    with pytest.raises(settle.Error, match="inside an `async def`"):
        settle.Kernel.open(str(tmp_path / "x.db"))


async def test_an_exception_in_the_kernels_async_with_block_goes_on_up(db):
    with pytest.raises(RuntimeError, match="boom"):
        async with await settle.Kernel.open(db) as kernel:
            await kernel.register("s")
            raise RuntimeError("boom")
    assert kernel.shutting_down


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checked through /proc/self/fd")
async def test_a_database_open_through_pythons_sqlite3_is_refused(tmp_path):
    """Python's `sqlite3` is another copy of SQLite: in one process the two do
    not see each other's locks (a kernel's write went through in the middle
    of an exclusive transaction of the other), so the kernel refuses a file
    the other has open, and opens it once that is closed."""
    path = str(tmp_path / "s.db")
    other = sqlite3.connect(path)  # the program's own connection, first
    other.execute("PRAGMA user_version").fetchall()
    try:
        with pytest.raises(settle.BadInput, match="another copy of SQLite"):
            await settle.Kernel.open(path)
    finally:
        other.close()
    kernel = await settle.Kernel.open(path)
    assert await kernel.sessions() == []
    await kernel.shutdown(0.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checked through /proc/self/fd")
async def test_a_database_a_kernel_of_this_process_opened_opens_again(tmp_path):
    """The kernel's own handles on its file are no other copy's: a second
    kernel on the same file, while the first is open, is not refused."""
    path = str(tmp_path / "s.db")
    first = await settle.Kernel.open(path)
    second = await settle.Kernel.open(path)
    await second.shutdown(0.0)
    await first.shutdown(0.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checked through /proc/self/fd")
async def test_a_database_whose_open_was_given_up_opens_again_at_once(tmp_path):
    """An open given up under a timeout goes on opening on its own thread:
    its handles on the file are a kernel's, not another copy of SQLite's,
    so opening again right away is not refused as if Python's `sqlite3`
    had the file (it was, on this machine, for timeouts of 20-30 ms)."""
    for i, timeout in enumerate([0.001, 0.005, 0.01, 0.02, 0.03, 0.05]):
        path = str(tmp_path / f"s{i}.db")
        try:
            first = await asyncio.wait_for(settle.Kernel.open(path), timeout)
        except asyncio.TimeoutError:
            first = None
        kernel = await settle.Kernel.open(path)
        await kernel.shutdown(0.0)
        if first is not None:
            await first.shutdown(0.0)


async def test_g10_a_session_winding_down_refuses_new_work_as_session_closing(tmp_path):
    """A child used while its parent's finish winds it down (a grandchild's
    task still settling): a turn, a task and a child are refused with
    ``settle.SessionClosing``, a ``SessionClosed``, so a framework's one
    ``except settle.SessionClosed`` covers the whole race with the finish,
    never a bare ``settle.Error``."""

    started = asyncio.Event()

    async def stubborn():
        started.set()
        for _ in range(2):
            try:
                await asyncio.sleep(3)
            except asyncio.CancelledError:
                pass

    kernel = await settle.Kernel.open(str(tmp_path / "closing.db"), settle_timeout=2.0)
    async with kernel:
        root = await kernel.register("root")
        child = await root.child("child")
        grandchild = await child.child("grandchild")
        await grandchild.spawn(stubborn())
        # A task cancelled before its first step never runs its body, and
        # ends at once: the finish must meet it already running.
        await started.wait()
        finishing = asyncio.create_task(root.finish())
        await asyncio.sleep(0.2)
        assert await child.state() == "cancelling"
        refused = []
        for call in (
            lambda: child.turn(Stream(["a"])),
            lambda: child.spawn(asyncio.sleep(0)),
            lambda: child.child("late"),
            lambda: root.child("late"),
        ):
            with pytest.raises(settle.SessionClosing) as raised:
                await call()
            refused.append(raised.value)
        assert all(isinstance(e, settle.SessionClosed) for e in refused)
        assert await finishing == "completed"
    assert issubclass(settle.SessionClosing, settle.SessionClosed)
    assert settle.SessionClosing.__doc__


async def test_g11_a_session_name_holding_a_nul_is_bad_input(kernel):
    """PostgreSQL's text keeps no NUL: such a name is refused before the
    kernel sees it, on every store alike."""
    root = await kernel.register("root")
    with pytest.raises(settle.BadInput, match="NUL"):
        await kernel.register("a\0b")
    with pytest.raises(settle.BadInput, match="NUL"):
        await root.child("c\0")
    assert [row["name"] for row in await kernel.sessions()] == ["root"]


async def test_g11_a_blank_or_overlong_session_name_is_bad_input_at_await(kernel):
    """As ``settle serve`` refuses them: a blank name, or one over 128
    characters, is refused when the call is awaited, and nothing is
    registered."""
    root = await kernel.register("root")
    await root.finish()
    for call in (
        lambda: kernel.register(""),
        lambda: kernel.register(" \t\n"),
        lambda: kernel.register("x" * 129),
        lambda: root.child(""),
        lambda: kernel.resume(root.id, "  "),
    ):
        pending = call()  # the call itself raises nothing
        with pytest.raises(settle.BadInput, match="blank|at most 128 characters"):
            await pending
    assert [row["name"] for row in await kernel.sessions()] == ["root"]
    longest = await kernel.register("é" * 128)
    assert longest.name == "é" * 128


async def test_g11_an_unknown_session_is_said_in_python_words(kernel):
    """A parent or a session id that neither the kernel nor its store has:
    ``BadInput`` that says so, not the core's "sending events"."""
    for call in (lambda: kernel.register("x", 987654), lambda: kernel.session(987654)):
        with pytest.raises(settle.BadInput) as refused:
            await call()
        assert str(refused.value) == "session 987654 is not known to this kernel or its store"
    assert await kernel.sessions() == []


async def test_a_store_path_may_be_a_pathlib_path(tmp_path):
    """``str`` or ``os.PathLike[str]``, as Python's own file functions take;
    a path that is not UTF-8 is ``BadInput``."""
    path = tmp_path / "by_path.db"
    kernel = await settle.Kernel.open(path, settle_timeout=0.3, drain_timeout=0.0)
    try:
        session = await kernel.register("s")
        assert [row["id"] for row in await kernel.sessions()] == [session.id]
    finally:
        await kernel.shutdown(0.0)
    assert path.exists()
    with pytest.raises(settle.BadInput, match="not UTF-8"):
        await settle.Kernel.open(tmp_path / "bad \udc80 name.db")
    with pytest.raises(TypeError):
        settle.Kernel.open(42)  # type: ignore[arg-type]


async def test_g10_a_turn_of_a_finalized_session_stopped_by_cancel_turn_is_session_closed(kernel):
    """Found from outside: ``turn()`` on a finalized session, with
    ``cancel_turn()`` called in the same step (a stop button racing the
    agent loop's next turn after its parent finished it), answered
    ``Cancelled`` ("the user stopped this turn, go on") instead of
    ``SessionClosed`` (G10: "closed, stop"), 20 times in 20."""
    for n in range(5):
        session = await kernel.register(f"s{n}")
        assert await session.finish() == "completed"
        started, stopped = await asyncio.gather(
            session.turn(Stream(["x"])), session.cancel_turn(), return_exceptions=True
        )
        assert isinstance(started, settle.SessionClosed), repr(started)
        assert isinstance(stopped, settle.AlreadyFinalized), repr(stopped)


async def test_g1_a_finish_made_before_a_childs_turn_is_seen_first_by_the_kernel(kernel):
    """Found from outside: with a parent's ``finish()`` made, then its
    child's ``turn()`` made, the turn answered ``TurnRunning`` (the child's
    running turn had not been wound down yet) about one time in ten
    instead of ``SessionClosing``: the two calls reached the kernel in
    either order. A call that changes the lifecycle is queued to the
    kernel when it is made, so calls made in order are seen in order: the turn finds the
    child closing, or finalized already once its turn settled."""
    answers = []
    for n in range(40):
        parent = await kernel.register(f"p{n}")
        child = await parent.child("c")
        turn = await child.turn(Stream(["x"] * 1000, delay=0.01))
        finishing = parent.finish()
        started = child.turn(Stream(["y"]))
        results = await asyncio.gather(finishing, started, return_exceptions=True)
        answers.append(type(results[1]).__name__)
        await turn.aclose()
    assert set(answers) <= {"SessionClosing", "SessionClosed"}, answers


async def test_g10_after_a_clean_stop_a_finalized_sessions_child_is_session_closed(db):
    """As turn, spawn and finish do: ``ShuttingDown`` is for a session the
    stop left for recovery."""
    kernel = await settle.Kernel.open(db)
    root = await kernel.register("root")
    await kernel.shutdown()
    with pytest.raises(settle.SessionClosed):
        await root.child("late")


KEY = "sk-TESTKEY-0123456789abcdef"


async def _failed_with(kernel, source):
    """The error of a turn over ``source``, as the turn says it and as the
    store keeps it."""
    session = await kernel.register("s")
    async with await session.turn(source) as turn:
        async for _ in turn:
            pass
    assert turn.outcome == "failed", turn.error
    [stored] = await session.transcript()
    return turn.error[1], stored["error"]["message"]


async def test_a_secret_given_to_the_kernel_is_masked_in_every_turn_error(db, monkeypatch):
    """Found from outside: a server that answers 401 "Incorrect API key
    provided: sk-…" had the key stored in the turn's error (``settle show``,
    ``export``) through Python, where the Rust provider masks its own. The
    package cannot know the program's client's key: ``secrets=`` names it,
    and it is masked wherever a turn's error is made (the source's
    exception, a chunk's ``error``), the longest secret first."""
    for name in settle_key_variables():
        monkeypatch.delenv(name, raising=False)

    async def failing():
        yield "a"
        raise ValueError(f"Incorrect API key provided: {KEY}. Also {KEY[:7]} alone.")

    kernel = await settle.Kernel.open(db, settle_timeout=0.3, secrets=[KEY[:7], KEY])
    try:
        for source in (failing(), Stream(["a", {"error": {"message": f"bad key {KEY}"}}])):
            told, stored = await _failed_with(kernel, source)
            for message in (told, stored):
                assert "***" in message, message
                assert KEY[:7] not in message and "0123456789" not in message, message
        told, _ = await _failed_with(kernel, failing())
        assert told.endswith("Incorrect API key provided: ***. Also *** alone."), told
    finally:
        await kernel.shutdown(0.0)

    # One string is one secret, not its characters; an empty one is none.
    kernel = await settle.Kernel.open(None, secrets=KEY)
    try:
        told, stored = await _failed_with(kernel, Stream(["a"], fail=ValueError(f"key {KEY}")))
        assert told.endswith("ValueError: key ***") and stored == told, (told, stored)
    finally:
        await kernel.shutdown(0.0)
    kernel = await settle.Kernel.open(None, secrets=["", KEY])
    try:
        told, _ = await _failed_with(kernel, Stream(["a"], fail=ValueError(f"key {KEY}")))
        assert told.endswith("ValueError: key ***"), told
    finally:
        await kernel.shutdown(0.0)
    with pytest.raises(TypeError):
        await settle.Kernel.open(None, secrets=[KEY, 1])


async def test_a_secret_echoed_in_another_case_cut_short_or_starred_is_masked(db, monkeypatch):
    """Found from outside (the gateway's provider, whose masking the
    package's now shares): a server echoing the key it refused
    lower-cased, cut short or with its end starred leaked most of it; only
    the exact key was masked. Short pieces (a key's last four) are left."""
    for name in settle_key_variables():
        monkeypatch.delenv(name, raising=False)
    key = "sk-SECRETVALUE1234567"
    echoed = f"lower {key.lower()} cut {key[:-2]} starred {key[:14]}******* last {key[-4:]}"
    kernel = await settle.Kernel.open(db, settle_timeout=0.3, secrets=[key])
    try:
        told, stored = await _failed_with(kernel, Stream(["a"], fail=ValueError(echoed)))
        for message in (told, stored):
            assert message.endswith(
                f"lower *** cut *** starred ********** last {key[-4:]}"
            ), message
    finally:
        await kernel.shutdown(0.0)


def settle_key_variables():
    return [
        "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", "GROQ_API_KEY",
        "MISTRAL_API_KEY", "TOGETHER_API_KEY", "DEEPSEEK_API_KEY", "OPENROUTER_API_KEY",
        "SETTLE_API_KEY",
    ]


async def test_the_keys_of_the_usual_environment_variables_are_masked_by_default(db, monkeypatch):
    """Without ``secrets=``, the values of the variables the common clients
    read their keys from (``OPENAI_API_KEY``...) are masked, read when the
    kernel starts; a value shorter than 8 characters is not (it would take
    that text out of every message)."""
    for name in settle_key_variables():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("GROQ_API_KEY", "gsk-ENVKEY-42")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "short")
    kernel = await settle.Kernel.open(db, settle_timeout=0.3)
    try:
        error = ValueError(f"Incorrect API key provided: {KEY}, gsk-ENVKEY-42, short")
        told, stored = await _failed_with(kernel, Stream(["a"], fail=error))
        for message in (told, stored):
            assert message.endswith("Incorrect API key provided: ***, ***, short"), message
    finally:
        await kernel.shutdown(0.0)


async def test_the_key_an_openai_client_is_refused_with_is_masked(db, monkeypatch):
    """The case found: an ``openai.AsyncOpenAI`` client whose server
    answers 401 quoting the key; the client's key is in ``OPENAI_API_KEY``."""
    openai = pytest.importorskip("openai")
    for name in settle_key_variables():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    async def refuse(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        body = (
            '{"error": {"message": "Incorrect API key provided: %s", "type": '
            '"invalid_request_error", "code": "invalid_api_key"}}' % KEY
        ).encode()
        writer.write(
            b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    model = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    kernel = await settle.Kernel.open(db, settle_timeout=0.3)
    try:
        session = await kernel.register("s")
        async with await session.turn(
            lambda: model.chat.completions.create(model="m", messages=messages, stream=True),
            input=messages,
        ) as turn:
            async for _ in turn:
                pass
        assert turn.outcome == "failed", turn.error
        [stored] = await session.transcript()
        for message in (turn.error[1], stored["error"]["message"]):
            assert "AuthenticationError" in message and "***" in message, message
            assert "0123456789" not in message, message
    finally:
        await kernel.shutdown(0.0)
        server.close()


async def test_a_task_nobody_keeps_that_awaits_a_kernel_call_is_not_collected(kernel):
    """A task started with ``asyncio.create_task`` and no reference kept
    (fire-and-forget, as frameworks do) that waits on a kernel call is kept
    alive by that call, as one waiting on a timer or a socket is by the
    loop: a collection meanwhile neither destroys it ("Task was destroyed
    but it is pending!") nor cancels its turn or task. A call nobody awaits
    is still collected, and cancels its work."""
    reading = await kernel.register("reading")
    joining = await kernel.register("joining")
    log = []

    async def reader() -> None:
        turn = await reading.turn(Stream(["a", "b", "c"], delay=0.05))
        async for chunk in turn:
            log.append(("chunk", chunk.text))
        log.append(("turn", turn.outcome))

    async def tool() -> int:
        await asyncio.sleep(0.3)
        return 7

    async def joiner() -> None:
        task = await joining.spawn(tool())
        log.append(("joined", await task))

    asyncio.create_task(reader())
    asyncio.create_task(joiner())
    for _ in range(8):
        await asyncio.sleep(0.05)
        gc.collect()
    await eventually(lambda: len(log) == 5, "the two tasks' ends")
    assert sorted(log) == [
        ("chunk", "a"), ("chunk", "b"), ("chunk", "c"), ("joined", 7), ("turn", "completed"),
    ]
    # A call is kept only while a task waits on it: resolved, or cancelled
    # with its task, it is let go of.
    from settle import _bridge

    other = await kernel.register("other")
    sleeper = await other.spawn(asyncio.sleep(10))
    joined = asyncio.create_task(sleeper.join())
    await asyncio.sleep(0.05)
    assert _bridge._AWAITED, "the join a task waits on is kept"
    joined.cancel()
    sleeper.cancel()
    await eventually(lambda: not _bridge._AWAITED, "every call let go of")


async def test_g8_a_store_silent_for_a_whole_lease_stops_the_kernel_and_lease_ttl_says_how_long(db):
    """Found from outside: a store locked for about 30 s stopped the kernel
    for good, which the package never said, and nothing could change it.
    ``lease_ttl`` says how long the lease lasts unrenewed (its docstring
    says what follows): here a short one, outlived by the lock."""
    import subprocess
    import sys

    from conftest import LOCKER, PATIENCE, eventually

    for bad in (0, -1.0):
        with pytest.raises(settle.BadInput, match="lease_ttl"):
            await settle.Kernel.open(db, lease_ttl=bad)
    kernel = await settle.Kernel.open(db, lease_ttl=1.5, store_timeout=10.0, settle_timeout=0.3)
    try:
        await kernel.register("s")
        assert not kernel.shutting_down
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, db, "4"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            assert locker.stdout.readline().strip() == "locked"
            await eventually(lambda: kernel.shutting_down, "the kernel stopped", PATIENCE)
        finally:
            locker.kill()
            locker.wait()
        with pytest.raises(settle.ShuttingDown):
            await kernel.register("late")
    finally:
        await kernel.shutdown(0.0)


#: A program's reader left pending on a loop closed without cancelling its
#: tasks (as some frameworks close theirs): its coroutine, inside the
#: kernel's and the turn's ``async with``, is closed later by the
#: collector (``collect``) or at interpreter exit (``exit``), on no loop.
LEFT_INSIDE_ASYNC_WITH_SCRIPT = """
import asyncio, gc, sys, time
import settle

async def items():
    while True:
        await asyncio.sleep(0.01)
        yield "x"

async def reader(db, box):
    async with await settle.Kernel.open(db, settle_timeout=0.3) as kernel:
        box.append(kernel)
        session = await kernel.register("s")
        box.append(session)
        async with await session.turn(items) as turn:
            async for _ in turn:
                pass

async def main(box):
    asyncio.ensure_future(reader(sys.argv[1], box))
    while len(box) < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)

box = []
loop = asyncio.new_event_loop()
loop.run_until_complete(main(box))
type(loop).close(loop)
if sys.argv[2] != "exit":
    # The kernel finds the loop closed (it looks about once a second) and
    # lets go of what the reader waited on: the collector can take it.
    time.sleep(2.5)
    if sys.argv[2] == "collect":
        gc.collect()
    kernel, session = box
    async def after():
        if sys.argv[2] == "collect_on_another_loop":
            gc.collect()
        await kernel.stopped()
        print("stopped", [t["outcome"] for t in await session.transcript()], flush=True)
    asyncio.run(after())
print("end", flush=True)
"""


@pytest.mark.parametrize("when", ["collect", "collect_on_another_loop", "exit"])
def test_g4_g9_a_reader_closed_off_its_loop_inside_async_with_ends_its_turn_and_kernel_quietly(db, when):
    """Found from outside: a program's coroutine left pending inside
    ``async with kernel`` and ``async with turn`` (its loop closed under
    it), closed later by the collector or at interpreter exit, had each
    ``__aexit__`` raise ``settle.Error`` ("settle's calls run on the event
    loop of the code that awaits them...") into the close, which Python
    printed as "Exception ignored": the exits asked for the running loop
    to make their awaitable, and no loop runs there; collected while
    another loop ran, the exits' awaitables suspended the closing
    coroutine ("coroutine ignored GeneratorExit"). Either way the kernel
    was never shut down. Now the exit of a coroutine being closed awaits
    nothing: the turn is cancelled and settles on the kernel's threads (as
    when it is dropped), and the kernel's shutdown begins without being
    waited for."""
    out = run_script(LEFT_INSIDE_ASYNC_WITH_SCRIPT, db, when, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    if when != "exit":
        assert lines == ["stopped ['cancelled']", "end"], out.stdout + out.stderr
    else:
        assert lines == ["end"], out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    assert "settle.Error" not in out.stderr, out.stderr
