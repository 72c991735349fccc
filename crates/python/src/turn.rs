//! `settle.Turn`: a turn in flight, as an async iterator of the chunks the
//! store has acknowledged (G7), closed by `aclose()` or `async with`.
//!
//! Leaving early closes the turn: `aclose()`, the end of an `async with`
//! block, cancelling the asyncio task that awaits its next chunk, or the
//! `Turn` being collected all cancel it, and the kernel closes its stream
//! (G4). (A bare `async for` that breaks out leaves the closing to the
//! collector; `async with` makes it deterministic, as pydantic-ai asks of its
//! streams for the same reason.)
//!
//! What the yielded chunks say is kept as they reach Python: `tool_calls()`
//! gives the tool-call pieces put together (by index, as the runtime's turn
//! does, with `settle_stream::ToolCalls`), and `reply()` the whole reply,
//! both readable without waiting on the kernel. A chunk counts once the
//! task awaiting `__anext__` has it, not when the kernel has it: one whose
//! awaiter was cancelled first (it is stored all the same) is no part of
//! them.

use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use settle_core::{ChunkKind, Outcome, TurnError};
use settle_runtime::{Turn, WorkCanceller};
use settle_stream::{Chunk, ReplyBuilder, ToolCalls};
use tokio_util::sync::CancellationToken;

use crate::awaitable::{awaitable_with, bridge, finishing, ready, OnCancel};
use crate::chunk::PyChunk;
use crate::process::{ForkSafe, Owner};
use crate::provider::PumpWatch;
use crate::ready::Ready;
use crate::stranded::Stranded;

/// How a turn ended, once a read or a close has seen it.
type Ending = Option<(Outcome, Option<TurnError>)>;

/// What the chunks a `Turn` yielded say, put together as they go by.
#[derive(Debug, Default)]
struct Gathered {
    /// The chunks other than tool-call pieces (text, reasoning, usage, data).
    reply: ReplyBuilder,
    /// The tool-call pieces, put together (a piece may grow any call, by
    /// its index).
    calls: ToolCalls,
}

impl Gathered {
    /// Notes `chunk`, which the task awaiting it has just received.
    fn saw(&mut self, chunk: &Chunk) {
        if chunk.kind() == ChunkKind::ToolCall {
            self.calls.push(&chunk.to_json());
        } else {
            self.reply.push(chunk);
        }
    }
}

/// Notes `chunk` in `gathered` (a poisoned lock notes nothing: a panic
/// elsewhere already lost what was put together).
fn note(gathered: &Mutex<Gathered>, chunk: &Chunk) {
    if let Ok(mut gathered) = gathered.lock() {
        gathered.saw(chunk);
    }
}

/// What notes a chunk in its turn's `Gathered` once the task that awaited
/// it has it (`_bridge.Next` calls it in that task's own step): a chunk
/// whose awaiter was cancelled before it resumed is stored, never seen, and
/// no part of the reply.
#[pyclass(module = "settle._settle", frozen)]
struct Gather {
    gathered: Arc<Mutex<Gathered>>,
}

#[pymethods]
impl Gather {
    fn __call__(&self, chunk: &Bound<'_, PyChunk>) {
        note(&self.gathered, &chunk.get().chunk);
    }
}

/// What the future of a waiting read calls from its own `cancel()`: the
/// turn's cancel, queued to the kernel before the cancelling task's next
/// line (the session's next turn) runs.
#[pyclass(module = "settle._settle", frozen)]
struct CancelAtOnce {
    turn: Py<PyTurn>,
}

/// What cancels `turn` from the `cancel()` of a future its reader's task
/// waits on (`_bridge.CancelsAtOnce`).
pub(crate) fn cancel_at_once<'py>(turn: &Bound<'py, PyTurn>) -> PyResult<Bound<'py, PyAny>> {
    let at_once = CancelAtOnce {
        turn: turn.clone().unbind(),
    };
    Ok(Bound::new(turn.py(), at_once)?.into_any())
}

#[pymethods]
impl CancelAtOnce {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        self.turn.get().cancel_now();
    }
}

