//! Sessions handed off (SPEC §12): released in the store for another
//! process to adopt, once every write before them is committed (a release
//! is a barrier), so each row is idle when it is released. The releases
//! that come one after another (a shutdown with handoff releases every
//! idle session at once) are one store call, one transaction on the
//! database store ([`SessionStore::release_all`](settle_store::SessionStore::release_all)),
//! made before any record behind them is taken.

use settle_store::Release;

use super::retry::may_heal;
use super::unwritten::Unwritten;
use super::Recorder;
use crate::backoff::Backoff;
use crate::event::LifecycleEvent;

impl Recorder {
    /// Releases the sessions queued for release ([`Recorder::releasing`]),
    /// tried again while the store fails in a way that may heal (a
    /// connection a database restart killed, a lock, a full disk), as every
    /// lifecycle write is, until the shutdown's budget is spent (else the
    /// store timeout): one failure on a dead pooled connection must not
    /// leave sessions owned by a process that exits, unreachable until its
    /// lease runs out. A try whose commit landed though its answer was lost
    /// is taken by the next: the store answers a release of a session its
    /// owner released already as done. A release the store did not commit
    /// leaves the session owned by this process: once its lease expires, a
    /// live peer releases it (or `settle recover` finalizes it).
    pub(super) async fn release_queued(&mut self) {
        if self.releasing.is_empty() {
            return;
        }
        // Their rows must be as the core left them (idle) before they are
        // released: the writes a store blip left waiting land first,
        // within the shutdown's budget.
        if !self.retries.is_empty() {
            self.settle_retries().await;
        }
        let mut asked = std::mem::take(&mut self.releasing);
        let until = self
            .deadline
            .borrow()
            .unwrap_or_else(|| tokio::time::Instant::now() + self.store_timeout);
        let mut backoff = Backoff::new();
        loop {
            let call = self.store.release_all(self.owner, asked.clone());
            let results: Vec<Result<(), Unwritten>> = match self
                .bounded(async { Ok::<_, settle_store::StoreError>(call.await) })
                .await
            {
                Ok(results) => results
                    .into_iter()
                    .map(|r| r.map_err(Unwritten::from_store))
                    .collect(),
                Err(unwritten) => vec![Err(unwritten); asked.len()],
            };
            let wait = backoff.next_wait();
            let again = tokio::time::Instant::now() + wait < until;
            let mut left = Vec::new();
            for (one, result) in asked.into_iter().zip(results) {
                match result {
                    Ok(()) => self.released(one, true),
                    Err(unwritten) if again && may_heal(&unwritten) => left.push((one, unwritten)),
                    Err(unwritten) => {
                        self.failed(
                            Some(one.session),
                            "release a session for adoption",
                            &unwritten,
                        );
                        self.released(one, false);
                    }
                }
            }
            let Some((_, first)) = left.first() else {
                return;
            };
            tracing::warn!(
                sessions = left.len(),
                error = %first,
                "failed to release sessions for adoption; trying again until the store takes them"
            );
            asked = left.into_iter().map(|(one, _)| one).collect();
            tokio::time::sleep(wait).await;
        }
    }

    /// Says how `one`'s release ended: in the shutdown's report and as a
    /// [`LifecycleEvent::HandedOff`].
    fn released(&mut self, one: Release, released: bool) {
        let session = one.session;
        if released {
            self.report.released.push(session);
        } else {
            self.report.left_recoverable.push(session);
        }
        self.events
            .emit(None, || LifecycleEvent::HandedOff { session, released });
    }
}
