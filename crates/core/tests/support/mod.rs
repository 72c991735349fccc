//! The harness of the example-based suites (`edges.rs`, `seeds.rs`,
//! `contract.rs`): a core driven as a driver drives it, on a fake clock, with
//! every effect it emitted kept in order.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use settle_core::{
    Core, Effect, EndReason, Error, Event, Finalize, Handled, Policy, SessionId, State, WorkId,
};

pub const SEC: Duration = Duration::from_secs(1);
pub const MS: Duration = Duration::from_millis(1);

pub struct Harness {
    pub core: Core,
    pub start: Instant,
    pub now: Instant,
    /// Every effect, in the order the core emitted it.
    pub log: Vec<Effect>,
}

impl Harness {
    pub fn new() -> Self {
        Self::with(Policy::default())
    }

    pub fn with(policy: Policy) -> Self {
        let start = Instant::now();
        Harness {
            core: Core::new(policy),
            start,
            now: start,
            log: Vec::new(),
        }
    }

    /// No idle reap and no LRU cap unless a test asks for them.
    pub fn quiet() -> Self {
        Self::with(Policy::default().idle_ttl(None).lru_cap(None))
    }

    /// The drain rule: every effect is taken before the next input.
    pub fn drain(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        // A set effect is checked as the single orders it stands for.
        while let Some(e) = self.core.poll_effect() {
            out.extend(e.singles());
        }
        self.log.extend(out.iter().cloned());
        out
    }

    pub fn try_ev(&mut self, event: Event) -> Result<Handled, Error> {
        let handled = self.core.handle(self.now, event);
        self.drain();
        handled
    }

    pub fn ev_h(&mut self, event: Event) -> Handled {
        self.try_ev(event).expect("event accepted")
    }

    pub fn ev(&mut self, event: Event) {
        let _ = self.ev_h(event);
    }

    /// Feeds `event` and returns only the effects it caused.
    pub fn effects_of(&mut self, event: Event) -> Vec<Effect> {
        let handled = self.core.handle(self.now, event);
        assert!(handled.is_ok(), "{handled:?}");
        self.drain()
    }

    /// Moves the clock to `start + at` without waking the core.
    pub fn at(&mut self, at: Duration) {
        self.now = self.start + at;
    }

    /// Moves the clock to `start + at` and lets the deadlines fire.
    pub fn tick(&mut self, at: Duration) {
        self.at(at);
        self.wake();
    }

    /// Moves the clock on by `by` and lets the deadlines fire.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        self.wake();
    }

    /// Calls `handle_timeout` with the current time, and checks that the core
    /// then asks for no time at or before it.
    pub fn wake(&mut self) {
        self.core.handle_timeout(self.now);
        self.drain();
        if let Some(next) = self.core.poll_timeout() {
            assert!(next.at > self.now, "asked for a time in the past: {next:?}");
        }
    }

    /// Registers `id` under `parent`; at the LRU cap, commits the
    /// registration at once, as a driver does once its row is written (the
    /// evictions that make room for it happen then).
    pub fn register(&mut self, id: u64, parent: Option<u64>) -> SessionId {
        let session = SessionId(id);
        let handled = self.ev_h(Event::Register {
            session,
            parent: parent.map(SessionId),
            scope: None,
        });
        match handled {
            Handled::Applied => {}
            Handled::EvictsOnCommit => {
                self.ev(Event::Committed { session });
            }
            other => panic!("registration of {id} answered {other:?}"),
        }
        session
    }

    /// Starts a turn and returns its work, as the core named it.
    pub fn start_turn(&mut self, session: SessionId) -> WorkId {
        self.start(Event::StartTurn { session })
    }

    /// Starts a task and returns its work, as the core named it.
    pub fn start_task(&mut self, session: SessionId) -> WorkId {
        self.start(Event::StartTask { session })
    }

    /// Starts a turn and attaches its stream, nothing in between: the
    /// setup of a turn that is streaming. Returns its work.
    pub fn attached_turn(&mut self, session: SessionId) -> WorkId {
        let work = self.start_turn(session);
        self.ev(Event::StreamAttached { work });
        work
    }

    fn start(&mut self, event: Event) -> WorkId {
        match self.try_ev(event) {
            Ok(Handled::Started(work)) => work,
            other => panic!("a start answers the work it admitted: {other:?}"),
        }
    }

    pub fn attach(&mut self, session: SessionId) {
        self.ev(Event::TransportAttached {
            session,
            close_on_disconnect: false,
        });
    }

    pub fn state(&self, id: SessionId) -> State {
        self.core.session(id).expect("known").state()
    }

    pub fn finalized(&self) -> Vec<(SessionId, EndReason)> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Effect::Finalize(f) => Some((f.session, f.reason)),
                _ => None,
            })
            .collect()
    }

    pub fn finalize_of(&self, id: SessionId) -> Option<Finalize> {
        self.log.iter().find_map(|e| match e {
            Effect::Finalize(f) if f.session == id => Some(f.clone()),
            _ => None,
        })
    }

    pub fn count(&self, pred: impl Fn(&Effect) -> bool) -> usize {
        self.log.iter().filter(|e| pred(e)).count()
    }

    pub fn closes_of(&self, id: SessionId) -> usize {
        self.count(|e| matches!(e, Effect::CloseStream { work } if work.session == id))
    }

    pub fn detaches_of(&self, id: SessionId) -> usize {
        self.count(|e| matches!(e, Effect::DetachWork { work } if work.session == id))
    }

    pub fn cancels_of(&self, id: SessionId) -> usize {
        self.count(|e| matches!(e, Effect::CancelWork { work, .. } if work.session == id))
    }

    /// The outcomes the core recorded for `work` (exactly one once it is over).
    pub fn ended(&self, work: WorkId) -> Vec<settle_core::Outcome> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Effect::EndWork { work: w, outcome } if *w == work => Some(*outcome),
                _ => None,
            })
            .collect()
    }
}
