//! G3: every automatic reclaim path takes an eligible idle session and spares
//! a running one, a held one, and one whose turn started after it looked idle
//! but before the claim (the core checks and claims in one step, so a turn
//! start that the driver handles first makes the claim miss).

use std::time::Duration;

use settle_runtime::{
    EndReason, Handled, Hold, LifecycleError, Outcome, RuntimeError, SessionHandle, State,
};
use settle_store::MemoryStore;
use tokio::time::{sleep, Instant};

use crate::common::*;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

async fn state(store: &MemoryStore, s: &SessionHandle) -> State {
    detail(store, s.id()).await.session.state
}

async fn assert_open(store: &MemoryStore, sessions: &[&SessionHandle]) {
    for s in sessions {
        let st = state(store, s).await;
        assert_ne!(st, State::Finalized, "session {} was reclaimed", s.id());
    }
}

#[tokio::test(start_paused = true)]
async fn g3_idle_reap_takes_the_idle_session_and_spares_live_ones() {
    let store = MemoryStore::new();
    let ttl = 10 * SEC;
    let runtime = runtime_on(&store, |b| b.idle_ttl(Some(ttl)).lru_cap(None)).await;
    let t0 = Instant::now();
    let idle = runtime.register("idle", None).await.unwrap();
    let running = runtime.register("running", None).await.unwrap();
    let held = runtime.register("held", None).await.unwrap();
    let late = runtime.register("late", None).await.unwrap();

    let p_running = provider([hang(&["r"], 10 * MS)]);
    let _running_turn = start(&running, &p_running).await;
    assert_eq!(
        held.hold(Hold::PendingInput).await.unwrap(),
        Handled::Applied
    );
    // Looked idle for almost the whole TTL, then a turn starts just before
    // the reap would claim it.
    sleep(ttl - 100 * MS).await;
    let p_late = provider([complete(&["l1", "l2"], SEC)]);
    let late_turn = start(&late, &p_late).await;

    assert_eq!(idle.finalized().await.unwrap(), EndReason::IdleReap);
    assert!(t0.elapsed() >= ttl);
    settle_tasks().await;
    assert_open(&store, &[&running, &held, &late]).await;
    assert_eq!(state(&store, &running).await, State::Running);

    // Skipped ones are reclaimed by the same path once eligible again.
    assert_eq!(late_turn.outcome().await, Outcome::Completed);
    let turn_ended = Instant::now();
    assert_eq!(late.finalized().await.unwrap(), EndReason::IdleReap);
    assert!(turn_ended.elapsed() >= ttl);
    sleep(3 * ttl).await;
    assert_open(&store, &[&running, &held]).await;
    applied(held.release(Hold::PendingInput).await);
    assert_eq!(held.finalized().await.unwrap(), EndReason::IdleReap);
    assert_eq!(state(&store, &running).await, State::Running);
    assert_eq!(runtime.store_failures(), 0);
    runtime.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g3_lru_cap_evicts_the_least_recent_idle_session_only() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b.lru_cap(Some(4)).idle_ttl(None)).await;
    let late = runtime.register("late", None).await.unwrap();
    sleep(SEC).await;
    let running = runtime.register("running", None).await.unwrap();
    let held = runtime.register("held", None).await.unwrap();
    sleep(SEC).await;
    let idle = runtime.register("idle", None).await.unwrap();
    let p = provider([hang(&["r"], 10 * MS)]);
    let _running_turn = start(&running, &p).await;
    applied(held.hold(Hold::Delegation).await);
    // The oldest session looked idle; its turn starts before the cap is hit.
    let p_late = provider([hang(&["l"], 10 * MS)]);
    let _late_turn = start(&late, &p_late).await;

    let newcomer = runtime.register("newcomer", None).await.unwrap();
    assert_eq!(idle.finalized().await.unwrap(), EndReason::LruEvict);
    settle_tasks().await;
    assert_open(&store, &[&late, &running, &held, &newcomer]).await;
    assert_eq!(runtime.store_failures(), 0);
    runtime.shutdown(Duration::ZERO).await;
}

