//! `settle.Session`: one session of a kernel, its turns, tasks and end.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyString;
use settle_core::{CancelMode, Handled, Hold, SessionId};
use settle_runtime::{SessionHandle, TurnOptions, TurnRequest};
use settle_stream::Message;
use tokio_util::sync::CancellationToken;

use crate::args::Text;
use crate::awaitable::{
    awaitable, awaitable_with, finishing, raising, running_loop, Nothing, OnCancel,
};
use crate::budget::PyBudget;
use crate::errors;
use crate::handover::Handover;
use crate::process::ForkSafe;
use crate::provider::{PumpWatch, PyProvider, Source};
use crate::task::{check_write, PyTask, Shared as TaskShared, Spawned};
use crate::ties::Ties;
use crate::unclaimed::CancelUnclaimed;

/// One session of a kernel. Every method is safe at any time: once the
/// session is finalized, those that use it raise `settle.SessionClosed`
/// (G10) and those that end it say it already ended (G2); none crashes.
#[pyclass(name = "Session", module = "settle", frozen)]
pub(crate) struct PySession {
    handle: ForkSafe<SessionHandle>,
    /// What it keeps of its kernel.
    ties: Ties,
    id: u64,
    name: String,
    parent: Option<u64>,
    /// Turn starts through this object, one at a time: a start whose
    /// caller was cancelled keeps its place until the turn it made is
    /// cancelled (see `turn`).
    starts: Arc<tokio::sync::Mutex<()>>,
    /// Cancelled by `cancel_turn()` (and then replaced): every start
    /// through this object not handed over yet gives up.
    stop: std::sync::Mutex<CancellationToken>,
}

impl PySession {
    pub fn new(handle: SessionHandle, ties: Ties) -> Self {
        PySession {
            starts: Arc::default(),
            stop: std::sync::Mutex::default(),
            id: handle.id().get(),
            name: handle.name().to_owned(),
            parent: handle.parent().map(SessionId::get),
            handle: ForkSafe::new(handle, ties.owner.clone()),
            ties,
        }
    }
}

/// A turn's request from `input=`: a prompt string, a list of
/// `{"role", "content"}` messages (what the caller sends its model), or
/// nothing.
fn request(input: Option<&Bound<'_, PyAny>>) -> PyResult<TurnRequest> {
    let Some(input) = input.filter(|i| !i.is_none()) else {
        return Ok(TurnRequest::new(Vec::new()));
    };
    if let Ok(prompt) = input.cast::<PyString>() {
        return Ok(TurnRequest::prompt(crate::convert::utf8(prompt)?));
    }
    let value = crate::convert::to_json(input)?;
    // A message's `content` may be a string, `None` (an assistant message
    // that only calls tools, as the `openai` package's types write it) or a
    // list of parts (text, images), kept as given.
    let messages: Vec<Message> = serde_json::from_value(value).map_err(|e| {
        errors::BadInput::new_err(format!(
            "input= must be a str or a list of {{\"role\", \"content\"}} messages: {e}"
        ))
    })?;
    Ok(TurnRequest::new(messages))
}

