//! Lifecycle writes group-committed: a batch of registrations, transitions,
//! turn starts and ends and finalizes, applied in one transaction, each with
//! its own result.
//!
//! A batch is applied in four moves, inside one write transaction:
//!
//! 1. **Read** every session it touches in bulk (on PostgreSQL with `FOR
//!    UPDATE`, in id order so that two batches never deadlock), the owners of
//!    its registrations, and the turns its turn writes name.
//! 2. **Decide**, in memory and in batch order, what each write does, by the
//!    same [rules](crate::rules) as [`MemoryStore`](crate::MemoryStore): a
//!    write the lifecycle refuses gets its refusal, and the writes after it
//!    see the session as it was left.
//! 3. **Write** the outcome back: the new sessions in multi-row INSERTs; one
//!    conditional UPDATE per changed session (compare-and-set on the version
//!    that was read, so a finalize spends the latch once across processes,
//!    G2), all of them in multi-row `UPDATE … FROM (VALUES …)` statements; the
//!    new turns and turn ends likewise, and one timeline segment per session
//!    holding all its transitions of the batch ([`timeline`](crate::timeline)).
//! 4. **Commit memory** for finalizes that ask for it, from completed turns
//!    only (G7), each in a savepoint of the same transaction.
//!
//! The answers are given after the commit. A refused write does not fail the
//! others; a database failure fails the whole batch (nothing of it is
//! written) and every write gets that error.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::ops::Range;
use std::time::SystemTime;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::Sqlite;
use serde_json::Value;
use settle_core::{Cause, Outcome, SessionId, State, TurnError};

use crate::conn::Db;
use crate::error::{Context, DbError, StoreError};
use crate::latch::{memory_step, Finalize, FinalizeReport, Finalized};
use crate::lease::{fence, store_now, OwnerId};
use crate::rows::{bind, Params, Rows};
use crate::rules::{allowed, Live, TurnSeen};
use crate::schema::{owners, sessions, turns};
use crate::session::NewSession;
use crate::time::{json_text, opt_word, session_id, sid, to_millis, turn_no, word};
use crate::timeline::Step;

/// Maps keyed by database ids: foldhash, not SipHash, on this hot path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// One write of a lifecycle batch
/// ([`SessionStore::apply`](crate::SessionStore::apply)). Each means what the
/// single call of the same name means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleWrite {
    /// Register a session; answered with [`Applied::Registered`].
    Register(NewSession),
    /// Move `session` from `from` to `to`, only if it is in `from` then,
    /// recording `cause` on its timeline. Finalizing goes through
    /// [`LifecycleWrite::Finalize`], which records its own transition.
    Transition {
        /// The session.
        session: SessionId,
        /// The state it must be in.
        from: State,
        /// The state it moves to.
        to: State,
        /// Why, as the timeline shows it.
        cause: Cause,
        /// When.
        at: SystemTime,
    },
    /// Open turn `no` of `session`, recording its input.
    StartTurn {
        /// The session.
        session: SessionId,
        /// The turn number.
        no: u32,
        /// The messages sent to the provider.
        input: Option<Value>,
        /// When.
        at: SystemTime,
    },
    /// End turn `no` of `session` with `outcome` and, if it failed, `error`.
    EndTurn {
        /// The session.
        session: SessionId,
        /// The turn number.
        no: u32,
        /// How it ended.
        outcome: Outcome,
        /// Why it failed.
        error: Option<TurnError>,
        /// When.
        at: SystemTime,
    },
    /// Spend the finalize latch of `session` with `plan`; answered with
    /// [`Applied::Finalized`].
    Finalize {
        /// The session.
        session: SessionId,
        /// What to do.
        plan: Finalize,
    },
}

/// What one write of a batch did.
#[derive(Debug, Clone)]
#[must_use]
pub enum Applied {
    /// The session was registered with this id.
    Registered(SessionId),
    /// The transition, turn start or turn end was applied.
    Done,
    /// The finalize ran: won, or the latch was already spent.
    Finalized(Finalized),
}

