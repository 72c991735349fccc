//! The gateway's answers fit its frames, whatever a client sends or a model
//! streams, over 127.0.0.1 with real WebSocket clients: an error quotes a
//! bounded excerpt of a huge request; `sessions.list` pages; a chunk larger
//! than a frame arrives in parts; a client that comes back reads what it
//! missed from the store; a cap of held sessions refuses a new one instead
//! of evicting it at birth; the per-principal and per-turn limits refuse
//! with their kinds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::sync::Arc;

use gateway_support::{Client, Served};
use serde_json::{json, Value};
use settle_gateway::ScriptBook;
use settle_stream::TurnScript;

fn book() -> Arc<ScriptBook> {
    Arc::new(ScriptBook::new().otherwise(TurnScript::new(["fine"])))
}

async fn create(client: &mut Client, name: &str) -> u64 {
    client.ok("session.create", json!({ "name": name })).await["id"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn an_error_quotes_a_bounded_excerpt_of_a_huge_request_and_the_connection_stays_usable() {
    let mut served = Served::tcp(book(), |k| k, |g| g).await;
    let mut client = served.client().await;
    // About 900 KB of quotes: each one escaped twice over in an echo.
    let huge = "\"".repeat(450_000);
    let cases = [
        ("turn.start", json!({ "id": huge, "prompt": "hi" })),
        ("session.create", json!({ "name": "a", huge.clone(): 1 })),
        (huge.as_str(), json!({})),
    ];
    for (method, params) in cases {
        let error = client.call(method, params).await.unwrap_err();
        assert_eq!(
            error["data"]["kind"],
            "bad_request",
            "{}",
            &error.to_string()[..200]
        );
        let message = error["message"].as_str().unwrap();
        assert!(
            message.chars().count() <= 700,
            "a message of {} characters",
            message.chars().count()
        );
        assert!(message.contains("characters in all"), "{message}");
    }
    // Still answered on the same connection.
    let id = create(&mut client, "after").await;
    assert!(id > 0);
    served.shut_down().await;
}

#[tokio::test]
async fn g3_a_create_over_a_cap_of_held_sessions_is_refused_over_capacity_and_writes_nothing() {
    let mut served = Served::tcp(
        book(),
        |k| k.lru_cap(Some(3)),
        |g| g.drain_timeout(std::time::Duration::from_millis(50)),
    )
    .await;
    let mut client = served.client().await;
    let mut held = Vec::new();
    for name in ["a", "b", "c"] {
        let id = create(&mut client, name).await;
        client
            .ok("session.hold", json!({ "id": id, "hold": "input" }))
            .await;
        held.push(id);
    }
    for _ in 0..3 {
        let error = client
            .call("session.create", json!({ "name": "late" }))
            .await
            .unwrap_err();
        assert_eq!(error["data"]["kind"], "over_capacity", "{error}");
        assert_eq!(error["code"], -32005);
    }
    let rows = served.kernel.list_sessions(None).await.unwrap();
    assert_eq!(rows.len(), 3, "a refused create wrote a row");
    assert!(rows.iter().all(|r| r.end_reason.is_none()), "{rows:?}");
    assert!(client.held().is_empty(), "{:?}", client.held());

    // Released, the oldest is evicted for the next one; the new one lives.
    client
        .ok("session.release", json!({ "id": held[0], "hold": "input" }))
        .await;
    let fresh = create(&mut client, "fresh").await;
    let finalized = client.expect("session.finalized").await;
    assert_eq!(
        finalized,
        json!({ "id": held[0], "end_reason": "lru_evict" })
    );
    assert_eq!(
        client.ok("session.attach", json!({ "id": fresh })).await,
        json!({ "state": "registered" })
    );
    client
        .ok("turn.start", json!({ "id": fresh, "prompt": "hi" }))
        .await;
    let (_, ended) = client.turn(fresh).await;
    assert_eq!(ended["outcome"], "completed");
    served.shut_down().await;
}
