"""The Rust framework's per-turn options, budgets and holds, from Python:
``session.turn(..., idle_timeout=, first_event_timeout=)``,
``settle.Budget`` on ``register``/``child``, ``session.hold()``."""

from __future__ import annotations

import asyncio

import pytest

import settle
from conftest import PATIENCE, Stream


async def test_a_turn_sets_its_own_idle_timeout(db):
    # The kernel's idle timeout is long; this turn's is short.
    kernel = await settle.Kernel.open(db, settle_timeout=0.3, idle_timeout=300.0)
    try:
        session = await kernel.register("s")
        stream = Stream(["a"], delay=30.0)
        async with await session.turn(stream, idle_timeout=0.2) as turn:
            chunks = await asyncio.wait_for(_read(turn), PATIENCE)
        assert chunks == []
        assert turn.outcome == "idle_timeout"
    finally:
        await kernel.shutdown(0.0)


async def test_a_turn_sets_its_own_first_event_timeout(db):
    kernel = await settle.Kernel.open(db, settle_timeout=0.3, idle_timeout=None)
    try:
        session = await kernel.register("s")
        async with await session.turn(Stream(["a"], delay=30.0), first_event_timeout=0.2) as turn:
            assert await asyncio.wait_for(_read(turn), PATIENCE) == []
        assert turn.outcome == "idle_timeout"
        # Zero disables: a quick stream is read to its end.
        async with await session.turn(Stream(["b"]), idle_timeout=0) as turn:
            assert await asyncio.wait_for(_read(turn), PATIENCE) == ["b"]
        assert turn.outcome == "completed"
    finally:
        await kernel.shutdown(0.0)


async def test_a_negative_timeout_is_bad_input(kernel):
    session = await kernel.register("s")
    with pytest.raises(settle.BadInput):
        await session.turn(Stream(["a"]), idle_timeout=-1.0)


def test_a_budget_says_what_it_limits():
    budget = settle.Budget(turns=2, tokens=1000, wall_time=1.5)
    assert (budget.turns, budget.tokens, budget.wall_time) == (2, 1000, 1.5)
    assert settle.Budget() == settle.Budget(turns=None)
    assert budget != settle.Budget(turns=2)
    with pytest.raises(settle.BadInput):
        settle.Budget(wall_time=-1.0)


async def test_a_spent_turn_budget_refuses_the_next_turn_and_winds_the_subtree_down(kernel):
    root = await kernel.register("root", budget=settle.Budget(turns=1))
    child = await root.child("child")
    async with await child.turn(Stream(["one"])) as turn:
        assert await _read(turn) == ["one"]
    with pytest.raises(settle.BudgetExhausted):
        await root.turn(Stream(["two"]))
    assert await asyncio.wait_for(child.finalized(), PATIENCE) == "budget_exhausted"
    assert await asyncio.wait_for(root.finalized(), PATIENCE) == "budget_exhausted"


async def test_a_token_count_past_64_bits_or_a_float_spends_a_token_budget(kernel):
    """Found from outside: a usage report of ``2**64 + 1`` tokens, or of
    ``100.0``, counted none, and a budget of 10 tokens let the next turn
    go. Every count is counted, saturated."""
    for total in [2**64 + 1, 100.0, 1.5e300]:
        session = await kernel.register("s", budget=settle.Budget(tokens=10))
        usage = {"choices": [], "usage": {"total_tokens": total}}
        async with await session.turn(Stream(["hi", usage])) as turn:
            await _read(turn)
        assert await asyncio.wait_for(session.finalized(), PATIENCE) == "budget_exhausted", total


async def test_new_work_asked_of_a_session_winding_down_on_its_budget_raises_budget_exhausted(db):
    """Its token budget spent by a reply, a session winds down while a task
    of its settles: a turn asked meanwhile raises ``BudgetExhausted``, as
    the turn the budget refuses does; once finalized, ``SessionClosed``."""

    started = asyncio.Event()

    async def slow_to_stop() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)

    kernel = await settle.Kernel.open(db, settle_timeout=2.0)
    try:
        session = await kernel.register("s", budget=settle.Budget(tokens=5))
        await session.spawn(slow_to_stop())
        await started.wait()
        usage = {"choices": [], "usage": {"total_tokens": 10}}
        async with await session.turn(Stream(["hi", usage])) as turn:
            await _read(turn)
        with pytest.raises(settle.BudgetExhausted):
            await session.turn(Stream(["again"]))
        assert await asyncio.wait_for(session.finalized(), PATIENCE) == "budget_exhausted"
        with pytest.raises(settle.SessionClosed):
            await session.turn(Stream(["again"]))
    finally:
        await kernel.shutdown(0.0)


async def test_a_child_has_a_budget_of_its_own(kernel):
    root = await kernel.register("root")
    child = await root.child("child", budget=settle.Budget(turns=0))
    with pytest.raises(settle.BudgetExhausted):
        await child.turn(Stream(["x"]))
    assert await asyncio.wait_for(child.finalized(), PATIENCE) == "budget_exhausted"
    assert not root.closed


