//! What a framework embedding the kernel relies on: any work under the
//! lifecycle (tasks, child processes), RAII guards, turns as streams.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use settle_runtime::{
    process, CancelMode, Chunk, EndReason, LifecycleEvent, Outcome, State, TaskError, TurnRequest,
};
use settle_store::MemoryStore;

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

/// A task that ignores its cancel is detached at the settle deadline, like a
/// turn (G5): its late result is refused, and it sees its write access gone.
// On the real clock: a blocking part stops tokio's paused clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_a_spawned_task_ignoring_its_cancel_is_detached_and_its_writes_refused() {
    let store = MemoryStore::new();
    let settle = 100 * MS;
    let kernel = runtime_on(&store, |b| b.settle_timeout(settle)).await;
    let session = kernel.register("agent", None).await.unwrap();
    let revoked_seen = Arc::new(AtomicBool::new(false));
    let task = {
        let revoked_seen = revoked_seen.clone();
        session
            .spawn(move |ctx| async move {
                // A tool that never looks at its token, but whose blocking
                // part checks its write access before writing.
                let check = ctx.clone();
                let blocking = tokio::task::spawn_blocking(move || {
                    std::thread::sleep(Duration::from_secs(1));
                    if check.check_write() == Err(TaskError::Detached) {
                        revoked_seen.store(true, Ordering::SeqCst);
                    }
                });
                let _ = blocking.await;
                "too late"
            })
            .await
            .unwrap()
    };
    applied(session.cancel(CancelMode::Immediate).await);
    // Detached at the settle deadline, long before its blocking part ends:
    // its result is refused.
    assert_eq!(task.join().await, Err(TaskError::Detached));
    assert!(!revoked_seen.load(Ordering::SeqCst));
    // The blocking part outlived the detach and found its writes refused.
    for _ in 0..300 {
        if revoked_seen.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(revoked_seen.load(Ordering::SeqCst));
    assert_eq!(session.finalized().await.unwrap(), EndReason::Cancelled);
    kernel.shutdown(Duration::ZERO).await;
}

/// A task that ends on its own gives its result; one that panics says why;
/// a session is not finalized while its task runs (G1).
#[tokio::test(start_paused = true)]
async fn g1_a_session_waits_for_its_tasks_and_a_panicking_task_says_why() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let slow = session
        .spawn(|ctx| async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => 42,
                () = ctx.cancelled() => 0,
            }
        })
        .await
        .unwrap();
    let broken = session
        .spawn(|_| async move {
            tokio::time::sleep(10 * MS).await;
            panic!("the tool broke");
        })
        .await
        .unwrap();
    assert_eq!(
        broken.join().await,
        Err(TaskError::Panicked("the tool broke".into()))
    );
    let finishing = {
        let session = session.clone();
        tokio::spawn(async move { session.finish().await })
    };
    // Finishing cancels the task; it unwinds at once with its own answer.
    assert_eq!(slow.join().await, Ok(0));
    assert_eq!(finishing.await.unwrap().unwrap(), EndReason::Completed);
    kernel.shutdown(Duration::ZERO).await;
}

/// A task whose closure panics before it returns its future ends as one
/// whose future panicked: its caller hears why, and its session goes back
/// to idle (G5: nothing waits on a work that can no longer report).
#[tokio::test(start_paused = true)]
async fn g5_a_task_whose_closure_panics_before_its_future_ends_panicked() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let broken = session
        .spawn(|_| -> std::future::Ready<u32> { panic!("no tool to build") })
        .await
        .unwrap();
    let joined = tokio::time::timeout(Duration::from_secs(1), broken.join()).await;
    assert_eq!(
        joined,
        Ok(Err(TaskError::Panicked("no tool to build".into())))
    );
    assert_eq!(session.state().await.unwrap(), State::Registered);
    assert_eq!(session.finish().await.unwrap(), EndReason::Completed);
    kernel.shutdown(Duration::ZERO).await;
}

