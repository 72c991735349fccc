"""The Python half of the bridge: what runs on the caller's event loop.

The Rust half (``settle._settle``) calls these on the loop's own thread,
from the drain of the loop's mailbox: what the kernel has for a loop is
queued there and run in batches, with one ``call_soon_threadsafe`` per
batch (see ``deliver.rs``), never one per result.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import sys
import types
import weakref
from typing import Any, Callable, Optional

_log = logging.getLogger("settle")

_AsyncGenerator = types.AsyncGeneratorType

#: The control of the settle task the current asyncio task runs, if any: a
#: detached task's writes are refused through it (G10).
CURRENT_TASK: contextvars.ContextVar[Optional[Any]] = contextvars.ContextVar(
    "settle_current_task", default=None
)


# --- turns --------------------------------------------------------------

#: What the kernel's cancel of a turn's pump says (its message): a cancel
#: that does not is another's, the loop's as it closes.
KERNEL_CLOSE = "settle: the kernel closes the turn's stream"


#: What the cancel of a pump or a settle task by its loop's end says (see
#: ``_OnLoop``): another's than the kernel's, so a pump bounds its close.
LOOP_END = "settle: the event loop is ending"


def start_pump(
    loop: asyncio.AbstractEventLoop,
    source: Any,
    to_chunk: Any,
    sink: Any,
    context: contextvars.Context,
) -> None:
    """Starts a turn's pump on ``loop``, from its thread, in ``context``: the
    copy of its caller's taken by ``turn()``."""
    # The pump attaches its task itself, in its first step: a task
    # cancelled before that would run neither its body nor its `finally`
    # (which closes the stream). A close asked for before the attach is
    # seen by the pump, first thing.
    on = _on(loop)
    pump = _pump(source, to_chunk, sink, on)
    on.pending[_create_task(loop, pump, context)] = sink.close_bound()


async def _pump(source: Any, to_chunk: Any, sink: Any, on: "_OnLoop") -> None:
    # The caller's context may be a settle task's: the pump is not that
    # task, and its source's writes are not refused as that task's (G10).
    CURRENT_TASK.set(None)
    me = asyncio.current_task()
    stream = None
    iterator = None
    # Cancelled by another than the kernel (the loop is closing): its
    # cancel does not say it is the kernel's.
    theirs = False
    try:
        if sink.attach(me):
            # The turn was cancelled while its stream was being opened.
            await _close_source(source)
            sink.cancelled()
            return
        if on.ending:
            # Started as its loop ends (after `shutdown_asyncgens()`):
            # nothing opened now would be closed on it.
            await _close_source(source)
            sink.fail(LOOP_ENDED)
            return
        # A callable makes the stream: a class of async iterators too
        # (its `__aiter__` is its instances', not its own).
        makes = callable(source) and (isinstance(source, type) or not hasattr(source, "__aiter__"))
        made = source() if makes else source
        if inspect.isawaitable(made):
            made = await made
        if not hasattr(made, "__aiter__"):
            raise TypeError(
                f"the turn's source gave {type(made).__name__}, which is not an async iterable"
            )
        stream = made
        iterator = stream.__aiter__()
        # What the pump iterates, should the kernel detach it (see `let_go`).
        if me is not None:
            _ITERATED[me] = iterator
        sink.opened()
        while True:
            try:
                item = await iterator.__anext__()
            except StopAsyncIteration:
                break
            if to_chunk is not None:
                item = to_chunk(item)
            go = sink.push(item)
            if go is not True:
                if go is False:
                    # The turn is over (ended, cancelled, or detached): stop here.
                    return
                # Enough chunks wait for the kernel (its reader is slow):
                # the stream is not pulled until the kernel took half.
                room = asyncio.get_running_loop().create_future()
                if sink.wait_for_room(room):
                    await room
        sink.end()
    except asyncio.CancelledError as error:
        sink.cancelled()
        # Even with the turn's close asked for, the cancel that landed may
        # be another's (a dropped turn's, met by the loop's as it closes,
        # before the kernel's reached the pump).
        theirs = error.args[:1] != (KERNEL_CLOSE,)
        if not sink.close_requested():
            raise  # someone else's cancel (the loop is closing): theirs to see
        # The kernel's own close: the pump has done its job, and it ends
        # without keeping the CancelledError (and the traceback and frames
        # it holds) alive on its task until the collector finds them.
    except Exception as error:  # the source's own failure ends the turn, saying why
        sink.fail(_said(error))
    except (KeyboardInterrupt, SystemExit) as error:
        # The program's own stop: the turn fails saying so, and it goes on
        # up (asyncio takes these out of the loop).
        sink.fail(_said(error))
        raise
    except BaseException as error:
        # Neither an error nor a stop (a `GeneratorExit` a source raised, a
        # framework's own kind): the turn fails saying so. Raised again, it
        # would only sit on this task, which nobody awaits, and asyncio
        # would log it as never retrieved.
        sink.fail(_said(error))
    finally:
        try:
            # Not in a step of its task: the pump is being collected, its
            # loop closed under it (see `loop_closed`). Nothing can be
            # awaited there: its stream goes with it, to the collector.
            if stream is not None and _stepping(me):
                # The kernel's close, from now on, waits for this one
                # instead of cancelling it half way (G4: closed once, to
                # its end).
                sink.closing()
                if theirs or _cancelled_twice():
                    await _close_within(stream, iterator, sink.close_bound())
                else:
                    await close_stream(stream, iterator)
        finally:
            sink.closed()
            on.left(me)