/// How many rows one multi-row statement carries, well under both backends'
/// bind limits.
const ROWS_PER_STATEMENT: usize = 256;

/// A session as the batch read it, and as its writes leave it.
struct Sim {
    live: Live,
    /// The turn open when the row was read: by the rows' invariant (a turn
    /// is open exactly while it is its session's `open_turn`), that turn is
    /// known open without reading it.
    read_open: Option<u32>,
    /// The version that was read: the compare-and-set of the write back.
    version: i64,
    tree: i64,
    owner: i64,
    changed: bool,
}

/// Whose timeline a row is on: a session that existed, or the `n`th
/// registration of the batch.
#[derive(Clone, Copy)]
enum Whose {
    Existing(i64),
    New(usize),
}

struct TimelineEntry {
    whose: Whose,
    at: i64,
    from: Option<State>,
    to: State,
    cause: Range<usize>,
}

struct TurnStart {
    session: i64,
    no: i64,
    at: i64,
    input: Option<String>,
}

struct TurnEnd<'b> {
    session: i64,
    no: i64,
    at: i64,
    outcome: &'static str,
    error_kind: Option<&'static str>,
    error_message: Option<&'b str>,
}

/// A session's row as the batch leaves it, and the version it must still
/// have.
struct SessionWrite {
    id: i64,
    version: i64,
    state: &'static str,
    outcome: Option<&'static str>,
    end_reason: Option<&'static str>,
    open_turn: Option<i64>,
    finalized_at: Option<i64>,
}

struct Segment<'e> {
    session: i64,
    steps: &'e str,
}

/// `Params` for both backends, from one body.
macro_rules! params {
    ($row:ident $(<$l:lifetime>)?, |$this:ident, $out:ident| $body:expr) => {
        impl $(<$l>)? Params<Sqlite> for $row $(<$l>)? {
            fn push<'x>(&'x self, $out: &mut AstPass<'_, 'x, Sqlite>) -> QueryResult<()> {
                let $this = self;
                $body
            }
        }
        impl $(<$l>)? Params<Pg> for $row $(<$l>)? {
            fn push<'x>(&'x self, $out: &mut AstPass<'_, 'x, Pg>) -> QueryResult<()> {
                let $this = self;
                $body
            }
        }
    };
}

params!(TurnStart, |r, out| bind!(out;
    BigInt => &r.session, BigInt => &r.no, BigInt => &r.at, BigInt => &0_i64,
    Nullable<Text> => &r.input));
params!(TurnEnd<'b>, |r, out| bind!(out;
    BigInt => &r.session, BigInt => &r.no, BigInt => &r.at, Text => r.outcome,
    Nullable<Text> => &r.error_kind, Nullable<Text> => &r.error_message));
params!(SessionWrite, |r, out| bind!(out;
    BigInt => &r.id, BigInt => &r.version, Text => r.state,
    Nullable<Text> => &r.outcome, Nullable<Text> => &r.end_reason,
    Nullable<BigInt> => &r.open_turn, Nullable<BigInt> => &r.finalized_at));
params!(
    Segment<'e>,
    |r, out| bind!(out; BigInt => &r.session, Text => r.steps)
);

struct Registration<'b> {
    item: usize,
    new: &'b NewSession,
    tree: Option<i64>,
}

/// Everything the batch decided, before it is written.
#[derive(Default)]
struct Decided<'b> {
    results: Vec<Option<Result<Applied, StoreError>>>,
    registrations: Vec<Registration<'b>>,
    turn_starts: Vec<TurnStart>,
    turn_ends: Vec<TurnEnd<'b>>,
    timeline: Vec<TimelineEntry>,
    /// Every cause of the batch, one after another, so that a transition's
    /// cause is formatted without an allocation of its own.
    causes: String,
    /// Finalizes that won: (item, session, whether to commit memory, at).
    finalized: Vec<(usize, SessionId, bool, i64)>,
}

