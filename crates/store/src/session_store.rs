//! The store as the runtime sees it: an async trait, so the runtime can run
//! against [`Store`](crate::Store) or against a stub in benchmarks and tests.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use settle_core::{Holds, SessionId, State};

use crate::batch::{Applied, LifecycleWrite};
use crate::chunk::{ChunkReceipt, NewChunk};
use crate::error::StoreError;
use crate::fleet::{Adopted, PeerRelease, Whereabouts};
use crate::lease::{OwnerId, OwnerInfo};
use crate::list::SessionFilter;
use crate::page::TurnPage;
use crate::read::{MemoryRow, SessionDetail, SessionRow};
use crate::recover::{RecoverOptions, RecoveryCandidate, RecoveryReport};

/// The durable side of the session lifecycle.
///
/// **Every lifecycle write goes through [`apply`](Self::apply)**: a batch of
/// [`LifecycleWrite`]s (registrations, transitions, turn starts and ends,
/// finalizes), one answer per write. Besides the batch there are the owner's
/// lease ([`register_owner`](Self::register_owner),
/// [`renew_lease`](Self::renew_lease)), ids ([`reserve_ids`](Self::reserve_ids)),
/// the transcript's chunks ([`append_chunk`](Self::append_chunk),
/// [`flush`](Self::flush)), recovery and the reads. A wrapper that
/// intercepts lifecycle writes (to count, time or fail them) intercepts
/// `apply` alone.
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

    /// Reserve `count` fresh session ids for [`NewSession::with_id`](crate::NewSession::with_id): ids
    /// are never handed out twice, across connections and processes (an id
    /// reserved and never used leaves a gap).
    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError>;

    /// Append a chunk (text, or structured with its JSON) to turn `turn` of
    /// `id`. The chunk is queued now, in call order; the receipt resolves once
    /// it is committed (G7), or with [`StoreError::TurnClosed`] if the turn has
    /// ended, [`StoreError::SessionClosed`] if the session is finalized, or
    /// [`StoreError::LeaseLost`] once its owner's lease expired.
    fn append_chunk(&self, id: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt;

    /// Withdraws the chunks of turn `turn` of `id` numbered `from` and later
    /// that its writer gave up on: an append not answered within the
    /// caller's bound (its turn failed, its reader was never given the
    /// chunk) that a store still committing may write after all. Queued now,
    /// behind every append before it, it removes what they wrote from `from`
    /// on once they have; none of it was acknowledged. A finalized session
    /// is never touched. Nobody waits for it. The default does nothing: a
    /// store that answers every append at once (or not at all) has nothing
    /// to withdraw.
    fn withdraw_chunks(&self, id: SessionId, turn: u32, from: u32) {
        let _ = (id, turn, from);
    }

    /// Wait until every chunk appended so far is committed.
    async fn flush(&self) -> Result<(), StoreError>;

    /// Apply a batch of lifecycle writes in one transaction, in order, and
    /// answer each: the one write path of registrations, transitions, turn
    /// starts and ends and finalizes, group-committed (SPEC §9). Each
    /// [`LifecycleWrite`] variant says what it does and how it is refused.
    /// A write the lifecycle refuses gets its refusal and the writes after
    /// it see the session as that left it; it does not fail the others.
    /// Every write of an owner whose lease expired is refused with
    /// [`StoreError::LeaseLost`]. Each finalize is a compare-and-set on its
    /// own row, so it spends the latch once across processes (G2), and
    /// commits memory in that transaction from completed turns only (G7).
    /// When the transaction itself fails, nothing of the batch is written
    /// and every write gets that error. The answers come after the commit;
    /// the result has one entry per write, in order.
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

    /// The kernel's shutdown gave up on this store's writes (they were not
    /// committed within its budget: a lock, a server down): closing the
    /// store, when its last handle is dropped, does not wait for its
    /// threads again, which the shutdown already waited for. They are left
    /// behind, and what they had not committed is left to recovery (G8), as
    /// at a close that timed out. The default does nothing (a store with no
    /// threads to wait for).
    fn shutdown_gave_up(&self) {}

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

    /// Turn `turn` of `id` (its last when `None`) with at most `max_chunks`
    /// of its chunks from `from_seq`, and how many turns the session has:
    /// a page of a transcript without the rest of the session. Refused with
    /// [`StoreError::UnknownSession`] as `session_detail` is. The default
    /// cuts it from [`session_detail`](Self::session_detail); the stores of
    /// this crate read only the page.
    async fn turn_page(
        &self,
        id: SessionId,
        turn: Option<u32>,
        from_seq: u32,
        max_chunks: usize,
    ) -> Result<TurnPage, StoreError> {
        let detail = self.session_detail(id).await?;
        Ok(TurnPage::of(&detail, turn, from_seq, max_chunks))
    }

    /// The memory committed for `id`.
    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError>;

    // ----- a fleet of processes on one database (SPEC §12) -----------------
    // A store of one process only keeps the defaults: `apply_as` is `apply`,
    // the rest are refused with `StoreError::Unsupported`.

    /// [`apply`](Self::apply) the batch as `writer`, fenced per writer: a
    /// write about a session that `writer` does not own now (it released
    /// it, or another process adopted it) is refused with
    /// [`StoreError::HandedOff`], whoever's lease is live (G8, G12).
    async fn apply_as(
        &self,
        writer: OwnerId,
        batch: Vec<LifecycleWrite>,
    ) -> Vec<Result<Applied, StoreError>> {
        let _ = writer;
        self.apply(batch).await
    }

    /// [`apply_as`](Self::apply_as) for a batch handed while the batch
    /// handed before it may still be applying (by a caller of a store that
    /// [`applies_in_order`](Self::applies_in_order)): applied only if no
    /// batch of `writer` since the last one it handed with `apply_as`
    /// failed in a way that may heal (each writer keeps a chain of its
    /// own). Otherwise nothing of it is written and every
    /// write gets that failure again, so that its caller tries it again
    /// behind the writes that failed: a parent's finalize chained behind
    /// its child's is never committed ahead of it, even when the database
    /// takes writes again between the two (a lock released, room made on a
    /// disk, a server back). A batch handed with `apply_as` (its caller has
    /// seen every answer before it) starts the chain again.
    ///
    /// The default is `apply_as`: right for a store whose transactions do
    /// not fail (the memory store). A store that applies in order and whose
    /// transactions can fail must keep this rule.
    async fn apply_chained(
        &self,
        writer: OwnerId,
        batch: Vec<LifecycleWrite>,
    ) -> Vec<Result<Applied, StoreError>> {
        self.apply_as(writer, batch).await
    }

    /// Release `session`, idle (`registered`, no open turn) and owned by
    /// `owner`, for another process to adopt: no owner, timeline cause
    /// `handoff`. Its `holds` are kept for its adopter
    /// ([`Adopted::holds`]); held, it is not reaped as idle. Refused with [`StoreError::HandedOff`] when `owner` does
    /// not own it, [`StoreError::StateMismatch`] when it is not idle,
    /// [`StoreError::LeaseLost`] once `owner`'s lease expired.
    async fn release(
        &self,
        owner: OwnerId,
        session: SessionId,
        holds: Holds,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let _ = (owner, session, holds, at);
        Err(StoreError::Unsupported("handing sessions off"))
    }

    /// Release each of `sessions` as [`release`](Self::release) does, with
    /// a result for each in order: a process handing off many idle
    /// sessions at once (a shutdown with handoff) releases them in one
    /// call. The database store does it in one transaction, `owner`'s lease
    /// checked once and each row on its own (one refused leaves the others
    /// released; a database failure fails them all). By default, one
    /// [`release`](Self::release) after another.
    async fn release_all(
        &self,
        owner: OwnerId,
        sessions: Vec<crate::fleet::Release>,
    ) -> Vec<Result<(), StoreError>> {
        let mut results = Vec::with_capacity(sessions.len());
        for one in sessions {
            results.push(self.release(owner, one.session, one.holds, one.at).await);
        }
        results
    }

    /// Record `session`'s `holds` (its counts now) while `owner` owns it,
    /// live and not released, so that a process adopting it keeps them
    /// ([`Adopted::holds`]), after a handoff or after `owner` crashed and
    /// its lease expired (SPEC §5: a held session is reclaimable by no
    /// automatic path); none drops what was kept. A session finalized,
    /// released or owned by another process since is left as it is.
    /// Refused with [`StoreError::LeaseLost`] once `owner`'s lease expired.
    /// The default keeps nothing: a store with no fleet has no adopter.
    async fn record_holds(
        &self,
        owner: OwnerId,
        session: SessionId,
        holds: Holds,
    ) -> Result<(), StoreError> {
        let _ = (owner, session, holds);
        Ok(())
    }

    /// Adopt `session` for `owner`: one conditional update that takes a
    /// released session (or one whose owner's lease expired, its open turn
    /// marked `interrupted`, G8), so that of two processes racing, one wins
    /// and the other gets [`StoreError::Elsewhere`] naming the winner.
    /// Refused with [`StoreError::SessionClosed`] once finalized and
    /// [`StoreError::NotReleased`] when `owner` owns it or it is winding down.
    async fn adopt(
        &self,
        owner: OwnerId,
        session: SessionId,
        at: SystemTime,
    ) -> Result<Adopted, StoreError> {
        let _ = (owner, session, at);
        Err(StoreError::Unsupported("adopting sessions"))
    }

    /// Where `session` is: owned (by whom, reached where, whether its lease
    /// is live), released, or finalized.
    async fn locate(&self, session: SessionId) -> Result<Whereabouts, StoreError> {
        let _ = session;
        Err(StoreError::Unsupported("locating sessions in a fleet"))
    }

    /// Release for adoption every session that a peer whose lease expired
    /// left `registered` or `running`, its open turn marked `interrupted`
    /// (G8); `owner` is the live process asking, which must hold its lease.
    async fn release_expired(
        &self,
        owner: OwnerId,
        at: SystemTime,
    ) -> Result<PeerRelease, StoreError> {
        let _ = (owner, at);
        Err(StoreError::Unsupported(
            "releasing the sessions of expired peers",
        ))
    }

    /// Finalize `idle_reap`, once across the fleet, every session released
    /// at least `idle_ttl` ago (by the store's clock) that nobody adopted.
    async fn reap_released(&self, idle_ttl: Duration) -> Result<Vec<SessionId>, StoreError> {
        let _ = idle_ttl;
        Err(StoreError::Unsupported("reaping released sessions"))
    }

    /// Who may use `session` through a gateway, as
    /// [`set_principal`](Self::set_principal) recorded it (`None`: no
    /// principal was recorded).
    async fn principal(&self, session: SessionId) -> Result<Option<String>, StoreError> {
        let _ = session;
        Err(StoreError::Unsupported("reading principals"))
    }

    /// Record who may use `session` through a gateway, so that every process
    /// of the fleet enforces it ([`Adopted::principal`]).
    async fn set_principal(
        &self,
        session: SessionId,
        principal: Option<String>,
    ) -> Result<(), StoreError> {
        let _ = (session, principal);
        Err(StoreError::Unsupported("recording principals"))
    }
}