#: What a turn started as its loop ends fails with.
LOOP_ENDED = (
    "the turn's event loop was ending (its shutdown_asyncgens() had run): its stream was not opened"
)


def _stepping(task: Any) -> bool:
    """Whether ``task`` is the task running now: not so for a coroutine
    being closed by the collector (then no loop runs, or another task)."""
    try:
        return asyncio.current_task() is task
    except RuntimeError:  # no running loop
        return False


def _cancelled_twice() -> bool:
    """Whether the running task was asked to cancel more than once (not
    counted before Python 3.11: then taken as so). The kernel's close of a
    pump and another's cancel (``asyncio.run`` cancelling every task left
    as it ends) land as one ``CancelledError``: the second is spent, and
    nothing would interrupt the close that follows."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 1


async def _close_within(stream: Any, iterator: Any, bound: float) -> None:
    """The close of a stream whose pump another than the kernel cancelled
    (its loop is closing): awaited at most ``bound`` seconds, the kernel's
    settle timeout (G5), then cancelled and left, so that an ``aclose()``
    that never returns (a dead connection) does not keep the loop from
    closing and the program from ending (G9). A cancel of the pump while
    it waits cancels the close with it."""
    closing = asyncio.ensure_future(close_stream(stream, iterator))
    try:
        done, _ = await asyncio.wait({closing}, timeout=bound)
    except asyncio.CancelledError:
        closing.cancel()
        raise
    if not done:
        closing.cancel()
        _log.warning(
            "a turn's stream did not close within %.1f s (the settle timeout) of its "
            "loop's end; its close was left",
            bound,
        )


def _said(error: BaseException) -> str:
    """What a source's failure says: its type and its message; its type
    alone when its ``__str__`` fails (a library's exception reading an
    attribute it never set, or raising ``CancelledError`` there), and
    neither when its class will not give its name, so that the turn still
    ends saying why: nothing raised while describing it escapes."""
    try:
        name = str(type(error).__name__)
    except BaseException:
        name = "an exception whose class gives no name"
    try:
        text = str(error)
    except BaseException:
        return f"{name} (its message could not be read: its __str__ raised)"
    return f"{name}: {text}"


#: The calls a task waits on, until they are done: each keeps its waiting
#: task alive (see ``Call.add_done_callback``).
_AWAITED: "set[asyncio.Future[Any]]" = set()


class Call(asyncio.Future):  # type: ignore[type-arg]
    """What every kernel call returns: an ``asyncio.Future`` that is also a
    coroutine in the sense ``asyncio`` checks (``send``, ``throw`` and
    ``close``, as ``collections.abc.Coroutine`` asks), so that
    ``asyncio.create_task(session.finish())`` and ``TaskGroup.create_task``
    take it as they take the coroutines of other libraries. Awaited by a
    task made that way, it is that task's future: cancelling the task
    cancels the call, as cancelling a task awaiting it does."""

    __slots__ = ()

    # The steps are those of ``Future.__await__``, kept in no iterator of
    # their own: one call may be the coroutine of several tasks, or of a
    # second one after the first has ended, as a future may be awaited by
    # several.
    def send(self, value: Any) -> Any:
        """A step of a task that runs this as its coroutine: this future,
        for the task to wait on, until it is done; then its result."""
        if not self.done():
            self._asyncio_future_blocking = True
            return self
        raise StopIteration(self.result())

    def throw(self, error: Any, *rest: Any) -> Any:
        """A task's cancel (or another exception) thrown into its step. A
        task cancelled before its first step throws its cancel here rather
        than cancelling this future: the call is cancelled all the same."""
        self.cancel()
        if isinstance(error, type):
            value = rest[0] if rest else None
            error = value if isinstance(value, error) else error() if value is None else error(value)
        raise error

    def close(self) -> None:
        """Nothing to close: the call is the kernel's, cancelled by ``cancel()``."""

    def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
        """As ``Future.add_done_callback``; a task that waits on this call
        (its wakeup is what it adds) is kept alive with the call until the
        call is done, as the loop keeps a task waiting on a timer or a
        socket. The kernel holds its calls weakly, so that a call nobody
        awaits is collected and cancels its work; without this, a task
        nobody kept a reference to (``asyncio.create_task(agent())``) was
        collected with the call it waited on, mid-turn."""
        if not self.done() and isinstance(getattr(fn, "__self__", None), asyncio.Task):
            # Let go of by the kernel's half once done (or never to be).
            _AWAITED.add(self)
        super().add_done_callback(fn, context=context)


