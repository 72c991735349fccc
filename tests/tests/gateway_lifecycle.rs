//! Transports and reclaims through the gateway, on tokio's paused clock
//! (clients on in-memory pipes, so the clock moves only when every task
//! waits on a timer): a client gone mid-turn leaves the turn running and the
//! orphan reap waits for the grace and the turn's end; a client back within
//! the grace keeps its session; close-on-disconnect closes it once idle; a
//! held session is never reaped; and seed 004's shutdown: the running
//! session drained, the idle ones finalized at once, a finalized one left
//! alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_support::{Client, Served};
use serde_json::json;
use settle_gateway::ScriptBook;
use settle_runtime::{EndReason, Outcome, SessionId, State};
use settle_stream::TurnScript;
use settle_tests::numbered;

const GRACE: Duration = Duration::from_secs(60);

/// "long": ten chunks twenty seconds apart (200 s); "short": three chunks
/// ten seconds apart; anything else: one chunk at once.
fn book() -> Arc<ScriptBook> {
    Arc::new(
        ScriptBook::new()
            .reply(
                "long",
                TurnScript::new(numbered("l", 10)).chunk_delay(Duration::from_secs(20)),
            )
            .reply(
                "short",
                TurnScript::new(numbered("s", 3)).chunk_delay(Duration::from_secs(10)),
            )
            .otherwise(TurnScript::new(["ok"])),
    )
}

async fn served() -> Served {
    Served::pipes(
        book(),
        |k| k.orphan_grace(GRACE).idle_ttl(None),
        |g| g.keepalive(None),
    )
    .await
}

async fn create(client: &mut Client, params: serde_json::Value) -> u64 {
    client.ok("session.create", params).await["id"]
        .as_u64()
        .unwrap()
}

async fn state(served: &Served, id: u64) -> State {
    match served.kernel.session(SessionId(id)).await {
        Ok(handle) => handle.state().await.unwrap(),
        Err(e) if e.is_session_closed() => State::Finalized,
        Err(e) => panic!("{e}"),
    }
}

async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn g3_a_client_gone_mid_turn_leaves_the_turn_running_and_is_reaped_after_the_grace_and_the_turn(
) {
    let mut served = served().await;
    let mut client = served.client().await;
    let id = create(&mut client, json!({ "name": "orphan" })).await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "long" }))
        .await;
    assert_eq!(client.expect("turn.chunk").await["text"], "l1");
    drop(client);

    // Past the grace, the turn still runs: the session is not reaped (G3).
    sleep(GRACE * 2).await;
    assert_eq!(state(&served, id).await, State::Running);
    let handle = served.kernel.session(SessionId(id)).await.unwrap();
    // It is reaped only after its turn's end, at a re-armed grace.
    let reason = handle.finalized().await.unwrap();
    assert_eq!(reason, EndReason::OrphanReap);
    let row = served.row(id).await;
    assert_eq!(row.outcome, Some(Outcome::Completed));
    assert_eq!(row.chunks, 10, "the turn went on without its client");
    served.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn g3_a_client_back_within_the_grace_keeps_its_session() {
    let mut served = served().await;
    let mut client = served.client().await;
    let id = create(&mut client, json!({ "name": "kept" })).await;
    client.close().await;
    sleep(GRACE / 2).await;
    let mut again = served.client().await;
    assert_eq!(
        again.ok("session.attach", json!({ "id": id })).await,
        json!({ "state": "registered" })
    );
    sleep(GRACE * 3).await;
    assert_eq!(state(&served, id).await, State::Registered);
    // Its turns go on as before, to the new connection.
    again
        .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    assert_eq!(again.turn(id).await.0, ["ok"]);
    // Gone again, and this time for good: reaped after the grace.
    drop(again);
    let handle = served.kernel.session(SessionId(id)).await.unwrap();
    assert_eq!(handle.finalized().await.unwrap(), EndReason::OrphanReap);
    served.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn close_on_disconnect_closes_the_session_once_its_turn_has_ended() {
    let mut served = served().await;
    let mut client = served.client().await;
    let id = create(
        &mut client,
        json!({ "name": "tab", "close_on_disconnect": true }),
    )
    .await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "short" }))
        .await;
    assert_eq!(client.expect("turn.chunk").await["text"], "s1");
    drop(client);
    sleep(Duration::from_secs(5)).await;
    assert_eq!(state(&served, id).await, State::Running);
    let handle = served.kernel.session(SessionId(id)).await.unwrap();
    assert_eq!(
        handle.finalized().await.unwrap(),
        EndReason::TransportClosed
    );
    let row = served.row(id).await;
    assert_eq!(row.chunks, 3);
    assert_eq!(row.outcome, Some(Outcome::Completed));
    served.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn g3_a_held_session_is_never_reaped_until_released() {
    let mut served = Served::pipes(
        book(),
        |k| {
            k.orphan_grace(GRACE)
                .idle_ttl(Some(Duration::from_secs(600)))
        },
        |g| g.keepalive(None),
    )
    .await;
    let mut client = served.client().await;
    let id = create(&mut client, json!({ "name": "asking" })).await;
    client
        .ok("session.hold", json!({ "id": id, "hold": "input" }))
        .await;
    drop(client);
    // Past the grace and the idle TTL many times over.
    sleep(Duration::from_secs(4 * 3600)).await;
    assert_eq!(state(&served, id).await, State::Registered);
    // The person answered: released, and with nobody attached it goes.
    let mut again = served.client().await;
    again
        .ok("session.release", json!({ "id": id, "hold": "input" }))
        .await;
    let handle = served.kernel.session(SessionId(id)).await.unwrap();
    let reason = handle.finalized().await.unwrap();
    assert!(
        matches!(reason, EndReason::OrphanReap | EndReason::IdleReap),
        "{reason}"
    );
    served.shut_down().await;
}

