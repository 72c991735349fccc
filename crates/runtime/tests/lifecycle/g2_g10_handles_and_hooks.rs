//! G2 and the `on_session_end` hook: once per session, with the right flags,
//! and never able to stop a shutdown. G10: closed handles fail loudly; the
//! active-session slot is released at finalize.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use settle_runtime::{
    CancelMode, Config, EndReason, Handled, Hold, Outcome, RuntimeError, SessionEnd,
    SessionEndHook, TurnRequest,
};
use settle_store::{MemoryStore, SessionStore, StoreError};
use tokio::time::Instant;

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn g2_the_end_hook_fires_once_per_session_with_its_flags() {
    let store = MemoryStore::new();
    let ends: Arc<Mutex<Vec<SessionEnd>>> = Arc::default();
    let seen = ends.clone();
    let runtime = runtime_on(&store, move |b| {
        b.on_session_end(move |end: SessionEnd| seen.lock().unwrap().push(end))
    })
    .await;
    let done = runtime.register("done", None).await.unwrap();
    let cancelled = runtime.register("cancelled", None).await.unwrap();
    let closed = runtime.register("closed", None).await.unwrap();
    let idle = runtime.register("idle", None).await.unwrap();

    let p = provider([complete(&["ok"], 10 * MS)]);
    assert_eq!(start(&done, &p).await.outcome().await, Outcome::Completed);
    assert_eq!(done.finish().await.unwrap(), EndReason::Completed);
    let p2 = provider([hang(&["half"], 10 * MS)]);
    let mut turn = start(&cancelled, &p2).await;
    read_chunks(&mut turn, 1).await;
    applied(cancelled.cancel(CancelMode::Immediate).await);
    assert_eq!(cancelled.finalized().await.unwrap(), EndReason::Cancelled);
    // Closing twice finalizes once (G2) and reports the end reason both times.
    assert_eq!(closed.close().await.unwrap(), EndReason::UserClose);
    assert_eq!(closed.close().await.unwrap(), EndReason::UserClose);
    runtime.shutdown(Duration::ZERO).await;

    let ends = ends.lock().unwrap().clone();
    let of = |id| {
        let mine: Vec<&SessionEnd> = ends.iter().filter(|e| e.session == id).collect();
        assert_eq!(mine.len(), 1, "hook calls for {id}: {ends:?}");
        (mine[0].reason, mine[0].completed, mine[0].interrupted)
    };
    assert_eq!(ends.len(), 4);
    assert_eq!(of(done.id()), (EndReason::Completed, true, false));
    assert_eq!(of(cancelled.id()), (EndReason::Cancelled, false, true));
    assert_eq!(of(closed.id()), (EndReason::UserClose, false, false));
    assert_eq!(of(idle.id()), (EndReason::Shutdown, false, false));
}