impl PySession {
    /// An awaitable of `work` on a clone of this session's handle, on the
    /// kernel's runtime: the call every method that only asks the handle
    /// something makes.
    fn call<'py, F, Fut, T>(
        &self,
        py: Python<'py>,
        on_cancel: OnCancel,
        work: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: FnOnce(SessionHandle) -> Fut,
        Fut: std::future::Future<Output = PyResult<T>> + Send + 'static,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let (handle, here) = self.handle.get()?;
        awaitable(
            py,
            here,
            CancellationToken::new(),
            on_cancel,
            work(handle.clone()),
        )
    }

    pub fn id_value(&self) -> u64 {
        self.id
    }

    /// `SessionClosed` as an awaitable that raises it, when the asyncio
    /// task calling is a detached settle task (G10); `None` otherwise.
    /// What the call was `handed` (a turn's source, a coroutine) is closed
    /// now, as one the kernel refuses.
    fn refused_if_detached<'py>(
        &self,
        py: Python<'py>,
        handed: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match check_write(py) {
            Ok(()) => Ok(None),
            Err(error) => {
                let error = match handed {
                    Some(handed) => refused(py, handed, error),
                    None => error,
                };
                let (_, here) = self.handle.get()?;
                raising(py, here, error).map(Some)
            }
        }
    }

    /// A turn's options from its keyword arguments; `None` when it sets
    /// none (the kernel's apply).
    fn turn_options(&self, idle: Option<f64>, first: Option<f64>) -> PyResult<Option<TurnOptions>> {
        if idle.is_none() && first.is_none() {
            return Ok(None);
        }
        let seconds = |value: f64, what: &str| {
            Duration::try_from_secs_f64(value).map_err(|_| {
                errors::BadInput::new_err(format!(
                    "{what} must be a number of seconds ≥ 0, not {value}"
                ))
            })
        };
        let idle = match idle {
            Some(idle) => seconds(idle, "idle_timeout")?,
            None => self.ties.idle.unwrap_or(Duration::ZERO),
        };
        let mut options = TurnOptions::default().idle_timeout(idle);
        if let Some(first) = first {
            options = options.first_event_timeout(seconds(first, "first_event_timeout")?);
        }
        Ok(Some(options))
    }
}

/// `error`, once `source` (a turn's stream, a coroutine to spawn) that a
/// refused call will never open or await is closed: a stream `aclose()`d on
/// the running loop (G4), a coroutine closed unawaited (Python would warn
/// that it was never awaited). Closing is best effort: its failure is
/// logged, and `error` is what the caller is told.
fn refused(py: Python<'_>, source: &Bound<'_, PyAny>, error: PyErr) -> PyErr {
    let closed = crate::awaitable::bridge(py).and_then(|bridge| {
        let on = running_loop(py).ok();
        bridge.call_method1(pyo3::intern!(py, "close_unopened"), (on, source))
    });
    if let Err(failed) = closed {
        tracing::debug!(error = %failed, "could not close what a refused call was handed");
    }
    error
}

/// A hold's kind from its Python spelling.
fn hold_of(kind: &str) -> PyResult<Hold> {
    match kind {
        "input" => Ok(Hold::PendingInput),
        "delegation" => Ok(Hold::Delegation),
        other => Err(errors::BadInput::new_err(format!(
            "a hold is \"input\" or \"delegation\", not {other:?}"
        ))),
    }
}

#[pymethods]
impl PySession {
    /// The session's id (what `settle show ID` takes).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// The session's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The id of the session that spawned it, if any.
    #[getter]
    fn parent(&self) -> Option<u64> {
        self.parent
    }

