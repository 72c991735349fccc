"""Types of the native module of ``settle`` (see the package's docstring)."""

from __future__ import annotations

import asyncio
import os
from types import GenericAlias
from typing import (
    Any,
    Awaitable,
    Callable,
    Coroutine,
    Dict,
    Generator,
    Generic,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from typing_extensions import TypedDict, final

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
    "shutdown_all",
]

_T = TypeVar("_T")

class _Call(asyncio.Future[_T], Coroutine[Any, Any, _T]):
    """What every kernel call returns (``settle._bridge.Call``): an
    ``asyncio.Future`` that ``asyncio.create_task`` and
    ``TaskGroup.create_task`` also take as a coroutine. Being a coroutine
    too, it is refused by ``asyncio.wait`` (which refuses every coroutine):
    give ``wait`` the task ``create_task`` makes of it; ``gather``,
    ``wait_for`` and ``as_completed`` take it as it is."""

    def send(self, value: Any) -> Any:
        """A step of a task that runs the call as its coroutine."""
    def throw(self, *error: Any) -> Any:  # type: ignore[override, unused-ignore]
        """A cancel (or another exception) thrown into the call: it cancels the call and raises it."""
    def close(self) -> None:
        """Nothing to close: the call is cancelled by ``cancel()``."""

BUILD_PROFILE: str
"""How the native module was compiled: ``"release"`` (what ``pip install``
builds) or ``"debug"`` (what the workspace's test harness installs). The
benchmark scripts refuse a debug build."""
DEFAULT_IDLE_TIMEOUT: float
"""A turn's idle timeout in seconds unless the kernel or the turn sets one (the runtime's: 30)."""

class Error(Exception):
    """Every error of ``settle``; a forked child using its parent's kernel gets this one."""

class SessionClosed(Error):
    """G10: the session is finalized, or the writing task was detached."""

class SessionClosing(SessionClosed):
    """G1, G10: the session is winding down (its parent finished, it is
    being closed, cancelled or its budget is spent): it admits no new turn,
    task or child, and is finalized once its work settles."""

class AlreadyFinalized(Error):
    """G2: the session was already finalized; nothing changed."""

class ShuttingDown(Error):
    """G9: the kernel is shutting down or has stopped."""

class StoreError(Error):
    """The session store failed or did not answer in time."""

class BadInput(Error):
    """An argument was refused before anything was written: an unknown
    session, a request over a size limit, a number out of its range (a
    negative id), a string that is not UTF-8 (a lone surrogate), a chunk
    that cannot be read."""

class Detached(Error):
    """G5: the task ignored its cancel past the settle timeout and was detached."""

class Cancelled(Error):
    """The task was cancelled and gave no result, or a turn's start was
    stopped by ``Session.cancel_turn()``."""

class TurnRunning(Error):
    """A turn was refused because the session's turn before still runs:
    stop it with ``Session.cancel_turn()``; the next turn then waits for
    its end."""

class BudgetExhausted(Error):
    """The session's budget (its own or an ancestor's) is spent."""

@final
class Budget:
    """What a session and its subtree may spend: turns, tokens, wall time (seconds)."""

    def __new__(
        cls, *, turns: Optional[int] = None, tokens: Optional[int] = None, wall_time: Optional[float] = None
    ) -> Budget:
        """A budget; ``None`` limits nothing. Exceeding it cancels the
        subtree, children first (G1), and finalizes each session
        ``budget_exhausted``; the turn past ``turns`` raises
        ``BudgetExhausted``. ``BadInput`` for a negative number."""
    @property
    def turns(self) -> Optional[int]:
        """The most turns, if limited."""
    @property
    def tokens(self) -> Optional[int]:
        """The most tokens (as the turns' usage reports count them), if limited."""
    @property
    def wall_time(self) -> Optional[float]:
        """The longest wall time in seconds from registration, if limited."""
    def __eq__(self, other: object, /) -> bool:
        """Budgets with the same limits are equal."""

