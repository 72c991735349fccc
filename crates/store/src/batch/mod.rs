//! Lifecycle writes group-committed: a batch of registrations, transitions,
//! turn starts and ends and finalizes, applied in one transaction, each with
//! its own result.
//!
//! A batch is applied in five moves, inside one write transaction:
//!
//! 0. **Spend the latch as a set** for the finalizes of a batch of its
//!    writer (`SessionStore::apply_as`) that it can decide from the write
//!    alone: each the only write naming its session, carrying steps that
//!    say which state the row must be in (a teardown's finalizes are). One
//!    conditional `UPDATE … WHERE +owner = ? AND state = ? AND open_turn = ?
//!    AND id IN (…)` per set of them spends the latch of every row that is
//!    as expected (G2), which is the rules' verdict for such a row; the rest
//!    take the four moves below against their rows as they are
//!    ([`latch_set`]).
//! 1. **Read** every session it touches in bulk (on PostgreSQL with `FOR
//!    UPDATE`, in id order so that two batches never deadlock; a dense run of
//!    ids is read as a range, which may also lock the few sessions between
//!    them), the leases of the owners it writes for, by the store's clock,
//!    and the turns its turn writes name.
//! 2. **Decide**, in memory and in batch order, what each write does, by the
//!    same [rules](crate::rules) as [`MemoryStore`](crate::MemoryStore): a
//!    write the lifecycle refuses gets its refusal (a write of an owner whose
//!    lease expired, `LeaseLost`), and the writes after it see the session as
//!    it was left.
//! 3. **Write** the outcome back: the new sessions in multi-row INSERTs; every
//!    changed session only if it still has the version that was read (a
//!    compare-and-set per row, so a finalize spends the latch once across
//!    processes, G2), in one `UPDATE … WHERE version = ? AND id IN (…)` per
//!    set of sessions written to the same values, whose row count must be the
//!    set's size; the new turns and turn ends likewise, and one timeline
//!    segment per session holding all its transitions of the batch
//!    ([`timeline`](crate::timeline)), the last one of a finalized session
//!    named from its row.
//! 4. **Commit memory** for finalizes that ask for it, from completed turns
//!    only (G7), each in a savepoint of the same transaction.
//!
//! The answers are given after the commit. A refused write does not fail the
//! others; a database failure fails the whole batch (nothing of it is
//! written) and every write gets that error.

mod decide;
mod latch_set;
mod read;
mod write;

use std::fmt::Write as _;
use std::ops::Range;
use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{Cause, Outcome, SessionId, State, TurnError};

use crate::conn::Db;
use crate::error::StoreError;
use crate::input::TurnInput;
use crate::latch::{memory_step, FinalizeRequest, Finalized, TurnEnding};
use crate::lease::{store_now, OwnerId};
use crate::rules::Live;
use crate::session::NewSession;
use crate::time::to_millis;

/// Maps keyed by database ids: foldhash, not SipHash, on this hot path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// One write of a lifecycle batch
/// ([`SessionStore::apply`](crate::SessionStore::apply)), the one way the
/// lifecycle is written. Each is answered on its own; a write of an owner
/// whose lease expired is refused with [`StoreError::LeaseLost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleWrite {
    /// Register a session, with its first timeline step; answered with
    /// [`Applied::Registered`] and its id: the one it was given with
    /// [`NewSession::with_id`] (reserved earlier), or a fresh one. Refused
    /// with [`StoreError::UnknownSession`] when the resumed session or the
    /// parent does not exist, [`StoreError::ParentClosed`] when the parent is
    /// settled or finalized, [`StoreError::UnknownOwner`], and
    /// [`StoreError::DuplicateSession`] when the id is taken.
    Register(NewSession),
    /// Move `session` from `from` to `to`, only if it is in `from` then,
    /// recording `cause` on its timeline. Refused with
    /// [`StoreError::StateMismatch`] (naming both states) when it is not in
    /// `from`, [`StoreError::SessionClosed`] when it is finalized, and
    /// [`StoreError::InvalidTransition`] for a move the lifecycle does not
    /// have ([`State::can_move_to`]). Finalizing goes through
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
    /// Open turn `no` of `session`, recording its input: the messages sent
    /// to the provider (any JSON, typically an array of `{role, content}`),
    /// whole or as the messages the turn added ([`TurnInput`]).
    /// Refused with [`StoreError::TurnInFlight`] while another turn is open,
    /// [`StoreError::SessionClosing`] while the session is marked closing,
    /// [`StoreError::NotAcceptingTurns`] once it is cancelling or settled,
    /// [`StoreError::SessionClosed`] once it is finalized, and
    /// [`StoreError::TurnExists`] for a number used before.
    StartTurn {
        /// The session.
        session: SessionId,
        /// The turn number.
        no: u32,
        /// The messages sent to the provider.
        input: Option<TurnInput>,
        /// When.
        at: SystemTime,
    },
    /// End turn `no` of `session` with `outcome` and, if it failed, `error`;
    /// it accepts no more chunks. Refused with [`StoreError::UnknownTurn`],
    /// [`StoreError::TurnClosed`] when it has ended, and
    /// [`StoreError::SessionClosed`] once the session is finalized.
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
    /// Spend the finalize latch of `session` with `plan` (G2): across
    /// connections and processes exactly one finalize of a session gets
    /// [`Finalized::Won`], the others [`Finalized::AlreadyFinalized`]; the
    /// winner ends the row, interrupts the turn still open and commits
    /// memory if asked (G7). Answered with [`Applied::Finalized`].
    ///
    /// It may carry the session's transitions and its turn's end since its
    /// last write ([`FinalizeRequest::after_steps`],
    /// [`FinalizeRequest::ending_turn`]), applied first, each as its own
    /// write would be ([`FinalizeReport::refused`](crate::FinalizeReport::refused)
    /// says what the lifecycle refused of them): a session's end is then one
    /// write, answered once.
    Finalize {
        /// The session.
        session: SessionId,
        /// What to do.
        plan: FinalizeRequest,
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
    /// Released by its owner for another process to adopt (SPEC §12).
    released: bool,
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

/// A turn to open.
struct TurnStart {
    session: i64,
    no: i64,
    at: i64,
    input: Option<String>,
    input_from: Option<i64>,
}

/// A turn to end (or interrupt).
struct TurnEnd<'b> {
    session: i64,
    no: i64,
    at: i64,
    outcome: &'static str,
    error_kind: Option<&'static str>,
    error_message: Option<&'b str>,
}

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
    /// The ids the batch's registrations asked for.
    taken: HashSet<SessionId>,
    turn_starts: Vec<TurnStart>,
    turn_ends: Vec<TurnEnd<'b>>,
    timeline: Vec<TimelineEntry>,
    /// Every cause of the batch, one after another, so that a transition's
    /// cause is formatted without an allocation of its own.
    causes: String,
    /// Where each cause already formatted stands in `causes`: a teardown's
    /// thousands of transitions have a handful of causes, each formatted
    /// once.
    formatted: Vec<(Cause, Range<usize>)>,
    /// Finalizes that won: (item, session, whether to commit memory, at).
    finalized: Vec<(usize, SessionId, bool, i64)>,
}

