//! Step 1 of a batch: read every session it touches (locked on PostgreSQL),
//! the leases of the owners it writes for, and the turns it names.

use std::collections::BTreeSet;

use diesel::prelude::*;

use super::{HashMap, LifecycleWrite, Sim};
use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::lease::fence;
use crate::rows::ROWS_PER_STATEMENT;
use crate::rules::{Live, TurnSeen};
use crate::schema::{owners, sessions, turns};
use crate::time::{opt_word, sid, turn_no, word};

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
    Option<i64>,
);

/// Every session the batch names (as a subject, a parent, a resumed session
/// or the id a registration asks for), in id order; on PostgreSQL locked
/// until the commit.
pub(super) fn sessions(
    mut db: Db<'_>,
    batch: &[LifecycleWrite],
    skip: &[bool],
) -> Result<HashMap<i64, Sim>, StoreError> {
    let mut ids = BTreeSet::new();
    for write in deciding(batch, skip) {
        match write {
            // An id out of the database's range names no session; its write
            // is refused on its own when it is decided.
            LifecycleWrite::Register(new) => {
                ids.extend(new.id.and_then(|id| sid(id).ok()));
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
                    sessions::released_at,
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
            released_at,
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
                    released: released_at.is_some(),
                    changed: false,
                },
            );
        }
    }
    Ok(found)
}

/// The writes of `batch` still to decide: not those `skip` marks (the
/// set-wise latch answered them).
fn deciding<'b>(
    batch: &'b [LifecycleWrite],
    skip: &'b [bool],
) -> impl Iterator<Item = &'b LifecycleWrite> + 'b {
    batch
        .iter()
        .zip(skip.iter().copied().chain(std::iter::repeat(false)))
        .filter(|(_, skip)| !skip)
        .map(|(write, _)| write)
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
pub(super) fn owners(
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
pub(super) fn turns(
    mut db: Db<'_>,
    batch: &[LifecycleWrite],
    read: &HashMap<i64, Sim>,
    skip: &[bool],
) -> Result<HashMap<(i64, u32), TurnSeen>, StoreError> {
    let mut sessions = BTreeSet::new();
    let mut nos = BTreeSet::new();
    for write in deciding(batch, skip) {
        let (session, no, ending) = match write {
            LifecycleWrite::StartTurn { session, no, .. } => (session, no, false),
            LifecycleWrite::EndTurn { session, no, .. } => (session, no, true),
            LifecycleWrite::Finalize { session, plan } => match &plan.turn_end {
                Some(end) => (session, &end.no, true),
                None => continue,
            },
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
