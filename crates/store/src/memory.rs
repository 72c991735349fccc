//! [`MemoryStore`]: an in-memory [`SessionStore`] for tests and benchmarks.
//!
//! It keeps the rules of [`Store`](crate::Store) where the lifecycle depends
//! on them — conditional transitions, the finalize latch, closed sessions and
//! closed turns, memory from completed turns only — and answers every call
//! at once, on the caller's task: no thread, no I/O, no timer. So it works
//! under tokio's paused clock, where a store that waits on a thread would let
//! the clock jump ahead, and it costs next to nothing when a benchmark wants
//! the store's writes out of the measurement.
//!
//! The store's shared test suite runs on it as on both databases, so the two
//! implementations cannot drift apart. It is not durable: everything is lost
//! when the last clone is dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use settle_core::{Cause, ChunkKind, EndReason, Outcome, SessionId, State, TurnError};

use crate::batch::{Applied, LifecycleWrite};
use crate::chunk::{ChunkAck, ChunkReceipt, NewChunk};
use crate::error::StoreError;
use crate::input::TurnInput;
use crate::latch::{FinalizeReport, FinalizeRequest, Finalized};
use crate::lease::{fence, OwnerId, OwnerInfo, OwnerRow};
use crate::list::{ListOrder, SessionFilter};
use crate::read::{ChunkRow, MemoryRow, SessionDetail, SessionRow, TimelineRow, TurnRow};
use crate::recover::{verdict, OwnerGone, RecoverOptions, RecoveryCandidate, RecoveryReport};
use crate::rules::{allowed, turn_refusal, Live, TurnSeen};
use crate::session::NewSession;
use crate::session_store::SessionStore;
use crate::time::{duration_millis, from_millis, to_millis};

/// An in-memory [`SessionStore`]: faithful to the lifecycle rules of
/// [`Store`](crate::Store), immediate, not durable. Cheap to clone: clones
/// share one set of sessions.
///
/// Times are kept to the millisecond, as the database keeps them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), settle_store::StoreError> {
/// use std::time::{Duration, SystemTime};
/// use settle_store::{
///     Applied, EndReason, FinalizeRequest, Finalized, LifecycleWrite, MemoryStore, NewSession,
///     Outcome, OwnerInfo, SessionStore,
/// };
///
/// let store = MemoryStore::new();
/// let owner = store.register_owner(OwnerInfo::this_process(), Duration::from_secs(30)).await?;
/// // Every lifecycle write goes through `apply`: a batch, one answer per write.
/// let registered = store
///     .apply(vec![LifecycleWrite::Register(NewSession::new("root", owner))])
///     .await;
/// let Some(Ok(Applied::Registered(id))) = registered.first().cloned() else {
///     unreachable!("one answer per write")
/// };
/// let now = SystemTime::now();
/// let started = store
///     .apply(vec![LifecycleWrite::StartTurn { session: id, no: 1, input: None, at: now }])
///     .await;
/// assert!(started.iter().all(Result::is_ok));
/// store.append_chunk(id, 1, "hello".into()).await?;
///
/// let plan = FinalizeRequest::new(EndReason::Completed).commit_memory(true);
/// let finalize = LifecycleWrite::Finalize { session: id, plan };
/// let answers = store
///     .apply(vec![
///         LifecycleWrite::EndTurn { session: id, no: 1, outcome: Outcome::Completed, error: None, at: now },
///         finalize.clone(),
///         finalize, // G2: once
///     ])
///     .await;
/// assert!(matches!(answers[1], Ok(Applied::Finalized(Finalized::Won(_)))));
/// assert!(matches!(answers[2], Ok(Applied::Finalized(Finalized::AlreadyFinalized))));
/// assert_eq!(store.memories(id).await?[0].content, "hello");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Tables>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tables = self.lock();
        f.debug_struct("MemoryStore")
            .field("sessions", &tables.sessions.len())
            .field("owners", &tables.owners.len())
            .finish()
    }
}

