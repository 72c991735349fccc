//! The one deadline table of the whole tree (the quinn-proto model): settle
//! deadlines, orphan grace, idle TTL and the drain deadline all answer
//! [`Core::poll_timeout`](crate::Core::poll_timeout) from here.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use crate::{Scope, SessionId, WorkKind};

/// When the core next wants [`Core::handle_timeout`](crate::Core::handle_timeout),
/// and why (the model of str0m's timeout reason and firezone's
/// `(Instant, &'static str)`): a driver can log it, and a test can check the
/// core never asks for a time in the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    /// When. Compare it with your own clock when you wake: a timer may fire
    /// early or late, and the core is fed the current time, not this one.
    pub at: Instant,
    /// Which kind of deadline it is (the earliest one, if several are due).
    pub kind: DeadlineKind,
}

/// The kinds of deadline the core keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeadlineKind {
    /// A cancelled work's settle deadline: past it the work is detached (G5).
    Settle,
    /// A session without a transport reaches the end of its orphan grace.
    Orphan,
    /// The oldest idle session reaches the idle TTL.
    IdleReap,
    /// The drain period of a shutdown ends (G9).
    Drain,
    /// A budget's wall time runs out.
    Budget,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// The settle deadline of one work of the session.
    Settle(WorkKind, u32),
    Orphan,
    /// The wall time of the session's budget.
    Budget,
}

impl Timer {
    fn kind(self) -> DeadlineKind {
        match self {
            Timer::Settle(..) => DeadlineKind::Settle,
            Timer::Orphan => DeadlineKind::Orphan,
            Timer::Budget => DeadlineKind::Budget,
        }
    }
}

/// A session's place in the idle index, kept on its record so that the
/// common case (a turn that starts and ends) touches no heap.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdleMark {
    /// Since when it is idle, while it is reclaimable; `None` otherwise.
    since: Option<Instant>,
    /// The key of its one entry in the idle heap, if it has one: a lower
    /// bound of `since`, re-armed at the real time when it surfaces early.
    key: Option<Instant>,
}

/// Where the idle index finds the marks of the sessions it names: the
/// core's session table.
pub(crate) trait IdleMarks {
    /// The mark of `id`, if the session is still kept.
    fn mark_mut(&mut self, id: SessionId) -> Option<&mut IdleMark>;

    /// The scope of `id`, if the session is still kept.
    fn scope(&self, id: SessionId) -> Option<Scope>;

    /// Whether the registration of `id` waits for its commit to make room
    /// under the cap (see `Session::room_owed`).
    fn owes_room(&self, id: SessionId) -> bool;
}

#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    /// Per-session deadlines. Entries are never removed eagerly: an entry whose
    /// session no longer carries that deadline is stale and skipped when it
    /// surfaces, so re-arming is O(log n) and cancelling is free.
    timers: BinaryHeap<Reverse<(Instant, SessionId, Timer)>>,
    /// Settle deadlines, in the order they were armed, stale ones skipped
    /// as in `timers`. Each is its cancel's time plus the one settle
    /// timeout and the core's clock never runs back, so they come in
    /// order: a queue keeps them sorted for nothing, where a subtree's
    /// cancel pushed thousands into the heap one sift at a time. (One that
    /// would break the order goes into `timers` instead.)
    settles: VecDeque<(Instant, SessionId, Timer)>,
    /// Reclaimable idle sessions by when they became idle, oldest first: the
    /// idle reap takes from the top once `since + ttl` has passed, the LRU cap
    /// evicts from the top. A session has at most one entry, whose key is a
    /// lower bound of when it became idle: a turn that starts and ends leaves
    /// the entry where it is, and when it surfaces early it is re-armed at the
    /// real time (the quinn timer habit). So turns cost nothing here.
    idle: BinaryHeap<Reverse<(Instant, SessionId)>>,
    /// The end of the shutdown drain, until it has passed.
    pub drain: Option<Instant>,
    /// The sizes past which [`compact`](Self::compact) rebuilds each heap.
    compact_idle_at: usize,
    compact_timers_at: usize,
}

impl Deadlines {
    pub fn arm(&mut self, at: Instant, session: SessionId, timer: Timer) {
        let in_order = self.settles.back().is_none_or(|(last, _, _)| *last <= at);
        match timer {
            Timer::Settle(..) if in_order => self.settles.push_back((at, session, timer)),
            _ => self.timers.push(Reverse((at, session, timer))),
        }
    }

    /// The earliest timer: the heap's top or the settle queue's front.
    fn first(&self) -> Option<(Instant, SessionId, Timer)> {
        let heap = self.timers.peek().map(|Reverse(t)| *t);
        let queue = self.settles.front().copied();
        match (heap, queue) {
            (Some(h), Some(q)) => Some(h.min(q)),
            (h, q) => h.or(q),
        }
    }

