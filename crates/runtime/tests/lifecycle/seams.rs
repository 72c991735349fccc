//! Where users meet the kernel: handles racing their parents' finish, events
//! about tasks, a panicking task, the next turn after a dropped one, a guard
//! dropped during a shutdown, chunks of a cancelled turn, and signals after
//! the kernel stopped. Each test is the regression test of a reproduction
//! found from outside.

use std::sync::Arc;
use std::time::Duration;

use settle_runtime::{
    EndReason, Kernel, LifecycleEvent, Outcome, RuntimeError, SessionHandle, SessionId, State,
    TaskError, TurnRequest, WorkKind,
};
use settle_store::{MemoryStore, Store};
use settle_stream::ScriptedProvider;

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

/// Whether `error` is the "not known" a registered handle must never hear.
fn not_known(error: &RuntimeError) -> bool {
    matches!(
        error,
        RuntimeError::Lifecycle(settle_core::Error::UnknownSession(_))
    )
}

/// One round of the race: the root finishes while its child's handle is
/// used in a loop; every answer is the child's state or `SessionClosed`,
/// never "not known". Returns how many answers it saw.
async fn race_round(kernel: &Kernel, round: usize) -> usize {
    let root = kernel
        .register(format!("root-{round}"), None)
        .await
        .unwrap();
    let child = kernel
        .register(format!("child-{round}"), Some(root.id()))
        .await
        .unwrap();
    let finishing = tokio::spawn({
        let root = root.clone();
        async move { root.finish().await }
    });
    let provider = Arc::new(ScriptedProvider::new([]));
    let mut answers = 0;
    loop {
        answers += 1;
        let which = answers % 3;
        let closed = match which {
            0 => match child.state().await {
                Ok(state) => state == State::Finalized,
                Err(error) => panic!("round {round}: state() answered {error}"),
            },
            1 => match child
                .run_turn(provider.clone(), TurnRequest::prompt("x"))
                .await
            {
                // The turn got in before the cancel: let it be cancelled.
                Ok(turn) => {
                    drop(turn);
                    false
                }
                Err(error) => {
                    assert!(!not_known(&error), "round {round}: run_turn: {error}");
                    error.is_session_closed()
                }
            },
            _ => match child.spawn(|_| async {}).await {
                Ok(_) => false,
                Err(error) => {
                    assert!(!not_known(&error), "round {round}: spawn: {error}");
                    error.is_session_closed()
                }
            },
        };
        if closed {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Once closed, every handle method answers closed, never "not known".
    match child.finish().await {
        Err(error) => assert!(error.is_session_closed(), "round {round}: {error}"),
        Ok(reason) => panic!("round {round}: a closed child finished again: {reason}"),
    }
    assert_eq!(child.state().await.unwrap(), State::Finalized);
    assert_eq!(finishing.await.unwrap().unwrap(), EndReason::Completed);
    assert_eq!(child.finalized().await.unwrap(), EndReason::ParentFinished);
    answers
}

async fn race_rounds(kernel: Kernel, rounds: usize) {
    let mut answers = 0;
    for round in 0..rounds {
        answers += race_round(&kernel, round).await;
    }
    assert!(answers >= rounds, "each round asked at least once");
    let report = kernel.shutdown(Duration::ZERO).await;
    assert_eq!(report.store_failures, 0);
}

/// A kernel on a memory store whose sessions no idle timeout reclaims.
async fn in_memory_without_idle_reclaim() -> Kernel {
    Kernel::builder(Arc::new(MemoryStore::new()))
        .idle_timeout(None)
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g10_a_handle_whose_parent_just_finished_never_answers_not_known_memory() {
    let kernel = in_memory_without_idle_reclaim().await;
    race_rounds(kernel, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g10_a_handle_whose_parent_just_finished_never_answers_not_known_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let kernel = Kernel::builder(Arc::new(store))
        .idle_timeout(None)
        .start()
        .await
        .unwrap();
    race_rounds(kernel, 300).await;
}

#[tokio::test(start_paused = true)]
async fn events_about_work_say_which_work_a_task_end_is_no_turn_end() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let mut events = session.subscribe();
    let task = session.spawn(|_| async { 7 }).await.unwrap();
    assert_eq!(task.join().await.unwrap(), 7);
    let p = provider([complete(&["hi"], 5 * MS)]);
    let _ = start(&session, &p).await.outcome().await;
    settle_tasks().await;
    let ends: Vec<(WorkKind, u32)> = drain(&mut events)
        .into_iter()
        .filter_map(|e| match e {
            LifecycleEvent::WorkEnded { work, .. } => Some((work.kind, work.no)),
            _ => None,
        })
        .collect();
    assert_eq!(ends, vec![(WorkKind::Task, 1), (WorkKind::Turn, 1)]);
    kernel.shutdown(Duration::ZERO).await;
}

/// Found from outside: a task whose result its caller already had was
/// cancelled by the finish the caller then asked for, and recorded
/// `cancelled` (running → cancelling → settled, "task ended: cancelled"),
/// in about 1 of 60 rounds: the result reached the handle before the
/// task's end reached the driver, and the end was labelled by the token
/// afterwards. G6: work that ended is not cancelled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_a_task_whose_result_was_taken_is_never_cancelled_by_what_follows() {
    let kernel = in_memory_without_idle_reclaim().await;
    let mut events = kernel.subscribe();
    for round in 0..400 {
        let session = kernel.register(format!("s-{round}"), None).await.unwrap();
        let task = session
            .spawn(|_| async {
                tokio::task::yield_now().await;
                "done"
            })
            .await
            .unwrap();
        assert_eq!(task.join().await.unwrap(), "done");
        assert_eq!(session.finish().await.unwrap(), EndReason::Completed);
    }
    kernel.shutdown(Duration::ZERO).await;
    let mut cancelled = Vec::new();
    for event in drain(&mut events) {
        match event {
            LifecycleEvent::WorkEnded {
                session, outcome, ..
            } if outcome != settle_runtime::Outcome::Completed => {
                cancelled.push((session, outcome));
            }
            LifecycleEvent::Transition {
                session,
                to: State::Cancelling,
                ..
            } => {
                cancelled.push((session, settle_runtime::Outcome::Cancelled));
            }
            _ => {}
        }
    }
    assert!(cancelled.is_empty(), "{cancelled:?}");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_task_says_it_panicked_once() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let task = session
        .spawn(|_| async {
            if true {
                panic!("parse_banner: no banner");
            }
        })
        .await
        .unwrap();
    let error = task.join().await.unwrap_err();
    assert_eq!(error, TaskError::Panicked("parse_banner: no banner".into()));
    assert_eq!(
        error.to_string(),
        "the task panicked: parse_banner: no banner"
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// A chat's "stop, then the next message": the `Turn` of the answer being
/// streamed is dropped (which cancels it) and the next turn started at
/// once. The start waits until the cancelled turn has ended, then starts;
/// it is not refused because the turn before is still unwinding.
#[tokio::test(start_paused = true)]
async fn g5_the_next_turn_after_a_dropped_one_waits_for_its_settle_and_starts() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("chat", None).await.unwrap();
    let p = provider([
        hang(&["a"], 5 * MS),
        // Its work unwinds slowly: closing its stream takes 300 ms.
        hang(&["b"], 5 * MS).close_delay(300 * MS),
        complete(&["c"], 5 * MS),
    ]);
    let mut turn = start(&session, &p).await;
    read_chunks(&mut turn, 1).await;
    drop(turn);
    let mut second = start(&session, &p).await;
    assert_eq!(read_chunks(&mut second, 1).await, ["b"]);
    drop(second);
    let asked = tokio::time::Instant::now();
    let third = start(&session, &p).await;
    let waited = asked.elapsed();
    assert!(waited >= 300 * MS && waited < 400 * MS, "{waited:?}");
    assert_eq!(third.outcome().await, settle_runtime::Outcome::Completed);
    let d = detail(&store, session.id()).await;
    let outcomes: Vec<_> = d.turns.iter().map(|t| t.outcome).collect();
    use settle_runtime::Outcome::{Cancelled, Completed};
    assert_eq!(
        outcomes,
        [Some(Cancelled), Some(Cancelled), Some(Completed)]
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// The wait for a cancelled turn's end is bounded by the settle timeout
/// (G5): a work that ignores its cancel is detached at the deadline, and
/// the next turn starts then.
#[tokio::test(start_paused = true)]
async fn g5_a_start_waiting_behind_a_work_that_ignores_its_cancel_starts_at_the_settle_deadline() {
    let store = MemoryStore::new();
    let settle = Duration::from_millis(500);
    let kernel = runtime_on(&store, |b| b.settle_timeout(settle)).await;
    let session = kernel.register("chat", None).await.unwrap();
    let p = provider([ignores_cancel(), complete(&["next"], 5 * MS)]);
    let mut turn = start(&session, &p).await;
    read_chunks(&mut turn, 1).await;
    drop(turn);
    let asked = tokio::time::Instant::now();
    let next = start(&session, &p).await;
    let waited = asked.elapsed();
    assert!(
        waited >= settle - 100 * MS && waited <= settle + 50 * MS,
        "{waited:?}"
    );
    assert_eq!(next.outcome().await, settle_runtime::Outcome::Completed);
    let d = detail(&store, session.id()).await;
    assert_eq!(d.turns[0].outcome, Some(settle_runtime::Outcome::Detached));
    assert_eq!(d.turns.len(), 2);
    kernel.shutdown(Duration::ZERO).await;
}

/// A start waiting for a cancelled turn's end is answered as a new one
/// would be once that turn has ended: refused when the session was closed
/// meanwhile, and not started at all when its caller went away.
#[tokio::test(start_paused = true)]
async fn g10_a_start_waiting_for_a_settle_is_refused_when_its_session_closes_and_dropped_when_its_caller_goes(
) {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let p = provider([
        hang(&["a"], 5 * MS).close_delay(200 * MS),
        hang(&["b"], 5 * MS).close_delay(200 * MS),
        complete(&["never"], 5 * MS),
    ]);
    // Closed meanwhile: the waiting start hears that the session is closed.
    let closed = kernel.register("closed", None).await.unwrap();
    let mut turn = start(&closed, &p).await;
    read_chunks(&mut turn, 1).await;
    drop(turn);
    let waiting = tokio::spawn({
        let closed = closed.clone();
        let p = p.clone();
        async move { closed.run_turn(p, TurnRequest::prompt("next")).await }
    });
    settle_tasks().await;
    let finishing = tokio::spawn({
        let closed = closed.clone();
        async move { closed.finish().await }
    });
    match waiting.await.unwrap() {
        Err(e) => assert!(e.is_session_closed(), "{e}"),
        Ok(_) => panic!("a turn started on a session being closed"),
    }
    finishing.await.unwrap().unwrap();
    // Its caller went away: nothing starts once the turn before has ended.
    let gone = kernel.register("gone", None).await.unwrap();
    let mut turn = start(&gone, &p).await;
    read_chunks(&mut turn, 1).await;
    drop(turn);
    let gave_up = tokio::time::timeout(
        50 * MS,
        gone.run_turn(p.clone(), TurnRequest::prompt("next")),
    )
    .await;
    assert!(gave_up.is_err(), "the start did not wait");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(detail(&store, gone.id()).await.turns.len(), 1);
    assert_eq!(gone.state().await.unwrap(), State::Registered);
    assert_eq!(p.stats().opened, 2);
    kernel.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g9_a_guard_dropped_during_the_shutdown_leaves_its_subtree_to_the_drain() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel.register("root", None).await.unwrap().guard();
    let child = kernel.register("child", Some(root.id())).await.unwrap();
    // A child turn of 300 ms under a 2 s drain.
    let p = provider([complete(&["one", "two", "three"], 100 * MS)]);
    let turn = start(&child, &p).await;
    let shutdown = tokio::spawn({
        let kernel = kernel.clone();
        async move { kernel.shutdown(2000 * MS).await }
    });
    kernel.shutdown_begun().await;
    // The agent's code returns on "shutdown begun" and drops its guard.
    drop(root);
    assert_eq!(turn.outcome().await, settle_runtime::Outcome::Completed);
    let report = shutdown.await.unwrap();
    assert!(report.cancelled.is_empty(), "{report:?}");
    assert_eq!(report.drained, vec![child.id()]);
    assert_eq!(child.finalized().await.unwrap(), EndReason::Shutdown);
    let stored = detail(&store, child.id()).await;
    assert_eq!(stored.turns[0].chunks.len(), 3);
}

/// The chunks a cancelled turn yielded are a prefix of the ones it stored.
async fn yielded_prefix_of_stored(kernel: &Kernel, store: &MemoryStore, round: usize) {
    let session: SessionHandle = kernel.register(format!("s{round}"), None).await.unwrap();
    let chunks = numbered("c", 400);
    let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let p = provider([complete(&chunks, Duration::ZERO)]);
    let mut turn = start(&session, &p).await;
    let mut yielded = read_chunks(&mut turn, 1 + round % 7).await;
    turn.cancel();
    while let Some(chunk) = turn.next_chunk().await {
        yielded.push(chunk.into_payload());
    }
    let _ = turn.outcome().await;
    session.close().await.unwrap();
    let stored: Vec<String> = detail(store, session.id()).await.turns[0]
        .chunks
        .iter()
        .map(|c| c.text.clone())
        .collect();
    assert!(
        stored.starts_with(&yielded),
        "round {round}: yielded {} chunks, stored {}, not a prefix",
        yielded.len(),
        stored.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_a_cancelled_turn_yields_a_prefix_of_what_it_stored() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    for round in 0..40 {
        yielded_prefix_of_stored(&kernel, &store, round).await;
    }
    kernel.shutdown(Duration::ZERO).await;
}

/// A frontend that takes waiting chunks without waiting (the Python
/// package's reads) gets only persisted ones, in order, and a `Pending`
/// costs nothing: the chunk not yet there comes with the next ask.
#[tokio::test(start_paused = true)]
async fn g7_a_chunk_taken_without_waiting_is_persisted_and_in_order() {
    use std::task::Poll;
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("reader", None).await.unwrap();
    let chunks = numbered("c", 6);
    let p = Arc::new(ScriptedProvider::new([settle_stream::TurnScript::new(
        chunks.iter().map(String::as_str),
    )
    .chunk_delay(10 * MS)]));
    let mut turn = session
        .run_turn(p, TurnRequest::prompt("go"))
        .await
        .unwrap();
    let (mut taken, mut pending) = (Vec::new(), 0);
    let ended = loop {
        match turn.try_next_chunk() {
            Poll::Ready(Some(chunk)) => {
                let stored = detail(&store, session.id()).await.turns[0].chunks.len();
                assert!(
                    stored > taken.len(),
                    "a chunk was yielded before it was stored"
                );
                taken.push(chunk.into_payload());
            }
            Poll::Ready(None) => break true,
            Poll::Pending => {
                pending += 1;
                assert!(pending < 10_000, "the turn never ended");
                tokio::time::sleep(MS).await;
            }
        }
    };
    assert!(ended);
    assert!(
        pending > 0,
        "the chunks came one every 10 ms: some asks found none"
    );
    assert_eq!(taken, chunks);
    assert_eq!(turn.outcome().await, settle_runtime::Outcome::Completed);
    kernel.shutdown(Duration::ZERO).await;
}

#[test]
fn signals_get_their_default_action_once_the_kernel_stopped() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    // The example sits beside the test binaries: target/debug/examples.
    let exe = std::env::current_exe().unwrap();
    let examples = exe.parent().unwrap().parent().unwrap().join("examples");
    let program = examples.join("hang_after_shutdown");
    assert!(program.exists(), "build the example first: {program:?}");
    for signal in [nix::sys::signal::SIGINT, nix::sys::signal::SIGTERM] {
        let mut child = std::process::Command::new(&program)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "stopped");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{signal} did not end a program whose kernel had stopped");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(signal as i32), "{status:?}");
    }
}

/// Starts a turn on `p` and drops the start's future after one poll (its
/// command sent), before it gave the turn: at once, so that the driver's
/// answer finds nobody, or, `answered`, once every task ran, so that the
/// answer waits unread in the start's channel.
async fn drop_a_start_after_one_poll(
    session: &SessionHandle,
    p: &Arc<ScriptedProvider>,
    answered: bool,
) {
    use std::future::Future;
    let mut starting = Box::pin(session.run_turn(p.clone(), TurnRequest::prompt("go")));
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(starting.as_mut().poll(&mut cx).is_pending());
    if answered {
        settle_tasks().await;
    }
    drop(starting);
}

/// Starts a turn on a stream that never ends and drops the start's future
/// after one poll, before it gave the turn (what a `timeout` or a
/// `select!` that gives up does): at once, so that the driver's answer
/// finds nobody, or once every task ran, so that the answer waits unread
/// in the start's channel. The turn must end as if its `Turn` had been
/// dropped: cancelled, its stream closed, the session free for the next.
async fn a_dropped_start(answered: bool) {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("chat", None).await.unwrap();
    let p = provider([hang(&[], MS)]);
    drop_a_start_after_one_poll(&session, &p, answered).await;
    settle_tasks().await;
    tokio::time::sleep(100 * MS).await;
    let stats = p.stats();
    // Cancelled before its stream opened, or closed once it did (G4).
    assert!(stats.opened <= 1, "{stats:?}");
    assert_eq!(
        stats.close_started, stats.opened,
        "a stream left open: {stats:?}"
    );
    assert_eq!(session.state().await.unwrap(), State::Registered);
    let next = start(&session, &provider([complete(&["next"], MS)])).await;
    assert_eq!(next.outcome().await, settle_runtime::Outcome::Completed);
    kernel.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g4_a_turn_whose_start_was_dropped_before_its_answer_is_cancelled_and_closed() {
    a_dropped_start(false).await;
}

#[tokio::test(start_paused = true)]
async fn g4_a_turn_whose_start_was_dropped_with_its_answer_waiting_is_cancelled_and_closed() {
    a_dropped_start(true).await;
}

/// A caller that gives up on a turn's start (a `timeout`, a `select!`, a
/// cancelled task) and asks for the next turn at once, before the kernel
/// has even taken the first start: the first turn is cancelled before the
/// next start is looked at, so the next one waits for its end, as after
/// any cancel, instead of being refused "a turn is still running" for a
/// turn its caller never had. `answered`: the kernel had answered the
/// first start, unread, before it was dropped.
async fn the_next_turn_right_after_a_dropped_start(answered: bool) {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("chat", None).await.unwrap();
    let p = provider([hang(&[], MS)]);
    drop_a_start_after_one_poll(&session, &p, answered).await;
    let mut next = session
        .run_turn(
            provider([complete(&["next"], MS)]),
            TurnRequest::prompt("next"),
        )
        .await
        .expect("the next turn waits for the dropped one's end, then starts");
    assert_eq!(read_chunks(&mut next, 1).await.len(), 1);
    assert_eq!(next.outcome().await, settle_runtime::Outcome::Completed);
    let stats = p.stats();
    assert_eq!(
        stats.close_started, stats.opened,
        "a stream left open: {stats:?}"
    );
    kernel.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g5_the_next_turn_right_after_a_start_dropped_before_its_answer_waits_for_its_end() {
    the_next_turn_right_after_a_dropped_start(false).await;
}

#[tokio::test(start_paused = true)]
async fn g5_the_next_turn_right_after_a_start_dropped_with_its_answer_waiting_waits_for_its_end() {
    the_next_turn_right_after_a_dropped_start(true).await;
}

/// A chat's "stop" without the turn's handle (a frontend that holds only
/// the session): `cancel_turn()` is queued to the kernel when it is
/// called, so the next turn, asked before that call's future is even
/// polled, waits for the cancelled turn's end instead of being refused
/// because it still runs.
#[tokio::test(start_paused = true)]
async fn g5_a_turn_asked_right_after_cancel_turn_is_called_waits_for_the_cancelled_ones_end() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("chat", None).await.unwrap();
    let p = provider([hang(&["a"], 5 * MS), complete(&["b"], MS)]);
    let mut turn = start(&session, &p).await;
    assert_eq!(read_chunks(&mut turn, 1).await, ["a"]);
    let stopping = session.cancel_turn();
    let mut next = session
        .run_turn(p.clone(), TurnRequest::prompt("next"))
        .await
        .expect("the next turn waits for the stopped one's end");
    applied(stopping.await);
    assert_eq!(read_chunks(&mut next, 1).await, ["b"]);
    assert_eq!(next.outcome().await, settle_runtime::Outcome::Completed);
    assert_eq!(turn.outcome().await, settle_runtime::Outcome::Cancelled);
    kernel.shutdown(Duration::ZERO).await;
}

/// A tool's own account of how it ended: what `spawn_with_outcome` reads
/// off its output, in the test's own type.
enum Scan {
    Found(u32),
    GaveUp,
}

impl settle_runtime::TaskOutcome for Scan {
    fn task_outcome(&self) -> Result<(), settle_runtime::TaskFailure> {
        match self {
            Scan::Found(_) => Ok(()),
            Scan::GaveUp => Err(settle_runtime::TaskFailure::Cancelled),
        }
    }
}

/// Found from outside: a tool that failed was recorded `completed` (its
/// caller got the error, the store said "task ended: completed"). A task
/// spawned with `spawn_with_outcome` is recorded as its output says: an
/// `Err` `failed` with its words (kind `task`), a task that gave up on its
/// own `cancelled`, and never cancelled again (G6); `spawn` keeps
/// recording a task that returned `completed`.
#[tokio::test(start_paused = true)]
async fn g7_a_task_is_recorded_as_its_output_says_it_ended() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let mut events = kernel.subscribe();
    let outcome_of = |events: &[LifecycleEvent], id: SessionId| {
        events
            .iter()
            .find_map(|e| match e {
                LifecycleEvent::WorkEnded {
                    session,
                    work,
                    outcome,
                    error,
                } if *session == id && work.kind == WorkKind::Task => {
                    Some((*outcome, error.clone()))
                }
                _ => None,
            })
            .expect("the task's end was announced")
    };

    let failing = kernel.register("failing", None).await.unwrap();
    let task = failing
        .spawn_with_outcome(|_| async { Err::<u32, _>("no host answered on port 22") })
        .await
        .unwrap();
    assert_eq!(
        task.join().await.unwrap(),
        Err("no host answered on port 22")
    );
    let gave_up = kernel.register("gave-up", None).await.unwrap();
    let task = gave_up
        .spawn_with_outcome(|_| async { Scan::GaveUp })
        .await
        .unwrap();
    assert!(matches!(task.join().await.unwrap(), Scan::GaveUp));
    let found = kernel.register("found", None).await.unwrap();
    let task = found
        .spawn_with_outcome(|_| async { Scan::Found(3) })
        .await
        .unwrap();
    assert!(matches!(task.join().await.unwrap(), Scan::Found(3)));
    let plain = kernel.register("plain", None).await.unwrap();
    let task = plain
        .spawn(|_| async { Err::<u32, _>("said nothing of it") })
        .await
        .unwrap();
    assert!(task.join().await.unwrap().is_err());
    for session in [&failing, &gave_up, &found, &plain] {
        session.finish().await.unwrap();
    }
    let seen = drain(&mut events);

    let (outcome, error) = outcome_of(&seen, failing.id());
    assert_eq!(outcome, Outcome::Failed);
    let error = error.expect("a failed task says why");
    assert_eq!(error.kind, settle_runtime::TurnErrorKind::Task);
    assert_eq!(error.message, "no host answered on port 22");
    assert_eq!(outcome_of(&seen, gave_up.id()).0, Outcome::Cancelled);
    assert_eq!(outcome_of(&seen, found.id()).0, Outcome::Completed);
    assert_eq!(outcome_of(&seen, plain.id()).0, Outcome::Completed);
    // Stored so: the session's outcome is its last work's, and the timeline
    // says how the task ended; the one that gave up was not cancelled.
    let d = detail(&store, failing.id()).await;
    assert_eq!(d.session.outcome, Some(Outcome::Failed), "{d:?}");
    assert!(
        d.timeline.iter().any(|t| t.cause == "task ended: failed"),
        "{:?}",
        d.timeline
    );
    let d = detail(&store, gave_up.id()).await;
    assert_eq!(d.session.outcome, Some(Outcome::Cancelled), "{d:?}");
    assert!(
        d.timeline.iter().all(|t| t.to != State::Cancelling),
        "{:?}",
        d.timeline
    );
    kernel.shutdown(Duration::ZERO).await;
}
