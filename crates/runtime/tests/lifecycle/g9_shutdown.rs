//! Seed 004: shutdown with idle and running sessions; a process killed
//! mid-turn and recovered.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use settle_runtime::{
    EndReason, Kernel, LifecycleEvent, Outcome, RuntimeError, State, TurnRequest,
};
use settle_store::{MemoryStore, RecoverOptions, SessionStore, Store};
use settle_stream::{ScriptedEnd, ScriptedProvider, TurnScript};

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

/// One idle session, one whose turn finishes within the drain.
#[tokio::test(start_paused = true)]
async fn g9_shutdown_finalizes_idle_at_once_and_lets_a_running_turn_finish() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let mut events = runtime.subscribe();
    let idle = runtime.register("idle", None).await.unwrap();
    let running = runtime.register("running", None).await.unwrap();
    let p = provider([complete(&["one ", "two ", "three"], 100 * MS)]);
    let mut turn = start(&running, &p).await;
    read_chunks(&mut turn, 1).await;

    let report = runtime.shutdown(Duration::from_secs(5)).await;

    // The idle one went first, before the running turn ended.
    let seen = drain(&mut events);
    let idle_done = seen
        .iter()
        .position(
            |e| matches!(e, LifecycleEvent::Finalized { session, .. } if *session == idle.id()),
        )
        .unwrap();
    let turn_done = seen
        .iter()
        .position(
            |e| matches!(e, LifecycleEvent::WorkEnded { session, .. } if *session == running.id()),
        )
        .unwrap();
    assert!(idle_done < turn_done, "{seen:?}");
    assert_eq!(
        report.finalized,
        vec![
            (idle.id(), EndReason::Shutdown),
            (running.id(), EndReason::Shutdown)
        ]
    );
    assert_eq!(report.drained, vec![running.id()]);
    assert!(report.cancelled.is_empty() && report.detached.is_empty());
    assert!(report.left_recoverable.is_empty());
    assert_eq!(report.store_failures, 0);
    assert!(report.flushed_in_budget);

    // Its full transcript, and memory from its completed turn.
    let d = detail(&store, running.id()).await;
    assert_eq!(
        d.turns[0]
            .chunks
            .iter()
            .map(|c| c.text.as_str())
            .collect::<Vec<_>>(),
        vec!["one ", "two ", "three"]
    );
    assert_eq!(d.turns[0].outcome, Some(Outcome::Completed));
    let memory = store.memories(running.id()).await.unwrap();
    assert_eq!(memory.len(), 1);
    assert_eq!(memory[0].content, "one two three");
    assert_eq!(
        detail(&store, idle.id()).await.session.end_reason,
        Some(EndReason::Shutdown)
    );
}

/// The drain is too short for the running turn: it is cancelled, settles,
/// and is finalized with its partial transcript and no memory.
#[tokio::test(start_paused = true)]
async fn g9_a_turn_outliving_the_drain_is_cancelled_settled_and_finalized_without_memory() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let idle = runtime.register("idle", None).await.unwrap();
    let running = runtime.register("running", None).await.unwrap();
    // A completed first turn, then one that the drain cuts short.
    let p = provider([
        complete(&["whole"], 10 * MS),
        TurnScript::new(numbered("c", 50)).chunk_delay(100 * MS),
    ]);
    assert_eq!(
        start(&running, &p).await.outcome().await,
        Outcome::Completed
    );
    let mut turn = start(&running, &p).await;
    read_chunks(&mut turn, 2).await;

    let report = runtime.shutdown(Duration::from_millis(300)).await;
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    assert_eq!(report.cancelled, vec![running.id()]);
    assert!(report.drained.is_empty() && report.detached.is_empty());
    assert_eq!(
        report.finalized,
        vec![
            (idle.id(), EndReason::Shutdown),
            (running.id(), EndReason::Shutdown)
        ]
    );
    let d = detail(&store, running.id()).await;
    assert_eq!(d.session.outcome, Some(Outcome::Cancelled));
    assert_eq!(d.turns[1].outcome, Some(Outcome::Cancelled));
    let partial = d.turns[1].chunks.len();
    assert!((2..50).contains(&partial), "{partial} chunks");
    // G7: memory never comes from a truncated transcript, so the session's
    // last turn being cut short commits none at all.
    assert!(store.memories(running.id()).await.unwrap().is_empty());
    assert_eq!(p.stats().opened, p.stats().close_started);
    assert_eq!(report.store_failures, 0);
}

