//! The writes a store blip left unwritten, tried again until the store
//! answers (a lock released, a disk with room again, a server back).
//!
//! A lifecycle write whose transaction failed in a way that may heal (the
//! database said so, or did not answer in time) is not dropped: a turn's
//! end, a transition or a finalize that is lost leaves the session open in
//! the store, and every later write about it refused. So such a write is
//! queued here with its answer, and every later write about its session
//! waits behind it, in order, until the store takes them (a turn's reader
//! is told how it ended at the store timeout all the same, see
//! [`Retries::tell_turn_ends`]). A registration
//! and a turn's start are tried again the same way, for their callers who
//! wait for them, but only until the store timeout: then the caller is told
//! it failed, with what the store last said. A registration's write is
//! dropped then (the session was refused; one that may have been written
//! is withdrawn, so nothing is left live behind). A turn's start is kept
//! and written once the store takes it: the core numbered the turn and
//! ended it `failed`, and that end, queued behind its start, is written
//! too, so the stored turns keep the kernel's numbers with no gap.
//!
//! A finalize waits behind every write queued here, of any session, while
//! any is (G1 in the store): the recorder does not know the tree, and a
//! parent's finalize handed on while a child's writes wait here would be
//! committed first, leaving the store with a finalized parent over a live
//! child for the outage, and for good if a shutdown gives the child's up.
//! The queue is one, in the order the writes were decided, so a retry
//! batch writes children's finalizes before their parents', as the core
//! decided them.
//!
//! Once a shutdown's budget is spent, what is still queued is given up:
//! each waiter is told, and the session is left for recovery (G8).

use std::collections::VecDeque;
use std::time::Duration;

use settle_core::EndReason;
use settle_core::SessionId;
use settle_store::{FinalizeRequest, LifecycleWrite, StoreError};
use tokio::time::Instant;

use super::pending::{Answer, Pending};
use super::unwritten::Unwritten;
use crate::backoff::Backoff;

/// Maps keyed by session: foldhash, as everywhere on the recorder's path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// One write waiting for its session's turn, and its answer.
pub(super) struct Queued {
    pub write: LifecycleWrite,
    pub answer: Answer,
    /// When it was queued (a waiter's patience runs from here).
    pub since: Instant,
    /// What the store said last.
    pub last: Unwritten,
}

impl Queued {
    /// If this is a turn's end (alone or carried by its session's
    /// finalize) that has waited `patience` (the store timeout) by `now`,
    /// tells the turn's reader how it ended (once); the write itself stays
    /// queued.
    pub(super) fn tell_turn_end(&mut self, patience: Duration, now: Instant) {
        if now.duration_since(self.since) < patience {
            return;
        }
        self.answer.tell_turn_end_now();
    }
}

/// The writes waiting to be tried again, in the order they were decided.
#[derive(Default)]
pub(crate) struct Retries {
    /// Every waiting write with its session, in order: a retry batch keeps
    /// the order the writes were decided in.
    queue: VecDeque<(SessionId, Queued)>,
    /// The sessions with writes waiting: how many, and what the store said
    /// last of the latest (what keeps a write diverted behind them waiting).
    held: HashMap<SessionId, (usize, Unwritten)>,
    /// The wait before the next try, doubled after each failed one
    /// (see `backoff.rs`).
    wait: Option<Backoff>,
    next: Option<Instant>,
    /// Since when the store has not taken what waits here: from the
    /// first try of the oldest write that waits, until the store takes
    /// every one of them.
    stalled_since: Option<Instant>,
    /// The longest wait between two tries, once a shutdown has begun (see
    /// [`Retries::hurry`]).
    cap: Option<Duration>,
    /// The sessions whose registration was refused to its caller, until
    /// the finalize that withdraws it is answered: a write about one that
    /// finds no row has nothing to do (see [`Retries::withdraw`]).
    withdrawn: HashSet<SessionId>,
}

/// Whether a store failure may heal on its own, so that the write is worth
/// trying again (see [`StoreError::may_heal`]): the database failed (not a
/// violated constraint) or did not answer; a refusal (a closed session, a
/// lost lease) is final.
pub(super) fn may_heal(unwritten: &Unwritten) -> bool {
    match unwritten {
        Unwritten::TimedOut(_) => true,
        Unwritten::Failed(error) => error.may_heal(),
    }
}

/// Whether a waiter may wait for its write until the store heals: a turn's
/// end, a transition and a finalize are kept until written; a registration
/// and a turn's start answer a caller, who is told within the store timeout.
pub(super) fn kept_until_written(write: &LifecycleWrite) -> bool {
    matches!(
        write,
        LifecycleWrite::EndTurn { .. }
            | LifecycleWrite::Transition { .. }
            | LifecycleWrite::Finalize { .. }
    )
}

