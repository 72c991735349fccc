"""Shared helpers of the package's tests: a kernel on a fresh SQLite file,
streams that count their closes, and a way to run a script in a child
interpreter (for signals, exit and fork)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Optional

import pytest

import settle

#: Far above what any wait needs on an idle machine: only a hang trips it.
PATIENCE = 30.0

#: A child interpreter's code that takes SQLite's write lock on ``argv[1]``
#: (another process, as a program's own tool would), says "locked", and
#: holds it for ``argv[2]`` seconds: the store stalls meanwhile.
LOCKER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
c.execute("BEGIN EXCLUSIVE")
c.execute("CREATE TABLE IF NOT EXISTS held_lock(x)")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "settle.db")


#: The settle timeout of the ``kernel`` fixture: far above how long any
#: cancelled work here takes to unwind, even on a loaded machine, so that a
#: test expecting ``cancelled`` never reads ``detached`` because the deadline
#: came first. Tests of the deadline itself use ``quick_kernel``.
SETTLE_TIMEOUT = 10.0

#: The settle timeout of ``quick_kernel``: short, for the tests whose work
#: ignores its cancel and is detached at the deadline.
QUICK_SETTLE_TIMEOUT = 0.3


@pytest.fixture
async def kernel(db: str) -> AsyncIterator[settle.Kernel]:
    k = await settle.Kernel.open(db, settle_timeout=SETTLE_TIMEOUT, drain_timeout=2.0)
    yield k
    await k.shutdown(0.0)


@pytest.fixture
async def quick_kernel(db: str) -> AsyncIterator[settle.Kernel]:
    """A kernel whose settle deadline comes soon: for work that ignores its
    cancel and is detached at it (G5)."""
    k = await settle.Kernel.open(db, settle_timeout=QUICK_SETTLE_TIMEOUT, drain_timeout=2.0)
    yield k
    await k.shutdown(0.0)


class Stream:
    """An async iterator over ``items`` that counts how often it is closed.

    ``forever`` repeats the last item; ``delay`` sleeps before each item;
    ``fail`` raises it after the items; ``swallow`` ignores cancellation
    (it catches ``CancelledError`` and goes on yielding)."""

    def __init__(
        self,
        items: Iterable[Any] = ("a", "b"),
        *,
        delay: float = 0.0,
        forever: bool = False,
        fail: Optional[BaseException] = None,
        swallow: bool = False,
    ) -> None:
        self.items = list(items)
        self.delay = delay
        self.forever = forever
        self.fail = fail
        self.swallow = swallow
        self.closes = 0
        self.sent = 0
        self.cancels_swallowed = 0
        self.first_item = asyncio.Event()

    def __aiter__(self) -> "Stream":
        return self

    async def __anext__(self) -> Any:
        if self.closes:
            raise StopAsyncIteration
        if self.delay:
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                if not self.swallow:
                    raise
                self.cancels_swallowed += 1
        if self.sent < len(self.items):
            item = self.items[self.sent]
        elif self.forever and self.items:
            item = self.items[-1]
        elif self.fail is not None:
            raise self.fail
        else:
            raise StopAsyncIteration
        self.sent += 1
        self.first_item.set()
        return item

    async def aclose(self) -> None:
        self.closes += 1


async def eventually(predicate, what: str, timeout: float = PATIENCE) -> None:
    """Waits until ``predicate()`` is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run_script(code: str, *args: str, timeout: float = PATIENCE, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a child interpreter; its stdout and stderr are captured."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


async def run_python(*args: str) -> "tuple[int, str, str]":
    """Runs a child interpreter with ``args`` to its end (bounded by PATIENCE)
    without blocking the loop; gives its exit code, stdout and stderr."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(child.communicate(), PATIENCE)
    return child.returncode, out.decode(), err.decode()


def settle_bin() -> str:
    """The `settle` binary (``SETTLE_BIN``, set by the workspace's test runner)."""
    bin = os.environ.get("SETTLE_BIN")
    if not bin:
        if os.environ.get("CI") == "true":
            pytest.fail("SETTLE_BIN is not set under CI=true")
        pytest.skip("SETTLE_BIN is not set: the `settle` binary is not known")
    return bin


def settle_json(db: str, *args: str) -> Any:
    out = subprocess.run(
        [settle_bin(), "--db", db, *args], capture_output=True, text=True, timeout=PATIENCE
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def piece(index, *, id=None, name=None, arguments=None):
    """An OpenAI-shaped chunk carrying one tool-call piece (``index=None``:
    a piece without an index)."""
    function = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    call = {"function": function}
    if index is not None:
        call["index"] = index
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