    /// Whether its finalize has run.
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self.handle.get()?.0.is_closed())
    }

    /// Registers a child session under this one (G1: it is cancelled and
    /// finalized before this one), with a `settle.Budget` of its own if
    /// given (it counts against this one's too). Raises `SessionClosed`
    /// once this one is finalized, `Error` while it winds down,
    /// `ShuttingDown` during a shutdown.
    #[pyo3(signature = (name, *, budget = None))]
    fn child<'py>(
        &self,
        py: Python<'py>,
        name: Text,
        budget: Option<PyRef<'py, PyBudget>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Text(name) = name;
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        let budget = budget.map(|b| b.get());
        let (handle, here) = self.handle.get()?;
        let (handle, ties) = (handle.clone(), self.ties.clone());
        finishing(py, here, async move {
            let child = match budget {
                None => handle.child(name).await,
                Some(budget) => handle.child_with_budget(name, budget).await,
            };
            let child = child.map_err(errors::runtime)?;
            Ok(crate::registered::Registered::new(child, ties))
        })
    }

    /// Starts a turn over `source`: a callable returning an async iterable
    /// (or an awaitable of one, as `client.chat.completions.create(...,
    /// stream=True)` is), or an async iterable. The kernel opens it on this
    /// loop, stores each chunk, and closes it (`aclose()`, else `close()`)
    /// exactly once, on end, error, idle timeout, cancel and drop, and when
    /// the cancel lands while it is being opened (G4). `input` is what the
    /// turn sends (a prompt, or `[{"role", "content"}]` messages, with
    /// `tool_calls`, `tool_call_id` and `name` where they have them; other
    /// fields are not kept; a content may
    /// be a `str`, a list of parts (`[{"type": "text", "text"}, {"type":
    /// "image_url", ...}]`, kept as given) or `None`, stored as `""`),
    /// stored as the turn's input. `to_chunk`
    /// turns each item into a chunk (a `str`, a `settle.Chunk`, an
    /// OpenAI-shaped chunk, a list of those, or `None`) when the items are
    /// none of those. The source is pulled only as fast as the turn is
    /// read: once the kernel's chunk buffer and 64 more chunks wait
    /// unread, the kernel stops pulling it until the reader catches up.
    ///
    /// This turn's own timeouts, in seconds (`0` disables): `idle_timeout`
    /// (no item for this long ends it `idle_timeout`; default: the
    /// kernel's) and `first_event_timeout` (no first item within this ends
    /// it `idle_timeout`; default: the idle timeout), for a model that
    /// thinks long before its first token, or a step that must be quick.
    /// (Retrying a failed open is the model client's own business in
    /// Python, e.g. `openai`'s `max_retries`: the kernel never re-opens a
    /// source it was given.)
    ///
    /// The source (its call, its iteration, `to_chunk`) runs in a copy of
    /// the caller's `contextvars` context, taken at this call, as an
    /// asyncio task runs in a copy of its creator's: it sees the caller's
    /// request ids and tracing spans, and what it sets stays its own.
    ///
    /// Resolves to a `settle.Turn` once the turn's start is stored.
    /// Cancelling the task awaiting it cancels the turn it makes (its
    /// source closed once); the next `turn(...)` through this object
    /// waits for that turn's end rather than being refused. Raises
    /// `settle.TurnRunning` while the session's turn before still runs
    /// (`cancel_turn()` stops it), `settle.StoreError` when the store does
    /// not take the start within the store timeout, `settle.Cancelled`
    /// when `cancel_turn()` stopped this start, `settle.SessionClosed` once
    /// the session is finalized (`SessionClosing` while it closes),
    /// `settle.ShuttingDown` once a shutdown has begun,
    /// `settle.BudgetExhausted` when its budget has no turn left, and
    /// `settle.BadInput` for an `input` over a limit or that is not one,
    /// and at the call for a `source` that cannot give a stream (a list, a
    /// plain iterator). Each is a `settle.Error`.
    #[pyo3(signature = (source, *, input = None, to_chunk = None, idle_timeout = None, first_event_timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn turn<'py>(
        &self,
        py: Python<'py>,
        source: Py<PyAny>,
        input: Option<Bound<'py, PyAny>>,
        to_chunk: Option<Py<PyAny>>,
        idle_timeout: Option<f64>,
        first_event_timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Refused before the kernel sees it: the source is closed all the
        // same, as the kernel closes one it refuses (G4).
        if let Some(refused) = self.refused_if_detached(py, Some(source.bind(py)))? {
            return Ok(refused);
        }
        let checked = (|| {
            check_source(source.bind(py))?;
            let options = self.turn_options(idle_timeout, first_event_timeout)?;
            if let Some(to_chunk) = &to_chunk {
                check_to_chunk(to_chunk.bind(py))?;
            }
            let (handle, here) = self.handle.get()?;
            let request = request(input.as_ref())?;
            let mailbox = here.deliver.mailbox(&running_loop(py)?)?;
            Ok((options, handle, here, request, mailbox, caller_context(py)?))
        })();
        let (options, handle, here, request, mailbox, caller_context) = match checked {
            Ok(checked) => checked,
            Err(error) => return Err(refused(py, source.bind(py), error)),
        };
        let watch = PumpWatch::new(mailbox.clone());
        let provider = Arc::new(PyProvider {
            source: Arc::new(Source {
                mailbox,
                source,
                to_chunk,
                caller_context: std::sync::Mutex::new(Some(caller_context)),
                watch: watch.clone(),
                secrets: self.ties.secrets.clone(),
                close_bound: self.ties.settle,
            }),
            opened: std::sync::atomic::AtomicBool::new(false),
        });
        let (handle, owner, settle) = (handle.clone(), self.ties.owner.clone(), self.ties.settle);
        let starts = self.starts.clone();
        // A cancel of the caller's task (or the awaitable collected) cancels
        // `gone`, at the loop's next pass. The start then gives up wherever
        // it is: dropping the kernel's start cancels the turn it made (G4:
        // its source closed once), before its place is let go, so the next
        // start through this session reaches the kernel after that cancel
        // and waits there for the turn's end, as after any cancel, instead
        // of being refused "a turn is still running", or waiting for the
        // store to answer a start nobody wants (during a stall, a whole
        // store timeout before its own began). A start done just before
        // the cancel hands a turn nobody will read: `Handover` cancels it,
        // and a cancel after the turn was handed over, before the task
        // resumed, cancels it at once (`CancelUnclaimed`).
        // `cancel_turn()` stops it too, handed over or not yet.
        let gone = self
            .stop
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .child_token();
        let at_once = Bound::new(py, CancelUnclaimed)?.into_any();
        // Stopped by `cancel_turn()`: `Cancelled`, unless the session is
        // finalized (G10): a start it stopped would have been refused
        // `SessionClosed` all the same, and that is what the caller must
        // hear (found from outside: a loop read `Cancelled` as a user's
        // stop and went on).
        let closed = handle.clone();
        let cancelled = move || match closed.start_refused_if_closed() {
            Some(refused) => errors::runtime(refused),
            None => errors::Cancelled::new_err("the turn's start was stopped"),
        };
        let stopped = gone.clone();
        awaitable_with(
            py,
            here,
            Some(at_once),
            gone.clone(),
            OnCancel::Finish,
            async move {
                let place = tokio::select! {
                    biased;
                    () = gone.cancelled() => return Err(cancelled()),
                    place = starts.lock_owned() => place,
                };
                // A turn cancelled just before (one never handed over, or one
                // its caller cancelled) may still be settling: the kernel's
                // start waits for its end, which the settle timeout bounds (G5).
                let starting = async {
                    match options {
                        None => handle.run_turn(provider, request).await,
                        Some(options) => handle.run_turn_with(provider, request, options).await,
                    }
                };
                // The select's futures are gone before its arms run: the start
                // is dropped (its turn cancelled) before `place` is.
                let turn = tokio::select! {
                    biased;
                    () = gone.cancelled() => return Err(cancelled()),
                    turn = starting => turn,
                };
                let turn = turn.map_err(errors::turn_refused)?;
                Ok(Handover::new(turn, owner, watch, settle, place, stopped))
            },
        )
    }

    /// Runs `coroutine` as an asyncio task under this session's lifecycle
    /// (G1, G5, G6): when the session (or an ancestor) is cancelled or
    /// finishes, or the shutdown's drain ends, the task is cancelled on its
    /// loop; if it ignores that past the settle timeout it is detached, and
    /// its later writes through a session raise `SessionClosed` (G10). The
    /// session is not finalized while it runs. It runs in a copy of the
    /// caller's `contextvars` context, taken at this call, as a task of
    /// `asyncio.create_task` does: it sees the caller's request ids and
    /// tracing spans, and what it sets reaches neither the caller nor
    /// another task. Resolves to a `settle.Task`;
    /// its awaiter cancelled before it has the task (before the spawn
    /// resolves, or as it does), the task it started is cancelled too.
    /// Its record says how it ended: `completed` when it returned, `failed`
    /// when it raised (a `GeneratorExit` too; the record names the class,
    /// and what it raised goes to its awaiter, never to the store),
    /// `cancelled` when it raised `CancelledError` of its own or was
    /// cancelled. A coroutine closed while it runs (`coroutine.close()`
    /// called as it waits in an `await`) has ended with the close's
    /// `GeneratorExit`: its loop notices within about half a second and
    /// the task ends `failed`, its awaiters given a `GeneratorExit`.
    /// Raises `BadInput` at once for what cannot be
    /// awaited (a function rather than the coroutine its call makes).
    fn spawn<'py>(&self, py: Python<'py>, coroutine: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let awaited = coroutine.bind(py);
        // Refused before the kernel sees it: closed unawaited, as one the
        // kernel refuses, so Python does not warn that it was never awaited.
        if let Some(refused) = self.refused_if_detached(py, Some(awaited))? {
            return Ok(refused);
        }
        // `inspect.isawaitable` for what has no `__await__`: a generator
        // made a coroutine by `types.coroutine` is awaited all the same.
        if !awaited.hasattr(pyo3::intern!(py, "__await__"))?
            && !py
                .import(pyo3::intern!(py, "inspect"))?
                .call_method1(pyo3::intern!(py, "isawaitable"), (awaited,))?
                .is_truthy()?
        {
            return Err(errors::BadInput::new_err(format!(
                "spawn takes a coroutine or another awaitable, not {}; call the coroutine \
                 function: spawn(tool(...))",
                awaited.get_type().name()?
            )));
        }
        let (handle, here) = self.handle.get()?;
        let mailbox = here.deliver.mailbox(&running_loop(py)?)?;
        // Its end's value is held by the `settle.Task` (or by this call
        // until it makes one): nobody else could be told it.
        let caller_context = caller_context(py)?;
        let (shared, given) = TaskShared::new(mailbox, coroutine, caller_context, self.ties.settle);
        let (handle, owner) = (handle.clone(), self.ties.owner.clone());
        // The task of a spawn whose awaiter was cancelled after the call
        // resolved, before it resumed, is cancelled as one it never had.
        let at_once = Bound::new(py, CancelUnclaimed)?.into_any();
        let token = CancellationToken::new();
        awaitable_with(
            py,
            here,
            Some(at_once),
            token,
            OnCancel::Finish,
            async move {
                let theirs = shared.clone();
                let spawned = handle
                    .spawn_with_outcome(move |context| crate::task::run(context, theirs))
                    .await;
                match spawned {
                    // Cancelled if its awaiter is gone before it gets there.
                    Ok(task) => Ok(Spawned::new(PyTask::new(task, owner, shared, given))),
                    Err(error) => {
                        // Never started: closed unawaited, so Python does
                        // not warn that it was never awaited.
                        shared.discard();
                        Err(errors::runtime(error))
                    }
                }
            },
        )
    }

    /// The agent is done: its live descendants are cancelled, settled and
    /// finalized first, then it is (G1). Resolves to its end reason
    /// (`"completed"`, `"failed"`, `"cancelled"`; `"shutdown"` during a
    /// shutdown). Raises `AlreadyFinalized` when it was already finalized
    /// (G2: nothing changed), as `cancel()` does. Cancelling the task that
    /// awaits it stops the wait, not the finish: the session still winds
    /// down and is finalized.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        // Queued to the kernel now, in the order of the calls (G1: a
        // child's turn made after it is seen after it).
        self.call(py, OnCancel::Finish, |handle| {
            let finishing = handle.finish();
            async move {
                finishing
                    .await
                    .map(|reason| reason.as_str())
                    .map_err(errors::runtime)
            }
        })
    }

    /// Cancels the session: its descendants first, then its own turn and
    /// tasks (G1, G5); `immediate=False` lets the running turns of the
    /// session and of its descendants finish (each within the settle
    /// timeout) and starts no more. Raises `AlreadyFinalized` when it was (G2).
    #[pyo3(signature = (*, immediate = true))]
    fn cancel<'py>(&self, py: Python<'py>, immediate: bool) -> PyResult<Bound<'py, PyAny>> {
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        let mode = if immediate {
            CancelMode::Immediate
        } else {
            CancelMode::Graceful
        };
        self.call(py, OnCancel::Finish, move |handle| {
            let cancelling = handle.cancel(mode);
            async move {
                match cancelling.await.map_err(errors::runtime)? {
                    Handled::AlreadyFinalized => Err(errors::already_finalized(handle.id())),
                    _ => Ok(Nothing),
                }
            }
        })
    }

    /// Stops the session's turn (a chat's "stop") without its `Turn`: the
    /// turn running is cancelled (its source closed once, G4), and every
    /// start through this `Session` not yet handed to its caller gives up
    /// and raises `settle.Cancelled`. The cancel reaches the kernel when
    /// this is called, so the next `turn(...)`, awaited right after or
    /// not, waits for the stopped turn's end instead of raising
    /// `settle.TurnRunning`, whatever holds the stopped turn (a task, a
    /// `TaskGroup`, `wait_for`). Resolves to `True` when a running turn was
    /// cancelled, `False` when none ran. Raises `AlreadyFinalized` when the
    /// session was (G2).
    fn cancel_turn<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        let stopping = std::mem::take(
            &mut *self
                .stop
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        stopping.cancel();
        self.call(py, OnCancel::Finish, |handle| {
            let answer = handle.cancel_turn();
            async move {
                match answer.await.map_err(errors::runtime)? {
                    Handled::Applied => Ok(true),
                    Handled::AlreadyFinalized => Err(errors::already_finalized(handle.id())),
                    _ => Ok(false),
                }
            }
        })
    }

    /// Closes the session on a user's request: cancel, then finalize
    /// (`user_close`). Resolves to its end reason; closing a closed session
    /// resolves to the reason it ended with (G2).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        self.call(py, OnCancel::Finish, |handle| {
            let closing = handle.close();
            async move {
                let reason = closing.await.map_err(errors::runtime)?;
                Ok(reason.as_str())
            }
        })
    }

    /// Marks the session as waiting (`kind`: `"input"`, input it asked a
    /// person for; `"delegation"`, work it handed to another session): no
    /// automatic path (idle reap, LRU cap) reclaims it until `release()`.
    /// Returns once the hold is recorded, so a process that adopts the
    /// session after this one crashed keeps it held. Raises `SessionClosed`
    /// once it is finalized, `StoreError` when the store did not take the
    /// hold's record within the store timeout (a lock or a full disk is
    /// tried again until then; refused, it is not held).
    #[pyo3(signature = (kind = Text("input".to_owned())), text_signature = "(self, /, kind='input')")]
    fn hold<'py>(&self, py: Python<'py>, kind: Text) -> PyResult<Bound<'py, PyAny>> {
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        let kind = kind.0.as_str();
        let hold = hold_of(kind)?;
        let (handle, here) = self.handle.get()?;
        let handle = handle.clone();
        finishing(py, here, async move {
            handle.hold(hold).await.map_err(errors::runtime)?;
            Ok(Nothing)
        })
    }

    /// Ends a `hold(kind)`.
    #[pyo3(signature = (kind = Text("input".to_owned())), text_signature = "(self, /, kind='input')")]
    fn release<'py>(&self, py: Python<'py>, kind: Text) -> PyResult<Bound<'py, PyAny>> {
        if let Some(refused) = self.refused_if_detached(py, None)? {
            return Ok(refused);
        }
        let kind = kind.0.as_str();
        let hold = hold_of(kind)?;
        let (handle, here) = self.handle.get()?;
        let handle = handle.clone();
        finishing(py, here, async move {
            handle.release(hold).await.map_err(errors::runtime)?;
            Ok(Nothing)
        })
    }

    /// Resolves to the end reason once the session is finalized.
    fn finalized<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.call(py, OnCancel::Abort, |handle| async move {
            let reason = handle.finalized().await.map_err(errors::runtime)?;
            Ok(reason.as_str())
        })
    }

    /// Resolves to its state as the kernel has it now: `"registered"`,
    /// `"running"`, `"cancelling"`, `"settled"` or `"finalized"`.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.call(py, OnCancel::Abort, |handle| async move {
            let state = handle.state().await.map_err(errors::runtime)?;
            Ok(state.as_str())
        })
    }

    /// Resolves to its turns as the store has them: a list of dicts with
    /// `no`, `outcome`, `started_at`, `ended_at`, `input`, `text`, `error`
    /// (`{"kind", "message"}` or `None`) and `chunks` (`settle.Chunk`s) —
    /// what `settle show` prints.
    fn transcript<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (handle, here) = self.handle.get()?;
        let (kernel, id) = (handle.kernel().clone(), handle.id());
        awaitable(
            py,
            here,
            CancellationToken::new(),
            OnCancel::Abort,
            async move {
                let detail = kernel.session_detail(id).await.map_err(errors::runtime)?;
                Ok(Transcript(detail.turns))
            },
        )
    }

    fn __repr__(&self) -> String {
        format!("<settle.Session {} {:?}>", self.id, self.name)
    }
}

