"""Seed 004 and the process's edges: signals (G9), interpreter exit, fork,
and a loop that closed before a completion arrived. Each runs in a child
interpreter."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import settle

from conftest import LOCKER, run_script


SIGNALS_SCRIPT = """
import asyncio, json, os, signal, sys, time
import settle

async def main():
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.5, drain_timeout=float(sys.argv[2]))
    kernel.install_signal_handlers()
    idle = await kernel.register("idle")
    busy = await kernel.register("busy")
    signals = int(sys.argv[3])
    forever = sys.argv[4] == "forever"

    async def stream():
        n = 0
        while forever or n < 5:
            await asyncio.sleep(0.1)
            n += 1
            yield f"chunk {n} "

    turn = await busy.turn(stream)
    chunks = []
    async def read():
        async for chunk in turn:
            chunks.append(chunk.text)
            if len(chunks) == 1:
                for _ in range(signals):
                    os.kill(os.getpid(), signal.SIGTERM)
                    await asyncio.sleep(0.05)
    reader = asyncio.create_task(read())
    await asyncio.wait_for(idle.finalized(), 10)
    idle_done = time.monotonic()
    await reader
    turn_done = time.monotonic()
    await kernel.stopped()
    print(json.dumps({
        "signal": kernel.received_signal,
        "idle": await idle.finalized(),
        "busy": await busy.finalized(),
        "turn": turn.outcome,
        "chunks": len(chunks),
        "idle_first": idle_done < turn_done,
    }))

asyncio.run(main())
"""


def test_g9_sigterm_finalizes_the_idle_session_at_once_and_drains_the_running_turn(db):
    started = time.monotonic()
    out = run_script(SIGNALS_SCRIPT, db, "5.0", "1", "finite", timeout=30)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["signal"] == signal.SIGTERM
    assert report["idle"] == "shutdown"
    assert report["idle_first"], "the idle session waited for the running turn"
    assert report["turn"] == "completed"  # it drained: all five chunks
    assert report["chunks"] == 5
    assert report["busy"] == "shutdown"
    # drain (5 s) + settle timeout + a margin, and far less in fact.
    assert took < 5.0 + 0.5 + 10


def test_g9_a_second_signal_skips_the_drain(db):
    started = time.monotonic()
    out = run_script(SIGNALS_SCRIPT, db, "60.0", "2", "forever", timeout=30)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["idle"] == "shutdown"
    assert report["turn"] == "cancelled"
    assert report["busy"] == "shutdown"
    assert took < 20, "the second signal did not cut the 60 s drain"


ATEXIT_SCRIPT = """
import asyncio, sys
import settle

async def main():
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.5, drain_timeout=1.0)
    root = await kernel.register("root")
    await root.child("child")
    print(root.id, flush=True)
    # Returns with both sessions open and no shutdown: interpreter exit does it.

asyncio.run(main())
"""

READ_SCRIPT = """
import asyncio, json, sys
import settle

async def main():
    kernel = await settle.Kernel.open(sys.argv[1])
    print(json.dumps(await kernel.sessions()))
    await kernel.shutdown()

asyncio.run(main())
"""


def test_g9_interpreter_exit_shuts_the_kernel_down(db):
    started = time.monotonic()
    out = run_script(ATEXIT_SCRIPT, db, timeout=30)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 15
    rows = json.loads(run_script(READ_SCRIPT, db).stdout)
    assert [(r["name"], r["state"], r["end_reason"]) for r in rows] == [
        ("root", "finalized", "shutdown"),
        ("child", "finalized", "shutdown"),
    ]


HANGING_CLOSE_SCRIPT = """
import asyncio, sys, time
import settle

class Hangs:
    # A stream whose aclose() never returns (a dead HTTP connection).
    def __aiter__(self):
        return self
    async def __anext__(self):
        await asyncio.sleep(0.01)
        return "h"
    async def aclose(self):
        await asyncio.sleep(3600)

async def main():
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.3, drain_timeout=0.5)
    session = await kernel.register("s")
    turn = await session.turn(Hangs())
    async for _ in turn:
        break
    # main returns with the turn streaming: asyncio.run cancels its pump.

