//! The finalize latch spent as a set: step 0 of a batch, before anything is
//! read.
//!
//! A teardown's batch is thousands of finalizes, each carrying the same
//! kind of end: the session's cancel and its settling, its turn's end, the
//! latch (see [`FinalizeRequest::after_steps`]). Read first, each costs
//! its session's row read and decided in memory before it is written back.
//! But what such a finalize does is known from the write alone, as long as
//! the row is as the write expects it: in the state its first step leaves,
//! with the turn its turn end names open (or none open when it carries no
//! turn end), owned by the writer and not released. So the finalizes whose
//! sessions no other write of the batch names are grouped by what they set,
//! and each group is one conditional update:
//!
//! ```sql
//! UPDATE sessions SET state = 'finalized', outcome = COALESCE(?, outcome), ...
//!   WHERE owner = ? AND released_at IS NULL AND state = ? AND open_turn = ?
//!     AND id IN (...)
//! ```
//!
//! Its row count says whether every finalize of the set won, and when one
//! did not, the rows that name the segment it just wrote say which did:
//! the condition is the rules' own verdict for a row in that state (each step's move, the turn's end,
//! the latch not spent, G2), tested atomically with the write, row by row,
//! on both databases. A finalize whose row is not as expected (finalized
//! already, in another state, handed off) is not answered here: it goes
//! through the batch's read and decision like every other write, against
//! its row as it is, and gets the answer the rules give. The answers are
//! the same either way; only the cost differs. Memory commits (G7) and
//! finalizes that carry no step (nothing says which state they leave) go
//! that way too.

use std::ops::Range;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use settle_core::{Cause, Outcome, State};

use super::{Applied, HashMap, LifecycleWrite};
use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::latch::{FinalizeReport, FinalizeRequest, Finalized};
use crate::rows::{group_head, grouped, pieces, InList};
use crate::rules::allowed;
use crate::schema::{last_segments, owners, sessions};
use crate::time::{sid, to_millis};
use crate::timeline::Step;

/// What the set-wise latch answered: `done[item]` for each write it
/// decided (a finalize that won), with its answer in `results[item]`.
pub(super) struct Latched<'b> {
    pub(super) done: Vec<bool>,
    pub(super) results: Vec<Option<Result<Applied, StoreError>>>,
    /// The turn ends the won finalizes carried that keep their end in the
    /// turn's own row (see `ends_with_its_session` for the others).
    pub(super) turn_ends: Vec<super::TurnEnd<'b>>,
}

impl Latched<'_> {
    /// Nothing decided: every write of a batch of `n` goes the usual way.
    pub(super) fn none(n: usize) -> Self {
        Latched {
            done: vec![false; n],
            results: (0..n).map(|_| None).collect(),
            turn_ends: Vec::new(),
        }
    }
}

/// What one group's update sets, and what it expects of each row.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LatchSet {
    outcome: Option<&'static str>,
    end_reason: &'static str,
    finalized_at: i64,
    last_segment: i64,
    writer: i64,
    /// The state the row must be in: the first carried step's `from`.
    state: &'static str,
    /// The turn the row must have open (none when no turn end is carried).
    open_turn: Option<i64>,
}

group_head!(LatchSet, |set, out| {
    out.push_sql("UPDATE sessions SET state = '");
    out.push_sql(State::Finalized.as_str());
    out.push_sql("', outcome = COALESCE(");
    out.push_bind_param::<Nullable<Text>, _>(&set.outcome)?;
    out.push_sql(", outcome), end_reason = ");
    out.push_bind_param::<Text, _>(set.end_reason)?;
    out.push_sql(", open_turn = NULL, finalized_at = ");
    out.push_bind_param::<BigInt, _>(&set.finalized_at)?;
    out.push_sql(", last_segment = ");
    out.push_bind_param::<BigInt, _>(&set.last_segment)?;
    // `+column`: the rows are found by their ids, never through the owner's
    // or the released sessions' index, which would visit every session of
    // the owner for each statement.
    out.push_sql(", version = version + 1 WHERE +owner = ");
    out.push_bind_param::<BigInt, _>(&set.writer)?;
    out.push_sql(" AND +released_at IS NULL AND state = ");
    out.push_bind_param::<Text, _>(set.state)?;
    match &set.open_turn {
        Some(no) => {
            out.push_sql(" AND open_turn = ");
            out.push_bind_param::<BigInt, _>(no)?;
        }
        None => out.push_sql(" AND open_turn IS NULL"),
    }
    out.push_sql(" AND id IN (");
    Ok(())
});

