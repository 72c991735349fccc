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
