//! [`MemoryStore`]: an in-memory [`SessionStore`] for tests and benchmarks.
//!
//! It keeps the rules of [`Store`](crate::Store) where the lifecycle depends
//! on them — conditional transitions, the reclaim claim, the finalize latch,
//! closed sessions and closed turns, memory from completed turns only — and
//! answers every call at once, on the caller's task: no thread, no I/O, no
//! timer. So it works under tokio's paused clock, where a store that waits on
//! a thread would let the clock jump ahead, and it costs next to nothing when
//! a benchmark wants the store's writes out of the measurement.
//!
//! It is not durable: everything is lost when the last clone is dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use settle_core::{EndReason, Outcome, SessionId, State};

use crate::chunk::{ChunkAck, ChunkReceipt};
use crate::claim::{Claim, Ineligible};
use crate::error::StoreError;
use crate::latch::{Finalize, FinalizeReport, Finalized};
use crate::lease::{OwnerId, OwnerInfo};
use crate::read::{MemoryRow, SessionDetail, SessionRow, TimelineRow, TurnRow};
use crate::recover::{OwnerGone, RecoverOptions, RecoveryReport};
use crate::session::NewSession;
use crate::session_store::SessionStore;
use crate::time::{from_millis, to_millis};

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
/// use settle_store::{EndReason, Finalize, MemoryStore, NewSession, Outcome, OwnerInfo, SessionStore};
///
/// let store = MemoryStore::new();
/// let owner = store.register_owner(OwnerInfo::this_process(), Duration::from_secs(30)).await?;
/// let id = store.create_session(NewSession::new("root", owner)).await?;
/// store.start_turn(id, 1, SystemTime::now()).await?;
/// store.append_chunk(id, 1, "hello".into()).await?;
/// store.end_turn(id, 1, Outcome::Completed, SystemTime::now()).await?;
///
/// let plan = Finalize::new(EndReason::Completed).commit_memory(true);
/// assert!(store.finalize(id, plan.clone()).await?.won());
/// assert!(!store.finalize(id, plan).await?.won()); // G2: once
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
}

struct Owner {
    info: OwnerInfo,
    lease_expires_at: i64,
}

struct Row {
    name: String,
    parent: Option<SessionId>,
    owner: u64,
    state: State,
    outcome: Option<Outcome>,
    end_reason: Option<EndReason>,
    open_turn: Option<u32>,
    closing: Option<EndReason>,
    created_at: i64,
    finalized_at: Option<i64>,
    turns: BTreeMap<u32, TurnRec>,
    timeline: Vec<TimelineRow>,
    memories: Vec<MemoryRow>,
}

struct TurnRec {
    started_at: i64,
    ended_at: Option<i64>,
    outcome: Option<Outcome>,
    chunks: Vec<String>,
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
            state: self.state,
            outcome: self.outcome,
            end_reason: self.end_reason,
            turns: self.turns.len() as u64,
            chunks: self.chunk_count(),
            created_at: from_millis(self.created_at),
            finalized_at: self.finalized_at.map(from_millis),
        }
    }

    /// Why a write to turn `no` is refused, as [`Store`](crate::Store) says it.
    fn turn_refusal(&self, id: SessionId, no: u32) -> StoreError {
        if self.state == State::Finalized {
            return StoreError::SessionClosed(id);
        }
        match self.turns.get(&no) {
            None => StoreError::UnknownTurn {
                session: id,
                turn: no,
            },
            Some(_) => StoreError::TurnClosed {
                session: id,
                turn: no,
            },
        }
    }
}

