//! The two core rows of SPEC §9.
//!
//! - `events`: a seeded random workload of register / start / end / finish /
//!   cancel through the core, against a bare `HashMap<u64, small struct>`
//!   update loop doing the same lookups on the same data (target ≥ 0.5×).
//! - `memory`: heap bytes per idle registered session in a core holding
//!   100,000 of them, counted by the global allocator of this binary
//!   (target ≤ 512).
//!
//! Both figures are also printed as plain lines at the end of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A counting allocator needs `unsafe impl GlobalAlloc`; it only forwards to
// `System` and adds up sizes.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use settle_core::{CancelMode, Core, Event, Outcome, Policy, SessionId};

struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counter never affects the returned memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ----- the workload -------------------------------------------------------

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

#[derive(Debug, Clone, Copy)]
enum Op {
    Register(u64),
    Start(u64),
    End(u64),
    Finish(u64),
    Cancel(u64),
    /// The work of a cancelled turn exits.
    Exited(u64),
    /// The driver drops the record of a finalized session.
    Forget(u64),
}

/// A valid random sequence over `slots` concurrent sessions: each slot
/// registers a session, runs turns, and finishes or is cancelled; then the
/// record is forgotten and the slot takes a fresh id.
fn workload(seed: u64, slots: usize, len: usize) -> Vec<Op> {
    #[derive(Clone, Copy)]
    enum Slot {
        Gone,
        Idle(u64),
        Running(u64),
        Cancelling(u64),
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
                (Op::Register(next_id), Slot::Idle(next_id))
            }
            Slot::Idle(id) => match roll {
                0..=6 => (Op::Start(id), Slot::Running(id)),
                7..=8 => (Op::Finish(id), Slot::Done(id)),
                _ => (Op::Cancel(id), Slot::Done(id)),
            },
            Slot::Running(id) => match roll {
                0..=6 => (Op::End(id), Slot::Idle(id)),
                7 => (Op::Finish(id), Slot::Done(id)),
                _ => (Op::Cancel(id), Slot::Cancelling(id)),
            },
            Slot::Cancelling(id) => (Op::Exited(id), Slot::Done(id)),
            Slot::Done(id) => (Op::Forget(id), Slot::Gone),
        };
        table[i] = to;
        ops.push(op);
    }
    ops
}

fn bench_policy() -> Policy {
    // No cap: the workload decides how many sessions live, not the evictor.
    Policy {
        lru_cap: None,
        ..Policy::default()
    }
}

fn run_core(mut core: Core, ops: &[Op], now: Instant) -> Core {
    for op in ops {
        let session = |id: u64| SessionId(id);
        let event = match *op {
            Op::Register(id) => Event::Register {
                session: session(id),
                parent: None,
            },
            Op::Start(id) => Event::StartTurn {
                session: session(id),
            },
            Op::End(id) => Event::TurnEnded {
                session: session(id),
                outcome: Outcome::Completed,
            },
            Op::Finish(id) => Event::AgentFinished {
                session: session(id),
            },
            Op::Cancel(id) => Event::Cancel {
                session: session(id),
                mode: CancelMode::Immediate,
            },
            Op::Exited(id) => Event::WorkExited {
                session: session(id),
            },
            Op::Forget(id) => {
                black_box(core.forget(session(id)));
                continue;
            }
        };
        black_box(core.handle(now, event)).ok();
        // The drain rule: every effect is taken before the next input.
        while let Some(effect) = core.poll_effect() {
            black_box(effect);
        }
    }
    core
}

/// The baseline: one lookup and a small update per input, nothing else.
#[derive(Debug, Clone, Copy)]
struct Small {
    state: u8,
    turns: u32,
    outcome: u8,
}

fn run_map(mut map: HashMap<u64, Small>, ops: &[Op]) -> HashMap<u64, Small> {
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
            Op::End(id) => {
                if let Some(s) = map.get_mut(&id) {
                    s.state = 0;
                    s.outcome = 1;
                }
            }
            Op::Finish(id) | Op::Exited(id) => {
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

const SLOTS: usize = 1024;
const EVENTS: usize = 200_000;

fn events(c: &mut Criterion) {
    let ops = workload(0x005e_771e, SLOTS, EVENTS);
    let now = Instant::now();
    let mut group = c.benchmark_group("events");
    group.throughput(Throughput::Elements(ops.len() as u64));
    group.bench_function("core", |b| {
        b.iter_batched(
            || Core::new(bench_policy()),
            |core| run_core(core, &ops, now),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("hashmap_baseline", |b| {
        b.iter_batched(
            HashMap::new,
            |map| run_map(map, &ops),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, events);

/// The best of a few timed runs, outside criterion, for the printed ratio.
fn best_of(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..runs).map(|_| f()).min().unwrap_or_default()
}

fn events_ratio() {
    let ops = workload(0x005e_771e, SLOTS, EVENTS);
    let now = Instant::now();
    let core = best_of(15, || {
        let core = Core::new(bench_policy());
        let start = Instant::now();
        let core = run_core(core, &ops, now);
        let took = start.elapsed();
        drop(black_box(core));
        took
    });
    let map = best_of(15, || {
        let start = Instant::now();
        let map = run_map(HashMap::new(), &ops);
        let took = start.elapsed();
        drop(black_box(map));
        took
    });
    let per_sec = |d: Duration| EVENTS as f64 / d.as_secs_f64();
    println!(
        "core events/s: {:.2}M, hashmap baseline: {:.2}M, ratio {:.2}x (target >= 0.5x)",
        per_sec(core) / 1e6,
        per_sec(map) / 1e6,
        per_sec(core) / per_sec(map)
    );
}

fn memory_per_idle_session() {
    const SESSIONS: u64 = 100_000;
    let now = Instant::now();
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut core = Core::new(bench_policy());
    for id in 1..=SESSIONS {
        let handled = core.handle(
            now,
            Event::Register {
                session: SessionId(id),
                parent: None,
            },
        );
        assert!(handled.is_ok(), "registered: {handled:?}");
        while let Some(effect) = core.poll_effect() {
            black_box(effect);
        }
    }
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    let per_session = (after - before) as f64 / SESSIONS as f64;
    println!(
        "memory: {per_session:.0} heap bytes per idle session over {SESSIONS} sessions \
         (record held inline in the table; Core itself {} bytes) (target <= 512)",
        std::mem::size_of::<Core>()
    );
    drop(black_box(core));
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    events_ratio();
    memory_per_idle_session();
}
