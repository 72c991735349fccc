"""G4 at the end of an event loop: a turn still running as its loop ends has
its stream closed on that loop before the loop closes, when the loop's end
runs ``shutdown_asyncgens()`` (``asyncio.run``, ``asyncio.Runner``, a program
that closes its loop by the book); and a loop closed under a turn without it
has its pump let go of, so that what the kernel held is freed at the next
collection rather than kept until the process exits. Each runs in a child
interpreter, with an OpenAI-compatible server on a thread of its own that
outlives the loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_script

pytest.importorskip("openai")

TESTS = str(Path(__file__).parent)

#: What the scripts share: a server on its own thread (its own loop), which
#: notes when each connection was closed by the client, and a stream that
#: counts its closes.
COMMON = """
import asyncio, gc, json, sys, threading, time, weakref
sys.path.insert(0, sys.argv[2])
from sse_server import SseServer
import openai, settle

box = {}

def serve():
    async def run():
        async with SseServer(forever=True, interval=0.01) as server:
            box["server"] = server
            await asyncio.Event().wait()
    asyncio.run(run())

threading.Thread(target=serve, daemon=True).start()
while "server" not in box:
    time.sleep(0.01)
server = box["server"]
client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)

def create():
    return client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "hi"}], stream=True
    )

class Counted:
    closes = 0
    made = []
    def __init__(self):
        Counted.made.append(weakref.ref(self))
    def __aiter__(self):
        return self
    async def __anext__(self):
        await asyncio.sleep(0.01)
        return "c"
    async def aclose(self):
        Counted.closes += 1

def closed_within(seconds):
    deadline = time.monotonic() + seconds
    while not server.closed_at and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.closed_at[0] if server.closed_at else None
"""

LATE_TURN_SCRIPT = COMMON + """
async def main():
    # Kept past the loop: nothing of the kernel's own winds the turns down.
    kernel = box["kernel"] = await settle.Kernel.open(sys.argv[1], settle_timeout=1.0)
    session = box["session"] = await kernel.register("s")
    other = await kernel.register("t")

    async def agent():
        try:
            await asyncio.sleep(3600)
        finally:
            # Its own cleanup as asyncio.run cancels it: two last turns,
            # read a little and left running. Their pumps start after
            # asyncio.run took the list of the tasks it cancels.
            turn = await session.turn(create)
            async for _ in turn:
                break
            counted = await other.turn(lambda: Counted())
            async for _ in counted:
                break
            box["turns"] = [turn, counted]

    asyncio.create_task(agent())
    await asyncio.sleep(0)

asyncio.run(main())
returned = time.monotonic()
closed = closed_within(3.0)
print(json.dumps({
    "requests": server.requests,
    "closed_after_return": None if closed is None else closed - returned,
    "closes": Counted.closes,
}), flush=True)

async def read_back():
    turns = await box["session"].transcript()
    print(json.dumps([t["outcome"] for t in turns]), flush=True)
    await box["kernel"].shutdown(0.0)

asyncio.run(read_back())
"""

BY_HAND_SCRIPT = COMMON + """
async def main():
    kernel = box["kernel"] = await settle.Kernel.open(sys.argv[1], settle_timeout=1.0)
    session = await kernel.register("s")
    other = await kernel.register("t")
    turn = await session.turn(create)
    await turn.__anext__()
    counted = await other.turn(lambda: Counted())
    await counted.__anext__()
    box["turns"] = [turn, counted]

loop = asyncio.new_event_loop()
loop.run_until_complete(main())
if sys.argv[3] == "shutdown_asyncgens":
    # What asyncio's documentation asks before close.
    loop.run_until_complete(loop.shutdown_asyncgens())
loop.close()
closed_at = time.monotonic()
closed = closed_within(1.0)
print(json.dumps({
    "closed_after_close": None if closed is None else closed - closed_at,
    "closes": Counted.closes,
}), flush=True)
box["kernel"].begin_shutdown(0.0)
"""

LATE_TOOL_SCRIPT = COMMON + """
async def main():
    kernel = box["kernel"] = await settle.Kernel.open(sys.argv[1], settle_timeout=1.0)
    session = box["session"] = await kernel.register("s")
    reading = asyncio.Event()

    async def tool():
        # A tool that reads a model's stream itself, mid-read as the loop ends.
        stream = await create()
        async for _ in stream:
            reading.set()

    async def agent():
        try:
            await asyncio.sleep(3600)
        finally:
            # Its cleanup as asyncio.run cancels it: a turn and a tool,
            # started after asyncio.run took the list of tasks it cancels,
            # each left mid-read of an HTTP stream.
            turn = await session.turn(create)
            async for _ in turn:
                break
            box["turn"] = turn
            box["tool"] = await session.spawn(tool())
            await reading.wait()

    asyncio.create_task(agent())
    await asyncio.sleep(0)