/// A turn in flight: `async for chunk in turn` yields each chunk once the
/// store has it; then `turn.outcome` says how it ended, and
/// `turn.tool_calls()` and `turn.reply()` what its chunks made.
///
/// Cancelling the task that awaits its next chunk cancels the turn, as for
/// any await of it: `asyncio.wait_for(turn.__anext__(), 0.1)` ends it at
/// its first timeout. To look for chunks with a timeout and go on, read
/// the turn in a task of its own and wait for that task (`reader =
/// asyncio.create_task(turn.__anext__())`, then
/// `asyncio.wait({reader}, timeout=0.1)`).
#[pyclass(name = "Turn", module = "settle", frozen)]
pub(crate) struct PyTurn {
    turn: ForkSafe<Arc<tokio::sync::Mutex<Option<Turn>>>>,
    /// Cancelled to cancel the turn (its next chunk, or its close, sees it).
    cancel: CancellationToken,
    /// Cancels the turn at once, apart from the read that may hold it.
    canceller: Option<WorkCanceller>,
    /// How it ended, once a read or a close has seen it.
    ending: Arc<Mutex<Ending>>,
    /// What its yielded chunks say (`tool_calls()`, `reply()`).
    gathered: Arc<Mutex<Gathered>>,
    no: u32,
    session: u64,
    /// Its pump, for one whose loop closed.
    pump: Arc<PumpWatch>,
    /// The kernel's settle timeout (G5): how long leaving an `async with`
    /// block by an exception waits for the turn's end.
    settle: Duration,
}

/// What leaving an `async with` block by an exception waits for a turn's
/// end beyond the settle timeout: its end's write, on a store that answers.
const EXIT_MARGIN: Duration = Duration::from_secs(1);

impl PyTurn {
    /// Ends the turn here: cancels it unless it already ended (G6), and
    /// resolves once it has settled, or once `bound` has passed (the end is
    /// still kept when it comes).
    fn end_here<'py>(
        &self,
        py: Python<'py>,
        bound: Option<Duration>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (turn, here) = self.turn.get()?;
        self.pump.end_if_loop_closed(py);
        self.cancel.cancel();
        let closing = cancel_and_settle(turn.clone(), self.ending.clone(), self.pump.clone());
        let Some(bound) = bound else {
            return finishing(py, here, async move {
                closing.await;
                Ok(crate::awaitable::Nothing)
            });
        };
        // On the runtime, apart: the end is kept when it comes, after the
        // wait below gave up.
        let closing = here.runtime.spawn(closing);
        finishing(py, here, async move {
            let _ = tokio::time::timeout(bound, closing).await;
            Ok(crate::awaitable::Nothing)
        })
    }

    pub fn new(turn: Turn, owner: Owner, pump: Arc<PumpWatch>, settle: Duration) -> Self {
        let work = turn.work();
        let canceller = turn.canceller();
        PyTurn {
            canceller,
            turn: ForkSafe::new(Arc::new(tokio::sync::Mutex::new(Some(turn))), owner),
            cancel: CancellationToken::new(),
            ending: Arc::new(Mutex::new(None)),
            gathered: Arc::new(Mutex::new(Gathered::default())),
            no: work.no,
            session: work.session.get(),
            pump,
            settle,
        }
    }

    /// Notes `chunk` in what the turn's chunks say, as its reader has it.
    pub(crate) fn saw(&self, chunk: &Chunk) {
        note(&self.gathered, chunk);
    }

    /// Cancels the turn and settles it on the runtime, without waiting:
    /// what `cancel()` and a read dropped before it gave its chunk do. In
    /// a forked child, where the runtime is not, it does nothing and says
    /// so: the `settle.Error` of every other call on the parent's objects.
    pub(crate) fn cancel_soon(&self) -> PyResult<()> {
        let (turn, here) = self.turn.get()?;
        self.cancel_now();
        here.runtime.spawn(cancel_and_settle(
            turn.clone(),
            self.ending.clone(),
            self.pump.clone(),
        ));
        Ok(())
    }

    /// Cancels the turn now: its token, and the kernel's work, queued before
    /// this returns (G6: the core ignores it for a turn that ended). Nothing
    /// in a forked child, where the kernel's threads are not.
    pub(crate) fn cancel_now(&self) {
        self.cancel.cancel();
        if self.turn.get().is_ok() {
            if let Some(canceller) = &self.canceller {
                canceller.cancel();
            }
        }
    }

    /// Keeps the turn's end in `ending` once the kernel has told it, when
    /// nobody settled the turn (its session closed or finished while
    /// nobody read it): `outcome` says it then, as the store does. A read
    /// or a close holding the turn keeps the end itself.
    fn refresh(&self) {
        if self.ending.lock().map_or(true, |ending| ending.is_some()) {
            return;
        }
        let Ok((turn, _)) = self.turn.get() else {
            return;
        };
        let Ok(mut slot) = turn.try_lock() else {
            return;
        };
        if let Some(end) = slot.as_mut().and_then(|turn| turn.try_end().cloned()) {
            keep_end(end, &self.ending, &self.pump);
        }
    }

    /// The next chunk if the store has it and it waits in the turn's
    /// channel; `None` when it has to be waited for, when the turn was
    /// cancelled, and while another read holds the turn.
    fn waiting_chunk(&self, turn: &tokio::sync::Mutex<Option<Turn>>) -> Option<Chunk> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let mut slot = turn.try_lock().ok()?;
        match slot.as_mut()?.try_next_chunk() {
            Poll::Ready(Some(chunk)) => Some(chunk),
            // The end is the waiting read's to settle.
            Poll::Ready(None) | Poll::Pending => None,
        }
    }
}