started = time.monotonic()
asyncio.run(main())
print(f"{time.monotonic() - started:.1f}")
"""


def test_g5_g9_a_program_whose_streams_close_never_returns_still_exits(db):
    """``main()`` returns while a turn streams from a stream whose
    ``aclose()`` never returns: ``asyncio.run`` cancels the turn's pump as
    it cancels every task left, and the pump's close of its stream is
    awaited at most the settle timeout (G5), then left, so the loop closes
    and the program exits (G9) instead of waiting for it forever. The row
    ends as any at interpreter exit."""
    out = run_script(HANGING_CLOSE_SCRIPT, db, timeout=30)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) < 10, out.stdout
    rows = json.loads(run_script(READ_SCRIPT, db).stdout)
    assert [(r["name"], r["state"]) for r in rows] == [("s", "finalized")], rows


FORK_SCRIPT = """
import asyncio, os, sys
import settle

async def main():
    kernel = await settle.Kernel.open(sys.argv[1])
    session = await kernel.register("parent's")
    pid = os.fork()
    if pid == 0:
        try:
            kernel.register("child's")
            os._exit(3)
        except settle.Error as error:
            try:
                session.turn(lambda: None)
                os._exit(4)
            except settle.Error as again:
                sys.stdout.write(f"child: {type(error).__name__}: {error}\\n")
                sys.stdout.flush()
                os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
    # The parent's kernel is untouched.
    await session.finish()
    print("parent", await session.finalized())
    await kernel.shutdown()

asyncio.run(main())
"""


def test_fork_a_child_touching_its_parents_kernel_gets_a_clear_error(db):
    out = run_script(FORK_SCRIPT, db, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(l.startswith("child: Error: ") and "fork" in l for l in lines), out.stdout
    assert "child exit 0" in lines
    assert "parent completed" in lines


FORK_TURN_SCRIPT = """
import asyncio, os, sys
import settle

async def stream():
    while True:
        await asyncio.sleep(0.05)
        yield "c"

async def main():
    kernel = await settle.Kernel.open(sys.argv[1])
    session = await kernel.register("busy")
    turn = await session.turn(stream)
    await turn.__anext__()
    pid = os.fork()
    if pid == 0:
        try:
            turn.cancel()
            sys.stdout.write("child: cancel returned\\n")
        except settle.Error as error:
            sys.stdout.write(f"child: {type(error).__name__}: {error}\\n")
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    # The child's refused cancel did not reach the parent's turn.
    await turn.__anext__()
    print("parent", turn.outcome, flush=True)
    await turn.aclose()
    print("parent", turn.outcome, flush=True)
    await kernel.shutdown()

asyncio.run(main())
"""


def test_fork_a_child_cancelling_its_parents_turn_gets_the_same_clear_error(db):
    out = run_script(FORK_TURN_SCRIPT, db, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(l.startswith("child: Error: ") and "fork" in l for l in lines), out.stdout
    assert "parent None" in lines, out.stdout  # still running after the child's call
    assert "parent cancelled" in lines, out.stdout


CLOSED_LOOP_SCRIPT = """
import asyncio, gc, sys
import settle

async def first(kernel_box):
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.2)
    kernel_box.append(kernel)
    session = await kernel.register("s")
    kernel_box.append(session)
    # Pending calls whose completions arrive after this loop closed.
    asyncio.ensure_future(session.finalized())
    asyncio.ensure_future(kernel.stopped())

box = []
asyncio.run(first(box))
kernel, session = box

async def second():
    # A new loop: the old loop's completions arrive now, and are dropped.
    await kernel.shutdown(0.0)
    print("shut down", flush=True)

asyncio.run(second())
gc.collect()
"""


def test_a_completion_after_its_loop_closed_is_dropped_quietly(db):
    out = run_script(CLOSED_LOOP_SCRIPT, db, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "shut down" in out.stdout
    assert "Event loop is closed" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


# A turn that waits forever and a coroutine that does, for a loop that closes.
WAITING_WORK = """
import asyncio, gc, sys
import settle

async def stream():
    while True:
        await asyncio.sleep(3600)
        yield "never"

async def job():
    await asyncio.sleep(3600)

# Starts both on this loop, waits `wait` seconds, and leaves them in `box`.
async def first(box, wait=0.0):
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.2)
    session = await kernel.register("s")
    turn = await session.turn(stream)
    task = await session.spawn(job())
    if wait:
        await asyncio.sleep(wait)
    box.extend([kernel, turn, task])