/// Forward only, except `running → registered` when a turn ends; finalizing
/// goes through the latch.
fn allowed(from: State, to: State) -> bool {
    to != State::Finalized
        && (to.rank() > from.rank() || (from == State::Running && to == State::Registered))
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

impl Tables {
    fn row(&mut self, id: SessionId) -> Result<&mut Row, StoreError> {
        self.sessions
            .get_mut(&id.get())
            .ok_or(StoreError::UnknownSession(id))
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
        let row = self.row(id)?;
        if row.state == State::Finalized || owner.is_some_and(|o| o != row.owner) {
            return Ok(None);
        }
        let from = row.state;
        let outcome = outcome.or(if row.open_turn.is_some() {
            Some(Outcome::Interrupted)
        } else {
            row.outcome
        });
        row.state = State::Finalized;
        row.end_reason = Some(reason);
        row.finalized_at = Some(at);
        row.outcome = outcome;
        row.open_turn = None;
        // Close whatever turn is still open, so its work can write no more.
        let mut interrupted = None;
        for (no, turn) in row.turns.iter_mut() {
            if turn.ended_at.is_none() {
                turn.ended_at = Some(at);
                turn.outcome = Some(Outcome::Interrupted);
                interrupted = Some(*no);
            }
        }
        row.record(at, Some(from), State::Finalized, cause);
        Ok(Some(interrupted))
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError> {
        let mut tables = self.lock();
        tables.next_owner += 1;
        let id = tables.next_owner;
        let lease_expires_at = to_millis(SystemTime::now()).saturating_add(millis(ttl));
        tables.owners.insert(
            id,
            Owner {
                info: owner,
                lease_expires_at,
            },
        );
        Ok(OwnerId(id))
    }

    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        let mut tables = self.lock();
        let now = to_millis(SystemTime::now());
        let entry = tables
            .owners
            .get_mut(&owner.0)
            .ok_or(StoreError::UnknownOwner(owner))?;
        if entry.lease_expires_at <= now {
            return Err(StoreError::LeaseLost(owner));
        }
        entry.lease_expires_at = now.saturating_add(millis(ttl));
        Ok(from_millis(entry.lease_expires_at))
    }

    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        let mut tables = self.lock();
        let start = tables.next_session + 1;
        tables.next_session += u64::from(count);
        Ok(start..tables.next_session + 1)
    }

    async fn create_session(&self, new: NewSession) -> Result<SessionId, StoreError> {
        let mut tables = self.lock();
        if let Some(parent) = new.parent {
            let row = tables.row(parent)?;
            if !row.state.is_open() {
                return Err(StoreError::ParentClosed {
                    parent,
                    state: row.state,
                });
            }
        }
        if !tables.owners.contains_key(&new.owner.0) {
            return Err(StoreError::UnknownOwner(new.owner));
        }
        let id = match new.id {
            Some(SessionId(id)) if tables.sessions.contains_key(&id) => {
                return Err(StoreError::DuplicateSession(SessionId(id)))
            }
            Some(SessionId(id)) => {
                tables.next_session = tables.next_session.max(id);
                id
            }
            None => {
                tables.next_session += 1;
                tables.next_session
            }
        };
        let at = to_millis(new.created_at);
        let mut row = Row {
            name: new.name,
            parent: new.parent,
            owner: new.owner.0,
            state: State::Registered,
            outcome: None,
            end_reason: None,
            open_turn: None,
            closing: None,
            created_at: at,
            finalized_at: None,
            turns: BTreeMap::new(),
            timeline: Vec::new(),
            memories: Vec::new(),
        };
        row.record(at, None, State::Registered, "registered");
        tables.sessions.insert(id, row);
        Ok(SessionId(id))
    }

    async fn transition(
        &self,
        id: SessionId,
        from: State,
        to: State,
        cause: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        if !allowed(from, to) {
            return Err(StoreError::InvalidTransition {
                session: id,
                from,
                to,
            });
        }
        let mut tables = self.lock();
        let row = tables.row(id)?;
        if row.state != from {
            return Err(if row.state == State::Finalized {
                StoreError::SessionClosed(id)
            } else {
                StoreError::StateMismatch {
                    session: id,
                    expected: from,
                    found: row.state,
                }
            });
        }
        row.state = to;
        row.record(to_millis(at), Some(from), to, cause);
        Ok(())
    }

    async fn start_turn(&self, id: SessionId, no: u32, at: SystemTime) -> Result<(), StoreError> {
        let mut tables = self.lock();
        let row = tables.row(id)?;
        if row.state == State::Finalized {
            return Err(StoreError::SessionClosed(id));
        }
        if let Some(reason) = row.closing {
            return Err(StoreError::SessionClosing {
                session: id,
                reason,
            });
        }
        if let Some(open) = row.open_turn {
            return Err(StoreError::TurnInFlight { session: id, open });
        }
        if !matches!(row.state, State::Registered | State::Running) {
            return Err(StoreError::NotAcceptingTurns {
                session: id,
                state: row.state,
            });
        }
        if row.turns.contains_key(&no) {
            return Err(StoreError::TurnExists {
                session: id,
                turn: no,
            });
        }
        row.open_turn = Some(no);
        row.turns.insert(
            no,
            TurnRec {
                started_at: to_millis(at),
                ended_at: None,
                outcome: None,
                chunks: Vec::new(),
            },
        );
        Ok(())
    }

    fn append_chunk(&self, id: SessionId, turn: u32, text: String) -> ChunkReceipt {
        let mut tables = self.lock();
        let result = tables.row(id).and_then(|row| {
            if row.state != State::Finalized {
                if let Some(t) = row.turns.get_mut(&turn).filter(|t| t.ended_at.is_none()) {
                    let seq =
                        u32::try_from(t.chunks.len()).map_err(|_| StoreError::OutOfRange {
                            what: "chunk sequence number",
                            value: t.chunks.len() as u64,
                        })?;
                    t.chunks.push(text);
                    return Ok(ChunkAck {
                        session: id,
                        turn,
                        seq,
                    });
                }
            }
            Err(row.turn_refusal(id, turn))
        });
        ChunkReceipt::ready(result)
    }

    async fn end_turn(
        &self,
        id: SessionId,
        no: u32,
        outcome: Outcome,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let mut tables = self.lock();
        let row = tables.row(id)?;
        match row.turns.get_mut(&no).filter(|t| t.ended_at.is_none()) {
            Some(turn) => {
                turn.ended_at = Some(to_millis(at));
                turn.outcome = Some(outcome);
            }
            None => return Err(row.turn_refusal(id, no)),
        }
        if row.open_turn == Some(no) {
            row.open_turn = None;
            row.outcome = Some(outcome);
        }
        Ok(())
    }

    async fn claim(&self, id: SessionId, reason: EndReason) -> Result<Claim, StoreError> {
        let mut tables = self.lock();
        let row = tables.row(id)?;
        let open_turn = row.open_turn.or_else(|| {
            row.turns
                .iter()
                .find(|(_, t)| t.ended_at.is_none())
                .map(|(no, _)| *no)
        });
        let why = if row.state == State::Finalized {
            Ineligible::Finalized
        } else if let Some(r) = row.closing {
            Ineligible::Closing(r)
        } else if let Some(t) = open_turn {
            Ineligible::TurnInFlight(t)
        } else if row.state != State::Registered {
            Ineligible::State(row.state)
        } else {
            row.closing = Some(reason);
            return Ok(Claim::Claimed);
        };
        Ok(Claim::NotEligible(why))
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn finalize(&self, id: SessionId, plan: Finalize) -> Result<Finalized, StoreError> {
        let mut tables = self.lock();
        let at = to_millis(plan.at);
        let cause = format!("finalize: {}", plan.reason);
        let Some(interrupted) = tables.spend(id, plan.reason, plan.outcome, at, None, &cause)?
        else {
            return Ok(Finalized::AlreadyFinalized);
        };
        let mut report = FinalizeReport {
            interrupted_turn: interrupted,
            ..FinalizeReport::default()
        };
        if plan.commit_memory {
            let row = tables.row(id)?;
            // One row per completed turn with chunks (G7): failed, cancelled,
            // detached and interrupted turns contribute nothing.
            let fresh: Vec<MemoryRow> = row
                .turns
                .iter()
                .filter(|(_, t)| t.outcome == Some(Outcome::Completed) && !t.chunks.is_empty())
                .map(|(no, t)| MemoryRow {
                    turn: *no,
                    content: t.chunks.concat(),
                })
                .collect();
            report.memories = fresh.len();
            row.memories.extend(fresh);
        }
        Ok(Finalized::Won(report))
    }

    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError> {
        let mut tables = self.lock();
        let now = to_millis(options.now);
        let mut verdicts: BTreeMap<u64, Option<OwnerGone>> = BTreeMap::new();
        for (id, owner) in &tables.owners {
            let live = tables
                .sessions
                .values()
                .any(|r| r.owner == *id && r.state != State::Finalized);
            if !live {
                continue;
            }
            let verdict = if owner.lease_expires_at <= now {
                Some(OwnerGone::LeaseExpired)
            } else if owner.info.host == options.this_host
                && crate::sys::process_is_gone(i64::from(owner.info.pid)) == Some(true)
            {
                Some(OwnerGone::ProcessGone)
            } else {
                None
            };
            verdicts.insert(*id, verdict);
        }
        let mut report = RecoveryReport {
            owners_gone: verdicts
                .iter()
                .filter_map(|(o, v)| v.map(|v| (OwnerId(*o), v)))
                .collect(),
            ..RecoveryReport::default()
        };
        // Newest first: children are created after their parents, so they are
        // finalized before them (G1).
        let live: Vec<(u64, u64)> = tables
            .sessions
            .iter()
            .rev()
            .filter(|(_, r)| r.state != State::Finalized)
            .map(|(id, r)| (*id, r.owner))
            .collect();
        for (raw, owner) in live {
            let Some(gone) = verdicts.get(&owner).copied().flatten() else {
                continue;
            };
            let cause = match gone {
                OwnerGone::LeaseExpired => format!("recovered: the lease of owner {owner} expired"),
                OwnerGone::ProcessGone => {
                    let info = tables.owners.get(&owner).map(|o| &o.info);
                    let (pid, host) = info.map_or((0, ""), |i| (i.pid, i.host.as_str()));
                    format!("recovered: owner {owner} (process {pid} on {host}) is gone")
                }
            };
            let id = SessionId(raw);
            let ending = EndReason::Recovered;
            match tables.spend(id, ending, None, now, Some(owner), &cause)? {
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

    async fn list_sessions(&self, state: Option<State>) -> Result<Vec<SessionRow>, StoreError> {
        let tables = self.lock();
        Ok(tables
            .sessions
            .iter()
            .filter(|(_, r)| state.is_none_or(|s| r.state == s))
            .map(|(id, r)| r.to_session_row(*id))
            .collect())
    }

    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        let mut tables = self.lock();
        let row = tables.row(id)?;
        Ok(SessionDetail {
            session: row.to_session_row(id.get()),
            turns: row
                .turns
                .iter()
                .map(|(no, t)| TurnRow {
                    no: *no,
                    outcome: t.outcome,
                    started_at: from_millis(t.started_at),
                    ended_at: t.ended_at.map(from_millis),
                    chunks: t.chunks.clone(),
                })
                .collect(),
            timeline: row.timeline.clone(),
            finalize_errors: None,
        })
    }

    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
        let tables = self.lock();
        Ok(tables
            .sessions
            .get(&id.get())
            .map(|r| r.memories.clone())
            .unwrap_or_default())
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    async fn store_with_session() -> (MemoryStore, SessionId) {
        let store = MemoryStore::new();
        let owner = store
            .register_owner(OwnerInfo::this_process(), Duration::from_secs(30))
            .await
            .unwrap();
        let id = store
            .create_session(NewSession::new("s", owner))
            .await
            .unwrap();
        (store, id)
    }

    #[tokio::test]
    async fn g2_the_latch_is_spent_once_and_closes_the_session() {
        let (store, id) = store_with_session().await;
        let now = SystemTime::now();
        store.start_turn(id, 1, now).await.unwrap();
        store.append_chunk(id, 1, "a".into()).await.unwrap();
        let won = store
            .finalize(id, Finalize::new(EndReason::Shutdown).commit_memory(true))
            .await
            .unwrap();
        let Finalized::Won(report) = won else {
            panic!("the first finalize must win")
        };
        // The open turn was interrupted: no memory from a truncated turn (G7).
        assert_eq!(report.interrupted_turn, Some(1));
        assert_eq!(report.memories, 0);
        assert!(matches!(
            store
                .finalize(id, Finalize::new(EndReason::Completed))
                .await,
            Ok(Finalized::AlreadyFinalized)
        ));
        // G10: every write after it is refused with a typed error.
        assert!(matches!(
            store.append_chunk(id, 1, "b".into()).await,
            Err(StoreError::SessionClosed(_))
        ));
        assert!(matches!(
            store
                .transition(id, State::Registered, State::Running, "x", now)
                .await,
            Err(StoreError::SessionClosed(_))
        ));
        let detail = store.session_detail(id).await.unwrap();
        assert_eq!(detail.session.end_reason, Some(EndReason::Shutdown));
        assert_eq!(detail.session.outcome, Some(Outcome::Interrupted));
        assert_eq!(detail.turns[0].chunks, vec!["a".to_owned()]);
    }

    #[tokio::test]
    async fn transitions_are_conditional_and_turns_close() {
        let (store, id) = store_with_session().await;
        let now = SystemTime::now();
        assert!(matches!(
            store
                .transition(id, State::Running, State::Cancelling, "x", now)
                .await,
            Err(StoreError::StateMismatch {
                expected: State::Running,
                found: State::Registered,
                ..
            })
        ));
        store.start_turn(id, 1, now).await.unwrap();
        assert!(matches!(
            store.claim(id, EndReason::IdleReap).await,
            Ok(Claim::NotEligible(Ineligible::TurnInFlight(1)))
        ));
        for text in ["x", "y", "z"] {
            store.append_chunk(id, 1, text.into()).await.unwrap();
        }
        store
            .end_turn(id, 1, Outcome::Completed, now)
            .await
            .unwrap();
        assert!(matches!(
            store.append_chunk(id, 1, "late".into()).await,
            Err(StoreError::TurnClosed { turn: 1, .. })
        ));
        assert_eq!(
            store.claim(id, EndReason::IdleReap).await.unwrap(),
            Claim::Claimed
        );
        // A claimed session admits no new turn.
        assert!(matches!(
            store.start_turn(id, 2, now).await,
            Err(StoreError::SessionClosing { .. })
        ));
        let plan = Finalize::new(EndReason::IdleReap).commit_memory(true);
        assert!(store.finalize(id, plan).await.unwrap().won());
        let memories = store.memories(id).await.unwrap();
        assert_eq!(memories.len(), 1);
        assert_eq!(memories[0].content, "xyz");
        let rows = store.list_sessions(Some(State::Finalized)).await.unwrap();
        assert_eq!((rows.len(), rows[0].chunks, rows[0].turns), (1, 3, 1));
        assert!(store
            .list_sessions(Some(State::Registered))
            .await
            .unwrap()
            .is_empty());
    }
}