@final
class Chunk:
    """One piece of a turn's output, as the store acknowledged it."""

    def __new__(cls, kind: str, data: Any) -> Chunk:
        """A chunk of ``kind`` (``"text"``, ``"reasoning"``, ``"tool_call"``,
        ``"usage"``, ``"data"``...) carrying ``data`` (a string for text, any
        JSON-like value for the others): what a ``to_chunk`` may return.
        Raises ``BadInput`` for a kind that is not one, text that is not a
        ``str``, or data that cannot be stored."""
    @property
    def kind(self) -> str:
        """What it carries: ``"text"``, ``"reasoning"``, ``"tool_call"``, ``"usage"``, ..."""
    @property
    def text(self) -> Optional[str]:
        """The text of a text chunk; ``None`` for the other kinds."""
    @property
    def data(self) -> Any:
        """The payload: the text of a text chunk, the parsed JSON of the others."""
    def __eq__(self, other: object, /) -> bool:
        """Chunks of the same kind and data are equal."""

class _ToolCall(TypedDict):
    """A tool call the model made, its streamed pieces put together."""

    id: str
    name: str
    arguments: str

class _Reply(TypedDict):
    """A turn's reply: its text and reasoning joined, its tool calls whole, its usage reports and other data, and itself as the assistant message to send back on the next turn."""

    text: str
    reasoning: str
    tool_calls: List[_ToolCall]
    usage: List[Any]
    data: List[Any]
    #: A message dict (``role``, ``content``, ``tool_calls``); typed ``Any``
    #: so that it goes where a model client's message type is expected (the
    #: ``openai`` package's ``ChatCompletionMessageParam``) without a cast.
    message: Any

class _SessionRow(TypedDict):
    """A session as the store has it, the fields of ``settle sessions --json`` (times in seconds since the Unix epoch)."""

    id: int
    name: str
    parent: Optional[int]
    state: str
    outcome: Optional[str]
    end_reason: Optional[str]
    turns: int
    chunks: int
    created_at: float
    finalized_at: Optional[float]
    resumed_from: Optional[int]
    #: Where clients reach the live process that owns it (the address it
    #: advertised); ``None`` once it is finalized or released, or when its
    #: owner advertised nothing or lost its lease.
    owner: Optional[str]

class _TurnError(TypedDict):
    """Why a turn failed."""

    kind: str
    message: str

class _TurnRow(TypedDict):
    """A turn as the store has it, what ``settle show`` prints (times in seconds since the Unix epoch)."""

    no: int
    outcome: Optional[str]
    started_at: float
    ended_at: Optional[float]
    input: Any
    text: str
    error: Optional[_TurnError]
    chunks: List[Chunk]

class _ShutdownReport(TypedDict):
    """What a shutdown did."""

    finalized: Dict[int, str]
    drained: List[int]
    cancelled: List[int]
    detached: List[int]
    left_recoverable: List[int]
    store_failures: int
    lease_lost: bool
    lease_lost_why: Optional[str]

class _RecoveryReport(TypedDict):
    """What a recovery did."""

    recovered: List[int]
    interrupted_turns: List[Tuple[int, int]]
    finalized_elsewhere: List[int]

_ChunkLike = Union[str, Chunk, None, Dict[str, Any], List[Any], Tuple[Any, ...], Any]
_Source = Union[Callable[[], Any], Any]