/// Panics for the session named "panics", never returns for "hangs".
struct Unruly {
    fired: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl SessionEndHook for Unruly {
    async fn on_session_end(&self, end: SessionEnd) {
        self.fired.lock().unwrap().push(end.name.clone());
        match end.name.as_str() {
            "panics" => panic!("a hook that panics"),
            "hangs" => std::future::pending::<()>().await,
            _ => {}
        }
    }
}

#[tokio::test(start_paused = true)]
async fn g9_a_panicking_or_hanging_hook_does_not_stop_shutdown() {
    let store = MemoryStore::new();
    let fired: Arc<Mutex<Vec<String>>> = Arc::default();
    let hook_timeout = Duration::from_secs(1);
    let config = Config::default().hook_timeout(hook_timeout);
    let hook = Unruly {
        fired: fired.clone(),
    };
    let runtime = runtime_on(&store, |b| {
        b.with_config(config)
            .idle_timeout(None)
            .on_session_end(hook)
    })
    .await;
    let ids: Vec<_> = [("panics"), ("hangs"), ("fine")]
        .into_iter()
        .map(|name| {
            let runtime = runtime.clone();
            async move { runtime.register(name, None).await.unwrap().id() }
        })
        .collect();
    let mut sessions = Vec::new();
    for id in ids {
        sessions.push(id.await);
    }

    let began = Instant::now();
    let report = runtime.shutdown(Duration::ZERO).await;
    let took = began.elapsed();
    assert!(took <= hook_timeout + 100 * MS, "shutdown took {took:?}");
    assert_eq!(report.finalized.len(), 3);
    let mut fired = fired.lock().unwrap().clone();
    fired.sort();
    assert_eq!(fired, vec!["fine", "hangs", "panics"]);
    for id in sessions {
        let d = detail(&store, id).await;
        assert_eq!(d.session.end_reason, Some(EndReason::Shutdown));
    }
    assert_eq!(report.store_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn g10_a_handle_used_after_its_finalize_returns_session_closed() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let session = runtime.register("s", None).await.unwrap();
    let other = runtime.register("other", None).await.unwrap();
    let p = provider([complete(&["x"], 10 * MS), complete(&["y"], 10 * MS)]);
    assert_eq!(
        start(&session, &p).await.outcome().await,
        Outcome::Completed
    );
    assert_eq!(session.finish().await.unwrap(), EndReason::Completed);

    let id = session.id();
    let closed = |r: Result<Handled, RuntimeError>| {
        assert!(
            matches!(&r, Err(RuntimeError::SessionClosed(s)) if *s == id),
            "{r:?}"
        );
    };
    let turn = session
        .run_turn(p.clone(), TurnRequest::prompt("again"))
        .await;
    assert!(matches!(turn, Err(RuntimeError::SessionClosed(s)) if s == id));
    // Using it fails loudly (G10); ending it or letting go of it again is a
    // no-op that says it was already finalized (G2).
    closed(session.hold(Hold::PendingInput).await);
    closed(session.attach_transport(true).await);
    for again in [
        session.release(Hold::PendingInput).await,
        session.detach_transport().await,
        session.cancel_turn().await,
    ] {
        assert_eq!(again.unwrap(), Handled::AlreadyFinalized);
    }
    let finished = session.finish().await;
    assert!(
        matches!(&finished, Err(RuntimeError::AlreadyFinalized(s)) if *s == id),
        "{finished:?}"
    );
    assert!(finished.is_err_and(|e| e.is_session_closed()));
    let delegated = session.delegate(&other).await;
    assert!(matches!(delegated, Err(RuntimeError::SessionClosed(s)) if s == id));
    // Asking again for the end is not a write: it reports it (G2).
    assert_eq!(session.close().await.unwrap(), EndReason::Completed);
    assert_eq!(session.finalized().await.unwrap(), EndReason::Completed);
    assert_eq!(
        session.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::AlreadyFinalized
    );
    // The store refuses a late write to the row the same way, and the row is intact.
    let late = store.append_chunk(id, 1, "late".into()).await;
    assert!(matches!(late, Err(StoreError::SessionClosed(s)) if s == id));
    let d = detail(&store, id).await;
    assert_eq!(d.turns.len(), 1);
    assert_eq!(d.turns[0].text(), "x");
    assert_eq!(runtime.store_failures(), 0);

    runtime.shutdown(Duration::ZERO).await;
    // After the runtime stopped, never a panic or a hang, and the same
    // answers as before (G10): the session is finalized all the same. So is
    // `other`, by the shutdown.
    closed(session.hold(Hold::PendingInput).await);
    assert_eq!(
        session.release(Hold::PendingInput).await.unwrap(),
        Handled::AlreadyFinalized
    );
    assert_eq!(session.close().await.unwrap(), EndReason::Completed);
    for handle in [&session, &other] {
        let turn = handle
            .run_turn(p.clone(), TurnRequest::prompt("late"))
            .await;
        assert!(matches!(&turn, Err(e) if e.is_session_closed()), "{turn:?}");
        let task = handle.spawn(|_| async {}).await;
        assert!(matches!(&task, Err(e) if e.is_session_closed()), "{task:?}");
    }
    assert_eq!(other.close().await.unwrap(), EndReason::Shutdown);
}

#[tokio::test(start_paused = true)]
async fn g10_the_active_session_slot_is_released_at_finalize() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b.slots(Some(1))).await;
    let first = runtime.register("first", None).await.unwrap();
    let second = runtime.register("second", None).await.unwrap();
    let p = provider([
        complete(&["a"], 10 * MS),
        complete(&["b"], 10 * MS),
        complete(&["c"], 10 * MS),
    ]);
    assert_eq!(start(&first, &p).await.outcome().await, Outcome::Completed);
    // The first session keeps its slot between turns, until it is finalized.
    let refused = second.run_turn(p.clone(), TurnRequest::prompt("b")).await;
    assert!(
        matches!(refused, Err(RuntimeError::NoSlot(1))),
        "{refused:?}"
    );
    assert_eq!(start(&first, &p).await.outcome().await, Outcome::Completed);
    assert_eq!(first.finish().await.unwrap(), EndReason::Completed);
    assert_eq!(start(&second, &p).await.outcome().await, Outcome::Completed);
    runtime.shutdown(Duration::ZERO).await;
}