/// Seed 004: the shutdown sweep must not finalize a session mid-turn.
#[tokio::test(start_paused = true)]
async fn g9_seed_004_shutdown_drains_the_running_session_finalizes_idle_ones_at_once_and_leaves_a_finalized_one(
) {
    let ends: Arc<Mutex<Vec<(u64, EndReason)>>> = Arc::default();
    let hook = {
        let ends = ends.clone();
        move |end: settle_runtime::SessionEnd| {
            ends.lock().unwrap().push((end.session.get(), end.reason))
        }
    };
    let mut served = Served::pipes(
        book(),
        |k| k.orphan_grace(GRACE).on_session_end(hook),
        |g| g.keepalive(None).drain_timeout(Duration::from_secs(300)),
    )
    .await;
    let mut client = served.client().await;
    let running = create(&mut client, json!({ "name": "running" })).await;
    let idle = create(&mut client, json!({ "name": "idle" })).await;
    let done = create(&mut client, json!({ "name": "done" })).await;
    assert_eq!(
        client.ok("session.close", json!({ "id": done })).await,
        json!({ "end_reason": "user_close" })
    );
    assert_eq!(client.expect("session.finalized").await["id"], done);
    let done_before = served.row(done).await;
    client
        .ok("turn.start", json!({ "id": running, "prompt": "long" }))
        .await;
    assert_eq!(client.expect("turn.chunk").await["text"], "l1");

    served.gateway.shutdown();
    assert_eq!(
        client.expect("server.shutdown").await,
        json!({ "drain_ms": 300_000 })
    );
    // Nothing new starts.
    assert_eq!(
        client
            .refused("session.create", json!({ "name": "late" }))
            .await,
        "shutting_down"
    );
    assert_eq!(
        client
            .refused("turn.start", json!({ "id": idle, "prompt": "hi" }))
            .await,
        "shutting_down"
    );
    // The idle session is finalized at once, before the running turn's next chunk.
    let first = client.next_notification().await.unwrap();
    assert_eq!(first["method"], "session.finalized", "{first}");
    assert_eq!(
        first["params"],
        json!({ "id": idle, "end_reason": "shutdown" })
    );
    // The running one streams to its end, then is finalized.
    let (chunks, ended) = client.turn(running).await;
    assert_eq!(chunks, numbered("l", 10)[1..]);
    assert_eq!(ended["outcome"], "completed");
    assert_eq!(
        client.expect("session.finalized").await,
        json!({ "id": running, "end_reason": "shutdown" })
    );
    // Then the gateway closes the connection, and nothing else was said.
    assert!(client.until_closed().await.is_empty());

    let report = served.finished().await;
    assert_eq!(report.drained, [SessionId(running)]);
    assert!(report.cancelled.is_empty());
    let row = served.row(running).await;
    assert_eq!(row.end_reason, Some(EndReason::Shutdown));
    assert_eq!(row.outcome, Some(Outcome::Completed));
    assert_eq!(row.chunks, 10);
    // The session finalized before was not touched again (G2).
    assert_eq!(served.row(done).await, done_before);
    let mut ends = ends.lock().unwrap().clone();
    ends.sort_unstable();
    assert_eq!(
        ends,
        [
            (running, EndReason::Shutdown),
            (idle, EndReason::Shutdown),
            (done, EndReason::UserClose)
        ]
    );
}

/// A store whose listings never answer (a database gone quiet under a
/// read), every other call the memory store's.
struct QuietListings(settle_store::MemoryStore);