@final
class Turn:
    """A turn in flight: an async iterator of stored chunks; ``async with`` closes it; then its tool calls and reply.

    Cancelling the task that awaits its next chunk cancels the turn:
    ``asyncio.wait_for(turn.__anext__(), 0.1)`` ends it at its first
    timeout. To wait for chunks with a timeout and go on, read the turn in
    a task of its own and wait for that task: ``reader =
    asyncio.create_task(turn.__anext__())``, then ``asyncio.wait({reader},
    timeout=0.1)``.
    """

    @property
    def no(self) -> int:
        """The turn's number within its session, from 1."""
    @property
    def session_id(self) -> int:
        """The id of the session it belongs to."""
    @property
    def outcome(self) -> Optional[str]:
        """How it ended, once it has: ``"completed"``, ``"cancelled"``,
        ``"failed"``, ``"idle_timeout"``, ``"detached"`` (or
        ``"interrupted"`` when the kernel stopped first); ``None`` while it
        runs, and when a second cancel cut short the wait for its end."""
    @property
    def error(self) -> Optional[Tuple[str, str]]:
        """Why it failed or timed out, as ``(kind, message)``; ``None`` otherwise."""
    def tool_calls(self) -> List[_ToolCall]:
        """The model's tool calls, each put together from its streamed pieces
        (by ``index``), in the order they began: ``{"id", "name",
        "arguments"}`` dicts. All of them once the turn was read to its end;
        before that, those of the chunks yielded so far. A turn that did not
        complete (``failed``, ``cancelled``) may have cut its last call
        short: run calls once ``outcome`` is ``completed``."""
    def reply(self) -> _Reply:
        """The reply its chunks make: ``text``, ``reasoning``, ``tool_calls``,
        ``usage``, ``data``, and ``message``, the assistant message to put in
        the history the next turn sends. The whole reply once the turn was
        read to its end; before that, that of the chunks yielded so far."""
    def __aiter__(self) -> Turn:
        """The turn itself: ``async for chunk in turn``."""
    def __anext__(self) -> Coroutine[Any, Any, Chunk]:
        """The next chunk, once the store has it (G7); ``StopAsyncIteration``
        at the turn's end. Cancelling its awaiter cancels the turn. A
        coroutine, as an ``openai`` stream's ``__anext__`` gives:
        ``asyncio.create_task(turn.__anext__())`` (or ``anext(turn)``) reads
        it in a task of its own, whose cancel cancels the turn too."""
    def aclose(self) -> _Call[None]:
        """Ends the turn here: cancels it unless it already ended (G6), and
        resolves once it has settled (its stream closed, G4); then
        ``outcome`` is known. Idempotent."""
    def cancel(self) -> None:
        """Cancels the turn now, without waiting (unless it already ended,
        G6): its stream is closed (G4) and ``outcome`` is known once it has
        settled. The session stays open. ``settle.Error`` in a forked child."""
    def __aenter__(self) -> _Call[Turn]:
        """The turn itself, for ``async with``."""
    def __aexit__(self, kind: Any, value: Any, traceback: Any) -> _Call[None]:
        """Ends the turn as ``aclose()`` does; left by an exception (the reading task cancelled), waits for its end at most the settle timeout and a second (G5), so a stalled store never holds a cancel. Left by the close of its coroutine (``close()``: the collector, or the interpreter's exit, closing a coroutine its closed loop left pending), it waits for nothing (a coroutine being closed can await nothing): the turn is cancelled and settles on the kernel's threads."""

@final
class Task(Generic[_T]):
    """A coroutine running under a session; await it (or ``join()``) for its
    result: ``Task[int]`` for a coroutine that returns an ``int``.

    As an ``asyncio.Task``, it may be awaited by several callers at once
    and again after it ended: each gets the same value, or the same
    exception it raised (cancelled, detached or stopped, each gets an
    exception of that class of its own, as each awaiter of a cancelled
    ``asyncio.Task`` gets its own ``CancelledError``). ``cancel()`` reaches
    it while another task awaits it. Once nobody holds it, it is collected
    with what it kept, cycles through its result or exception included.
    """

    @property
    def no(self) -> int:
        """The task's number within its session."""
    def cancel(self) -> None:
        """Cancels the task: its coroutine gets ``CancelledError`` on its
        loop and the settle timeout to unwind, then it is detached (G5)."""
    def join(self) -> _Call[_T]:
        """Waits for the coroutine's result: what it returned, or what it
        raised. Raises ``Cancelled`` when it was cancelled, ``Detached`` when
        it was detached at the settle deadline, ``ShuttingDown`` when the
        kernel stopped first. Cancelling the awaiter cancels the task too
        (``asyncio.shield()`` lets it go on)."""
    def __await__(self) -> Generator[Any, None, _T]:
        """Waits for the coroutine's result, as ``join()`` does."""
    @classmethod
    def __class_getitem__(cls, item: Any) -> GenericAlias:
        """``settle.Task[int]`` at run time too, as ``asyncio.Task[int]``."""

