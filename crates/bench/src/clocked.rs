//! A [`SessionStore`] that forwards every call to a real store, counts the
//! writes and notes when finalizes were handed to it and when they returned
//! (were committed), for the phase breakdown of the `teardown durable` row.
//!
//! Only the breakdown's own rounds use it; the timed rounds run on the bare
//! store. It must forward every method of the trait (every lifecycle write
//! comes through `apply`): a method left to a default implementation here
//! would send the runtime down a slower path than the bare store offers, and
//! the breakdown would no longer describe the timed rounds (its note quotes
//! both totals, so a gap shows).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use settle_core::{SessionId, State};
use settle_store::{
    Applied, ChunkReceipt, LifecycleWrite, MemoryRow, NewChunk, OwnerId, OwnerInfo, RecoverOptions,
    RecoveryCandidate, RecoveryReport, SessionDetail, SessionFilter, SessionRow, SessionStore,
    StoreError,
};

/// Nanoseconds since `base`, or `NEVER`.
#[derive(Debug)]
struct Mark(AtomicU64);

const NEVER: u64 = u64::MAX;

impl Mark {
    fn never() -> Mark {
        Mark(AtomicU64::new(NEVER))
    }

    fn zero() -> Mark {
        Mark(AtomicU64::new(0))
    }

    fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::SeqCst)).filter(|&t| t != NEVER)
    }
}

/// A write counted; its index is its place in [`WRITES`].
#[derive(Debug, Clone, Copy)]
enum Write {
    Register,
    StartTurn,
    Transition,
    EndTurn,
    Flush,
    Finalize,
    Batch,
}

/// The names of the writes counted: each lifecycle write of a batch by its
/// kind, the batches themselves, and flushes.
pub const WRITES: [&str; 7] = [
    "register",
    "start_turn",
    "transition",
    "end_turn",
    "flush",
    "finalize",
    "apply (batches)",
];

/// A store whose writes are counted and whose finalizes are timed.
#[derive(Debug)]
pub struct Clocked<S> {
    inner: S,
    base: Instant,
    first_handed: Mark,
    last_handed: Mark,
    last_committed: Mark,
    calls: [AtomicU64; WRITES.len()],
}

/// When the finalizes of a teardown reached the store, as offsets from the
/// start of the timed part (`None`: none did after it).
#[derive(Debug, Clone, Copy, Default)]
pub struct FinalizeMarks {
    /// The first finalize was handed to the store.
    pub first_handed: Option<Duration>,
    /// The last finalize was handed to the store.
    pub last_handed: Option<Duration>,
    /// The last finalize returned from the store: committed.
    pub last_committed: Option<Duration>,
}

impl<S> Clocked<S> {
    /// `inner`, timed.
    pub fn new(inner: S) -> Clocked<S> {
        Clocked {
            inner,
            base: Instant::now(),
            first_handed: Mark::never(),
            last_handed: Mark::zero(),
            last_committed: Mark::zero(),
            calls: Default::default(),
        }
    }

    fn count(&self, write: Write) {
        self.calls[write as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many times each of [`WRITES`] was called, in that order.
    pub fn calls(&self) -> [u64; WRITES.len()] {
        std::array::from_fn(|i| self.calls[i].load(Ordering::SeqCst))
    }

    /// Finalizes are being handed to the store now.
    fn mark_handed(&self) {
        let handed = self.now();
        self.first_handed.0.fetch_min(handed, Ordering::SeqCst);
        self.last_handed.0.fetch_max(handed, Ordering::SeqCst);
    }

    /// Finalizes handed to the store came back now.
    fn mark_committed(&self) {
        self.last_committed
            .0
            .fetch_max(self.now(), Ordering::SeqCst);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(NEVER - 1)
    }

    /// Counts `batch`'s writes and marks when its finalizes are handed to
    /// the store and come back, around `apply` (the inner store's call).
    async fn counted<F>(
        &self,
        batch: Vec<LifecycleWrite>,
        apply: impl FnOnce(Vec<LifecycleWrite>) -> F,
    ) -> Vec<Result<Applied, StoreError>>
    where
        F: std::future::Future<Output = Vec<Result<Applied, StoreError>>>,
    {
        self.count(Write::Batch);
        let mut finalizes = false;
        for write in &batch {
            self.count(match write {
                LifecycleWrite::Register(_) => Write::Register,
                LifecycleWrite::Transition { .. } => Write::Transition,
                LifecycleWrite::StartTurn { .. } => Write::StartTurn,
                LifecycleWrite::EndTurn { .. } => Write::EndTurn,
                LifecycleWrite::Finalize { .. } => {
                    finalizes = true;
                    Write::Finalize
                }
            });
        }
        if finalizes {
            self.mark_handed();
        }
        let results = apply(batch).await;
        if finalizes {
            self.mark_committed();
        }
        results
    }

    /// The marks, as offsets from `from`.
    pub fn marks(&self, from: Instant) -> FinalizeMarks {
        let offset = from.saturating_duration_since(self.base);
        let since = |mark: &Mark| {
            mark.get()
                .filter(|&t| t > 0)
                .map(|t| Duration::from_nanos(t).saturating_sub(offset))
        };
        FinalizeMarks {
            first_handed: since(&self.first_handed),
            last_handed: since(&self.last_handed),
            last_committed: since(&self.last_committed),
        }
    }
}

#[async_trait]
impl<S: SessionStore> SessionStore for Clocked<S> {
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError> {
        self.inner.register_owner(owner, ttl).await
    }

    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        self.inner.renew_lease(owner, ttl).await
    }

    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        self.inner.reserve_ids(count).await
    }

    fn append_chunk(&self, id: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt {
        self.inner.append_chunk(id, turn, chunk)
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.count(Write::Flush);
        self.inner.flush().await
    }

    async fn apply(&self, batch: Vec<LifecycleWrite>) -> Vec<Result<Applied, StoreError>> {
        self.counted(batch, |batch| self.inner.apply(batch)).await
    }

    /// The kernel writes as its owner: the same path as the timed rounds
    /// (the store's set-wise latch is taken only for a writer's batch).
    async fn apply_as(
        &self,
        writer: OwnerId,
        batch: Vec<LifecycleWrite>,
    ) -> Vec<Result<Applied, StoreError>> {
        self.counted(batch, |batch| self.inner.apply_as(writer, batch))
            .await
    }

    fn applies_in_order(&self) -> bool {
        // Nothing is awaited before the inner store's first poll.
        self.inner.applies_in_order()
    }

    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError> {
        self.inner.recover(options).await
    }

    async fn recovery_candidates(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<RecoveryCandidate>, StoreError> {
        self.inner.recovery_candidates(options).await
    }

    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRow>, StoreError> {
        self.inner.list_sessions(filter).await
    }

    async fn last_session(&self, state: Option<State>) -> Result<Option<SessionId>, StoreError> {
        self.inner.last_session(state).await
    }

    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        self.inner.session_detail(id).await
    }

    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
        self.inner.memories(id).await
    }
}