#[derive(Default)]
struct Tables {
    owners: HashMap<u64, Owner>,
    next_owner: u64,
    sessions: BTreeMap<u64, Row>,
    next_session: u64,
    /// Who may use each session through a gateway, where one was recorded.
    principals: HashMap<u64, String>,
}

struct Owner {
    info: OwnerInfo,
    lease_expires_at: i64,
}

impl Owner {
    fn to_row(&self, id: u64) -> OwnerRow {
        OwnerRow {
            id: OwnerId(id),
            host: self.info.host.clone(),
            identity: self.info.identity.clone(),
            pid: self.info.pid,
            started_at: from_millis(to_millis(self.info.started_at)),
            lease_expires_at: from_millis(self.lease_expires_at),
        }
    }
}

struct Row {
    name: String,
    parent: Option<SessionId>,
    owner: u64,
    live: Live,
    created_at: i64,
    resumed_from: Option<SessionId>,
    turns: BTreeMap<u32, TurnRec>,
    timeline: Vec<TimelineRow>,
    memories: Vec<MemoryRow>,
}

struct TurnRec {
    started_at: i64,
    ended_at: Option<i64>,
    outcome: Option<Outcome>,
    input: Option<TurnInput>,
    error: Option<TurnError>,
    chunks: Vec<ChunkRow>,
}

impl TurnRec {
    fn to_row(&self, no: u32) -> TurnRow {
        TurnRow {
            no,
            outcome: self.outcome,
            started_at: from_millis(self.started_at),
            ended_at: self.ended_at.map(from_millis),
            input: self.input.clone(),
            error: self.error.clone(),
            chunks: self.chunks.clone(),
        }
    }
}

impl Row {
    fn record(&mut self, at: i64, from: Option<State>, to: State, cause: &str) {
        self.timeline.push(TimelineRow {
            at: from_millis(at),
            from,
            to,
            cause: cause.to_owned(),
        });
    }

    fn chunk_count(&self) -> u64 {
        self.turns.values().map(|t| t.chunks.len() as u64).sum()
    }

    fn to_session_row(&self, id: u64) -> SessionRow {
        SessionRow {
            id: SessionId(id),
            name: self.name.clone(),
            parent: self.parent,
            state: self.live.state,
            outcome: self.live.outcome,
            end_reason: self.live.end_reason,
            turns: self.turns.len() as u64,
            chunks: self.chunk_count(),
            created_at: from_millis(self.created_at),
            finalized_at: self.live.finalized_at.map(from_millis),
            resumed_from: self.resumed_from,
            owner: None,
        }
    }

