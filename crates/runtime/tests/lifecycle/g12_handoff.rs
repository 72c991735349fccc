//! A fleet of two kernels on one database file (SPEC §12, G12): a handoff
//! releases the sessions instead of finalizing them, the other kernel adopts
//! one with its history and turn count, and the first never writes it again.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use settle_runtime::{
    EndReason, Handled, Hold, Kernel, KernelBuilder, Outcome, RuntimeError, SessionId, State,
    TurnRequest,
};
use settle_store::{SessionStore, Store, StoreError, Whereabouts};
use settle_stream::{Message, Role};

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

async fn node(store: &Arc<dyn SessionStore>, url: &str) -> Kernel {
    tuned_node(store, url, |b| b).await
}

/// A kernel on `store` reached at `url`, tuned by `tune`.
async fn tuned_node(
    store: &Arc<dyn SessionStore>,
    url: &str,
    tune: impl FnOnce(KernelBuilder) -> KernelBuilder,
) -> Kernel {
    tune(Kernel::builder(store.clone()).idle_timeout(None))
        .advertise(Some(url.to_owned()))
        .start()
        .await
        .expect("the runtime starts")
}

fn texts(history: &[Message]) -> Vec<(Role, String)> {
    history
        .iter()
        .map(|m| (m.role, m.content.clone()))
        .collect()
}

#[tokio::test]
async fn g12_a_handoff_releases_sessions_and_another_kernel_adopts_one_with_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn SessionStore> = Arc::new(Store::open(path.to_str().unwrap()).unwrap());
    let a = node(&store, "ws://a/ws").await;
    let b = node(&store, "ws://b/ws").await;

    let idle = a.register("idle", None).await.unwrap();
    let busy = a.register("busy", None).await.unwrap();
    let script = provider([
        complete(&["hello", " there"], MS),
        complete(&["slow"], 50 * MS),
    ]);
    let first = idle
        .run_turn(script.clone(), TurnRequest::prompt("hi"))
        .await
        .unwrap();
    assert_eq!(first.outcome().await, Outcome::Completed);
    let running = busy
        .run_turn(script.clone(), TurnRequest::prompt("go"))
        .await
        .unwrap();
    assert_eq!(
        store.locate(idle.id()).await.unwrap(),
        Whereabouts::Owned {
            owner: a.owner(),
            advertise: Some("ws://a/ws".into()),
            live: true
        }
    );

    // The running turn keeps the drain; then both are released, none finalized.
    let report = a.handoff(Duration::from_secs(5)).await;
    assert_eq!(running.outcome().await, Outcome::Completed);
    assert!(report.handoff);
    assert!(report.finalized.is_empty(), "{report:?}");
    let mut released = report.released.clone();
    released.sort_unstable();
    assert_eq!(released, vec![idle.id(), busy.id()]);
    assert_eq!(
        store.locate(idle.id()).await.unwrap(),
        Whereabouts::Released
    );
    assert!(matches!(
        idle.run_turn(script.clone(), TurnRequest::prompt("more"))
            .await,
        Err(RuntimeError::Lifecycle(settle_core::Error::HandedOff(_)) | RuntimeError::Stopped)
    ));

    // The other kernel adopts it: the history comes along, turns go on.
    let adoption = b.adopt(idle.id()).await.unwrap();
    assert_eq!(adoption.turns, 1);
    assert_eq!(
        texts(&adoption.history),
        vec![
            (Role::User, "hi".into()),
            (Role::Assistant, "hello there".into())
        ]
    );
    let next = provider([complete(&["again"], MS)]);
    let mut messages = adoption.history.clone();
    messages.push(Message::new(Role::User, "and now?"));
    let turn = adoption
        .session
        .run_turn(next, TurnRequest::new(messages))
        .await
        .unwrap();
    assert_eq!(turn.work().no, 2);
    assert_eq!(turn.outcome().await, Outcome::Completed);
    // Adopting it again answers where it is.
    let again = a_second_try(&store, idle.id()).await;
    assert!(
        matches!(again, Err(StoreError::Elsewhere { advertise: Some(ref url), .. }) if url == "ws://b/ws"),
        "{again:?}"
    );
    assert_eq!(
        adoption.session.close().await.unwrap(),
        EndReason::UserClose
    );
    let detail = store.session_detail(idle.id()).await.unwrap();
    assert_eq!(detail.session.end_reason, Some(EndReason::UserClose));
    assert_eq!(detail.turns.len(), 2);
    let causes: Vec<&str> = detail.timeline.iter().map(|t| t.cause.as_str()).collect();
    assert!(
        causes.contains(&"handoff") && causes.contains(&"adopted"),
        "{causes:?}"
    );
    assert_eq!(
        store.session_detail(busy.id()).await.unwrap().session.state,
        State::Registered
    );
    b.shutdown(Duration::ZERO).await;
}