/// Cancels the turn unless it already ended (G6) and waits until it has
/// settled, its end kept in `ending`; a read in flight holds the turn
/// meanwhile and sees the cancel token, and whichever takes the turn
/// settles it.
async fn cancel_and_settle(
    turn: Arc<tokio::sync::Mutex<Option<Turn>>>,
    ending: Arc<Mutex<Ending>>,
    pump: Arc<PumpWatch>,
) {
    let mut slot = turn.lock().await;
    if let Some(turn) = slot.take() {
        turn.cancel();
        settle_turn(turn, &ending, &pump).await;
    }
}

/// Waits for `turn`'s end and keeps it in `ending`. A turn the kernel
/// detached (G5: its source ignores its cancel) has its pump let go of
/// first, so that its loop's end does not wait for it.
async fn settle_turn(turn: Turn, ending: &Mutex<Ending>, pump: &PumpWatch) {
    keep_end(turn.end().await, ending, pump);
}

/// Keeps `end` in `ending`; a turn the kernel detached has its pump let go
/// of first.
fn keep_end(end: (Outcome, Option<TurnError>), ending: &Mutex<Ending>, pump: &PumpWatch) {
    if end.0 == Outcome::Detached {
        pump.let_go();
    }
    if let Ok(mut slot) = ending.lock() {
        *slot = Some(end);
    }
}

#[pymethods]
impl PyTurn {
    /// The turn's number within its session, from 1.
    #[getter]
    fn no(&self) -> u32 {
        self.no
    }

    /// The id of the session it belongs to.
    #[getter]
    fn session_id(&self) -> u64 {
        self.session
    }

