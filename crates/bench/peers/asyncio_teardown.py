#!/usr/bin/env python3
# The reference peer of SPEC §9 (the `teardown durable` row's baseline), vendored as is: do not change it.
"""Peer baseline for the `teardown durable` benchmark row (SPEC §9).

The teardown the Python agent projects of the seeds do: N asyncio tasks, each
mid-stream on an async generator; cancel them leaves first, gather, close each
stream with aclose() in a finally, then mark every session row finalized in
SQLite (one UPDATE per session, one transaction). Timed from the first cancel
to the commit.

    python3 asyncio_teardown.py [N ...] [--fanout F] [--runs R] [--json]

--fanout: children per node (10 by default; 1 makes a chain, N a flat tree).
--json: one JSON object per size on stdout: {"n", "fanout", "runs", "median_ms", "min_ms", "max_ms"}.
Standard library only.
"""
import asyncio, json, os, sqlite3, sys, tempfile, time


async def provider():
    i = 0
    while True:
        await asyncio.sleep(3600)
        yield i
        i += 1


async def agent_work(closed):
    gen = provider()
    try:
        async for _ in gen:
            pass
    finally:
        await gen.aclose()
        closed.append(1)


async def teardown(n, fanout, folder):
    parent = [None] + [(i - 1) // fanout for i in range(1, n)]  # the tree's shape
    assert len(parent) == n
    closed = []
    tasks = [asyncio.create_task(agent_work(closed)) for _ in range(n)]
    await asyncio.sleep(0)  # every task is now mid-stream
    db = os.path.join(folder, f"peer-{n}.db")
    con = sqlite3.connect(db)
    con.execute("pragma journal_mode=wal")
    con.execute("create table s(id integer primary key, state text)")
    con.executemany("insert into s values (?, 'running')", [(i,) for i in range(n)])
    con.commit()
    t0 = time.perf_counter()
    order = list(range(n))[::-1]  # leaves first
    for i in order:
        tasks[i].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    con.executemany("update s set state='finalized' where id=?", [(i,) for i in order])
    con.commit()
    dt = time.perf_counter() - t0
    assert len(closed) == n
    con.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    return dt


def main(argv):
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
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes or [1000, 10000, 100000]:
            times = sorted(asyncio.run(teardown(n, max(1, fanout), folder)) * 1000 for _ in range(runs))
            row = {"n": n, "fanout": fanout, "runs": runs, "median_ms": times[len(times) // 2],
                   "min_ms": times[0], "max_ms": times[-1]}
            if as_json:
                print(json.dumps(row), flush=True)
            else:
                print(f"asyncio teardown n={n} fanout={fanout}: median {row['median_ms']:.1f} ms "
                      f"(min {row['min_ms']:.1f}, max {row['max_ms']:.1f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