"""


WORK_FOR_A_CLOSED_LOOP_SCRIPT = WAITING_WORK + """
# Their pump and coroutine are for this loop, which closes at once: whether
# they started on it (and were cancelled as it closed) or never reached it,
# neither waits for a loop that is gone.
box = []
asyncio.run(first(box))
kernel, turn, task = box

async def second():
    chunks = [c async for c in turn]
    print("turn", turn.outcome, chunks, flush=True)
    try:
        await asyncio.wait_for(task.join(), 20)
    except settle.Error as error:
        print("task", type(error).__name__, flush=True)
    await kernel.shutdown(0.0)
    print("shut down", flush=True)

asyncio.run(asyncio.wait_for(second(), 25))
"""


# A turn and a task left pending by a loop closed under them. Without the
# collector the abandoned pump and task are never freed: what ends them is
# the kernel finding their loop closed.
CLOSED_UNDER_PENDING_WORK = WAITING_WORK + """
gc.disable()

box = []
loop = asyncio.new_event_loop()
# The pump and the coroutine run and wait in their first await.
loop.run_until_complete(first(box, wait=0.2))
# Closed with both still pending, as asyncio.run leaves a task made while it
# was cancelling the ones it knew of; closed as a loop whose methods the
# package cannot wrap closes (its type's `close`, which runs nothing first).
type(loop).close(loop)
kernel, turn, task = box
"""


LEFT_PENDING_BY_A_CLOSED_LOOP_SCRIPT = CLOSED_UNDER_PENDING_WORK + """
async def second():
    try:
        await asyncio.wait_for(task.join(), 10)
    except settle.Error as error:
        print("task", type(error).__name__, flush=True)
    chunks = [c async for c in turn]
    print("turn", turn.outcome, chunks, flush=True)
    await kernel.shutdown(0.0)
    print("shut down", flush=True)

asyncio.run(asyncio.wait_for(second(), 20))
"""


UNWATCHED_AFTER_ITS_LOOP_CLOSED_SCRIPT = CLOSED_UNDER_PENDING_WORK + """
# Nobody reads the turn or joins the task after their loop closed: the
# kernel finds the loop closed on its own, and the session goes idle
# (no idle timeout here would end the turn).
async def second():
    [row] = await kernel.sessions()
    began = time.monotonic()
    while True:
        [row] = await kernel.sessions()
        if row["state"] != "running" or time.monotonic() - began > 10:
            break
        await asyncio.sleep(0.05)
    print(row["state"], round(time.monotonic() - began), flush=True)
    await kernel.shutdown(0.0)
    print("shut down", flush=True)

import time
asyncio.run(asyncio.wait_for(second(), 20))
"""


def test_a_turn_and_task_left_pending_by_a_closed_loop_end_unwatched(db):
    out = run_script(UNWATCHED_AFTER_ITS_LOOP_CLOSED_SCRIPT, db, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    state, waited = out.stdout.splitlines()[0].split()
    assert state == "registered", out.stdout
    assert int(waited) <= 3, out.stdout
    assert out.stdout.splitlines()[1] == "shut down", out.stdout


def test_a_pump_or_task_its_closed_loop_left_pending_ends_when_waited_for(db):
    out = run_script(LEFT_PENDING_BY_A_CLOSED_LOOP_SCRIPT, db, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["task Cancelled", "turn cancelled []", "shut down"], out.stdout


def test_a_pump_or_task_whose_loop_closed_ends_instead_of_waiting(db):
    out = run_script(WORK_FOR_A_CLOSED_LOOP_SCRIPT, db, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] in ("turn failed []", "turn cancelled []"), lines
    assert lines[1] in ("task Cancelled", "task Error"), lines
    assert lines[2] == "shut down", lines
    assert "never awaited" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


AFTER_STOP_SCRIPT = """
import asyncio, os, signal, sys
import settle

