//! `Guarded<IdleTimeout<S>>` over 1,000,000 ready items against the bare
//! stream `S` (SPEC §9: target ≤ 1.10×). Ready items never touch the timer
//! or the clock, so the wrappers should cost next to nothing.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use settle_stream::{Guarded, IdleTimeout};

mod support {
    pub mod ready;
}
use support::ready::{drain, Ready};

const ITEMS: usize = 1_000_000;

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stream");
    group.throughput(Throughput::Elements(ITEMS as u64));
    group.sample_size(20);
    group.bench_function("bare", |b| {
        b.iter_batched(
            || Ready::new(ITEMS),
            |s| runtime.block_on(drain(s)),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("guarded_idle_timeout", |b| {
        b.iter_batched(
            || Guarded::new(IdleTimeout::new(Ready::new(ITEMS), Duration::from_secs(30))),
            |s| runtime.block_on(drain(s)),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
