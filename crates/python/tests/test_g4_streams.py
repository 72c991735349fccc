"""G4: a turn's stream is closed exactly once, on end, error, idle timeout,
cancel and drop, and when the cancel lands while it is being opened; and
leaving an ``async with`` (or ``aclose()``) closes the turn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time

import pytest

import settle
from conftest import LOCKER, PATIENCE, Stream, eventually


async def test_g4_stream_closed_once_on_end(kernel):
    session = await kernel.register("s")
    stream = Stream(["a", "b", "c"])
    async with await session.turn(lambda: stream, input="go") as turn:
        assert [chunk.text async for chunk in turn] == ["a", "b", "c"]
    assert turn.outcome == "completed"
    await eventually(lambda: stream.closes, "the stream closed")
    assert stream.closes == 1


async def test_g4_stream_closed_once_on_error_and_the_turn_says_why(kernel):
    session = await kernel.register("s")
    stream = Stream(["a"], fail=ValueError("the model fell over"))
    async with await session.turn(stream) as turn:
        assert [chunk.text async for chunk in turn] == ["a"]
    assert turn.outcome == "failed"
    kind, message = turn.error
    assert kind == "provider"
    assert "ValueError: the model fell over" in message
    await eventually(lambda: stream.closes, "the stream closed")
    assert stream.closes == 1
    [stored] = await session.transcript()
    assert stored["error"]["message"] == message


class ClosesSlowly:
    """A source whose ``aclose()`` awaits, as a generator holding an HTTP
    response in ``async with`` does while it releases the connection."""

    def __init__(self, items, fail=None) -> None:
        self.items = list(items)
        self.fail = fail
        self.entered = 0
        self.finished = 0

    def __aiter__(self) -> "ClosesSlowly":
        return self

    async def __anext__(self):
        await asyncio.sleep(0)
        if self.items:
            return self.items.pop(0)
        if self.fail is not None:
            raise self.fail
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.entered += 1
        await asyncio.sleep(0.05)
        self.finished += 1


@pytest.mark.parametrize("fail", [None, ValueError("the model fell over")])
async def test_g4_a_source_whose_close_awaits_is_closed_to_its_end_when_the_turn_ends_or_fails(kernel, fail):
    """The kernel closing the stream of a turn that ended (or failed) on
    its own does not cancel the source's close half way: the pump is
    already closing it, once, and the turn's end waits for that close."""
    session = await kernel.register("s")
    for _ in range(3):
        source = ClosesSlowly(["a", "b"], fail)
        async with await session.turn(source, input="go") as turn:
            assert [chunk.text async for chunk in turn] == ["a", "b"]
        assert turn.outcome == ("failed" if fail else "completed")
        await eventually(lambda: source.entered, "the source's close began")
        await asyncio.sleep(0.2)
        assert (source.entered, source.finished) == (1, 1), "the source's close was cut short"


async def test_g4_stream_closed_once_on_idle_timeout(db):
    kernel = await settle.Kernel.open(db, settle_timeout=0.3, idle_timeout=0.2)
    try:
        session = await kernel.register("s")
        stream = Stream(["a"], delay=30.0)
        async with await session.turn(stream) as turn:
            assert [chunk.text async for chunk in turn] == []
        assert turn.outcome == "idle_timeout"
        await eventually(lambda: stream.closes, "the stream closed")
        assert stream.closes == 1
    finally:
        await kernel.shutdown(0.0)


async def test_g4_stream_closed_once_when_the_reading_task_is_cancelled(kernel):
    session = await kernel.register("s")
    stream = Stream(["tick"], delay=0.02, forever=True)
    turn = await session.turn(stream)

    async def read() -> None:
        async with turn:
            async for _ in turn:
                pass

    reader = asyncio.create_task(read())
    await asyncio.wait_for(stream.first_item.wait(), 10)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await eventually(lambda: turn.outcome is not None, "the turn's end")
    assert turn.outcome == "cancelled"
    await eventually(lambda: stream.closes, "the stream closed")
    await asyncio.sleep(0.1)
    assert stream.closes == 1
    # The session stays open for another turn.
    async with await session.turn(Stream(["next"])) as again:
        assert [c.text async for c in again] == ["next"]


