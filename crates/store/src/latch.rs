//! The finalize latch (G2) and the finalize plan's durable steps (SPEC §4).
//!
//! The latch is a conditional UPDATE: `state <> 'finalized' AND version = v`.
//! Exactly one writer sees it affect a row, across connections and processes:
//! a batch's finalize ([`LifecycleWrite::Finalize`](crate::LifecycleWrite::Finalize),
//! whose write-back is that compare-and-set on the version the batch read) or
//! recovery's ([`spend`]). The winner, in the same transaction, ends the row
//! (state, end reason, time), closes any turn still open (revoking its
//! writes), records the timeline step, and commits memory from completed
//! turns only when asked (G7, [`memory_step`]).

use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{Cause, ChunkKind, EndReason, Outcome, SessionId, State, TurnError};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::schema::{chunks, memories, sessions, turns};
use crate::session::{current, Current};
use crate::time::{sid, turn_no};
use crate::timeline::{record, Step};

/// What a finalize ([`LifecycleWrite::Finalize`](crate::LifecycleWrite::Finalize))
/// does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalizeRequest {
    /// Why the session ends.
    pub reason: EndReason,
    /// Whether to commit memory (from completed turns only).
    pub commit_memory: bool,
    /// The outcome of the session's work, if known; otherwise the outcome of
    /// its last turn is kept (or `interrupted` if a turn was still open).
    pub outcome: Option<Outcome>,
    /// When it is finalized.
    pub at: SystemTime,
    /// Transitions of the session to record first, in order (see
    /// [`after_steps`](Self::after_steps)); inline, as a teardown builds
    /// one request per session.
    steps: Steps,
    /// The session's turn to end first, as a
    /// [`LifecycleWrite::EndTurn`](crate::LifecycleWrite::EndTurn) would.
    pub turn_end: Option<TurnEnding>,
}

/// The steps a finalize carries: the two of a teardown (a cancel and its
/// settling) and one more stay inline.
type Steps = smallvec::SmallVec<[TimelineStep; 3]>;

/// A transition a finalize records before it spends the latch
/// ([`FinalizeRequest::steps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineStep {
    /// The state it must be in.
    pub from: State,
    /// The state it moves to (never `finalized`: the latch records that).
    pub to: State,
    /// Why, as the timeline shows it.
    pub cause: Cause,
    /// When.
    pub at: SystemTime,
}

/// The end of a turn a finalize records before it spends the latch
/// ([`FinalizeRequest::turn_end`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnding {
    /// The turn number.
    pub no: u32,
    /// How it ended.
    pub outcome: Outcome,
    /// Why it failed.
    pub error: Option<TurnError>,
    /// When.
    pub at: SystemTime,
}

impl FinalizeRequest {
    /// End with `reason` now, without committing memory.
    pub fn new(reason: EndReason) -> Self {
        FinalizeRequest {
            reason,
            commit_memory: false,
            outcome: None,
            at: SystemTime::now(),
            steps: Steps::new(),
            turn_end: None,
        }
    }

    /// The transitions it records first, in order.
    pub fn steps(&self) -> &[TimelineStep] {
        &self.steps
    }

    /// Record `steps` on the session's timeline first, in order, each as a
    /// [`LifecycleWrite::Transition`](crate::LifecycleWrite::Transition)
    /// would be: its steps since its last write, so that a session's end is
    /// one write (one row update and one timeline segment). A step the
    /// lifecycle refuses (the session is not in its `from` state) is
    /// reported in [`FinalizeReport::refused`]; the rest still run and the
    /// session is finalized all the same.
    pub fn after_steps(mut self, steps: impl IntoIterator<Item = TimelineStep>) -> Self {
        self.steps.extend(steps);
        self
    }

    /// End the session's turn first, as `end` says. Refused (reported in
    /// [`FinalizeReport::refused`]) when that turn is not open.
    pub fn ending_turn(mut self, end: TurnEnding) -> Self {
        self.turn_end = Some(end);
        self
    }

    /// Commit memory from the completed turns.
    pub fn commit_memory(mut self, commit: bool) -> Self {
        self.commit_memory = commit;
        self
    }

    /// Record `outcome` as the session's outcome.
    pub fn with_outcome(mut self, outcome: Outcome) -> Self {
        self.outcome = Some(outcome);
        self
    }

