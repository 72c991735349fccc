//! A real SQLite file locked by another process (the `sqlite3` shell holding
//! `BEGIN EXCLUSIVE`) for longer than the store timeout, while a coordinator
//! winds its children down mid-turn. The store's writer waits for the lock
//! (its busy timeout is longer than the lock) while the kernel stops
//! waiting for it at the store timeout: the writes it was not answered in
//! time land once the lock goes, and are then tried again. Those that
//! landed are not failures.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use settle_runtime::{Kernel, Outcome};
use settle_store::{SessionFilter, SessionStore, State, Store};
use settle_stream::TurnScript;

use crate::common::*;

/// The `sqlite3` shell holding an exclusive lock on `path` until released.
struct Lock(Child);

impl Lock {
    /// Takes the lock; returns once the shell holds it.
    fn take(path: &str) -> Lock {
        let mut shell = Command::new("sqlite3")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the sqlite3 shell runs (CI installs it)");
        let stdin = shell.stdin.as_mut().expect("its stdin");
        stdin
            .write_all(b"BEGIN EXCLUSIVE;\nSELECT 'held';\n")
            .expect("the lock asked for");
        let mut said = String::new();
        BufReader::new(shell.stdout.as_mut().expect("its stdout"))
            .read_line(&mut said)
            .expect("the shell answers");
        assert_eq!(said.trim(), "held", "the lock was not taken");
        Lock(shell)
    }

    fn release(mut self) {
        if let Some(mut stdin) = self.0.stdin.take() {
            let _ = stdin.write_all(b"COMMIT;\n");
        }
        let _ = self.0.wait();
    }
}

/// A kernel on a new SQLite file in `dir` (its path and its store), with
/// a 1 s store timeout (the store's busy timeout stays 5 s: a lock of a
/// few seconds outlasts the one and not the other) and a 300 ms settle
/// timeout.
async fn on_a_file(dir: &tempfile::TempDir) -> (String, Arc<Store>, Kernel) {
    on_a_file_with(dir, settle_store::StoreOptions::default()).await
}