async def test_g4_breaking_out_of_async_with_closes_the_turn(kernel):
    session = await kernel.register("s")
    stream = Stream(["tick"], delay=0.01, forever=True)
    async with await session.turn(stream) as turn:
        async for _ in turn:
            break
    assert turn.outcome == "cancelled"
    await eventually(lambda: stream.closes, "the stream closed")
    assert stream.closes == 1


async def test_g4_a_dropped_turn_is_cancelled_and_its_stream_closed(kernel):
    session = await kernel.register("s")
    stream = Stream(["tick"], delay=0.01, forever=True)
    turn = await session.turn(stream)
    await asyncio.wait_for(stream.first_item.wait(), 10)
    del turn
    gc.collect()
    await eventually(lambda: stream.closes, "the stream closed")
    [stored] = await _transcript_when_ended(session)
    assert stored["outcome"] == "cancelled"
    assert stream.closes == 1


async def test_a_turn_nobody_reads_says_its_end_once_its_session_closed_or_finished(kernel):
    """``turn.outcome`` is ``None`` until the end comes, then says it: also
    for a turn nobody read, whose session was closed or finished under it
    (it read ``None`` for good then, while the store said ``cancelled``).
    Its error says the same, and the handle still reads the end alike."""
    for end in ("close", "finish"):
        session = await kernel.register(end)
        stream = Stream(["tick"], delay=0.01, forever=True)
        turn = await session.turn(stream)
        await asyncio.wait_for(stream.first_item.wait(), 10)
        assert turn.outcome is None
        await getattr(session, end)()
        await eventually(lambda: turn.outcome is not None, f"the outcome after {end}")
        assert turn.outcome == "cancelled"
        assert turn.error is None
        [stored] = await _transcript_when_ended(session)
        assert stored["outcome"] == turn.outcome
        await turn.aclose()
        assert turn.outcome == "cancelled"
        assert stream.closes == 1


async def _transcript_when_ended(session):
    for _ in range(1000):
        turns = await session.transcript()
        if turns and turns[-1]["outcome"] is not None:
            return turns
        await asyncio.sleep(0.01)
    raise AssertionError("the turn never ended")


async def test_g4_a_cancel_while_the_stream_is_opened_closes_what_was_opened(kernel):
    """The attach race of seed 001: the source is still opening (awaiting,
    like an HTTP request waiting for its headers) when the turn is
    cancelled. The source sees the cancel; nothing is left open."""
    session = await kernel.register("s")
    opening = asyncio.Event()
    released = []

    async def open_stream() -> Stream:
        held = Stream(["never"])  # what the source holds while it opens
        opening.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await held.aclose()
            released.append(held)
            raise
        return held

    turn = await session.turn(open_stream)
    await asyncio.wait_for(opening.wait(), 10)
    await turn.aclose()
    assert turn.outcome == "cancelled"
    assert [s.closes for s in released] == [1]


def _finishing_its_open(opening: asyncio.Event, made: list):
    """A source whose open finishes despite its cancel, a second later (past
    the settle timeout), as an SDK finishing its connect; what it makes
    goes in ``made``."""

    async def open_stream() -> Stream:
        opening.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1.0)
        stream = Stream(["late"])
        made.append(stream)
        return stream

    return open_stream


async def test_g5_a_source_finishing_its_open_despite_the_cancel_is_detached_at_the_settle_deadline(quick_kernel):
    """The open that ignores its cancel (an SDK that finishes its connect
    anyway): the turn is not over while its work still runs. It is
    detached at the settle deadline (G5), its session takes no new turn
    before, and the stream it hands over late is closed exactly once."""
    session = await quick_kernel.register("s")
    opening = asyncio.Event()
    late: list = []
    turn = await session.turn(_finishing_its_open(opening, late))
    await asyncio.wait_for(opening.wait(), PATIENCE)
    await turn.aclose()
    assert turn.outcome == "detached"
    [stored] = await _transcript_when_ended(session)
    assert stored["outcome"] == "detached"
    await eventually(lambda: late and late[0].closes, "the late stream closed")
    assert late[0].closes == 1


