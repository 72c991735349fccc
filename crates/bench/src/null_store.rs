//! A [`SessionStore`] that writes nothing: the teardown row measures the
//! lifecycle, not the database (the store row measures that).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use settle_core::{SessionId, State};
use settle_store::{
    Applied, ChunkAck, ChunkReceipt, FinalizeReport, Finalized, LifecycleWrite, MemoryRow,
    NewChunk, OwnerId, OwnerInfo, RecoverOptions, RecoveryCandidate, RecoveryReport, SessionDetail,
    SessionFilter, SessionRow, SessionStore, StoreError,
};
use tokio::sync::Notify;

/// Every method succeeds at once; sessions get increasing ids; finalizes are
/// counted, so a round can wait until the finalize plan of every session has
/// reached the store.
#[derive(Debug)]
pub struct NullStore {
    next_id: AtomicU64,
    finalized: AtomicUsize,
    expect: usize,
    all_finalized: Notify,
    base: Instant,
    first_end_turn: AtomicU64,
    last_end_turn: AtomicU64,
    first_finalize: AtomicU64,
}

impl NullStore {
    /// A store that signals once `expect` sessions are finalized.
    pub fn expecting(expect: usize) -> NullStore {
        NullStore {
            next_id: AtomicU64::new(0),
            finalized: AtomicUsize::new(0),
            expect,
            all_finalized: Notify::new(),
            base: Instant::now(),
            first_end_turn: AtomicU64::new(u64::MAX),
            last_end_turn: AtomicU64::new(0),
            first_finalize: AtomicU64::new(u64::MAX),
        }
    }

    fn since_base(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// When the recorder wrote its first and last turn end and its first
    /// finalize, as offsets from `from` (zero if before it or never).
    pub fn marks(&self, from: Instant) -> [Duration; 3] {
        let offset = from.saturating_duration_since(self.base);
        [
            &self.first_end_turn,
            &self.last_end_turn,
            &self.first_finalize,
        ]
        .map(|mark| {
            Duration::from_nanos(mark.load(Ordering::SeqCst).min(u64::MAX - 1))
                .saturating_sub(offset)
        })
    }

    /// How many sessions were finalized so far.
    pub fn finalized(&self) -> usize {
        self.finalized.load(Ordering::SeqCst)
    }

    /// Waits until the expected number of sessions is finalized.
    pub async fn all_finalized(&self) {
        let notified = self.all_finalized.notified();
        if self.finalized() >= self.expect {
            return;
        }
        notified.await;
    }
}

#[async_trait]
impl SessionStore for NullStore {
    async fn register_owner(&self, _: OwnerInfo, _: Duration) -> Result<OwnerId, StoreError> {
        Ok(OwnerId(1))
    }

    async fn renew_lease(&self, _: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        Ok(SystemTime::now() + ttl)
    }

    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        let start = self.next_id.fetch_add(u64::from(count), Ordering::Relaxed) + 1;
        Ok(start..start + u64::from(count))
    }

    fn append_chunk(&self, session: SessionId, turn: u32, _: NewChunk) -> ChunkReceipt {
        ChunkReceipt::ready(Ok(ChunkAck {
            session,
            turn,
            seq: 0,
        }))
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn apply(&self, batch: Vec<LifecycleWrite>) -> Vec<Result<Applied, StoreError>> {
        // The whole batch is applied at one moment: one clock read for its
        // phase marks, not one per write (the stub costs ours what it must).
        let at = std::cell::OnceCell::new();
        let now = || *at.get_or_init(|| self.since_base());
        batch
            .into_iter()
            .map(|write| {
                Ok(match write {
                    LifecycleWrite::Register(_) => Applied::Registered(SessionId(
                        self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
                    )),
                    LifecycleWrite::EndTurn { .. } => {
                        self.first_end_turn.fetch_min(now(), Ordering::Relaxed);
                        self.last_end_turn.fetch_max(now(), Ordering::Relaxed);
                        Applied::Done
                    }
                    LifecycleWrite::Finalize { plan, .. } => {
                        // A session's end carries its turn's end.
                        if plan.turn_end.is_some() {
                            self.first_end_turn.fetch_min(now(), Ordering::Relaxed);
                            self.last_end_turn.fetch_max(now(), Ordering::Relaxed);
                        }
                        self.first_finalize.fetch_min(now(), Ordering::Relaxed);
                        if self.finalized.fetch_add(1, Ordering::SeqCst) + 1 == self.expect {
                            // A permit is stored if nobody waits yet.
                            self.all_finalized.notify_one();
                        }
                        Applied::Finalized(Finalized::Won(FinalizeReport::default()))
                    }
                    LifecycleWrite::Transition { .. } | LifecycleWrite::StartTurn { .. } => {
                        Applied::Done
                    }
                })
            })
            .collect()
    }

    /// Every write answers at once: a batch is applied whole at its first poll.
    fn applies_in_order(&self) -> bool {
        true
    }

    async fn recover(&self, _: RecoverOptions) -> Result<RecoveryReport, StoreError> {
        Ok(RecoveryReport::default())
    }

    async fn recovery_candidates(
        &self,
        _: RecoverOptions,
    ) -> Result<Vec<RecoveryCandidate>, StoreError> {
        Ok(Vec::new())
    }

    async fn list_sessions(&self, _: SessionFilter) -> Result<Vec<SessionRow>, StoreError> {
        Ok(Vec::new())
    }

    async fn last_session(&self, _: Option<State>) -> Result<Option<SessionId>, StoreError> {
        Ok(None)
    }

    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        Err(StoreError::UnknownSession(id))
    }

    async fn memories(&self, _: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
        Ok(Vec::new())
    }
}
