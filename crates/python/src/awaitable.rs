//! Rust futures as asyncio awaitables: the bridge every kernel call goes
//! through.
//!
//! Each call makes an `asyncio.Future` on the caller's running loop and runs
//! the Rust future on the runtime's threads. When that ends, its result is
//! posted to the loop's mailbox (`deliver.rs`) and set on the future by the
//! loop's own thread, in a batch with whatever else arrived meanwhile (one
//! wake of the loop per batch); the GIL is never held while the kernel or
//! the store is waited on. Three things make it safe where a plain
//! `future_into_py` is not:
//!
//! - **Cancel reaches Rust.** A done callback sees the asyncio future
//!   cancelled and cancels a token the Rust side selects on (a turn's
//!   start gives up where it is and lets go of its place among the
//!   session's starts only once the turn it made is cancelled; other calls
//!   that must finish to be safe run to their end and drop what they made,
//!   which a result nobody reads cancels). A done
//!   callback runs at the loop's next pass; a read of a turn's next chunk
//!   cannot wait that long, since its caller may start the session's next
//!   turn in the same step, so its future's own `cancel()` cancels the turn
//!   before it returns ([`awaitable_with`], `_bridge.CancelsAtOnce`).
//! - **A garbage-collected awaitable does not leave work running.** The Rust
//!   side holds only a weak reference to the future; the future holds the
//!   callback, and the callback's drop cancels the token when it never ran.
//! - **A closed loop is not an error.** A result that arrives after its loop
//!   closed is dropped, not raised as `RuntimeError: Event loop is closed`
//!   from a thread nobody watches.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyGeneratorExit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule, PySet, PyType, PyWeakrefReference};
use pyo3::IntoPyObjectExt;
use tokio_util::sync::CancellationToken;

use crate::deliver::Landing;
use crate::process::Here;

/// What a cancel of the asyncio future does to the Rust future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnCancel {
    /// Drop it at once: it holds nothing that dropping leaves half done.
    Abort,
    /// Let it finish (the token is still cancelled, for it to look at); its
    /// result is then dropped, and with it whatever it made.
    Finish,
}

/// The done callback of a bridged future: it forwards a cancel, and its
/// drop cancels too when the future was never done (it was collected). A
/// future the kernel resolves has it taken off first (see [`resolve`]): a
/// done callback is a handle of its own on the loop, one per kernel call.
#[pyclass(frozen, weakref)]
struct CancelOnDone {
    token: CancellationToken,
    called: AtomicBool,
}

#[pymethods]
impl CancelOnDone {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        self.called.store(true, Ordering::Release);
        forget(future);
        if future.call_method0("cancelled")?.is_truthy()? {
            self.token.cancel();
        }
        Ok(())
    }
}

impl Drop for CancelOnDone {
    fn drop(&mut self) {
        if !self.called.load(Ordering::Acquire) {
            self.token.cancel();
        }
    }
}

static BRIDGE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The bridge's `_AWAITED`: the calls a task waits on, each keeping its
/// task alive until it is done (`_bridge.Call.add_done_callback`).
static AWAITED: PyOnceLock<Py<PySet>> = PyOnceLock::new();

/// Lets go of `future` in `_AWAITED` once it is done, or will never be
/// (its loop closed): from here rather than a done callback of its own,
/// which would cost every call a scheduled handle.
fn forget(future: &Bound<'_, PyAny>) {
    let py = future.py();
    let awaited = AWAITED.get_or_try_init(py, || {
        bridge(py)?
            .getattr(intern!(py, "_AWAITED"))?
            .cast_into::<PySet>()
            .map(Bound::unbind)
            .map_err(PyErr::from)
    });
    if let Ok(awaited) = awaited {
        let _ = awaited.bind(py).discard(future);
    }
}

/// What a call that gives nothing resolves to: `None`, as its stub says
/// (`()` would be the empty tuple).
pub(crate) struct Nothing;

impl<'py> IntoPyObject<'py> for Nothing {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(py.None().into_bound(py))
    }
}

/// The package's Python half (`settle/_bridge.py`).
pub(crate) fn bridge(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    BRIDGE
        .get_or_try_init(py, || py.import("settle._bridge").map(Bound::unbind))
        .map(|module| module.bind(py))
}

/// `CO_COROUTINE`, the flag of a native coroutine's code (`inspect`).
const CO_COROUTINE: u32 = 0x80;

