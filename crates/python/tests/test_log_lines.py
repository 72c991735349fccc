"""The kernel's log lines reach Python's ``logging`` (logger ``settle``),
without the kernel ever waiting for the interpreter."""

from __future__ import annotations

import asyncio
import logging
import time

import settle
from conftest import PATIENCE, eventually, run_script


def _opening_past_its_cancel(opening: asyncio.Event):
    """A source whose open finishes a second after its cancel (past the
    settle timeout), as an SDK finishing its connect."""

    async def open_stream():
        opening.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1.0)
        raise RuntimeError("opened too late")

    return open_stream


async def test_g5_a_detach_at_the_settle_deadline_is_a_warning_in_pythons_logging(quick_kernel, caplog):
    caplog.set_level(logging.WARNING, logger="settle")
    session = await quick_kernel.register("s")
    opening = asyncio.Event()
    turn = await session.turn(_opening_past_its_cancel(opening))
    await asyncio.wait_for(opening.wait(), PATIENCE)
    await turn.aclose()
    assert turn.outcome == "detached"

    def said() -> list:
        return [
            r
            for r in caplog.records
            if r.name == "settle" and "detached" in r.getMessage()
        ]

    await eventually(said, "the detach's warning in logging")
    [record] = said()
    assert record.levelno == logging.WARNING
    assert record.settle_module.startswith("settle_runtime")
    assert f"session {session.id} turn" in record.getMessage()


def test_g9_the_lines_a_shutdown_makes_reach_logging_before_the_interpreter_ends(tmp_path):
    """A shutdown right before the program ends detaches the task that
    ignores its cancel; the warning that says so reaches ``logging``
    before the interpreter ends (what the package's thread has not handed
    on yet is handed on at exit)."""
    out = run_script(
        """
        import asyncio, logging, sys
        import settle
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")

        async def main():
            kernel = await settle.Kernel.open(sys.argv[1], settle_timeout=0.2)
            session = await kernel.register("s")
            async def stubborn():
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    await asyncio.sleep(1.0)  # past the settle timeout
            await session.spawn(stubborn())
            await asyncio.sleep(0.1)
            print("spawned", flush=True)
            await kernel.shutdown(0.0)

        asyncio.run(main())
        """,
        str(tmp_path / "exit.db"),
    )
    assert "spawned" in out.stdout, out
    lines = [l for l in out.stdout.splitlines() if l.startswith("settle WARNING")]
    assert any("detached" in l for l in lines), out


def test_an_interpreter_that_imported_settle_exits_without_waiting_for_the_log_thread():
    """The exit's last lines are taken without waiting for the package's
    thread, which waits for lines itself (it used to hold the queue while
    it waited: an exit took 1.1 to 5.1 s, never less than the thread's
    1 s wait; it takes about 0.06 s now)."""
    started = time.monotonic()
    out = run_script("import settle")
    took = time.monotonic() - started
    assert out.returncode == 0, out
    assert took < 0.9, f"an interpreter that only imported settle took {took:.2f} s to exit"


async def test_a_line_whose_event_has_a_message_field_reads_as_the_command_lines_does(db, caplog):
    """Found from outside: a field named ``message`` was glued onto the
    event's text ("stopping the turncould not persist a chunk: ..."). The
    line reads as the command line's log writes it: the text, then each
    field in order, a space between (a ``message`` field by its value
    alone, the others as ``name=value``)."""
    import subprocess
    import sys

    from conftest import LOCKER

    caplog.set_level(logging.WARNING, logger="settle")
    async with await settle.Kernel.open(db, settle_timeout=0.5, store_timeout=0.5) as kernel:
        session = await kernel.register("s")
        go = asyncio.Event()

        async def source():
            await go.wait()
            yield "a"

        turn = await session.turn(source)
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, db, "5"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            assert locker.stdout.readline().strip() == "locked"
            go.set()
            async with turn:
                async for _ in turn:
                    pass
            assert turn.outcome == "failed", turn.outcome

            def said() -> list:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.name == "settle" and "stopping the turn" in r.getMessage()
                ]

            await eventually(said, "the turn's stop in logging")
        finally:
            locker.kill()
            locker.wait()
    [line] = said()
    assert line.startswith(
        f"stopping the turn session={session.id} could not persist a chunk: "
    ), line
