"""The README's example, examples/python/scan.py, against a local
OpenAI-compatible server: it runs to its end, and the child still mid-turn
when the root finished is finalized first (G1)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PATIENCE, run_python, settle_json
from sse_server import SseServer

pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "scan.py"


async def test_g1_the_scan_example_runs_against_a_local_server(db):
    # Three chunks, 0.3 s apart: recon's turn completes; web's is cut short.
    async with SseServer(interval=0.3) as server:
        code, out, err = await run_python(str(EXAMPLE), "--base-url", server.base_url, "--db", db, "--web-time", "0.5")
    assert code == 0, err
    lines = out.splitlines()
    assert "[recon] turn 1: completed" in lines, lines
    assert "[web] turn 1: cancelled" in lines, lines
    assert "root: completed" in lines
    assert "web: parent_finished" in lines
    rows = {row["name"]: row for row in settle_json(db, "sessions", "--json")}
    assert rows["recon"]["end_reason"] == "parent_finished"
    assert rows["web"]["outcome"] == "cancelled"
    assert rows["web"]["finalized_at"] <= rows["root"]["finalized_at"]


README = Path(__file__).resolve().parents[3] / "README.md"


async def test_g1_the_readme_example_runs_against_a_local_server(db):
    text = README.read_text()
    start = text.index("```python\nimport asyncio, openai, settle")
    code = text[start + len("```python\n"): text.index("```", start + 10)]
    async with SseServer(interval=0.01) as server:
        code = code.replace("http://127.0.0.1:8080/v1", server.base_url).replace('"settle.db"', repr(db))
        status, out, err = await run_python("-c", code)
    assert status == 0, err
    assert out.splitlines() == ["Hello, world", "completed"]
    rows = {row["name"]: row for row in settle_json(db, "sessions", "--json")}
    assert rows["recon"]["end_reason"] == "parent_finished"
    assert rows["root"]["end_reason"] == "completed"


def readme_python_examples() -> list:
    """The Python examples of the README's Python section that use
    ``settle``, as the README shows them."""
    text = README.read_text()
    section = text[text.index("\n## Python\n"):]
    section = section[: section.index("\n## ", 1)]
    blocks = section.split("```python\n")[1:]
    return [block[: block.index("```")] for block in blocks if "import" in block and "settle" in block]


def test_the_readme_examples_pass_mypy_strict_against_the_stubs(tmp_path):
    """What a typed program copies from the README type-checks under
    ``mypy --strict`` with the package's stubs (``turn.outcome`` is
    ``Optional``, ``openai``'s messages are typed)."""
    pytest.importorskip("mypy")
    examples = readme_python_examples()
    assert examples, "no Python example found in the README's Python section"
    files = []
    for n, code in enumerate(examples):
        path = tmp_path / f"readme_example_{n}.py"
        path.write_text(code)
        files.append(str(path))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "mypy_cache"), *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr


STAND_IN = EXAMPLE.parent / "stand_in_model.py"
TOOL_LOOP = EXAMPLE.parent / "tool_loop.py"


async def test_g1_the_examples_run_against_the_stand_in_model(db):
    # What the README offers a machine without a model server: the stand-in,
    # then both examples against it, as a newcomer types them.
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(STAND_IN), "--port", "0", "--delay", "0.05", stdout=asyncio.subprocess.PIPE
    )
    try:
        line = (await asyncio.wait_for(server.stdout.readline(), PATIENCE)).decode()
        assert line.startswith("serving http://127.0.0.1:"), line
        base_url = line.split()[1]

        code, out, err = await run_python(str(EXAMPLE), "--base-url", base_url, "--db", db, "--web-time", "0.3")
        assert code == 0, err
        lines = out.splitlines()
        assert "[recon] turn 1: completed" in lines, lines
        assert "[web] turn 1: cancelled" in lines, lines
        assert "web: parent_finished" in lines, lines

        code, out, err = await run_python(str(TOOL_LOOP), "--base-url", base_url, "--db", db, "read it")
        assert code == 0, err
        assert "[tool] read_file" in out, out
        assert "[answer] The tool said:" in out, out
    finally:
        server.terminate()
        await server.wait()
    rows = {row["name"]: row for row in settle_json(db, "sessions", "--json")}
    assert rows["web"]["outcome"] == "cancelled"
    assert rows["agent"]["state"] == "finalized"
