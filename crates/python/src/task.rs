//! A Python coroutine under a session's lifecycle: `session.spawn(coro)`.
//!
//! The kernel's task (a Rust future on the runtime) starts the coroutine as
//! an asyncio task on the caller's loop and waits for it to report. When the
//! kernel cancels the work (its session or an ancestor is cancelled or
//! finishes, the drain ends, `Task.cancel()`), it calls `task.cancel()` on
//! that loop; a coroutine that swallows its `CancelledError` is detached at
//! the settle deadline (G5), and from then on every write it makes through a
//! session raises `settle.SessionClosed` (G10): the asyncio task carries its
//! control in a context variable, and each writing call checks it.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::{PyTraverseError, PyVisit};
use settle_runtime::{TaskContext, TaskHandle};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::awaitable::{awaitable, bridge, OnCancel};
use crate::deliver::{Landing, Mailbox};
use crate::errors;
use crate::process::{ForkSafe, Owner};
use crate::stranded::Stranded;
use crate::task_end::{Ended, Given, TaskEnd};

#[derive(Default)]
struct Control {
    task: Option<Py<PyAny>>,
    cancel_requested: bool,
}

/// A coroutine not started yet, and the context it will run in: the copy
/// of the caller's `contextvars` taken at `spawn()` (request ids, tracing
/// spans), as an asyncio task runs in a copy of its creator's.
struct Unstarted {
    coroutine: Py<PyAny>,
    caller_context: Py<PyAny>,
}

/// What the kernel's side and the asyncio task share.
pub(crate) struct Shared {
    /// The mailbox of the caller's loop, where the coroutine runs.
    mailbox: Arc<Mailbox>,
    /// Taken by its asyncio task's start, or by `discard`.
    coroutine: Mutex<Option<Unstarted>>,
    /// Where what the coroutine returned or raised goes: its
    /// `settle.Task`'s, held weakly here. This is held by the asyncio
    /// task's control, which the task's frames and context hold, and what
    /// the coroutine raised holds those frames (its traceback): held
    /// strongly here, that cycle went through Rust, where the collector
    /// cannot see it, and every task that raised was kept for good once
    /// its `settle.Task` was let go of. The `settle.Task` holds it and
    /// shows it to the collector.
    given: Weak<Given>,
    ended: Mutex<Option<oneshot::Sender<Ended>>>,
    control: Mutex<Control>,
    /// Cancelled when the kernel detaches the task (its write access).
    context: Mutex<Option<TaskContext>>,
    /// The kernel's settle timeout (G5): what its loop's end gives the
    /// coroutine to unwind.
    settle: Duration,
}

impl Shared {
    /// What the kernel's side and the asyncio task of `coroutine` share,
    /// and where what it gives goes (for its `settle.Task` to hold: see
    /// `given`); the coroutine runs in `caller_context`.
    pub fn new(
        mailbox: Arc<Mailbox>,
        coroutine: Py<PyAny>,
        caller_context: Py<PyAny>,
        settle: Duration,
    ) -> (Arc<Self>, Arc<Given>) {
        let given = Arc::new(Given::default());
        let shared = Arc::new(Shared {
            mailbox,
            coroutine: Mutex::new(Some(Unstarted {
                coroutine,
                caller_context,
            })),
            given: Arc::downgrade(&given),
            ended: Mutex::new(None),
            control: Mutex::new(Control::default()),
            context: Mutex::new(None),
            settle,
        });
        let stranded: Weak<dyn Stranded> = Arc::downgrade(&shared) as Weak<Shared>;
        shared.mailbox.watch(stranded);
        (shared, given)
    }

    /// Hands what the coroutine gave to its `settle.Task`; nothing when
    /// nobody holds that any more (nobody could be told).
    fn give(&self, give: impl FnOnce(&Given)) {
        if let Some(given) = self.given.upgrade() {
            give(&given);
        }
    }

    /// Closes the coroutine unawaited when it never started (the spawn was
    /// refused), so Python does not warn that it was never awaited.
    pub fn discard(&self) {
        let Some(unstarted) = self.coroutine.lock().ok().and_then(|mut c| c.take()) else {
            return;
        };
        self.mailbox.post(move |py, _| {
            let _ = unstarted.coroutine.bind(py).call_method0("close");
        });
    }

    fn report(&self, ended: Ended) {
        if let Some(sender) = self.ended.lock().ok().and_then(|mut e| e.take()) {
            let _ = sender.send(ended);
        }
    }

    /// The asyncio task is done: nothing will cancel it any more, and it is
    /// let go of. It holds this control in its context, so keeping it here
    /// made a cycle through Rust that the collector cannot see: every
    /// spawned task stayed alive, its result with it.
    fn let_go_of_task(&self) {
        let task = self.control.lock().ok().and_then(|mut c| c.task.take());
        drop(task);
    }