async def test_g1_a_parent_finishing_while_a_childs_open_ignores_its_cancel_waits_for_the_child(quick_kernel):
    """G1 with the same open: the child is settled (detached at the settle
    deadline) before its parent is finalized, not finalized with its
    work still running."""
    root = await quick_kernel.register("root")
    child = await root.child("child")
    opening = asyncio.Event()
    turn = await child.turn(_finishing_its_open(opening, []))
    await asyncio.wait_for(opening.wait(), PATIENCE)
    assert await root.finish() == "completed"
    assert await child.finalized() == "parent_finished"
    [stored] = await child.transcript()
    assert stored["outcome"] == "detached", stored
    with contextlib.suppress(settle.Error):
        await turn.aclose()


async def test_g4_cancels_landing_anywhere_around_the_open_close_each_stream_exactly_once(kernel):
    """A cancel at a random moment around the open: every stream that was
    made is closed exactly once, whichever window the cancel hit."""
    rng = random.Random(7)
    made: list = []

    def factory():
        async def open_stream():
            await asyncio.sleep(rng.choice([0, 0, 0.001, 0.003]))
            stream = Stream(["a"], delay=0.002, forever=True)
            made.append(stream)
            return stream

        return open_stream()

    for n in range(40):
        session = await kernel.register(f"s{n}")
        turn = await session.turn(factory)
        await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.002, 0.004, 0.01]))
        await turn.aclose()
        assert turn.outcome in ("cancelled", "completed"), turn.outcome
    await eventually(lambda: all(s.closes for s in made), "every stream made closed")
    await asyncio.sleep(0.1)
    assert made, "no stream was ever made"
    assert {s.closes for s in made} == {1}


async def test_g4_a_close_reaching_the_loop_with_the_pumps_start_still_closes_the_stream(db):
    """The kernel's start of a turn's pump and its close of that turn reach
    the loop in one batch (the loop was busy meanwhile). A pump cancelled
    before its first step never runs its body, nor the ``finally`` that
    closes the stream: the close must be seen by the pump itself."""
    k = await settle.Kernel.open(db, settle_timeout=2 * PATIENCE)
    try:
        session = await k.register("s")
        stream = Stream(["tick"], delay=0.05, forever=True)
        starting = session.turn(stream)
        time.sleep(0.5)  # the loop is busy: the pump's start waits in its mailbox
        cancelling = session.cancel()
        time.sleep(0.5)  # and the close the cancel asks for waits behind it
        try:
            await starting
        except settle.Error:
            pass  # cancelled before the turn was handed over: the same race
        await asyncio.wait_for(cancelling, PATIENCE)
        await eventually(lambda: stream.closes, "the stream closed")
        assert stream.closes == 1
    finally:
        await k.shutdown(0.0)


async def test_g4_a_source_raising_a_base_exception_fails_the_turn_at_once(kernel):
    """Not an `Exception`, not the pump's cancel (a framework's own
    `BaseException`, as trio's and gevent's cancels are): the turn ends
    failed, saying so, instead of waiting for its idle timeout."""

    class Stop(BaseException):
        pass

    # Found from outside: the pump raised it again on its own task, which
    # nobody awaits, and asyncio logged "Task exception was never
    # retrieved" once the task was collected.
    loop = asyncio.get_running_loop()
    reported = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        session = await kernel.register("s")
        stream = Stream(["a"], fail=Stop("the framework stopped it"))
        turn = await session.turn(stream, idle_timeout=2 * PATIENCE)
        async with turn:
            assert [chunk.text async for chunk in turn] == ["a"]
        assert turn.outcome == "failed"
        kind, message = turn.error
        assert kind == "provider"
        assert "Stop: the framework stopped it" in message
        assert stream.closes == 1
        await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
        assert not [c for c in reported if isinstance(c.get("exception"), Stop)], reported
    finally:
        loop.set_exception_handler(before)


async def test_g4_turn_cancel_with_no_read_in_flight_ends_the_turn_and_closes_its_stream(kernel):
    """`Turn.cancel()` cancels the turn then and there, not at its next read:
    a program that cancels a turn and reads it no more (it moves on to
    another) sees the turn end and its stream closed."""
    session = await kernel.register("s")
    stream = Stream(["tick"], delay=0.01, forever=True)
    turn = await session.turn(stream)
    await asyncio.wait_for(stream.first_item.wait(), PATIENCE)
    turn.cancel()
    await eventually(lambda: turn.outcome is not None, "the turn's end")
    assert turn.outcome == "cancelled"
    await eventually(lambda: stream.closes, "the stream closed")
    assert stream.closes == 1
    assert await session.state() == "registered"


