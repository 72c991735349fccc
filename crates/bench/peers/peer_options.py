#!/usr/bin/env python3
"""The bench's way of running the reference peer (asyncio_teardown.py, next
to this file and unchanged) the same as ours, with two options of its own
before the peer's arguments:

    python3 peer_options.py [--synchronous MODE] [--tree] PEER-ARGS...

--synchronous MODE: every SQLite connection the peer opens runs
  `pragma synchronous = MODE` first. The peer leaves Python's default, FULL
  (an fsync of the WAL at every commit); the store runs NORMAL (WAL + NORMAL
  survives a process kill, and may lose the last commits to a power loss).
  Both sides of a row must run the same setting.
--tree: the teardown cancels by tree, as ours does: only the root's task is
  cancelled; each task, once cancelled, cancels its children's tasks, waits
  for them, then closes its own stream (structured concurrency, as an
  asyncio.TaskGroup does). The peer itself builds the tree and cancels every
  task in one flat loop, leaves first, which is the flat shape's teardown.
  Everything else (the provider, the streams, the one UPDATE per session in
  one transaction, the timing from the first cancel to the commit, the
  output) is the peer's own.

Standard library only.
"""
import asyncio, os, sqlite3, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import asyncio_teardown as peer  # noqa: E402


class _Sqlite:
    """The sqlite3 module, but connect() sets `synchronous` first."""

    def __init__(self, mode):
        self.mode = mode

    def __getattr__(self, name):
        return getattr(sqlite3, name)

    def connect(self, *args, **kwargs):
        con = sqlite3.connect(*args, **kwargs)
        con.execute(f"pragma synchronous={self.mode}")
        return con


async def tree_teardown(n, fanout, folder):
    children = [[] for _ in range(n)]
    for i in range(1, n):
        children[(i - 1) // fanout].append(i)
    closed = []
    tasks = [None] * n

    async def agent_work(i):
        gen = peer.provider()
        try:
            async for _ in gen:
                pass
        finally:
            kids = [tasks[c] for c in children[i]]
            for kid in kids:
                kid.cancel()
            await asyncio.gather(*kids, return_exceptions=True)
            await gen.aclose()
            closed.append(1)

    for i in range(n):
        tasks[i] = asyncio.create_task(agent_work(i))
    await asyncio.sleep(0)  # every task is now mid-stream
    db = os.path.join(folder, f"peer-{n}.db")
    con = peer.sqlite3.connect(db)
    con.execute("pragma journal_mode=wal")
    con.execute("create table s(id integer primary key, state text)")
    con.executemany("insert into s values (?, 'running')", [(i,) for i in range(n)])
    con.commit()
    t0 = time.perf_counter()
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)
    order = list(range(n))[::-1]  # leaves first, as the peer writes them
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
    rest = []
    it = iter(argv)
    for a in it:
        if a == "--synchronous":
            peer.sqlite3 = _Sqlite(next(it))
        elif a == "--tree":
            peer.teardown = tree_teardown
        else:
            rest.append(a)
    peer.main(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