/// A guard dropped by a panic in the agent's code cancels its session, whose
/// subtree is wound down children first (G1).
#[tokio::test(start_paused = true)]
async fn g1_a_guard_dropped_by_a_panic_winds_its_subtree_down_children_first() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let mut events = kernel.subscribe();
    let p = provider([hang(&["working"], 10 * MS)]);
    let agent = {
        let (kernel, p) = (kernel.clone(), p.clone());
        tokio::spawn(async move {
            let root = kernel.register("root", None).await.unwrap().guard();
            let child = kernel
                .register("child", Some(root.id()))
                .await
                .unwrap()
                .guard();
            let mut turn = start(&child, &p).await;
            read_chunks(&mut turn, 1).await;
            let ids = (root.id(), child.id());
            if ids.0 .0 > 0 {
                panic!("the agent's code failed");
            }
            ids
        })
    };
    assert!(agent.await.unwrap_err().is_panic());
    let seen = wait_finalized(&mut events, 2).await;
    let order = finalized(&seen);
    assert_eq!(order.len(), 2, "{order:?}");
    let (child, root) = (order[0], order[1]);
    assert_eq!(child.1, EndReason::Cancelled);
    assert_eq!(root.1, EndReason::Cancelled);
    assert!(seen.iter().any(|e| matches!(
        e,
        LifecycleEvent::WorkEnded { session, outcome: Outcome::Cancelled, .. } if *session == child.0
    )));
    assert_eq!(p.stats().close_started, 1);
    kernel.shutdown(Duration::ZERO).await;
}

/// A `Turn` is a `Stream`; dropping it before its end cancels the turn and
/// closes its provider stream (G4).
#[tokio::test(start_paused = true)]
async fn g4_a_turn_dropped_mid_stream_closes_its_provider_stream() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let p = provider([
        hang(&["one", "two"], 10 * MS),
        complete(&["a", "b"], 10 * MS),
    ]);
    let turn = session
        .run_turn(p.clone(), TurnRequest::prompt("go"))
        .await
        .unwrap();
    let first: Vec<String> = turn.take(1).map(Chunk::into_payload).collect().await;
    assert_eq!(first, vec!["one".to_owned()]);
    settle_tasks().await;
    tokio::time::sleep(50 * MS).await;
    assert_eq!(p.stats().close_started, 1, "{:?}", p.stats());
    // The session goes on: the next turn streams to its end.
    let turn = start(&session, &p).await;
    let all: Vec<String> = turn.map(Chunk::into_payload).collect().await;
    assert_eq!(all, vec!["a".to_owned(), "b".to_owned()]);
    let d = detail(&store, session.id()).await;
    assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled));
    assert_eq!(d.turns[1].outcome, Some(Outcome::Completed));
    kernel.shutdown(Duration::ZERO).await;
}

/// A wait for a turn's end given up on (a timeout, an aborted task) is a
/// consumer gone before the stream ended: the turn is cancelled and its
/// provider stream closed, whichever of `outcome`, `result`, `end` or
/// `reply` was waiting (G4).
#[tokio::test(start_paused = true)]
async fn g4_a_wait_for_a_turns_end_given_up_cancels_the_turn() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let p = provider((0..4).map(|_| hang(&["one"], 10 * MS)));
    for (n, how) in ["outcome", "result", "end", "reply"]
        .into_iter()
        .enumerate()
    {
        let turn = start(&session, &p).await;
        let wait = async move {
            match how {
                "outcome" => drop(turn.outcome().await),
                "result" => drop(turn.result().await),
                "end" => drop(turn.end().await),
                _ => drop(turn.reply().await),
            }
        };
        let waited = tokio::time::timeout(100 * MS, wait).await;
        assert!(
            waited.is_err(),
            "{how}: the turn hangs, so the wait times out"
        );
        settle_tasks().await;
        tokio::time::sleep(50 * MS).await;
        assert_eq!(p.stats().close_started, n + 1, "{how}: {:?}", p.stats());
        assert_eq!(session.state().await.unwrap(), State::Registered, "{how}");
    }
    let d = detail(&store, session.id()).await;
    let outcomes: Vec<_> = d.turns.iter().map(|t| t.outcome).collect();
    assert_eq!(outcomes, vec![Some(Outcome::Cancelled); 4]);
    kernel.shutdown(Duration::ZERO).await;
}

/// The state of process `pid` as /proc tells it (`None` once it is gone).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
}

