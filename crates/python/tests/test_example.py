"""The README's example, examples/python/scan.py, against a local
OpenAI-compatible server: it runs to its end, and the child still mid-turn
when the root finished is finalized first (G1)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from conftest import PATIENCE, settle_json
from sse_server import SseServer

pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "scan.py"


async def test_g1_the_scan_example_runs_against_a_local_server(db):
    # Three chunks, 0.3 s apart: recon's turn completes; web's is cut short.
    async with SseServer(interval=0.3) as server:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLE), "--base-url", server.base_url, "--db", db, "--web-time", "0.5",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), PATIENCE)
    assert child.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert "[recon] turn 1: completed" in lines, lines
    assert "[web] turn 1: cancelled" in lines, lines
    assert "root: completed" in lines
    assert "web: parent_finished" in lines
    rows = {row["name"]: row for row in settle_json(db, "sessions", "--json")}
    assert rows["recon"]["end_reason"] == "parent_finished"
    assert rows["web"]["outcome"] == "cancelled"
    assert rows["web"]["finalized_at"] <= rows["root"]["finalized_at"]