/// Whether a write the store failed to take is tried again: what is kept
/// until written, and a registration or a turn's start (within the store
/// timeout, see [`Retries::expired`]). Every write is tried again.
pub(super) fn tried_again(write: &LifecycleWrite) -> bool {
    kept_until_written(write)
        || matches!(
            write,
            LifecycleWrite::Register(_) | LifecycleWrite::StartTurn { .. }
        )
}

/// Whether a write tried again was refused only because an earlier try of
/// it was committed after all (its answer was lost with the connection, or
/// the store finished it after the store timeout): the turn is started or
/// ended already, the state is already moved. Or the session is finalized
/// already while this kernel's own finalize of it is among the writes tried
/// again (`finalize_follows`): a session's writes are applied in order, so
/// its finalize landing means every write before it landed too. (Were it
/// another process's finalize, recovering the session after this one's
/// lease lapsed, that finalize's own answer says so.)
pub(super) fn landed_before(
    write: &LifecycleWrite,
    error: &StoreError,
    finalize_follows: bool,
) -> bool {
    match (write, error) {
        (
            LifecycleWrite::Transition { .. } | LifecycleWrite::EndTurn { .. },
            StoreError::SessionClosed(_),
        ) => finalize_follows,
        // Its id was reserved for it: taken, it is this registration's.
        (LifecycleWrite::Register(_), StoreError::DuplicateSession(_)) => true,
        (LifecycleWrite::StartTurn { no, .. }, StoreError::TurnInFlight { open, .. }) => open == no,
        (LifecycleWrite::StartTurn { no, .. }, StoreError::TurnExists { turn, .. }) => turn == no,
        (LifecycleWrite::EndTurn { .. }, StoreError::TurnClosed { .. }) => true,
        // Its start was never written: there is nothing to end.
        (LifecycleWrite::EndTurn { .. }, StoreError::UnknownTurn { .. }) => true,
        (LifecycleWrite::Transition { to, .. }, StoreError::StateMismatch { found, .. }) => {
            found == to
        }
        _ => false,
    }
}

