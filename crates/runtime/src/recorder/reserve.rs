//! Session ids reserved for the driver beside the lifecycle writes, not
//! behind them: a reservation touches only the store's id counter, so
//! nothing decided before it has to be committed first. Made a barrier, it
//! would hold the registrations that already have their ids (and the
//! driver's, parked waiting for more) behind a commit and a store round
//! trip of its own, every block of a burst.
//!
//! A reservation that meets a store failure that may heal (a locked
//! database, a connection a restart killed) is tried again until the store
//! takes it, within the store timeout (and a shutdown's budget), as the
//! registrations' own writes are: the registrations waiting for its ids are
//! refused only when the store stays down.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use settle_store::{SessionStore, StoreError};
use tokio::sync::watch;

use super::bounded::{note_answer, within};
use super::retry::may_heal;
use super::unwritten::Unwritten;
use super::Recorder;
use crate::backoff::Backoff;
use crate::command::Ack;

impl Recorder {
    /// Reserves `count` session ids on a task of its own and hands the
    /// driver the block (or the failure) when the store answers. The driver
    /// asks for one block at a time.
    pub(super) fn reserve_ids(&mut self, count: u32) {
        let reservation = Reservation {
            store: self.store.clone(),
            count,
            store_timeout: self.store_timeout,
            deadline: self.deadline.clone(),
            calls_stalled: self.calls_stalled.clone(),
            store_stalled: self.store_stalled.clone(),
        };
        let acks = self.acks.clone();
        let task = tokio::spawn(async move {
            let ack = match reservation.until_taken().await {
                Ok(range) => Ack::Ids(range),
                Err(Unwritten::Failed(error)) => {
                    Ack::IdsFailed(Arc::try_unwrap(error).unwrap_or(StoreError::Unavailable))
                }
                Err(Unwritten::TimedOut(_)) => Ack::IdsFailed(StoreError::Unavailable),
            };
            let _ = acks.send(ack);
        });
        // One at a time: an earlier one (not expected) still answers the
        // driver, it is only not waited for at the end.
        drop(self.reserving.replace(task));
    }

    /// Waits for a reservation still in flight as the recorder ends (it is
    /// bounded), so that nothing of the kernel uses the store after it.
    pub(super) async fn reserved(&mut self) {
        if let Some(task) = self.reserving.take() {
            let _ = task.await;
        }
    }
}

/// One reservation, with what it needs of the recorder to bound its tries.
struct Reservation {
    store: Arc<dyn SessionStore>,
    count: u32,
    store_timeout: Duration,
    deadline: watch::Receiver<Option<tokio::time::Instant>>,
    calls_stalled: Arc<AtomicBool>,
    store_stalled: Arc<AtomicBool>,
}

impl Reservation {
    /// Tries until the store takes it, while its failures may heal, for at
    /// most the store timeout (or what is left of a shutdown's budget).
    async fn until_taken(self) -> Result<std::ops::Range<u64>, Unwritten> {
        let started = tokio::time::Instant::now();
        let mut backoff = Backoff::new();
        loop {
            let until = self.until(started);
            let bound = until.saturating_duration_since(tokio::time::Instant::now());
            let store = self.store.clone();
            let count = self.count;
            let answered = within(bound, self.deadline.clone(), async move {
                store.reserve_ids(count).await
            })
            .await;
            note_answer(&self.calls_stalled, &self.store_stalled, &answered);
            let unwritten = match answered {
                Ok(range) => return Ok(range),
                Err(unwritten) => unwritten,
            };
            let wait = backoff.next_wait();
            if !may_heal(&unwritten) || tokio::time::Instant::now() + wait >= self.until(started) {
                return Err(unwritten);
            }
            tracing::debug!(error = %unwritten, "failed to reserve session ids; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// When the tries end: the store timeout after the first, or a
    /// shutdown's deadline if that comes first.
    fn until(&self, started: tokio::time::Instant) -> tokio::time::Instant {
        let timeout = started + self.store_timeout;
        match *self.deadline.borrow() {
            Some(deadline) => deadline.min(timeout),
            None => timeout,
        }
    }
}