class CancelsAtOnce(Call):
    """The future a read of a turn's next chunk, or a turn's start, makes its
    task wait on: its ``cancel()``, which is what cancelling that task
    calls, cancels the turn before it returns (``_on_cancel(future)``, set by
    the Rust half as it makes the future). A plain future runs its done
    callbacks at the loop's next pass, so a caller that cancels its reader
    and starts the session's next turn in the same step would have the
    kernel see that start first, while the turn before still runs, and be
    refused.

    The turn is cancelled also when the future is already done: its task
    has not resumed yet, so it never has the chunk, or the turn the start
    made (a read of a waiting chunk waits on a future that is done from the
    start: it passes the loop once)."""

    __slots__ = ("_on_cancel",)
    _on_cancel: Optional[Callable[["CancelsAtOnce"], None]]

    def cancel(self, msg: Any = None) -> bool:
        on_cancel, self._on_cancel = self._on_cancel, None
        if on_cancel is not None:
            on_cancel(self)
        return super().cancel(msg)


class Next:
    """A turn's next chunk, as ``Turn.__anext__`` gives it: the bridged
    future, and ``gather``, which notes the chunk in the turn's reply once
    the awaiting task has it, in that task's own step. A chunk whose task
    was cancelled after the future got it but before the task resumed is
    never seen, and so no part of ``turn.reply()``.

    Also a coroutine in the sense ``asyncio`` checks (``send``, ``throw``
    and ``close``, as ``collections.abc.Coroutine`` asks), as the
    ``__anext__`` of ``openai``'s and ``aiohttp``'s streams give one:
    ``asyncio.create_task(turn.__anext__())`` (or ``anext(turn)``) runs it
    as its coroutine. ``await`` takes ``__await__``, as before."""

    __slots__ = ("_future", "_gather")

    def __init__(self, future: "asyncio.Future[Any]", gather: Any) -> None:
        self._future = future
        self._gather = gather

    def __await__(self) -> Any:
        chunk = yield from self._future.__await__()
        gather, self._gather = self._gather, None
        if gather is not None:
            gather(chunk)
        return chunk

    def send(self, value: Any) -> Any:
        """A step of a task that runs this read as its coroutine: the
        future, for the task to wait on, until it is done; then the chunk
        (noted in the reply, as ``__await__`` notes it), or what the read
        raised (``StopAsyncIteration`` at the turn's end)."""
        future = self._future
        if not future.done():
            future._asyncio_future_blocking = True
            return future
        chunk = future.result()
        gather, self._gather = self._gather, None
        if gather is not None:
            gather(chunk)
        raise StopIteration(chunk)

    def throw(self, error: Any, *rest: Any) -> Any:
        """A cancel (or another exception) thrown into the read by its
        task: the read's future is cancelled, which cancels the turn (as
        cancelling a task awaiting it does), and the exception is raised."""
        self._gather = None
        self._future.cancel()
        if isinstance(error, type):
            value = rest[0] if rest else None
            error = value if isinstance(value, error) else error() if value is None else error(value)
        raise error

    def close(self) -> None:
        """Closed before it gave its chunk: the turn is cancelled, as when
        the read is dropped. Nothing once it has given it."""
        gather, self._gather = self._gather, None
        if gather is not None:
            self._future.cancel()


