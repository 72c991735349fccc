//! Step 3 of a batch: write what was decided back, many rows per statement,
//! each changed session only if its version is still the one read.

use std::ops::Range;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use settle_core::{Outcome, State};

use super::{Applied, Decided, HashMap, Sim, TurnEnd, TurnStart, Whose};
use crate::conn::Db;
use crate::error::{Context, DbError, StoreError};
use crate::rows::{
    bind, group_head, grouped, insert_rows, params, pieces, GroupHead, InList, Insert,
};
use crate::schema::last_segments;
use crate::time::{session_id, sid, to_millis};
use crate::timeline::{Segment, Step};

impl Insert for TurnStart {
    const HEAD: &'static str =
        "INSERT INTO turns (session, \"no\", started_at, next_seq, input, input_from) VALUES ";
    type Id = TurnStart;
}

params!(TurnStart, |r, out| bind!(out;
    BigInt => &r.session, BigInt => &r.no, BigInt => &r.at, BigInt => &0_i64,
    Nullable<Text> => &r.input, Nullable<BigInt> => &r.input_from));

/// A registered session's row, as it is inserted: many per statement, with
/// one text per row count that stays prepared (Diesel's own slice insert
/// was parsed again in every batch).
struct NewRow<'b> {
    id: i64,
    name: &'b str,
    parent: Option<i64>,
    tree: i64,
    created_at: i64,
    owner: i64,
    resumed_from: Option<i64>,
}

impl Insert for NewRow<'_> {
    const HEAD: &'static str = "INSERT INTO sessions \
        (id, name, parent, tree, state, created_at, version, owner, resumed_from) VALUES ";
    type Id = NewRow<'static>;
}

params!(NewRow<'b>, |r, out| bind!(out;
    BigInt => &r.id, Text => r.name, Nullable<BigInt> => &r.parent, BigInt => &r.tree,
    Text => State::Registered.as_str(), BigInt => &r.created_at, BigInt => &0_i64,
    BigInt => &r.owner, Nullable<BigInt> => &r.resumed_from));

pub(super) fn write_back(
    mut db: Db<'_>,
    sessions: &HashMap<i64, Sim>,
    d: &mut Decided<'_>,
) -> Result<(), StoreError> {
    let new_ids = insert_sessions(db.reborrow(), d)?;
    let mut segments = Segments::of(d, &new_ids)?;
    segments.insert_last(db.reborrow())?;
    update_sessions(db.reborrow(), sessions, &segments)?;
    insert_turns(db.reborrow(), &d.turn_starts)?;
    end_turns(db.reborrow(), &d.turn_ends)?;
    insert_timeline(db, &segments)
}

