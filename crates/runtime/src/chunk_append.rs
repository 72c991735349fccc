//! A chunk appended until the store takes it, within the store timeout.
//!
//! A store blip (a database locked by another process for longer than its
//! busy timeout, a full disk freed again, a PostgreSQL server restarting)
//! fails the append that meets it. The chunk is the provider's output, paid
//! for and not to be asked for again, so the turn does not end on the first
//! failure: the append is tried again, waiting 50 ms and then twice as long
//! each time up to 1 s, until the store takes it or the store timeout
//! (counted from the first try) is spent; then the turn fails with the
//! store's own cause. The provider's stream is not read meanwhile (its idle
//! timeout counts only the time spent waiting for its events). A cancel
//! ends the wait as it ends any other, and a cancelled turn tries no more
//! (it ends `cancelled`, whatever the store said last);
//! an append whose answer is still on its way when the wait is dropped is
//! handed to `abandoned` (its chunk may be written already: the caller
//! hands it on once the store says so).
//!
//! An append given up on (not answered by the deadline, or failing until
//! it) may still be committed by a store that was waiting on a lock with
//! it: it is withdrawn (`SessionStore::withdraw_chunks`), so the store keeps
//! only what the reader was given.
//!
//! A failed append may have been written all the same: a commit whose
//! answer was lost with its connection. Before appending again the store is
//! asked whether the turn holds a chunk at this one's place, so no chunk is
//! stored twice. A refusal (a closed session or turn, a lost lease, a
//! violated constraint) is final and is not tried again.

use std::time::Duration;

use settle_core::SessionId;
use settle_store::{ChunkReceipt, NewChunk, SessionStore, StoreError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// An append whose answer is on its way: dropped before it came, its
/// receipt goes to `abandoned`.
struct Flight<'a, F: Fn(ChunkReceipt)> {
    receipt: Option<ChunkReceipt>,
    abandoned: &'a F,
}

impl<F: Fn(ChunkReceipt)> Drop for Flight<'_, F> {
    fn drop(&mut self) {
        if let Some(receipt) = self.receipt.take() {
            (self.abandoned)(receipt);
        }
    }
}

/// Why a chunk was not appended.
#[derive(Debug)]
pub(crate) enum NotAppended {
    /// The session or the turn is closed: write access is revoked (G10).
    Closed,
    /// The store refused it, or failed until the store timeout was spent;
    /// what it said last.
    Failed(StoreError),
    /// The store did not answer within the store timeout.
    Unanswered(Duration),
    /// The turn was cancelled while the store failed: it tries no more (a
    /// cancelled turn ends `cancelled`, not with the store's error).
    Cancelled,
}

/// Where a chunk goes: its session, its turn and its place in the turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub session: SessionId,
    pub turn: u32,
    pub seq: u32,
}

/// Appends the chunk `make` builds at `place`, trying again while the store
/// fails in a way that may heal, for at most `timeout` in all, and not once
/// `cut` is cancelled. `retrying` is called at the first failure that will
/// be tried again. Dropped while an append's answer is on its way (the
/// turn was cancelled), that append's receipt goes to `abandoned`.
pub(crate) async fn append_until_taken(
    store: &dyn SessionStore,
    place: Place,
    make: impl Fn() -> NewChunk,
    timeout: Duration,
    cut: &CancellationToken,
    abandoned: impl Fn(ChunkReceipt),
    mut retrying: impl FnMut(&StoreError),
) -> Result<(), NotAppended> {
    let appended = async {
        let deadline = Instant::now() + timeout;
        let mut backoff = Backoff::new();
        let mut said = false;
        loop {
            let mut flight = Flight {
                receipt: Some(store.append_chunk(place.session, place.turn, make())),
                abandoned: &abandoned,
            };
            let answer = match flight.receipt.as_mut() {
                Some(receipt) => tokio::time::timeout_at(deadline, receipt).await,
                None => Ok(Err(StoreError::Unavailable)),
            };
            flight.receipt = None;
            let mut last = match answer {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(StoreError::SessionClosed(_) | StoreError::TurnClosed { .. })) => {
                    return Err(NotAppended::Closed)
                }
                Ok(Err(error)) if error.may_heal() => error,
                Ok(Err(error)) => return Err(NotAppended::Failed(error)),
                Err(_) => return Err(NotAppended::Unanswered(timeout)),
            };
            if cut.is_cancelled() {
                return Err(NotAppended::Cancelled);
            }
            if !said {
                said = true;
                retrying(&last);
            }
            // Wait, then learn whether the failed append landed after all; a
            // store that cannot say is asked again after the next wait.
            loop {
                let at = Instant::now() + backoff.next_wait();
                if cut.is_cancelled() {
                    return Err(NotAppended::Cancelled);
                }
                if at >= deadline {
                    return Err(NotAppended::Failed(last));
                }
                tokio::select! {
                    biased;
                    () = cut.cancelled() => return Err(NotAppended::Cancelled),
                    () = tokio::time::sleep_until(at) => {}
                }
                let page = store.turn_page(place.session, Some(place.turn), place.seq, 1);
                match tokio::time::timeout_at(deadline, page).await {
                    Ok(Ok(page)) => {
                        let landed = page.turn.is_some_and(|turn| {
                            turn.chunks.first().is_some_and(|c| c.seq == place.seq)
                        });
                        if landed {
                            return Ok(());
                        }
                        break;
                    }
                    Ok(Err(error)) if error.may_heal() => last = error,
                    Ok(Err(error)) => return Err(NotAppended::Failed(error)),
                    Err(_) => return Err(NotAppended::Failed(last)),
                }
            }
        }
    }
    .await;
    if let Err(NotAppended::Failed(_) | NotAppended::Unanswered(_) | NotAppended::Cancelled) =
        &appended
    {
        // Given up on: a try the store is still committing (it waits on a
        // lock with it) must not land now that the turn fails without it.
        store.withdraw_chunks(place.session, place.turn, place.seq);
    }
    appended
}