/// A framework that restarts and registers under a parent of its last run
/// (an id it kept): the parent is finalized, in the store, and a kernel
/// that never knew it answers as for any finalized parent, never "not
/// known" for a session that exists; an id that never existed is.
#[tokio::test(start_paused = true)]
async fn g10_a_child_under_a_parent_finalized_in_an_earlier_run_is_refused_session_closed() {
    let store = MemoryStore::new();
    let first = runtime_on(&store, |b| b).await;
    let root = first.register("root", None).await.unwrap();
    assert_eq!(root.finish().await.unwrap(), EndReason::Completed);
    first.shutdown(Duration::ZERO).await;

    let second = runtime_on(&store, |b| b).await;
    match second.register("kid", Some(root.id())).await {
        Err(RuntimeError::SessionClosed(id)) => assert_eq!(id, root.id()),
        other => panic!("a finalized parent, answered {:?}", other.map(|h| h.id())),
    }
    let never = settle_runtime::SessionId(root.id().get() + 1000);
    match second.register("kid", Some(never)).await {
        Err(RuntimeError::Lifecycle(settle_runtime::LifecycleError::UnknownSession(id))) => {
            assert_eq!(id, never)
        }
        other => panic!(
            "a parent that never was, answered {:?}",
            other.map(|h| h.id())
        ),
    }
    second.shutdown(Duration::ZERO).await;
}

/// After a clean stop, a session the stop finalized answers as it did
/// before the stop: `SessionClosed` to a child, a closed handle to a
/// lookup; `Stopped` is for sessions left for recovery.
#[tokio::test(start_paused = true)]
async fn g10_after_a_clean_stop_a_finalized_session_answers_session_closed_not_stopped() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let idle = runtime.register("idle", None).await.unwrap();
    runtime.shutdown(Duration::ZERO).await;
    assert_eq!(idle.finalized().await.unwrap(), EndReason::Shutdown);
    match idle.child("late").await {
        Err(RuntimeError::SessionClosed(id)) => assert_eq!(id, idle.id()),
        other => panic!(
            "a child after the stop, answered {:?}",
            other.map(|h| h.id())
        ),
    }
    let looked_up = runtime.session(idle.id()).await.expect("a closed handle");
    assert!(matches!(
        looked_up.child("late").await,
        Err(RuntimeError::SessionClosed(_))
    ));
}

/// G11: a session name no store keeps (a NUL, which PostgreSQL's text
/// refuses, failing the writes batched with it) is refused before the
/// kernel sees it, on every store alike: nothing registered, nothing
/// evicted at the cap, and the kernel goes on.
#[tokio::test(start_paused = true)]
async fn g11_a_session_name_holding_a_nul_blank_or_too_long_is_refused_before_anything_is_written()
{
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b.lru_cap(Some(1))).await;
    let idle = runtime.register("idle", None).await.unwrap();
    assert!(matches!(
        runtime.register("a\0b", None).await,
        Err(RuntimeError::NulInName)
    ));
    assert!(matches!(
        idle.child("c\0").await,
        Err(RuntimeError::NulInName)
    ));
    // One rule for every frontend (found from outside: Python took a
    // blank name the gateway refuses): not blank, at most 128 characters.
    assert!(matches!(
        runtime.register(" \t", None).await,
        Err(RuntimeError::BlankName)
    ));
    let long = "é".repeat(settle_runtime::MAX_NAME_CHARS + 1);
    assert!(matches!(
        idle.child(long).await,
        Err(RuntimeError::NameTooLong {
            chars: 129,
            max: 128
        })
    ));
    let longest = "é".repeat(settle_runtime::MAX_NAME_CHARS);
    let kept = runtime.register(longest, None).await;
    assert!(kept.is_ok(), "{:?}", kept.map(|s| s.id()));
    assert!(idle.is_closed(), "the longest name registered, at the cap");
    assert_eq!(store.len(), 2);
    runtime.shutdown(Duration::ZERO).await;
}