/// Another process racing for the same session: a third owner.
async fn a_second_try(store: &Arc<dyn SessionStore>, id: SessionId) -> Result<(), StoreError> {
    let other = store
        .register_owner(
            settle_store::OwnerInfo::this_process(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    store
        .adopt(other, id, std::time::SystemTime::now())
        .await
        .map(|_| ())
}

#[tokio::test]
async fn g1_a_tree_moves_whole_so_closing_an_adopted_parent_winds_its_child_down_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn SessionStore> = Arc::new(Store::open(path.to_str().unwrap()).unwrap());
    let a = node(&store, "ws://a/ws").await;
    let b = node(&store, "ws://b/ws").await;
    let c = node(&store, "ws://c/ws").await;

    let parent = a.register("parent", None).await.unwrap();
    let child = parent.child("child").await.unwrap();
    let grandchild = child.child("grandchild").await.unwrap();
    let report = a.handoff(Duration::from_secs(5)).await;
    assert_eq!(report.released.len(), 3, "{report:?}");

    // Adopting the child takes its whole tree: the parent and the
    // grandchild are this process's too, so no other process can take the
    // parent and finalize it while the child lives here (G1).
    let adoption = b.adopt(child.id()).await.unwrap();
    let mut moved: Vec<SessionId> = adoption.with.iter().map(|a| a.session.id()).collect();
    moved.sort_unstable();
    assert_eq!(moved, vec![parent.id(), grandchild.id()]);
    for id in [parent.id(), child.id(), grandchild.id()] {
        assert!(
            matches!(store.locate(id).await.unwrap(), Whereabouts::Owned { owner, .. } if owner == b.owner()),
            "{id} is not b's"
        );
    }
    let taken = c.adopt(parent.id()).await;
    assert!(
        matches!(&taken, Err(RuntimeError::Store(StoreError::Elsewhere { advertise: Some(url), .. })) if url == "ws://b/ws"),
        "{:?}",
        taken.map(|a| a.session.id())
    );

    // The child runs a turn; closing the parent here cancels it and
    // finalizes the child and the grandchild before the parent.
    let script = provider([hang(&["thinking"], MS)]);
    let turn = adoption
        .session
        .run_turn(script, TurnRequest::prompt("go"))
        .await
        .unwrap();
    let adopted_parent = adoption
        .with
        .iter()
        .find(|a| a.session.id() == parent.id())
        .unwrap();
    assert_eq!(
        adopted_parent.session.close().await.unwrap(),
        EndReason::UserClose
    );
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    let at = |id: SessionId| {
        let store = store.clone();
        async move {
            let detail = store.session_detail(id).await.unwrap();
            assert_eq!(detail.session.state, State::Finalized, "{id}");
            detail.session.finalized_at.unwrap()
        }
    };
    let (p, k, g) = (
        at(parent.id()).await,
        at(child.id()).await,
        at(grandchild.id()).await,
    );
    assert!(
        g <= k && k <= p,
        "finalized out of order: {g:?} {k:?} {p:?}"
    );
    b.shutdown(Duration::ZERO).await;
    c.shutdown(Duration::ZERO).await;
}

/// A store whose adoptions commit only after `delay` (a row lock held by
/// an operator's `SELECT … FOR UPDATE`, a writer queue behind a stall);
/// whose first `adopts_refused` adoptions fail before they are written,
/// and whose first `releases_unanswered` releases are committed but answer
/// a failure, as one on a pooled connection a database restart killed.
struct SlowAdopt {
    inner: Store,
    delay: Duration,
    adopts_refused: AtomicU32,
    releases_unanswered: AtomicU32,
    /// How many sessions each release call was asked to release, in order.
    release_calls: std::sync::Mutex<Vec<usize>>,
}

impl SlowAdopt {
    fn new(inner: Store, delay: Duration) -> Self {
        SlowAdopt {
            inner,
            delay,
            adopts_refused: AtomicU32::new(0),
            releases_unanswered: AtomicU32::new(0),
            release_calls: Default::default(),
        }
    }
}

/// Takes one of `left` if any is left.
fn one_of(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait::async_trait]
impl SessionStore for SlowAdopt {
    async fn register_owner(
        &self,
        owner: settle_store::OwnerInfo,
        ttl: Duration,
    ) -> Result<settle_store::OwnerId, StoreError> {
        self.inner.register_owner(owner, ttl).await
    }
    async fn renew_lease(
        &self,
        owner: settle_store::OwnerId,
        ttl: Duration,
    ) -> Result<std::time::SystemTime, StoreError> {
        self.inner.renew_lease(owner, ttl).await
    }
    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        self.inner.reserve_ids(count).await
    }
    fn append_chunk(
        &self,
        id: SessionId,
        turn: u32,
        chunk: settle_store::NewChunk,
    ) -> settle_store::ChunkReceipt {
        self.inner.append_chunk(id, turn, chunk)
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
    async fn apply(
        &self,
        batch: Vec<settle_store::LifecycleWrite>,
    ) -> Vec<Result<settle_store::Applied, StoreError>> {
        self.inner.apply(batch).await
    }
    fn applies_in_order(&self) -> bool {
        self.inner.applies_in_order()
    }
    async fn recover(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<settle_store::RecoveryReport, StoreError> {
        self.inner.recover(options).await
    }
    async fn recovery_candidates(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<Vec<settle_store::RecoveryCandidate>, StoreError> {
        self.inner.recovery_candidates(options).await
    }
    async fn list_sessions(
        &self,
        filter: settle_store::SessionFilter,
    ) -> Result<Vec<settle_store::SessionRow>, StoreError> {
        self.inner.list_sessions(filter).await
    }
    async fn last_session(&self, state: Option<State>) -> Result<Option<SessionId>, StoreError> {
        self.inner.last_session(state).await
    }
    async fn session_detail(
        &self,
        id: SessionId,
    ) -> Result<settle_store::SessionDetail, StoreError> {
        self.inner.session_detail(id).await
    }
    async fn memories(&self, id: SessionId) -> Result<Vec<settle_store::MemoryRow>, StoreError> {
        self.inner.memories(id).await
    }
    async fn apply_as(
        &self,
        writer: settle_store::OwnerId,
        batch: Vec<settle_store::LifecycleWrite>,
    ) -> Vec<Result<settle_store::Applied, StoreError>> {
        self.inner.apply_as(writer, batch).await
    }
    async fn release_all(
        &self,
        owner: settle_store::OwnerId,
        sessions: Vec<settle_store::Release>,
    ) -> Vec<Result<(), StoreError>> {
        self.release_calls.lock().unwrap().push(sessions.len());
        if self.releases_unanswered.load(Ordering::SeqCst) == 0 {
            return self.inner.release_all(owner, sessions).await;
        }
        let mut results = Vec::new();
        for one in sessions {
            results.push(self.release(owner, one.session, one.holds, one.at).await);
        }
        results
    }
    async fn release(
        &self,
        owner: settle_store::OwnerId,
        session: SessionId,
        holds: settle_core::Holds,
        at: std::time::SystemTime,
    ) -> Result<(), StoreError> {
        let released = self.inner.release(owner, session, holds, at).await;
        match released.is_ok() && one_of(&self.releases_unanswered) {
            true => Err(StoreError::Unavailable),
            false => released,
        }
    }
    async fn adopt(
        &self,
        owner: settle_store::OwnerId,
        session: SessionId,
        at: std::time::SystemTime,
    ) -> Result<settle_store::Adopted, StoreError> {
        tokio::time::sleep(self.delay).await;
        if one_of(&self.adopts_refused) {
            return Err(StoreError::Unavailable);
        }
        self.inner.adopt(owner, session, at).await
    }
    async fn locate(&self, session: SessionId) -> Result<Whereabouts, StoreError> {
        self.inner.locate(session).await
    }
    async fn principal(&self, session: SessionId) -> Result<Option<String>, StoreError> {
        self.inner.principal(session).await
    }
}

#[tokio::test]
async fn g12_an_adoption_the_store_commits_after_its_timeout_is_released_again_not_left_unreachable(
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let plain: Arc<dyn SessionStore> = Arc::new(store.clone());
    let a = node(&plain, "ws://a/ws").await;
    let idle = a.register("idle", None).await.unwrap();
    a.handoff(Duration::from_secs(5)).await;

    let slow: Arc<dyn SessionStore> = Arc::new(SlowAdopt::new(store, 300 * MS));
    let b = tuned_node(&slow, "ws://b/ws", |b| b.store_timeout(100 * MS)).await;
    let gave_up = b.adopt(idle.id()).await;
    assert!(
        matches!(gave_up, Err(RuntimeError::StoreTimeout { .. })),
        "{:?}",
        gave_up.map(|a| a.session.id())
    );
    // The store commits the adoption later, and it is given back: another
    // process can adopt the session, instead of finding it b's for as long
    // as b lives while b's kernel never took it on.
    let c = node(&plain, "ws://c/ws").await;
    // Past the late commit.
    tokio::time::sleep(500 * MS).await;
    let mut adopted = None;
    for _ in 0..50 {
        tokio::time::sleep(50 * MS).await;
        if let Ok(a) = c.adopt(idle.id()).await {
            adopted = Some(a);
            break;
        }
    }
    let adopted = adopted.expect("the session was left owned by the process that gave up");
    assert_eq!(adopted.session.id(), idle.id());
    b.shutdown(Duration::ZERO).await;
    c.shutdown(Duration::ZERO).await;
}

/// A database restart shortly before a redeploy: the release of an idle
/// session at the handoff fails once, though it was committed (its answer
/// lost with the connection), and the first adoption after it fails before
/// it is written. Both are tried again, as every lifecycle write is: the
/// session is handed off, not left owned by the process that exits (for
/// its lease to run out, or for `settle recover`), and adopted on the first
/// ask.
#[tokio::test]
async fn g12_a_release_or_an_adoption_the_store_fails_once_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let flaky = Arc::new(SlowAdopt::new(store, Duration::ZERO));
    flaky.releases_unanswered.store(1, Ordering::SeqCst);
    flaky.adopts_refused.store(1, Ordering::SeqCst);
    let shared: Arc<dyn SessionStore> = flaky.clone();
    let a = node(&shared, "ws://a/ws").await;
    let idle = a.register("idle", None).await.unwrap();
    let report = a.handoff(Duration::from_secs(5)).await;
    assert_eq!(report.released, [idle.id()], "{report:?}");
    assert!(report.left_recoverable.is_empty(), "{report:?}");
    assert_eq!(flaky.releases_unanswered.load(Ordering::SeqCst), 0);

    let b = node(&shared, "ws://b/ws").await;
    let adopted = b.adopt(idle.id()).await.expect("adopted on the first ask");
    assert_eq!(adopted.session.id(), idle.id());
    assert_eq!(flaky.adopts_refused.load(Ordering::SeqCst), 0);
    b.shutdown(Duration::ZERO).await;
}

/// A handoff of many idle sessions releases them in one store call (one
/// transaction on the database store), not one transaction a session, and
/// each is adopted elsewhere as one released alone is.
#[tokio::test]
async fn g12_a_handoff_releases_its_idle_sessions_in_one_store_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let counted = Arc::new(SlowAdopt::new(store, Duration::ZERO));
    let shared: Arc<dyn SessionStore> = counted.clone();
    let a = node(&shared, "ws://a/ws").await;
    let mut idle = Vec::new();
    for i in 0..50 {
        idle.push(a.register(format!("idle-{i}"), None).await.unwrap().id());
    }
    let report = a.handoff(Duration::from_secs(5)).await;
    let mut released = report.released.clone();
    released.sort_unstable();
    assert_eq!(released, idle, "{report:?}");
    assert!(report.left_recoverable.is_empty(), "{report:?}");
    assert_eq!(*counted.release_calls.lock().unwrap(), [50]);
    let b = node(&shared, "ws://b/ws").await;
    for &id in &idle {
        assert_eq!(b.adopt(id).await.unwrap().session.id(), id);
    }
    b.shutdown(Duration::ZERO).await;
}

/// G3 across a handoff: a session that waits on a person is released with
/// its hold, and no automatic path takes it, neither the fleet's reap of
/// released sessions nor the adopter's own reclaims (here its LRU cap),
/// until its new owner ends the hold.
#[tokio::test]
async fn g3_g12_a_held_session_is_handed_off_held_and_no_reclaim_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn SessionStore> = Arc::new(Store::open(path.to_str().unwrap()).unwrap());
    let a = node(&store, "ws://a/ws").await;
    let held = a.register("asks a person", None).await.unwrap();
    let idle = a.register("idle", None).await.unwrap();
    assert_eq!(
        held.hold(Hold::PendingInput).await.unwrap(),
        Handled::Applied
    );
    // Held and idle, it goes at once, with its hold.
    let report = a.handoff(200 * MS).await;
    assert!(report.finalized.is_empty(), "{report:?}");
    assert!(report.released.contains(&held.id()), "{report:?}");

    let b = tuned_node(&store, "ws://b/ws", |b| b.lru_cap(Some(1))).await;
    // Released and due, but held: the fleet reaps only the idle one.
    let sweep = b.sweep_fleet(Some(Duration::ZERO)).await.unwrap();
    assert_eq!(sweep.reaped, vec![idle.id()]);
    assert_eq!(
        store.locate(held.id()).await.unwrap(),
        Whereabouts::Released
    );

    assert_adopted_held(&b, &store, held.id()).await;
    b.shutdown(Duration::ZERO).await;
}

