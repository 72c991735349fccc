//! Rust futures as asyncio awaitables: the bridge every kernel call goes
//! through.
//!
//! Each call makes an `asyncio.Future` on the caller's running loop and runs
//! the Rust future on the runtime's threads. When that ends, the deliverer
//! (`deliver.rs`) schedules the result onto the loop with
//! `call_soon_threadsafe`; the GIL is never held while the kernel or the
//! store is waited on. Three things make it safe where a plain
//! `future_into_py` is not:
//!
//! - **Cancel reaches Rust.** A done callback sees the asyncio future
//!   cancelled and cancels a token the Rust side selects on (or, for a call
//!   that must finish to be safe, such as a turn's start, that the Rust side
//!   checks once it is done: the turn it then drops is cancelled).
//! - **A garbage-collected awaitable does not leave work running.** The Rust
//!   side holds only a weak reference to the future; the future holds the
//!   callback, and the callback's drop cancels the token when it never ran.
//! - **A closed loop is not an error.** A result that arrives after its loop
//!   closed is dropped, not raised as `RuntimeError: Event loop is closed`
//!   from a thread nobody watches.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyWeakrefReference};
use pyo3::IntoPyObjectExt;
use tokio_util::sync::CancellationToken;

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
/// drop cancels too when the future was never done (it was collected).
#[pyclass(frozen)]
struct CancelOnDone {
    token: CancellationToken,
    called: AtomicBool,
}

#[pymethods]
impl CancelOnDone {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        self.called.store(true, Ordering::Release);
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

/// The package's Python half (`settle/_bridge.py`).
pub(crate) fn bridge(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    BRIDGE
        .get_or_try_init(py, || py.import("settle._bridge").map(Bound::unbind))
        .map(|module| module.bind(py))
}

/// The running event loop of the calling thread.
pub(crate) fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("asyncio")?.call_method0("get_running_loop")
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
    let event_loop = running_loop(py)?;
    let future = event_loop.call_method0("create_future")?;
    let callback = Bound::new(
        py,
        CancelOnDone {
            token: token.clone(),
            called: AtomicBool::new(false),
        },
    )?;
    future.call_method1("add_done_callback", (callback,))?;
    let weak = PyWeakrefReference::new(&future)?.into_any().unbind();
    let event_loop = event_loop.unbind();
    let deliver = here.deliver.clone();
    here.runtime.spawn(async move {
        let result = match on_cancel {
            OnCancel::Finish => work.await,
            OnCancel::Abort => tokio::select! {
                result = work => result,
                () = token.cancelled() => return,
            },
        };
        deliver.send(move |py| resolve(py, &event_loop, &weak, result));
    });
    Ok(future)
}

/// Hands `result` to the future `weak` names, on its loop; nothing when the
/// future was collected or the loop is closed.
fn resolve<T>(py: Python<'_>, event_loop: &Py<PyAny>, weak: &Py<PyAny>, result: PyResult<T>)
where
    T: for<'a> IntoPyObject<'a>,
{
    let Ok(future) = weak.bind(py).call0() else {
        return;
    };
    if future.is_none() {
        return;
    }
    let (ok, value) = match result.and_then(|value| value.into_py_any(py)) {
        Ok(value) => (true, value),
        Err(error) => (false, error.into_value(py).into_any()),
    };
    let Ok(bridge) = bridge(py) else {
        return;
    };
    let Ok(set) = bridge.getattr("resolve") else {
        return;
    };
    // A closed loop raises here; the result has nobody left to reach.
    let _ = event_loop
        .bind(py)
        .call_method1("call_soon_threadsafe", (set, future, ok, value));
}

/// An awaitable already resolved with `value` (for `__aenter__`).
pub(crate) fn ready<'py>(py: Python<'py>, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let future = running_loop(py)?.call_method0("create_future")?;
    future.call_method1("set_result", (value,))?;
    Ok(future)
}