/// [`on_a_file`] with the store's `options`.
async fn on_a_file_with(
    dir: &tempfile::TempDir,
    options: settle_store::StoreOptions,
) -> (String, Arc<Store>, Kernel) {
    let path = dir.path().join("locked.db");
    let path = path.to_str().unwrap().to_owned();
    let store = Arc::new(Store::open_with(&path, options).unwrap());
    let kernel = Kernel::builder(store.clone())
        .idle_timeout(None)
        .settle_timeout(Duration::from_millis(300))
        .store_timeout(Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    (path, store, kernel)
}

/// Cancels `turn` and reads it to its end: how it ended, and how long
/// after the cancel its reader was told.
async fn told_after_cancel(mut turn: settle_runtime::Turn) -> (Outcome, Duration) {
    let cancelled = std::time::Instant::now();
    turn.cancel();
    while turn.next_chunk().await.is_some() {}
    let (outcome, _) = turn.end().await;
    (outcome, cancelled.elapsed())
}

/// `n` idle sessions registered on `kernel`, to be held.
async fn holders(kernel: &Kernel, n: usize) -> Vec<settle_runtime::SessionHandle> {
    let mut holders = Vec::with_capacity(n);
    for i in 0..n {
        holders.push(kernel.register(format!("holder-{i}"), None).await.unwrap());
    }
    holders
}

/// A hold of each of `holders`, asked at once, each on a task of its own:
/// how it was answered, and how long after its ask.
fn ask_holds(
    holders: &[settle_runtime::SessionHandle],
) -> Vec<
    tokio::task::JoinHandle<(
        Result<settle_runtime::Handled, settle_runtime::RuntimeError>,
        Duration,
    )>,
> {
    holders
        .iter()
        .map(|h| {
            let h = h.clone();
            tokio::spawn(async move {
                let asked = std::time::Instant::now();
                let held = h.hold(settle_runtime::Hold::PendingInput).await;
                (held, asked.elapsed())
            })
        })
        .collect()
}

/// A coordinator finished while the file is locked past the store timeout:
/// its children's transitions and turn ends, handed while the lock was
/// held, land when it goes and are tried again after; the store answers
/// the second tries that their session is finalized (the first ones and
/// its finalize landed). That is not a failure: none is counted or
/// announced, and the store holds every session finalized, children
/// before their parent, every turn ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_g7_writes_that_landed_after_the_store_timeout_are_not_counted_failed_when_tried_again()
{
    let dir = tempfile::tempdir().unwrap();
    let (path, store, kernel) = on_a_file(&dir).await;
    let mut events = kernel.subscribe();
    let root = kernel.register("root", None).await.unwrap();
    let long = TurnScript::new(numbered("c", 100_000)).chunk_delay(Duration::from_millis(5));
    let mut turns = Vec::new();
    for i in 0..3 {
        let child = root.child(format!("child-{i}")).await.unwrap();
        let mut turn = start(&child, &provider([long.clone()])).await;
        // A tool beside the turn, as a coordinator's children run them.
        let tool = child
            .spawn(|ctx| async move { ctx.cancelled().await })
            .await
            .unwrap();
        assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
        turns.push(tokio::spawn(async move {
            while turn.next_chunk().await.is_some() {}
            let _ = tool.await;
            turn.end().await
        }));
    }
    let lock = Lock::take(&path);
    let finishing = tokio::spawn({
        let root = root.clone();
        async move { root.finish().await }
    });
    // Past the store timeout, within the store's busy timeout (5 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    lock.release();
    finishing
        .await
        .unwrap()
        .expect("the root is finished once the store takes it");
    for turn in turns {
        let (outcome, _) = turn.await.unwrap();
        assert!(
            matches!(outcome, Outcome::Cancelled | Outcome::Failed),
            "{outcome:?}"
        );
    }
    let report = kernel.shutdown(Duration::from_millis(100)).await;
    let failed = store_failed(&drain(&mut events));
    assert!(failed.is_empty(), "announced as failed: {failed:?}");
    assert_eq!(report.store_failures, 0, "{report:?}");
    let rows = store.list_sessions(SessionFilter::default()).await.unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for row in &rows {
        assert_eq!(row.state, State::Finalized, "{row:?}");
        let d = store.session_detail(row.id).await.unwrap();
        assert!(d.turns.iter().all(|t| t.outcome.is_some()), "{d:?}");
    }
}

/// A chunk whose append the store did not answer within the store timeout
/// (the file locked past it) fails its turn; the writer, still waiting on
/// the lock with it, commits it once the lock goes. It is withdrawn then:
/// the store keeps exactly the chunks the reader was given, in a turn that
/// ended `failed` (G7: what is kept is what was told).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_a_chunk_given_up_on_at_the_store_timeout_is_not_kept_when_it_lands_later() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store, kernel) = on_a_file(&dir).await;
    let session = kernel.register("s", None).await.unwrap();
    let long = TurnScript::new(numbered("c", 100_000)).chunk_delay(Duration::from_millis(5));
    let mut turn = start(&session, &provider([long])).await;
    assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
    let lock = Lock::take(&path);
    let mut given = vec!["c-0".to_owned()];
    while let Some(chunk) = turn.next_chunk().await {
        given.push(chunk.into_payload());
    }
    let (outcome, error) = turn.end().await;
    assert_eq!(outcome, Outcome::Failed, "{error:?}");
    // Within the store's busy timeout (5 s): the writer takes the lock
    // with the chunk it was given up on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    lock.release();
    store.flush().await.unwrap();
    let detail = store.session_detail(session.id()).await.unwrap();
    let stored: Vec<String> = detail.turns[0]
        .chunks
        .iter()
        .map(|c| c.text.clone())
        .collect();
    assert_eq!(stored, given, "the store keeps what the reader was given");
    kernel.shutdown(Duration::ZERO).await;
}