    /// Finalize at `at`.
    pub fn at(mut self, at: SystemTime) -> Self {
        self.at = at;
        self
    }
}

/// Who won the latch.
#[derive(Debug, Clone)]
#[must_use]
pub enum Finalized {
    /// This call finalized the session.
    Won(FinalizeReport),
    /// The session was already finalized; nothing was changed.
    AlreadyFinalized,
}

impl Finalized {
    /// Whether this call finalized the session.
    pub fn won(&self) -> bool {
        matches!(self, Finalized::Won(_))
    }
}

/// What the winning finalize did.
#[derive(Debug, Clone, Default)]
pub struct FinalizeReport {
    /// The turn that was still open and is now `interrupted`, if any.
    pub interrupted_turn: Option<u32>,
    /// Memory rows committed (one per completed turn with reply text).
    pub memories: usize,
    /// Steps that failed; the session was finalized all the same.
    pub failed_steps: Vec<StepFailure>,
    /// The transitions and the turn's end the finalize carried
    /// ([`FinalizeRequest::steps`], [`FinalizeRequest::turn_end`]) that the
    /// lifecycle refused, each with its refusal, as the separate write would
    /// have been answered; the session was finalized all the same.
    pub refused: Vec<StoreError>,
}

/// A durable step of the finalize plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinalizeStep {
    /// Commit memory from completed turns.
    CommitMemory,
}

impl FinalizeStep {
    /// A stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinalizeStep::CommitMemory => "commit_memory",
        }
    }
}

/// A finalize step that failed; it is also recorded on the session.
#[derive(Debug, Clone)]
pub struct StepFailure {
    /// Which step.
    pub step: FinalizeStep,
    /// Why it failed.
    pub error: StoreError,
}

/// How recovery's latch ends a row.
pub(crate) struct Ending<'a> {
    pub(crate) reason: EndReason,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) at: i64,
    /// Only spend the latch while the session still has this owner.
    pub(crate) owner: i64,
    /// Only while the session is released for adoption (the fleet's reap
    /// of one nobody adopted), or only while it is not (recovery, which
    /// leaves released sessions to adoption: SPEC §12).
    pub(crate) released: bool,
    pub(crate) cause: &'a str,
}

/// What spending the latch found and did.
pub(crate) struct Spent {
    pub(crate) interrupted: Option<u32>,
}

/// Spend the latch of session `id` inside the caller's transaction, for
/// recovery: not fenced by the owner's lease, which has run out.
/// `Ok(None)`: already finalized (or no longer this owner's).
pub(crate) fn spend(
    mut db: Db<'_>,
    id: SessionId,
    ending: &Ending<'_>,
) -> Result<Option<Spent>, StoreError> {
    let raw = sid(id)?;
    // On SQLite the caller's IMMEDIATE transaction already excludes other
    // writers, so the first attempt wins or finds the row finalized. On
    // PostgreSQL a concurrent update between our read and our CAS makes the
    // CAS miss; re-read and try again.
    for _ in 0..64 {
        let Some(cur) = current(db.reborrow(), raw)? else {
            return Err(StoreError::UnknownSession(id));
        };
        if cur.state == State::Finalized
            || cur.owner != ending.owner
            || cur.released != ending.released
        {
            return Ok(None);
        }
        let Current {
            state: from,
            version,
            open_turn,
            ..
        } = cur;
        let outcome = ending.outcome.or(if open_turn.is_some() {
            Some(Outcome::Interrupted)
        } else {
            cur.outcome
        });
        let won = on_db!(db.reborrow(), |c| diesel::update(
            sessions::table
                .filter(sessions::id.eq(raw))
                .filter(sessions::version.eq(version))
                .filter(sessions::state.ne(State::Finalized.as_str())),
        )
        .set((
            sessions::state.eq(State::Finalized.as_str()),
            sessions::end_reason.eq(Some(ending.reason.as_str())),
            sessions::finalized_at.eq(Some(ending.at)),
            sessions::outcome.eq(outcome.map(Outcome::as_str)),
            sessions::open_turn.eq(None::<i64>),
            sessions::version.eq(sessions::version + 1),
        ))
        .execute(c))
        .context("spending the finalize latch")?;
        if won == 0 {
            continue;
        }
        // Close whatever turn is still open, so its work can write no more.
        let closed: Vec<i64> = on_db!(db.reborrow(), |c| diesel::update(
            turns::table
                .filter(turns::session.eq(raw))
                .filter(turns::ended_at.is_null()),
        )
        .set((
            turns::ended_at.eq(Some(ending.at)),
            turns::outcome.eq(Some(Outcome::Interrupted.as_str())),
        ))
        .returning(turns::no)
        .get_results(c))
        .context("interrupting the open turn")?;
        record(
            db.reborrow(),
            raw,
            Step {
                at: ending.at,
                from: Some(from),
                to: State::Finalized,
                cause: ending.cause,
            },
        )?;
        let interrupted = closed.into_iter().max().map(turn_no).transpose()?;
        return Ok(Some(Spent { interrupted }));
    }
    Err(StoreError::Database {
        context: "spending the finalize latch",
        source: crate::error::DbError::new(std::io::Error::other(
            "the session kept changing under the latch; try again",
        )),
    })
}

