//! A session handed off (SPEC §12): released in the store for another
//! process to adopt, once every write before it is committed (it is a
//! barrier), so the row is idle when it is released.

use std::time::SystemTime;

use settle_core::{Holds, SessionId};

use super::retry::may_heal;
use super::unwritten::Unwritten;
use super::Recorder;
use crate::backoff::Backoff;
use crate::event::LifecycleEvent;

impl Recorder {
    /// Releases `session` with its `holds`. A release the store did not commit leaves the
    /// session owned by this process: once its lease expires, a live peer
    /// releases it (or `settle recover` finalizes it).
    pub(super) async fn release(&mut self, session: SessionId, holds: Holds, at: SystemTime) {
        // Its row must be as the core left it (idle) before it is released:
        // the writes a store blip left waiting land first, within the
        // shutdown's budget.
        if !self.retries.is_empty() {
            self.settle_retries().await;
        }
        let released = match self.release_until_taken(session, holds, at).await {
            Ok(()) => {
                self.report.released.push(session);
                true
            }
            Err(unwritten) => {
                self.failed(Some(session), "release a session for adoption", &unwritten);
                self.report.left_recoverable.push(session);
                false
            }
        };
        self.events
            .emit(None, || LifecycleEvent::HandedOff { session, released });
    }

    /// Releases `session`, tried again while the store fails in a way that
    /// may heal (a connection a database restart killed, a lock, a full
    /// disk), as every lifecycle write is, until the shutdown's budget is
    /// spent (else the store timeout): one failure on a dead pooled
    /// connection must not leave a session owned by a process that exits,
    /// unreachable until its lease runs out. A try whose commit landed
    /// though its answer was lost is taken by the next: the store answers
    /// a release of a session its owner released already as done.
    async fn release_until_taken(
        &mut self,
        session: SessionId,
        holds: Holds,
        at: SystemTime,
    ) -> Result<(), Unwritten> {
        let until = self
            .deadline
            .borrow()
            .unwrap_or_else(|| tokio::time::Instant::now() + self.store_timeout);
        let mut backoff = Backoff::new();
        loop {
            let call = self.store.release(self.owner, session, holds, at);
            let unwritten = match self.bounded(call).await {
                Ok(()) => return Ok(()),
                Err(unwritten) => unwritten,
            };
            let wait = backoff.next_wait();
            if !may_heal(&unwritten) || tokio::time::Instant::now() + wait >= until {
                return Err(unwritten);
            }
            tracing::warn!(%session, error = %unwritten, "failed to release a session for adoption; trying again until the store takes it");
            tokio::time::sleep(wait).await;
        }
    }
}