/// A shutdown whose store is locked past its budget leaves what it could
/// not write to recovery (G8, G9); dropping the kernel's last handle after
/// it then returns at once, instead of waiting the store's close timeout
/// again for a writer the shutdown already gave up on (a Python program's
/// event loop stood still for that second, the GIL held, when it let its
/// handles go, and its exit came a second late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_the_last_handle_of_a_store_the_shutdown_gave_up_on_is_dropped_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    let path = path.to_str().unwrap().to_owned();
    // The default close timeout: one second.
    let store = Arc::new(Store::open_async(path.clone()).await.unwrap());
    let kernel = Kernel::builder(store.clone())
        .idle_timeout(None)
        .settle_timeout(Duration::from_millis(100))
        .flush_budget(Duration::from_millis(300))
        .store_timeout(Duration::from_millis(500))
        .start()
        .await
        .unwrap();
    let session = kernel.register("held up", None).await.unwrap();
    let lock = Lock::take(&path);
    let report = kernel.shutdown(Duration::ZERO).await;
    assert!(
        report.left_recoverable.contains(&session.id()) || !report.flushed_in_budget,
        "the shutdown could not write through the lock: {report:?}"
    );
    drop((session, kernel));
    // The kernel's tasks let go of it as they end: the test's is the last.
    let waiting = std::time::Instant::now();
    while Arc::strong_count(&store) > 1 && waiting.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "the kernel let go of its store"
    );
    let dropping = std::time::Instant::now();
    drop(store);
    let took = dropping.elapsed();
    lock.release();
    assert!(
        took < Duration::from_millis(500),
        "dropping the last handle took {took:?}"
    );
}

/// A coordinator finished while the file is locked for several store
/// timeouts: its children's turns are cancelled at once, and their readers
/// are told the end by the store timeout (the end is written once the lock
/// goes), not held until the store answers: a coordinator awaiting its
/// children is not held for the whole outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_turn_cancelled_on_a_locked_store_is_told_its_end_by_the_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store, kernel) = on_a_file(&dir).await;
    let root = kernel.register("root", None).await.unwrap();
    let long = TurnScript::new(numbered("c", 100_000)).chunk_delay(Duration::from_millis(5));
    let mut readers = Vec::new();
    for i in 0..3 {
        let child = root.child(format!("child-{i}")).await.unwrap();
        let mut turn = start(&child, &provider([long.clone()])).await;
        assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
        readers.push(tokio::spawn(async move {
            while turn.next_chunk().await.is_some() {}

            let end = turn.end().await;

            (end, std::time::Instant::now())
        }));
    }
    let lock = Lock::take(&path);
    let finishing = tokio::spawn({
        let root = root.clone();
        async move { root.finish().await }
    });
    // Four store timeouts, within the store's busy timeout (5 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let released = std::time::Instant::now();

    lock.release();
    for reader in readers {
        let ((outcome, _), ended) = reader.await.unwrap();
        assert!(
            matches!(outcome, Outcome::Cancelled | Outcome::Failed),
            "{outcome:?}"
        );
        assert!(
            ended < released,
            "a reader was told its end {:?} after the lock went, not by the store timeout",
            ended - released
        );
    }
    finishing
        .await
        .unwrap()
        .expect("the root is finished once the store takes it");
    kernel.shutdown(Duration::from_millis(100)).await;
    let rows = store.list_sessions(SessionFilter::default()).await.unwrap();
    assert!(rows.iter().all(|r| r.state == State::Finalized), "{rows:?}");
}

/// On a store known to be stalled (a write already given up on at the
/// store timeout, waiting to be tried again), a turn cancelled later is
/// told its end at once: its reader does not wait a whole store timeout
/// more for a write handed behind the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_turn_cancelled_on_a_store_known_stalled_is_told_its_end_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    let path = path.to_str().unwrap().to_owned();
    let store = Arc::new(Store::open_async(path.clone()).await.unwrap());
    let timeout = Duration::from_millis(1500);
    let kernel = Kernel::builder(store.clone())
        .idle_timeout(None)
        .settle_timeout(Duration::from_millis(300))
        .store_timeout(timeout)
        .start()
        .await
        .unwrap();
    // One chunk, then nothing until cancelled: no append stalls on the lock.
    let quiet = hang(&["c-0"], Duration::from_millis(5));
    let mut turns = Vec::new();
    for i in 0..2 {
        let session = kernel.register(format!("s-{i}"), None).await.unwrap();
        let mut turn = start(&session, &provider([quiet.clone()])).await;
        assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
        turns.push(turn);
    }
    let second = turns.pop().unwrap();
    let first = turns.pop().unwrap();
    let lock = Lock::take(&path);
    // The first turn's end stalls on the lock and is given up on at the
    // store timeout: the store is known stalled from then on.
    first.cancel();
    let (outcome, _) = first.end().await;
    assert_eq!(outcome, Outcome::Cancelled);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled = std::time::Instant::now();
    second.cancel();
    let (outcome, _) = second.end().await;
    let waited = cancelled.elapsed();
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(
        waited < timeout / 2,
        "told {waited:?} after its cancel, on a store stalled already"
    );
    lock.release();
    kernel.shutdown(Duration::ZERO).await;
    let rows = store.list_sessions(SessionFilter::default()).await.unwrap();
    for row in &rows {
        let d = store.session_detail(row.id).await.unwrap();
        assert!(d.turns.iter().all(|t| t.outcome.is_some()), "{d:?}");
    }
}

