//! G12 across processes, as properties of random fleet histories: two
//! cores (two processes of a fleet, restarted at will) over a model of the
//! store's rows and its conditional updates. A session moves between them
//! only by a handoff ([`Effect::HandOff`]) and an adoption (the store's
//! compare-and-set first, then [`Event::Adopt`]; a core that refuses it has
//! it released again), while a sweeper of the store reaps released sessions
//! nobody adopted, and may run between the two halves of an adoption. Checked after every step: every finalize and every release a
//! core orders is of a session the store says it owns (so none is finalized
//! twice, G2, and none claimed by a sweeper while another process adopts
//! it, G3); no session is open in two processes; turn numbers go on across
//! processes; no state moves backwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use settle_core::{
    Adoptee, Core, Effect, EndReason, Event, Holds, Outcome, Policy, Scope, SessionId, State,
    WorkId,
};

const NODES: usize = 2;
const TTL_MS: u64 = 300;

/// One input to the fleet.
#[derive(Debug, Clone)]
enum Step {
    Register(usize),
    StartTurn(usize, usize),
    EndWork(usize, usize),
    Handoff(usize, u64),
    /// The store's conditional update gives the `k`th released session to
    /// node `n`...
    AdoptBegin(usize, usize),
    /// ...and its core takes it on (or refuses, and it is released again).
    AdoptCommit(usize),
    Sweep,
    Restart(usize),
    Tick(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let node = 0..NODES;
    prop_oneof![
        4 => node.clone().prop_map(Step::Register),
        4 => (node.clone(), 0usize..4).prop_map(|(n, k)| Step::StartTurn(n, k)),
        4 => (node.clone(), 0usize..4).prop_map(|(n, k)| Step::EndWork(n, k)),
        1 => (node.clone(), prop_oneof![Just(0u64), 1u64..400]).prop_map(|(n, d)| Step::Handoff(n, d)),
        3 => (node.clone(), 0usize..4).prop_map(|(n, k)| Step::AdoptBegin(n, k)),
        3 => node.clone().prop_map(Step::AdoptCommit),
        2 => Just(Step::Sweep),
        2 => node.prop_map(Step::Restart),
        4 => (0u64..500).prop_map(Step::Tick),
    ]
}

/// A session's row, as the store keeps it.
#[derive(Debug, Clone)]
struct Row {
    /// The process (node, generation) that owns it; `None`: released.
    owner: Option<(usize, u32)>,
    released_at: Option<u64>,
    finalized: Option<EndReason>,
    turns: u32,
    last_outcome: Option<Outcome>,
    /// What a released row holds it open for (carried to its adopter).
    holds: Holds,
}

struct Node {
    core: Core,
    generation: u32,
    done: bool,
    works: Vec<WorkId>,
    /// An adoption the store gave it, not yet given to its core.
    adopting: Option<SessionId>,
}

struct Fleet {
    base: Instant,
    now: u64,
    next_id: u64,
    rows: BTreeMap<u64, Row>,
    nodes: Vec<Node>,
    generations: u32,
}

fn core() -> Core {
    Core::new(
        Policy::default()
            .idle_ttl(Some(Duration::from_millis(TTL_MS)))
            .settle_timeout(Duration::from_millis(50))
            .lru_cap(None),
    )
}

impl Fleet {
    fn new() -> Fleet {
        Fleet {
            base: Instant::now(),
            now: 0,
            next_id: 1,
            rows: BTreeMap::new(),
            nodes: (0..NODES)
                .map(|n| Node {
                    core: core(),
                    generation: n as u32,
                    done: false,
                    works: Vec::new(),
                    adopting: None,
                })
                .collect(),
            generations: NODES as u32,
        }
    }

    fn at(&self) -> Instant {
        self.base + Duration::from_millis(self.now)
    }

    fn me(&self, n: usize) -> (usize, u32) {
        (n, self.nodes[n].generation)
    }