async def main():
    kernel = await settle.Kernel.open(sys.argv[1])
    kernel.install_signal_handlers()
    await kernel.register("s")
    await kernel.shutdown()
    await kernel.stopped()
    print("stopped", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(10)
    print("survived the signal", flush=True)

asyncio.run(main())
"""


def test_g9_a_signal_after_the_kernel_stopped_takes_its_default_action(db):
    out = run_script(AFTER_STOP_SCRIPT, db, timeout=30)
    assert out.stdout.splitlines() == ["stopped"], out.stdout + out.stderr
    assert out.returncode == -signal.SIGTERM


TWO_KERNELS_SCRIPT = """
import asyncio, os, signal, sys, threading
import settle

async def main():
    first = await settle.Kernel.open(sys.argv[1] + ".a")
    second = await settle.Kernel.open(sys.argv[1] + ".b")
    first.install_signal_handlers()
    second.install_signal_handlers()
    await first.register("a")
    await second.register("b")
    # From another thread's loop: a settle.Error saying why.
    said = []
    def elsewhere():
        async def install():
            try:
                first.install_signal_handlers()
            except settle.Error as error:
                said.append("settle.Error: " + str(error))
            except BaseException as error:
                said.append(type(error).__name__)
        asyncio.run(install())
    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    print(said[0].split(":")[0], flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(asyncio.gather(first.stopped(), second.stopped()), 10)
    print("stopped", first.received_signal, second.received_signal, flush=True)

asyncio.run(main())
"""


def test_g9_a_signal_reaches_every_kernel_that_installed_handlers_on_the_loop(db):
    """Two kernels on one loop: the second's ``install_signal_handlers``
    joins the first's instead of taking the signals from it, so SIGTERM
    shuts both down; from a thread that is not the main one it raises a
    ``settle.Error`` saying why, not asyncio's ``RuntimeError``."""
    out = run_script(TWO_KERNELS_SCRIPT, db, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "settle.Error",
        f"stopped {int(signal.SIGTERM)} {int(signal.SIGTERM)}",
    ], out.stdout + out.stderr


async def test_g9_the_shutdown_report_says_what_the_store_committed_and_whether_the_lease_was_lost(db):
    kernel = await settle.Kernel.open(db)
    root = await kernel.register("root")
    child = await root.child("child")
    report = await kernel.shutdown(0.0)
    assert report["finalized"] == {child.id: "shutdown", root.id: "shutdown"}
    assert list(report["finalized"]) == [child.id, root.id]
    assert report["left_recoverable"] == []
    assert report["lease_lost"] is False
    assert report["store_failures"] == 0


LOCKED_AT_EXIT_SCRIPT = f"""
import asyncio, subprocess, sys, time
import settle

LOCKER = {LOCKER!r}

async def main():
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.5, drain_timeout=1.0)
    root = await kernel.register("root")
    await root.child("a")
    await root.child("b")
    # Another process takes the store's write lock, and holds it past this
    # one's exit: every write of the shutdown at exit stalls.
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, sys.argv[1], sys.argv[2]],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert locker.stdout.readline().strip() == "locked"
    print("locker", locker.pid, flush=True)
    if sys.argv[3] == "keep":
        sys.modules["__main__"].kept = kernel  # held until interpreter exit
    if sys.argv[3] == "explicit":
        # The program shuts down itself and reads what was left.
        report = await kernel.shutdown()
        print("reported", len(report["left_recoverable"]), flush=True)
        sys.modules["__main__"].kept = kernel
    # "drop": every handle goes with main(); the kernel shuts itself down.

asyncio.run(main())
print("exiting", time.monotonic(), flush=True)
"""


@pytest.mark.parametrize("held", ["keep", "drop", "explicit"])
def test_g9_interpreter_exit_on_a_stalled_store_keeps_the_kernels_bound_and_says_what_it_left(db, held):
    """Said once: at exit, unless the program's own shutdown already
    handed it the report that names them (found from outside: the line
    came again at exit after an explicit ``shutdown()``)."""
    out = None
    try:
        out = run_script(LOCKED_AT_EXIT_SCRIPT, db, "60", held, timeout=90)
        ended = time.monotonic()  # the system's clock: the child's is the same
        assert out.returncode == 0, out.stderr
        last = out.stdout.splitlines()[-1].split()
        assert last[0] == "exiting", out.stdout
        # From the interpreter's exit on: drain 1 + settle timeout 0.5 +
        # flush budget 2, and a margin; the lock is held for 60 s.
        took = ended - float(last[1])
        assert took < 3.5 + 3, f"the exit took {took:.1f} s"
        lines = [l for l in out.stderr.splitlines() if l.startswith("settle: ")]
        if held == "explicit":
            assert "reported 3" in out.stdout.splitlines(), out.stdout
            assert lines == [], out.stderr
            return
        assert len(lines) == 1, out.stderr
        assert "3 sessions" in lines[0] and "settle --db" in lines[0] and "recover" in lines[0], lines
    finally:
        if out is not None:
            for line in out.stdout.splitlines():
                if line.startswith("locker "):
                    try:
                        os.kill(int(line.split()[1]), signal.SIGKILL)
                    except ProcessLookupError:
                        pass


STUBBORN_AT_EXIT_SCRIPT = """
import asyncio, sys, time
import settle

async def stubborn():
    # Ignores every cancel, for good (a tool that catches CancelledError).
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass

async def stubborn_source():
    yield "a"
    await stubborn()

async def main(mode):
    async with await settle.Kernel.open(sys.argv[1], settle_timeout=0.3, drain_timeout=0.3) as kernel:
        root = await kernel.register("root")
        kid = await root.child("kid")
        if mode == "task":
            task = await kid.spawn(stubborn())
        else:
            async def read():
                async with await kid.turn(stubborn_source) as turn:
                    async for _ in turn:
                        pass
            reading = asyncio.create_task(read())
        await asyncio.sleep(0.1)
        print("finish", await root.finish(), flush=True)
        if mode == "task":
            try:
                await task
            except settle.Detached:
                print("detached", flush=True)
        else:
            await reading
    print("left", flush=True)

started = time.monotonic()
asyncio.run(main(sys.argv[2]))
print(f"exited {time.monotonic() - started:.1f}", flush=True)
"""


@pytest.mark.parametrize("mode", ["task", "turn"])
def test_g5_g9_a_program_whose_detached_work_ignores_its_cancel_for_good_still_exits(db, mode):
    """Found from outside: work the kernel detached at the settle deadline
    (G5) because it ignores its cancel, a spawned coroutine or a turn's
    source, was still an asyncio task of the loop, and ``asyncio.run``
    waits at its end for every task it cancels: the program never exited.
    The kernel lets go of it at the detach, so the loop does not wait."""
    out = run_script(STUBBORN_AT_EXIT_SCRIPT, db, mode, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "finish completed", out.stdout
    assert "left" in lines, out.stdout
    took = float(lines[-1].split()[1])
    assert took < 10, out.stdout
    # Nothing said about it at the loop's end either (asyncio trying to
    # close the source's generator mid-step, a task destroyed pending).
    assert "Error" not in out.stderr and "pending" not in out.stderr, out.stderr


SIGNAL_IN_OWN_SHUTDOWN_SCRIPT = """
import asyncio, json, os, signal, sys, time
import settle

async def main():
    kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.3, drain_timeout=60.0)
    kernel.install_signal_handlers()
    busy = await kernel.register("busy")

    async def forever():
        while True:
            await asyncio.sleep(0.05)
            yield "x"

    turn = await busy.turn(forever)
    async def read():
        async for _ in turn:
            pass
    reader = asyncio.create_task(read())
    await asyncio.sleep(0.1)
    # The program shuts down itself, with a long drain; a Ctrl-C comes.
    asyncio.get_running_loop().call_later(0.3, os.kill, os.getpid(), signal.SIGINT)
    started = time.monotonic()
    report = await kernel.shutdown()
    await reader
    print(json.dumps({
        "took": time.monotonic() - started,
        "signal": kernel.received_signal,
        "turn": turn.outcome,
        "cancelled": report["cancelled"],
    }))

asyncio.run(main())
"""


def test_g9_a_signal_during_the_programs_own_shutdown_skips_the_drain(db):
    """Found from outside: a signal that came while the program's own
    ``shutdown()`` drained waited the whole drain; only a second skipped
    it. The program began the shutdown: the signal asks for it sooner, as
    a second signal does."""
    out = run_script(SIGNAL_IN_OWN_SHUTDOWN_SCRIPT, db, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["signal"] == signal.SIGINT
    assert report["turn"] == "cancelled"
    assert report["took"] < 10, report