/// G1 for the end hook (SPEC §4 step 4, `on_session_end`'s doc): a tree's
/// hooks start in the order its sessions were finalized, children first,
/// on a runtime of several workers, where the task spawned last is often
/// the one run first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_a_trees_end_hooks_start_children_first() {
    let store = MemoryStore::new();
    let started: Arc<Mutex<Vec<settle_runtime::SessionId>>> = Arc::default();
    let seen = started.clone();
    let kernel = runtime_on(&store, move |b| {
        b.on_session_end(move |end: SessionEnd| seen.lock().unwrap().push(end.session))
    })
    .await;
    let mut trees = Vec::new();
    for _ in 0..100 {
        let parent = kernel.register("parent", None).await.unwrap();
        let child = kernel.register("child", Some(parent.id())).await.unwrap();
        let grandchild = kernel
            .register("grandchild", Some(child.id()))
            .await
            .unwrap();
        trees.push((parent, child, grandchild));
    }
    for (parent, _, _) in &trees {
        parent.finish().await.unwrap();
    }
    kernel.shutdown(Duration::from_secs(1)).await;

    let started = started.lock().unwrap().clone();
    let at = |id| started.iter().position(|s| *s == id).expect("its hook ran");
    let out_of_order: Vec<_> = trees
        .iter()
        .filter(|(p, c, g)| !(at(g.id()) < at(c.id()) && at(c.id()) < at(p.id())))
        .map(|(p, _, _)| p.id())
        .collect();
    assert!(
        out_of_order.is_empty(),
        "trees whose hooks started parent first: {out_of_order:?}"
    );
}

/// Shuts the kernel down from its own hook once the session named "last"
/// ended, as a program that exits when its root agent is done does; keeps
/// the report and when it came.
struct ShutsDownAfterLast {
    kernel: Arc<std::sync::OnceLock<settle_runtime::Kernel>>,
    answered: Arc<Mutex<Option<(settle_runtime::ShutdownReport, Instant)>>>,
}

#[async_trait]
impl SessionEndHook for ShutsDownAfterLast {
    async fn on_session_end(&self, end: SessionEnd) {
        if end.name != "last" {
            return;
        }
        let Some(kernel) = self.kernel.get() else {
            return;
        };
        let report = kernel.shutdown(Duration::ZERO).await;
        *self.answered.lock().unwrap() = Some((report, Instant::now()));
    }
}

#[tokio::test(start_paused = true)]
async fn g9_a_shutdown_asked_from_an_end_hook_does_not_wait_for_that_hook() {
    let store = MemoryStore::new();
    let kernel = Arc::new(std::sync::OnceLock::new());
    let answered = Arc::new(Mutex::new(None));
    let hook = ShutsDownAfterLast {
        kernel: kernel.clone(),
        answered: answered.clone(),
    };
    let config = Config::default().hook_timeout(Duration::from_secs(5));
    let runtime = runtime_on(&store, |b| b.with_config(config).on_session_end(hook)).await;
    assert!(kernel.set(runtime.clone()).is_ok());
    let other = runtime.register("other", None).await.unwrap();
    let last = runtime.register("last", None).await.unwrap();

    let began = Instant::now();
    assert_eq!(last.finish().await.unwrap(), EndReason::Completed);
    // The program waits for the shutdown its hook began.
    let report = runtime.shutdown(Duration::ZERO).await;
    let took = began.elapsed();
    assert!(took < 100 * MS, "the shutdown took {took:?}");
    assert_eq!(report.hooks_abandoned, 0, "{report:?}");
    assert_eq!(
        detail(&store, other.id()).await.session.end_reason,
        Some(EndReason::Shutdown)
    );
    // The hook's own call was answered with the same report, in time.
    let (from_hook, at) = answered
        .lock()
        .unwrap()
        .clone()
        .expect("the hook's shutdown returned");
    assert!(
        at - began < 100 * MS,
        "the hook's shutdown took {:?}",
        at - began
    );
    assert_eq!(from_hook.hooks_abandoned, 0, "{from_hook:?}");
    assert_eq!(from_hook.finalized, report.finalized);
}