    fn request_cancel(self: &Arc<Self>) {
        match self.control.lock() {
            Ok(mut control) if !control.cancel_requested => control.cancel_requested = true,
            _ => return,
        }
        let shared = self.clone();
        self.mailbox.post(move |py, landing| {
            // A closed loop runs nothing more: the kernel detaches the task
            // at the settle deadline, and the task is let go of here (it
            // holds this control: kept, it would never be collected).
            if let Landing::Closed = landing {
                shared.let_go_of_task();
                return;
            }
            let task = match shared.control.lock() {
                Ok(control) => control.task.as_ref().map(|t| t.bind(py).clone()),
                Err(_) => None,
            };
            // Not attached yet: the task sees the request when it does.
            if let Some(task) = task {
                let _ = task.call_method0(pyo3::intern!(py, "cancel"));
            }
        });
    }
}

impl crate::let_go::HoldsTask for Shared {
    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }

    fn task<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        let control = self.control.lock().ok()?;
        control.task.as_ref().map(|t| t.bind(py).clone())
    }
}

impl Stranded for Shared {
    /// Reports the coroutine cancelled when its loop closed with its
    /// asyncio task still pending: it will never run again, so nothing else
    /// would report it (see [`Mailbox::loop_closed`]). The task is let go
    /// of, so that the collector frees it with what its coroutine holds.
    fn end_if_loop_closed(&self, py: Python<'_>) {
        let unreported = self.ended.lock().is_ok_and(|ended| ended.is_some());
        if unreported && self.mailbox.loop_closed(py) {
            self.report(Ended::Cancelled);
            self.let_go_of_task();
        }
    }
}

/// The kernel's side of a settle task, handed to its asyncio task.
#[pyclass(module = "settle._settle", frozen)]
pub(crate) struct TaskControl {
    shared: Arc<Shared>,
}

#[pymethods]
impl TaskControl {
    /// The asyncio task runs its first step: a cancel asked for from now
    /// on reaches it. Returns whether one was asked for already: the task
    /// then closes its coroutine unawaited and reports itself cancelled.
    /// Only the task itself attaches, once it runs: cancelled before its
    /// first step, it would never report, and its session would wait for
    /// the settle deadline.
    fn attach(&self, task: Py<PyAny>) -> bool {
        match self.shared.control.lock() {
            Ok(mut control) => {
                control.task = Some(task);
                control.cancel_requested
            }
            Err(_) => true,
        }
    }

    fn finished(&self, result: Py<PyAny>) {
        self.shared.give(|given| given.returned(result));
        self.shared.report(Ended::Returned);
        self.shared.let_go_of_task();
    }

    fn failed(&self, error: Bound<'_, PyAny>) {
        let class = crate::task_end::class_name(&error);
        self.shared.give(|given| given.raised(&error));
        self.shared.report(Ended::Raised(class));
        self.shared.let_go_of_task();
    }

    fn cancelled(&self) {
        self.shared.report(Ended::Cancelled);
        self.shared.let_go_of_task();
    }

    /// Whether the task was detached: its writes are refused.
    fn is_revoked(&self) -> bool {
        self.shared
            .context
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(TaskContext::is_revoked))
            .unwrap_or(false)
    }
}

/// `SessionClosed` when the asyncio task calling is a detached settle task.
pub(crate) fn check_write(py: Python<'_>) -> PyResult<()> {
    let current = bridge(py)?.getattr("CURRENT_TASK")?.call_method0("get")?;
    if let Ok(control) = current.cast::<TaskControl>() {
        if control.get().is_revoked() {
            return Err(errors::SessionClosed::new_err(
                "this task ignored its cancellation past the settle timeout and was detached; \
                 what it asks of the kernel is refused (its write access is revoked)",
            ));
        }
    }
    Ok(())
}

/// The kernel's task of a spawned coroutine.
pub(crate) async fn run(context: TaskContext, shared: Arc<Shared>) -> Ended {
    let (sender, mut ended) = oneshot::channel();
    if let Ok(mut slot) = shared.ended.lock() {
        *slot = Some(sender);
    }
    if let Ok(mut slot) = shared.context.lock() {
        *slot = Some(context.clone());
    }
    let starting = shared.clone();
    shared.mailbox.post(move |py, landing| {
        let started = (|| -> PyResult<()> {
            let unstarted = starting.coroutine.lock().ok().and_then(|mut c| c.take());
            let Some(Unstarted {
                coroutine,
                caller_context,
            }) = unstarted
            else {
                return Ok(());
            };
            let Landing::Loop(event_loop) = landing else {
                // Closed unawaited, so Python does not warn that it never ran.
                let _ = coroutine.bind(py).call_method0("close");
                return Err(errors::error(
                    "the task's event loop is closed: its coroutine cannot run",
                ));
            };
            let control = Py::new(
                py,
                TaskControl {
                    shared: starting.clone(),
                },
            )?;
            let bound = starting.settle.as_secs_f64();
            bridge(py)?.call_method1(
                "start_task",
                (
                    event_loop,
                    coroutine.bind(py),
                    control,
                    bound,
                    caller_context,
                ),
            )?;
            Ok(())
        })();
        if let Err(error) = started {
            let error = error.into_value(py);
            let error = error.bind(py).as_any();
            let class = crate::task_end::class_name(error);
            starting.give(|given| given.raised(error));
            starting.report(Ended::Raised(class));
        }
    });
    tokio::select! {
        ended = &mut ended => return ended.unwrap_or(Ended::Cancelled),
        () = context.cancelled() => shared.request_cancel(),
    }
    // The coroutine has the settle timeout to unwind; the kernel drops this
    // future at the deadline (the task is detached): then its loop lets go
    // of it, so that the loop's end does not wait for it.
    let let_go = crate::let_go::LetGoUnlessEnded::new(shared.clone());
    let ended = ended.await.unwrap_or(Ended::Cancelled);
    let_go.ended();
    ended
}