/// An adopted session is in its recorded principal's scope: at the cap, a
/// registration of another principal does not evict it, one of its own
/// principal's does.
#[tokio::test]
async fn g3_g12_an_adopted_session_is_evicted_only_for_its_own_principal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn SessionStore> = Arc::new(Store::open(path.to_str().unwrap()).unwrap());
    let a = node(&store, "ws://a/ws").await;
    let hers = a
        .register_in(a.scope_of(Some("alice")), "hers", None)
        .await
        .unwrap();
    store
        .set_principal(hers.id(), Some("alice".to_owned()))
        .await
        .unwrap();
    let report = a.handoff(200 * MS).await;
    assert!(report.released.contains(&hers.id()), "{report:?}");

    let b = tuned_node(&store, "ws://b/ws", |b| b.lru_cap(Some(1))).await;
    let adoption = b.adopt(hers.id()).await.unwrap();
    assert_eq!(adoption.principal.as_deref(), Some("alice"));
    for refused in [
        b.register_in(b.scope_of(Some("bob")), "his", None).await,
        b.register("nobody's", None).await,
    ] {
        assert!(
            matches!(
                refused,
                Err(RuntimeError::Lifecycle(settle_core::Error::OverCapacity {
                    cap: 1
                }))
            ),
            "{:?}",
            refused.map(|s| s.id())
        );
    }
    let _next = b
        .register_in(b.scope_of(Some("alice")), "hers too", None)
        .await
        .unwrap();
    assert_eq!(
        adoption.session.finalized().await.unwrap(),
        EndReason::LruEvict
    );
    b.shutdown(Duration::ZERO).await;
}