#[async_trait::async_trait]
impl settle_store::SessionStore for QuietListings {
    async fn register_owner(
        &self,
        owner: settle_store::OwnerInfo,
        ttl: Duration,
    ) -> Result<settle_store::OwnerId, settle_store::StoreError> {
        self.0.register_owner(owner, ttl).await
    }
    async fn renew_lease(
        &self,
        owner: settle_store::OwnerId,
        ttl: Duration,
    ) -> Result<std::time::SystemTime, settle_store::StoreError> {
        self.0.renew_lease(owner, ttl).await
    }
    async fn reserve_ids(
        &self,
        count: u32,
    ) -> Result<std::ops::Range<u64>, settle_store::StoreError> {
        self.0.reserve_ids(count).await
    }
    fn append_chunk(
        &self,
        id: SessionId,
        turn: u32,
        chunk: settle_store::NewChunk,
    ) -> settle_store::ChunkReceipt {
        self.0.append_chunk(id, turn, chunk)
    }
    async fn flush(&self) -> Result<(), settle_store::StoreError> {
        self.0.flush().await
    }
    async fn apply(
        &self,
        batch: Vec<settle_store::LifecycleWrite>,
    ) -> Vec<Result<settle_store::Applied, settle_store::StoreError>> {
        self.0.apply(batch).await
    }
    fn applies_in_order(&self) -> bool {
        self.0.applies_in_order()
    }
    async fn recover(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<settle_store::RecoveryReport, settle_store::StoreError> {
        self.0.recover(options).await
    }
    async fn recovery_candidates(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<Vec<settle_store::RecoveryCandidate>, settle_store::StoreError> {
        self.0.recovery_candidates(options).await
    }
    async fn list_sessions(
        &self,
        _: settle_store::SessionFilter,
    ) -> Result<Vec<settle_store::SessionRow>, settle_store::StoreError> {
        std::future::pending().await
    }
    async fn last_session(
        &self,
        state: Option<State>,
    ) -> Result<Option<SessionId>, settle_store::StoreError> {
        self.0.last_session(state).await
    }
    async fn session_detail(
        &self,
        id: SessionId,
    ) -> Result<settle_store::SessionDetail, settle_store::StoreError> {
        self.0.session_detail(id).await
    }
    async fn memories(
        &self,
        id: SessionId,
    ) -> Result<Vec<settle_store::MemoryRow>, settle_store::StoreError> {
        self.0.memories(id).await
    }
}

/// G9 with a read in flight: a `sessions.list` the store never answers
/// does not hold the gateway past its shutdown bound (the drain, the
/// settle timeout, the store's flush and the closing grace), however long
/// the store timeout that bounds the read; the connection is cut at the
/// closing bound like any that does not take its closing frame.
#[tokio::test(start_paused = true)]
async fn g9_a_read_the_store_never_answers_does_not_hold_the_shutdown_past_its_bound() {
    let mut served = Served::pipes_over(
        |store| Arc::new(QuietListings(store)),
        book(),
        |k| k.store_timeout(Duration::from_secs(600)),
        |g| g.keepalive(None).drain_timeout(Duration::ZERO),
    )
    .await;
    let mut client = served.client().await;
    create(&mut client, json!({ "name": "idle" })).await;
    client
        .send_raw(r#"{"jsonrpc":"2.0","id":7,"method":"sessions.list","params":{}}"#)
        .await;
    // The read is in flight.
    sleep(Duration::from_secs(1)).await;
    let began = tokio::time::Instant::now();
    served.shut_down().await;
    let took = began.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the shutdown waited {took:?} for a read (store timeout 600 s)"
    );
}

/// G1 over the wire: a connection attached to a tree hears each session's
/// `session.finalized` after its children's, as they were finalized. Their
/// ends are committed in one batch and wake the watchers of their ends
/// together; on a runtime of two threads those run in parallel, and a
/// parent's notice came first in about a third of the rounds. Many rounds,
/// a tree of three levels with siblings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_a_parents_session_finalized_reaches_a_client_after_its_childrens() {
    let served = Served::pipes(
        book(),
        |k| k.idle_ttl(None),
        |g| g.keepalive(None).requests_per_second(None),
    )
    .await;
    let mut client = served.client().await;
    for round in 0..30 {
        let root = create(&mut client, json!({ "name": "root" })).await;
        let mut edges = Vec::new();
        for name in ["a", "b"] {
            let child = create(&mut client, json!({ "name": name, "parent": root })).await;
            edges.push((child, root));
            for i in 0..2 {
                let params = json!({ "name": format!("{name}{i}"), "parent": child });
                edges.push((create(&mut client, params).await, child));
            }
        }
        client.ok("session.close", json!({ "id": root })).await;
        let mut order = Vec::new();
        while order.len() <= edges.len() {
            let note = client.expect("session.finalized").await;
            order.push(note["id"].as_u64().unwrap());
        }
        let at = |id: u64| order.iter().position(|&o| o == id).unwrap();
        for (child, parent) in edges {
            assert!(
                at(child) < at(parent),
                "round {round}: {parent}'s notice before its child {child}'s: {order:?}"
            );
        }
    }
}