/// Found from outside: a shutdown while the file was locked past its
/// budget reported every session left for recovery, yet once the lock
/// went the store held the root (and a child) finalized `shutdown` over
/// children still `running`: the writes given up on when the budget ran
/// out were dropped, and a finalize decided after that was still handed to
/// the store (polled once with no time to wait, which queues it on the
/// store's writer) and committed when the lock went. A write with no time
/// left is not handed at all: nothing the report says was left for
/// recovery is written later, and no parent is finalized over a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_a_shutdown_on_a_locked_store_writes_nothing_it_left_for_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store, kernel) = on_a_file(&dir).await;
    let root = kernel.register("root", None).await.unwrap();
    let quiet = hang(&["c-0"], Duration::from_millis(5));
    let mut turns = Vec::new();
    for i in 0..4 {
        let child = root.child(format!("child-{i}")).await.unwrap();
        let mut turn = start(&child, &provider([quiet.clone()])).await;
        assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
        turns.push(turn);
    }
    let _idle = root.child("idle").await.unwrap();
    let stubborn = root.child("stubborn").await.unwrap();
    // A tool that ignores its cancel: detached at the settle deadline.
    let _tool = stubborn
        .spawn(|_ctx| async move { tokio::time::sleep(Duration::from_secs(60)).await })
        .await
        .unwrap();
    let lock = Lock::take(&path);
    // Every store write of the shutdown stalls on the lock past its budget
    // (the drain, the settle timeout, then the store's time).
    let report = kernel.shutdown(Duration::from_millis(200)).await;
    assert!(report.finalized.is_empty(), "{report:?}");
    // The lock goes; whatever the store's writer still holds lands now.
    lock.release();
    drop(turns);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = store.list_sessions(SessionFilter::default()).await.unwrap();
    let finalized = |id| {
        rows.iter()
            .any(|r| r.id == id && r.state == State::Finalized)
    };
    for row in &rows {
        if let Some(parent) = row.parent {
            assert!(
                !finalized(parent) || row.state == State::Finalized,
                "session {} ({}) is {:?} under its finalized parent {parent}: {rows:#?}",
                row.id,
                row.name,
                row.state
            );
        }
    }
    for (id, _) in &report.finalized {
        assert!(finalized(*id), "reported finalized, not in the store: {id}");
    }
    for id in &report.left_recoverable {
        assert!(
            !finalized(*id),
            "reported left for recovery, finalized later: {id}: {rows:#?}"
        );
    }
}

/// Found from outside: on a locked file, a turn cancelled while other
/// store calls waited ahead of its end (two holds asked a moment before,
/// each a store call of its own) was told its end only once each of those
/// had waited its whole store timeout (4× the store timeout in a longer
/// run). Once one call goes unanswered for a store timeout the store is
/// known stalled, and the ends waiting behind the other calls are told at
/// once (their writes keep their order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_turns_end_behind_other_store_calls_on_a_stalled_store_is_told_by_the_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _store, kernel) = on_a_file(&dir).await;
    let quiet = hang(&["c-0"], Duration::from_millis(5));
    let session = kernel.register("reader", None).await.unwrap();
    let mut turn = start(&session, &provider([quiet])).await;
    assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
    let holders = holders(&kernel, 3).await;
    let lock = Lock::take(&path);
    // Three holds' records, each a store call of its own, ahead of the
    // turn's end.
    let holds = ask_holds(&holders);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (outcome, told) = told_after_cancel(turn).await;
    lock.release();
    for hold in holds {
        let _ = hold.await.unwrap();
    }
    assert_eq!(outcome, Outcome::Cancelled);
    // The store timeout (1 s), the settle timeout it may take to unwind
    // (0.3 s) and a margin; behind the calls ahead of it, 1.9 s before.
    assert!(
        told < Duration::from_millis(1_700),
        "told {told:?} after the cancel, with a 1 s store timeout"
    );
    kernel.shutdown(Duration::from_millis(100)).await;
}

