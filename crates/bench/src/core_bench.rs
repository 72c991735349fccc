//! The core row: events per second through the sans-IO [`Core`] on a seeded
//! random workload (register / start / end / finish / cancel / work exited /
//! forget over 1,024 concurrent slots), against a bare `HashMap<u64, small
//! struct>` update loop doing the same lookups on the same data, hashed with
//! the hasher the core's session table uses (foldhash, `crates/core/src/hash.rs`):
//! with std's SipHash the baseline spent most of its time hashing and read
//! about half as fast as it is. The workload generator is the one of
//! `crates/core/benches/core.rs` (the same source file,
//! `crates/core/benches/support/workload.rs`), so both harnesses measure the
//! same thing.
//!
//! Also the memory row: heap bytes per idle registered session.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use settle_core::{Core, Event, SessionId};

use crate::Result;
#[path = "../../core/benches/support/workload.rs"]
mod workload;

use workload::{bench_policy, run_core, run_map};
pub use workload::{workload, Op};

/// The seed of the workload (the same as the criterion bench's).
pub const SEED: u64 = 0x005e_771e;
/// Concurrent sessions in the workload.
pub const SLOTS: usize = 1024;

/// One round of ours: a fresh core through the whole workload.
pub fn core_round(ops: &[Op]) -> Duration {
    let core = Core::new(bench_policy());
    let now = Instant::now();
    let start = Instant::now();
    let core = run_core(core, ops, now);
    let took = start.elapsed();
    drop(black_box(core));
    took
}

/// One round of the baseline: a fresh map, hashed as the core's table is,
/// through the whole workload.
pub fn map_round(ops: &[Op]) -> Duration {
    let start = Instant::now();
    let map = run_map(
        HashMap::with_hasher(foldhash::fast::RandomState::default()),
        ops,
    );
    let took = start.elapsed();
    drop(black_box(map));
    took
}

/// Heap bytes per idle registered session in a core holding `sessions` of
/// them, counted by this binary's allocator.
pub fn bytes_per_idle_session(sessions: u64) -> Result<f64> {
    let now = Instant::now();
    let (core, bytes) = crate::alloc::net_bytes(|| {
        let mut core = Core::new(bench_policy());
        for id in 1..=sessions {
            let _ = core.handle(
                now,
                Event::Register {
                    session: SessionId(id),
                    parent: None,
                    scope: None,
                },
            )?;
            while let Some(effect) = core.poll_effect() {
                black_box(effect);
            }
        }
        Ok::<_, settle_core::Error>(core)
    });
    let core = core?;
    drop(black_box(core));
    Ok(bytes as f64 / sessions as f64)
}