/// The LRU cap per scope: a registration at the cap evicts only idle
/// sessions of its own scope, its children are in its scope, and with
/// none of its own to evict it is refused, however many others are idle.
#[tokio::test(start_paused = true)]
async fn g3_the_lru_cap_evicts_only_within_the_registering_scope() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b.lru_cap(Some(3)).idle_ttl(None)).await;
    let (a, b) = (runtime.scope_of(Some("a")), runtime.scope_of(Some("b")));
    assert_ne!(a, b);
    let a1 = runtime.register_in(a, "a1", None).await.unwrap();
    sleep(SEC).await;
    let a2 = a1.child("a2").await.unwrap();
    sleep(SEC).await;
    let b1 = runtime.register_in(b, "b1", None).await.unwrap();
    sleep(SEC).await;
    // B at the cap: its own idle one goes, though A's child is older.
    let b2 = runtime.register_in(b, "b2", None).await.unwrap();
    assert_eq!(b1.finalized().await.unwrap(), EndReason::LruEvict);
    applied(b2.hold(Hold::PendingInput).await);
    let over = |r: Result<SessionHandle, RuntimeError>| {
        matches!(
            r,
            Err(RuntimeError::Lifecycle(LifecycleError::OverCapacity {
                cap: 3
            }))
        )
    };
    assert!(over(runtime.register_in(b, "b3", None).await));
    // Nor may a session of no scope end A's.
    assert!(over(runtime.register("shared", None).await));
    settle_tasks().await;
    assert_open(&store, &[&a1, &a2, &b2]).await;
    // A's child is in A's scope: a new one evicts it, not its parent.
    let a3 = a1.child("a3").await.unwrap();
    assert_eq!(a2.finalized().await.unwrap(), EndReason::LruEvict);
    settle_tasks().await;
    assert_open(&store, &[&a1, &a3, &b2]).await;
    runtime.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g3_orphan_reap_takes_the_orphan_and_re_arms_for_live_ones() {
    let store = MemoryStore::new();
    let grace = 5 * SEC;
    let runtime = runtime_on(&store, |b| b.orphan_grace(grace).idle_ttl(None)).await;
    let sessions = [
        runtime.register("idle", None).await.unwrap(),
        runtime.register("running", None).await.unwrap(),
        runtime.register("held", None).await.unwrap(),
        runtime.register("late", None).await.unwrap(),
    ];
    let [idle, running, held, late] = &sessions;
    for s in &sessions {
        applied(s.attach_transport(false).await);
    }
    // The running turn outlives the grace and ends at 7 s.
    let p = provider([complete(&["a", "b", "c", "d", "e", "f", "g"], SEC)]);
    let running_turn = start(running, &p).await;
    applied(held.hold(Hold::PendingInput).await);
    let t0 = Instant::now();
    for s in &sessions {
        applied(s.detach_transport().await);
    }
    sleep(grace - 100 * MS).await;
    let p_late = provider([complete(&["l"], SEC)]);
    let late_turn = start(late, &p_late).await;

    assert_eq!(idle.finalized().await.unwrap(), EndReason::OrphanReap);
    settle_tasks().await;
    assert_open(&store, &[running, held, late]).await;

    // Re-armed while the turns ran: reclaimed at the next grace expiry.
    assert_eq!(late_turn.outcome().await, Outcome::Completed);
    assert_eq!(running_turn.outcome().await, Outcome::Completed);
    assert_eq!(running.finalized().await.unwrap(), EndReason::OrphanReap);
    assert_eq!(late.finalized().await.unwrap(), EndReason::OrphanReap);
    assert!(t0.elapsed() >= 2 * grace);
    sleep(4 * grace).await;
    assert_open(&store, &[held]).await;
    assert_eq!(runtime.store_failures(), 0);
    runtime.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g3_transport_closed_reclaims_at_once_but_never_a_live_turn() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b.idle_ttl(None)).await;
    let idle = runtime.register("idle", None).await.unwrap();
    let running = runtime.register("running", None).await.unwrap();
    let held = runtime.register("held", None).await.unwrap();
    let p = provider([hang(&["r"], 10 * MS)]);
    let running_turn = start(&running, &p).await;
    applied(held.hold(Hold::PendingInput).await);
    for s in [&idle, &running, &held] {
        applied(s.attach_transport(true).await);
        applied(s.detach_transport().await);
    }
    assert_eq!(idle.finalized().await.unwrap(), EndReason::TransportClosed);
    sleep(SEC).await;
    assert_open(&store, &[&running, &held]).await;
    assert_eq!(state(&store, &running).await, State::Running);

    // Once the turn is over, and once the hold ends, the same path claims them.
    applied(running.cancel_turn().await);
    assert_eq!(running_turn.outcome().await, Outcome::Cancelled);
    assert_eq!(
        running.finalized().await.unwrap(),
        EndReason::TransportClosed
    );
    assert_open(&store, &[&held]).await;
    applied(held.release(Hold::PendingInput).await);
    assert_eq!(held.finalized().await.unwrap(), EndReason::TransportClosed);
    assert_eq!(p.stats().opened, p.stats().close_started);
    assert_eq!(runtime.store_failures(), 0);
    runtime.shutdown(Duration::ZERO).await;
}

/// SPEC §5: a session's holds are kept in the store for a process that
/// adopts it. A held session that is finalized (closed by its user, or by
/// a shutdown) has no adopter, so what was kept for it goes with it: the
/// store keeps no holds of a finalized session, and nothing grows with
/// the held sessions a long-lived process ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_session_finalized_while_held_leaves_no_holds_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.db");
    let path = path.to_str().unwrap().to_owned();
    let store = std::sync::Arc::new(settle_store::Store::open_async(path.clone()).await.unwrap());
    let kernel = settle_runtime::Kernel::builder(store)
        .idle_timeout(None)
        .start()
        .await
        .unwrap();
    let closed = kernel.register("closed", None).await.unwrap();
    let left = kernel.register("left", None).await.unwrap();
    let released = kernel.register("released", None).await.unwrap();
    for s in [&closed, &left, &released] {
        assert_eq!(s.hold(Hold::PendingInput).await.unwrap(), Handled::Applied);
    }
    // A hold is answered once the core took it; its row follows.
    assert_eq!(held_rows_once(&path, 3).await, 3, "the holds were not kept");
    assert_eq!(
        released.release(Hold::PendingInput).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(closed.close().await.unwrap(), EndReason::UserClose);
    let report = kernel.shutdown(Duration::ZERO).await;
    assert!(report.left_recoverable.is_empty(), "{report:?}");
    assert_eq!(held_rows(&path), 0, "holds of finalized sessions were kept");
}

/// The rows of kept holds at `path` once they are `n`, or after 10 s.
async fn held_rows_once(path: &str, n: usize) -> usize {
    let mut rows = held_rows(path);
    for _ in 0..1_000 {
        if rows == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        rows = held_rows(path);
    }
    rows
}

/// The rows of kept holds in the SQLite file at `path`.
fn held_rows(path: &str) -> usize {
    let out = std::process::Command::new("sqlite3")
        .arg(path)
        .arg("SELECT count(*) FROM released_holds;")
        .output()
        .expect("the sqlite3 shell runs (CI installs it)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
