//! The shutdown signals on an asyncio loop (`Kernel.install_signal_handlers`):
//! SIGINT, SIGTERM and SIGHUP begin the graceful shutdown of every kernel
//! that installed them on that loop (G9), a later one skips the drain, and
//! once every such kernel has stopped a signal gets its default action back.
//!
//! A loop has one handler per signal (`loop.add_signal_handler` replaces
//! the one before), so one handler per loop serves every kernel installed
//! on it: it is found again through `_bridge.SIGNAL_HANDLERS`, keyed by the
//! loop, and a second kernel joins it instead of silently taking the
//! signals from the first.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use settle_runtime::{Kernel, WeakKernel};

use crate::awaitable::{bridge, running_loop};
use crate::errors;
use crate::process::Here;

const SIGNALS: [&str; 3] = ["SIGINT", "SIGTERM", "SIGHUP"];

/// One kernel a loop's signals reach.
struct Signalled {
    kernel: WeakKernel,
    drain: Duration,
    /// The first signal it received (0: none yet).
    first: Arc<AtomicU32>,
    /// Set once the kernel has stopped: a signal is no longer its.
    stopped: Arc<AtomicBool>,
}

/// Installs the shutdown signals' handler on the running loop for `kernel`
/// (see the module doc).
pub(crate) fn install(
    py: Python<'_>,
    kernel: &Kernel,
    here: &Here,
    drain: Duration,
    first: Arc<AtomicU32>,
) -> PyResult<()> {
    let event_loop = running_loop(py)?;
    let stopped = Arc::new(AtomicBool::new(false));
    let (watched, flag) = (kernel.stopped(), stopped.clone());
    here.runtime.spawn(async move {
        watched.await;
        flag.store(true, Ordering::Release);
    });
    let signalled = Signalled {
        kernel: kernel.downgrade(),
        drain,
        first,
        stopped,
    };
    let handlers = bridge(py)?.getattr(pyo3::intern!(py, "SIGNAL_HANDLERS"))?;
    let existing = handlers.call_method1(pyo3::intern!(py, "get"), (&event_loop,))?;
    let handler = match existing.cast::<SignalHandler>() {
        Ok(handler) => handler.clone().unbind(),
        Err(_) => Py::new(
            py,
            SignalHandler {
                kernels: Mutex::default(),
                event_loop: event_loop.clone().unbind(),
            },
        )?,
    };
    let signal = py.import(pyo3::intern!(py, "signal"))?;
    // (Again) for every signal: one may have been given back its default.
    for name in SIGNALS {
        let number = signal.getattr(name)?;
        event_loop
            .call_method1(
                pyo3::intern!(py, "add_signal_handler"),
                (number.clone(), handler.clone_ref(py), number),
            )
            .map_err(|error| {
                errors::Error::new_err(format!(
                    "cannot install the signal handlers: {error} (call install_signal_handlers \
                     from the main thread, inside its running loop)"
                ))
            })?;
    }
    handler.get().entries().push(signalled);
    // A loop that cannot be weakly referenced keeps no record: a second
    // kernel's install then replaces this one's handler, as before.
    let _ = handlers.set_item(&event_loop, &handler);
    Ok(())
}

/// The handler of the shutdown signals on one loop.
///
/// Once every kernel it serves has stopped (or is gone), a signal gets its
/// default action back: a program that hangs after its shutdown is still
/// ended by SIGTERM or SIGINT, as the runtime's own signal handling does.
#[pyclass(module = "settle._settle", frozen)]
pub(crate) struct SignalHandler {
    kernels: Mutex<Vec<Signalled>>,
    event_loop: Py<PyAny>,
}

impl SignalHandler {
    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Signalled>> {
        self.kernels.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl SignalHandler {
    fn __call__(&self, py: Python<'_>, number: u32) -> PyResult<()> {
        let mut reached = 0;
        for signalled in self.entries().iter() {
            let kernel = signalled
                .kernel
                .upgrade()
                .filter(|_| !signalled.stopped.load(Ordering::Acquire));
            let Some(kernel) = kernel else {
                continue;
            };
            reached += 1;
            if signalled
                .first
                .compare_exchange(0, number, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
                && !kernel.is_shutting_down()
            {
                kernel.begin_shutdown(signalled.drain);
            } else {
                // A second signal, or the first during a shutdown the
                // program began: the rest of the drain is skipped.
                kernel.skip_drain();
            }
        }
        if reached == 0 {
            bridge(py)?.call_method1(
                pyo3::intern!(py, "default_action"),
                (self.event_loop.bind(py), number),
            )?;
        }
        Ok(())
    }
}