async def nothing() -> None:
    """Done at its first step, on no loop: what a ``Turn``'s or a
    ``Kernel``'s ``__aexit__`` gives when the coroutine in the block is
    being closed (it can await nothing that suspends)."""


def close_unopened(
    loop: Optional[asyncio.AbstractEventLoop],
    source: Any,
    context: Optional[contextvars.Context] = None,
) -> None:
    """Closes a turn's source that the kernel never opened (the turn was
    cancelled first), from ``loop``'s thread; ``loop`` is ``None`` when it
    is closed. A coroutine is closed unawaited at once (nothing to await),
    a stream on ``loop`` (``aclose()`` is awaited), if it still runs, in
    ``context`` (the copy of the caller's taken by ``turn()``; without one,
    in a copy of the current context: the caller's, at its call)."""
    if inspect.iscoroutine(source):
        source.close()
    elif loop is not None:
        # Waited for by the loop's end (not cancelled: a close is let run).
        on = _on(loop)
        closing = _close_unopened(source, on)
        if context is None:
            on.pending[loop.create_task(closing)] = None
            return
        # Not the caller's settle task, as for a pump (G10).
        context.run(CURRENT_TASK.set, None)
        on.pending[_create_task(loop, closing, context)] = None


async def _close_unopened(source: Any, on: "_OnLoop") -> None:
    me = asyncio.current_task()
    try:
        await _close_source(source)
    finally:
        on.left(me)


async def _close_source(source: Any) -> None:
    """A source given as a stream is closed; a coroutine is closed unawaited;
    a callable that makes a stream was never called: nothing to close."""
    if inspect.iscoroutine(source):
        source.close()
    elif hasattr(source, "__aiter__") and not isinstance(source, type):
        await close_stream(source)


async def close_stream(stream: Any, iterator: Any = None) -> None:
    """Closes a turn's stream once, best effort: ``aclose()``, else ``close()``
    (awaited when it returns an awaitable); errors are logged, never raised."""
    if type(stream) is _AsyncGenerator:
        # The common case (an async generator) without the look-ups.
        try:
            await stream.aclose()
        except Exception as error:  # close is best effort (G4)
            _log.warning("closing a turn's stream failed: %s", error)
        return
    closer = getattr(stream, "aclose", None) or getattr(stream, "close", None)
    if closer is None and iterator is not None and iterator is not stream:
        closer = getattr(iterator, "aclose", None)
    if closer is None:
        return
    try:
        closing = closer()
        if inspect.isawaitable(closing):
            await closing
    except Exception as error:  # close is best effort (G4)
        _log.warning("closing a turn's stream failed: %s", error)


#: The async iterator each turn's pump task iterates, while it runs.
_ITERATED: "weakref.WeakKeyDictionary[asyncio.Task[Any], Any]" = weakref.WeakKeyDictionary()


def let_go(task: "asyncio.Task[Any]") -> None:
    """The kernel detached this settle task, or turn's pump, at the settle
    deadline (G5): it ignores its cancel. The loop stops counting it among
    its tasks, so that ``asyncio.run``, which at its end cancels every task
    left and waits for each, does not wait forever for this one (left as it
    is when the loop closes: its ``finally`` does not run). A pump's async
    generator is let go of the same way, so that the loop's end does not
    try to close it mid-step (asyncio would log that it "is already
    running"). On a Python whose loop cannot let go of a task (its
    registry has no ``_unregister_task``), nothing changes."""
    if task.done():
        return
    unregister = getattr(asyncio.tasks, "_unregister_task", None)
    if unregister is None:
        return
    unregister(task)
    iterated = _ITERATED.pop(task, None)
    generators = getattr(task.get_loop(), "_asyncgens", None)
    if isinstance(iterated, _AsyncGenerator) and generators is not None:
        generators.discard(iterated)


