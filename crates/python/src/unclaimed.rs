//! [`CancelUnclaimed`]: what the future of a call that makes work (a
//! turn's start, a spawn) calls from its own `cancel()` (see
//! `_bridge.CancelsAtOnce`), so that work made for a caller who will never
//! have it is cancelled.
//!
//! A call not done yet needs nothing here: its result, never handed over,
//! is dropped, and dropping it cancels what it made (`Handover`,
//! `Spawned`). A call done already, whose awaiting task was cancelled
//! before it resumed, handed its result to a future nobody will read: the
//! turn or task in it is cancelled now, before the caller's next line runs
//! (for a turn, the session's next start).

use pyo3::intern;
use pyo3::prelude::*;

use crate::task::PyTask;
use crate::turn::PyTurn;

/// Cancels the turn or task a done call's future holds, when its awaiter
/// was cancelled before it had it.
#[pyclass(module = "settle._settle", frozen)]
pub(crate) struct CancelUnclaimed;

#[pymethods]
impl CancelUnclaimed {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = future.py();
        let done = future.call_method0(intern!(py, "done"))?.is_truthy()?;
        if !done || future.call_method0(intern!(py, "cancelled"))?.is_truthy()? {
            return Ok(());
        }
        if !future.call_method0(intern!(py, "exception"))?.is_none() {
            return Ok(());
        }
        let result = future.call_method0(intern!(py, "result"))?;
        if let Ok(turn) = result.cast::<PyTurn>() {
            turn.get().cancel_now();
        } else if let Ok(task) = result.cast::<PyTask>() {
            task.get().cancel()?;
        }
        Ok(())
    }
}
