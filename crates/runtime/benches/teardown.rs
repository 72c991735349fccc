//! Teardown of a flat agent tree (SPEC §9): the root finishes while every
//! child is mid-turn with an open (hung) scripted stream, and the runtime
//! cancels, settles and finalizes every child, then the root, with the store
//! stubbed out ([`MemoryStore`]). The baseline is a bare tokio-util
//! `CancellationToken` tree plus a `TaskTracker` cancelling and joining as
//! many tasks, each holding a similar pending stream.
//!
//! Only the teardown is timed: from the root's finish (or the root token's
//! cancel) until every session is finalized (or every task joined).
//!
//! Criterion measures 1,000 and 10,000 agents; then an interleaved run
//! (baseline, runtime, baseline, ...) prints the medians and their ratio at
//! 1,000, 10,000 and 100,000 agents.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use futures_util::StreamExt;
use settle_runtime::{EndReason, Kernel, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{Guarded, ScriptedEnd, ScriptedProvider, TurnScript};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn hung() -> TurnScript {
    TurnScript::new(Vec::<String>::new()).end(ScriptedEnd::Hang)
}

/// One runtime teardown of `n` children under one root; returns its time.
async fn runtime_teardown(n: usize) -> Duration {
    let store = MemoryStore::new();
    let runtime = Kernel::builder(Arc::new(store))
        .idle_timeout(None)
        .idle_ttl(None)
        .lru_cap(None)
        .start()
        .await
        .unwrap();
    let root = runtime.register("root", None).await.unwrap();
    let provider = Arc::new(ScriptedProvider::new((0..n).map(|_| hung())));
    let mut turns = Vec::with_capacity(n);
    for i in 0..n {
        let child = runtime
            .register(format!("child-{i}"), Some(root.id()))
            .await
            .unwrap();
        let turn = child
            .run_turn(provider.clone(), TurnRequest::prompt("go"))
            .await
            .unwrap();
        turns.push(turn);
    }
    while provider.stats().opened < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let began = Instant::now();
    let reason = root.finish().await.unwrap();
    let took = began.elapsed();

    assert_eq!(reason, EndReason::Completed);
    assert_eq!(provider.stats().close_started, n);
    drop(turns);
    runtime.shutdown(Duration::ZERO).await;
    took
}

/// The same number of tasks under a bare token tree and a task tracker.
async fn baseline_teardown(n: usize) -> Duration {
    let provider = Arc::new(ScriptedProvider::new((0..n).map(|_| hung())));
    let root = CancellationToken::new();
    let tracker = TaskTracker::new();
    let started = Arc::new(AtomicUsize::new(0));
    for _ in 0..n {
        let token = root.child_token();
        let mut stream = Guarded::new(provider.open_next().unwrap());
        let started = started.clone();
        tracker.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                () = token.cancelled() => {}
                _ = stream.next() => {}
            }
            // Dropping the guard closes the stream, as the runtime's works do.
            drop(stream);
        });
    }
    while started.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let began = Instant::now();
    root.cancel();
    tracker.close();
    tracker.wait().await;
    let took = began.elapsed();

    assert_eq!(provider.stats().close_started, n);
    took
}

fn teardown(c: &mut Criterion) {
    let rt = tokio_runtime();
    let mut group = c.benchmark_group("teardown");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    for n in [1_000, 10_000] {
        group.bench_with_input(BenchmarkId::new("baseline", n), &n, |b, &n| {
            b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(baseline_teardown(n))).sum());
        });
        group.bench_with_input(BenchmarkId::new("runtime", n), &n, |b, &n| {
            b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(runtime_teardown(n))).sum());
        });
    }
    group.finish();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Baseline and runtime runs alternate, so drift hits both alike.
fn interleaved() {
    let rt = tokio_runtime();
    println!("\nteardown, interleaved (median of rounds):");
    for (n, rounds) in [(1_000, 21), (10_000, 9), (100_000, 1)] {
        // One warm-up of each.
        rt.block_on(baseline_teardown(n));
        rt.block_on(runtime_teardown(n));
        let (mut base, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            base.push(rt.block_on(baseline_teardown(n)));
            ours.push(rt.block_on(runtime_teardown(n)));
        }
        let (b, r) = (median(base), median(ours));
        println!(
            "  {n:>7} agents: baseline {b:>12.3?}  runtime {r:>12.3?}  ratio {:.2}x  ({rounds} rounds)",
            r.as_secs_f64() / b.as_secs_f64()
        );
    }
}

fn main() {
    // `TEARDOWN_PROFILE=N`: only the runtime's teardown of N agents, a few
    // times, for a profiler.
    if let Some(n) = std::env::var("TEARDOWN_PROFILE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let rt = tokio_runtime();
        for _ in 0..3 {
            println!("{n} agents: {:?}", rt.block_on(runtime_teardown(n)));
        }
        return;
    }
    let mut criterion = Criterion::default().configure_from_args();
    teardown(&mut criterion);
    criterion.final_summary();
    if !std::env::args().any(|a| a == "--test" || a == "--list") {
        interleaved();
    }
}