/// Apply `batch` in one transaction. `Err` when the transaction failed:
/// nothing of the batch was written.
pub(crate) fn apply(
    db: Db<'_>,
    batch: &[LifecycleWrite],
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    write_tx!(db, |c| {
        let mut db = Db::from(&mut *c);
        let now = store_now(db.reborrow())?;
        let mut sessions = read_sessions(db.reborrow(), batch)?;
        let owners = read_owners(db.reborrow(), batch, &sessions, now)?;
        let mut turns = read_turns(db.reborrow(), batch, &sessions)?;
        let mut decided = decide(batch, &mut sessions, &owners, &mut turns)?;
        write_back(db.reborrow(), &sessions, &mut decided)?;
        for &(item, id, commit, at) in &decided.finalized {
            if let (true, Some(Ok(Applied::Finalized(Finalized::Won(report))))) =
                (commit, decided.results[item].as_mut())
            {
                memory_step(db.reborrow(), id, commit, at, report)?;
            }
        }
        Ok(decided
            .results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::Unavailable)))
            .collect())
    })
}

// --- 1. read ------------------------------------------------------------------

type SessionCols = (
    i64,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
);

/// Every session the batch names (as a subject, a parent or a resumed
/// session), in id order; on PostgreSQL locked until the commit.
fn read_sessions(
    mut db: Db<'_>,
    batch: &[LifecycleWrite],
) -> Result<HashMap<i64, Sim>, StoreError> {
    let mut ids = BTreeSet::new();
    for write in batch {
        match write {
            // An id out of the database's range names no session; its write
            // is refused on its own when it is decided.
            LifecycleWrite::Register(new) => {
                ids.extend(new.parent.and_then(|p| sid(p).ok()));
                ids.extend(new.resumed_from.and_then(|p| sid(p).ok()));
            }
            LifecycleWrite::Transition { session, .. }
            | LifecycleWrite::StartTurn { session, .. }
            | LifecycleWrite::EndTurn { session, .. }
            | LifecycleWrite::Finalize { session, .. } => {
                ids.extend(sid(*session).ok());
            }
        }
    }
    let ids: Vec<i64> = ids.into_iter().collect();
    let mut found = HashMap::with_capacity_and_hasher(ids.len(), Default::default());
    for part in by_ranges(&ids) {
        macro_rules! load {
            ($filter:expr) => {{
                let columns = (
                    sessions::id,
                    sessions::state,
                    sessions::version,
                    sessions::outcome,
                    sessions::end_reason,
                    sessions::open_turn,
                    sessions::closing_reason,
                    sessions::finalized_at,
                    sessions::tree,
                    sessions::owner,
                );
                let q = sessions::table
                    .filter($filter)
                    .order(sessions::id.asc())
                    .select(columns);
                match db.reborrow() {
                    Db::Sqlite(c) => q.load::<SessionCols>(c),
                    // Locked in id order: the rows cannot change before the
                    // commit, and two batches lock the sessions they share in
                    // the same order.
                    Db::Pg(c) => q.for_update().load::<SessionCols>(c),
                }
            }};
        }
        let rows = match part {
            Ids::Range(first, last) => load!(sessions::id.between(first, last)),
            Ids::List(list) => load!(sessions::id.eq_any(list)),
        }
        .context("reading the sessions of a batch")?;
        for (
            id,
            state,
            version,
            outcome,
            end_reason,
            open_turn,
            closing,
            finalized_at,
            tree,
            owner,
        ) in rows
        {
            // A range may hold sessions the batch does not name.
            if !wanted(&ids, id) {
                continue;
            }
            let live = Live {
                state: word("sessions.state", &state)?,
                outcome: opt_word("sessions.outcome", outcome.as_deref())?,
                end_reason: opt_word("sessions.end_reason", end_reason.as_deref())?,
                open_turn: open_turn.map(turn_no).transpose()?,
                closing: opt_word("sessions.closing_reason", closing.as_deref())?,
                finalized_at,
            };
            found.insert(
                id,
                Sim {
                    read_open: live.open_turn,
                    live,
                    version,
                    tree,
                    owner,
                    changed: false,
                },
            );
        }
    }
    Ok(found)
}

