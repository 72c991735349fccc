#!/usr/bin/env python3
"""The `python` row of SPEC §9: the durable teardown driven from Python
through the `settle` package, against the asyncio peer at the same size.

N agents in a tree (fan-out 10 by default), each a session whose turn is
mid-stream on an async generator, read by an asyncio task of its own. Timed
from the root's finish (which cancels every descendant, closes every stream
with aclose() and finalizes every session, children first, timeline
included, on a SQLite file in WAL mode) until every reading task has ended.
The peer (`crates/bench/peers/asyncio_teardown.py`, the seeds' own teardown:
cancel, gather, aclose, one UPDATE per session) runs in the same process,
its rounds interleaved with ours, and as `settle-bench` runs it
(`crates/bench/peers/peer_options.py --synchronous NORMAL --tree`): its
SQLite at the store's `synchronous = NORMAL`, and cancelled by tree, the
root's task cancelling its children's, as the kernel does, not in one flat
loop.

    pip install ./crates/python      # a release build: what a user installs
    python crates/python/bench/teardown.py [N ...] [--fanout F] [--runs R] [--json]

Prints one line per size (or, with --json, one object: {"n", "fanout",
"runs", "ours_ms", "peer_ms", "ratio", "ours_cpu_ms", "ours_loop_cpu_ms",
"peer_cpu_ms"}: medians, ratio = ours / peer, target ≤ 1.0). The CPU times
are the process's (every thread) and the loop thread's over the same timed
window: on shared cores, where wall time swings with the other load, they
say how much work each side does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import settle
from build import require_release

PEERS = Path(__file__).resolve().parents[2] / "bench" / "peers"
PEER = PEERS / "asyncio_teardown.py"


class _Clock:
    """The peer's `time`, unchanged but for `perf_counter`, which also notes
    the CPU time at each call: the peer reads it exactly twice, at the start
    and at the end of its timed window."""

    def __init__(self) -> None:
        self.marks: list = []

    def __getattr__(self, name):
        return getattr(time, name)

    def perf_counter(self) -> float:
        self.marks.append(time.process_time())
        return time.perf_counter()


def load_peer():
    """The peer's module, unchanged."""
    spec = importlib.util.spec_from_file_location("asyncio_teardown", PEER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_peer_as_benched(clock: _Clock):
    """The peer's teardown as `settle-bench` runs it: `peer_options.py`'s
    tree teardown over the peer's own provider and SQLite, every connection
    at `synchronous = NORMAL`, timed by `clock`."""
    sys.path.insert(0, str(PEERS))
    import peer_options  # noqa: E402  (imports asyncio_teardown beside it)

    peer_options.peer.sqlite3 = peer_options._Sqlite("NORMAL")
    peer_options.time = clock
    return peer_options.tree_teardown


async def provider():
    i = 0
    while True:
        await asyncio.sleep(3600)
        yield str(i)
        i += 1


async def read(turn: settle.Turn) -> None:
    async for _ in turn:
        pass


async def ours(n: int, fanout: int, folder: str, round_no: int) -> tuple:
    db = os.path.join(folder, f"ours-{n}-{round_no}.db")
    kernel = await settle.Kernel.open(db, settle_timeout=5.0, idle_timeout=None, idle_ttl=None, lru_cap=None)
    try:
        sessions = [await kernel.register("agent-0")]
        for i in range(1, n):
            sessions.append(await kernel.register(f"agent-{i}", sessions[(i - 1) // fanout]))
        turns = await asyncio.gather(*(s.turn(provider) for s in sessions))
        readers = [asyncio.create_task(read(t)) for t in turns]
        # Every turn's stream is open and mid-stream (its pump is waiting).
        await asyncio.sleep(0.2)
        t0, c0, l0 = time.perf_counter(), time.process_time(), time.thread_time()
        await sessions[0].finish()
        await asyncio.gather(*readers)
        dt = time.perf_counter() - t0
        cpu, loop_cpu = time.process_time() - c0, time.thread_time() - l0
        outcomes = {t.outcome for t in turns}
        assert outcomes == {"cancelled"}, outcomes
        return dt, cpu, loop_cpu
    finally:
        await kernel.shutdown(0.0)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                os.unlink(db + suffix)


def main(argv) -> None:
    require_release()
    sizes, fanout, runs, as_json = [], 10, 5, False
    it = iter(argv)
    for a in it:
        if a == "--fanout":
            fanout = int(next(it))
        elif a == "--runs":
            runs = int(next(it))
        elif a == "--json":
            as_json = True
        else:
            sizes.append(int(a))
    clock = _Clock()
    peer_teardown = load_peer_as_benched(clock)
    median = lambda values: sorted(values)[len(values) // 2]
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes or [1000, 10000]:
            mine, theirs = [], []
            for r in range(runs):
                dt, cpu, loop_cpu = asyncio.run(ours(n, max(1, fanout), folder, r))
                mine.append((dt * 1000, cpu * 1000, loop_cpu * 1000))
                clock.marks.clear()
                dt = asyncio.run(peer_teardown(n, max(1, fanout), folder))
                theirs.append((dt * 1000, (clock.marks[-1] - clock.marks[0]) * 1000))
            row = {"n": n, "fanout": fanout, "runs": runs,
                   "ours_ms": median([m[0] for m in mine]), "peer_ms": median([t[0] for t in theirs])}
            row["ratio"] = row["ours_ms"] / row["peer_ms"]
            row["ours_cpu_ms"] = median([m[1] for m in mine])
            row["ours_loop_cpu_ms"] = median([m[2] for m in mine])
            row["peer_cpu_ms"] = median([t[1] for t in theirs])
            if as_json:
                print(json.dumps(row), flush=True)
            else:
                print(f"python teardown durable n={n} fanout={fanout}: settle {row['ours_ms']:.1f} ms, "
                      f"asyncio peer {row['peer_ms']:.1f} ms, ratio {row['ratio']:.2f} (target <= 1.0); "
                      f"cpu: settle {row['ours_cpu_ms']:.1f} ms (loop thread {row['ours_loop_cpu_ms']:.1f}), "
                      f"peer {row['peer_cpu_ms']:.1f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