/// A finalize's last timeline segment by what it holds: each carried step
/// and the latch's own (time, states, cause).
type SegmentKey = smallvec::SmallVec<[(i64, State, State, Cause); 4]>;

/// One finalize the set may decide.
struct Eligible<'b> {
    item: usize,
    id: i64,
    plan: &'b FinalizeRequest,
    /// The state it must be in, and the one its steps leave it in.
    from: State,
    last: State,
}

/// Spends the latch of every finalize of `batch` that it can decide from
/// the write alone (see the module), as `writer` (its raw id), at the
/// store's time `now`; returns what it decided. The rest is left to the
/// batch's read and decision.
pub(super) fn spend<'b>(
    mut db: Db<'_>,
    batch: &'b [LifecycleWrite],
    writer: i64,
    now: i64,
) -> Result<Latched<'b>, StoreError> {
    let mut latched = Latched::none(batch.len());
    let eligible = eligible(batch);
    if eligible.is_empty() || !lease_live(db.reborrow(), writer, now)? {
        return Ok(latched);
    }
    // Each distinct last segment once, in `last_segments`.
    let mut keys: HashMap<SegmentKey, usize> = HashMap::default();
    let mut distinct: Vec<SegmentKey> = Vec::new();
    let segment_of: Vec<usize> = eligible
        .iter()
        .map(|e| {
            let key = segment_key(e);
            *keys.entry(key.clone()).or_insert_with(|| {
                distinct.push(key);
                distinct.len() - 1
            })
        })
        .collect();
    let segment_ids = insert_segments(db.reborrow(), &distinct)?;
    // One conditional update per set of finalizes that set the same values
    // and expect the same row.
    let sets = grouped(eligible.iter().zip(&segment_of).map(|(e, &segment)| {
        let plan = e.plan;
        let turn = plan.turn_end.as_ref();
        (
            LatchSet {
                outcome: plan
                    .outcome
                    .or(turn.map(|t| t.outcome))
                    .map(Outcome::as_str),
                end_reason: plan.reason.as_str(),
                finalized_at: to_millis(plan.at),
                last_segment: segment_ids[segment],
                writer,
                state: e.from.as_str(),
                open_turn: turn.map(|t| i64::from(t.no)),
            },
            e.id,
        )
    }));
    let mut won: HashMap<i64, ()> = HashMap::default();
    for (set, ids) in sets {
        for part in pieces(&ids) {
            let statement = InList {
                group: &set,
                keys: part,
                tail: "",
            };
            let updated = on_db!(db.reborrow(), |c| statement.execute(c))
                .context("spending the finalize latch of a batch")?;
            if updated == part.len() {
                won.extend(part.iter().map(|id| (*id, ())));
                continue;
            }
            // Some rows were not as expected: those that won name the
            // segment this batch just wrote (a `RETURNING` on every
            // statement cost SQLite as much again as the update).
            let named: Vec<i64> = on_db!(db.reborrow(), |c| sessions::table
                .filter(sessions::id.eq_any(part))
                .filter(
                    diesel::dsl::sql::<diesel::sql_types::Bool>("last_segment = ")
                        .bind::<BigInt, _>(set.last_segment),
                )
                .select(sessions::id)
                .load(c))
            .context("reading which finalizes of a batch won")?;
            won.extend(named.into_iter().map(|id| (id, ())));
        }
    }
    for e in &eligible {
        if !won.contains_key(&e.id) {
            continue;
        }
        latched.done[e.item] = true;
        latched.results[e.item] = Some(Ok(Applied::Finalized(Finalized::Won(
            FinalizeReport::default(),
        ))));
        let plan = e.plan;
        if let Some(end) = &plan.turn_end {
            // The session's row says it all, or the turn's row is written.
            let outcome = plan.outcome.unwrap_or(end.outcome);
            if !super::ends_with_its_session(end, plan, Some(outcome)) {
                latched.turn_ends.push(super::TurnEnd {
                    session: e.id,
                    no: i64::from(end.no),
                    at: to_millis(end.at),
                    outcome: end.outcome.as_str(),
                    error_kind: end.error.as_ref().map(|x| x.kind.as_str()),
                    error_message: end.error.as_ref().map(|x| x.message.as_str()),
                });
            }
        }
    }
    Ok(latched)
}