    /// Removes the earliest timer (the one [`first`](Self::first) names).
    fn pop_first(&mut self) -> Option<(Instant, SessionId, Timer)> {
        let heap = self.timers.peek().map(|Reverse(t)| *t);
        match (heap, self.settles.front()) {
            (Some(h), Some(q)) if *q < h => self.settles.pop_front(),
            (Some(_), _) => self.timers.pop().map(|Reverse(t)| t),
            (None, _) => self.settles.pop_front(),
        }
    }

    /// Removes and returns the earliest timer due at `now`, stale or not.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, SessionId, Timer)> {
        match self.first() {
            Some((at, _, _)) if at <= now => self.pop_first(),
            _ => None,
        }
    }

    /// Files `session` in the idle index as idle since `since`, or takes it
    /// out of it (`None`: it is not reclaimable). An entry already in the
    /// heap stays where it is: it is early or on time, and re-armed when it
    /// surfaces; only a session with no entry gets one.
    pub fn set_idle(&mut self, mark: &mut IdleMark, session: SessionId, since: Option<Instant>) {
        mark.since = since;
        if let (Some(since), None) = (since, mark.key) {
            mark.key = Some(since);
            self.idle.push(Reverse((since, session)));
        }
    }

    /// The oldest idle session and since when, after dropping the entries of
    /// sessions no longer reclaimable (or forgotten) and re-arming the ones
    /// that surfaced early (their session went busy and idle again since).
    pub fn next_idle(&mut self, marks: &mut impl IdleMarks) -> Option<(Instant, SessionId)> {
        while let Some(Reverse((key, id))) = self.idle.peek().copied() {
            let Some(mark) = marks.mark_mut(id) else {
                self.idle.pop();
                continue;
            };
            if mark.key != Some(key) {
                // Not this session's entry any more (the index was cleared).
                self.idle.pop();
                continue;
            }
            match mark.since {
                Some(since) if since == key => return Some((key, id)),
                Some(since) => {
                    self.idle.pop();
                    mark.key = Some(since);
                    self.idle.push(Reverse((since, id)));
                }
                None => {
                    self.idle.pop();
                    mark.key = None;
                }
            }
        }
        None
    }

    /// The `n` oldest idle sessions of `scope` but those in `spare` (and,
    /// with `committed_only`, those whose registration waits for its
    /// commit), oldest first (fewer when there are not as many), leaving
    /// them in the index.
    ///
    /// Sessions of other scopes are looked past: with one scope that costs
    /// nothing; with several, a registration at the cap looks at most at
    /// every idle session once (O(k log k) for the k it looks past), and
    /// only at the cap.
    pub fn oldest_idle(
        &mut self,
        marks: &mut impl IdleMarks,
        n: usize,
        spare: [Option<SessionId>; 2],
        scope: Scope,
        committed_only: bool,
    ) -> Vec<SessionId> {
        let mut taken = Vec::with_capacity(n + 1);
        let mut oldest = Vec::with_capacity(n);
        while oldest.len() < n {
            let Some((since, id)) = self.next_idle(marks) else {
                break;
            };
            // Off the top for the next look, back in below as it was.
            self.idle.pop();
            taken.push(Reverse((since, id)));
            let counted = !committed_only || !marks.owes_room(id);
            if counted && !spare.contains(&Some(id)) && marks.scope(id) == Some(scope) {
                oldest.push(id);
            }
        }
        self.idle.extend(taken);
        oldest
    }

    /// Takes a session out of the index wherever its entry is: the entry
    /// goes stale, skipped when it surfaces.
    pub fn unindex_idle(&mut self, mark: &mut IdleMark) {
        *mark = IdleMark::default();
    }

    /// Takes the session [`next_idle`](Self::next_idle) named out of the
    /// index, to claim it.
    pub fn take_next_idle(&mut self, mark: &mut IdleMark) {
        self.idle.pop();
        *mark = IdleMark::default();
    }

    /// Empties the idle index (a shutdown: no automatic path runs any more).
    pub fn clear_idle(&mut self, marks: &mut impl IdleMarks) {
        for Reverse((_, id)) in std::mem::take(&mut self.idle) {
            if let Some(mark) = marks.mark_mut(id) {
                *mark = IdleMark::default();
            }
        }
    }

    /// Drops every entry of a session `keep` says no (a forgotten session),
    /// once such entries may be half of a heap: stale entries are otherwise
    /// dropped only when they surface, and an idle entry surfaces after the
    /// idle TTL, so a process that finalizes sessions faster than that would
    /// keep one entry per finalized session. Checked after each forget,
    /// rebuilt at most once per as many forgets as the heap has entries, so
    /// it stays linear overall.
    pub fn compact(&mut self, live_sessions: usize, keep: impl Fn(SessionId) -> bool) {
        let bound = live_sessions.saturating_mul(2).saturating_add(64);
        if self.idle.len() > bound.max(self.compact_idle_at) {
            self.idle.retain(|Reverse((_, id))| keep(*id));
            // Entries of live sessions stay; the next rebuild waits until the
            // heap has doubled again, so rebuilds stay linear overall.
            self.compact_idle_at = self.idle.len().saturating_mul(2);
        }
        if self.len() > bound.max(self.compact_timers_at) {
            self.timers.retain(|Reverse((_, id, _))| keep(*id));
            self.settles.retain(|(_, id, _)| keep(*id));
            self.compact_timers_at = self.len().saturating_mul(2);
        }
    }

    /// Drops stale timers from the top, as judged by `is_live`, so that
    /// [`next`](Self::next) does not report a deadline nobody waits for
    /// (the idle heap is pruned by [`next_idle`](Self::next_idle)).
    pub fn prune(&mut self, mut is_live: impl FnMut(Instant, SessionId, Timer) -> bool) {
        while let Some((at, id, timer)) = self.first() {
            if is_live(at, id, timer) {
                break;
            }
            self.pop_first();
        }
    }

    /// The earliest deadline at which [`Core::handle_timeout`](crate::Core::handle_timeout)
    /// has something to do.
    pub fn next(&self, idle_ttl: Option<Duration>) -> Option<Deadline> {
        let timer = self.first().map(|(at, _, timer)| Deadline {
            at,
            kind: timer.kind(),
        });
        let idle = idle_ttl.and_then(|ttl| {
            self.idle.peek().and_then(|Reverse((since, _))| {
                since.checked_add(ttl).map(|at| Deadline {
                    at,
                    kind: DeadlineKind::IdleReap,
                })
            })
        });
        let drain = self.drain.map(|at| Deadline {
            at,
            kind: DeadlineKind::Drain,
        });
        [timer, idle, drain].into_iter().flatten().min()
    }

    pub fn len(&self) -> usize {
        self.timers.len() + self.settles.len()
    }

    pub fn idle_len(&self) -> usize {
        self.idle.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills both heaps with `n` entries of sessions nobody keeps any more.
    fn filled(n: u64) -> Deadlines {
        let now = Instant::now();
        let mut d = Deadlines::default();
        for id in 1..=n {
            d.arm(now, SessionId(id), Timer::Orphan);
            d.set_idle(&mut IdleMark::default(), SessionId(id), Some(now));
        }
        d
    }

    #[test]
    fn a_heap_is_rebuilt_once_it_holds_more_than_twice_the_live_sessions_and_64() {
        // No live session: the bound is 64 entries, each heap's own.
        let mut at_bound = filled(64);
        at_bound.compact(0, |_| false);
        assert_eq!(
            (at_bound.idle_len(), at_bound.len()),
            (64, 64),
            "at the bound"
        );
        let mut past = filled(65);
        past.compact(0, |_| false);
        assert_eq!((past.idle_len(), past.len()), (0, 0), "one past it");
        // Ten live sessions raise it to 84.
        let mut live = filled(84);
        live.compact(10, |_| false);
        assert_eq!((live.idle_len(), live.len()), (84, 84));
        live.compact(9, |_| false);
        assert_eq!((live.idle_len(), live.len()), (0, 0));
    }

    /// Settle deadlines wait in the order they were armed, the other timers
    /// in the heap, and every timer comes out earliest first from both; a
    /// settle deadline earlier than the last one queued (which the core's
    /// clock never makes) still comes out in its place.
    #[test]
    fn timers_come_out_earliest_first_from_the_settle_queue_and_the_heap() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let settle = Timer::Settle(WorkKind::Turn, 1);
        let mut d = Deadlines::default();
        d.arm(ms(10), SessionId(1), settle);
        d.arm(ms(30), SessionId(2), settle);
        d.arm(ms(20), SessionId(3), Timer::Orphan);
        d.arm(ms(5), SessionId(4), settle); // out of order: into the heap
        d.arm(ms(30), SessionId(5), settle);
        assert_eq!((d.settles.len(), d.len()), (3, 5));
        assert_eq!(
            d.next(None),
            Some(Deadline {
                at: ms(5),
                kind: DeadlineKind::Settle
            })
        );
        assert!(d.pop_due(ms(4)).is_none(), "nothing due yet");
        let due: Vec<u64> = std::iter::from_fn(|| d.pop_due(ms(30)))
            .map(|(_, id, _)| id.get())
            .collect();
        assert_eq!(due, [4, 1, 3, 2, 5]);
        assert_eq!(d.len(), 0);

        // Stale entries at the front of either are pruned.
        d.arm(ms(40), SessionId(6), settle);
        d.arm(ms(50), SessionId(7), Timer::Orphan);
        d.prune(|_, id, _| id.get() != 6);
        assert_eq!(d.next(None).map(|n| n.at), Some(ms(50)));
    }
}
