//! The store as the runtime sees it: an async trait, so the runtime can run
//! against [`Store`](crate::Store) or against a stub in benchmarks and tests.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use settle_core::{EndReason, Outcome, SessionId, State};

use crate::chunk::ChunkReceipt;
use crate::claim::Claim;
use crate::error::StoreError;
use crate::latch::{Finalize, Finalized};
use crate::lease::{OwnerId, OwnerInfo};
use crate::read::{MemoryRow, SessionDetail, SessionRow};
use crate::recover::{RecoverOptions, RecoveryReport};
use crate::session::NewSession;

/// The durable side of the session lifecycle.
///
/// Writes take effect in the order they are called (for one store value and
/// its clones); each resolves once committed.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Register an owning process; its lease runs `ttl` from now.
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError>;

    /// Extend the lease of `owner` to `ttl` from now, returning the new expiry.
    /// Fails with [`StoreError::LeaseLost`] once the lease has expired.
    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError>;

    /// Reserve `count` fresh session ids for [`NewSession::with_id`]: ids
    /// are never handed out twice, across connections and processes (an id
    /// reserved and never used leaves a gap).
    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError>;

    /// Register a session and return its id: the one it was given with
    /// [`NewSession::with_id`] (reserved earlier), or a fresh one.
    async fn create_session(&self, new: NewSession) -> Result<SessionId, StoreError>;

    /// Move `id` from `from` to `to`, only if it is in `from` now, recording a
    /// timeline row with `cause` at `at` in the same transaction.
    ///
    /// Fails with [`StoreError::StateMismatch`] (naming both states) if it is
    /// not in `from`, [`StoreError::SessionClosed`] if it is finalized, and
    /// [`StoreError::InvalidTransition`] for a move the lifecycle does not have
    /// (finalizing goes through [`finalize`](Self::finalize)).
    async fn transition(
        &self,
        id: SessionId,
        from: State,
        to: State,
        cause: &str,
        at: SystemTime,
    ) -> Result<(), StoreError>;

    /// Open turn `no` of `id`. Refused while another turn is open, while the
    /// session is closing (claimed), or once it is settled or finalized.
    async fn start_turn(&self, id: SessionId, no: u32, at: SystemTime) -> Result<(), StoreError>;

    /// Append a chunk to turn `turn` of `id`. The chunk is queued now, in call
    /// order; the receipt resolves once it is committed (G7), or with
    /// [`StoreError::TurnClosed`] if the turn has ended or
    /// [`StoreError::SessionClosed`] if the session is finalized.
    fn append_chunk(&self, id: SessionId, turn: u32, text: String) -> ChunkReceipt;

    /// End turn `no` of `id` with `outcome`; it accepts no more chunks.
    async fn end_turn(
        &self,
        id: SessionId,
        no: u32,
        outcome: Outcome,
        at: SystemTime,
    ) -> Result<(), StoreError>;

    /// Claim `id` for an automatic reclaim (G3): succeeds only if it is
    /// registered, not closing and has no open turn, and marks it closing in
    /// the same statement.
    async fn claim(&self, id: SessionId, reason: EndReason) -> Result<Claim, StoreError>;

    /// Wait until every chunk appended so far is committed.
    async fn flush(&self) -> Result<(), StoreError>;

    /// Spend the finalize latch of `id` (G2): exactly one caller, across
    /// connections and processes, gets [`Finalized::Won`].
    async fn finalize(&self, id: SessionId, plan: Finalize) -> Result<Finalized, StoreError>;

    /// Finalize the sessions left live by crashed processes (G8).
    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError>;

    /// Every session, or those in `state`, by id.
    async fn list_sessions(&self, state: Option<State>) -> Result<Vec<SessionRow>, StoreError>;

    /// One session with its turns, transcript and timeline.
    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError>;

    /// The memory committed for `id`.
    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError>;
}