/// Whether an `__aexit__` called with the exception class `kind` and
/// `traceback` is the close of the coroutine in the block: a
/// `GeneratorExit` left by a coroutine's frame (its `close()`, which the
/// collector calls on a coroutine its closed loop left pending, whatever
/// loop runs meanwhile, and the interpreter's exit), or one with no event
/// loop running in this thread. Nothing can be awaited there (a
/// coroutine being closed that suspends "ignored GeneratorExit"), so the
/// exit must make no awaitable of a loop, nor one that suspends. (An
/// async generator's `aclose()` may await: its exits wait as ever.)
pub(crate) fn closing_coroutine(
    py: Python<'_>,
    kind: &Bound<'_, PyAny>,
    traceback: &Bound<'_, PyAny>,
) -> bool {
    let generator_exit = kind
        .cast::<PyType>()
        .is_ok_and(|kind| kind.is_subclass_of::<PyGeneratorExit>().unwrap_or(false));
    if !generator_exit {
        return false;
    }
    let flags = traceback
        .getattr(intern!(py, "tb_frame"))
        .and_then(|frame| frame.getattr(intern!(py, "f_code")))
        .and_then(|code| code.getattr(intern!(py, "co_flags")))
        .and_then(|flags| flags.extract::<u32>());
    flags.is_ok_and(|flags| flags & CO_COROUTINE != 0) || running_loop(py).is_err()
}

/// An awaitable done at once that needs no event loop (a coroutine that
/// returns `None` at its first step): what an exit off any loop gives.
pub(crate) fn done_at_once(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    bridge(py)?.call_method0(intern!(py, "nothing"))
}

/// The running event loop of the calling thread.
pub(crate) fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let asyncio = py.import("asyncio")?;
    asyncio.call_method0("get_running_loop").map_err(|error| {
        // asyncio's bare `RuntimeError` names no call and no remedy (found
        // from outside: `asyncio.run(settle.Kernel.open(...))`, which
        // type-checks, failed with it).
        if error.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py) {
            crate::errors::error(
                "settle's calls run on the event loop of the code that awaits them: call \
                 and await them inside an `async def` run by asyncio (`asyncio.run(main())`, \
                 with `kernel = await settle.Kernel.open(...)` in `main`), not from plain code",
            )
        } else {
            error
        }
    })
}

/// An empty context for the done callbacks of bridged futures: they read
/// no context variable, so they need no copy of the caller's.
static NO_CONTEXT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn no_context(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    NO_CONTEXT
        .get_or_try_init(py, || {
            py.import("contextvars")?
                .getattr("Context")?
                .call0()
                .map(Bound::unbind)
        })
        .map(|context| context.bind(py))
}

/// [`awaitable`] for work that nothing cancels from outside and that runs
/// to its end even when the awaitable is cancelled (its result is then
/// dropped): most kernel calls.
pub(crate) fn finishing<'py, F, T>(
    py: Python<'py>,
    here: &Here,
    work: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    awaitable(py, here, CancellationToken::new(), OnCancel::Finish, work)
}

/// An awaitable on the running loop that raises `error` when awaited: a
/// refusal said where every other one is, so that
/// `gather(..., return_exceptions=True)` and helpers handed the call see it.
pub(crate) fn raising<'py>(
    py: Python<'py>,
    here: &Here,
    error: PyErr,
) -> PyResult<Bound<'py, PyAny>> {
    finishing(py, here, async move { Err::<(), PyErr>(error) })
}

/// An awaitable on the running loop that resolves with what `work` gives
/// (converted to Python), or raises its error. `token` is cancelled when
/// the awaitable is cancelled or collected before it is done.
pub(crate) fn awaitable<'py, F, T>(
    py: Python<'py>,
    here: &Here,
    token: CancellationToken,
    on_cancel: OnCancel,
    work: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    awaitable_with(py, here, None, token, on_cancel, work)
}

