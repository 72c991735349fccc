//! The teardown row: cancel the root of an N-agent tree in which every
//! session is mid-turn on an open stream, and time until every session is
//! finalized; against a bare tokio-util `CancellationToken` tree and a
//! `TaskTracker` cancelling and joining the same N tasks.
//!
//! Ours: a [`Kernel`] over the [`NullStore`], no idle timeout, idle reap or
//! LRU cap; every session (root included) runs one `ScriptedEnd::Hang` turn,
//! so each holds a provider stream that never ends on its own. Timed from the
//! root's `cancel` until the finalize plan of every session has reached the
//! store (the root's, by G1, last).
//!
//! Baseline: the same tree of tokens, one task per agent holding the same kind
//! of scripted stream, `select!`ing on its token and the stream, and closing
//! the stream when cancelled. Timed from the root token's `cancel` to
//! `TaskTracker::wait`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use futures_util::StreamExt;
use settle_runtime::{CancelMode, Kernel, TurnRequest};
use settle_stream::{Close, Provider, ScriptedEnd, ScriptedProvider, TurnScript};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::null_store::NullStore;
use crate::Result;

/// The shape of the agent tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One root with N − 1 children.
    Flat,
    /// A chain N deep: each agent the only child of the one before.
    Chain,
}

impl Shape {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Flat => "flat",
            Shape::Chain => "chain",
        }
    }
}

/// How long set-up may take before a round is given up.
const SETUP_LIMIT: Duration = Duration::from_secs(120);
/// A pause after set-up, so that the timed part starts from a quiet runtime.
pub(crate) const SETTLE_PAUSE: Duration = Duration::from_millis(20);

/// A provider of `n` turns that each hang until closed.
pub(crate) fn hanging(n: usize) -> ScriptedProvider {
    ScriptedProvider::new((0..n).map(|_| TurnScript::default().end(ScriptedEnd::Hang)))
}

/// Waits (set-up, untimed) until `done`, then a short pause.
pub(crate) async fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > SETUP_LIMIT {
            return Err(format!("teardown set-up: gave up waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(SETTLE_PAUSE).await;
    Ok(())
}

/// With `SETTLE_BENCH_PERF_CTL` naming the control FIFO of a
/// `perf record --delay=-1 --control=fifo:PATH` session, profiles only the
/// timed teardown of ours (see BENCHMARKS.md).
pub(crate) fn perf_control(command: &str) {
    if let Some(path) = std::env::var_os("SETTLE_BENCH_PERF_CTL") {
        if let Err(e) = std::fs::write(&path, format!("{command}\n")) {
            eprintln!("settle-bench: perf control {}: {e}", path.to_string_lossy());
        }
    }
}

/// Where the time of one teardown of ours went: offsets from the cancel.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// The driver handled the cancel (the core cancelled the whole subtree).
    pub cancel_handled: Duration,
    /// The recorder ended the first turn in the store.
    pub first_turn_ended: Duration,
    /// The recorder ended the last turn in the store.
    pub last_turn_ended: Duration,
    /// The recorder ran the first finalize plan.
    pub first_finalized: Duration,
    /// `finalized()` of the root answered (at the core's finalize, or after
    /// the recorder ran its plan if the wait reached the driver first).
    pub root_finalized_in_core: Duration,
    /// The last finalize plan reached the store: the figure timed.
    pub all_finalized: Duration,
}

/// One round of ours: build the tree, open every turn, then time the teardown.
pub async fn ours(shape: Shape, n: usize) -> Result<Phases> {
    let store = Arc::new(NullStore::expecting(n));
    let runtime = Kernel::builder(store.clone())
        .idle_timeout(None)
        .idle_ttl(None)
        .lru_cap(None)
        .start()
        .await?;
    let provider = Arc::new(hanging(n));
    let root = runtime.register("root", None).await?;
    let mut sessions = Vec::with_capacity(n);
    sessions.push(root.clone());
    match shape {
        Shape::Flat => {
            let children = (1..n).map(|i| runtime.register(format!("agent-{i}"), Some(root.id())));
            sessions.extend(try_join_all(children).await?);
        }
        Shape::Chain => {
            for i in 1..n {
                let parent = sessions[i - 1].id();
                sessions.push(runtime.register(format!("agent-{i}"), Some(parent)).await?);
            }
        }
    }
    let dyn_provider: Arc<dyn Provider> = provider.clone();
    let turns = try_join_all(
        sessions
            .iter()
            .map(|s| s.run_turn(dyn_provider.clone(), TurnRequest::prompt("go"))),
    )
    .await?;
    wait_until("every stream to open", || provider.stats().opened == n).await?;
    // A stream closed before the cancel would be teardown done untimed.
    if provider.stats().close_finished != 0 {
        return Err("a stream closed before the timed cancel".into());
    }

    perf_control("enable");
    let start = Instant::now();
    let _ = root.cancel(CancelMode::Immediate).await?;
    let cancel_handled = start.elapsed();
    // Not `root.finalized()` alone: it answers as soon as the core has
    // finalized the root, which can be before the recorder ran the finalize
    // plans of the last sessions.
    root.finalized().await?;
    let root_finalized_in_core = start.elapsed();
    store.all_finalized().await;
    let took = start.elapsed();
    perf_control("disable");

    let (finalized, closed) = (store.finalized(), provider.stats().close_finished);
    if finalized != n || closed != n {
        return Err(format!(
            "teardown {} {n}: {finalized} sessions finalized and {closed} streams closed, expected {n} of each",
            shape.name()
        )
        .into());
    }
    drop(turns);
    drop(sessions);
    let _ = runtime.shutdown(Duration::ZERO).await;
    let [first_turn_ended, last_turn_ended, first_finalized] = store.marks(start);
    Ok(Phases {
        cancel_handled,
        first_turn_ended,
        last_turn_ended,
        first_finalized,
        root_finalized_in_core,
        all_finalized: took,
    })
}

/// One round of the baseline: the same tree of tokens and tasks.
pub async fn baseline(shape: Shape, n: usize) -> Result<Duration> {
    let provider = hanging(n);
    let tracker = TaskTracker::new();
    let root = CancellationToken::new();
    let started = Arc::new(AtomicUsize::new(0));
    let mut parent = root.clone();
    for i in 0..n {
        let token = match (i, shape) {
            (0, _) => root.clone(),
            (_, Shape::Flat) => root.child_token(),
            (_, Shape::Chain) => parent.child_token(),
        };
        if shape == Shape::Chain {
            parent = token.clone();
        }
        let mut stream = provider.open_next()?;
        let started = started.clone();
        tracker.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                biased;
                () = token.cancelled() => {}
                _ = stream.next() => {}
            }
            let _ = stream.close_now();
        });
    }
    drop(parent);
    wait_until("every task to start", || {
        started.load(Ordering::Relaxed) == n
    })
    .await?;

    let start = Instant::now();
    root.cancel();
    tracker.close();
    tracker.wait().await;
    let took = start.elapsed();

    let closed = provider.stats().close_finished;
    if closed != n {
        return Err(format!(
            "baseline {} {n}: {closed} streams closed, expected {n}",
            shape.name()
        )
        .into());
    }
    Ok(took)
}