/// The finalizes of `batch` the set may decide: each the only write of the
/// batch that names its session, committing no memory, carrying steps that
/// chain from one state to the next by the lifecycle's moves.
fn eligible(batch: &[LifecycleWrite]) -> Vec<Eligible<'_>> {
    // Most batches that are not a teardown's have no finalize to decide.
    let carrying = |w: &LifecycleWrite| matches!(w, LifecycleWrite::Finalize { plan, .. } if !plan.steps().is_empty());
    if !batch.iter().any(carrying) {
        return Vec::new();
    }
    let mut named: HashMap<i64, u32> = HashMap::default();
    let mut name = |id: Option<settle_core::SessionId>| {
        if let Some(raw) = id.and_then(|id| sid(id).ok()) {
            *named.entry(raw).or_default() += 1;
        }
    };
    for write in batch {
        match write {
            LifecycleWrite::Register(new) => {
                name(new.id);
                name(new.parent);
                name(new.resumed_from);
            }
            LifecycleWrite::Transition { session, .. }
            | LifecycleWrite::StartTurn { session, .. }
            | LifecycleWrite::EndTurn { session, .. }
            | LifecycleWrite::Finalize { session, .. } => name(Some(*session)),
        }
    }
    let mut eligible = Vec::new();
    for (item, write) in batch.iter().enumerate() {
        let LifecycleWrite::Finalize { session, plan } = write else {
            continue;
        };
        let Ok(id) = sid(*session) else { continue };
        let steps = plan.steps();
        let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
            continue;
        };
        let chained = steps.iter().all(|s| allowed(s.from, s.to))
            && steps.windows(2).all(|w| w[0].to == w[1].from);
        if plan.commit_memory || !chained || named.get(&id) != Some(&1) {
            continue;
        }
        eligible.push(Eligible {
            item,
            id,
            plan,
            from: first.from,
            last: last.to,
        });
    }
    eligible
}

/// The last segment a finalize writes: its steps, then the latch's.
fn segment_key(e: &Eligible<'_>) -> SegmentKey {
    let plan = e.plan;
    let mut key: SegmentKey = plan
        .steps()
        .iter()
        .map(|s| (to_millis(s.at), s.from, s.to, s.cause))
        .collect();
    key.push((
        to_millis(plan.at),
        e.last,
        State::Finalized,
        Cause::Finalized(plan.reason),
    ));
    key
}

/// Writes each segment into `last_segments`; returns their ids, in order.
fn insert_segments(mut db: Db<'_>, segments: &[SegmentKey]) -> Result<Vec<i64>, StoreError> {
    let mut ids = Vec::with_capacity(segments.len());
    let mut causes = String::new();
    let mut encoded = Vec::new();
    for key in segments {
        causes.clear();
        let mut at: Vec<Range<usize>> = Vec::with_capacity(key.len());
        for &(_, _, _, cause) in key {
            use std::fmt::Write as _;
            let start = causes.len();
            // Writing to a String cannot fail.
            let _ = write!(causes, "{cause}");
            at.push(start..causes.len());
        }
        encoded.clear();
        crate::timeline::encode(
            &mut encoded,
            key.iter().zip(&at).map(|(&(at, from, to, _), cause)| Step {
                at,
                from: Some(from),
                to,
                cause: &causes[cause.clone()],
            }),
        )?;
        let steps = crate::timeline::segment_text(&encoded)?;
        let id: i64 = on_db!(db.reborrow(), |c| diesel::insert_into(last_segments::table)
            .values(last_segments::steps.eq(steps))
            .returning(last_segments::id)
            .get_result(c))
        .context("recording the last timeline segments of a batch")?;
        ids.push(id);
    }
    Ok(ids)
}

/// Whether `writer` holds its lease at `now` (the store's clock).
fn lease_live(db: Db<'_>, writer: i64, now: i64) -> Result<bool, StoreError> {
    let expires: Option<i64> = on_db!(db, |c| owners::table
        .find(writer)
        .select(owners::lease_expires_at)
        .first(c)
        .optional())
    .context("reading the writer's lease")?;
    Ok(expires.is_some_and(|at| at > now))
}