impl Retries {
    /// Whether nothing waits.
    /// What the store said last to the newest write waiting here.
    pub(super) fn last_said(&self) -> Option<String> {
        self.queue.back().map(|(_, q)| q.last.to_string())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether writes about `session` wait here (so its next ones must too).
    pub(super) fn holds(&self, session: SessionId) -> bool {
        self.held.contains_key(&session)
    }

    /// Queues a write the store did not take, behind every other.
    pub(super) fn push(&mut self, session: SessionId, queued: Queued) {
        let last = queued.last.clone();
        self.held
            .entry(session)
            .and_modify(|(count, latest)| {
                *count += 1;
                *latest = last.clone();
            })
            .or_insert((1, last));
        self.stalled_since.get_or_insert(queued.since);
        self.queue.push_back((session, queued));
        if self.next.is_none() {
            let wait = self.wait.get_or_insert_with(Backoff::new).current();
            let wait = self.cap.map_or(wait, |cap| wait.min(cap));
            self.next = Some(Instant::now() + wait);
        }
    }

    /// A shutdown has begun: from now on no wait between two tries is
    /// longer than `cap`, the next one included, so that a store back a
    /// moment before the shutdown's budget runs out still takes what waits
    /// (its waits had grown to a second, and the last try before the
    /// deadline could come that long before it).
    pub(super) fn hurry(&mut self, cap: Duration) {
        if self.cap.is_some() {
            return;
        }
        self.cap = Some(cap);
        if let Some(next) = self.next {
            self.next = Some(next.min(Instant::now() + cap));
        }
    }

    /// Moves the writes of `pending` that must wait behind those waiting
    /// here (any about a session with writes waiting, and any finalize
    /// while anything waits), keeping the rest (and their order).
    pub(super) fn divert(
        &mut self,
        pending: &mut Pending,
        session_of: impl Fn(&LifecycleWrite) -> Option<SessionId>,
    ) {
        if self.queue.is_empty() {
            return;
        }
        let writes = std::mem::take(&mut pending.writes);
        let answers = std::mem::take(&mut pending.answers);
        // A session whose finalize waits here has its writes before it in
        // this batch wait too, ahead of it: handed on now, one the store
        // did not take would be queued behind its own finalize.
        let finalizing: HashSet<SessionId> = writes
            .iter()
            .filter(|w| matches!(w, LifecycleWrite::Finalize { .. }))
            .filter_map(&session_of)
            .collect();
        for (write, answer) in writes.into_iter().zip(answers) {
            match session_of(&write) {
                Some(session) if finalizing.contains(&session) || self.holds(session) => {
                    let last = match self.held.get(&session) {
                        Some((_, latest)) => latest.clone(),
                        None => self
                            .queue
                            .back()
                            .map(|(_, q)| q.last.clone())
                            .unwrap_or(Unwritten::TimedOut(Duration::ZERO)),
                    };
                    // What keeps it waiting, for a caller told at its bound.
                    answer.note_failure(&last);
                    self.push(
                        session,
                        Queued {
                            write,
                            answer,
                            since: Instant::now(),
                            last,
                        },
                    );
                }
                _ => {
                    pending.writes.push(write);
                    pending.answers.push(answer);
                }
            }
        }
    }

    /// When to try again, if anything waits.
    pub(super) fn due(&self) -> Option<Instant> {
        self.next
    }

    /// Takes every waiting write, in the order they were decided, for one
    /// more try; the next wait doubles.
    pub(super) fn take(&mut self) -> Vec<(SessionId, Queued)> {
        self.held.clear();
        self.next = None;
        match &mut self.wait {
            Some(wait) => wait.advance(),
            None => self.wait = Some(Backoff::new()),
        }
        std::mem::take(&mut self.queue).into()
    }

    /// The store took a try: the next failure starts from the first wait.
    pub(super) fn healed(&mut self) {
        if self.queue.is_empty() {
            self.wait = None;
            self.stalled_since = None;
        }
    }

    /// Whether the store has not taken the writes that wait here (or are
    /// tried again now) for `patience` or longer by `now`.
    pub(super) fn stalled_for(&self, patience: Duration, now: Instant) -> bool {
        self.stalled_since
            .is_some_and(|since| now.duration_since(since) >= patience)
    }

    /// Tells the readers of turns whose end has waited `patience` (the store
    /// timeout) for the store how their turn ended: an agent loop awaiting
    /// its turn is not held for a whole outage. The end itself stays queued
    /// and is written once the store takes it.
    pub(super) fn tell_turn_ends(&mut self, patience: Duration) {
        let now = Instant::now();
        for (_, q) in &mut self.queue {
            q.tell_turn_end(patience, now);
        }
    }

    /// Takes the answers of the writes whose waiters may not wait longer
    /// than `patience` (a registration, a turn's start), to be told they
    /// failed with what the store said last. A registration's write goes
    /// with its answer; a turn's start stays queued, answering no one.
    pub(super) fn expired(&mut self, patience: Duration) -> Vec<(Answer, Unwritten)> {
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for (session, mut q) in self.queue.drain(..) {
            if kept_until_written(&q.write) || now.duration_since(q.since) < patience {
                kept.push_back((session, q));
            } else if matches!(q.write, LifecycleWrite::StartTurn { .. }) {
                if let Some(told) = q.answer.take_start_waiting() {
                    expired.push((told, q.last.clone()));
                }
                kept.push_back((session, q));
            } else {
                expired.push((q.answer, q.last));
                if let Some((count, _)) = self.held.get_mut(&session) {
                    *count -= 1;
                    if *count == 0 {
                        self.held.remove(&session);
                    }
                }
            }
        }
        self.queue = kept;
        if self.queue.is_empty() {
            self.next = None;
        }
        expired
    }

    /// Queues the finalize of `session`, whose registration was refused to
    /// its caller after a failure that may not have kept it from being
    /// written (`last`): the store's writer applies it after the
    /// registration, so its answer says for certain (no such session:
    /// nothing was written; won: it was, and is ended now).
    ///
    /// It goes right after the session's own writes waiting here (its end
    /// the core decided, if any, goes first), or, with none, before the
    /// first finalize waiting here: either way before the finalizes decided
    /// after them, a parent's among them (G1 in the store: a child's row
    /// that the registration's try wrote after all is never left live
    /// under its finalized parent). Until it is answered, a write about the
    /// session that finds no row is answered as done (see
    /// [`Retries::was_withdrawn`]).
    pub(super) fn withdraw(&mut self, session: SessionId, last: Unwritten) {
        let write = LifecycleWrite::Finalize {
            session,
            plan: FinalizeRequest::new(EndReason::Failed),
        };
        let queued = Queued {
            write,
            answer: Answer::Withdrawn(session),
            since: Instant::now(),
            last,
        };
        let at = match self.queue.iter().rposition(|(s, _)| *s == session) {
            Some(last_own) => last_own + 1,
            None => self
                .queue
                .iter()
                .position(|(_, q)| matches!(q.write, LifecycleWrite::Finalize { .. }))
                .unwrap_or(self.queue.len()),
        };
        self.withdrawn.insert(session);
        self.push(session, queued);
        if let Some(entry) = self.queue.pop_back() {
            self.queue.insert(at, entry);
        }
    }

    /// Whether `session`'s registration was refused to its caller and its
    /// withdrawal is not answered yet.
    pub(super) fn was_withdrawn(&self, session: SessionId) -> bool {
        self.withdrawn.contains(&session)
    }

    /// The finalize withdrawing `session` was answered.
    pub(super) fn withdrawal_answered(&mut self, session: SessionId) {
        self.withdrawn.remove(&session);
    }

    /// Takes everything still waiting, to give it up.
    pub(super) fn give_up(&mut self) -> Vec<Queued> {
        self.next = None;
        self.wait = None;
        self.stalled_since = None;
        self.take().into_iter().map(|(_, q)| q).collect()
    }
}

impl super::Recorder {
    /// Says that a write failed and will be tried again: a line in the
    /// runs of its kind (`store_failures.rs`), and a
    /// [`StoreRetrying`](crate::LifecycleEvent::StoreRetrying) event.
    pub(super) fn retrying(&self, session: SessionId, what: &str, unwritten: &Unwritten) {
        crate::store_failures::store_failure!(
            self.failures,
            crate::store_failures::StoreFailure::WriteRetried,
            warn,
            %session,
            error = %unwritten,
            "failed to {what}; trying again"
        );
        self.events
            .emit(None, || crate::LifecycleEvent::StoreRetrying {
                session: Some(session),
                message: format!("failed to {what}: {unwritten}; trying again"),
            });
    }