@final
class Session:
    """One session of a kernel."""

    @property
    def id(self) -> int:
        """The session's id (what ``settle show ID`` takes)."""
    @property
    def name(self) -> str:
        """The session's name."""
    @property
    def parent(self) -> Optional[int]:
        """The id of the session that spawned it, if any."""
    @property
    def closed(self) -> bool:
        """Whether its finalize has run."""
    def child(self, name: str, *, budget: Optional[Budget] = None) -> _Call[Session]:
        """Registers a child session under this one (G1: it is cancelled and
        finalized before this one), with a ``Budget`` of its own if given.
        Raises ``SessionClosed`` once this one is finalized
        (``SessionClosing`` while it winds down), ``ShuttingDown`` during a
        shutdown, ``BadInput`` for a blank name, one over 128 characters or
        one holding a NUL."""
    def turn(
        self,
        source: _Source,
        *,
        input: Union[str, Sequence[Mapping[str, Any]], None] = None,
        to_chunk: Optional[Callable[[Any], _ChunkLike]] = None,
        idle_timeout: Optional[float] = None,
        first_event_timeout: Optional[float] = None,
    ) -> _Call[Turn]:
        """Starts a turn over ``source``: a callable returning an async
        iterable (or an awaitable of one, as ``openai``'s
        ``create(..., stream=True)``; a class of async iterators is such a
        callable), or an async iterable. The kernel opens
        it on this loop, stores each chunk, and closes it exactly once (G4).
        ``input`` is what the turn sends: a prompt, or a list (or tuple) of
        ``{"role", "content"}`` messages. Its items are chunks: a ``str``
        (text), a ``settle.Chunk``, an OpenAI-shaped chunk (the ``openai``
        package's object or the same as a dict), ``None`` (a keepalive), or
        a list or tuple of those, each in order (``("text", "hi")`` is two
        text chunks). ``to_chunk`` turns items that are not chunks into
        chunks; anything else fails the turn ``BadInput``. ``idle_timeout`` and
        ``first_event_timeout`` (seconds, ``0`` disables) are this turn's own.
        The source (its call, its iteration, ``to_chunk``) runs in a copy of
        the caller's ``contextvars`` context, taken at this call, as an
        asyncio task runs in a copy of its creator's: it sees the caller's
        request ids and tracing spans, and what it sets stays its own.

        Resolves to a ``Turn`` once its start is stored; cancelling the
        awaiter cancels the turn. Raises ``TurnRunning`` while the session's
        turn before still runs, ``Cancelled`` when ``cancel_turn()`` stopped
        this start, ``StoreError`` when the store did not take the start in
        time, ``SessionClosed`` once the session is finalized
        (``SessionClosing`` while it closes), ``ShuttingDown`` once a
        shutdown has begun, ``BudgetExhausted`` when its budget has no turn
        left, ``BadInput`` for an ``input`` over a limit or that is not one,
        and at the call for a ``source`` that cannot give a stream (a list,
        a plain iterator). Each is a ``settle.Error``."""
    def spawn(self, coroutine: Awaitable[_T]) -> _Call[Task[_T]]:
        """Runs ``coroutine`` as an asyncio task under this session's
        lifecycle (G1, G5, G6): cancelled on its loop when the session (or
        an ancestor) is cancelled or finishes, or the shutdown's drain ends;
        detached if it ignores that past the settle timeout, its later
        writes then raising ``SessionClosed`` (G10). It runs in a copy of the
        caller's ``contextvars`` context, taken at this call, as a task of
        ``asyncio.create_task`` does: it sees the caller's request ids and
        tracing spans, and what it sets reaches neither the caller nor
        another task. Resolves to a ``Task``. Its record says how it ended: ``completed`` when it returned,
        ``failed`` when it raised (a ``GeneratorExit`` too; the record
        names the class, and what it raised goes to its awaiter, never to
        the store), ``cancelled`` when it raised ``CancelledError`` of its
        own or was cancelled. A coroutine closed while it runs
        (``coroutine.close()`` called as it waits in an ``await``) has
        ended with the close's ``GeneratorExit``: its loop notices within
        about half a second and the task ends ``failed``, its awaiters
        given a ``GeneratorExit``. Raises ``BadInput``
        at once for what cannot be awaited (a function rather than the
        coroutine its call makes)."""
    def finish(self) -> _Call[str]:
        """The agent is done: its live descendants are cancelled, settled and
        finalized first, then it is (G1). Resolves to its end reason
        (``"completed"``, ``"failed"``, ``"cancelled"``; ``"shutdown"``
        during a shutdown). Raises ``AlreadyFinalized`` when it was already
        finalized (G2). Cancelling the awaiter stops the wait, not the finish."""
    def cancel(self, *, immediate: bool = True) -> _Call[None]:
        """Cancels the session: its descendants first, then its own turn and
        tasks (G1, G5); ``immediate=False`` lets the running turns of the
        session and of its descendants finish (each within the settle
        timeout) and starts no more. Raises ``AlreadyFinalized`` when it was (G2)."""
    def cancel_turn(self) -> _Call[bool]:
        """Stops the session's turn (and its starts in flight) without its
        ``Turn``; queued to the kernel at the call, so the next turn waits
        for the stopped one's end. ``True`` when a running turn was
        cancelled, ``False`` when none ran. Raises ``AlreadyFinalized`` when
        the session was (G2)."""
    def close(self) -> _Call[str]:
        """Closes the session on a user's request: cancel, then finalize
        (``user_close``). Resolves to its end reason; closing a closed
        session resolves to the reason it ended with (G2)."""
    def hold(self, kind: str = "input") -> _Call[None]:
        """Marks the session as waiting (``"input"`` from a person, or
        ``"delegation"`` to another session): no idle reap or LRU eviction
        takes it until ``release()``. Raises ``SessionClosed`` once it is
        finalized, ``StoreError`` when the store did not record the hold in
        time, ``BadInput`` for another ``kind``."""
    def release(self, kind: str = "input") -> _Call[None]:
        """Ends a ``hold(kind)``."""
    def finalized(self) -> _Call[str]:
        """Resolves to the end reason once the session is finalized."""
    def state(self) -> _Call[str]:
        """Resolves to its state as the kernel has it now: ``"registered"``,
        ``"running"``, ``"cancelling"``, ``"settled"`` or ``"finalized"``."""
    def transcript(self) -> _Call[List[_TurnRow]]:
        """Resolves to its turns as the store has them: dicts with ``no``,
        ``outcome``, ``started_at``, ``ended_at``, ``input``, ``text``,
        ``error`` (``{"kind", "message"}`` or ``None``) and ``chunks``
        (``Chunk``s), what ``settle show`` prints."""