/// Insert the batch's registrations with ids reserved up front (a root's tree
/// is its own id), and answer them.
fn insert_sessions(mut db: Db<'_>, d: &mut Decided<'_>) -> Result<Vec<i64>, StoreError> {
    if d.registrations.is_empty() {
        return Ok(Vec::new());
    }
    // A registration names the id it reserved ahead (`reserve_ids`), or
    // takes one from the same counter now: ids never collide.
    let missing = d
        .registrations
        .iter()
        .filter(|r| r.new.id.is_none())
        .count();
    let mut fresh = reserve_session_ids(db.reborrow(), missing)?;
    let ids = d
        .registrations
        .iter()
        .map(|r| match r.new.id {
            Some(id) => sid(id),
            None => fresh
                .next()
                .map(settle_core::SessionId)
                .map(sid)
                .unwrap_or(Err(StoreError::OutOfRange {
                    what: "reserved session ids",
                    value: missing as u64,
                })),
        })
        .collect::<Result<Vec<i64>, StoreError>>()?;
    let rows: Vec<NewRow<'_>> = d
        .registrations
        .iter()
        .zip(&ids)
        .map(|(r, &id)| {
            Ok(NewRow {
                id,
                name: r.new.name.as_str(),
                parent: r.new.parent.map(sid).transpose()?,
                tree: r.tree.unwrap_or(id),
                created_at: to_millis(r.new.created_at),
                owner: r.new.owner.raw()?,
                resumed_from: r.new.resumed_from.map(sid).transpose()?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    for part in pieces(&rows) {
        on_db!(db.reborrow(), |c| insert_rows!(c, part)).context("registering sessions")?;
    }
    // Whose each is, in the same transaction: never a row without it.
    let owned: Vec<(i64, &str)> = d
        .registrations
        .iter()
        .zip(&ids)
        .filter_map(|(r, &id)| r.new.principal.as_deref().map(|p| (id, p)))
        .collect();
    for (id, principal) in owned {
        on_db!(db.reborrow(), |c| diesel::insert_into(
            crate::schema::session_principals::table
        )
        .values((
            crate::schema::session_principals::session.eq(id),
            crate::schema::session_principals::principal.eq(principal),
        ))
        .execute(c))
        .context("recording a session's principal")?;
    }
    for (r, &id) in d.registrations.iter().zip(&ids) {
        d.results[r.item] = Some(Ok(Applied::Registered(session_id(id)?)));
    }
    Ok(ids)
}

/// `n` session ids no other writer will use, from the store's id counter
/// (the one `reserve_ids` draws from), inside the batch's transaction.
fn reserve_session_ids(db: Db<'_>, n: usize) -> Result<std::ops::Range<u64>, StoreError> {
    if n == 0 {
        return Ok(0..0);
    }
    let count = u32::try_from(n).map_err(|_| StoreError::OutOfRange {
        what: "batch size",
        value: n as u64,
    })?;
    on_db!(db, |c| { reserve_ids_on!(c, count) })
}

/// What a set of sessions is written to, and the version each of them must
/// still have: one statement for all of them. A session this batch
/// finalized names its last timeline segment (`last_segment`); in a
/// teardown the sessions a batch finalizes at one moment share it, so they
/// stay one set.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct SessionSet {
    version: i64,
    state: &'static str,
    outcome: Option<&'static str>,
    end_reason: Option<&'static str>,
    open_turn: Option<i64>,
    finalized_at: Option<i64>,
    last_segment: Option<i64>,
}

group_head!(SessionSet, |set, out| {
    out.push_sql("UPDATE sessions SET state = ");
    out.push_bind_param::<Text, _>(set.state)?;
    out.push_sql(", outcome = ");
    out.push_bind_param::<Nullable<Text>, _>(&set.outcome)?;
    out.push_sql(", end_reason = ");
    out.push_bind_param::<Nullable<Text>, _>(&set.end_reason)?;
    out.push_sql(", open_turn = ");
    out.push_bind_param::<Nullable<BigInt>, _>(&set.open_turn)?;
    out.push_sql(", finalized_at = ");
    out.push_bind_param::<Nullable<BigInt>, _>(&set.finalized_at)?;
    out.push_sql(", last_segment = ");
    out.push_bind_param::<Nullable<BigInt>, _>(&set.last_segment)?;
    out.push_sql(", version = version + 1 WHERE version = ");
    out.push_bind_param::<BigInt, _>(&set.version)?;
    out.push_sql(" AND id IN (");
    Ok(())
});

/// What a set of turns is ended with: one statement for all of them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct TurnSet<'b> {
    no: i64,
    at: i64,
    outcome: &'static str,
    error_kind: Option<&'static str>,
    error_message: Option<&'b str>,
}

group_head!(TurnSet<'b>, |set, out| {
    out.push_sql("UPDATE turns SET ended_at = ");
    out.push_bind_param::<BigInt, _>(&set.at)?;
    out.push_sql(", outcome = ");
    out.push_bind_param::<Text, _>(set.outcome)?;
    out.push_sql(", error_kind = ");
    out.push_bind_param::<Nullable<Text>, _>(&set.error_kind)?;
    out.push_sql(", error_message = ");
    out.push_bind_param::<Nullable<Text>, _>(&set.error_message)?;
    out.push_sql(" WHERE \"no\" = ");
    out.push_bind_param::<BigInt, _>(&set.no)?;
    out.push_sql(" AND ended_at IS NULL AND session IN (");
    Ok(())
});

/// Write every changed session back, each only if its version is still the
/// one read: a compare-and-set per row, one statement per set of rows
/// written to the same values (in a teardown, nearly all of them).
fn update_sessions(
    db: Db<'_>,
    sessions: &HashMap<i64, Sim>,
    segments: &Segments,
) -> Result<(), StoreError> {
    let sets = grouped(sessions.iter().filter(|(_, s)| s.changed).map(|(id, sim)| {
        (
            SessionSet {
                version: sim.version,
                state: sim.live.state.as_str(),
                outcome: sim.live.outcome.map(Outcome::as_str),
                end_reason: sim.live.end_reason.map(|r| r.as_str()),
                open_turn: sim.live.open_turn.map(i64::from),
                finalized_at: sim.live.finalized_at,
                last_segment: segments.last(*id),
            },
            *id,
        )
    }));
    update_sets(db, &sets, "writing the sessions of a batch")
}

/// One `UPDATE … IN (…)` per set (cut into statements that stay prepared),
/// each of which must change every row it names: the rows were read under
/// this transaction's lock, so a row that changed anyway means another
/// writer ignored it, and nothing of the batch is written.
fn update_sets<G>(
    mut db: Db<'_>,
    sets: &[(G, Vec<i64>)],
    context: &'static str,
) -> Result<(), StoreError>
where
    G: GroupHead<diesel::sqlite::Sqlite> + GroupHead<diesel::pg::Pg>,
{
    for (set, keys) in sets {
        for part in pieces(keys) {
            let statement = InList {
                group: set,
                keys: part,
                tail: "",
            };
            let updated = on_db!(db.reborrow(), |c| statement.execute(c)).context(context)?;
            if updated != part.len() {
                return Err(changed_under(context));
            }
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
    for part in pieces(starts) {
        on_db!(db.reborrow(), |c| insert_rows!(c, part)).context("opening the turns of a batch")?;
    }
    Ok(())
}

pub(super) fn end_turns(db: Db<'_>, ends: &[TurnEnd<'_>]) -> Result<(), StoreError> {
    let sets = grouped(ends.iter().map(|e| {
        (
            TurnSet {
                no: e.no,
                at: e.at,
                outcome: e.outcome,
                error_kind: e.error_kind,
                error_message: e.error_message,
            },
            e.session,
        )
    }));
    update_sets(db, &sets, "ending the turns of a batch")
}

/// The batch's timeline: one segment per session, its steps in batch order.
/// The segment of a session the batch finalized is its last: it goes into
/// `last_segments`, named from the session's row (see [`SessionSet`]); the
/// others go into `timeline`. Sessions whose segments are the same (a
/// teardown's sessions, finalized at one moment for one reason) share one
/// encoding, and one `last_segments` row.
struct Segments {
    encoded: String,
    /// Each distinct segment's place in `encoded`, and its `last_segments`
    /// id once it is written there.
    distinct: Vec<(Range<usize>, Option<i64>)>,
    /// Each session's segment, in the order the sessions first appear, and
    /// whether it is its last.
    sessions: Vec<(i64, usize, bool)>,
    /// Where each session is in `sessions`.
    at: HashMap<i64, usize>,
}

/// A segment by what it holds: each step's time, states and cause (a
/// range of the batch's causes, each formatted once).
type SegmentKey = smallvec::SmallVec<[(i64, Option<State>, State, usize); 3]>;

impl Segments {
    fn of(d: &Decided<'_>, new_ids: &[i64]) -> Result<Segments, StoreError> {
        // Each session's steps, in the order the sessions first appear.
        let mut order: Vec<i64> = Vec::new();
        let mut steps: HashMap<i64, SegmentKey> = HashMap::default();
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
                    SegmentKey::new()
                })
                .push((entry.at, entry.from, entry.to, entry.cause.start));
        }
        // A finalize that won is its session's last write: its segment is
        // the session's last one.
        let finalized: HashMap<i64, ()> = d
            .finalized
            .iter()
            .filter_map(|(_, id, _, _)| crate::time::sid(*id).ok())
            .map(|raw| (raw, ()))
            .collect();
        let mut encoded: Vec<u8> = Vec::new();
        let mut distinct = Vec::new();
        let mut known: HashMap<&SegmentKey, usize> = HashMap::default();
        let mut sessions = Vec::with_capacity(order.len());
        let mut at = HashMap::with_capacity_and_hasher(order.len(), Default::default());
        for session in order {
            let Some(key) = steps.get(&session) else {
                continue;
            };
            let segment = match known.get(key) {
                Some(&k) => k,
                None => {
                    let start = encoded.len();
                    crate::timeline::encode(
                        &mut encoded,
                        key.iter().map(|&(at, from, to, cause)| Step {
                            at,
                            from,
                            to,
                            cause: d.cause_text(cause),
                        }),
                    )?;
                    distinct.push((start..encoded.len(), None));
                    known.insert(key, distinct.len() - 1);
                    distinct.len() - 1
                }
            };
            at.insert(session, sessions.len());
            sessions.push((session, segment, finalized.contains_key(&session)));
        }
        let encoded = String::from_utf8(encoded).map_err(|e| StoreError::Database {
            context: "encoding a timeline segment",
            source: DbError::new(e),
        })?;
        Ok(Segments {
            encoded,
            distinct,
            sessions,
            at,
        })
    }

    fn text(&self, segment: usize) -> &str {
        self.distinct
            .get(segment)
            .map_or("[]", |(range, _)| &self.encoded[range.clone()])
    }

    /// Writes each distinct last segment once into `last_segments`.
    fn insert_last(&mut self, mut db: Db<'_>) -> Result<(), StoreError> {
        let mut wanted = vec![false; self.distinct.len()];
        for &(_, segment, last) in &self.sessions {
            if let (true, Some(w)) = (last, wanted.get_mut(segment)) {
                *w = true;
            }
        }
        for (k, wanted) in wanted.into_iter().enumerate() {
            if !wanted {
                continue;
            }
            let steps = self.text(k);
            let id: i64 = on_db!(db.reborrow(), |c| diesel::insert_into(last_segments::table)
                .values(last_segments::steps.eq(steps))
                .returning(last_segments::id)
                .get_result(c))
            .context("recording the last timeline segments of a batch")?;
            if let Some((_, slot)) = self.distinct.get_mut(k) {
                *slot = Some(id);
            }
        }
        Ok(())
    }

    /// The `last_segments` row session `id`'s row names, if the batch
    /// finalized it.
    fn last(&self, id: i64) -> Option<i64> {
        let &(_, segment, last) = self.sessions.get(*self.at.get(&id)?)?;
        self.distinct
            .get(segment)
            .and_then(|(_, row)| *row)
            .filter(|_| last)
    }
}

/// The segments that go into `timeline`, many per statement.
fn insert_timeline(mut db: Db<'_>, segments: &Segments) -> Result<(), StoreError> {
    let rows: Vec<Segment<'_>> = segments
        .sessions
        .iter()
        .filter(|(_, _, last)| !last)
        .map(|&(session, segment, _)| Segment {
            session,
            steps: segments.text(segment),
        })
        .collect();
    for part in pieces(&rows) {
        on_db!(db.reborrow(), |c| insert_rows!(c, part))
            .context("recording the timeline of a batch")?;
    }
    Ok(())
}