    /// Once a shutdown has begun, the waits between tries are short (see
    /// [`Retries::hurry`]).
    pub(super) fn hurry_in_shutdown(&mut self) {
        if self.deadline.borrow().is_some() {
            self.retries.hurry(super::SHUTDOWN_WAIT);
        }
    }

    /// Whether a shutdown's budget is spent: nothing is tried again then.
    pub(super) fn budget_spent(&self) -> bool {
        self.deadline
            .borrow()
            .is_some_and(|at| Instant::now() >= at)
    }

    /// One more try of every waiting write, as one batch, after telling
    /// the waiters who may not wait any longer that their write failed;
    /// returns once the store answered it.
    pub(super) async fn retry(&mut self) {
        if let Some(mut batch) = self.start_retry().await {
            let results = batch.results_telling(self.store_timeout).await;
            self.answer_batch(batch, results).await;
        }
    }

    /// One more try of every waiting write, as one batch left in flight:
    /// the recorder goes on taking records (and telling the readers of
    /// works' ends that the store is stalled) while the store answers it.
    pub(super) async fn retry_in_flight(&mut self) {
        if let Some(batch) = self.start_retry().await {
            self.in_flight = Some(batch);
        }
    }

    /// Starts one more try of every waiting write: the batch handed to the
    /// store, or `None` when there is nothing to try (or a shutdown's
    /// budget is spent, and what waited is given up).
    async fn start_retry(&mut self) -> Option<super::pending::InFlight> {
        self.hurry_in_shutdown();
        // The batch in flight first: a write of it the store did not take
        // is queued now, before the writes decided after it are taken
        // (else a session's finalize, waiting here, would be tried before
        // the end of its turn that was still in flight).
        self.land().await;
        for (answer, last) in self.retries.expired(self.store_timeout) {
            self.answer(answer, Err(last)).await;
        }
        self.retries.tell_turn_ends(self.store_timeout);
        if self.budget_spent() {
            for q in self.retries.give_up() {
                self.answer(q.answer, Err(q.last)).await;
            }
            self.note_stall();
            return None;
        }
        let taken = self.retries.take();
        if taken.is_empty() {
            return None;
        }
        let mut pending = Pending::default();
        let mut copies = Vec::with_capacity(taken.len());
        for (_, q) in taken {
            copies.push(Some((q.write.clone(), q.since)));
            pending.writes.push(q.write);
            pending.answers.push(q.answer);
        }
        self.hand_with(pending, copies, true)
    }