# --- tasks --------------------------------------------------------------


def start_task(
    loop: asyncio.AbstractEventLoop,
    coroutine: Any,
    control: Any,
    bound: float,
    context: contextvars.Context,
) -> None:
    """Starts a settle task's coroutine on ``loop``, from its thread, in
    ``context``: the copy of its caller's taken by ``spawn()``. ``bound`` is
    the kernel's settle timeout, what the loop's end gives it to unwind."""
    # As for a pump: the task attaches itself in its first step.
    on = _on(loop)
    on.pending[_create_task(loop, _run_task(coroutine, control, on), context)] = bound


#: Whether ``loop.create_task`` takes the context its task runs in (Python
#: 3.11 and after).
_CREATE_TASK_TAKES_CONTEXT = sys.version_info >= (3, 11)


def _create_task(
    loop: asyncio.AbstractEventLoop, coroutine: Any, context: contextvars.Context
) -> "asyncio.Task[Any]":
    """A task of ``coroutine`` on ``loop`` that runs in ``context``, as one
    made by its caller's own ``create_task`` runs in a copy of the caller's
    (request ids, tracing spans): these are made from the drain of the
    loop's mailbox, whose context is nobody's."""
    if _CREATE_TASK_TAKES_CONTEXT:
        return loop.create_task(coroutine, context=context)
    # A task made within `context` runs in a copy of it.
    return context.run(loop.create_task, coroutine)


#: What the cancel of a settle task whose coroutine was closed under it
#: says (see ``_OnLoop.watch``).
CLOSED_UNDER = "settle: the task's coroutine was closed while it ran"

#: What such a task's awaiters get: the ``GeneratorExit`` its close ended
#: the coroutine with (as for a coroutine that ends with one).
CLOSED_WORDS = "the task's coroutine was closed (its close() was called) while it ran"


async def _run_task(coroutine: Any, control: Any, on: "_OnLoop") -> None:
    me = asyncio.current_task()
    CURRENT_TASK.set(control)
    try:
        if control.attach(me) or on.ending:
            # Cancelled before it ran, or started as its loop ends.
            coroutine.close()
            control.cancelled()
            return
        if me is not None and inspect.iscoroutine(coroutine):
            on.watch(me, coroutine)
        try:
            result = await coroutine
        except asyncio.CancelledError as error:
            if error.args[:1] == (CLOSED_UNDER,) and _closed(coroutine):
                # Its coroutine was closed under it: it ended with the
                # close's `GeneratorExit`, and the cancel that woke this
                # task from the future nobody completes is spent.
                control.failed(GeneratorExit(CLOSED_WORDS))
                return
            control.cancelled()
            raise
        except BaseException as error:  # reported to whoever joins the task
            if isinstance(error, GeneratorExit) and not _stepping(me):
                # Not the coroutine's end: this one is being closed by the
                # collector, its loop closed under it (see `loop_closed`).
                control.cancelled()
                raise
            if _sent_to_closed(error, coroutine):
                # Closed under it, and woken before the loop noticed: the
                # same end as when it noticed.
                error = GeneratorExit(CLOSED_WORDS)
            control.failed(error)
            # The program's own stop goes on up (asyncio takes these out
            # of the loop). Anything else (a `GeneratorExit` the coroutine
            # ended with, a framework's own kind) raised again would only
            # sit on this task, which nobody awaits, and asyncio would log
            # it, words and all, as never retrieved: the settle task's
            # awaiters get it.
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
        else:
            control.finished(result)
    finally:
        on.left(me)


def _closed(coroutine: Any) -> bool:
    """Whether ``coroutine`` has ended (returned, raised, or was closed):
    what ``inspect.getcoroutinestate`` calls ``CORO_CLOSED``, read
    directly (the loop asks it of every running settle task twice a
    second)."""
    return coroutine.cr_frame is None