/// A set of ids to read in one statement.
enum Ids<'a> {
    /// Every id from the first to the last: dense enough to read as a range.
    Range(i64, i64),
    List(&'a [i64]),
}

/// The sorted `ids` as statements: dense runs (a teardown's tree, a batch of
/// registrations) as ranges, which cost one comparison each; the rest as
/// lists of at most `ROWS_PER_STATEMENT`.
fn by_ranges(ids: &[i64]) -> Vec<Ids<'_>> {
    let mut parts = Vec::new();
    let mut start = 0;
    while start < ids.len() {
        // The longest run from `start` with no gap wider than one id.
        let mut end = start + 1;
        while end < ids.len() && ids[end] - ids[end - 1] <= 2 {
            end += 1;
        }
        if end - start >= 32 {
            parts.push(Ids::Range(ids[start], ids[end - 1]));
            start = end;
        } else {
            let stop = (start + ROWS_PER_STATEMENT).min(ids.len());
            // A list stops where the next dense run begins.
            let mut cut = start;
            while cut < stop {
                let mut run = cut + 1;
                while run < ids.len() && ids[run] - ids[run - 1] <= 2 {
                    run += 1;
                }
                if run - cut >= 32 && cut > start {
                    break;
                }
                cut += 1;
            }
            parts.push(Ids::List(&ids[start..cut]));
            start = cut;
        }
    }
    parts
}

fn wanted(sorted: &[i64], id: i64) -> bool {
    sorted.binary_search(&id).is_ok()
}

/// Whether each owner the batch writes for (the owners of its sessions and
/// of its registrations) holds its lease at `now`; an owner missing from the
/// answer does not exist.
fn read_owners(
    db: Db<'_>,
    batch: &[LifecycleWrite],
    sessions: &HashMap<i64, Sim>,
    now: i64,
) -> Result<HashMap<i64, bool>, StoreError> {
    let mut ids: BTreeSet<i64> = sessions.values().map(|s| s.owner).collect();
    for write in batch {
        if let LifecycleWrite::Register(new) = write {
            ids.extend(new.owner.raw().ok());
        }
    }
    if ids.is_empty() {
        return Ok(HashMap::default());
    }
    let ids: Vec<i64> = ids.into_iter().collect();
    let found: Vec<(i64, i64)> = on_db!(db, |c| owners::table
        .filter(owners::id.eq_any(&ids))
        .select((owners::id, owners::lease_expires_at))
        .load(c))
    .context("reading the owners of a batch")?;
    Ok(found
        .into_iter()
        .map(|(id, expires)| (id, fence(id, expires, now).is_ok()))
        .collect())
}

/// The turns the batch's turn writes name, open or ended, but for the turn
/// each session had open, which is known open.
fn read_turns(
    mut db: Db<'_>,
    batch: &[LifecycleWrite],
    read: &HashMap<i64, Sim>,
) -> Result<HashMap<(i64, u32), TurnSeen>, StoreError> {
    let mut sessions = BTreeSet::new();
    let mut nos = BTreeSet::new();
    for write in batch {
        let (session, no, ending) = match write {
            LifecycleWrite::StartTurn { session, no, .. } => (session, no, false),
            LifecycleWrite::EndTurn { session, no, .. } => (session, no, true),
            _ => continue,
        };
        let Ok(raw) = sid(*session) else { continue };
        match read.get(&raw) {
            Some(sim) if ending && sim.read_open == Some(*no) => {}
            Some(_) => {
                sessions.insert(raw);
                nos.insert(i64::from(*no));
            }
            None => {}
        }
    }
    let sessions: Vec<i64> = sessions.into_iter().collect();
    let nos: Vec<i64> = nos.into_iter().collect();
    let mut seen = HashMap::default();
    for part in sessions.chunks(ROWS_PER_STATEMENT) {
        let rows: Vec<(i64, i64, Option<i64>)> = on_db!(db.reborrow(), |c| turns::table
            .filter(turns::session.eq_any(part))
            .filter(turns::no.eq_any(&nos))
            .select((turns::session, turns::no, turns::ended_at))
            .load(c))
        .context("reading the turns of a batch")?;
        for (session, no, ended_at) in rows {
            let state = if ended_at.is_some() {
                TurnSeen::Ended
            } else {
                TurnSeen::Open
            };
            seen.insert((session, turn_no(no)?), state);
        }
    }
    Ok(seen)
}

