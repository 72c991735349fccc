//! The hold buffer: timeline transitions nobody waits for, held back until
//! their session's next write so that both are one row update and one
//! timeline segment (for [`HOLD`], or [`HOLD_BUSY`] while the store is busy).

use std::collections::VecDeque;
use std::time::Duration;

use settle_core::SessionId;
use settle_store::{LifecycleWrite, TimelineStep as Step};
use smallvec::SmallVec;

use super::pending::{Answer, Pending};

/// Maps keyed by session: foldhash on the teardown's hot path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How long a transition nobody waits for may wait for its session's next
/// write, to be committed with it (one row update and one timeline segment
/// instead of two), while the store has nothing else to do. A crash loses at
/// most this much of timelines that no one was told about (at most
/// [`HOLD_BUSY`] while the store is busy); recovery reads the session as it
/// was before them.
pub(super) const HOLD: Duration = Duration::from_millis(100);

/// How long such a transition may wait while the store is busy: while a
/// batch is in flight or the recorder has other writes for the store, one
/// whose [`HOLD`] has passed keeps waiting for its session's next write, up
/// to this long. A loaded store is then not handed writes that the next one
/// carries anyway: in a teardown longer than [`HOLD`], a session's cancel,
/// its turn's end and its finalize are still one row update and one timeline
/// segment, not two of each.
pub(super) const HOLD_BUSY: Duration = Duration::from_secs(1);

/// Timeline transitions held back, per session (see [`HOLD`]).
#[derive(Default)]
pub(super) struct Held {
    pub(super) writes: HashMap<SessionId, HeldWrites>,
    /// When each session's first held transition came, oldest first. An
    /// entry is current while its session still holds what it was queued
    /// for (the same time); one whose session's transitions went with its
    /// next write since, even if it holds newer ones now, is skipped.
    since: VecDeque<(tokio::time::Instant, SessionId)>,
}

/// One session's held transitions, and when the first of them came: inline
/// up to two (a turn's end; a cancel and its settling), the most a session
/// holds between two of its writes in a teardown, so that holding costs no
/// allocation per session.
pub(super) struct HeldWrites {
    since: tokio::time::Instant,
    steps: SmallVec<[Step; 2]>,
}

impl Held {
    /// Holds `step` of `session`, which came `now` (the time of the
    /// recorder's wake: one clock read for all it takes).
    pub(super) fn hold(&mut self, session: SessionId, step: Step, now: tokio::time::Instant) {
        let since = &mut self.since;
        let held = self.writes.entry(session).or_insert_with(|| {
            since.push_back((now, session));
            HeldWrites {
                since: now,
                steps: SmallVec::new(),
            }
        });
        held.steps.push(step);
    }

    /// Takes `session`'s held transitions, in the order they came, for its
    /// next write to carry.
    pub(super) fn take(&mut self, session: SessionId) -> SmallVec<[Step; 2]> {
        match self.writes.remove(&session) {
            Some(held) => held.steps,
            None => SmallVec::new(),
        }
    }

    /// Moves `session`'s held transitions into `pending`, ahead of its next write.
    pub(super) fn release(&mut self, session: SessionId, pending: &mut Pending) {
        if let Some(held) = self.writes.remove(&session) {
            for step in held.steps {
                pending.writes.push(LifecycleWrite::Transition {
                    session,
                    from: step.from,
                    to: step.to,
                    cause: step.cause,
                    at: step.at,
                });
                pending.answers.push(Answer::Transition(session));
            }
        }
    }

    /// Moves every transition held since before `older_than` into `pending`
    /// (all of them with `None`). Entries at the front that are not current
    /// any more are dropped whatever their age, so that they neither pile up
    /// for as long as a hold lasts nor end a later hold of the same session
    /// early.
    pub(super) fn release_old(
        &mut self,
        older_than: Option<tokio::time::Instant>,
        pending: &mut Pending,
    ) {
        while let Some(&(since, session)) = self.since.front() {
            let current = self.writes.get(&session).is_some_and(|h| h.since == since);
            if current && older_than.is_some_and(|limit| since > limit) {
                break;
            }
            self.since.pop_front();
            if current {
                self.release(session, pending);
            }
        }
    }

    /// When the oldest held transition must be committed: [`HOLD`] after
    /// it came, or [`HOLD_BUSY`] while the store is `busy`.
    pub(super) fn due(&self, busy: bool) -> Option<tokio::time::Instant> {
        self.since.front().map(|(since, _)| *since + hold_for(busy))
    }
}