    fn seen(&self, no: u32) -> TurnSeen {
        match self.turns.get(&no) {
            None => TurnSeen::Missing,
            Some(t) if t.ended_at.is_none() => TurnSeen::Open,
            Some(_) => TurnSeen::Ended,
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // Every critical section leaves the tables consistent before it can
        // panic, so a poisoned lock is still good to use.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many sessions it holds, finalized ones included.
    pub fn len(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Whether it holds no session.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// Each write is a method on the tables, so that one lock covers it whole, as
// one transaction does in the database.
impl Tables {
    fn row(&mut self, id: SessionId) -> Result<&mut Row, StoreError> {
        self.sessions
            .get_mut(&id.get())
            .ok_or(StoreError::UnknownSession(id))
    }

    /// The row of session `id` for a write of its owner: refused with
    /// `LeaseLost` once the owner's lease expired (by this machine's clock,
    /// the store's clock here).
    fn owned_row(&mut self, id: SessionId) -> Result<&mut Row, StoreError> {
        let now = to_millis(SystemTime::now());
        let row = self
            .sessions
            .get_mut(&id.get())
            .ok_or(StoreError::UnknownSession(id))?;
        let expires = self
            .owners
            .get(&row.owner)
            .map_or(i64::MIN, |o| o.lease_expires_at);
        fence(i64::try_from(row.owner).unwrap_or(i64::MAX), expires, now)?;
        Ok(row)
    }

    fn register_owner(&mut self, info: OwnerInfo, ttl: Duration) -> OwnerId {
        self.next_owner += 1;
        let id = self.next_owner;
        let lease_expires_at = to_millis(SystemTime::now()).saturating_add(duration_millis(ttl));
        self.owners.insert(
            id,
            Owner {
                info,
                lease_expires_at,
            },
        );
        OwnerId(id)
    }

    fn renew_lease(&mut self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        let now = to_millis(SystemTime::now());
        let entry = self
            .owners
            .get_mut(&owner.0)
            .ok_or(StoreError::UnknownOwner(owner))?;
        if entry.lease_expires_at <= now {
            return Err(StoreError::LeaseLost(owner));
        }
        entry.lease_expires_at = now.saturating_add(duration_millis(ttl));
        Ok(from_millis(entry.lease_expires_at))
    }

    fn register(&mut self, new: NewSession) -> Result<SessionId, StoreError> {
        if let Some(previous) = new.resumed_from {
            if !self.sessions.contains_key(&previous.get()) {
                return Err(StoreError::UnknownSession(previous));
            }
        }
        if let Some(parent) = new.parent {
            let row = self.row(parent)?;
            if !row.live.state.is_open() {
                return Err(StoreError::ParentClosed {
                    parent,
                    state: row.live.state,
                });
            }
        }
        match self.owners.get(&new.owner.0) {
            None => return Err(StoreError::UnknownOwner(new.owner)),
            Some(owner) => fence(
                new.owner.raw()?,
                owner.lease_expires_at,
                to_millis(SystemTime::now()),
            )?,
        }
        let id = match new.id {
            Some(SessionId(id)) if self.sessions.contains_key(&id) => {
                return Err(StoreError::DuplicateSession(SessionId(id)))
            }
            Some(SessionId(id)) => {
                self.next_session = self.next_session.max(id);
                id
            }
            None => {
                self.next_session += 1;
                self.next_session
            }
        };
        let at = to_millis(new.created_at);
        let mut row = Row {
            name: new.name,
            parent: new.parent,
            owner: new.owner.0,
            live: Live::registered(),
            created_at: at,
            resumed_from: new.resumed_from,
            turns: BTreeMap::new(),
            timeline: Vec::new(),
            memories: Vec::new(),
        };
        row.record(at, None, State::Registered, &Cause::Registered.to_string());
        self.sessions.insert(id, row);
        if let Some(principal) = new.principal {
            self.principals.insert(id, principal);
        }
        Ok(SessionId(id))
    }

    fn transition(
        &mut self,
        id: SessionId,
        from: State,
        to: State,
        cause: Cause,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        if !allowed(from, to) {
            // Refused before the session is looked up, as the database does.
            return Err(StoreError::InvalidTransition {
                session: id,
                from,
                to,
            });
        }
        let row = self.owned_row(id)?;
        row.live.transition(id, from, to)?;
        row.record(to_millis(at), Some(from), to, &cause.to_string());
        Ok(())
    }

    fn start_turn(
        &mut self,
        id: SessionId,
        no: u32,
        input: Option<TurnInput>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let row = self.owned_row(id)?;
        let seen = row.seen(no);
        row.live.start_turn(id, no, seen)?;
        row.turns.insert(
            no,
            TurnRec {
                started_at: to_millis(at),
                ended_at: None,
                outcome: None,
                input,
                error: None,
                chunks: Vec::new(),
            },
        );
        Ok(())
    }

    fn append_chunk(
        &mut self,
        id: SessionId,
        turn: u32,
        chunk: NewChunk,
    ) -> Result<ChunkAck, StoreError> {
        let row = self.owned_row(id)?;
        let seen = row.seen(turn);
        match row.turns.get_mut(&turn) {
            Some(t) if seen == TurnSeen::Open && row.live.state != State::Finalized => {
                let seq = u32::try_from(t.chunks.len()).map_err(|_| StoreError::OutOfRange {
                    what: "chunk sequence number",
                    value: t.chunks.len() as u64,
                })?;
                t.chunks.push(ChunkRow {
                    seq,
                    kind: chunk.kind,
                    text: chunk.text,
                    data: chunk.data,
                });
                Ok(ChunkAck {
                    session: id,
                    turn,
                    seq,
                })
            }
            _ => Err(turn_refusal(&row.live, id, turn, seen)),
        }
    }

    fn end_turn(
        &mut self,
        id: SessionId,
        no: u32,
        outcome: Outcome,
        error: Option<TurnError>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let row = self.owned_row(id)?;
        let seen = row.seen(no);
        row.live.end_turn(id, no, outcome, seen)?;
        if let Some(turn) = row.turns.get_mut(&no) {
            turn.ended_at = Some(to_millis(at));
            turn.outcome = Some(outcome);
            turn.error = error;
        }
        Ok(())
    }

    /// The finalize latch: `None` when the session was already finalized (or,
    /// with `owner`, no longer that owner's).
    fn spend(
        &mut self,
        id: SessionId,
        reason: EndReason,
        outcome: Option<Outcome>,
        at: i64,
        owner: Option<u64>,
        cause: &str,
    ) -> Result<Option<Option<u32>>, StoreError> {
        // The owner's own finalize is fenced by its lease; recovery's is not.
        let row = match owner {
            None => self.owned_row(id)?,
            Some(_) => self.row(id)?,
        };
        if owner.is_some_and(|o| o != row.owner) {
            return Ok(None);
        }
        let Some(spent) = row.live.spend(reason, outcome, at) else {
            return Ok(None);
        };
        // Close whatever turn is still open, so its work can write no more.
        for turn in row.turns.values_mut() {
            if turn.ended_at.is_none() {
                turn.ended_at = Some(at);
                turn.outcome = Some(Outcome::Interrupted);
            }
        }
        row.record(at, Some(spent.from), State::Finalized, cause);
        Ok(Some(spent.interrupted))
    }

    fn finalize(&mut self, id: SessionId, plan: &FinalizeRequest) -> Result<Finalized, StoreError> {
        let at = to_millis(plan.at);
        let cause = Cause::Finalized(plan.reason).to_string();
        if self.owned_row(id)?.live.state == State::Finalized {
            return Ok(Finalized::AlreadyFinalized);
        }
        // What it carries first, each as its own write would be.
        let mut refused = Vec::new();
        for step in plan.steps() {
            let moved = self.transition(id, step.from, step.to, step.cause, step.at);
            refused.extend(moved.err());
        }
        if let Some(end) = &plan.turn_end {
            let ended = self.end_turn(id, end.no, end.outcome, end.error.clone(), end.at);
            refused.extend(ended.err());
        }
        let Some(interrupted) = self.spend(id, plan.reason, plan.outcome, at, None, &cause)? else {
            return Ok(Finalized::AlreadyFinalized);
        };
        let mut report = FinalizeReport {
            interrupted_turn: interrupted,
            refused,
            ..FinalizeReport::default()
        };
        if plan.commit_memory {
            let row = self.row(id)?;
            // One row per completed turn with reply text (G7): failed,
            // cancelled, detached and interrupted turns contribute nothing.
            let fresh: Vec<MemoryRow> = row
                .turns
                .iter()
                .filter(|(_, t)| t.outcome == Some(Outcome::Completed))
                .filter(|(_, t)| t.chunks.iter().any(|c| c.kind == ChunkKind::Text))
                .map(|(no, t)| MemoryRow {
                    turn: *no,
                    content: t.to_row(*no).text(),
                })
                .collect();
            report.memories = fresh.len();
            row.memories.extend(fresh);
        }
        Ok(Finalized::Won(report))
    }

    fn apply(&mut self, write: LifecycleWrite) -> Result<Applied, StoreError> {
        match write {
            LifecycleWrite::Register(new) => self.register(new).map(Applied::Registered),
            LifecycleWrite::Transition {
                session,
                from,
                to,
                cause,
                at,
            } => self
                .transition(session, from, to, cause, at)
                .map(|()| Applied::Done),
            LifecycleWrite::StartTurn {
                session,
                no,
                input,
                at,
            } => self
                .start_turn(session, no, input, at)
                .map(|()| Applied::Done),
            LifecycleWrite::EndTurn {
                session,
                no,
                outcome,
                error,
                at,
            } => self
                .end_turn(session, no, outcome, error, at)
                .map(|()| Applied::Done),
            LifecycleWrite::Finalize { session, plan } => {
                self.finalize(session, &plan).map(Applied::Finalized)
            }
        }
    }

    fn recovery_candidates(&self, options: &RecoverOptions) -> Vec<RecoveryCandidate> {
        // The store's clock: this machine's.
        let now = to_millis(SystemTime::now());
        let mut verdicts: HashMap<u64, Option<OwnerGone>> = HashMap::new();
        let mut found = Vec::new();
        // Newest first: children are created after their parents, so they are
        // finalized before them (G1).
        for (id, row) in self.sessions.iter().rev() {
            if row.live.state == State::Finalized {
                continue;
            }
            let Some(owner) = self.owners.get(&row.owner) else {
                continue;
            };
            let verdict = *verdicts
                .entry(row.owner)
                .or_insert_with(|| verdict(&owner.to_row(row.owner), now, &options.here));
            let Some(reason) = verdict else { continue };
            found.push(RecoveryCandidate {
                session: SessionId(*id),
                name: row.name.clone(),
                state: row.live.state,
                open_turn: row.live.open_turn,
                owner: owner.to_row(row.owner),
                reason,
            });
        }
        let live = self
            .sessions
            .iter()
            .filter(|(_, row)| row.live.state != State::Finalized)
            .map(|(id, row)| (SessionId(*id), row.parent))
            .collect();
        crate::recover::sparing_parents_of_the_left(found, &live)
    }

    fn recover(&mut self, options: &RecoverOptions) -> Result<RecoveryReport, StoreError> {
        let now = to_millis(options.now);
        let found = self.recovery_candidates(options);
        let mut report = RecoveryReport::default();
        for candidate in &found {
            let gone = (candidate.owner.id, candidate.reason);
            if !report.owners_gone.contains(&gone) {
                report.owners_gone.push(gone);
            }
        }
        report.owners_gone.sort();
        for candidate in found {
            let owner = &candidate.owner;
            let cause = match candidate.reason {
                OwnerGone::LeaseExpired => {
                    format!("recovered: the lease of owner {} expired", owner.id)
                }
                OwnerGone::ProcessGone => format!(
                    "recovered: owner {} (process {} on {}) is gone",
                    owner.id, owner.pid, owner.host
                ),
            };
            let id = candidate.session;
            let ending = EndReason::Recovered;
            match self.spend(id, ending, None, now, Some(owner.id.0), &cause)? {
                Some(interrupted) => {
                    report.recovered.push(id);
                    if let Some(turn) = interrupted {
                        report.interrupted_turns.push((id, turn));
                    }
                }
                None => report.finalized_elsewhere.push(id),
            }
        }
        Ok(report)
    }

    fn list_sessions(&self, filter: &SessionFilter) -> Vec<SessionRow> {
        let only: Option<std::collections::HashSet<u64>> = filter
            .ids
            .as_ref()
            .map(|ids| ids.iter().map(|id| id.get()).collect());
        let admitted = |(id, r): &(&u64, &Row)| {
            only.as_ref().is_none_or(|only| only.contains(*id))
                && match &filter.principal {
                    None => true,
                    Some(None) => !self.principals.contains_key(*id),
                    Some(Some(name)) => self.principals.get(*id) == Some(name),
                }
                && filter.admits(SessionId(**id), r.live.state, from_millis(r.created_at))
        };
        let limit = filter.limit.unwrap_or(usize::MAX);
        let rows = |it: &mut dyn Iterator<Item = (&u64, &Row)>| {
            it.filter(admitted)
                .take(limit)
                .map(|(id, r)| r.to_session_row(*id))
                .collect()
        };
        // By registration time, then id, as the databases order them.
        let mut ordered: Vec<(&u64, &Row)> = self.sessions.iter().collect();
        ordered.sort_by_key(|(id, r)| (r.created_at, **id));
        match filter.order {
            ListOrder::NewestFirst => rows(&mut ordered.into_iter().rev()),
            ListOrder::OldestFirst => rows(&mut ordered.into_iter()),
        }
    }

    fn last_session(&self, state: Option<State>) -> Option<SessionId> {
        self.sessions
            .iter()
            .filter(|(_, r)| state.is_none_or(|s| r.live.state == s))
            .max_by_key(|(id, r)| (r.created_at, **id))
            .map(|(id, _)| SessionId(*id))
    }

    fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        let row = self
            .sessions
            .get(&id.get())
            .ok_or(StoreError::UnknownSession(id))?;
        Ok(SessionDetail {
            session: row.to_session_row(id.get()),
            turns: row.turns.iter().map(|(no, t)| t.to_row(*no)).collect(),
            timeline: row.timeline.clone(),
            finalize_errors: None,
        })
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError> {
        Ok(self.lock().register_owner(owner, ttl))
    }

    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        self.lock().renew_lease(owner, ttl)
    }

    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        let mut tables = self.lock();
        let start = tables.next_session + 1;
        tables.next_session += u64::from(count);
        Ok(start..tables.next_session + 1)
    }

    fn append_chunk(&self, id: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt {
        ChunkReceipt::ready(self.lock().append_chunk(id, turn, chunk))
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn apply(&self, batch: Vec<LifecycleWrite>) -> Vec<Result<Applied, StoreError>> {
        // One lock for the whole batch, as one transaction in the database.
        let mut tables = self.lock();
        batch.into_iter().map(|write| tables.apply(write)).collect()
    }

    /// A batch is applied whole at its first poll.
    fn applies_in_order(&self) -> bool {
        true
    }

    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError> {
        self.lock().recover(&options)
    }

    async fn recovery_candidates(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<RecoveryCandidate>, StoreError> {
        Ok(self.lock().recovery_candidates(&options))
    }

    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRow>, StoreError> {
        Ok(self.lock().list_sessions(&filter))
    }

    async fn last_session(&self, state: Option<State>) -> Result<Option<SessionId>, StoreError> {
        Ok(self.lock().last_session(state))
    }

    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        self.lock().session_detail(id)
    }

    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
        Ok(self
            .lock()
            .sessions
            .get(&id.get())
            .map(|r| r.memories.clone())
            .unwrap_or_default())
    }

    async fn principal(&self, session: SessionId) -> Result<Option<String>, StoreError> {
        let tables = self.lock();
        if !tables.sessions.contains_key(&session.get()) {
            return Err(StoreError::UnknownSession(session));
        }
        Ok(tables.principals.get(&session.get()).cloned())
    }

    async fn set_principal(
        &self,
        session: SessionId,
        principal: Option<String>,
    ) -> Result<(), StoreError> {
        let mut tables = self.lock();
        match principal {
            Some(name) => tables.principals.insert(session.get(), name),
            None => tables.principals.remove(&session.get()),
        };
        Ok(())
    }
}