/// `b` (an LRU cap of one) adopts `held`, released with one input hold:
/// held, it fills the cap and nothing may be evicted; once its new owner
/// ends the hold, it is an idle session like any other.
async fn assert_adopted_held(b: &Kernel, store: &Arc<dyn SessionStore>, held: SessionId) {
    let adoption = b.adopt(held).await.unwrap();
    assert_eq!(adoption.holds.pending_input, 1);
    let refused = b.register("newcomer", None).await.map(|s| s.id());
    assert!(
        matches!(
            refused,
            Err(RuntimeError::Lifecycle(settle_core::Error::OverCapacity {
                cap: 1
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(
        store.session_detail(held).await.unwrap().session.state,
        State::Registered
    );
    assert_eq!(
        adoption.session.release(Hold::PendingInput).await.unwrap(),
        Handled::Applied
    );
    let _next = b.register("next", None).await.unwrap();
    assert_eq!(
        adoption.session.finalized().await.unwrap(),
        EndReason::LruEvict
    );
}

/// G3 across a crash (SPEC §5): a held session's holds are recorded as they
/// change, so when its owner dies (here: its lease expires in the store and
/// it renews no more) the live process that releases its sessions leaves
/// the held one to no reap, and adopts it held.
#[tokio::test]
async fn g3_g12_a_crashed_owners_held_session_is_adopted_held_and_no_reclaim_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn SessionStore> = Arc::new(Store::open(path.to_str().unwrap()).unwrap());
    // An hour's lease: it renews no more within the test once expired below.
    let a = tuned_node(&store, "ws://a/ws", |b| {
        b.lease_ttl(Duration::from_secs(3600))
    })
    .await;
    let held = a.register("asks a person", None).await.unwrap();
    let idle = a.register("idle", None).await.unwrap();
    assert_eq!(
        held.hold(Hold::PendingInput).await.unwrap(),
        Handled::Applied
    );
    // Records reach the store in order: once this registration is
    // written, so is the hold.
    let _after = a.register("after", None).await.unwrap();
    // The owner dies: its lease runs out, and it writes nothing more.
    store.renew_lease(a.owner(), Duration::ZERO).await.unwrap();

    let b = tuned_node(&store, "ws://b/ws", |b| b.lru_cap(Some(1))).await;
    let sweep = b.sweep_fleet(Some(Duration::ZERO)).await.unwrap();
    assert!(sweep.released.contains(&held.id()), "{sweep:?}");
    assert!(sweep.reaped.contains(&idle.id()), "{sweep:?}");
    assert!(!sweep.reaped.contains(&held.id()), "reaped held: {sweep:?}");
    assert_eq!(
        store.locate(held.id()).await.unwrap(),
        Whereabouts::Released
    );
    // Held in b too, as after a handoff.
    assert_adopted_held(&b, &store, held.id()).await;
    b.shutdown(Duration::ZERO).await;
}

/// G1, G12: a tree moves whole, or not at all. Adopted onto a kernel with
/// room for its parent but not its child (an LRU cap: an adoption evicts
/// nothing), the parent was taken and the child released again, so the
/// child could be adopted elsewhere under a parent this kernel owned, and
/// the parent, taken but never served, was left to no one. Now the whole
/// tree is released again, and a kernel with room takes it whole.
#[tokio::test]
async fn g1_g12_a_tree_refused_in_part_is_taken_by_no_one_and_released_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn SessionStore> = Arc::new(Store::open(path.to_str().unwrap()).unwrap());
    let a = node(&store, "ws://a/ws").await;
    let parent = a.register("parent", None).await.unwrap();
    let child = parent.child("child").await.unwrap();
    let report = a.handoff(200 * MS).await;
    assert_eq!(report.released.len(), 2, "{report:?}");

    let b = tuned_node(&store, "ws://b/ws", |b| b.lru_cap(Some(1))).await;
    let refused = b.adopt(child.id()).await;
    assert!(
        matches!(
            refused,
            Err(RuntimeError::Lifecycle(settle_core::Error::NoRoomToAdopt {
                cap: 1
            }))
        ),
        "{:?}",
        refused.map(|a| a.session.id())
    );
    for id in [parent.id(), child.id()] {
        assert_eq!(
            store.locate(id).await.unwrap(),
            Whereabouts::Released,
            "{id} was kept by the kernel that refused its tree"
        );
    }
    // B keeps nothing of it: its one place is free for a session of its own.
    let own = b.register("own", None).await;
    assert!(own.is_ok(), "{:?}", own.map(|s| s.id()));

    let c = node(&store, "ws://c/ws").await;
    let adoption = c.adopt(child.id()).await.unwrap();
    let moved: Vec<SessionId> = adoption.with.iter().map(|a| a.session.id()).collect();
    assert_eq!(moved, vec![parent.id()]);
    let report = b.shutdown(Duration::ZERO).await;
    assert!(report.left_recoverable.is_empty(), "{report:?}");
    assert_eq!(b.store_failures(), 0, "B wrote what it no longer owned");
    c.shutdown(Duration::ZERO).await;
    let causes: Vec<String> = store
        .session_detail(parent.id())
        .await
        .unwrap()
        .timeline
        .iter()
        .map(|t| t.cause.clone())
        .collect();
    // B's adoption and its release again are in the timeline, as any.
    assert_eq!(
        causes,
        [
            "registered",
            "handoff",
            "adopted",
            "handoff",
            "adopted",
            "finalized: shutdown"
        ]
    );
}