/// The plan's memory step, for a session whose latch this transaction just
/// spent: commit memory from completed turns if asked, in a savepoint, so a
/// failure is rolled back alone and the session is finalized all the same
/// (SPEC §4: best-effort steps); a failed step is reported and recorded on
/// the session.
pub(crate) fn memory_step(
    db: Db<'_>,
    id: SessionId,
    commit: bool,
    at: i64,
    report: &mut FinalizeReport,
) -> Result<(), StoreError> {
    on_db!(db, |c| {
        if commit {
            match c.transaction(|c| commit_memory(Db::from(c), id, at)) {
                Ok(n) => report.memories = n,
                Err(error) => {
                    tracing::warn!(session = %id, %error, "finalize: committing memory failed");
                    report.failed_steps.push(StepFailure {
                        step: FinalizeStep::CommitMemory,
                        error,
                    });
                }
            }
        }
        if !report.failed_steps.is_empty() {
            let text = report
                .failed_steps
                .iter()
                .map(|f| format!("{}: {}", f.step.as_str(), f.error))
                .collect::<Vec<_>>()
                .join("\n");
            diesel::update(sessions::table.find(sid(id)?))
                .set(sessions::finalize_errors.eq(Some(text)))
                .execute(c)
                .context("recording failed finalize steps")?;
        }
        Ok(())
    })
}

/// Commit one memory row per completed turn: its reply, the text chunks in
/// order, joined (structured chunks stay in the transcript).
/// Turns that failed, were cancelled, detached or interrupted contribute
/// nothing (G7).
fn commit_memory(db: Db<'_>, id: SessionId, at: i64) -> Result<usize, StoreError> {
    let raw = sid(id)?;
    on_db!(db, |c| {
        // Joined as the rows are read: a long reply of small chunks is
        // held once, not as one row (a `String` and its tuple, each far
        // larger than a token's text) per chunk.
        let rows = chunks::table
            .inner_join(
                turns::table.on(turns::session
                    .eq(chunks::session)
                    .and(turns::no.eq(chunks::turn_no))),
            )
            .filter(chunks::session.eq(raw))
            .filter(chunks::kind.eq(ChunkKind::Text.as_str()))
            .filter(turns::outcome.eq(Outcome::Completed.as_str()))
            .order((chunks::turn_no.asc(), chunks::seq.asc()))
            .select((chunks::turn_no, chunks::text))
            .load_iter::<(i64, String), diesel::connection::DefaultLoadingMode>(c)
            .context("reading completed turns for memory")?;
        let mut per_turn: Vec<(i64, String)> = Vec::new();
        for row in rows {
            let (turn, text) = row.context("reading completed turns for memory")?;
            match per_turn.last_mut() {
                Some((t, content)) if *t == turn => content.push_str(&text),
                _ => per_turn.push((turn, text)),
            }
        }
        let values: Vec<_> = per_turn
            .iter()
            .map(|(turn, content)| {
                (
                    memories::session.eq(raw),
                    memories::turn_no.eq(*turn),
                    memories::content.eq(content.as_str()),
                    memories::created_at.eq(at),
                )
            })
            .collect();
        if !values.is_empty() {
            diesel::insert_into(memories::table)
                .values(&values)
                .execute(c)
                .context("committing memory")?;
        }
        Ok(per_turn.len())
    })
}