/// How long a held transition may wait: [`HOLD_BUSY`] while the store is
/// `busy`, [`HOLD`] otherwise.
pub(super) fn hold_for(busy: bool) -> Duration {
    if busy {
        HOLD_BUSY
    } else {
        HOLD
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use settle_core::{Cause, State};

    use super::*;

    fn step() -> Step {
        Step {
            from: State::Running,
            to: State::Registered,
            cause: Cause::TurnEnded(settle_core::Outcome::Completed),
            at: SystemTime::UNIX_EPOCH,
        }
    }

    fn now() -> tokio::time::Instant {
        tokio::time::Instant::now()
    }

    fn released(pending: &Pending) -> Vec<SessionId> {
        pending
            .answers
            .iter()
            .filter_map(|a| match a {
                Answer::Transition(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    /// A session whose held transitions went with its next write leaves no
    /// entry behind for as long as a hold lasts: the entries at the front are
    /// dropped at the next release, whatever their age, and those still held
    /// stay until their own time.
    #[tokio::test(start_paused = true)]
    async fn entries_of_released_sessions_do_not_wait_for_their_hold() {
        let mut held = Held::default();
        held.hold(SessionId(1), step(), now());
        held.hold(SessionId(2), step(), now());
        tokio::time::advance(Duration::from_millis(10)).await;
        held.hold(SessionId(3), step(), now());

        // Session 1's next write takes its transition along.
        let mut pending = Pending::default();
        held.release(SessionId(1), &mut pending);
        assert_eq!(released(&pending), [SessionId(1)]);
        assert_eq!(held.since.len(), 3, "released lazily, at the next release");

        // Nothing is old enough to go, but session 1's entry is dropped.
        let mut pending = Pending::default();
        let long_ago = tokio::time::Instant::now() - Duration::from_millis(50);
        held.release_old(Some(long_ago), &mut pending);
        assert!(released(&pending).is_empty());
        assert_eq!(held.since.len(), 2);
        assert_eq!(held.due(false), Some(held.since[0].0 + HOLD));

        // Past the first hold, session 2 goes and session 3 stays.
        let mut pending = Pending::default();
        let first_due = held.since[0].0;
        held.release_old(Some(first_due), &mut pending);
        assert_eq!(released(&pending), [SessionId(2)]);
        assert_eq!(held.since.len(), 1);
        assert!(held.writes.contains_key(&SessionId(3)));
    }

    /// A session held again after its transitions went with a write keeps
    /// the time of its new hold: the old entry does not end it early.
    #[tokio::test(start_paused = true)]
    async fn a_session_held_again_keeps_the_time_of_its_new_hold() {
        let mut held = Held::default();
        held.hold(SessionId(1), step(), now());
        let first = tokio::time::Instant::now();
        held.release(SessionId(1), &mut Pending::default());
        tokio::time::advance(Duration::from_millis(50)).await;
        held.hold(SessionId(1), step(), now());

        // The first hold's time has passed, the second's has not.
        let mut pending = Pending::default();
        held.release_old(Some(first), &mut pending);
        assert!(released(&pending).is_empty(), "the new hold ended early");
        assert_eq!(held.since.len(), 1);
        assert_eq!(
            held.due(false),
            Some(first + Duration::from_millis(50) + HOLD)
        );

        let mut pending = Pending::default();
        held.release_old(Some(first + Duration::from_millis(50)), &mut pending);
        assert_eq!(released(&pending), [SessionId(1)]);
        assert!(held.since.is_empty() && held.writes.is_empty());
    }

    /// What a session held goes ahead of its next write as the transitions
    /// it was, in the order they came, each answered as a transition.
    #[tokio::test(start_paused = true)]
    async fn released_steps_are_the_transitions_that_were_held_in_order() {
        let mut held = Held::default();
        let cancel = Step {
            from: State::Running,
            to: State::Cancelling,
            cause: Cause::AncestorWindingDown,
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(5),
        };
        let settle = Step {
            from: State::Cancelling,
            to: State::Settled,
            cause: Cause::DescendantsSettled,
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(7),
        };
        held.hold(SessionId(4), cancel, now());
        held.hold(SessionId(9), step(), now());
        held.hold(SessionId(4), settle, now());

        let mut pending = Pending::default();
        held.release(SessionId(4), &mut pending);
        let whole = |s: Step| LifecycleWrite::Transition {
            session: SessionId(4),
            from: s.from,
            to: s.to,
            cause: s.cause,
            at: s.at,
        };
        assert_eq!(pending.writes, [whole(cancel), whole(settle)]);
        assert_eq!(released(&pending), [SessionId(4), SessionId(4)]);
        assert!(held.writes.contains_key(&SessionId(9)));
        assert!(!held.writes.contains_key(&SessionId(4)));
    }
}
