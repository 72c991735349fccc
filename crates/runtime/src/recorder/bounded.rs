//! The bounded store calls: every store call of the recorder is bounded by
//! the store timeout and, once a shutdown has begun, by what is left of its
//! budget, so that a store that stops answering cannot hold the process
//! (G9); a call that panics fails alone; and what a call that gave no
//! answer leaves behind.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::FutureExt;
use settle_core::SessionId;
use settle_store::StoreError;
use tokio::sync::watch;

use super::unwritten::Unwritten;
use super::Recorder;
use crate::event::LifecycleEvent;

/// Runs a store call within `bound`, and, once a shutdown has begun, within
/// its deadline: a shutdown that begins while the call is in flight (a
/// registration waiting on a stalled store) cuts it there.
pub(super) async fn within<T>(
    bound: Duration,
    mut deadline: watch::Receiver<Option<tokio::time::Instant>>,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, Unwritten> {
    // No time left (a shutdown's budget spent): the call is not made at
    // all. Polled even once, it would be handed to the store (a write
    // queued on its writer), and committed whenever the store took it:
    // after the writes given up on before it, which the report says are
    // left for recovery, a parent's finalize over its child's (G1).
    if bound.is_zero() {
        return Err(Unwritten::TimedOut(Duration::ZERO));
    }
    let started = tokio::time::Instant::now();
    // The deadline as it stands: a second signal skipping the drain
    // brings it closer while the call is in flight.
    let shutdown_ends = async move {
        loop {
            let at = match deadline.wait_for(Option::is_some).await.map(|at| *at) {
                Ok(Some(at)) => at,
                _ => return std::future::pending().await,
            };
            tokio::select! {
                () = tokio::time::sleep_until(at) => return at,
                changed = deadline.changed() => if changed.is_err() {
                    tokio::time::sleep_until(at).await;
                    return at;
                },
            }
        }
    };
    // A store of the embedder's own may panic: that fails this call, and
    // must not take the recorder (every later write) down with it.
    let call = AssertUnwindSafe(call).catch_unwind();
    tokio::select! {
        biased;
        ended = tokio::time::timeout(bound, call) => match ended {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(error))) => Err(Unwritten::from_store(error)),
            Ok(Err(_)) => Err(Unwritten::from_store(StoreError::Panicked { call: "writing" })),
            Err(_) => Err(Unwritten::TimedOut(bound)),
        },
        at = shutdown_ends => Err(Unwritten::TimedOut(crate::clock::to_millis(
            at.saturating_duration_since(started),
        ))),
    }
}

/// What a store call of the recorder's own says of the store: one not
/// answered within its bound marks it stalled (`calls`, and the driver's
/// flag), one answered marks it answering again.
pub(super) fn note_answer<T>(
    calls: &std::sync::atomic::AtomicBool,
    driver: &std::sync::atomic::AtomicBool,
    answered: &Result<T, Unwritten>,
) {
    match answered {
        Err(Unwritten::TimedOut(_)) => {
            calls.store(true, Ordering::Relaxed);
            driver.store(true, Ordering::Relaxed);
        }
        Ok(_) => calls.store(false, Ordering::Relaxed),
        Err(Unwritten::Failed(_)) => {}
    }
}

impl Recorder {
    /// The bound of a store call now.
    pub(super) fn bound(&self) -> Duration {
        match *self.deadline.borrow() {
            Some(deadline) => deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(self.store_timeout),
            None => self.store_timeout,
        }
    }

    /// Runs a store call within its bound. (Not an `async fn`: the future
    /// holds no reference to the recorder, whose batch in flight is not
    /// `Sync`.)
    /// A call that was not answered within its bound marks the store
    /// stalled (for the readers of works' ends, and the driver) until one
    /// is answered.
    pub(super) fn bounded<T, F>(
        &self,
        call: F,
    ) -> impl Future<Output = Result<T, Unwritten>> + use<T, F>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let call = within(self.bound(), self.deadline.clone(), call);
        let (calls, driver) = (self.calls_stalled.clone(), self.store_stalled.clone());
        async move {
            let answered = call.await;
            note_answer(&calls, &driver, &answered);
            answered
        }
    }

    /// Counts a store call that gave no answer, logs it and tells the
    /// subscribers (`StoreFailed`).
    pub(super) fn failed(&self, session: Option<SessionId>, what: &str, unwritten: &Unwritten) {
        self.failures.add();
        // Once the lease is lost every write is refused, as it must be:
        // the one line that says so is the kernel's, not one per write. So
        // once a shutdown's time for the store is spent: every write left
        // fails at once, one line says so, and the shutdown's report names
        // the sessions they leave.
        let spent = self
            .deadline
            .borrow()
            .is_some_and(|at| at <= tokio::time::Instant::now());
        match unwritten {
            Unwritten::Failed(error) if matches!(**error, StoreError::LeaseLost(_)) => {
                tracing::debug!(?session, error = %unwritten, "failed to {what}");
            }
            _ if spent && self.spent_said.replace(true) => {
                tracing::debug!(?session, error = %unwritten, "failed to {what}");
            }
            _ if spent => tracing::error!(
                ?session,
                error = %unwritten,
                "failed to {what}; the shutdown's time for the store's writes ran out, \
                 so the writes left are not waited for (the shutdown's report names \
                 the sessions they leave)"
            ),
            _ => crate::store_failures::store_failure!(
                self.failures,
                crate::store_failures::StoreFailure::WriteFailed,
                error,
                ?session,
                error = %unwritten,
                "failed to {what}"
            ),
        }
        self.events.emit(None, || LifecycleEvent::StoreFailed {
            session,
            message: format!("failed to {what}: {unwritten}"),
        });
    }
}