    /// Tries the waiting writes until the store takes them all or, in a
    /// shutdown, its budget is spent (else within the store timeout); what
    /// is left then is given up, its sessions left for recovery (G8).
    pub(super) async fn settle_retries(&mut self) {
        self.hurry_in_shutdown();
        let until = self
            .deadline
            .borrow()
            .unwrap_or_else(|| Instant::now() + self.store_timeout);
        while !self.retries.is_empty() {
            if Instant::now() >= until {
                for q in self.retries.give_up() {
                    self.answer(q.answer, Err(q.last)).await;
                }
                self.note_stall();
                break;
            }
            let at = self.retries.due().unwrap_or_else(Instant::now).min(until);
            tokio::time::sleep_until(at).await;
            self.retry().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use settle_core::{Outcome, SessionId};
    use settle_store::{LifecycleWrite, StoreError};

    use super::{landed_before, tried_again};

    const S: SessionId = SessionId(7);

    fn end(session: SessionId) -> LifecycleWrite {
        LifecycleWrite::EndTurn {
            session,
            no: 1,
            outcome: Outcome::Cancelled,
            error: None,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    fn finalize(session: SessionId) -> LifecycleWrite {
        LifecycleWrite::Finalize {
            session,
            plan: settle_store::FinalizeRequest::new(settle_core::EndReason::UserClose),
        }
    }

    /// G1 in the store, and every turn's own end: a session whose finalize
    /// is diverted behind the writes waiting here has its writes before it
    /// in the same batch diverted too, ahead of it, in order. Handed on
    /// instead, one the store did not take would be queued behind its own
    /// finalize, which would then end its turn `interrupted`.
    #[test]
    fn a_sessions_writes_before_its_diverted_finalize_wait_ahead_of_it() {
        use super::super::pending::{Answer, Pending};
        use super::super::unwritten::Unwritten;
        use super::{Queued, Retries};

        let (waiting, other) = (SessionId(8), SessionId(9));
        let mut retries = Retries::default();
        retries.push(
            waiting,
            Queued {
                write: end(waiting),
                answer: Answer::Transition(waiting),
                since: tokio::time::Instant::now(),
                last: Unwritten::TimedOut(std::time::Duration::ZERO),
            },
        );
        let mut pending = Pending::default();
        for write in [end(S), end(other), finalize(S)] {
            let session = super::super::batch::write_session(&write).unwrap();
            pending.writes.push(write);
            pending.answers.push(Answer::Transition(session));
        }
        retries.divert(&mut pending, super::super::batch::write_session);

        assert!(
            matches!(pending.writes[..], [LifecycleWrite::EndTurn { session, .. }] if session == other),
            "{:?}",
            pending.writes
        );
        let queued: Vec<(SessionId, bool)> = retries
            .take()
            .iter()
            .map(|(s, q)| (*s, matches!(q.write, LifecycleWrite::Finalize { .. })))
            .collect();
        assert_eq!(queued, [(waiting, false), (S, false), (S, true)]);
    }

    fn start(no: u32) -> LifecycleWrite {
        LifecycleWrite::StartTurn {
            session: S,
            no,
            input: None,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_start_tried_again_landed_before_only_if_its_own_turn_is_there() {
        let open = |open| StoreError::TurnInFlight { session: S, open };
        let exists = |turn| StoreError::TurnExists { session: S, turn };
        assert!(landed_before(&start(3), &open(3), false));
        assert!(landed_before(&start(3), &exists(3), false));
        assert!(
            !landed_before(&start(3), &open(2), false),
            "another turn is open"
        );
        assert!(!landed_before(&start(3), &exists(2), false));
        assert!(!landed_before(
            &start(3),
            &StoreError::SessionClosed(S),
            false
        ));
    }

    #[test]
    fn registrations_starts_and_what_must_be_written_are_tried_again() {
        assert!(tried_again(&start(1)));
        assert!(tried_again(&LifecycleWrite::EndTurn {
            session: S,
            no: 1,
            outcome: Outcome::Completed,
            error: None,
            at: SystemTime::UNIX_EPOCH,
        }));
        let register = LifecycleWrite::Register(
            settle_store::NewSession::new("s", settle_store::OwnerId(1)).with_id(S),
        );
        assert!(tried_again(&register));
        assert!(landed_before(
            &register,
            &StoreError::DuplicateSession(S),
            false
        ));
        assert!(!landed_before(
            &register,
            &StoreError::SessionClosed(S),
            false
        ));
    }

    #[test]
    fn a_step_or_turn_end_refused_as_finalized_landed_only_if_its_own_finalize_follows() {
        let closed = StoreError::SessionClosed(S);
        let end = LifecycleWrite::EndTurn {
            session: S,
            no: 1,
            outcome: Outcome::Cancelled,
            error: None,
            at: SystemTime::UNIX_EPOCH,
        };
        assert!(landed_before(&end, &closed, true));
        assert!(!landed_before(&end, &closed, false));
        // A start is never before a finalize of the kernel's own: refused.
        assert!(!landed_before(&start(2), &closed, true));
    }
}
