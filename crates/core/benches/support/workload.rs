//! The seeded workload of the core row of SPEC §9, shared by the core's
//! criterion bench (`crates/core/benches/core.rs`) and the benchmark harness
//! (`crates/bench`), so both measure the same thing: register / start / end /
//! finish / cancel / work exited / forget over concurrent slots, through the
//! core and through a bare `HashMap` update loop doing the same lookups.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::time::Instant;

use settle_core::{CancelMode, Core, Event, Outcome, Policy, SessionId, WorkId};

/// splitmix64: a seeded, dependency-free source of reproducible workloads.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One input of the workload, naming a session by its raw id (and a turn's
/// work by its number).
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// A root session is registered.
    Register(u64),
    /// It starts a turn.
    Start(u64),
    /// Its turn completes.
    End(u64, u32),
    /// The agent finishes (mid-turn, the turn is cancelled and must exit).
    Finish(u64),
    /// It is cancelled immediately.
    Cancel(u64),
    /// The work of a cancelled turn exits.
    Exited(u64, u32),
    /// The driver drops the record of a finalized session.
    Forget(u64),
}

/// A valid random sequence over `slots` concurrent sessions: each slot
/// registers a session, runs turns, and finishes or is cancelled (mid-turn,
/// its work then exits); then the record is forgotten and the slot takes a
/// fresh id.
pub fn workload(seed: u64, slots: usize, len: usize) -> Vec<Op> {
    /// A slot's session and the number of turns it started.
    #[derive(Clone, Copy)]
    enum Slot {
        Gone,
        Idle(u64, u32),
        Running(u64, u32),
        Cancelling(u64, u32),
        Done(u64),
    }
    let mut rng = Rng(seed);
    let mut table = vec![Slot::Gone; slots];
    let mut next_id = 1u64;
    let mut ops = Vec::with_capacity(len);
    while ops.len() < len {
        let i = rng.below(slots as u64) as usize;
        let roll = rng.below(10);
        let (op, to) = match table[i] {
            Slot::Gone => {
                next_id += 1;
                (Op::Register(next_id), Slot::Idle(next_id, 0))
            }
            Slot::Idle(id, turns) => match roll {
                0..=6 => (Op::Start(id), Slot::Running(id, turns + 1)),
                7..=8 => (Op::Finish(id), Slot::Done(id)),
                _ => (Op::Cancel(id), Slot::Done(id)),
            },
            Slot::Running(id, turn) => match roll {
                0..=6 => (Op::End(id, turn), Slot::Idle(id, turn)),
                7 => (Op::Finish(id), Slot::Cancelling(id, turn)),
                _ => (Op::Cancel(id), Slot::Cancelling(id, turn)),
            },
            Slot::Cancelling(id, turn) => (Op::Exited(id, turn), Slot::Done(id)),
            Slot::Done(id) => (Op::Forget(id), Slot::Gone),
        };
        table[i] = to;
        ops.push(op);
    }
    ops
}

/// The policy of both sides' cores: no cap, so the workload decides how many
/// sessions live, not the evictor.
pub fn bench_policy() -> Policy {
    // No cap: the workload decides how many sessions live, not the evictor.
    Policy::default().lru_cap(None)
}

/// The input an op feeds the core; `None` for a forget, which is a call.
pub fn event(op: Op) -> Option<Event> {
    let session = SessionId;
    Some(match op {
        Op::Register(id) => Event::Register {
            session: session(id),
            parent: None,
            scope: None,
        },
        Op::Start(id) => Event::StartTurn {
            session: session(id),
        },
        Op::End(id, no) => Event::WorkEnded {
            work: WorkId::turn(session(id), no),
            outcome: Outcome::Completed,
        },
        Op::Finish(id) => Event::AgentFinished {
            session: session(id),
        },
        Op::Cancel(id) => Event::Cancel {
            session: session(id),
            mode: CancelMode::Immediate,
        },
        Op::Exited(id, no) => Event::WorkExited {
            work: WorkId::turn(session(id), no),
        },
        Op::Forget(_) => return None,
    })
}

/// Runs `ops` through `core`, draining every effect after every input.
pub fn run_core(mut core: Core, ops: &[Op], now: Instant) -> Core {
    for op in ops {
        match (event(*op), *op) {
            (Some(event), _) => {
                black_box(core.handle(now, event)).ok();
            }
            (None, Op::Forget(id)) => {
                black_box(core.forget(SessionId(id)));
            }
            (None, _) => {}
        }
        // The drain rule: every effect is taken before the next input.
        while let Some(effect) = core.poll_effect() {
            black_box(effect);
        }
    }
    core
}

/// The baseline: one lookup and a small update per input, nothing else.
#[derive(Debug, Clone, Copy)]
pub struct Small {
    state: u8,
    turns: u32,
    outcome: u8,
}

/// Runs `ops` through the baseline map, with whatever hasher it was made
/// with (the harnesses give it the core's, foldhash).
pub fn run_map<S: BuildHasher>(
    mut map: HashMap<u64, Small, S>,
    ops: &[Op],
) -> HashMap<u64, Small, S> {
    for op in ops {
        match *op {
            Op::Register(id) => {
                map.insert(
                    id,
                    Small {
                        state: 0,
                        turns: 0,
                        outcome: 0,
                    },
                );
            }
            Op::Start(id) => {
                if let Some(s) = map.get_mut(&id) {
                    if s.state == 0 {
                        s.state = 1;
                        s.turns += 1;
                    }
                }
            }
            Op::End(id, _) => {
                if let Some(s) = map.get_mut(&id) {
                    s.state = 0;
                    s.outcome = 1;
                }
            }
            Op::Finish(id) | Op::Exited(id, _) => {
                if let Some(s) = map.get_mut(&id) {
                    s.state = 4;
                }
            }
            Op::Cancel(id) => {
                if let Some(s) = map.get_mut(&id) {
                    s.state = 2;
                }
            }
            Op::Forget(id) => {
                black_box(map.remove(&id));
            }
        }
    }
    map
}