async def test_a_turn_started_while_one_runs_says_how_to_end_the_one_that_runs(kernel):
    """A `break` out of a bare `async for` leaves its turn running (only
    `async with`, `aclose()` or the end close it): the next turn's refusal
    says so, and once the first is closed the next one starts."""
    session = await kernel.register("s")
    first = await session.turn(Stream(["a"], delay=0.01, forever=True))
    async for _ in first:
        break
    with pytest.raises(settle.Error, match="aclose"):
        await session.turn(Stream(["b"]))
    await first.aclose()
    async with await session.turn(Stream(["b"])) as second:
        assert [c.text async for c in second] == ["b"]


@pytest.mark.parametrize("ticks", [0, 1, 2, 5])
async def test_g4_a_turn_whose_start_was_cancelled_leaves_the_session_ready_for_the_next(kernel, ticks):
    """Cancelling the task that awaits ``session.turn(...)`` while the start
    is on its way cancels the turn it made (its source closed once); the
    caller has no handle to wait on, so the next ``session.turn(...)`` on
    the session waits for that turn's end instead of being refused with
    "a turn is still running"."""
    session = await kernel.register("s")
    for _ in range(10):
        abandoned = Stream(["x"], delay=0.02, forever=True)
        starting = asyncio.ensure_future(session.turn(abandoned, input="go"))
        for _ in range(ticks):
            await asyncio.sleep(0)
        starting.cancel()
        try:
            won = await starting
        except asyncio.CancelledError:
            pass
        else:
            # The start was done before the cancel: its caller has the turn.
            await won.aclose()
        fresh = Stream(["a", "b"])
        async with await session.turn(fresh, input="again") as turn:
            assert [chunk.text async for chunk in turn] == ["a", "b"]
        assert turn.outcome == "completed"
        await eventually(lambda: abandoned.closes or not abandoned.sent, "the abandoned source closed")
        assert abandoned.closes <= 1


async def _read(turn) -> int:
    count = 0
    async for _ in turn:
        count += 1
    return count


@pytest.mark.parametrize("how", ["reader_task_cancelled", "reader_behind_cancelled", "turn_cancel"])
async def test_g5_the_next_turn_in_the_same_step_as_a_cancel_waits_for_its_settle(kernel, how):
    """A turn started in the same step of the loop as the cancel of the one
    before (``reader.cancel()`` of the task awaiting its next chunk, whether
    it waits for it or it was there already, or ``turn.cancel()``) is taken
    once that turn has settled: the cancel reaches the kernel before
    ``cancel()`` returns, so the kernel never sees the next start while it
    still thinks the turn before runs."""
    session = await kernel.register("s")
    # Behind: the stream sends as fast as it can, so many reads find their
    # chunk waiting and only pass the loop (rounds are short, and more).
    behind = how == "reader_behind_cancelled"
    for _ in range(40 if behind else 10):
        running = Stream(["x"], delay=0.0 if behind else 0.05, forever=True)
        turn = await session.turn(running, input="go")
        reader = asyncio.ensure_future(_read(turn))
        await asyncio.sleep(0.01 if behind else 0.06)
        if how != "turn_cancel":
            reader.cancel()
        else:
            turn.cancel()
        fresh = Stream(["a", "b"])
        async with await session.turn(fresh, input="again") as second:
            assert [chunk.text async for chunk in second] == ["a", "b"]
        assert second.outcome == "completed"
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await turn.aclose()
        assert turn.outcome == "cancelled"
        await eventually(lambda: running.closes, "the cancelled turn's stream closed")
        assert running.closes == 1


async def test_g5_a_turn_handed_to_a_task_cancelled_before_it_resumed_is_cancelled_at_once(kernel):
    """A task awaiting ``session.turn(...)`` cancelled after the start was
    done (the turn handed over to its future) but before the task resumed
    never gets the turn: it is cancelled there and then, so the session's
    next turn, asked in the same step, waits for its settle instead of
    being refused 'a turn is still running' for a turn nobody holds."""
    session = await kernel.register("s")
    for _ in range(5):
        running = Stream(["x"], delay=0.05, forever=True)
        starting = session.turn(running, input="go")
        following = {}

        def on_done(_future) -> None:
            # Runs before the task's own wake-up (registered first): the
            # turn is on the future, and the task has not resumed yet.
            reader.cancel()
            following["start"] = asyncio.ensure_future(session.turn(Stream(["a", "b"]), input="again"))

        starting.add_done_callback(on_done)

        async def start():
            return await starting

        reader = asyncio.ensure_future(start())
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        assert reader.cancelled()
        async with await following["start"] as second:
            assert [chunk.text async for chunk in second] == ["a", "b"]
        assert second.outcome == "completed"
        await eventually(lambda: running.closes, "the lost turn's stream closed")
        assert running.closes == 1
    stored = [turn["outcome"] for turn in await session.transcript()]
    assert stored == ["cancelled", "completed"] * 5, stored




