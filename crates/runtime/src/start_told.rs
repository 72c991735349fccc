//! A turn's start as its caller and its work wait for it: told once, either
//! by the recorder when the store answers, or by the caller's own patience.
//!
//! The recorder hands writes to the store one batch after another, and
//! waits in its own loop for a batch ahead (and for a try again of writes a
//! blip left): a start asked for while the store is stalled behind another
//! write would be answered only once those gave up, up to two store
//! timeouts after it was asked. So the caller keeps the store timeout
//! itself, counted from its ask: at that bound it takes the waiters out of
//! the shared slot, if the recorder has not, and tells both, the work and
//! itself, that the start failed, with what the store last said of it (or
//! that it did not answer). The write stays queued; once the store takes
//! it, the turn's failed end, queued behind it, is written too, so the
//! stored turns keep the kernel's numbers (see `recorder/retry.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_store::StoreError;
use tokio::sync::oneshot;

/// Who waits for a turn's start to be written.
pub(crate) struct StartWaiters {
    /// The work, which streams once the start is written.
    done: oneshot::Sender<Result<(), StoreError>>,
    /// The caller, who is given the turn once its start is written.
    announce: oneshot::Sender<Result<(), StoreError>>,
}

impl StartWaiters {
    /// Tells the work and the caller how the start went.
    pub(crate) fn tell(self, answer: Result<(), StoreError>) {
        let _ = self.announce.send(answer.clone());
        let _ = self.done.send(answer);
    }
}

#[derive(Default)]
struct Slot {
    /// The waiters, until one side tells them.
    waiters: Option<StartWaiters>,
    /// What the store said last of the start (a failure it may heal from).
    last: Option<StoreError>,
}

/// The recorder's side of a start's waiters, shared with its caller.
#[derive(Clone)]
pub(crate) struct StartTold(Arc<Mutex<Slot>>);

impl StartTold {
    /// The waiters of a start, the work's side and the caller's: the caller
    /// waits on the [`Announced`].
    pub(crate) fn new(done: oneshot::Sender<Result<(), StoreError>>) -> (StartTold, Announced) {
        let (announce, told) = oneshot::channel();
        let slot = Slot {
            waiters: Some(StartWaiters { done, announce }),
            last: None,
        };
        let shared = StartTold(Arc::new(Mutex::new(slot)));
        let announced = Announced {
            told,
            slot: shared.clone(),
        };
        (shared, announced)
    }

    /// A slot of its own for `waiters` taken out of another to be told.
    pub(crate) fn holding(waiters: StartWaiters) -> StartTold {
        let slot = Slot {
            waiters: Some(waiters),
            last: None,
        };
        StartTold(Arc::new(Mutex::new(slot)))
    }

    /// The waiters, to be told now; `None` once they were.
    pub(crate) fn take(&self) -> Option<StartWaiters> {
        self.0.lock().ok()?.waiters.take()
    }

    /// Notes what the store said of the start, for a caller told at its
    /// bound before the write is tried again.
    pub(crate) fn failed_with(&self, error: StoreError) {
        if let Ok(mut slot) = self.0.lock() {
            slot.last = Some(error);
        }
    }

    fn give_up(&self, patience: Duration) {
        let Ok(mut slot) = self.0.lock() else {
            return;
        };
        if let Some(waiters) = slot.waiters.take() {
            let error = slot
                .last
                .take()
                .unwrap_or(StoreError::TimedOut { after: patience });
            drop(slot);
            waiters.tell(Err(error));
        }
    }
}

/// The caller's side of a turn's start: answered once the start is written,
/// or could not be.
pub(crate) struct Announced {
    told: oneshot::Receiver<Result<(), StoreError>>,
    slot: StartTold,
}

impl Announced {
    /// How the start went, at the latest at `deadline` (the store timeout
    /// from the ask); `None` when the kernel stopped without saying.
    pub(crate) async fn wait(
        mut self,
        deadline: tokio::time::Instant,
        patience: Duration,
    ) -> Option<Result<(), StoreError>> {
        if let Ok(told) = tokio::time::timeout_at(deadline, &mut self.told).await {
            return told.ok();
        }
        // At the bound: tell both sides unless the recorder is telling them
        // (then its answer is on its way).
        self.slot.give_up(patience);
        self.told.await.ok()
    }
}
