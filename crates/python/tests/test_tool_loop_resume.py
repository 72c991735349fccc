"""examples/python/tool_loop.py killed mid-loop (SIGKILL), its session
recovered (`settle recover`, G8) and resumed in a fresh process with
`Kernel.resume`: the tool calls it had not answered come back, whole, and
the loop goes on from them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import settle
from conftest import PATIENCE, settle_bin
from sse_server import SseServer

openai = pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "tool_loop.py"
PROMPT = [{"role": "user", "content": "nap, then say so"}]


def example():
    spec = importlib.util.spec_from_file_location("tool_loop_resumed", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def piece(index, *, id=None, name=None, arguments=None):
    function = {key: value for key, value in (("name", name), ("arguments", arguments)) if value is not None}
    call = {"index": index, "function": function, **({"id": id, "type": "function"} if id else {})}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


async def kill_when(db: str, server: SseServer, line: str) -> int:
    """Runs the example until it prints a line starting with ``line``, then
    SIGKILLs it; gives its session's id."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "--base-url", server.base_url, "--db", db, PROMPT[0]["content"],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    session, seen = None, b""
    try:
        while line.encode() not in seen:
            got = await asyncio.wait_for(child.stdout.read(256), PATIENCE)
            assert got, f"the loop ended first: {seen!r} {(await child.stderr.read()).decode()}"
            seen += got
            if session is None and b"]" in seen:
                session = int(seen.split(b"[session ", 1)[1].split(b"]", 1)[0])
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    return session


def recover(db: str) -> None:
    out = subprocess.run([settle_bin(), "--db", db, "recover"], capture_output=True, text=True, timeout=PATIENCE)
    assert out.returncode == 0, out.stderr


async def test_g8_a_loop_killed_while_its_tool_runs_resumes_with_the_call_pending(db):
    asks = [piece(0, id="call_1", name="sleep", arguments=""), piece(0, arguments='{"seconds": 3600}')]
    async with SseServer(replies=[asks, [{"choices": [{"index": 0, "delta": {"content": "Rested."}}]}]], interval=0.01) as server:
        id = await kill_when(db, server, "[tool] sleep")
        recover(db)
        kernel = await settle.Kernel.open(db)
        try:
            [row] = [r for r in await kernel.sessions() if r["id"] == id]
            assert row["end_reason"] == "recovered"
            resumed = await kernel.resume(id, "agent again")
            assert resumed.pending_tool_calls == [{"id": "call_1", "name": "sleep", "arguments": '{"seconds": 3600}'}]
            assert resumed.history[0] == PROMPT[0]
            assert resumed.history[-1]["tool_calls"][0]["id"] == "call_1"
            loop = example()
            loop.TOOLS["sleep"] = lambda seconds: asyncio.sleep(0, f"slept {seconds} s")
            answer = await loop.agent(resumed.session, openai.AsyncOpenAI(base_url=server.base_url, api_key="-"), "local",
                                      resumed.history, resumed.pending_tool_calls)
            assert answer == "Rested."
            assert server.bodies[-1]["messages"][-1] == {"role": "tool", "content": "slept 3600 s", "tool_call_id": "call_1"}
            await resumed.session.finish()
        finally:
            await kernel.shutdown(0.0)


async def test_g8_a_restarted_program_recovers_what_its_crashed_run_left_without_the_cli(db):
    """Found from outside: a program restarted after a ``kill -9`` could not
    continue the conversations its crashed run held (``resume`` refused a
    session left ``running``, pointing to ``settle recover``), and ``pip
    install`` gives no ``settle`` command. ``kernel.recover()`` does what it
    does, and ``Kernel.open(..., recover=True)`` at the start."""
    asks = [piece(0, id="call_1", name="sleep", arguments=""), piece(0, arguments='{"seconds": 3600}')]
    async with SseServer(replies=[asks], interval=0.01) as server:
        id = await kill_when(db, server, "[tool] sleep")
    kernel = await settle.Kernel.open(db)
    try:
        with pytest.raises(settle.BadInput, match=r"the kernel's `recover\(\)`"):
            await kernel.resume(id, "agent again")
        report = await kernel.recover()
        assert report["recovered"] == [id], report
        assert report["finalized_elsewhere"] == [], report
        [row] = [r for r in await kernel.sessions() if r["id"] == id]
        assert row["end_reason"] == "recovered"
        resumed = await kernel.resume(id, "agent again")
        assert [c["id"] for c in resumed.pending_tool_calls] == ["call_1"]
        assert (await kernel.recover())["recovered"] == []
        await resumed.session.finish()
    finally:
        await kernel.shutdown(0.0)
    async with SseServer(replies=[asks], interval=0.01) as server:
        id = await kill_when(db, server, "[tool] sleep")
    kernel = await settle.Kernel.open(db, recover=True)
    try:
        [row] = [r for r in await kernel.sessions() if r["id"] == id]
        assert (row["state"], row["end_reason"]) == ("finalized", "recovered")
    finally:
        await kernel.shutdown(0.0)


async def test_g7_a_loop_killed_mid_tool_call_resumes_without_the_cut_call(db):
    # The call's arguments were cut by the kill: running it would run
    # something the model never asked for. The text after it keeps coming
    # (`forever`) until the kill.
    asks = [piece(0, id="call_1", name="sleep", arguments='{"seconds": ')]
    async with SseServer(replies=[asks], interval=0.01, forever=True) as server:
        id = await kill_when(db, server, " more 5")
        recover(db)
        kernel = await settle.Kernel.open(db)
        try:
            resumed = await kernel.resume(id, "agent again")
            assert resumed.pending_tool_calls == []
            assert not any(m.get("tool_calls") for m in resumed.history)
            assert resumed.history[0] == PROMPT[0]
        finally:
            await kernel.shutdown(0.0)