// --- 2. decide ----------------------------------------------------------------

fn decide<'b>(
    batch: &'b [LifecycleWrite],
    sessions: &mut HashMap<i64, Sim>,
    owners: &HashMap<i64, bool>,
    turns: &mut HashMap<(i64, u32), TurnSeen>,
) -> Result<Decided<'b>, StoreError> {
    let mut d = Decided {
        results: Vec::with_capacity(batch.len()),
        ..Decided::default()
    };
    for (item, write) in batch.iter().enumerate() {
        let result = match write {
            LifecycleWrite::Register(new) => register(&mut d, item, new, sessions, owners),
            LifecycleWrite::Transition {
                session,
                from,
                to,
                cause,
                at,
            } => {
                Some(if allowed(*from, *to) {
                    lookup(sessions, owners, *session).and_then(|(raw, sim)| {
                        sim.live.transition(*session, *from, *to)?;
                        sim.changed = true;
                        let start = d.causes.len();
                        // Writing to a String cannot fail.
                        let _ = write!(d.causes, "{cause}");
                        d.timeline.push(TimelineEntry {
                            whose: Whose::Existing(raw),
                            at: to_millis(*at),
                            from: Some(*from),
                            to: *to,
                            cause: start..d.causes.len(),
                        });
                        Ok(Applied::Done)
                    })
                } else {
                    Err(StoreError::InvalidTransition {
                        session: *session,
                        from: *from,
                        to: *to,
                    })
                })
            }
            LifecycleWrite::StartTurn {
                session,
                no,
                input,
                at,
            } => Some(lookup(sessions, owners, *session).and_then(|(raw, sim)| {
                let seen = seen(turns, sim, raw, *no);
                sim.live.start_turn(*session, *no, seen)?;
                sim.changed = true;
                turns.insert((raw, *no), TurnSeen::Open);
                d.turn_starts.push(TurnStart {
                    session: raw,
                    no: i64::from(*no),
                    at: to_millis(*at),
                    input: input.as_ref().map(json_text),
                });
                Ok(Applied::Done)
            })),
            LifecycleWrite::EndTurn {
                session,
                no,
                outcome,
                error,
                at,
            } => Some(lookup(sessions, owners, *session).and_then(|(raw, sim)| {
                let seen = seen(turns, sim, raw, *no);
                sim.live.end_turn(*session, *no, *outcome, seen)?;
                sim.changed = true;
                turns.insert((raw, *no), TurnSeen::Ended);
                d.turn_ends.push(TurnEnd {
                    session: raw,
                    no: i64::from(*no),
                    at: to_millis(*at),
                    outcome: outcome.as_str(),
                    error_kind: error.as_ref().map(|e| e.kind.as_str()),
                    error_message: error.as_ref().map(|e| e.message.as_str()),
                });
                Ok(Applied::Done)
            })),
            LifecycleWrite::Finalize { session, plan } => {
                let at = to_millis(plan.at);
                Some(lookup(sessions, owners, *session).map(|(raw, sim)| {
                    let Some(spent) = sim.live.spend(plan.reason, plan.outcome, at) else {
                        return Applied::Finalized(Finalized::AlreadyFinalized);
                    };
                    sim.changed = true;
                    if let Some(no) = spent.interrupted {
                        // Close the turn still open, so its work can write no more.
                        turns.insert((raw, no), TurnSeen::Ended);
                        d.turn_ends.push(TurnEnd {
                            session: raw,
                            no: i64::from(no),
                            at,
                            outcome: Outcome::Interrupted.as_str(),
                            error_kind: None,
                            error_message: None,
                        });
                    }
                    let start = d.causes.len();
                    let _ = write!(d.causes, "finalize: {}", plan.reason);
                    d.timeline.push(TimelineEntry {
                        whose: Whose::Existing(raw),
                        at,
                        from: Some(spent.from),
                        to: State::Finalized,
                        cause: start..d.causes.len(),
                    });
                    d.finalized.push((item, *session, plan.commit_memory, at));
                    Applied::Finalized(Finalized::Won(FinalizeReport {
                        interrupted_turn: spent.interrupted,
                        ..FinalizeReport::default()
                    }))
                }))
            }
        };
        d.results.push(result);
    }
    Ok(d)
}

