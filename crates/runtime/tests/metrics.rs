//! The runtime's metrics move: a recorder installed for this test binary
//! (its own process, so the global recorder is its own) sees sessions
//! registered and finalized, sessions by state, turns by outcome, a detach,
//! settle times, chunk acknowledgement latency, store batch sizes and lease
//! renewals, under the names `settle_runtime::meter` documents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use settle_runtime::{meter, EndReason, Kernel, Outcome, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{ScriptedEnd, ScriptedProvider, TurnScript};

/// Each metric's value by name and labels (`name{k=v,...}`), added to what
/// `seen` had: the recorder hands each change over once (a snapshot
/// starts the next from zero).
fn snapshot(
    snapshotter: &metrics_util::debugging::Snapshotter,
    seen: &mut HashMap<String, DebugValue>,
) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let merged = match (seen.remove(&name), value) {
            (Some(DebugValue::Counter(a)), DebugValue::Counter(b)) => DebugValue::Counter(a + b),
            (Some(DebugValue::Gauge(a)), DebugValue::Gauge(b)) => DebugValue::Gauge(a + b),
            (Some(DebugValue::Histogram(mut a)), DebugValue::Histogram(b)) => {
                a.extend(b);
                DebugValue::Histogram(a)
            }
            (_, value) => value,
        };
        seen.insert(name, merged);
    }
}

fn counter(seen: &HashMap<String, DebugValue>, key: &str) -> u64 {
    match seen.get(key) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{key}: {other:?} in {:?}", seen.keys().collect::<Vec<_>>()),
    }
}

fn gauge(seen: &HashMap<String, DebugValue>, key: &str) -> f64 {
    match seen.get(key) {
        Some(DebugValue::Gauge(n)) => n.into_inner(),
        other => panic!("{key}: {other:?}"),
    }
}

fn samples(seen: &HashMap<String, DebugValue>, key: &str) -> usize {
    match seen.get(key) {
        Some(DebugValue::Histogram(values)) => values.len(),
        other => panic!("{key}: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_lifecycle_moves_the_documented_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
        .idle_timeout(None)
        .settle_timeout(Duration::from_millis(500))
        .lease_ttl(Duration::from_secs(3))
        .start()
        .await
        .unwrap();
    let root = kernel.register("root", None).await.unwrap();
    let child = root.child("child").await.unwrap();
    let provider = Arc::new(ScriptedProvider::new([
        TurnScript::new(["a", "b", "c"]),
        TurnScript::new(["x", "y", "z"])
            .chunk_delay(Duration::from_secs(10))
            .end(ScriptedEnd::IgnoreCancel),
    ]));
    let turn = child
        .run_turn(provider.clone(), TurnRequest::prompt("one"))
        .await
        .unwrap();
    assert_eq!(turn.outcome().await, Outcome::Completed);

    let mut seen = HashMap::new();
    snapshot(&snapshotter, &mut seen);
    let running = &seen;
    assert_eq!(
        counter(running, &format!("{}{{}}", meter::SESSIONS_REGISTERED)),
        2
    );
    assert_eq!(gauge(running, "settle_sessions{state=registered}"), 2.0);
    assert_eq!(gauge(running, "settle_sessions{state=running}"), 0.0);
    assert_eq!(samples(running, "settle_chunk_ack_seconds{}"), 3);

    // A turn that ignores its cancel is detached at the settle deadline.
    let mut stuck = child
        .run_turn(provider, TurnRequest::prompt("two"))
        .await
        .unwrap();
    assert!(stuck.next_chunk().await.is_some());
    tokio::time::sleep(Duration::from_secs(2)).await; // two lease renewals
    assert_eq!(root.finish().await.unwrap(), EndReason::Completed);
    assert_eq!(stuck.outcome().await, Outcome::Detached);
    kernel.shutdown(Duration::from_secs(1)).await;

    snapshot(&snapshotter, &mut seen);
    let done = &seen;
    assert_eq!(
        counter(
            done,
            "settle_sessions_finalized_total{end_reason=completed}"
        ),
        1
    );
    assert_eq!(
        counter(
            done,
            "settle_sessions_finalized_total{end_reason=parent_finished}"
        ),
        1
    );
    assert_eq!(
        counter(done, "settle_works_total{kind=turn,outcome=completed}"),
        1
    );
    assert_eq!(
        counter(done, "settle_works_total{kind=turn,outcome=detached}"),
        1
    );
    assert_eq!(counter(done, "settle_works_detached_total{}"), 1);
    assert_eq!(samples(done, "settle_settle_seconds{}"), 1);
    assert!(samples(done, "settle_store_batch_writes{}") >= 1);
    assert!(counter(done, "settle_lease_renewals_total{result=ok}") >= 1);
    // Every session left the gauges as it was finalized.
    for state in ["registered", "running", "cancelling", "settled"] {
        assert_eq!(
            gauge(done, &format!("settle_sessions{{state={state}}}")),
            0.0
        );
    }

    // A session handed off to another process leaves them too (SPEC §12):
    // it is open, but no longer this process's. (On the real clock: the
    // store is a file.)
    tokio::time::resume();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store = settle_store::Store::open(path.to_str().unwrap()).unwrap();
    let kernel = Kernel::builder(Arc::new(store))
        .idle_timeout(None)
        .start()
        .await
        .unwrap();
    kernel.register("leaving", None).await.unwrap();
    let report = kernel.handoff(Duration::from_secs(1)).await;
    assert_eq!(report.released.len(), 1, "{report:?}");
    snapshot(&snapshotter, &mut seen);
    assert_eq!(gauge(&seen, "settle_sessions{state=registered}"), 0.0);
}