@final
class Resumed:
    """A new session continuing a finalized one, with the conversation to send next."""

    @property
    def session(self) -> Session:
        """The new session (open; registered as a root)."""
    @property
    def resumed_from(self) -> int:
        """The id of the session it continues."""
    @property
    def history(self) -> List[Any]:
        """The messages of the session it continues, oldest first, as message
        dicts (``role``, ``content``, with ``tool_calls``, ``tool_call_id``
        and ``name`` where they have them): what its last turn with an input
        was sent, then that turn's reply unless it failed. A reply cut
        short (its turn cancelled, or interrupted by a crash) is given as
        far as it was stored, as the model's message: check the session's
        last turn (``transcript()``) to drop or mark it. ``[]`` when it ran
        no turn with an input."""
    @property
    def pending_tool_calls(self) -> List[_ToolCall]:
        """The tool calls of its last reply that no tool has answered yet, as
        ``Turn.tool_calls()`` gives them; ``[]`` when there are none."""

@final
class Kernel:
    """A running kernel over a session store."""

    @staticmethod
    def open(
        db: Union[str, os.PathLike[str], None] = ...,
        *,
        settle_timeout: float = 1.0,
        drain_timeout: float = 5.0,
        idle_timeout: Optional[float] = ...,
        idle_ttl: Optional[float] = None,
        lru_cap: Optional[int] = None,
        store_timeout: float = 10.0,
        max_turn_chunks: Optional[int] = None,
        max_turn_bytes: Optional[int] = None,
        max_prompt_bytes: Optional[int] = ...,
        max_history_bytes: Optional[int] = ...,
        secrets: Union[str, Iterable[str], None] = None,
        lease_ttl: float = 30.0,
        recover: bool = False,
    ) -> _Call[Kernel]:
        """Opens the store at ``db`` (an SQLite file's path, a ``str`` or a
        ``pathlib.Path``, or a ``postgres://`` URL; ``None`` for a store in
        memory) and starts a kernel on it. Times are in seconds.
        ``idle_ttl`` and ``lru_cap`` (the reclaimers of idle sessions) are
        off unless given; ``store_timeout`` bounds each write waited for;
        ``max_turn_chunks`` and ``max_turn_bytes`` bound one turn's stream
        (unbounded by default). ``max_prompt_bytes`` and
        ``max_history_bytes`` bound what a turn sends, each message of its
        ``input`` and the whole of it (1 MiB and 16 MiB by default, ``None``
        for no limit): a turn over either raises ``BadInput`` at ``turn()``.
        A conversation whose replies are unbounded outgrows the second:
        raise it, or bound the replies.

        ``recover=True`` first finalizes the sessions crashed processes left
        live (``recover()``), for a program that restarts on the same
        database after a crash and continues its conversations.

        ``lease_ttl`` is how long this process's lease on its sessions lasts
        unrenewed (renewed every tenth of it, so an outage of 26 s of 30 is
        always ridden out): a store that answers nothing
        for that long (a lock held by another process, a full disk, a
        server down) stops the kernel, its live sessions left for
        ``settle recover`` (or a peer in a fleet), for they may be taken
        over meanwhile; raise it to ride out longer outages, at the cost of
        a crashed process's sessions waiting that long for recovery.

        ``secrets`` (one string is one secret) are masked as ``***`` in
        every turn's error, told and stored; so are the values (8
        characters or more) of ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
        ``AZURE_OPENAI_API_KEY``, ``GROQ_API_KEY``, ``MISTRAL_API_KEY``,
        ``TOGETHER_API_KEY``, ``DEEPSEEK_API_KEY``, ``OPENROUTER_API_KEY``
        and ``SETTLE_API_KEY``, read when the kernel starts. A key it is
        not told of, or one a server escaped, is not masked; one echoed in
        another case, cut short or starred is (each piece of 12 characters
        or more).

        Raises ``BadInput`` for a store that cannot be opened or an option
        out of its range, ``TypeError`` for a ``db`` that is not a path,
        ``StoreError`` when the store fails."""
    def register(
        self,
        name: str,
        parent: Union[Session, int, None] = None,
        *,
        budget: Optional[Budget] = None,
        scope: Optional[str] = None,
    ) -> _Call[Session]:
        """Registers a root session (or a child of ``parent``, a ``Session``
        or an id), with a ``Budget`` for its subtree if given. Raises
        ``ShuttingDown`` during a shutdown, ``SessionClosed`` when the parent
        is finalized, ``BadInput`` when the parent is not known, and for a
        blank name, one over 128 characters or one holding a NUL. ``scope``
        names whose it is for ``lru_cap`` (a tenant, a user): at the cap a
        new session evicts only idle sessions of its scope and raises
        ``Error`` rather than end another's; without one it is in its
        parent's scope, a root in the shared one. Cancelling the task that
        awaits it before it answers cancels the session it makes, which
        nobody would hold."""
    def session(self, id: int) -> _Call[Session]:
        """A handle on session ``id``, open or finalized (its methods then raise ``SessionClosed``); ``SessionClosed`` while this kernel's finalize of it is not written yet; ``BadInput`` when unknown or another process's."""
    def resume(self, id: Union[Session, int], name: str) -> _Call[Resumed]:
        """Registers a new root session ``name`` that continues the finalized
        session ``id`` (a ``Session`` or an id), and resolves to a
        ``Resumed``: the new session, the ``history`` so far and the
        ``pending_tool_calls`` of its last reply. Raises ``BadInput`` when
        ``id`` is unknown or not finalized, ``ShuttingDown`` during a
        shutdown, ``StoreError`` when the store fails."""
    def sessions(self, state: Optional[str] = None) -> _Call[List[_SessionRow]]:
        """The store's sessions (those in ``state``), oldest first, as dicts
        with the fields of ``settle sessions --json`` (``owner``: where
        clients reach the live process that owns one, the address it
        advertised, or ``None``); ``BadInput`` for a
        state that is not one. Read from the store, where a session's state
        between turns is written in batches: a session may read ``running``
        for up to 100 ms (a second while the store is busy) after its turn
        ended; ``session.state()`` asks the kernel and is never behind."""
    def recover(self) -> _Call[_RecoveryReport]:
        """Finalizes the sessions crashed processes left live (G8), as
        ``settle recover`` does: each once its owner is gone (its lease ran
        out, or it ran on this machine and its process no longer exists),
        finalized ``recovered`` with its transcript kept, its open turn
        ``interrupted``; never a live process's, this kernel's among them.
        Resolves to ``recovered`` (ids, children first),
        ``interrupted_turns`` (``[id, turn]`` pairs) and
        ``finalized_elsewhere`` (ids another process took meanwhile).
        Idempotent; a recovered session can be resumed. Raises
        ``StoreError`` when the store fails."""
    def shutdown(self, drain: Optional[float] = None) -> _Call[_ShutdownReport]:
        """Shuts down (G9): no new session or turn, idle sessions finalized,
        running turns drained for ``drain`` seconds (default: the kernel's
        drain timeout), then cancelled, settled and finalized. Resolves to a
        report: ``finalized`` (id to end reason), ``drained``,
        ``cancelled``, ``detached``, ``left_recoverable`` (ids, the last
        left for ``settle recover``), ``store_failures``, ``lease_lost``
        and ``lease_lost_why``."""
    def begin_shutdown(self, drain: Optional[float] = None) -> None:
        """Starts the graceful shutdown without waiting for it (``stopped()`` waits)."""
    def skip_drain(self) -> None:
        """Ends a shutdown's drain now (what a second signal does)."""
    @property
    def shutting_down(self) -> bool:
        """Whether a shutdown has begun (a signal, a lost lease, or the program's own)."""
    def stopped(self) -> _Call[None]:
        """Resolves once the kernel has stopped: its shutdown is complete. A
        program that installed the signal handlers races its work against
        it, since a signal does not cancel the program's own tasks."""
    def install_signal_handlers(self) -> None:
        """Installs handlers of SIGINT, SIGTERM and SIGHUP on the running loop
        (call it from the main thread; from another, ``settle.Error``): the
        first signal starts the graceful shutdown (G9), every later one
        skips the rest of the drain. ``received_signal`` says which came
        first."""
    @property
    def received_signal(self) -> Optional[int]:
        """The first signal the handlers received, as its number; ``None`` if none."""
    @property
    def store_failures(self) -> int:
        """How many store writes failed so far."""
    def __aenter__(self) -> _Call[Kernel]:
        """The kernel itself, for ``async with``."""
    def __aexit__(self, kind: Any, value: Any, traceback: Any) -> _Call[bool]:
        """Shuts down as ``shutdown()`` does, with the kernel's drain timeout,
        and resolves to ``False``: an exception raised in the block goes on up.
        Left by the close of its coroutine (``close()``: the collector, or the
        interpreter's exit, closing a coroutine its closed loop left pending),
        it begins the shutdown and waits for nothing."""

def _next_log_line(timeout: float) -> Optional[Tuple[int, str, str]]:
    """The kernel's next log line as ``(logging level, module, text)``,
    waiting at most ``timeout`` seconds with the GIL released; ``None``
    when none came. The package's own thread forwards them to ``logging``."""

def shutdown_all(timeout: Optional[float] = None) -> None:
    """What interpreter exit runs: shuts down every kernel this process still
    holds, each within its own bound (drain + settle timeout + flush budget,
    and a margin of a second) or ``timeout`` seconds if given, and writes one
    line to ``sys.stderr`` for each that left sessions for ``settle recover``."""
