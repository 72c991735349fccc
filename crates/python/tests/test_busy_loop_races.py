"""Kernel calls racing a busy event loop (G1, G4, G5).

What the kernel has for a loop waits in the loop's mailbox while the loop
is busy, and reaches it in one batch: a turn's start beside its close, a
task's start beside its cancel, a result beside the next request. These
rounds hold the loop at random points between random calls, then finish
the root, and check what every user of the package relies on: every
stream handed to or made for a turn is closed exactly once, every spawned
coroutine is closed, every call ends (with its result or a `settle.Error`),
and nothing waits for the settle deadline."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from typing import Any, List

import settle
from conftest import PATIENCE, Stream, eventually

ROUNDS = 25


class Round:
    """One round's random choices and what it handed to the kernel."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.streams: List[Stream] = []
        self.generators: List[dict] = []
        self.coroutines: List[Any] = []
        self.users: List["asyncio.Task[None]"] = []

    def busy(self) -> None:
        """Holds the loop, so that what the kernel posts meanwhile lands in
        one batch."""
        pause = self.rng.choice([0, 0, 0, 0.0005, 0.002, 0.01])
        if pause:
            time.sleep(pause)

    def stream(self) -> Stream:
        stream = Stream(["tick"], delay=self.rng.choice([0, 0.001, 0.01]), forever=True)
        self.streams.append(stream)
        return stream

    def source(self) -> Any:
        kind = self.rng.randrange(4)
        if kind == 0:
            return self.stream()  # a stream handed over
        if kind == 1:
            return self.stream  # a callable that makes one
        if kind == 2:
            delay = self.rng.choice([0, 0.001, 0.005])

            async def opening() -> Stream:  # an awaitable that makes one
                await asyncio.sleep(delay)
                return self.stream()

            return opening
        seen = {"closed": 0, "started": False}
        self.generators.append(seen)

        async def generator():
            seen["started"] = True
            try:
                while True:
                    await asyncio.sleep(0.001)
                    yield "g"
            finally:
                seen["closed"] += 1

        return generator()

    async def use_turn(self, session: settle.Session) -> None:
        try:
            turn = await session.turn(self.source())
        except settle.Error:
            return  # the session is in a turn, finalized, or shutting down
        self.busy()
        choice = self.rng.randrange(4)
        if choice == 0:
            turn.cancel()
        elif choice == 1:
            async with turn:
                async for _ in turn:
                    if self.rng.random() < 0.4:
                        break
                    self.busy()
        elif choice == 2:
            await turn.aclose()
        # else: left to the session's end

    async def use_task(self, session: settle.Session) -> None:
        async def tool() -> None:
            await asyncio.sleep(PATIENCE)

        coroutine = tool()
        self.coroutines.append(coroutine)
        try:
            task = await session.spawn(coroutine)
        except settle.Error:
            return
        self.busy()
        if self.rng.random() < 0.5:
            task.cancel()
            try:
                await task.join()
            except settle.Error:
                pass


async def test_g4_g5_calls_racing_a_busy_loop_close_every_stream_once_and_end_every_task(db):
    k = await settle.Kernel.open(db, settle_timeout=2 * PATIENCE, drain_timeout=PATIENCE)
    rng = random.Random(20261204)
    made = {"streams": 0, "coroutines": 0}
    try:
        for n in range(ROUNDS):
            r = Round(rng)
            root = await k.register(f"root{n}")
            sessions = [root]
            for _ in range(rng.randint(4, 12)):
                session = rng.choice(sessions)
                action = rng.randrange(5)
                if action == 0:
                    try:
                        sessions.append(await session.child(f"c{len(sessions)}"))
                    except settle.Error:
                        pass
                elif action in (1, 2):
                    r.users.append(asyncio.ensure_future(r.use_turn(session)))
                elif action == 3:
                    r.users.append(asyncio.ensure_future(r.use_task(session)))
                else:
                    await asyncio.sleep(rng.choice([0, 0.001]))
                r.busy()
            finishing = root.finish()
            r.busy()
            await asyncio.wait_for(finishing, PATIENCE)
            done = await asyncio.wait_for(
                asyncio.gather(*r.users, return_exceptions=True), PATIENCE
            )
            unexpected = [e for e in done if isinstance(e, BaseException) and not isinstance(e, settle.Error)]
            assert not unexpected, f"round {n}: {unexpected!r}"
            for session in sessions:
                assert await session.state() == "finalized", f"round {n}: {session.name}"
            await eventually(
                lambda: all(s.closes for s in r.streams)
                and all(g["closed"] or not g["started"] for g in r.generators),
                f"round {n}: every stream closed",
            )
            assert [s.closes for s in r.streams] == [1] * len(r.streams), f"round {n}"
            assert all(g["closed"] <= 1 for g in r.generators), f"round {n}"
            assert all(
                inspect.getcoroutinestate(c) == inspect.CORO_CLOSED for c in r.coroutines
            ), f"round {n}: a spawned coroutine was never closed"
            made["streams"] += len(r.streams)
            made["coroutines"] += len(r.coroutines)
        # The rounds did hand the kernel what they check (how much varies
        # with the timing: a turn refused never calls its source).
        assert made["streams"] >= 5 and made["coroutines"] >= 5, made
    finally:
        await k.shutdown(0.0)