/// A task on its way to Python, as `spawn()` resolves to it: cancelled if
/// it never gets there (the awaiter of `spawn()` was cancelled or collected
/// first, or its loop closed), for nobody could join or cancel it then.
pub(crate) struct Spawned(Option<PyTask>);

impl Spawned {
    pub fn new(task: PyTask) -> Self {
        Spawned(Some(task))
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            // Only a forked child fails here, and its parent's task is not
            // its own to cancel.
            let _ = task.cancel();
        }
    }
}

impl<'py> IntoPyObject<'py> for Spawned {
    type Target = PyTask;
    type Output = Bound<'py, PyTask>;
    type Error = PyErr;

    fn into_pyobject(mut self, py: Python<'py>) -> PyResult<Self::Output> {
        match self.0.take() {
            Some(task) => Bound::new(py, task),
            None => Err(errors::error("this task was already handed over")),
        }
    }
}

/// A coroutine running under a session: await it (or `join()`) for its
/// result.
#[pyclass(name = "Task", module = "settle", frozen)]
pub(crate) struct PyTask {
    end: ForkSafe<Arc<TaskEnd>>,
    work: u32,
    /// What it shares with its asyncio task (for a loop that closed).
    shared: Arc<Shared>,
    /// What its coroutine gave, shown to the collector (`__traverse__`).
    given: Arc<Given>,
}

impl PyTask {
    pub fn new(
        handle: TaskHandle<Ended>,
        owner: Owner,
        shared: Arc<Shared>,
        given: Arc<Given>,
    ) -> Self {
        let work = handle.work().no;
        PyTask {
            end: ForkSafe::new(Arc::new(TaskEnd::new(handle, given.clone())), owner),
            work,
            shared,
            given,
        }
    }
}

#[pymethods]
impl PyTask {
    /// The task's number within its session.
    #[getter]
    fn no(&self) -> u32 {
        self.work
    }

    /// Cancels the task: its coroutine gets `CancelledError` on its loop and
    /// the settle timeout to unwind, then it is detached (G5).
    pub(crate) fn cancel(&self) -> PyResult<()> {
        let (end, _) = self.end.get()?;
        end.cancel();
        Ok(())
    }

    /// Waits for the coroutine's result: what it returned, or what it
    /// raised. Raises `settle.Cancelled` when it was cancelled,
    /// `settle.Detached` when it was detached at the settle deadline,
    /// `settle.ShuttingDown` when the kernel stopped first. As an
    /// `asyncio.Task`, it may be awaited by several callers at once and
    /// again after it ended: each gets the same value, or the same
    /// exception it raised (cancelled, detached or stopped, each gets an
    /// exception of that class of its own, as each awaiter of a cancelled
    /// `asyncio.Task` gets its own `CancelledError`). Once nobody holds
    /// it, it is collected with what it kept, cycles included.
    ///
    /// As with an `asyncio.Task`, cancelling the asyncio task that awaits
    /// it cancels the settle task too (its coroutine gets `CancelledError`
    /// and the settle timeout to unwind, G5): a caller that is cancelled
    /// leaves nothing it was waiting for running. `asyncio.shield()` the
    /// awaitable to let the task go on.
    fn join<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (end, here) = self.end.get()?;
        self.shared.end_if_loop_closed(py);
        let end = end.clone();
        let cancel = CancellationToken::new();
        let cancelled = cancel.clone();
        awaitable(py, here, cancel, OnCancel::Finish, async move {
            tokio::select! {
                told = end.told() => Ok(told),
                () = cancelled.cancelled() => {
                    // Its awaiter was cancelled: so is the task; another
                    // awaiter is told how it ended.
                    end.cancel();
                    Err(errors::Cancelled::new_err("the task's awaiter was cancelled"))
                }
            }
        })
    }

    /// Waits for the coroutine's result, as `join()` does.
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.join(py)?.call_method0("__await__")
    }

    /// Shows the collector what the task keeps (see `TaskEnd::traverse`).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.given.traverse(&visit)
    }

    /// `settle.Task[int]`: the type of a task whose coroutine returns an
    /// `int`, for annotations (as `asyncio.Task[int]`).
    #[classmethod]
    fn __class_getitem__<'py>(
        cls: &Bound<'py, PyType>,
        item: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        cls.py()
            .import("types")?
            .getattr("GenericAlias")?
            .call1((cls, item))
    }
}