/// What the batch knows of turn `no`: what it read or wrote, else the turn
/// the session had open when read, else nothing (it read every other turn the
/// batch names).
fn seen(turns: &HashMap<(i64, u32), TurnSeen>, sim: &Sim, raw: i64, no: u32) -> TurnSeen {
    match turns.get(&(raw, no)) {
        Some(seen) => *seen,
        None if sim.read_open == Some(no) => TurnSeen::Open,
        None => TurnSeen::Missing,
    }
}

/// The session `id` as the batch sees it, with its database id, for a write
/// of its owner: refused with `LeaseLost` once the owner's lease expired.
fn lookup<'s>(
    sessions: &'s mut HashMap<i64, Sim>,
    owners: &HashMap<i64, bool>,
    id: SessionId,
) -> Result<(i64, &'s mut Sim), StoreError> {
    let raw = sid(id)?;
    let sim = sessions
        .get_mut(&raw)
        .ok_or(StoreError::UnknownSession(id))?;
    if owners.get(&sim.owner) != Some(&true) {
        return Err(StoreError::LeaseLost(OwnerId(sim.owner.unsigned_abs())));
    }
    Ok((raw, sim))
}

/// Check a registration as `create_session` does (the resumed session, then
/// the parent, then the owner); the id is allocated when it is written.
fn register<'b>(
    d: &mut Decided<'b>,
    item: usize,
    new: &'b NewSession,
    sessions: &HashMap<i64, Sim>,
    owners: &HashMap<i64, bool>,
) -> Option<Result<Applied, StoreError>> {
    let known = |id: SessionId| sid(id).ok().and_then(|raw| sessions.get(&raw));
    if let Some(previous) = new.resumed_from {
        if known(previous).is_none() {
            return Some(Err(StoreError::UnknownSession(previous)));
        }
    }
    let tree = match new.parent {
        Some(parent) => match known(parent) {
            None => return Some(Err(StoreError::UnknownSession(parent))),
            Some(sim) if !sim.live.state.is_open() => {
                return Some(Err(StoreError::ParentClosed {
                    parent,
                    state: sim.live.state,
                }))
            }
            Some(sim) => Some(sim.tree),
        },
        None => None,
    };
    match new.owner.raw().ok().and_then(|owner| owners.get(&owner)) {
        Some(true) => {}
        Some(false) => return Some(Err(StoreError::LeaseLost(new.owner))),
        None => return Some(Err(StoreError::UnknownOwner(new.owner))),
    }
    let n = d.registrations.len();
    d.registrations.push(Registration { item, new, tree });
    let start = d.causes.len();
    d.causes.push_str("registered");
    d.timeline.push(TimelineEntry {
        whose: Whose::New(n),
        at: to_millis(new.created_at),
        from: None,
        to: State::Registered,
        cause: start..d.causes.len(),
    });
    // Answered once the id is known.
    None
}

// --- 3. write back --------------------------------------------------------------

fn write_back(
    mut db: Db<'_>,
    sessions: &HashMap<i64, Sim>,
    d: &mut Decided<'_>,
) -> Result<(), StoreError> {
    let new_ids = insert_sessions(db.reborrow(), d)?;
    update_sessions(db.reborrow(), sessions)?;
    insert_turns(db.reborrow(), &d.turn_starts)?;
    end_turns(db.reborrow(), &d.turn_ends)?;
    insert_timeline(db, d, &new_ids)
}

