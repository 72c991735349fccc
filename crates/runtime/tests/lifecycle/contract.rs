//! The defects a review of the first runtime found between the core and its
//! driver, each a test named after the guarantee it broke: the core decides,
//! the driver executes, and nothing waits where it must not.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use settle_runtime::{
    CancelMode, EndReason, Handled, Kernel, LifecycleEvent, Outcome, RuntimeError, SessionEnd,
    TurnErrorKind, TurnRequest,
};
use settle_store::{MemoryStore, SessionId, SessionStore, StoreError};
use settle_stream::{
    EventStream, Provider, ProviderStream, Request, ScriptedEnd, StreamError, TurnScript,
};
use tokio::time::Instant;

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

/// Item 2: a parent whose next turn is refused by the shutdown finishes
/// during the drain; its child's running turn keeps the drain and completes,
/// and every session finalized after the shutdown began ends `shutdown`.
#[tokio::test(start_paused = true)]
async fn g9_a_parent_finishing_during_the_drain_spares_its_childrens_turns() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel.register("root", None).await.unwrap();
    let child = kernel.register("child", Some(root.id())).await.unwrap();
    let root_p = provider([complete(&["r1", "r2"], 300 * MS)]);
    let child_p = provider([TurnScript::new(numbered("c", 8)).chunk_delay(400 * MS)]);
    let mut child_turn = start(&child, &child_p).await;
    let root_turn = start(&root, &root_p).await;

    tokio::time::sleep(450 * MS).await;
    kernel.begin_shutdown(Duration::from_secs(10));
    assert_eq!(root_turn.outcome().await, Outcome::Completed);
    // Its second turn is refused: the agent finishes instead.
    let refused = root
        .run_turn(root_p.clone(), TurnRequest::prompt("again"))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let finishing = {
        let root = root.clone();
        tokio::spawn(async move { root.finish().await })
    };

    let mut chunks = Vec::new();
    while let Some(chunk) = child_turn.next().await {
        chunks.push(chunk.into_payload());
    }
    assert_eq!(chunks, numbered("c", 8), "the child's turn was cut");
    assert_eq!(child_turn.outcome().await, Outcome::Completed);
    assert_eq!(finishing.await.unwrap().unwrap(), EndReason::Shutdown);
    assert_eq!(child.finalized().await.unwrap(), EndReason::Shutdown);
    let report = kernel.shutdown(Duration::ZERO).await;
    // Both turns that were running when the shutdown began ended on their own.
    assert_eq!(report.drained, vec![root.id(), child.id()], "{report:?}");
    assert!(report.cancelled.is_empty(), "{report:?}");
    for id in [root.id(), child.id()] {
        let d = detail(&store, id).await;
        assert_eq!(d.session.end_reason, Some(EndReason::Shutdown));
    }
    assert_eq!(detail(&store, child.id()).await.turns[0].chunks.len(), 8);
}

/// Item 3: `finish` after `cancel_turn` while the cut turn is still closing
/// records it `cancelled`, commits no memory, and tells the end hook so.
#[tokio::test(start_paused = true)]
async fn g7_finish_after_cancel_turn_records_the_cut_turn_cancelled() {
    let store = MemoryStore::new();
    let ends: Arc<Mutex<Vec<SessionEnd>>> = Arc::default();
    let hook = {
        let ends = ends.clone();
        move |end: SessionEnd| ends.lock().unwrap().push(end)
    };
    let kernel = runtime_on(&store, |b| b.on_session_end(hook)).await;
    let session = kernel.register("agent", None).await.unwrap();
    let p = provider([complete(&["a", "b", "c"], 100 * MS).close_delay(500 * MS)]);
    let mut turn = start(&session, &p).await;
    assert_eq!(read_chunks(&mut turn, 1).await, vec!["a".to_owned()]);

    applied(session.cancel_turn().await);
    assert_eq!(session.finish().await.unwrap(), EndReason::Cancelled);
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    kernel.shutdown(Duration::ZERO).await;

    let d = detail(&store, session.id()).await;
    assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled));
    assert_eq!(d.session.end_reason, Some(EndReason::Cancelled));
    assert!(store.memories(session.id()).await.unwrap().is_empty());
    let ends = ends.lock().unwrap();
    assert_eq!(ends.len(), 1);
    assert!(!ends[0].completed && ends[0].interrupted, "{:?}", ends[0]);
}