/// A child process that traps SIGTERM is killed with its whole process group
/// at the settle deadline, and reaped: no zombie is left (G5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_a_child_process_trapping_sigterm_is_killed_with_its_group_and_reaped() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b.settle_timeout(300 * MS)).await;
    let session = kernel.register("agent", None).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "trap '' TERM; sleep 300 & echo $$ $! > {}; wait",
        pids.display()
    );
    let task = session
        .spawn(move |ctx| async move {
            let mut sh = tokio::process::Command::new("sh");
            sh.arg("-c").arg(script);
            process::run(&ctx, sh).await
        })
        .await
        .unwrap();
    let read_pids = || -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(&pids).ok()?;
        let pids: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    };
    let mut found = None;
    for _ in 0..500 {
        found = read_pids();
        if found.is_some() {
            break;
        }
        tokio::time::sleep(10 * MS).await;
    }
    let pids = found.expect("the script started");
    assert!(pids.iter().all(|p| proc_state(*p).is_some()), "{pids:?}");

    applied(session.cancel(CancelMode::Immediate).await);
    assert!(matches!(task.join().await, Err(TaskError::Detached)));
    // Killed and reaped: the shell (our child) and its sleep (its child).
    let mut left = pids.clone();
    for _ in 0..500 {
        left.retain(|p| proc_state(*p).is_some());
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(10 * MS).await;
    }
    let states: Vec<_> = left.iter().map(|p| (p, proc_state(*p))).collect();
    assert!(left.is_empty(), "still there (Z is a zombie): {states:?}");
    assert_eq!(session.finalized().await.unwrap(), EndReason::Cancelled);
    kernel.shutdown(Duration::ZERO).await;
}

/// A tool that finishes: its output comes back, the process reaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_process_runs_to_its_end_and_gives_its_output() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let task = session
        .spawn(|ctx| async move {
            let mut echo = tokio::process::Command::new("sh");
            echo.arg("-c").arg("echo out; echo err >&2; exit 3");
            process::output(&ctx, echo).await
        })
        .await
        .unwrap();
    let output = task.join().await.unwrap().unwrap();
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.status.code(), Some(3));
    kernel.shutdown(Duration::ZERO).await;
}

/// Reads events until `n` sessions are finalized.
async fn wait_finalized(
    events: &mut tokio::sync::broadcast::Receiver<LifecycleEvent>,
    n: usize,
) -> Vec<LifecycleEvent> {
    let mut seen = Vec::new();
    while finalized(&seen).len() < n {
        seen.push(events.recv().await.unwrap());
    }
    seen
}

/// A finished session continues in a new one: its conversation comes back
/// as it was sent and answered, and the new row names the one it continues.
#[tokio::test(start_paused = true)]
async fn a_finished_session_is_resumed_with_its_conversation() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let chat = kernel.register("chat", None).await.unwrap();
    let p = provider([complete(&["Hello", ", you"], MS)]);
    let request = TurnRequest::new(vec![
        settle_stream::Message::new(settle_stream::Role::System, "be brief"),
        settle_stream::Message::new(settle_stream::Role::User, "hi"),
    ]);
    let turn = chat.run_turn(p, request).await.unwrap();
    assert_eq!(turn.outcome().await, Outcome::Completed);

    // Not finalized yet: it may still be live.
    let early = kernel.resume(chat.id(), "again").await;
    assert!(
        matches!(
            early,
            Err(settle_runtime::RuntimeError::NotResumable { .. })
        ),
        "{early:?}"
    );
    assert_eq!(chat.close().await.unwrap(), EndReason::UserClose);
    assert_eq!(kernel.last_finalized().await.unwrap(), Some(chat.id()));

    let resumed = kernel.resume(chat.id(), "again").await.unwrap();
    let roles: Vec<_> = resumed.history.iter().map(|m| m.role).collect();
    let contents: Vec<_> = resumed.history.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(
        roles,
        [
            settle_stream::Role::System,
            settle_stream::Role::User,
            settle_stream::Role::Assistant
        ]
    );
    assert_eq!(contents, ["be brief", "hi", "Hello, you"]);
    let row = detail(&store, resumed.session.id()).await;
    assert_eq!(row.session.resumed_from, Some(chat.id()));
    kernel.shutdown(Duration::ZERO).await;
}