def _sent_to_closed(error: BaseException, coroutine: Any) -> bool:
    """Whether ``error`` is what resuming ``coroutine`` after it was closed
    raises ("cannot reuse already awaited coroutine"): a ``RuntimeError``
    raised at the ``await`` itself (its traceback has no frame of the
    coroutine's), not one the coroutine raised."""
    trace = error.__traceback__
    return (
        type(error) is RuntimeError
        and trace is not None
        and trace.tb_next is None
        and inspect.iscoroutine(coroutine)
        and _closed(coroutine)
    )


# --- the loop's end -----------------------------------------------------

#: How often a loop running settle tasks looks for a coroutine closed
#: under its task (see ``_OnLoop.watch``).
_WATCH_EVERY = 0.5

#: How much longer than a pump's close bound (the settle timeout) the
#: loop's end waits for it: the steps it runs once its close is done or
#: given up.
_END_MARGIN = 0.25


class _OnLoop:
    """The pumps and settle tasks still running on one event loop, and
    what ends them before it closes.

    ``asyncio.run`` (and ``asyncio.Runner``) ends its loop in three steps:
    it cancels the tasks it finds and waits for them, then it closes the
    async generators first iterated on the loop
    (``loop.shutdown_asyncgens()``), then it closes the loop. A pump
    started after the first step took its list (a task's cleanup starting
    a turn, a start in flight) was never cancelled, and the loop closed
    under it with its stream open. So each loop running work of the
    kernel's has an async generator of its own among those the loop closes
    (``_at_loop_end``): its close cancels what is still pending here and
    waits for it (bounded by the settle timeout and a margin), each stream
    closed on the loop, once (G4); what starts on the loop after that
    closes its source without opening it. A program that closes its loop
    by hand gets the same by calling ``shutdown_asyncgens()`` first, as
    asyncio asks.

    ``shutdown_asyncgens()`` closes every generator it has at once, and a
    stream's own generators (the ``openai`` stream's, ``httpx``'s) are
    among them: closed while a pump or a tool was still inside a step of
    them, each would fail ("asynchronous generator is already running",
    logged by the loop) and be left to its reader's cancel. So while work
    runs here, the loop's ``shutdown_asyncgens`` is wrapped, on the loop
    object itself (``_ahead_of_the_loop``): the end runs first, and the
    loop closes its generators once nothing of the kernel's is inside one.

    A loop closed without ``shutdown_asyncgens()`` (``loop.close()`` after
    ``run_until_complete``, as some frameworks do) could run nothing more:
    its pumps' streams would never be closed (an HTTP client's pool kept
    the connection of a response never closed, its socket open, until the
    process exited). So its ``close`` is wrapped too: with work pending
    here and the loop not running, the end runs on it first (the loop run
    until it is done: at most the settle timeout and a margin, the
    program's other tasks stepping meanwhile), then it closes.

    A loop whose methods cannot be set on it (a type without an instance
    ``__dict__``) has the generator alone; closed without
    ``shutdown_asyncgens()``, what it left pending is ended as cancelled
    by the kernel once it finds the loop closed (``loop_closed``), and
    freed with its streams by the collector, unclosed.

    The generator lives only while work runs here: it is made for the
    first pump or task, and finished at once (nothing to wait for) when
    the last one ends, so nothing of this keeps an idle loop alive."""

    __slots__ = ("pending", "ending", "watched", "_loop", "_end", "_wrapped", "_look", "__weakref__")

    def __init__(self, loop: Any) -> None:
        #: Each task still running, with how long its end may take once
        #: cancelled (the settle timeout); `None` for a close of a source,
        #: which is let run, never cancelled.
        self.pending: "dict[asyncio.Task[Any], Optional[float]]" = {}
        self.ending = False
        #: Each settle task's coroutine, while it runs (see `watch`).
        self.watched: "dict[asyncio.Task[Any], Any]" = {}
        self._look: Optional[asyncio.TimerHandle] = None
        self._loop = weakref.ref(loop)
        self._end: Any = _at_loop_end(self)
        # Its first step, here on the running loop: the loop's hook notes
        # it among the generators it closes as it ends.
        try:
            self._end.asend(None).send(None)
        except StopIteration:
            pass
        self._wrapped = _ahead_of_the_loop(loop, self)

    def watch(self, task: Any, coroutine: Any) -> None:
        """Watches the coroutine a settle task runs, from the task's first
        step: closed under it (``coroutine.close()`` called while the task
        waits in one of its ``await``), the coroutine has ended, but its
        task still waits for the future the coroutine waited on, which
        nobody may ever complete (``asyncio.sleep`` cancels its timer as it
        is closed), and would never end nor be recorded as ended. Nothing
        tells of a close: the loop looks every ``_WATCH_EVERY`` seconds,
        while settle tasks run on it, and cancels the task of such a
        coroutine (``CLOSED_UNDER``), which then ends ``failed`` with the
        close's ``GeneratorExit``."""
        self.watched[task] = coroutine
        if self._look is None:
            self._look = asyncio.get_running_loop().call_later(_WATCH_EVERY, self._closed_under)

    def _closed_under(self) -> None:
        self._look = None
        for task, coroutine in list(self.watched.items()):
            # Its task resumes in the step its coroutine ends in: ended and
            # still waiting, it was closed from outside.
            if not task.done() and _closed(coroutine):
                task.cancel(CLOSED_UNDER)
        if self.watched and not self.ending:
            self._look = asyncio.get_running_loop().call_later(_WATCH_EVERY, self._closed_under)

    def _stop_watching(self) -> None:
        self.watched.clear()
        look, self._look = self._look, None
        if look is not None:
            look.cancel()

    def left(self, task: Any) -> None:
        """``task`` ended: forgotten; once none is left, the loop is let go of."""
        self.pending.pop(task, None)
        self.watched.pop(task, None)
        if self.pending or self.ending:
            return
        loop = self._loop()
        if loop is not None and _ON_LOOP.get(loop) is self:
            del _ON_LOOP[loop]
        self.retire()

    def retire(self) -> None:
        """Finishes the generator at once, and gives the loop its own
        ``shutdown_asyncgens`` and ``close`` back: nothing pending, nothing
        to wait for."""
        self._stop_watching()
        wrapped, self._wrapped = self._wrapped, None
        loop = self._loop()
        if wrapped is not None and loop is not None:
            _unwrap(loop, wrapped)
        end, self._end = self._end, None
        if end is None:
            return
        try:
            end.aclose().send(None)
        except (StopIteration, RuntimeError):
            pass

    def running(self) -> bool:
        """Whether its loop is the one running now (not so when the
        collector finishes the generator)."""
        try:
            return asyncio.get_running_loop() is self._loop()
        except RuntimeError:  # no running loop
            return False

    async def end(self) -> None:
        """The loop ends: what runs here is cancelled, as ``asyncio.run``
        cancels the tasks it knows of, and waited for, bounded. Then what
        starts on the loop closes its source unopened (``ending`` stays
        set), and nothing here holds the loop any more."""
        self.ending = True
        self._stop_watching()
        loop = asyncio.get_running_loop()
        bounds = [bound for bound in self.pending.values() if bound is not None]
        deadline = loop.time() + max(bounds, default=0.0) + _END_MARGIN
        for task, bound in list(self.pending.items()):
            # One that has not run its first step yet is left to it: it
            # sees `ending` there (cancelled now, it would run neither its
            # body nor its `finally`).
            if bound is not None and not _created(task):
                task.cancel(LOOP_END)
        while self.pending:
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(list(self.pending), timeout=left)
        # Past the bound (a coroutine that ignores its cancel): the loop
        # closes under it, as under any task left pending; the kernel
        # detaches it at the settle deadline.
        for task in self.pending:
            _quiet(task)
        self.pending.clear()


