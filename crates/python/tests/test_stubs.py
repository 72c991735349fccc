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
