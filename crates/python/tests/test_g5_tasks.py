"""Coroutines under a session (G1, G5, G6, G10): cancelled on their own loop
with their session, detached at the settle deadline when they swallow the
cancel, and refused every write after."""

from __future__ import annotations

import asyncio
import inspect
import json
import time

import pytest

import settle
from conftest import PATIENCE, Stream, eventually, run_script, settle_json


async def test_g1_a_spawned_coroutine_gives_its_result(kernel):
    session = await kernel.register("s")

    async def tool(x: int) -> int:
        await asyncio.sleep(0.01)
        return x * 2

    task = await session.spawn(tool(21))
    assert await task == 42


async def test_g1_a_spawned_coroutine_raises_what_it_raised(kernel):
    session = await kernel.register("s")

    async def tool() -> None:
        raise KeyError("missing")

    task = await session.spawn(tool())
    with pytest.raises(KeyError):
        await task.join()


async def test_g7_a_coroutine_is_recorded_as_it_ended(kernel, db):
    """Found from outside: a tool that raised, or cancelled itself, was
    stored ``completed``. Its record says ``failed`` (error kind ``task``,
    naming the exception's class, never its words, which may hold a secret)
    or ``cancelled``; the awaiter gets what it raised all the same."""

    async def raises() -> None:
        raise ValueError("token=sk-live-123 was refused")

    async def gives_up() -> None:
        raise asyncio.CancelledError()

    async def returns() -> int:
        return 7

    ids = {}
    for name, tool in [("raises", raises), ("gives_up", gives_up), ("returns", returns)]:
        session = await kernel.register(name)
        ids[name] = session.id
        task = await session.spawn(tool())
        try:
            await task
        except BaseException as error:  # what each raised, checked below
            assert name != "returns", error
            assert isinstance(error, ValueError if name == "raises" else settle.Cancelled), error
        await session.finish()
    await kernel.shutdown(0.0)
    rows = {row["name"]: row for row in settle_json(db, "sessions", "--json")}
    assert rows["raises"]["outcome"] == "failed", rows
    assert rows["gives_up"]["outcome"] == "cancelled", rows
    assert rows["returns"]["outcome"] == "completed", rows
    shown = settle_json(db, "show", str(ids["raises"]), "--json")
    causes = [step["cause"] for step in shown["timeline"]]
    assert "task ended: failed" in causes, causes
    assert "sk-live-123" not in json.dumps(shown)
    shown = settle_json(db, "show", str(ids["gives_up"]), "--json")
    assert all(step["to"] != "cancelling" for step in shown["timeline"]), shown["timeline"]


GENERATOR_EXIT_SCRIPT = """
import asyncio, gc, sys, weakref
import settle

class Held:
    pass

#: What the tools' frames held: kept for as long as what they raised is.
held = []

async def stream():
    yield "a"

async def raises():
    mine = Held()
    held.append(weakref.ref(mine))
    raise GeneratorExit("token=sk-live-123 was refused")

async def closed_under_it():
    # Awaits an async generator that is closed under it (thrown the
    # GeneratorExit a close throws): it ends with that GeneratorExit.
    mine = Held()
    held.append(weakref.ref(mine))
    items = stream()
    await items.__anext__()
    await items.athrow(GeneratorExit)

async def main():
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.3)
    for name, tool in [("raises", raises), ("closed_under_it", closed_under_it)]:
        session = await kernel.register(name)
        task = await session.spawn(tool())
        try:
            await task
        except GeneratorExit as error:
            print(name, "awaiter got", type(error).__name__, flush=True)
        await session.finish()
        del task
    # Nobody holds the tasks any more: what they raised is collected.
    gc.collect()
    print("kept", sum(r() is not None for r in held), flush=True)
    await kernel.shutdown(0.0)

asyncio.run(main())
gc.collect()
print("end", flush=True)
"""


