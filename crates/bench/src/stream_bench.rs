//! The stream row: `Guarded<IdleTimeout<S>>` over N ready items against the
//! bare stream `S`, on the workload of `crates/stream/benches/stream.rs`
//! (the same source file, `crates/stream/benches/support/ready.rs`).
//! Ready items never touch the timer or the clock, so the wrappers should
//! cost next to nothing; the items themselves cost next to nothing too, which
//! makes this the harshest possible ratio for a per-item overhead.

use std::hint::black_box;
use std::time::{Duration, Instant};

use settle_stream::{Guarded, IdleTimeout};

#[path = "../../stream/benches/support/ready.rs"]
mod ready;

use ready::{drain, Ready};

/// The idle timeout the wrapped stream carries (never reached: every item is ready).
const IDLE: Duration = Duration::from_secs(30);

/// One round of ours: drain `items` chunks through the wrappers.
pub fn guarded_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream = Guarded::new(IdleTimeout::new(Ready::new(items), IDLE));
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}

/// One round of the baseline: drain the same chunks from the bare stream.
pub fn bare_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream = Ready::new(items);
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}

/// Where the wrapper overhead sits: one round of `Guarded<S>` alone.
pub fn guarded_only_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream: Guarded<Ready> = Guarded::new(Ready::new(items));
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}

/// Where the wrapper overhead sits: one round of `IdleTimeout<S>` alone.
pub fn idle_only_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream = IdleTimeout::new(Ready::new(items), IDLE);
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}
