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
    ``TaskGroup.create_task`` also take as a coroutine."""

    def send(self, value: Any) -> Any: ...
    def throw(self, *error: Any) -> Any: ...  # type: ignore[override, unused-ignore]
    def close(self) -> None: ...

#: How the native module was compiled: ``"release"`` (what ``pip install``
#: builds) or ``"debug"`` (what the workspace's test harness installs). The
#: benchmark scripts refuse a debug build.
BUILD_PROFILE: str
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
    ) -> Budget: ...
    @property
    def turns(self) -> Optional[int]: ...
    @property
    def tokens(self) -> Optional[int]: ...
    @property
    def wall_time(self) -> Optional[float]: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Chunk:
    """One piece of a turn's output, as the store acknowledged it."""

    def __new__(cls, kind: str, data: Any) -> Chunk: ...
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> Optional[str]: ...
    @property
    def data(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...

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
    message: Dict[str, Any]

_ChunkLike = Union[str, Chunk, None, Dict[str, Any], List[Any], Tuple[Any, ...], Any]
_Source = Union[Callable[[], Any], Any]

@final
class Turn:
    """A turn in flight: an async iterator of stored chunks; ``async with`` closes it; then its tool calls and reply.

    Cancelling the task that awaits its next chunk cancels the turn:
    ``asyncio.wait_for(turn.__anext__(), 0.1)`` ends it at its first
    timeout. To wait for chunks with a timeout and go on, read the turn in
    a task of its own and wait for that task (``asyncio.wait({reader}, timeout=0.1)``).
    """

    @property
    def no(self) -> int: ...
    @property
    def session_id(self) -> int: ...
    @property
    def outcome(self) -> Optional[str]: ...
    @property
    def error(self) -> Optional[Tuple[str, str]]: ...
    def tool_calls(self) -> List[_ToolCall]: ...
    def reply(self) -> _Reply: ...
    def __aiter__(self) -> Turn: ...
    def __anext__(self) -> Awaitable[Chunk]: ...
    def aclose(self) -> _Call[None]: ...
    def cancel(self) -> None:
        """Cancels the turn without waiting; ``settle.Error`` in a forked child."""
    def __aenter__(self) -> _Call[Turn]: ...
    def __aexit__(self, kind: Any, value: Any, traceback: Any) -> _Call[None]:
        """Ends the turn as ``aclose()`` does; left by an exception (the reading task cancelled), waits for its end at most the settle timeout and a second (G5), so a stalled store never holds a cancel."""

@final
class Task(Generic[_T]):
    """A coroutine running under a session; await it (or ``join()``) for its
    result: ``Task[int]`` for a coroutine that returns an ``int``.

    As an ``asyncio.Task``, it may be awaited by several callers at once
    and again after it ended: each gets the same value, or the same
    exception. ``cancel()`` reaches it while another task awaits it.
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
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def parent(self) -> Optional[int]: ...
    @property
    def closed(self) -> bool: ...
    def child(self, name: str, *, budget: Optional[Budget] = None) -> _Call[Session]: ...
    def turn(
        self,
        source: _Source,
        *,
        input: Union[str, Sequence[Mapping[str, Any]], None] = None,
        to_chunk: Optional[Callable[[Any], _ChunkLike]] = None,
        idle_timeout: Optional[float] = None,
        first_event_timeout: Optional[float] = None,
    ) -> _Call[Turn]: ...
    def spawn(self, coroutine: Awaitable[_T]) -> _Call[Task[_T]]: ...
    def finish(self) -> _Call[str]: ...
    def cancel(self, *, immediate: bool = True) -> _Call[None]: ...
    def cancel_turn(self) -> _Call[bool]:
        """Stops the session's turn (and its starts in flight) without its
        ``Turn``; queued to the kernel at the call, so the next turn waits
        for the stopped one's end. ``True`` when a running turn was cancelled."""
    def close(self) -> _Call[str]: ...
    def hold(self, kind: str = "input") -> _Call[None]: ...
    def release(self, kind: str = "input") -> _Call[None]: ...
    def finalized(self) -> _Call[str]: ...
    def state(self) -> _Call[str]: ...
    def transcript(self) -> _Call[List[Dict[str, Any]]]: ...

@final
class Resumed:
    """A new session continuing a finalized one, with the conversation to send next."""

    @property
    def session(self) -> Session: ...
    @property
    def resumed_from(self) -> int: ...
    @property
    def history(self) -> List[Dict[str, Any]]: ...
    @property
    def pending_tool_calls(self) -> List[_ToolCall]: ...

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
        secrets: Union[str, Iterable[str], None] = None,
        lease_ttl: float = 30.0,
    ) -> _Call[Kernel]:
        """Opens the store at ``db`` and starts a kernel on it.
        ``lease_ttl`` is how long this process's lease on its sessions lasts
        unrenewed (renewed at a third of it): a store that answers nothing
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
        or more)."""
    def register(
        self,
        name: str,
        parent: Union[Session, int, None] = None,
        *,
        budget: Optional[Budget] = None,
        scope: Optional[str] = None,
    ) -> _Call[Session]:
        """Registers a session (a child of ``parent`` if given). ``scope``
        names whose it is for ``lru_cap`` (a tenant, a user): at the cap a
        new session evicts only idle sessions of its scope and raises
        ``Error`` rather than end another's; without one it is in its
        parent's scope, a root in the shared one."""
    def session(self, id: int) -> _Call[Session]:
        """A handle on session ``id``, open or finalized (its methods then raise ``SessionClosed``); ``SessionClosed`` while this kernel's finalize of it is not written yet; ``BadInput`` when unknown or another process's."""
    def resume(self, id: Union[Session, int], name: str) -> _Call[Resumed]: ...
    def sessions(self, state: Optional[str] = None) -> _Call[List[Dict[str, Any]]]:
        """The store's sessions (those in ``state``); ``BadInput`` for a state that is not one."""
    def shutdown(self, drain: Optional[float] = None) -> _Call[Dict[str, Any]]: ...
    def begin_shutdown(self, drain: Optional[float] = None) -> None: ...
    def skip_drain(self) -> None: ...
    @property
    def shutting_down(self) -> bool: ...
    def stopped(self) -> _Call[None]: ...
    def install_signal_handlers(self) -> None: ...
    @property
    def received_signal(self) -> Optional[int]: ...
    @property
    def store_failures(self) -> int: ...
    def __aenter__(self) -> _Call[Kernel]: ...
    def __aexit__(self, kind: Any, value: Any, traceback: Any) -> _Call[bool]: ...

def shutdown_all(timeout: Optional[float] = None) -> None:
    """What interpreter exit runs: shuts down every kernel this process still
    holds, each within its own bound (drain + settle timeout + flush budget,
    and a margin of a second) or ``timeout`` seconds if given, and writes one
    line to ``sys.stderr`` for each that left sessions for ``settle recover``."""