async def test_g7_a_start_right_after_one_cancelled_during_a_stall_is_answered_at_its_own_store_timeout(db):
    """A turn's start cancelled while the store is stalled (another process
    holds SQLite's write lock), then the next turn asked at once: the next
    start is answered within the store timeout of its own ask (refused
    with the store's cause), not after the cancelled start's store timeout
    and then its own; once the store heals, the session's next turn runs,
    and the stored turns keep their numbers."""
    import subprocess
    import sys

    async with await settle.Kernel.open(db, settle_timeout=0.5, store_timeout=2.0) as kernel:
        session = await kernel.register("s")
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, db, "5"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            assert locker.stdout.readline().strip() == "locked"
            first = Stream(["x"])
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(session.turn(first, input="first"), 0.2)
            asked = time.monotonic()
            with pytest.raises(settle.StoreError):
                await session.turn(Stream(["y"]), input="second")
            waited = time.monotonic() - asked
            # Its own store timeout (2 s) and a margin; before, the cancelled
            # start's place came first: about 1.8 s more.
            assert waited < 3.0, f"answered {waited:.1f} s after its ask"
        finally:
            locker.kill()
            locker.wait()
        fresh = Stream(["a", "b"])
        async with await session.turn(fresh, input="third") as turn:
            assert [chunk.text async for chunk in turn] == ["a", "b"]
        assert turn.outcome == "completed"
        assert first.closes <= 1
        stored = [(t["no"], t["outcome"]) for t in await session.transcript()]
        assert stored[-1] == (len(stored), "completed"), stored
        assert [no for no, _ in stored] == list(range(1, len(stored) + 1)), stored


async def test_g5_a_reader_cancelled_in_async_with_is_let_go_within_the_settle_timeout_while_the_store_stalls(db):
    """Found from outside: a task reading a turn in ``async with`` and
    cancelled (``asyncio.wait_for``, a TaskGroup, a stop button) while
    the store was locked ended only once the store came back: leaving the
    block waited for the turn's end to be written. Left by an exception,
    the block cancels the turn and waits at most the settle timeout and a
    margin (G5); the stream is closed (G4), and the turn's end is written
    once the store is back, as the transcript shows."""
    import subprocess
    import sys

    async with await settle.Kernel.open(db, settle_timeout=0.5, store_timeout=10.0) as kernel:
        session = await kernel.register("s")
        stream = Stream(["a"], delay=0.1, forever=True)
        read = asyncio.Event()

        async def reader():
            async with await session.turn(stream, input="go") as turn:
                async for _ in turn:
                    read.set()
            return turn

        task = asyncio.create_task(reader())
        await asyncio.wait_for(read.wait(), PATIENCE)
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, db, "8"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            assert locker.stdout.readline().strip() == "locked"
            await asyncio.sleep(0.3)
            task.cancel()
            asked = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, PATIENCE)
            waited = time.monotonic() - asked
            # The settle timeout (0.5 s) and the margin (1 s), and room for
            # a loaded machine; before, the whole lock (about 8 s).
            assert waited < 4.0, f"let go {waited:.1f} s after its cancel"
            await eventually(lambda: stream.closes, "the stream closed")
        finally:
            locker.kill()
            locker.wait()
        assert stream.closes == 1
        # The store is back: the turn's end is written.
        async def ended():
            [stored] = await session.transcript()
            return stored["outcome"] is not None and stored["outcome"]

        deadline = time.monotonic() + PATIENCE
        while not await ended():
            assert time.monotonic() < deadline, "the turn's end was never written"
            await asyncio.sleep(0.1)
        assert await ended() == "cancelled"