/// A transcript on its way to Python.
struct Transcript(Vec<settle_store::TurnRow>);

impl<'py> IntoPyObject<'py> for Transcript {
    type Target = pyo3::types::PyList;
    type Output = Bound<'py, pyo3::types::PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        crate::reads::transcript(py, &self.0)
    }
}

/// Refuses a turn's source that cannot give a stream (a list, a plain
/// iterator): found from outside, it became a stored turn `failed` with
/// the provider blamed. A callable is called on the loop, and what it
/// returns is checked there.
fn check_source(source: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = source.py();
    let streams = source.is_callable()
        || source.hasattr(pyo3::intern!(py, "__aiter__"))?
        || source.hasattr(pyo3::intern!(py, "__await__"))?;
    if streams {
        return Ok(());
    }
    let kind = source
        .get_type()
        .name()
        .map_or_else(|_| "value".to_owned(), |name| name.to_string());
    Err(crate::errors::BadInput::new_err(format!(
        "the turn's source is a {kind}, which is not an async iterable: give an async \
         iterable (an async generator), an awaitable of one, or a callable that returns \
         either; nothing was started"
    )))
}

/// `to_chunk` is called on each item as it comes and returns its chunks
/// then: an `async def` would return a coroutine for every item, which no
/// turn could read. Refused when the turn is asked for, not item by item.
fn check_to_chunk(to_chunk: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = to_chunk.py();
    let asynchronous = py
        .import(pyo3::intern!(py, "inspect"))?
        .call_method1(pyo3::intern!(py, "iscoroutinefunction"), (to_chunk,))?
        .is_truthy()?;
    if asynchronous {
        return Err(crate::errors::BadInput::new_err(
            "to_chunk is an async function: it is called on each item and must return the \
             item's chunks at once; make it a plain `def`",
        ));
    }
    Ok(())
}

/// A copy of the calling task's `contextvars` context, for the work a
/// `spawn()` or a `turn()` starts to run in: it is started later, from the
/// drain of the loop's mailbox, whose context is nobody's, and request
/// ids, tracing spans and tenants must reach it as they reach a task the
/// caller's own `create_task` makes.
fn caller_context(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(py
        .import(pyo3::intern!(py, "contextvars"))?
        .call_method0(pyo3::intern!(py, "copy_context"))?
        .unbind())
}