/// A turn streaming while the file is locked (its next append waiting on
/// the lock), cancelled: its reader is told its end by the store timeout
/// after the cancel, as the gateway's `turn.ended` promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_streaming_turn_cancelled_on_a_locked_store_is_told_its_end_by_the_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _store, kernel) = on_a_file(&dir).await;
    let long = TurnScript::new(numbered("c", 100_000)).chunk_delay(Duration::from_millis(5));
    let session = kernel.register("streaming", None).await.unwrap();
    let mut turn = start(&session, &provider([long])).await;
    assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
    let lock = Lock::take(&path);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (outcome, told) = told_after_cancel(turn).await;
    lock.release();
    assert!(
        matches!(outcome, Outcome::Cancelled | Outcome::Failed),
        "{outcome:?}"
    );
    assert!(
        told < Duration::from_millis(1_700),
        "told {told:?} after the cancel, with a 1 s store timeout"
    );
    kernel.shutdown(Duration::from_millis(100)).await;
}

/// Found from outside: `turn.ended` came about twice the store timeout
/// after a cancel on a locked file. A turn's end whose write the store
/// refused before the store timeout (its busy timeout is shorter) is tried
/// again, and while that try was in flight its reader's deadline passed
/// unseen: it was told only when the try failed in turn. Its reader is
/// told at the store timeout, wherever its write is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_turns_end_tried_again_is_told_at_the_store_timeout_not_when_the_try_fails() {
    let dir = tempfile::tempdir().unwrap();
    // The store gives up on the lock after 900 ms, before the kernel's
    // store timeout (1 s): the first write fails and is tried again.
    let options =
        settle_store::StoreOptions::default().with_busy_timeout(Duration::from_millis(900));
    let (path, _store, kernel) = on_a_file_with(&dir, options).await;
    let quiet = hang(&["c-0"], Duration::from_millis(5));
    let session = kernel.register("reader", None).await.unwrap();
    let mut turn = start(&session, &provider([quiet])).await;
    assert_eq!(read_chunks(&mut turn, 1).await, ["c-0"]);
    let lock = Lock::take(&path);
    let (outcome, told) = told_after_cancel(turn).await;
    lock.release();
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(
        told < Duration::from_millis(1_400),
        "told {told:?} after the cancel, with a 1 s store timeout"
    );
    kernel.shutdown(Duration::from_millis(100)).await;
}

/// Found from outside: on a locked file, holds asked one after another
/// were each answered only once the records ahead of theirs had waited
/// their store timeouts (6.5 s with a 3 s store timeout). Each caller
/// keeps its own store timeout from its ask, as a registration's does: at
/// that bound it is told the store did not answer, and its hold is taken
/// back first (it is not in effect for a hold it was told failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_holds_asked_on_a_locked_store_are_each_answered_by_their_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _store, kernel) = on_a_file(&dir).await;
    let holders = holders(&kernel, 4).await;
    // Lifecycle writes ahead of the holds' records: a turn's end and a
    // finalize, in a batch the lock stalls, tried again.
    let busy = kernel.register("busy", None).await.unwrap();
    let turn = start(&busy, &provider([hang(&["c-0"], Duration::from_millis(5))])).await;
    let lock = Lock::take(&path);
    let closing = tokio::spawn(async move {
        let _ = told_after_cancel(turn).await;
        busy.close().await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let holds = ask_holds(&holders);
    let mut answers = Vec::new();
    for hold in holds {
        answers.push(hold.await.unwrap());
    }
    lock.release();
    let _ = closing.await;
    for (held, after) in &answers {
        assert!(held.is_err(), "held on a locked store: {held:?}");
        // The store timeout (1 s) and a margin; 4 s before.
        assert!(
            *after < Duration::from_millis(1_600),
            "told {after:?} after the ask, with a 1 s store timeout: {answers:?}"
        );
    }
    // Each hold its caller was told failed was taken back.
    for h in &holders {
        let released = h.release(settle_runtime::Hold::PendingInput).await;
        assert_eq!(released.unwrap(), settle_runtime::Handled::NoOp);
    }
    kernel.shutdown(Duration::from_millis(100)).await;
}