/// A provider whose `open` panics, or whose stream panics mid-way.
struct Panicking {
    in_open: bool,
    closed: Arc<Mutex<usize>>,
}

struct PanicStream {
    closed: Arc<Mutex<usize>>,
    polled: bool,
}

impl futures_util::Stream for PanicStream {
    type Item = Result<settle_stream::StreamEvent, StreamError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if !self.polled {
            self.polled = true;
            return std::task::Poll::Ready(Some(Ok(settle_stream::StreamEvent::Chunk(
                "before the panic".into(),
            ))));
        }
        panic!("the provider's stream broke");
    }
}

impl settle_stream::Close for PanicStream {
    fn close_now(&mut self) -> Result<(), settle_stream::CloseError> {
        *self.closed.lock().unwrap() += 1;
        Ok(())
    }
}

#[async_trait]
impl Provider for Panicking {
    async fn open(&self, _: &Request) -> Result<ProviderStream, StreamError> {
        if self.in_open {
            panic!("the provider could not open");
        }
        let stream: Box<dyn EventStream> = Box::new(PanicStream {
            closed: self.closed.clone(),
            polled: false,
        });
        Ok(stream)
    }
}

/// Item 4: a panic in the provider ends the turn `failed` with the panic's
/// message, closes the stream it had opened (G4), and the session goes on.
#[tokio::test(start_paused = true)]
async fn g4_a_provider_that_panics_ends_its_turn_failed_and_closed() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    for in_open in [true, false] {
        let closed = Arc::new(Mutex::new(0));
        let provider = Arc::new(Panicking {
            in_open,
            closed: closed.clone(),
        });
        let turn = session
            .run_turn(provider, TurnRequest::prompt("go"))
            .await
            .unwrap();
        let result = tokio::time::timeout(Duration::from_secs(60), turn.result())
            .await
            .expect("the turn ended");
        let error = result.expect_err("the turn failed");
        assert_eq!(error.kind, TurnErrorKind::Panic);
        let expected = if in_open {
            "the provider could not open"
        } else {
            "the provider's stream broke"
        };
        assert!(error.message.contains(expected), "{error:?}");
        settle_tasks().await;
        assert_eq!(
            *closed.lock().unwrap(),
            usize::from(!in_open),
            "closed once if opened"
        );
    }
    // The session is still usable: the panics were the turns', not the kernel's.
    let p = provider([complete(&["fine"], 10 * MS)]);
    assert_eq!(
        start(&session, &p).await.outcome().await,
        Outcome::Completed
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// Item 6: commands arriving without pause cannot push a settle deadline
/// past its bound: the driver compares the deadline with the clock itself.
#[tokio::test(start_paused = true)]
async fn g5_a_steady_stream_of_commands_does_not_delay_a_detach() {
    let store = MemoryStore::new();
    let settle = 500 * MS;
    let kernel = runtime_on(&store, |b| b.settle_timeout(settle)).await;
    let busy = kernel.register("busy", None).await.unwrap();
    let stuck = kernel.register("stuck", None).await.unwrap();
    let p = provider([TurnScript::new(numbered("c", 100))
        .chunk_delay(10 * MS)
        .end(ScriptedEnd::IgnoreCancel)]);
    let mut turn = start(&stuck, &p).await;
    read_chunks(&mut turn, 1).await;
    let mut events = stuck.subscribe();

    let cancelled_at = Instant::now();
    applied(stuck.cancel(CancelMode::Immediate).await);
    let mut detached_at = None;
    for _ in 0..2_000 {
        tokio::time::advance(MS / 2).await;
        // A command on every step, answered before the next.
        let _ = busy.hold(settle_runtime::Hold::PendingInput).await.unwrap();
        let seen = drain(&mut events);
        if seen
            .iter()
            .any(|e| matches!(e, LifecycleEvent::Detached { .. }))
        {
            detached_at = Some(Instant::now());
            break;
        }
    }
    let waited = detached_at
        .expect("the work was detached")
        .duration_since(cancelled_at);
    assert!(waited >= settle && waited <= settle + 5 * MS, "{waited:?}");
    assert_eq!(turn.outcome().await, Outcome::Detached);
    kernel.shutdown(Duration::ZERO).await;
}

/// A store whose registering batches wait while `stall` is set.
#[derive(Clone)]
struct Stalling {
    inner: MemoryStore,
    stall: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl SessionStore for Stalling {
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
    /// A batch that registers a session waits while `stall` is set.
    async fn apply(
        &self,
        batch: Vec<settle_store::LifecycleWrite>,
    ) -> Vec<Result<settle_store::Applied, StoreError>> {
        let registers = batch
            .iter()
            .any(|w| matches!(w, settle_store::LifecycleWrite::Register(_)));
        while registers && self.stall.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(MS).await;
        }
        self.inner.apply(batch).await
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
    async fn last_session(
        &self,
        state: Option<settle_store::State>,
    ) -> Result<Option<SessionId>, StoreError> {
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
}

/// Item 7: a registration whose row the store does not write stalls nothing
/// else (a settle deadline fires on time meanwhile), fails with a clear
/// error at the store timeout, and is withdrawn from the core.
#[tokio::test(start_paused = true)]
async fn g5_a_stalled_registration_stalls_nothing_else() {
    let store = Stalling {
        inner: MemoryStore::new(),
        stall: Arc::default(),
    };
    let settle = 500 * MS;
    let store_timeout = Duration::from_secs(10);
    let kernel = Kernel::builder(Arc::new(store.clone()))
        .idle_timeout(None)
        .settle_timeout(settle)
        .store_timeout(store_timeout)
        .start()
        .await
        .unwrap();
    let stuck = kernel.register("stuck", None).await.unwrap();
    let p = provider([TurnScript::new(numbered("c", 100))
        .chunk_delay(10 * MS)
        .end(ScriptedEnd::IgnoreCancel)]);
    let mut turn = start(&stuck, &p).await;
    read_chunks(&mut turn, 1).await;

    let mut events = stuck.subscribe();
    store.stall.store(true, std::sync::atomic::Ordering::SeqCst);
    let registering = {
        let kernel = kernel.clone();
        tokio::spawn(async move { kernel.register("late", None).await })
    };
    settle_tasks().await;
    let cancelled_at = Instant::now();
    applied(stuck.cancel(CancelMode::Immediate).await);
    // The driver detaches on time; only the store's writes queue behind the
    // stalled one (they are ordered), and those are bounded by the timeout.
    loop {
        match events.recv().await.unwrap() {
            LifecycleEvent::Detached { .. } => break,
            _ => continue,
        }
    }
    let waited = cancelled_at.elapsed();
    assert!(
        waited <= settle + 5 * MS,
        "the detach waited for the store: {waited:?}"
    );
    assert_eq!(turn.outcome().await, Outcome::Detached);

    let failed = registering.await.unwrap();
    assert!(
        matches!(failed, Err(RuntimeError::StoreTimeout { after, .. }) if after == store_timeout),
        "{failed:?}"
    );
    // Withdrawn: the core holds nothing for it (and `stuck`, cancelled, is
    // finalized and forgotten).
    let tracked = kernel.tracked().await.unwrap();
    assert_eq!(tracked.core_sessions, 0, "{tracked:?}");
    store
        .stall
        .store(false, std::sync::atomic::Ordering::SeqCst);
    kernel.shutdown(Duration::ZERO).await;
}

/// A registration its caller gave up on before it was answered (a timeout
/// around it, its task aborted) is ended once it is made: nobody can hold
/// its session, so it is cancelled as an abandoned one is, not left live
/// for the process's life holding a place (G3).
#[tokio::test(start_paused = true)]
async fn g3_a_registration_given_up_by_its_caller_is_not_left_live() {
    let store = Stalling {
        inner: MemoryStore::new(),
        stall: Arc::default(),
    };
    let kernel = Kernel::builder(Arc::new(store.clone()))
        .idle_timeout(None)
        .lru_cap(None)
        .start()
        .await
        .unwrap();
    store.stall.store(true, std::sync::atomic::Ordering::SeqCst);
    let given_up = tokio::time::timeout(10 * MS, kernel.register("late", None)).await;
    assert!(given_up.is_err(), "{given_up:?}");
    store
        .stall
        .store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(100 * MS).await;
    settle_tasks().await;
    let tracked = kernel.tracked().await.unwrap();
    assert_eq!(tracked.core_sessions, 0, "{tracked:?}");
    let rows = store
        .inner
        .list_sessions(settle_store::SessionFilter::default())
        .await
        .unwrap();
    let ends: Vec<_> = rows.iter().map(|r| (r.state, r.end_reason)).collect();
    assert_eq!(
        ends,
        vec![(settle_store::State::Finalized, Some(EndReason::Cancelled))]
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// Item 8: a slow end hook does not delay anything the recorder does after
/// it: another session's turn starts and streams at once.
#[tokio::test(start_paused = true)]
async fn g9_a_slow_end_hook_delays_no_later_write() {
    let store = MemoryStore::new();
    struct Slow;
    #[async_trait]
    impl settle_runtime::SessionEndHook for Slow {
        async fn on_session_end(&self, _: SessionEnd) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    }
    let kernel = runtime_on(&store, |b| {
        b.on_session_end(Slow).hook_timeout(Duration::from_secs(60))
    })
    .await;
    let first = kernel.register("first", None).await.unwrap();
    let second = kernel.register("second", None).await.unwrap();
    assert_eq!(first.finish().await.unwrap(), EndReason::Completed);

    let began = Instant::now();
    let p = provider([complete(&["now"], MS)]);
    let mut turn = start(&second, &p).await;
    assert_eq!(read_chunks(&mut turn, 1).await, vec!["now".to_owned()]);
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// Item 9: a long-lived kernel forgets what it finalized.
#[tokio::test(start_paused = true)]
async fn g2_a_kernel_holds_nothing_for_finalized_sessions() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel.register("root", None).await.unwrap();
    let p = provider((0..200).map(|_| complete(&["x"], MS)));
    for i in 0..200 {
        let s = kernel
            .register(format!("s{i}"), Some(root.id()))
            .await
            .unwrap();
        assert_eq!(start(&s, &p).await.outcome().await, Outcome::Completed);
        assert_eq!(s.finish().await.unwrap(), EndReason::Completed);
        // A finished handle still answers from what it shares with the kernel.
        assert_eq!(s.finalized().await.unwrap(), EndReason::Completed);
    }
    let tracked = kernel.tracked().await.unwrap();
    assert_eq!(tracked.core_sessions, 1, "{tracked:?}");
    assert_eq!(tracked.sessions, 1, "{tracked:?}");
    assert_eq!(tracked.works, 0, "{tracked:?}");
    // And a forgotten session still answers as finalized (G2, G10).
    let gone = settle_store::SessionId(root.id().0 + 1);
    let handle = kernel.session(gone).await.unwrap();
    assert!(handle.is_closed());
    assert_eq!(
        handle.state().await.unwrap(),
        settle_runtime::State::Finalized
    );
    assert_eq!(handle.close().await.unwrap(), EndReason::Completed);
    assert_eq!(
        handle.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::AlreadyFinalized
    );
    let refused = handle
        .run_turn(p.clone(), TurnRequest::prompt("more"))
        .await;
    assert!(
        matches!(refused, Err(RuntimeError::SessionClosed(id)) if id == gone),
        "{refused:?}"
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// A handle asked for a session that is live in the store but another
/// process's (a live one, or one that crashed and left it for recovery)
/// says so, never "not known; register it": the row is there, and what
/// the caller can do about it is recover it, or reach its owner.
#[tokio::test(start_paused = true)]
async fn g10_a_session_live_in_another_process_is_named_so_not_unknown() {
    let store = MemoryStore::new();
    let owner = runtime_on(&store, |b| b).await;
    let theirs = owner.register("theirs", None).await.unwrap();
    let other = runtime_on(&store, |b| b).await;
    let asked = other.session(theirs.id()).await.map(|h| h.id());
    match asked {
        Err(RuntimeError::LiveElsewhere { session, state }) => {
            assert_eq!(session, theirs.id());
            assert_eq!(state, settle_runtime::State::Registered);
        }
        other => panic!("not named as another process's: {other:?}"),
    }
    let never = settle_store::SessionId(theirs.id().0 + 1_000_000);
    assert!(
        matches!(
            other.session(never).await.map(|h| h.id()),
            Err(RuntimeError::Lifecycle(settle_core::Error::UnknownSession(id))) if id == never
        ),
        "a session the store has not is still unknown"
    );
    other.shutdown(Duration::ZERO).await;
    owner.shutdown(Duration::ZERO).await;
}

/// Item 11: durations too long to represent mean "never" and panic nothing.
#[tokio::test(start_paused = true)]
async fn g5_durations_too_long_to_represent_mean_never() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| {
        b.settle_timeout(Duration::MAX)
            .idle_timeout(Some(Duration::MAX))
            .idle_ttl(Some(Duration::MAX))
            .orphan_grace(Duration::MAX)
            .drain_timeout(Duration::MAX)
    })
    .await;
    let session = kernel.register("agent", None).await.unwrap();
    applied(session.attach_transport(false).await);
    applied(session.detach_transport().await);
    let p = provider([complete(&["a", "b"], 10 * MS)]);
    let mut turn = start(&session, &p).await;
    read_chunks(&mut turn, 1).await;
    applied(session.cancel_turn().await);
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    kernel.begin_shutdown(Duration::MAX);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    kernel.skip_drain();
    let report = kernel.shutdown(Duration::MAX).await;
    assert_eq!(
        report.finalized,
        vec![(session.id(), EndReason::Shutdown)],
        "{report:?}"
    );
}

/// Item 12: a signal watcher holds only a weak kernel: dropping every handle
/// still shuts the kernel down, and its sessions are finalized.
#[tokio::test(start_paused = true)]
async fn g9_dropping_every_handle_shuts_down_despite_the_signal_watcher() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let watcher = settle_runtime::signals::shutdown_on_signals(&kernel, Duration::ZERO).unwrap();
    let watcher = tokio::spawn(watcher);
    let session = kernel.register("agent", None).await.unwrap();
    let id = session.id();
    drop(session);
    drop(kernel);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let d = detail(&store, id).await;
    assert_eq!(d.session.end_reason, Some(EndReason::Shutdown));
    assert!(!watcher.is_finished());
    watcher.abort();
}

/// The core forgets a finalized session; its handle still answers as the
/// core would: closing again reports the end reason, a cancel says it was
/// already finalized (G2).
#[tokio::test(start_paused = true)]
async fn g2_a_handle_on_a_forgotten_session_says_already_finalized() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    assert_eq!(session.close().await.unwrap(), EndReason::UserClose);
    assert_eq!(session.close().await.unwrap(), EndReason::UserClose);
    assert_eq!(
        session.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::AlreadyFinalized
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// A frontend asks a session's state from the core (the store may lag):
/// running while its turn is in flight, registered after, finalized once
/// closed; and the list of sessions reads the store's rows.
#[tokio::test(start_paused = true)]
async fn a_session_state_comes_from_the_core_and_the_list_from_the_store() {
    use settle_runtime::State;
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    assert_eq!(session.state().await.unwrap(), State::Registered);
    let p = provider([hang(&["a"], MS)]);
    let mut turn = start(&session, &p).await;
    assert_eq!(read_chunks(&mut turn, 1).await, ["a"]);
    assert_eq!(session.state().await.unwrap(), State::Running);
    turn.cancel();
    let _ = turn.outcome().await;
    assert_eq!(session.state().await.unwrap(), State::Registered);
    assert_eq!(session.close().await.unwrap(), EndReason::UserClose);
    assert_eq!(session.state().await.unwrap(), State::Finalized);
    let rows = kernel.list_sessions(None).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].end_reason, Some(EndReason::UserClose));
    let detail = kernel.session_detail(session.id()).await.unwrap();
    assert_eq!(detail.turns.len(), 1);
    kernel.shutdown(Duration::ZERO).await;
}