def test_g7_a_coroutine_ending_with_generator_exit_is_recorded_failed_and_nothing_is_logged(db):
    """Found from outside: a tool coroutine that ended with
    ``GeneratorExit`` (raised, or thrown in by an async generator closed
    under it) had asyncio log "Task exception was never retrieved", with
    the exception's words: the bridge's asyncio task raised again every
    exception that is not an ``Exception``, and nobody awaits that task.
    Only a stop of the program (``KeyboardInterrupt``, ``SystemExit``) is
    raised again now; the end is recorded ``failed`` (the record names the
    exception's class, never its words) and the awaiter gets what the
    coroutine raised, as from an ``asyncio.Task``. Once nobody holds the
    task, what it raised is collected."""
    out = run_script(GENERATOR_EXIT_SCRIPT, db, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines == [
        "raises awaiter got GeneratorExit",
        "closed_under_it awaiter got GeneratorExit",
        "kept 0",
        "end",
    ], out.stdout + out.stderr
    assert "never retrieved" not in out.stderr, out.stderr
    assert "sk-live-123" not in out.stderr, out.stderr
    rows = {row["name"]: row for row in settle_json(db, "sessions", "--json")}
    for name in ("raises", "closed_under_it"):
        assert rows[name]["outcome"] == "failed", rows
        shown = settle_json(db, "show", str(rows[name]["id"]), "--json")
        assert "task ended: failed" in [step["cause"] for step in shown["timeline"]], shown
        assert "sk-live-123" not in json.dumps(shown)


async def test_g1_cancelling_the_session_cancels_its_coroutine_on_its_loop(kernel):
    session = await kernel.register("s")
    started, saw_cancel = asyncio.Event(), asyncio.Event()

    async def tool() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            saw_cancel.set()
            raise

    task = await session.spawn(tool())
    await asyncio.wait_for(started.wait(), PATIENCE)  # a task cancelled unstarted never runs
    await session.cancel()
    await asyncio.wait_for(saw_cancel.wait(), 10)
    with pytest.raises(settle.Cancelled):
        await task


async def test_g5_a_coroutine_swallowing_its_cancel_is_detached_at_the_settle_deadline(db):
    settle_timeout = 0.3
    kernel = await settle.Kernel.open(db, settle_timeout=settle_timeout)
    try:
        root = await kernel.register("root")
        session = await root.child("worker")
        cancels = []
        later: list = []
        stop, running = asyncio.Event(), asyncio.Event()

        async def stubborn() -> None:
            running.set()
            while not stop.is_set():
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    cancels.append(time.monotonic())  # swallowed
            # Its writes after the detach are refused (G10): it may not
            # start work, nor end, cancel or hold a session either, nor
            # register one. Each call gives an awaitable that raises when
            # awaited, as every other refusal does (found from outside: they
            # raised at the call, past `gather(..., return_exceptions=True)`).
            writes = (
                lambda: session.child("late"),
                lambda: root.child("late"),
                lambda: root.hold("input"),
                lambda: root.release("input"),
                lambda: root.cancel(),
                lambda: root.finish(),
                lambda: root.close(),
                lambda: session.finish(),
                lambda: root.cancel_turn(),
                lambda: kernel.register("late root"),
            )
            calls = [write() for write in writes]
            for answer in await asyncio.gather(*calls, return_exceptions=True):
                match answer:
                    case settle.SessionClosed():
                        later.append("SessionClosed")
                    case _:
                        later.append(repr(answer))

        task = await session.spawn(stubborn())
        await asyncio.wait_for(running.wait(), PATIENCE)
        started = time.monotonic()
        await session.cancel()
        with pytest.raises(settle.Detached):
            await task
        detached_after = time.monotonic() - started
        assert cancels, "the coroutine never saw its cancel"
        assert detached_after >= settle_timeout * 0.9
        assert await session.state() in ("settled", "finalized")
        stop.set()
        await eventually(lambda: len(later) == 10, "the detached coroutine's writes")
        assert later == ["SessionClosed"] * 10
        assert await root.state() == "registered", "a detached coroutine ended its parent"
    finally:
        await kernel.shutdown(0.0)


async def test_g4_g10_what_a_detached_task_hands_a_refused_call_is_closed(db):
    """A detached task's spawn and turn are refused ``SessionClosed`` (G10),
    and the coroutine and the stream it handed them are closed, as for a
    finalized session: no coroutine left never awaited, no stream left open
    (G4), whatever refused the call."""
    kernel = await settle.Kernel.open(db, settle_timeout=0.3)
    try:
        root = await kernel.register("root")
        session = await root.child("worker")
        other = await kernel.register("other")
        stop, running = asyncio.Event(), asyncio.Event()
        seen: dict = {}

        async def tool() -> int:
            return 1

        async def stubborn() -> None:
            running.set()
            while not stop.is_set():
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    pass
            coroutine = tool()
            with pytest.raises(settle.SessionClosed):
                await other.spawn(coroutine)
            seen["coroutine closed"] = coroutine.cr_frame is None
            stream = Stream(["a"])
            with pytest.raises(settle.SessionClosed):
                await other.turn(stream)
            await eventually(lambda: stream.closes, "the refused stream closed")
            seen["stream closes"] = stream.closes

        task = await session.spawn(stubborn())
        await asyncio.wait_for(running.wait(), PATIENCE)
        await session.cancel()
        with pytest.raises(settle.Detached):
            await task
        stop.set()
        await eventually(lambda: len(seen) == 2, "the detached task's calls")
        assert seen == {"coroutine closed": True, "stream closes": 1}
    finally:
        await kernel.shutdown(0.0)


async def test_g5_a_turn_timing_out_on_a_source_that_swallows_its_cancel_ends_within_the_settle_timeout(db):
    """Its idle timeout reached, a turn's source swallows the cancel of its
    pending ``__anext__`` and goes on: the turn ends ``idle_timeout`` within
    the settle timeout (G5), its session free for the next turn, and the
    source is closed once, when it lets go (G4)."""

    class Stubborn:
        def __init__(self) -> None:
            self.closes = 0
            self.sent = False

        def __aiter__(self):
            return self

        async def __anext__(self):
            if not self.sent:
                self.sent = True
                return "first"
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await asyncio.sleep(2.0)
            raise StopAsyncIteration

        async def aclose(self) -> None:
            self.closes += 1

    kernel = await settle.Kernel.open(db, settle_timeout=0.3)
    try:
        session = await kernel.register("s")
        source = Stubborn()
        started = time.monotonic()
        async with await session.turn(source, idle_timeout=0.2) as turn:
            chunks = [chunk.text async for chunk in turn]
        took = time.monotonic() - started
        assert chunks == ["first"]
        assert turn.outcome == "idle_timeout"
        assert took < 1.5, f"the turn ended {took:.1f} s after its start"
        async with await session.turn(Stream(["next"])) as turn:
            assert [chunk.text async for chunk in turn] == ["next"]
        await eventually(lambda: source.closes, "the stubborn source closed")
        await asyncio.sleep(0.2)
        assert source.closes == 1
    finally:
        await kernel.shutdown(0.0)


async def test_g5_a_turn_whose_iterator_swallows_its_cancel_is_detached(db):
    settle_timeout = 0.3
    kernel = await settle.Kernel.open(db, settle_timeout=settle_timeout)
    try:
        session = await kernel.register("s")
        released = asyncio.Event()

        class Stubborn(Stream):
            """Yields one item, then ignores every cancel until released."""

            async def __anext__(self):
                if self.sent:
                    while not released.is_set():
                        try:
                            await asyncio.sleep(0.01)
                        except asyncio.CancelledError:
                            self.cancels_swallowed += 1
                return await super().__anext__()

        stream = Stubborn(["tick"], forever=True)
        turn = await session.turn(stream)
        first = await asyncio.wait_for(turn.__anext__(), 10)
        assert first.text == "tick"  # stored
        started = time.monotonic()
        await turn.aclose()
        assert turn.outcome == "detached"
        assert time.monotonic() - started >= settle_timeout * 0.9
        assert stream.cancels_swallowed >= 1
        assert stream.closes == 0  # it never gave the pump a chance
        # Once it yields again, its item is refused and it is closed, once.
        released.set()
        await eventually(lambda: stream.closes, "the stream closed")
        await asyncio.sleep(0.1)
        assert stream.closes == 1
        [stored] = await session.transcript()
        assert stored["outcome"] == "detached"
        assert stored["text"] == "tick"
    finally:
        await kernel.shutdown(0.0)


async def test_g6_a_finished_task_is_not_cancelled_again(kernel):
    session = await kernel.register("s")
    cancelled = []

    async def quick() -> str:
        try:
            return "done"
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    task = await session.spawn(quick())
    assert await task == "done"
    await session.finish()
    assert cancelled == []


def cancellable_tool():
    """A tool that sleeps until it is cancelled, with the events that say it
    started and that it saw its cancel."""
    started, saw_cancel = asyncio.Event(), asyncio.Event()

    async def tool() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            saw_cancel.set()
            raise

    return tool, started, saw_cancel


async def until_idle(session) -> None:
    """Waits, bounded, until the session's works have ended (their
    coroutines unwound): it is registered again."""
    for _ in range(1000):
        if await session.state() == "registered":
            break
        await asyncio.sleep(0.01)
    assert await session.state() == "registered"


async def test_g1_cancelling_the_asyncio_task_awaiting_a_settle_task_cancels_it(kernel):
    # As with an asyncio.Task: the awaiter's cancel goes on to what it awaits.
    session = await kernel.register("s")
    tool, started, saw_cancel = cancellable_tool()

    async def caller() -> None:
        await (await session.spawn(tool()))

    awaiting = asyncio.create_task(caller())
    await asyncio.wait_for(started.wait(), 10)
    awaiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await awaiting
    await asyncio.wait_for(saw_cancel.wait(), 10)
    await until_idle(session)


async def test_g1_a_shielded_settle_task_goes_on_when_its_awaiter_is_cancelled(kernel):
    session = await kernel.register("s")
    gate = asyncio.Event()

    async def tool() -> str:
        await gate.wait()
        return "done"

    task = await session.spawn(tool())
    joined = asyncio.ensure_future(task.join())
    awaiting = asyncio.create_task(asyncio.wait_for(asyncio.shield(joined), 0.05))
    with pytest.raises(asyncio.TimeoutError):
        await awaiting
    gate.set()
    assert await joined == "done"


async def test_g1_a_spawn_cancelled_before_it_resolves_leaves_no_task_running(kernel):
    session = await kernel.register("s")
    tool, started, saw_cancel = cancellable_tool()

    spawning = session.spawn(tool())
    spawning.cancel()  # nobody will get the settle.Task
    with pytest.raises(asyncio.CancelledError):
        await spawning
    await (await session.spawn(asyncio.sleep(0)))  # the first spawn is in by now
    await until_idle(session)
    assert saw_cancel.is_set() or not started.is_set()


async def test_g1_a_spawn_whose_awaiter_is_cancelled_as_it_resolves_leaves_no_task_running(kernel):
    """The spawn resolved (its ``settle.Task`` is in its future), but the
    task awaiting it was cancelled before it resumed: the caller never has
    the task, so it is cancelled, as one whose spawn was cancelled before
    it resolved, rather than left running with nobody able to reach it."""
    session = await kernel.register("s")
    finished = []

    async def tool() -> None:
        await asyncio.sleep(0.5)
        finished.append(True)

    spawning = session.spawn(tool())

    async def awaiter():
        return await spawning

    waiter: "asyncio.Task[object]"
    # Added before the waiter waits on it, this callback runs first once the
    # spawn resolves: the waiter is cancelled before its wakeup runs.
    spawning.add_done_callback(lambda _: waiter.cancel())
    waiter = asyncio.create_task(awaiter())
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not spawning.cancelled()  # it resolved: the race is the one meant
    await until_idle(session)
    await asyncio.sleep(0.6)
    assert finished == [], "the coroutine of a task nobody had ran to its end"


async def test_g5_a_cancel_reaching_the_loop_with_the_tasks_start_ends_it_at_once(db):
    """The kernel's start of a spawned coroutine and its cancel reach the
    loop in one batch. An asyncio task cancelled before its first step
    never reports: the session would wait for the settle deadline, and the
    coroutine would never be closed."""
    k = await settle.Kernel.open(db, settle_timeout=2 * PATIENCE)
    try:
        session = await k.register("s")

        async def tool() -> None:
            await asyncio.sleep(PATIENCE)

        coroutine = tool()
        spawning = session.spawn(coroutine)
        time.sleep(0.5)  # the loop is busy: the task's start waits in its mailbox
        cancelling = session.cancel()
        time.sleep(0.5)  # and the cancel waits behind it
        task = await spawning
        await asyncio.wait_for(cancelling, PATIENCE)
        with pytest.raises(settle.Cancelled):
            await asyncio.wait_for(task.join(), PATIENCE)
        assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
    finally:
        await k.shutdown(0.0)


async def test_a_settle_task_awaited_again_gives_the_same_end_as_an_asyncio_task_does(kernel):
    session = await kernel.register("s")

    async def value() -> int:
        await asyncio.sleep(0.01)
        return 7

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("missing")

    async def waits() -> None:
        await asyncio.sleep(3600)

    task = await session.spawn(value())
    # Two awaiters at once, then a third after its end: all told the same.
    assert await asyncio.gather(task, task.join()) == [7, 7]
    assert await task == 7
    raising = await session.spawn(fails())
    for _ in range(2):
        with pytest.raises(KeyError):
            await raising
    cancelled = await session.spawn(waits())
    cancelled.cancel()
    for _ in range(2):
        with pytest.raises(settle.Cancelled):
            await asyncio.wait_for(cancelled.join(), PATIENCE)


async def test_g1_cancel_reaches_a_settle_task_while_another_task_awaits_it(kernel):
    session = await kernel.register("s")
    started = asyncio.Event()

    async def waits() -> None:
        started.set()
        await asyncio.sleep(3600)

    task = await session.spawn(waits())
    awaiter = asyncio.ensure_future(task.join())
    await started.wait()
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(settle.Cancelled):
        await asyncio.wait_for(awaiter, PATIENCE)


async def test_a_task_that_raised_or_returned_is_collected_once_nobody_holds_it(kernel):
    # Found from outside (a soak of an agent framework whose tools raise):
    # a settle.Task kept its end where the collector could not see it, and
    # the end's traceback held the frame that held the Task: every failing
    # tool kept its Task, its exception, its frames and its session alive
    # for good. As for an asyncio.Task, the cycle is the collector's now.
    import gc
    import weakref

    class Boom(Exception):
        pass

    class Result:
        pass

    async def fails() -> None:
        await asyncio.sleep(0)
        raise Boom("tool failed")

    ends: list = []

    async def once(i: int) -> None:
        session = await kernel.register(f"s{i}")
        task = await session.spawn(fails())
        try:
            await task
        except Boom as error:
            ends.append(weakref.ref(error))
        result = Result()
        result.task = await session.spawn(asyncio.sleep(0, result))  # returns what holds it
        assert await result.task is result
        ends.append(weakref.ref(result))
        stopped = await session.spawn(asyncio.sleep(3600))
        stopped.cancel()
        try:
            await stopped
        except settle.Cancelled as error:
            ends.append(weakref.ref(error))
        await session.finish()

    for i in range(5):
        await once(i)
    gc.collect()
    left = [type(r()).__name__ for r in ends if r() is not None]
    assert left == [], f"kept after gc.collect(): {left}"


@pytest.mark.parametrize("awaited", [True, False], ids=["awaited", "unawaited"])
async def test_a_task_that_raised_lets_go_of_its_frames_once_nobody_holds_it(kernel, awaited):
    # Found with the GeneratorExit of a tool: what a coroutine raised holds
    # its traceback, whose frames hold the bridge's control of the task,
    # which held what the coroutine raised, through Rust: a cycle the
    # collector cannot see. Every tool that raised kept its frames (and
    # whatever they held) after its settle.Task was let go of. The end's
    # value is the settle.Task's alone now, which shows it to the collector.
    import gc
    import weakref

    class Held:
        pass

    held: list = []

    async def tool() -> None:
        mine = Held()
        held.append(weakref.ref(mine))
        await asyncio.sleep(0)
        raise ValueError("tool failed")

    for i in range(3):
        session = await kernel.register(f"s{i}")
        task = await session.spawn(tool())
        if awaited:
            with pytest.raises(ValueError):
                await task
        await session.finish()  # the tool has ended: the session waited for it
        del task
    gc.collect()
    assert [r for r in held if r() is not None] == []


async def test_a_task_nobody_awaited_is_collected_with_what_holds_it(kernel):
    # Found from outside: an end no caller had awaited yet was kept where
    # the collector could not see it, so an object keeping its tasks in a
    # list, whose tool raised unawaited, stayed alive with them for good.
    import gc
    import weakref

    class Agent:
        def __init__(self) -> None:
            self.tasks: list = []

        async def tool(self) -> None:
            await asyncio.sleep(0)
            raise KeyError("unawaited")

    held: list = []
    for i in range(5):
        session = await kernel.register(f"s{i}")
        agent = Agent()
        agent.tasks.append(await session.spawn(agent.tool()))
        held.append(weakref.ref(agent))
        await session.finish()  # the tool has ended: the session waited for it
        del agent
    gc.collect()
    assert [r for r in held if r() is not None] == []


async def test_an_exception_raised_to_many_awaiters_does_not_grow_its_traceback(kernel):
    import traceback

    session = await kernel.register("s")

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("again")

    task = await session.spawn(fails())
    lengths = []
    for _ in range(20):
        try:
            await task
        except KeyError as error:
            lengths.append(len(traceback.extract_tb(error.__traceback__)))
    assert len(set(lengths)) == 1, lengths


async def test_g5_a_tools_coroutine_closed_while_it_runs_ends_its_task_failed(kernel, db):
    """Found from outside: ``coro.close()`` on a tool's coroutine while its
    task ran (suspended in an ``await``) left the task waiting for good: the
    close ends the coroutine, but the asyncio task that ran it still waited
    for the future the coroutine had been waiting on, which nobody would
    complete any more (``asyncio.sleep`` cancels its timer as it is closed),
    so its ``join()`` never returned and it was never recorded as ended.
    Now the loop notices a coroutine closed under its task, and the task
    ends ``failed`` with the ``GeneratorExit`` the close ended it with (as
    for a coroutine that ends with one), given to its awaiters; a close
    whose future completes later ends the same."""
    started = {}
    woken = {}

    async def sleeps(name: str) -> None:
        started[name].set()
        await asyncio.sleep(3600)

    async def waits(name: str) -> None:
        started[name].set()
        await woken[name]

    ids = {}
    for name, tool in [("sleeps", sleeps), ("on_a_future", waits), ("woken_later", waits)]:
        session = await kernel.register(name)
        ids[name] = session.id
        started[name] = asyncio.Event()
        woken[name] = asyncio.get_running_loop().create_future()
        coroutine = tool(name)
        task = await session.spawn(coroutine)
        await started[name].wait()
        coroutine.close()
        if name == "woken_later":
            # Its task is woken before the loop looks: it resumes a closed
            # coroutine ("cannot reuse already awaited coroutine").
            woken[name].set_result(None)
        with pytest.raises(GeneratorExit):
            await asyncio.wait_for(task.join(), PATIENCE)
        # Ended: the session finishes at once, nothing to cancel.
        assert await asyncio.wait_for(session.finish(), PATIENCE) == "completed"
    await kernel.shutdown(0.0)
    for name, id in ids.items():
        shown = settle_json(db, "show", str(id), "--json")
        causes = [step["cause"] for step in shown["timeline"]]
        assert "task ended: failed" in causes, (name, causes)
        assert all(step["to"] != "cancelling" for step in shown["timeline"]), (name, shown)