#: The work running on each loop (see ``_OnLoop``).
_ON_LOOP: "weakref.WeakKeyDictionary[Any, _OnLoop]" = weakref.WeakKeyDictionary()


def _on(loop: Any) -> _OnLoop:
    """The work of ``loop``, made for its first task (from its thread, as it runs)."""
    on = _ON_LOOP.get(loop)
    if on is None:
        on = _ON_LOOP[loop] = _OnLoop(loop)
    return on


async def _at_loop_end(on: _OnLoop) -> Any:
    """The generator ``loop.shutdown_asyncgens()`` closes as the loop ends
    (see ``_OnLoop``)."""
    try:
        yield
    finally:
        # Nothing pending: finished by `retire`, or by the wrapped
        # `shutdown_asyncgens` once the end ran. Not on its loop: finished
        # by the collector, when no loop could run the end.
        if on.pending and on.running():
            await on.end()
            # This generator holds the loop through its finalizer: let go
            # of, so the loop is collected once the program lets go of it.
            on._end = None


def _ahead_of_the_loop(loop: Any, on: _OnLoop) -> "Optional[dict[str, Any]]":
    """Wraps ``loop.shutdown_asyncgens`` and ``loop.close`` (on the loop
    object, not its type) so that ``on``'s end runs before the loop closes
    any async generator, or closes (see ``_OnLoop``); gives the wrappers by
    name, or ``None`` when the loop's methods cannot be set on it. They
    hold neither the loop nor ``on`` (weak references): they keep nothing
    alive. Each gives the loop its own methods back once it ran."""
    own = weakref.ref(loop)
    work = weakref.ref(on)
    wrappers: "dict[str, Any]" = {}

    async def shutdown_asyncgens() -> None:
        loop = own()
        if loop is None:  # the loop this runs on: not collected
            return
        on = work()
        if on is not None:
            if on.pending and on.running():
                await on.end()
            # Nothing of the kernel's runs here now: the end's generator is
            # finished at once, the loop given its own methods back.
            on.retire()
        _unwrap(loop, wrappers)
        await loop.shutdown_asyncgens()

    def close() -> None:
        loop = own()
        if loop is None:  # the loop this is called on: not collected
            return
        on = work()
        if on is not None:
            if on.pending and not loop.is_running() and not loop.is_closed():
                # Closed without `shutdown_asyncgens()`: nothing could run
                # on it after, so its work ends on it now, as that would
                # have ended it (its streams closed there, once each).
                try:
                    loop.run_until_complete(on.end())
                except RuntimeError as error:  # another loop runs in this thread
                    _log.warning(
                        "the kernel's work on a closing event loop could not be ended on it (%s): "
                        "the kernel ends it as cancelled once it finds the loop closed",
                        error,
                    )
            on.retire()
        _unwrap(loop, wrappers)
        loop.close()

    wrappers["shutdown_asyncgens"] = shutdown_asyncgens
    wrappers["close"] = close
    try:
        for name, wrapper in wrappers.items():
            setattr(loop, name, wrapper)
    except AttributeError:  # a loop type whose instances have no `__dict__`
        return None
    return wrappers


