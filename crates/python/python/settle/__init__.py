"""settle: a lifecycle kernel for LLM-agent sessions, for asyncio programs.

A program keeps its own model client, tools and loop, and puts them under
the kernel, so that teardown is correct on every path::

    import settle

    async def main():
        async with await settle.Kernel.open("settle.db") as kernel:
            kernel.install_signal_handlers()   # SIGINT/SIGTERM: G9; a second skips the drain
            root = await kernel.register("root")
            recon = await root.child("recon")
            tool = await recon.spawn(run_nmap(target))       # under recon's lifecycle
            async with await recon.turn(
                lambda: client.chat.completions.create(model=m, messages=msgs, stream=True),
                input=msgs,
            ) as turn:
                async for chunk in turn:                    # chunks the store has (G7)
                    print(chunk.text or "", end="")
            print(turn.outcome)            # completed | cancelled | failed | idle_timeout | detached
            await root.finish()            # recon cancelled, settled, finalized first (G1)

What it guarantees (the numbers are the project's, see its README):

- G1: no session is finalized while a descendant is running or cancelling;
  children are cancelled and finalized before their parent on every path.
- G2: every session is finalized exactly once.
- G4: a turn's stream is closed exactly once (``aclose()``, else ``close()``)
  on end, error, idle timeout, cancel and drop, including a cancel that lands
  while it is being opened, and at the end of its event loop: a turn or
  task still running as ``asyncio.run`` ends (one started while it was
  cancelling the program's tasks among them) is cancelled on the loop
  before it closes, its stream closed there (within the settle timeout).
  A loop closed by hand gets the same, whether ``loop.shutdown_asyncgens()``
  was called before ``loop.close()`` or not: while the kernel's work runs on
  a loop, both are wrapped on the loop object, and ``close()`` on a loop
  with work pending first runs it until that work has ended (bounded as
  above; the program's other tasks step meanwhile). Only a loop whose
  methods cannot be set on it (a type without an instance ``__dict__``),
  closed without ``shutdown_asyncgens()``, can close nothing more: the
  kernel ends what it left as cancelled and lets go of it, and an HTTP
  stream's connection stays with its client's pool.
- G5: cancelled work (a turn, a spawned coroutine) gets ``settle_timeout``
  seconds to unwind, then it is detached.
- G7: a chunk a turn yields is already stored.
- G9: shutdown (``kernel.shutdown()``, a signal, interpreter exit) starts no
  new work, finalizes idle sessions at once, lets running turns drain, then
  cancels and settles them, and finalizes every session, within
  drain + settle timeout + a flush budget. What a stalled store did not
  commit in time is left for ``settle recover``: ``shutdown()``'s report
  names it, and at interpreter exit one line on stderr says how many.
- G10: a write to a finalized session, or by a task detached at the settle
  deadline, raises ``settle.SessionClosed``. For a detached task every
  call that changes a session is a write: starting a turn, a task or a
  child, and ``finish``, ``cancel``, ``close``, ``hold`` and ``release``.

Per turn, ``session.turn(..., idle_timeout=, first_event_timeout=)`` sets
its own timeouts; ``kernel.register(..., budget=settle.Budget(turns=,
tokens=, wall_time=))`` (or ``session.child``) bounds a subtree, which is
wound down ``budget_exhausted`` when it is spent. The kernel's reclaimers of
idle sessions (``idle_ttl``, ``lru_cap``) are off unless ``Kernel.open``
is given them; ``session.hold()`` keeps a session they would take.

A turn that ended gives its reply put together: ``turn.tool_calls()`` the
model's tool calls, each assembled from its streamed pieces by index
(``{"id", "name", "arguments"}``), and ``turn.reply()`` the text, reasoning,
tool calls and usage, and ``message``: the reply as the assistant message
to put in the next turn's ``input=``. A message's ``content`` may be a list
of parts (text, images), kept and sent as given. ``await kernel.resume(id,
name)`` continues a finalized session in a new one (its row's ``resumed_from``): the
``settle.Resumed`` it gives has the new ``session``, the ``history`` so far
(message dicts) and the ``pending_tool_calls`` of its last reply; run those
and send ``history`` with their results as the next turn's ``input=``.

Errors are exceptions under ``settle.Error``. A forked child that uses its
parent's kernel gets ``settle.Error`` (open a new kernel in the child).

The kernel's log lines go to ``logging``'s logger ``settle``: warnings and
errors by default (a store that blipped and the writes tried again, logged
in runs rather than one a session; a work detached at the settle deadline;
sessions left for recovery), or what the ``SETTLE_LOG`` variable asks (an
env-filter, as for the ``settle`` command). The kernel never waits for the
interpreter to log: its lines are queued for a thread of the package's own,
and one that does not fit is dropped and counted.
"""

from __future__ import annotations

import atexit as _atexit
import logging as _logging
import os as _os
import threading as _threading
from typing import Tuple as _Tuple

from settle._settle import (
    BUILD_PROFILE,
    DEFAULT_IDLE_TIMEOUT,
    AlreadyFinalized,
    BadInput,
    Budget,
    BudgetExhausted,
    Cancelled,
    Chunk,
    Detached,
    Error,
    Kernel,
    Resumed,
    Session,
    SessionClosed,
    SessionClosing,
    ShuttingDown,
    StoreError,
    Task,
    Turn,
    TurnRunning,
    _next_log_line,
    shutdown_all as _shutdown_all,
)

__all__ = [
    "BUILD_PROFILE",
    "DEFAULT_IDLE_TIMEOUT",
    "AlreadyFinalized",
    "BadInput",
    "Budget",
    "BudgetExhausted",
    "Cancelled",
    "Chunk",
    "Detached",
    "Error",
    "Kernel",
    "Resumed",
    "Session",
    "SessionClosed",
    "SessionClosing",
    "ShuttingDown",
    "StoreError",
    "Task",
    "Turn",
    "TurnRunning",
]

#: Where the kernel's log lines go: warnings and errors by default (a store
#: that blipped and the writes tried again, a work detached at the settle
#: deadline, sessions left for recovery), or what ``SETTLE_LOG`` asks.
_log = _logging.getLogger("settle")


def _forward(line: _Tuple[int, str, str]) -> None:
    level, module, text = line
    _log.log(level, "%s", text, extra={"settle_module": module})


def _forward_log_lines() -> None:
    """The package's thread: hands the kernel's log lines to ``logging`` as
    they come. The kernel's threads never wait for the interpreter to log:
    they queue each line, and this thread waits for them with the GIL
    released (a line that does not fit the queue is dropped and counted,
    and the count is logged)."""
    while True:
        line = _next_log_line(1.0)
        if line is not None:
            _forward(line)


def _start_forwarding() -> None:
    _threading.Thread(target=_forward_log_lines, name="settle-log", daemon=True).start()


def _forward_the_last_lines() -> None:
    """At exit, after the kernels' shutdown: the lines it made that the
    thread has not handed on yet."""
    while True:
        line = _next_log_line(0.0)
        if line is None:
            return
        _forward(line)


_start_forwarding()
# A forked child has no thread but the one that forked: it starts its own.
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_start_forwarding)

# Interpreter exit shuts down every kernel still open (G9), each within its
# own bound (drain + settle timeout + flush budget), and says on stderr how
# many sessions any of them left for `settle recover`; then the log lines
# that shutdown made are handed to ``logging`` (exit handlers run last
# registered first).
_atexit.register(_forward_the_last_lines)
_atexit.register(_shutdown_all)