/// [`awaitable`], with `at_once` (when given) called by the future's own
/// `cancel()` before it returns, on the loop's thread: for a cancel that
/// must reach the kernel before its caller's next line does (a turn's next
/// chunk, whose cancel cancels the turn). Without it, a cancel is seen by
/// the done callback, at the loop's next pass.
pub(crate) fn awaitable_with<'py, F, T>(
    py: Python<'py>,
    here: &Here,
    at_once: Option<Bound<'py, PyAny>>,
    token: CancellationToken,
    on_cancel: OnCancel,
    work: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = running_loop(py)?;
    let mailbox = here.deliver.mailbox(&event_loop)?;
    let future = match at_once {
        None => call(py, &event_loop)?,
        Some(at_once) => cancels_at_once(py, &event_loop, at_once)?,
    };
    let callback = Bound::new(
        py,
        CancelOnDone {
            token: token.clone(),
            called: AtomicBool::new(false),
        },
    )?;
    let options = PyDict::new(py);
    options.set_item(intern!(py, "context"), no_context(py)?)?;
    future.call_method(
        intern!(py, "add_done_callback"),
        (&callback,),
        Some(&options),
    )?;
    let weak = PyWeakrefReference::new(&future)?.unbind();
    let on_done = PyWeakrefReference::new(&callback)?.unbind();
    here.runtime.spawn(async move {
        let result = match on_cancel {
            OnCancel::Finish => work.await,
            OnCancel::Abort => tokio::select! {
                result = work => result,
                () = token.cancelled() => return,
            },
        };
        mailbox.post(move |py, landing| match landing {
            Landing::Loop(_) => resolve(py, &weak, &on_done, result),
            // Never to be done: nothing keeps it for a task any more.
            Landing::Closed => {
                if let Some(future) = weak.bind(py).upgrade() {
                    forget(&future);
                }
            }
        });
    });
    Ok(future)
}

static CALL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A plain kernel call's future on `event_loop`: `_bridge.Call`, which
/// `asyncio.create_task` takes as it takes a coroutine.
fn call<'py>(py: Python<'py>, event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let class = CALL.get_or_try_init(py, || {
        bridge(py)?.getattr(intern!(py, "Call")).map(Bound::unbind)
    })?;
    let options = PyDict::new(py);
    options.set_item(intern!(py, "loop"), event_loop)?;
    class.bind(py).call((), Some(&options))
}

/// A future on `event_loop` whose own `cancel()` calls `at_once` before it
/// returns, done or not (`_bridge.CancelsAtOnce`).
fn cancels_at_once<'py>(
    py: Python<'py>,
    event_loop: &Bound<'py, PyAny>,
    at_once: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = PyDict::new(py);
    options.set_item(intern!(py, "loop"), event_loop)?;
    let future = bridge(py)?
        .getattr(intern!(py, "CancelsAtOnce"))?
        .call((), Some(&options))?;
    future.setattr(intern!(py, "_on_cancel"), at_once)?;
    Ok(future)
}

/// What a read that needs no wait yields to its task to pass the loop
/// once: a future that is done already (the task resumes at the loop's
/// next pass, as after a bare `yield`), and whose `cancel()`, which is what
/// cancelling the task meanwhile calls, calls `at_once` before it returns.
pub(crate) fn pass_once<'py>(
    py: Python<'py>,
    at_once: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let future = cancels_at_once(py, &running_loop(py)?, at_once)?;
    future.call_method1(intern!(py, "set_result"), (py.None(),))?;
    // What `Future.__await__` sets before it yields: the task waits on it.
    future.setattr(intern!(py, "_asyncio_future_blocking"), true)?;
    Ok(future)
}

/// Hands `result` to the future `weak` names, on its loop's thread; nothing
/// when the future was collected or is already done (cancelled). Its
/// [`CancelOnDone`] (`on_done`) is taken off it first, marked as called: a
/// future resolved here was not cancelled, so the callback has nothing to
/// do, and left on it, it would be scheduled as a handle of its own.
fn resolve<T>(
    py: Python<'_>,
    weak: &Py<PyWeakrefReference>,
    on_done: &Py<PyWeakrefReference>,
    result: PyResult<T>,
) where
    T: for<'a> IntoPyObject<'a>,
{
    let Some(future) = weak.bind(py).upgrade() else {
        return;
    };
    let done = future
        .call_method0(intern!(py, "done"))
        .and_then(|done| done.is_truthy());
    if !matches!(done, Ok(false)) {
        return;
    }
    if let Some(callback) = on_done.bind(py).upgrade() {
        if let Ok(callback) = callback.cast::<CancelOnDone>() {
            callback.get().called.store(true, Ordering::Release);
            // Were this to fail, the callback runs, finds the future not
            // cancelled, and does nothing.
            let _ = future.call_method1(intern!(py, "remove_done_callback"), (callback,));
        }
    }
    let set = match result.and_then(|value| value.into_py_any(py)) {
        Ok(value) => future.call_method1(intern!(py, "set_result"), (value,)),
        Err(error) => future.call_method1(intern!(py, "set_exception"), (error.into_value(py),)),
    };
    forget(&future);
    // Only an `InvalidStateError` can fail here, and the future then has
    // its result already: nothing is lost.
    let _ = set;
}

/// An awaitable already resolved with `value` (for `__aenter__`).
pub(crate) fn ready<'py>(py: Python<'py>, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let future = call(py, &running_loop(py)?)?;
    future.call_method1("set_result", (value,))?;
    Ok(future)
}
