//! The store as the runtime sees it: an async trait, so the runtime can run
//! against [`Store`](crate::Store) or against a stub in benchmarks and tests.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::Value;
use settle_core::{EndReason, Outcome, SessionId, State, TurnError};

use crate::batch::{Applied, LifecycleWrite};
use crate::chunk::{ChunkReceipt, NewChunk};
use crate::claim::Claim;
use crate::error::StoreError;
use crate::latch::{FinalizeRequest, Finalized};
use crate::lease::{OwnerId, OwnerInfo};
use crate::list::SessionFilter;
use crate::read::{MemoryRow, SessionDetail, SessionRow};
use crate::recover::{RecoverOptions, RecoveryCandidate, RecoveryReport};
use crate::session::NewSession;

/// The durable side of the session lifecycle.
///
/// Writes take effect in the order they are called (for one store value and
/// its clones); each resolves once committed.
///
/// # Bounds
///
/// A call waits for its database. [`Store`](crate::Store) bounds what it can
/// — SQLite's busy timeout; PostgreSQL's connect timeout, statement timeout
/// and TCP keepalive (see [`StoreOptions`](crate::StoreOptions)) — but a
/// database that stops answering without dropping its connections (a server
/// process stopped with SIGSTOP, whose kernel still acknowledges TCP) holds a
/// call until it answers again. **Callers that must stay responsive bound
/// their awaits** (`tokio::time::timeout`), as the runtime does for every
/// call; a write given up on may still be applied later, so its session is
/// left to recovery. Dropping a `Store` waits at most its close timeout.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Register an owning process; its lease runs `ttl` from now, by the
    /// store's clock.
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError>;

    /// Extend the lease of `owner` to `ttl` from now (by the store's clock),
    /// returning the new expiry; a `ttl` of zero ends the lease now. Fails
    /// with [`StoreError::LeaseLost`] once the lease has expired: it is lost
    /// for good, and so is every later write of the owner.
    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError>;

    /// Reserve `count` fresh session ids for [`NewSession::with_id`]: ids
    /// are never handed out twice, across connections and processes (an id
    /// reserved and never used leaves a gap).
    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError>;

    /// Register a session and return its id: the one it was given with
    /// [`NewSession::with_id`] (reserved earlier), or a fresh one. Refused
    /// with [`StoreError::LeaseLost`] once the owner's lease expired, as
    /// every write of an owner to its sessions is (transitions, turns,
    /// chunks, claims, finalizes, batches).
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

    /// Open turn `no` of `id`, recording `input`, the messages sent to the
    /// provider (any JSON; typically an array of `{role, content}`). Refused
    /// while another turn is open, while the session is closing (claimed), or
    /// once it is settled or finalized.
    async fn start_turn(
        &self,
        id: SessionId,
        no: u32,
        input: Option<Value>,
        at: SystemTime,
    ) -> Result<(), StoreError>;

    /// Append a chunk (text, or structured with its JSON) to turn `turn` of
    /// `id`. The chunk is queued now, in call order; the receipt resolves once
    /// it is committed (G7), or with [`StoreError::TurnClosed`] if the turn has
    /// ended or [`StoreError::SessionClosed`] if the session is finalized.
    fn append_chunk(&self, id: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt;

    /// End turn `no` of `id` with `outcome` and, for a failed turn, the
    /// `error` that says why; it accepts no more chunks.
    async fn end_turn(
        &self,
        id: SessionId,
        no: u32,
        outcome: Outcome,
        error: Option<TurnError>,
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
    async fn finalize(&self, id: SessionId, plan: FinalizeRequest)
        -> Result<Finalized, StoreError>;

    /// Apply a batch of lifecycle writes in one transaction, in order, and
    /// answer each: the group commit of registrations, transitions, turn
    /// starts and ends and finalizes (SPEC §9). A write the lifecycle refuses
    /// gets its refusal and the writes after it see the session as that left
    /// it; it does not fail the others. Each finalize is still a
    /// compare-and-set on its own row, so it spends the latch once across
    /// processes (G2), and commits memory in that transaction from completed
    /// turns only (G7). When the transaction itself fails, nothing of the
    /// batch is written and every write gets that error. The answers come
    /// after the commit; the result has one entry per write, in order.
    async fn apply(&self, batch: Vec<LifecycleWrite>) -> Vec<Result<Applied, StoreError>>;

    /// Whether batches are applied in the order their [`apply`](Self::apply)
    /// futures are first polled, each whole before the next, whatever order
    /// they complete in. A store that says so lets a caller hand it the next
    /// batch while one is still being applied (the kernel's recorder builds
    /// and submits batch *k* + 1 while *k* commits, so the database never
    /// waits for it); one that does not is given one batch at a time. The
    /// default is `false`.
    fn applies_in_order(&self) -> bool {
        false
    }

    /// Finalize the sessions left live by crashed processes (G8).
    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError>;

    /// What [`recover`](Self::recover) would take over now, with each
    /// session's owner, its lease and why, without writing anything
    /// (`settle recover --dry-run`).
    async fn recovery_candidates(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<RecoveryCandidate>, StoreError>;

    /// The sessions `filter` selects, newest first unless it says otherwise.
    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRow>, StoreError>;

    /// The most recently registered session (in `state`, if given), for
    /// `settle chat --last`.
    async fn last_session(&self, state: Option<State>) -> Result<Option<SessionId>, StoreError>;

    /// One session with its turns, transcript and timeline.
    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError>;

    /// The memory committed for `id`.
    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError>;
}