/// After `shutdown` returns every waiter has its answer, every work task is
/// gone, and every later call fails with a typed error.
#[tokio::test(start_paused = true)]
async fn g9_after_shutdown_nothing_hangs_and_no_work_is_left() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b.settle_timeout(Duration::from_millis(200))).await;
    let ignoring = runtime.register("ignoring", None).await.unwrap();
    let hanging = runtime.register("hanging", None).await.unwrap();
    let idle = runtime.register("idle", None).await.unwrap();
    let p1 = provider([TurnScript::new(numbered("c", 100))
        .chunk_delay(100 * MS)
        .end(ScriptedEnd::IgnoreCancel)]);
    let p2 = provider([hang(&["h"], 10 * MS)]);
    let mut t1 = start(&ignoring, &p1).await;
    let mut t2 = start(&hanging, &p2).await;
    read_chunks(&mut t1, 1).await;
    read_chunks(&mut t2, 1).await;
    let waiters: Vec<_> = [&ignoring, &hanging, &idle]
        .into_iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move { s.finalized().await })
        })
        .collect();
    let other = runtime.clone();
    let second_shutdown = tokio::spawn(async move { other.shutdown(Duration::ZERO).await });

    let report = runtime.shutdown(Duration::from_millis(100)).await;
    assert_eq!(report.finalized.len(), 3);
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap(), EndReason::Shutdown);
    }
    // A second, concurrent shutdown returns too, once everything is done.
    second_shutdown.await.unwrap();
    assert_eq!(
        store
            .list_sessions(settle_store::SessionFilter::all().in_state(State::Finalized))
            .await
            .unwrap()
            .len(),
        3
    );
    // Readers of a turn's chunks see its end.
    while t2.next_chunk().await.is_some() {}
    while t1.next_chunk().await.is_some() {}
    assert_eq!(t1.outcome().await, Outcome::Detached);
    assert_eq!(t2.outcome().await, Outcome::Cancelled);

    // Every work task is gone: none holds its provider any more.
    settle_tasks().await;
    assert_eq!(Arc::strong_count(&p1), 1);
    assert_eq!(Arc::strong_count(&p2), 1);

    // Later calls fail loudly, they do not hang.
    assert!(runtime.register("late", None).await.is_err());
    // Asking for the end is not a write: the handle knows it.
    assert_eq!(idle.finalized().await.unwrap(), EndReason::Shutdown);
    assert!(idle
        .run_turn(p2.clone(), TurnRequest::prompt("x"))
        .await
        .is_err());
    // A shutdown asked for after the end gets the same report.
    assert_eq!(runtime.shutdown(Duration::ZERO).await, report);
}

const CHILD_DB: &str = "SETTLE_RUNTIME_TEST_KILLED_CHILD_DB";