/// Insert the batch's registrations with ids reserved up front (a root's tree
/// is its own id), and answer them.
fn insert_sessions(mut db: Db<'_>, d: &mut Decided<'_>) -> Result<Vec<i64>, StoreError> {
    if d.registrations.is_empty() {
        return Ok(Vec::new());
    }
    let ids = reserve_session_ids(db.reborrow(), d.registrations.len())?;
    let rows: Vec<_> = d
        .registrations
        .iter()
        .zip(&ids)
        .map(|(r, &id)| {
            Ok((
                sessions::id.eq(id),
                sessions::name.eq(r.new.name.as_str()),
                sessions::parent.eq(r.new.parent.map(sid).transpose()?),
                sessions::tree.eq(r.tree.unwrap_or(id)),
                sessions::state.eq(State::Registered.as_str()),
                sessions::created_at.eq(to_millis(r.new.created_at)),
                sessions::version.eq(0_i64),
                sessions::owner.eq(r.new.owner.raw()?),
                sessions::resumed_from.eq(r.new.resumed_from.map(sid).transpose()?),
            ))
        })
        .collect::<Result<_, StoreError>>()?;
    for part in rows.chunks(ROWS_PER_STATEMENT) {
        on_db!(db.reborrow(), |c| diesel::insert_into(sessions::table)
            .values(part)
            .execute(c))
        .context("registering sessions")?;
    }
    for (r, &id) in d.registrations.iter().zip(&ids) {
        d.results[r.item] = Some(Ok(Applied::Registered(session_id(id))));
    }
    Ok(ids)
}

#[derive(QueryableByName)]
struct Reserved {
    #[diesel(sql_type = BigInt)]
    value: i64,
}

/// `n` session ids no other writer will use: on SQLite, the ones after the
/// last allocated (the transaction excludes every other writer); on
/// PostgreSQL, drawn from the table's sequence.
fn reserve_session_ids(db: Db<'_>, n: usize) -> Result<Vec<i64>, StoreError> {
    let count = i64::try_from(n).map_err(|_| StoreError::OutOfRange {
        what: "batch size",
        value: n as u64,
    })?;
    let mut ids = match db {
        Db::Sqlite(c) => {
            // AUTOINCREMENT keeps the highest id ever allocated here.
            let last: Vec<Reserved> = diesel::sql_query(
                "SELECT seq AS value FROM sqlite_sequence WHERE name = 'sessions'",
            )
            .load(c)
            .context("reserving session ids")?;
            let last = last.first().map_or(0, |r| r.value);
            (1..=count).map(|k| last + k).collect::<Vec<_>>()
        }
        Db::Pg(c) => diesel::sql_query(
            "SELECT nextval(pg_get_serial_sequence('sessions', 'id')) AS value \
             FROM generate_series(1, $1)",
        )
        .bind::<BigInt, _>(count)
        .load::<Reserved>(c)
        .context("reserving session ids")?
        .into_iter()
        .map(|r| r.value)
        .collect(),
    };
    ids.sort_unstable();
    Ok(ids)
}

/// Write every changed session back, each only if its version is still the
/// one read: a compare-and-set per row, many rows per statement.
fn update_sessions(mut db: Db<'_>, sessions: &HashMap<i64, Sim>) -> Result<(), StoreError> {
    let mut rows: Vec<SessionWrite> = sessions
        .iter()
        .filter(|(_, s)| s.changed)
        .map(|(id, sim)| SessionWrite {
            id: *id,
            version: sim.version,
            state: sim.live.state.as_str(),
            outcome: sim.live.outcome.map(Outcome::as_str),
            end_reason: sim.live.end_reason.map(|r| r.as_str()),
            open_turn: sim.live.open_turn.map(i64::from),
            finalized_at: sim.live.finalized_at,
        })
        .collect();
    rows.sort_unstable_by_key(|r| r.id);
    for part in rows.chunks(ROWS_PER_STATEMENT) {
        let statement = Rows::update(
            "UPDATE sessions SET state = v.column3, outcome = v.column4, \
             end_reason = v.column5, open_turn = v.column6, finalized_at = v.column7, \
             version = sessions.version + 1 FROM (VALUES ",
            part,
            ") AS v WHERE sessions.id = v.column1 AND sessions.version = v.column2",
        );
        let updated = on_db!(db.reborrow(), |c| statement.execute(c))
            .context("writing the sessions of a batch")?;
        if updated != part.len() {
            // The rows were read under this transaction's lock: a session that
            // changed anyway means another writer ignored it. Write nothing.
            return Err(changed_under("writing the sessions of a batch"));
        }
    }
    Ok(())
}