async def test_a_held_session_is_not_evicted_by_the_lru_cap(db):
    kernel = await settle.Kernel.open(db, lru_cap=2)
    try:
        waiting = await kernel.register("waiting for a person")
        await waiting.hold("input")
        idle = await kernel.register("idle")
        newcomer = await kernel.register("newcomer")  # over the cap of 2: the idle one goes
        assert await asyncio.wait_for(idle.finalized(), PATIENCE) == "lru_evict"
        assert not waiting.closed
        await waiting.release("input")
        # Now the released one can go too (after the newcomer, idle longer).
        await kernel.register("another")
        await kernel.register("one more")
        assert await asyncio.wait_for(newcomer.finalized(), PATIENCE) == "lru_evict"
        assert await asyncio.wait_for(waiting.finalized(), PATIENCE) == "lru_evict"
        with pytest.raises(settle.BadInput):
            await idle.hold("lunch")
    finally:
        await kernel.shutdown(0.0)


async def _read(turn):
    return [chunk.text async for chunk in turn]


def test_the_idle_timeout_has_the_runtimes_default():
    # Kernel.open's default is the runtime's (30 s), not a second number.
    assert settle.DEFAULT_IDLE_TIMEOUT == 30.0


async def test_a_turn_past_max_turn_chunks_or_bytes_ends_too_large_and_keeps_what_it_read(db):
    """Found from outside: nothing bounded a Python turn, and a source that
    never stops grew the process past a gigabyte. ``Kernel.open`` takes
    the bounds ``settle serve`` sets: the chunk past either is neither
    stored nor read, and the turn ends ``failed`` (``too_large``)."""
    for bound, forever in [({"max_turn_chunks": 3}, "x"), ({"max_turn_bytes": 10}, "abcd")]:
        async with await settle.Kernel.open(db, **bound) as kernel:
            session = await kernel.register("s")
            async with await session.turn(Stream([forever], forever=True)) as turn:
                got = await asyncio.wait_for(_read(turn), PATIENCE)
            assert turn.outcome == "failed", (bound, turn.error)
            assert turn.error[0] == "too_large", turn.error
            assert got == [forever] * (3 if "max_turn_chunks" in bound else 2), bound
    with pytest.raises(settle.BadInput, match="max_turn_bytes=0"):
        await settle.Kernel.open(db, max_turn_bytes=0)


async def test_the_usage_after_a_finish_counts_and_a_whole_reply_is_not_cut_by_it(kernel):
    """Found from outside: servers send a reply's usage after its finish
    reason. After a ``length`` cut the usage was never read, so the turn
    spent nothing against its budget; and a whole reply (``stop``) whose
    usage exhausted the budget was cut while its stream waited for its end,
    and recorded ``cancelled``."""

    async def reply(finish):
        yield {"choices": [{"index": 0, "delta": {"content": "answer"}, "finish_reason": finish}]}
        yield {"choices": [], "usage": {"total_tokens": 500}}
        await asyncio.sleep(0.5)  # the wait for the stream's end

    for finish, outcome in [("length", "failed"), ("stop", "completed")]:
        session = await kernel.register("s", budget=settle.Budget(tokens=10))
        async with await session.turn(reply(finish)) as turn:
            got = await _read(turn)
        assert got == ["answer", None], (finish, got)
        assert turn.outcome == outcome, (finish, turn.error)
        if finish == "length":
            assert turn.error[0] == "truncated", turn.error
        assert await asyncio.wait_for(session.finalized(), PATIENCE) == "budget_exhausted", finish


async def test_the_limits_of_what_a_turn_sends_are_options_of_the_kernel(tmp_path):
    """Found from outside: the limits of a turn's request (1 MiB a message,
    16 MiB the whole) applied from Python unseen and could not be changed:
    one long reply made every later turn of its conversation refuse. They
    are ``Kernel.open`` options; ``None`` lifts them, ``0`` is refused."""
    kernel = await settle.Kernel.open(None)
    try:
        session = await kernel.register("s")
        with pytest.raises(settle.BadInput, match="max_prompt_bytes"):
            await session.turn(Stream(["x"]), input="y" * (1024 * 1024 + 1))
        await session.finish()
    finally:
        await kernel.shutdown(0.0)
    kernel = await settle.Kernel.open(None, max_prompt_bytes=16, max_history_bytes=None)
    try:
        session = await kernel.register("s")
        with pytest.raises(settle.BadInput, match="max_prompt_bytes"):
            await session.turn(Stream(["x"]), input="y" * 17)
        long = [{"role": "user", "content": "y" * 16}] * 100
        async with await session.turn(Stream(["ok"]), input=long) as turn:
            assert [c.text async for c in turn] == ["ok"]
        await session.finish()
    finally:
        await kernel.shutdown(0.0)
    kernel = await settle.Kernel.open(None, max_prompt_bytes=None, max_history_bytes=64)
    try:
        session = await kernel.register("s")
        with pytest.raises(settle.BadInput, match="max_history_bytes"):
            await session.turn(Stream(["x"]), input=[{"role": "user", "content": "y" * 40}] * 2)
        await session.finish()
    finally:
        await kernel.shutdown(0.0)
    for option in ("max_prompt_bytes", "max_history_bytes"):
        with pytest.raises(settle.BadInput, match=option):
            await settle.Kernel.open(None, **{option: 0})