asyncio.run(main())
returned = time.monotonic()
deadline = time.monotonic() + 3.0
while len(server.closed_at) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({
    "requests": server.requests,
    "closed_after_return": [at - returned for at in server.closed_at],
}), flush=True)

async def read_back():
    # The turn's end is written by the kernel's threads once its pump
    # reported it: read once it is (or after a generous bound).
    deadline = time.monotonic() + 20
    while True:
        outcomes = [t["outcome"] for t in await box["session"].transcript()]
        if None not in outcomes or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    print(json.dumps(outcomes), flush=True)
    await box["kernel"].shutdown(0.0)

asyncio.run(read_back())
"""

#: What the loop's end must not say: a close tried on a closed loop, a
#: pump left pending, a coroutine closed with an await in its way.
QUIET = (
    "Event loop is closed",
    "Task was destroyed",
    "never awaited",
    "Exception ignored",
    # `shutdown_asyncgens()` closing a stream's generator while a pump (or
    # a tool) is still in the middle of a step of it.
    "already running",
    "an error occurred during closing of asynchronous generator",
)


def test_g4_turns_started_as_asyncio_run_ends_have_their_streams_closed_before_it_returns(db):
    """Found from outside: a turn whose pump started after ``asyncio.run``
    took the list of tasks it cancels (a task's cleanup starting it, or a
    start in flight) was never cancelled: the loop closed under it with its
    HTTP connection open, and the kernel's side held the pump, so the
    connection stayed open until the process exited. The loop's end
    (``shutdown_asyncgens``) now cancels what is still pending on it and
    waits, bounded by the settle timeout, for its streams to close."""
    out = run_script(LATE_TURN_SCRIPT, db, TESTS, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    said = json.loads(lines[0])
    assert said["requests"] == 1, said
    # Seen by the server within its poll of the connection: closed before
    # asyncio.run returned, not at exit.
    assert said["closed_after_return"] is not None, (said, out.stderr)
    assert said["closed_after_return"] < 1.0, said
    assert said["closes"] == 1, said  # G4: exactly once
    assert json.loads(lines[1]) == ["cancelled"], out.stdout
    for words in QUIET:
        assert words not in out.stderr, out.stderr


def test_g4_loop_end_closes_pending_turns_and_tools_before_the_loop_closes_their_generators(db):
    """Found from outside: at the end of ``asyncio.run`` with a turn and a
    tool started late (a task's cleanup) and each mid-read of an ``openai``
    stream, asyncio logged "aclose(): asynchronous generator is already
    running" for every generator of the streams (the ``openai`` stream's,
    ``httpx``'s, ``httpcore``'s). ``shutdown_asyncgens()`` closes every
    async generator first iterated on the loop at once, the package's
    (whose close cancels what is pending) among them: the others were
    closed while the pump and the tool were still inside a step of them.
    Now what is pending is cancelled and waited for before the loop closes
    any generator: each stream is closed once, by whoever read it, and the
    loop's end says nothing."""
    out = run_script(LATE_TOOL_SCRIPT, db, TESTS, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    said = json.loads(lines[0])
    assert said["requests"] == 2, said
    # Both connections closed as the loop ended, not at exit.
    assert len(said["closed_after_return"]) == 2, (said, out.stderr)
    assert all(at < 1.0 for at in said["closed_after_return"]), said
    assert json.loads(lines[1]) == ["cancelled"], out.stdout
    for words in QUIET:
        assert words not in out.stderr, out.stderr


@pytest.mark.parametrize("how", ["shutdown_asyncgens", "close"])
def test_g4_a_loop_closed_by_hand_under_running_turns_closes_their_streams(db, how):
    """A loop run by hand and closed with turns running, by the book
    (``shutdown_asyncgens()`` first) or not (``loop.close()`` alone, as some
    frameworks do): their streams are closed on it before it closes, once
    each (G4). Before, closed by the book, their HTTP connections stayed
    open until the process exited; closed without it, the kernel let go of
    the pumps once it found the loop closed and the collector freed them,
    but no stream was closed (a closed loop runs no ``aclose()``), and the
    HTTP client's pool kept the connection of a response never closed, its
    socket open, until the process exited. Neither says anything on
    stderr."""
    out = run_script(BY_HAND_SCRIPT, db, TESTS, how, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    said = json.loads(out.stdout.splitlines()[0])
    assert said["closed_after_close"] is not None, (said, out.stderr)
    assert said["closed_after_close"] < 1.0, said
    assert said["closes"] == 1, said
    for words in QUIET:
        assert words not in out.stderr, out.stderr