fn changed_under(context: &'static str) -> StoreError {
    StoreError::Database {
        context,
        source: DbError::new(std::io::Error::other(
            "a row changed while the batch held its session; nothing of the batch was written",
        )),
    }
}

fn insert_turns(mut db: Db<'_>, starts: &[TurnStart]) -> Result<(), StoreError> {
    for part in starts.chunks(ROWS_PER_STATEMENT) {
        let statement = Rows::insert(
            "INSERT INTO turns (session, \"no\", started_at, next_seq, input) VALUES ",
            part,
        );
        on_db!(db.reborrow(), |c| statement.execute(c)).context("opening the turns of a batch")?;
    }
    Ok(())
}

fn end_turns(mut db: Db<'_>, ends: &[TurnEnd<'_>]) -> Result<(), StoreError> {
    for part in ends.chunks(ROWS_PER_STATEMENT) {
        let statement = Rows::update(
            "UPDATE turns SET ended_at = v.column3, outcome = v.column4, \
             error_kind = v.column5, error_message = v.column6 FROM (VALUES ",
            part,
            ") AS v WHERE turns.session = v.column1 AND turns.\"no\" = v.column2 \
             AND turns.ended_at IS NULL",
        );
        let ended = on_db!(db.reborrow(), |c| statement.execute(c))
            .context("ending the turns of a batch")?;
        if ended != part.len() {
            return Err(changed_under("ending the turns of a batch"));
        }
    }
    Ok(())
}

/// The batch's timeline: one segment per session, its steps in batch order,
/// many segments per statement.
fn insert_timeline(mut db: Db<'_>, d: &Decided<'_>, new_ids: &[i64]) -> Result<(), StoreError> {
    // Each session's steps, in the order the sessions first appear.
    let mut order: Vec<i64> = Vec::new();
    let mut steps: HashMap<i64, Vec<&TimelineEntry>> = HashMap::default();
    for entry in &d.timeline {
        let session = match entry.whose {
            Whose::Existing(id) => id,
            // Every registration with a timeline entry was written.
            Whose::New(n) => new_ids.get(n).copied().unwrap_or_default(),
        };
        steps
            .entry(session)
            .or_insert_with(|| {
                order.push(session);
                Vec::new()
            })
            .push(entry);
    }
    let mut encoded: Vec<u8> = Vec::with_capacity(d.timeline.len() * 80);
    let mut ranges: Vec<(i64, Range<usize>)> = Vec::with_capacity(order.len());
    for session in order {
        let start = encoded.len();
        let entries = steps.get(&session).map(Vec::as_slice).unwrap_or_default();
        crate::timeline::encode(
            &mut encoded,
            entries.iter().map(|t| Step {
                at: t.at,
                from: t.from,
                to: t.to,
                cause: &d.causes[t.cause.clone()],
            }),
        )?;
        ranges.push((session, start..encoded.len()));
    }
    let segments = ranges
        .into_iter()
        .map(|(session, range)| {
            Ok(Segment {
                session,
                steps: crate::timeline::segment_text(&encoded[range])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    for part in segments.chunks(ROWS_PER_STATEMENT) {
        let statement = Rows::insert("INSERT INTO timeline (session, steps) VALUES ", part);
        on_db!(db.reborrow(), |c| statement.execute(c))
            .context("recording the timeline of a batch")?;
    }
    Ok(())
}
