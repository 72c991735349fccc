#!/usr/bin/env python3
"""What a turn's chunks cost a Python reader: S sessions each stream N
chunks from an async generator that yields as fast as it can, read by one
asyncio task per turn, on a SQLite file (WAL). Every chunk is persisted
before it is yielded (G7), so a reader is behind its stream as soon as the
store is faster than the reader: the shape of a provider's bursts.

    pip install ./crates/python      # a release build: what a user installs
    python crates/python/bench/reads.py [S:N ...] [--rounds R] [--json]

Prints per shape (default `1:20000 100:1000 1000:100`) the medians over R
rounds (default 3) of: the wall time per chunk, the CPU time per chunk of
the whole process (every thread) and of the event loop's thread alone (what
the reading program has left for its own work), and how many of the reads
found their chunk already there (taken without a round trip through the
kernel's threads).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time

import settle
from build import require_release


async def source(n: int):
    for _ in range(n):
        yield "x"


async def read(turn: settle.Turn, counts: list) -> None:
    while True:
        pending = turn.__anext__()
        counts[0] += 1
        counts[1] += type(pending).__name__ == "Ready"
        try:
            await pending
        except StopAsyncIteration:
            return


async def shape(sessions: int, chunks: int, rounds: int, folder: str) -> dict:
    kernel = await settle.Kernel.open(os.path.join(folder, f"reads-{sessions}-{chunks}.db"))
    try:
        handles = [await kernel.register(f"s{i}") for i in range(sessions)]
        walls, cpus, loops, ready = [], [], [], []
        for _ in range(rounds):
            counts = [0, 0]
            t0, c0, l0 = time.perf_counter(), time.process_time(), time.thread_time()
            turns = await asyncio.gather(*(h.turn(lambda: source(chunks)) for h in handles))
            await asyncio.gather(*(read(t, counts) for t in turns))
            wall = time.perf_counter() - t0
            cpu, loop = time.process_time() - c0, time.thread_time() - l0
            assert {t.outcome for t in turns} == {"completed"}
            n = sessions * chunks
            walls.append(wall / n * 1e6)
            cpus.append(cpu / n * 1e6)
            loops.append(loop / n * 1e6)
            ready.append(counts[1] / counts[0])
    finally:
        await kernel.shutdown(1.0)
    median = lambda values: sorted(values)[len(values) // 2]
    return {
        "sessions": sessions,
        "chunks": chunks,
        "rounds": rounds,
        "wall_us_per_chunk": median(walls),
        "cpu_us_per_chunk": median(cpus),
        "loop_cpu_us_per_chunk": median(loops),
        "reads_ready": median(ready),
    }


def main(argv) -> None:
    require_release()
    shapes, rounds, as_json = [], 3, False
    it = iter(argv)
    for a in it:
        if a == "--rounds":
            rounds = int(next(it))
        elif a == "--json":
            as_json = True
        else:
            s, n = a.split(":")
            shapes.append((int(s), int(n)))
    with tempfile.TemporaryDirectory() as folder:
        for sessions, chunks in shapes or [(1, 20000), (100, 1000), (1000, 100)]:
            row = asyncio.run(shape(sessions, chunks, rounds, folder))
            if as_json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"python reads {sessions} x {chunks}: {row['wall_us_per_chunk']:.1f} us/chunk wall, "
                    f"cpu {row['cpu_us_per_chunk']:.1f} (loop thread {row['loop_cpu_us_per_chunk']:.1f}) "
                    f"us/chunk, {row['reads_ready']:.0%} of reads found their chunk there",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