    /// The sessions node `n` owns in the store, by id.
    fn owned(&self, n: usize) -> Vec<u64> {
        let me = self.me(n);
        self.rows
            .iter()
            .filter(|(_, r)| r.owner == Some(me) && r.finalized.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    fn released(&self) -> Vec<u64> {
        self.rows
            .iter()
            .filter(|(_, r)| r.owner.is_none() && r.finalized.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Executes node `n`'s effects as a driver does, against the store.
    fn drain(&mut self, n: usize) {
        let me = self.me(n);
        while let Some(set) = self.nodes[n].core.poll_effect() {
            for effect in set.singles() {
                self.execute(n, me, effect);
            }
        }
    }

    /// Executes one order of node `n` (whose owner id is `me`).
    fn execute(&mut self, n: usize, me: (usize, u32), effect: Effect) {
        match effect {
            Effect::Transition(t) => {
                if let Some(from) = t.from {
                    assert!(from.can_move_to(t.to), "{t:?} moves backwards");
                }
            }
            Effect::EndWork { work, outcome } => {
                self.nodes[n].works.retain(|w| *w != work);
                let row = self.rows.get_mut(&work.session.get()).unwrap();
                assert_eq!(
                    row.owner,
                    Some(me),
                    "G8: {work} ended by a process that does not own it"
                );
                if work.turn_no().is_some() {
                    row.last_outcome = Some(outcome);
                }
            }
            Effect::Finalize(f) => {
                let row = self.rows.get_mut(&f.session.get()).unwrap();
                assert_eq!(
                    (row.owner, row.finalized),
                    (Some(me), None),
                    "G2, G12: node {n} finalizes session {} it does not own",
                    f.session
                );
                row.finalized = Some(f.reason);
                self.nodes[n].core.forget(f.session);
            }
            Effect::HandOff(h) => {
                let now = self.now;
                let row = self.rows.get_mut(&h.session.get()).unwrap();
                assert_eq!(
                    (row.owner, row.finalized),
                    (Some(me), None),
                    "G12: node {n} releases session {} it does not own",
                    h.session
                );
                assert_eq!(h.turns, row.turns, "G12: released with its turn count");
                assert_eq!(h.last_outcome, row.last_outcome);
                row.owner = None;
                row.released_at = Some(now);
                row.holds = h.holds;
            }
            Effect::ShutdownComplete(_) => self.nodes[n].done = true,
            _ => {}
        }
    }

    fn input(
        &mut self,
        n: usize,
        event: Event,
    ) -> Result<settle_core::Handled, settle_core::Error> {
        let at = self.at();
        let answer = self.nodes[n].core.handle(at, event);
        self.drain(n);
        answer
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Register(n) => {
                let id = self.next_id;
                self.next_id += 1;
                let registered = self.input(
                    n,
                    Event::Register {
                        session: SessionId(id),
                        parent: None,
                        scope: None,
                    },
                );
                if registered.is_ok() {
                    let owner = Some(self.me(n));
                    self.rows.insert(
                        id,
                        Row {
                            owner,
                            released_at: None,
                            finalized: None,
                            turns: 0,
                            last_outcome: None,
                            holds: Holds::default(),
                        },
                    );
                }
            }
            Step::StartTurn(n, k) => {
                let owned = self.owned(n);
                let Some(&id) = owned.get(k % owned.len().max(1)) else {
                    return;
                };
                if let Ok(settle_core::Handled::Started(work)) = self.input(
                    n,
                    Event::StartTurn {
                        session: SessionId(id),
                    },
                ) {
                    let row = self.rows.get_mut(&id).unwrap();
                    assert_eq!(
                        work.no,
                        row.turns + 1,
                        "G12: turn numbers go on where they were"
                    );
                    row.turns = work.no;
                    self.nodes[n].works.push(work);
                }
            }
            Step::EndWork(n, k) => {
                let works = &self.nodes[n].works;
                let Some(&work) = works.get(k % works.len().max(1)) else {
                    return;
                };
                let _ = self.input(
                    n,
                    Event::WorkEnded {
                        work,
                        outcome: Outcome::Completed,
                    },
                );
            }
            Step::Handoff(n, drain) => {
                let _ = self.input(
                    n,
                    Event::BeginHandoff {
                        drain: Duration::from_millis(drain),
                    },
                );
            }
            Step::AdoptBegin(n, k) => {
                let released = self.released();
                let Some(&id) = released.get(k % released.len().max(1)) else {
                    return;
                };
                if self.nodes[n].adopting.is_some() || self.nodes[n].done {
                    return;
                }
                // The one conditional update: released and not finalized
                // (`released()` lists only those).
                let me = self.me(n);
                let row = self.rows.get_mut(&id).unwrap();
                row.owner = Some(me);
                row.released_at = None;
                self.nodes[n].adopting = Some(SessionId(id));
            }
            Step::AdoptCommit(n) => {
                let Some(session) = self.nodes[n].adopting.take() else {
                    return;
                };
                let row = self.rows[&session.get()].clone();
                let event = Event::Adopt(Adoptee {
                    session,
                    parent: None,
                    turns: row.turns,
                    last_outcome: row.last_outcome,
                    holds: row.holds,
                    scope: Scope::SHARED,
                });
                if self.input(n, event).is_err() {
                    // Refused (a shutdown began): released again at once.
                    let now = self.now;
                    let row = self.rows.get_mut(&session.get()).unwrap();
                    row.owner = None;
                    row.released_at = Some(now);
                }
            }
            Step::Sweep => {
                let now = self.now;
                for row in self.rows.values_mut() {
                    // Reaped only while released, in the same step (G3).
                    let due = row.released_at.is_some_and(|at| at + TTL_MS <= now);
                    // A held row is not idle: its adopter ends it (G3).
                    let idle = row.holds.is_empty();
                    if row.owner.is_none() && row.finalized.is_none() && due && idle {
                        row.finalized = Some(EndReason::IdleReap);
                    }
                }
            }
            Step::Restart(n) => {
                if !self.nodes[n].done {
                    return;
                }
                self.generations += 1;
                self.nodes[n] = Node {
                    core: core(),
                    generation: self.generations,
                    done: false,
                    works: Vec::new(),
                    adopting: None,
                };
            }
            Step::Tick(ms) => {
                self.now += ms;
                let at = self.at();
                for n in 0..NODES {
                    while self.nodes[n]
                        .core
                        .poll_timeout()
                        .is_some_and(|d| d.at <= at)
                    {
                        self.nodes[n].core.handle_timeout(at);
                        self.drain(n);
                    }
                }
            }
        }
    }

    /// No session is open in two processes; every session a process keeps
    /// open is one the store says it owns (or is adopting).
    fn check(&self) {
        for (id, row) in &self.rows {
            let open: Vec<usize> = (0..NODES)
                .filter(|n| {
                    self.nodes[*n]
                        .core
                        .state(SessionId(*id))
                        .is_some_and(|s| s != State::Finalized)
                })
                .collect();
            assert!(
                open.len() <= 1,
                "G12: session {id} is open in nodes {open:?}"
            );
            if let Some(&n) = open.first() {
                let adopting = self.nodes[n].adopting == Some(SessionId(*id));
                assert!(
                    row.owner == Some(self.me(n)) || adopting,
                    "G12: node {n} keeps session {id} open, the store says {row:?}"
                );
                assert!(
                    row.finalized.is_none(),
                    "G2: {id} open after it was finalized"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("SETTLE_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500),
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn g12_sessions_move_between_processes_only_by_handoff_and_adoption(
        steps in proptest::collection::vec(step(), 1..120)
    ) {
        let mut fleet = Fleet::new();
        for step in &steps {
            fleet.apply(step);
            fleet.check();
        }
    }
}
