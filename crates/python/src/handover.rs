//! [`Handover`]: a started turn on its way to the caller of
//! `Session.turn(...)`, and its place among the session's starts.
//!
//! Turn starts through a `Session` take their place one at a time (see
//! `session.rs`). A turn handed over to its caller frees the place at once:
//! the caller may read it, cancel it, or start the next. A turn whose caller
//! was cancelled while it started is never handed over (its awaitable is
//! done): it is cancelled before its place is let go, so the caller's next
//! start reaches the kernel after that cancel, and waits there for the
//! cancelled turn's end (as any start after a cancel does) instead of being
//! refused "a turn is still running" for a turn it has no handle to wait on.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use settle_runtime::Turn;
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use crate::process::Owner;
use crate::provider::PumpWatch;
use crate::turn::PyTurn;

/// A started turn and its place, until the caller has it.
pub(crate) struct Handover {
    /// The turn, its owner, its pump, and the kernel's settle timeout.
    turn: Option<(Turn, Owner, Arc<PumpWatch>, Duration)>,
    place: Option<OwnedMutexGuard<()>>,
    /// Cancelled by the session's `cancel_turn()`: then never handed over.
    stopped: CancellationToken,
}

impl Handover {
    /// `turn`, holding `place` until it is handed over or cancelled, unless
    /// `stopped` first.
    pub fn new(
        turn: Turn,
        owner: Owner,
        pump: Arc<PumpWatch>,
        settle: Duration,
        place: OwnedMutexGuard<()>,
        stopped: CancellationToken,
    ) -> Self {
        Handover {
            turn: Some((turn, owner, pump, settle)),
            place: Some(place),
            stopped,
        }
    }
}

impl<'py> IntoPyObject<'py> for Handover {
    type Target = PyTurn;
    type Output = Bound<'py, PyTurn>;
    type Error = PyErr;

    /// Handed over: the place is free.
    fn into_pyobject(mut self, py: Python<'py>) -> PyResult<Self::Output> {
        // Stopped on the loop's thread before this ran: the turn is
        // cancelled with this handover's drop, before its place is let go.
        if self.stopped.is_cancelled() {
            return Err(crate::errors::Cancelled::new_err(
                "the turn's start was stopped by cancel_turn()",
            ));
        }
        self.place.take();
        let Some((turn, owner, pump, settle)) = self.turn.take() else {
            return Err(crate::errors::error("the turn was handed over already"));
        };
        Bound::new(py, PyTurn::new(turn, owner, pump, settle))
    }
}

impl Drop for Handover {
    /// Never handed over: the turn is cancelled (dropping it cancels it),
    /// then its place is let go.
    fn drop(&mut self) {
        drop(self.turn.take());
        drop(self.place.take());
    }
}