impl Decided<'_> {
    /// The words of the cause formatted at `start` (see [`cause`](Self::cause)).
    fn cause_text(&self, start: usize) -> &str {
        self.formatted
            .iter()
            .find(|(_, at)| at.start == start)
            .map_or("", |(_, at)| &self.causes[at.clone()])
    }

    /// Where `cause`'s words stand in `causes`, formatted the first time.
    fn cause(&mut self, cause: Cause) -> Range<usize> {
        if let Some((_, at)) = self.formatted.iter().find(|(c, _)| *c == cause) {
            return at.clone();
        }
        let start = self.causes.len();
        // Writing to a String cannot fail.
        let _ = write!(self.causes, "{cause}");
        let at = start..self.causes.len();
        self.formatted.push((cause, at.clone()));
        at
    }
}

/// Whether the end of a turn that `plan` carries says no more than the
/// finalized session's row will, whose outcome is `session_outcome`: it
/// ended at the finalize's moment, with that outcome, and no error. Its
/// turn's row is then not written: a finalized session's turn that has no
/// end ended with its session (see [`turn_row`](crate::read::turn_row)),
/// and the session's end is one row write. A completed turn keeps its own
/// end: memory is committed from the turns whose rows say completed (G7).
fn ends_with_its_session(
    end: &TurnEnding,
    plan: &FinalizeRequest,
    session_outcome: Option<Outcome>,
) -> bool {
    end.error.is_none()
        && end.outcome != Outcome::Completed
        && session_outcome == Some(end.outcome)
        && to_millis(end.at) == to_millis(plan.at)
}

/// Apply `batch` in one transaction, as `writer` when it is given (each
/// write about an existing session is then refused unless `writer` owns it
/// now, G8, G12). `Err` when the transaction failed: nothing of the batch
/// was written.
pub(crate) fn apply(
    db: Db<'_>,
    batch: &[LifecycleWrite],
    writer: Option<OwnerId>,
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    write_tx!(db, |c| {
        let mut db = Db::from(&mut *c);
        let now = store_now(db.reborrow())?;
        let writer = writer
            .map(|w| Ok::<_, StoreError>((w, w.raw()?)))
            .transpose()?;
        // Step 0: the finalizes decided by their own conditional update.
        let latched = match writer {
            Some((_, raw)) => latch_set::spend(db.reborrow(), batch, raw, now)?,
            None => latch_set::Latched::none(batch.len()),
        };
        let skip = &latched.done;
        let mut sessions = read::sessions(db.reborrow(), batch, skip)?;
        let owners = read::owners(db.reborrow(), batch, &sessions, now)?;
        let mut turns = read::turns(db.reborrow(), batch, &sessions, skip)?;
        let mut decided = decide::decide(batch, skip, &mut sessions, &owners, &mut turns, writer)?;
        write::write_back(db.reborrow(), &sessions, &mut decided)?;
        write::end_turns(db.reborrow(), &latched.turn_ends)?;
        for &(item, id, commit, at) in &decided.finalized {
            if let (true, Some(Ok(Applied::Finalized(Finalized::Won(report))))) =
                (commit, decided.results[item].as_mut())
            {
                memory_step(db.reborrow(), id, commit, at, report)?;
            }
        }
        let mut done = latched.results;
        Ok(decided
            .results
            .into_iter()
            .zip(done.iter_mut())
            .map(|(r, set)| r.or_else(|| set.take()))
            .map(|r| r.unwrap_or(Err(StoreError::Unavailable)))
            .collect())
    })
}
