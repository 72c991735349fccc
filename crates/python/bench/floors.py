#!/usr/bin/env python3
"""The floor of the `python` row's shape: what the event loop's thread does
in a teardown of N agents when the kernel costs nothing.

Each shape below is the loop-side work of one way to tear down N turns that
are mid-stream on an async generator, with every kernel step replaced by an
instant one (a callback that cancels all at once, then one that ends all at
once). Their loop-thread CPU is the least any kernel with that shape can
make the row cost; the peer's own (its tasks, its aclose(), and, in
`peer+sql`, its one UPDATE per session) is what the row is measured against.

    python crates/python/bench/floors.py [N] [--rounds R] [--nogc]

- `peer+sql`, `peer`: the asyncio peer's teardown, with and without its SQL.
- `pumps`: today's shape. A pump task per turn reads the source; a reader
  task awaits one future per `__anext__`. The kernel cancels every pump
  (each closes its stream), then ends every reader's future (the outcome is
  known once the stream is closed, G4).
- `bridge`: `pumps` with the package's own pump (`settle._bridge._pump`)
  and `Next`, over a sink written in Python: the bridge's Python code,
  without its Rust.
- `reader_reads`: one task per agent. The reader reads the source itself;
  the kernel cancels it, it takes the cancel back (`uncancel()`), closes the
  stream, then awaits the turn's end.
- `reader_reads_known`: the same, where the outcome is known at the close
  (no second wake): the least any shape can do.

Prints the median and the least CPU time of the loop's thread per round
(`time.thread_time()`): on shared cores the median swings by half; the
least is the steadier figure.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import sys
import tempfile
import time

from teardown import load_peer  # the row's own script, beside this one

_peer = load_peer()
#: The peer's own generator, for every shape: mid-stream in its `sleep`.
provider = _peer.provider


async def instant(loop, step) -> None:
    """Runs `step` as one callback, as a mailbox drain would, and lets the
    tasks it woke run."""
    loop.call_soon(step)
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def end_all(loop, ends) -> None:
    """Ends every reader's wait in one callback, as one mailbox drain would."""
    loop.call_soon(lambda: [end.set_exception(StopAsyncIteration()) for end in ends])


async def peer(n: int, sql: bool) -> float:
    # The peer's own tasks (`agent_work`), cancelled and gathered as it does.
    closed = []
    tasks = [asyncio.create_task(_peer.agent_work(closed)) for _ in range(n)]
    await asyncio.sleep(0)
    with tempfile.TemporaryDirectory() as folder:
        con = sqlite3.connect(os.path.join(folder, "peer.db"))
        con.execute("pragma journal_mode=wal")
        con.execute("create table s(id integer primary key, state text)")
        con.executemany("insert into s values (?, 'running')", [(i,) for i in range(n)])
        con.commit()
        c0 = time.thread_time()
        for task in reversed(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if sql:
            con.executemany("update s set state='finalized' where id=?", [(i,) for i in range(n)])
            con.commit()
        took = time.thread_time() - c0
        con.close()
    assert len(closed) == n
    return took


async def pumps(n: int) -> float:
    loop = asyncio.get_running_loop()
    ends = [loop.create_future() for _ in range(n)]
    closed = []

    async def pump(i):
        gen = provider()
        it = gen.__aiter__()
        try:
            while True:
                await it.__anext__()
        except asyncio.CancelledError:
            pass
        finally:
            await gen.aclose()
            closed.append(i)

    async def read(end):
        try:
            await end
        except StopAsyncIteration:
            pass

    tasks = [asyncio.create_task(pump(i)) for i in range(n)]
    readers = [asyncio.create_task(read(end)) for end in ends]
    await asyncio.sleep(0)
    c0 = time.thread_time()
    await instant(loop, lambda: [t.cancel() for t in tasks])
    end_all(loop, ends)
    await asyncio.gather(*readers)
    took = time.thread_time() - c0
    assert len(closed) == n
    return took


class _Sink:
    """The pump's sink, in Python: what the Rust one answers, for free."""

    __slots__ = ("task", "close")

    def __init__(self) -> None:
        self.task, self.close = None, False

    def attach(self, task) -> None:
        self.task = task

    def close_requested(self) -> bool:
        return self.close

    def opened(self) -> None:
        pass

    def push(self, item) -> bool:
        return True

    def end(self) -> None:
        pass

    def fail(self, message) -> None:
        pass

    def cancelled(self) -> None:
        pass

    def closed(self) -> None:
        self.task = None


async def bridge(n: int) -> float:
    from settle import _bridge

    loop = asyncio.get_running_loop()
    sinks = [_Sink() for _ in range(n)]
    for sink in sinks:
        _bridge.start_pump(loop, provider, None, sink)
    ends = [loop.create_future() for _ in range(n)]

    async def read(end):
        try:
            while True:
                await _bridge.Next(end, None)
        except StopAsyncIteration:
            pass

    def cancel_all():
        for sink in sinks:
            sink.close = True
            sink.task.cancel()

    readers = [asyncio.create_task(read(end)) for end in ends]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    c0 = time.thread_time()
    await instant(loop, cancel_all)
    end_all(loop, ends)
    await asyncio.gather(*readers)
    return time.thread_time() - c0


async def reader_reads(n: int, known: bool) -> float:
    loop = asyncio.get_running_loop()
    ends = [loop.create_future() for _ in range(n)]
    closed = []

    async def read(i):
        gen = provider()
        it = gen.__aiter__()
        try:
            while True:
                await it.__anext__()
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
        await gen.aclose()
        closed.append(i)
        if not known:
            try:
                await ends[i]
            except StopAsyncIteration:
                pass

    readers = [asyncio.create_task(read(i)) for i in range(n)]
    await asyncio.sleep(0)
    c0 = time.thread_time()
    await instant(loop, lambda: [r.cancel() for r in readers])
    if not known:
        end_all(loop, ends)
    await asyncio.gather(*readers)
    took = time.thread_time() - c0
    assert len(closed) == n
    return took


SHAPES = {
    "peer+sql": lambda n: peer(n, True),
    "peer": lambda n: peer(n, False),
    "pumps": pumps,
    "bridge": bridge,
    "reader_reads": lambda n: reader_reads(n, False),
    "reader_reads_known": lambda n: reader_reads(n, True),
}


def main(argv) -> None:
    n, rounds, nogc = 1000, 21, False
    it = iter(argv)
    for a in it:
        if a == "--rounds":
            rounds = int(next(it))
        elif a == "--nogc":
            nogc = True
        else:
            n = int(a)
    if nogc:
        gc.disable()
    if sys.version_info < (3, 11):
        del SHAPES["reader_reads"], SHAPES["reader_reads_known"]  # uncancel() is 3.11's
    for name, shape in SHAPES.items():
        times = sorted(asyncio.run(shape(n)) * 1000 for _ in range(rounds))
        print(f"{name:20s} n={n}: loop thread {times[len(times) // 2]:6.2f} ms median, {times[0]:6.2f} ms least", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