    /// How it ended, once it has: `"completed"`, `"cancelled"`, `"failed"`,
    /// `"idle_timeout"`, `"detached"` (or `"interrupted"` when the kernel
    /// stopped first); `None` while it runs.
    #[getter]
    fn outcome(&self) -> Option<&'static str> {
        self.refresh();
        let ending = self.ending.lock().ok()?;
        ending.as_ref().map(|(outcome, _)| outcome.as_str())
    }

    /// Why it failed or timed out, as `(kind, message)`; `None` otherwise.
    #[getter]
    fn error(&self) -> Option<(&'static str, String)> {
        self.refresh();
        let ending = self.ending.lock().ok()?;
        ending
            .as_ref()
            .and_then(|(_, error)| error.as_ref())
            .map(|error| (error.kind.as_str(), error.message.clone()))
    }

    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next chunk, once the store has it; `StopAsyncIteration` at the
    /// turn's end (its outcome is then known). Cancelling the awaiting task
    /// cancels the turn. A chunk the store already has is given without a
    /// round trip through the kernel's threads; awaiting it still passes
    /// the event loop once, so a reader that is behind its stream lets
    /// other tasks run and can be cancelled at every chunk. Either read is
    /// a coroutine as `asyncio` sees one (`send`, `throw`, `close`), as an
    /// `openai` stream's `__anext__` gives: `asyncio.create_task` takes it.
    fn __anext__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let (py, this) = (slf.py(), slf.get());
        let (turn, here) = this.turn.get()?;
        if let Some(chunk) = this.waiting_chunk(turn) {
            return Ok(Bound::new(py, Ready::new(chunk, slf.clone().unbind()))?.into_any());
        }
        this.pump.end_if_loop_closed(py);
        let (turn, cancel, ending) = (turn.clone(), this.cancel.clone(), this.ending.clone());
        let pump = this.pump.clone();
        let gather = Gather {
            gathered: this.gathered.clone(),
        };
        // A cancel (or the collection) of this awaitable cancels the turn:
        // the future goes on to settle it, and its result is dropped. The
        // cancel reaches the kernel from the future's `cancel()` itself.
        let at_once = cancel_at_once(slf)?;
        let next = awaitable_with(
            py,
            here,
            Some(at_once),
            cancel.clone(),
            OnCancel::Finish,
            async move {
                let mut slot = turn.lock().await;
                let next = match slot.as_mut() {
                    None => None,
                    Some(turn) => tokio::select! {
                        chunk = turn.next_chunk() => chunk,
                        () = cancel.cancelled() => { turn.cancel(); None }
                    },
                };
                if let Some(chunk) = next {
                    return Ok(PyChunk { chunk });
                }
                if let Some(turn) = slot.take() {
                    settle_turn(turn, &ending, &pump).await;
                }
                Err(PyStopAsyncIteration::new_err(()))
            },
        )?;
        bridge(py)?
            .getattr(pyo3::intern!(py, "Next"))?
            .call1((next, Bound::new(py, gather)?))
    }

    /// Ends the turn here: cancels it unless it already ended (G6), and
    /// resolves once it has settled (its stream closed, G4); then
    /// `outcome` is known. Idempotent.
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.end_here(py, None)
    }

    /// The tool calls the model made, each put together from its streamed
    /// pieces (OpenAI's `delta.tool_calls`: a piece joins the call of its
    /// `index`), in the order they began: a list of `{"id", "name",
    /// "arguments"}` dicts, `arguments` the text the pieces made (usually
    /// JSON, unparsed). Once the turn has ended, read to its end, these
    /// are all of its calls; before that, those of the chunks yielded so
    /// far (`[]` before the first), and a turn closed early keeps those it
    /// yielded (the store has every chunk: `session.transcript()`). A
    /// turn that did not complete (`failed`, `cancelled`) may have cut its
    /// last call short: run calls once `outcome` is `completed`.
    fn tool_calls<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let calls = match self.gathered.lock() {
            Ok(gathered) => gathered.calls.calls().to_vec(),
            Err(_) => Vec::new(),
        };
        crate::reply::tool_calls(py, &calls)
    }

    /// The reply its chunks make, put together: a dict of `text` (the text
    /// chunks joined), `reasoning` (the reasoning chunks joined), `tool_calls`
    /// (as `tool_calls()` gives them), `usage` (each usage report, as the
    /// model sent it), `data` (every other structured chunk's payload) and
    /// `message`: the reply as the assistant message to put in the history
    /// the next turn sends (`{"role": "assistant", "content"}`, with
    /// `tool_calls` in the chat-completion spelling when it made some, which
    /// each tool's `{"role": "tool", "tool_call_id", "content"}` answers;
    /// `content` is `None` when it only calls tools).
    /// Once the turn has ended, read to its end, it is the whole reply;
    /// before that, the reply of the chunks yielded so far (empty before
    /// the first), as `tool_calls()` says.
    fn reply<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let reply = match self.gathered.lock() {
            Ok(gathered) => {
                let mut reply = gathered.reply.clone().finish();
                reply.tool_calls = gathered.calls.calls().to_vec();
                reply
            }
            Err(_) => ReplyBuilder::default().finish(),
        };
        crate::reply::reply(py, &reply)
    }

    /// Cancels the turn now, without waiting (unless it already ended,
    /// G6): its stream is closed (G4) and `outcome` is known once it has
    /// settled, whether or not the turn is read again. The session stays
    /// open. Raises `settle.Error` in a forked child (the turn is its
    /// parent's), as every call on the parent's objects does.
    fn cancel(&self) -> PyResult<()> {
        self.cancel_soon()
    }

    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        ready(py, slf.into_any())
    }

    /// Leaving the block ends the turn as `aclose()` does. Left by an
    /// exception (the reading task cancelled, an error in the block), it
    /// waits for the turn's end at most the settle timeout and a margin
    /// (G5), so that a cancel is not held while the store stalls; the end
    /// is kept (`outcome`) and written once the store answers. Left by the
    /// close of its coroutine (`close()`: the collector, or the
    /// interpreter's exit, closing a coroutine its closed loop left
    /// pending), it waits for nothing (a coroutine being closed can await
    /// nothing): the turn is cancelled and settles on the kernel's
    /// threads, as when it is dropped.
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        kind: Bound<'py, PyAny>,
        _value: Bound<'py, PyAny>,
        traceback: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if crate::awaitable::closing_coroutine(py, &kind, &traceback) {
            // A forked child's turn is not its own to cancel: nothing then.
            let _ = self.cancel_soon();
            return crate::awaitable::done_at_once(py);
        }
        let bound = (!kind.is_none()).then(|| self.settle.saturating_add(EXIT_MARGIN));
        self.end_here(py, bound)
    }

    fn __repr__(&self) -> String {
        format!(
            "<settle.Turn {} of session {}: {}>",
            self.no,
            self.session,
            self.outcome().unwrap_or("running")
        )
    }
}

impl Drop for PyTurn {
    fn drop(&mut self) {
        // The Rust turn cancels itself when dropped; the token also stops a
        // next-chunk wait still holding it.
        self.cancel.cancel();
    }
}