/// G7/G8: a process killed mid-turn leaves its session unfinalized, with
/// every chunk it acknowledged; a later `recover` finalizes it `recovered`.
///
/// The test binary re-executes itself with `CHILD_DB` set: the child runs a
/// runtime on that SQLite file and prints each chunk once it is persisted;
/// the parent SIGKILLs it mid-turn, then recovers.
#[test]
fn g8_a_process_killed_mid_turn_is_recovered_with_its_transcript() {
    if let Ok(path) = std::env::var(CHILD_DB) {
        return killed_child(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("settle.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "g8_a_process_killed_mid_turn_is_recovered_with_its_transcript",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut session = None;
    let mut acknowledged = Vec::new();
    while acknowledged.len() < 5 {
        let line = lines.next().expect("the child printed its chunks").unwrap();
        // The harness may print its own words ahead of ours on a line.
        if let Some((_, id)) = line.split_once("SESSION ") {
            session = Some(id.parse::<u64>().unwrap());
        } else if let Some((_, chunk)) = line.split_once("CHUNK ") {
            acknowledged.push(chunk.to_owned());
        }
    }
    child.kill().unwrap(); // SIGKILL: no shutdown, no drop, nothing flushed
    child.wait().unwrap();
    let id = settle_runtime::SessionId(session.expect("the child named its session"));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Store::open(path.to_str().unwrap()).unwrap();
        let left = store.session_detail(id).await.unwrap();
        assert_eq!(left.session.state, State::Running, "left live by the crash");
        assert_eq!(left.session.finalized_at, None);

        let report = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        assert_eq!(report.recovered, vec![id]);
        assert_eq!(report.interrupted_turns, vec![(id, 1)]);
        let d = store.session_detail(id).await.unwrap();
        assert_eq!(d.session.end_reason, Some(EndReason::Recovered));
        assert_eq!(d.turns[0].outcome, Some(Outcome::Interrupted));
        // Every chunk the child saw acknowledged survived the kill (G7), in order.
        let kept: Vec<String> = d.turns[0].chunks.iter().map(|c| c.text.clone()).collect();
        assert!(
            kept.len() >= acknowledged.len(),
            "{kept:?} vs {acknowledged:?}"
        );
        assert_eq!(kept[..acknowledged.len()], acknowledged[..]);
        assert!(store.memories(id).await.unwrap().is_empty());
        // Recovery is idempotent.
        let again = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        assert!(again.recovered.is_empty());
    });
}

/// The child's side: stream chunks forever, announcing each persisted one.
fn killed_child(path: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Store::open(path).unwrap();
        let runtime = Kernel::builder(Arc::new(store)).start().await.unwrap();
        let session = runtime.register("doomed", None).await.unwrap();
        let mut out = std::io::stdout().lock();
        writeln!(out, "SESSION {}", session.id()).unwrap();
        let p = Arc::new(ScriptedProvider::new([TurnScript::new(numbered(
            "chunk", 10_000,
        ))
        .chunk_delay(20 * MS)
        .end(ScriptedEnd::Hang)]));
        let mut turn = session
            .run_turn(p, TurnRequest::prompt("go"))
            .await
            .unwrap();
        while let Some(chunk) = turn.next_chunk().await {
            writeln!(out, "CHUNK {}", chunk.payload()).unwrap();
            out.flush().unwrap();
        }
    });
}

/// G9: a kernel that shut down lets go of its store: the program that
/// opens a kernel per job does not keep every store (its connection pool
/// and its threads) it ever used.
#[tokio::test]
async fn g9_a_kernel_shut_down_and_dropped_lets_go_of_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.db");
    let store: Arc<dyn settle_store::SessionStore> =
        Arc::new(settle_store::Store::open(path.to_str().unwrap()).unwrap());
    let kernel = Kernel::builder(store.clone()).start().await.unwrap();
    let session = kernel.register("job", None).await.unwrap();
    kernel.shutdown(Duration::from_millis(100)).await;
    drop(session);
    drop(kernel);
    // The driver's and the recorder's tasks end once it is shut down.
    for _ in 0..200 {
        if Arc::strong_count(&store) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{} references to the store are left after the shutdown",
        Arc::strong_count(&store) - 1
    );
}

/// A kernel whose tokio runtime was dropped without a shutdown has stopped:
/// its handles say so at once (not after the store timeout, waiting for a
/// stop nobody will announce), and a shutdown asked for after it says it
/// found the kernel stopped, not that it finalized nothing cleanly (G9).
#[test]
fn g9_a_kernel_whose_runtime_was_dropped_says_it_stopped_at_once() {
    let store = MemoryStore::new();
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (kernel, session) = first.block_on(async {
        let kernel = Kernel::builder(Arc::new(store.clone()))
            .idle_timeout(None)
            .store_timeout(Duration::from_secs(10))
            .start()
            .await
            .unwrap();
        let session = kernel.register("left", None).await.unwrap();
        (kernel, session)
    });
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    second.block_on(async {
        let asked = tokio::time::Instant::now();
        let state = session.state().await;
        assert!(matches!(state, Err(RuntimeError::Stopped)), "{state:?}");
        let finished = session.finish().await;
        assert!(
            matches!(finished, Err(RuntimeError::Stopped)),
            "{finished:?}"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "the handles waited {:?} to say the kernel stopped",
            asked.elapsed()
        );
        let report = kernel.shutdown(Duration::ZERO).await;
        assert!(report.stopped_without_shutdown, "{report:?}");
        assert!(!report.flushed_in_budget, "{report:?}");
    });
}
