"""The package is typed: its stubs match the native module (mypy's
stubtest, as pydantic-core checks its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import settle


def test_the_package_ships_py_typed_and_stubs():
    folder = Path(settle.__file__).parent
    assert (folder / "py.typed").exists()
    assert (folder / "_settle.pyi").exists()


def test_the_stubs_match_the_native_module():
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "settle._settle"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_package_says_how_it_was_built():
    """``settle.BUILD_PROFILE``, not only ``settle._settle``'s: what a
    program checks before it measures (a debug build is slower)."""
    assert settle.BUILD_PROFILE in ("release", "debug")
    assert "BUILD_PROFILE" in settle.__all__


async def test_the_calls_the_stubs_type_none_resolve_to_none(kernel):
    """``_Call[None]`` in the stubs: each resolves to ``None`` (a Rust
    ``()`` reached Python as the empty tuple), a finalized session's
    ``release`` too."""

    async def reply():
        yield "a"

    session = await kernel.register("s")
    results = {
        "hold": await session.hold("input"),
        "release": await session.release("input"),
    }
    turn = await session.turn(reply())
    results["turn.aclose"] = await turn.aclose()
    turn = await session.turn(reply())
    results["turn.__aexit__"] = await turn.__aexit__(None, None, None)
    results["cancel"] = await session.cancel()
    await session.finalized()
    results["release after the end"] = await session.release("input")
    assert results == dict.fromkeys(results)


def test_a_task_is_generic_at_run_time_as_in_the_stubs():
    """``settle.Task[int]`` in an annotation that is evaluated (no
    ``from __future__ import annotations``), as ``asyncio.Task[int]``."""
    alias = settle.Task[int]
    assert alias.__origin__ is settle.Task and alias.__args__ == (int,)


TYPED_PROGRAM = """
import pathlib
from typing import List

from typing_extensions import assert_type

import settle


async def tool() -> int:
    return 1


async def main() -> None:
    kernel = await settle.Kernel.open(pathlib.Path("x.db"))
    session = await kernel.register("s")
    task = await session.spawn(tool())
    assert_type(task, settle.Task[int])
    assert_type(await task, int)
    assert_type(await task.join(), int)
    annotated: settle.Task[int] = task
    word: str = await task  # E: the task's result is an int
    messages: List[dict[str, object]] = [{"role": "user", "content": "hi"}]
    await session.turn(lambda: None, input=messages)
    print(annotated, word)
"""


def test_the_stubs_type_what_a_program_writes(tmp_path):
    """Under ``mypy --strict``: a task is typed by its coroutine's result,
    a store's path may be a ``pathlib.Path``, a turn's input any list of
    message mappings; and a wrong use is still an error."""
    pytest.importorskip("mypy")
    program = tmp_path / "typed.py"
    program.write_text(TYPED_PROGRAM)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "mypy_cache"), str(program)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    expected = [n for n, line in enumerate(TYPED_PROGRAM.splitlines(), 1) if "# E:" in line]
    assert [int(line.split(":")[1]) for line in errors] == expected, out.stdout + out.stderr
    assert 'expression has type "int"' in errors[0], errors