def _unwrap(loop: Any, wrappers: "dict[str, Any]") -> None:
    """Gives ``loop`` its own methods back, each that is still the wrapper
    set on it (a program may have set its own since)."""
    attributes = getattr(loop, "__dict__", None)
    if attributes is None:
        return
    for name, wrapper in wrappers.items():
        if attributes.get(name) is wrapper:
            del attributes[name]


def _created(task: Any) -> bool:
    """Whether ``task`` has not run its first step yet."""
    coroutine = task.get_coro()
    return inspect.iscoroutine(coroutine) and (
        inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED
    )


def _quiet(task: Any) -> None:
    """``task`` is left pending on a loop that closes: asyncio would log
    that it "was destroyed but it is pending" when it is collected. The
    kernel has ended it already (cancelled, or detached)."""
    try:
        task._log_destroy_pending = False
    except AttributeError:  # another loop's task type: it may say so
        pass


def loop_closed(loop: Any) -> None:
    """The kernel found ``loop`` closed (see ``Mailbox::close``): what was
    still pending on it never runs again. It is let go of without a word
    (the kernel ends each as cancelled), and collected with what it holds:
    a stream that cannot be closed on a closed loop is freed."""
    on = _ON_LOOP.pop(loop, None)
    if on is None:
        return
    for task in on.pending:
        _quiet(task)
    on.pending.clear()
    on.retire()


# The shutdown signals' handler of each loop that has one (see the Rust
# module `signals`): a second kernel installing them joins it.
SIGNAL_HANDLERS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = (
    weakref.WeakKeyDictionary()
)


def default_action(loop: asyncio.AbstractEventLoop, number: int) -> None:
    """Gives signal ``number`` its default action back and takes it: the
    kernel it was for has stopped (a signal after the shutdown ends the
    program, as it would without handlers)."""
    loop.remove_signal_handler(number)
    os.kill(os.getpid(), number)
