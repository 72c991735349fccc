//! The gateway's protocol over 127.0.0.1 with real WebSocket clients: bad
//! input refused with its documented kind and nothing written; the history
//! sent with each prompt; several clients on one session; a slow client cut
//! off without holding back the turn or the others; the LRU cap; the list.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_support::{Client, Served};
use serde_json::{json, Value};
use settle_gateway::ScriptBook;
use settle_stream::{Provider, ProviderStream, Request, ScriptedEnd, StreamError, TurnScript};
use settle_tests::numbered;

/// The messages of each request, as (role, content).
type Requests = Arc<Mutex<Vec<Vec<(String, String)>>>>;

/// A provider that records the messages of every request it is sent.
struct Recording {
    book: ScriptBook,
    seen: Requests,
}

#[async_trait::async_trait]
impl Provider for Recording {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        let messages = request
            .messages
            .iter()
            .map(|m| (m.role.as_str().to_owned(), m.content.clone()))
            .collect();
        self.seen.lock().unwrap().push(messages);
        self.book.open(request).await
    }
}

fn book() -> Arc<ScriptBook> {
    Arc::new(
        ScriptBook::new()
            .otherwise(TurnScript::new(["fine"]))
            .reply("hang", TurnScript::new(["waiting"]).end(ScriptedEnd::Hang)),
    )
}

async fn create(client: &mut Client, name: &str) -> u64 {
    client.ok("session.create", json!({ "name": name })).await["id"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn g11_bad_input_gets_its_kind_the_connection_stays_usable_and_nothing_is_written() {
    let mut served = Served::tcp(book(), |k| k, |g| g).await;
    let mut client = served.client().await;
    let closed = create(&mut client, "closed").await;
    assert_eq!(
        client.ok("session.close", json!({ "id": closed })).await,
        json!({ "end_reason": "user_close" })
    );
    assert_eq!(
        client.expect("session.finalized").await["end_reason"],
        "user_close"
    );
    let before = served.kernel.list_sessions(None).await.unwrap();

    // Malformed JSON, and what is not a JSON-RPC 2.0 request: answered with id null.
    for (frame, code) in [
        ("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\"", -32700),
        (
            "[{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"sessions.list\"}]",
            -32600,
        ),
        ("\"session.create\"", -32600),
        // A key twice: a proxy reading the first value and a reader keeping
        // the last would act on different requests; refused whole.
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"sessions.list\", \
             \"method\": \"session.create\", \"params\": {\"name\": \"twice\"}}",
            -32700,
        ),
    ] {
        client.send_raw(frame).await;
        let error = client.answer_to(&Value::Null).await.unwrap_err();
        assert_eq!(error["code"], code, "{frame}: {error}");
        assert_eq!(error["data"]["kind"], "bad_request", "{frame}");
    }
    // An unknown method, wrong params: bad_request, to the request's id.
    assert_eq!(
        client.refused("session.explode", json!({})).await,
        "bad_request"
    );
    for (method, params) in [
        ("session.create", json!({})),
        ("session.create", json!({ "name": "" })),
        (
            "session.create",
            json!({ "name": "a", "close_on_disconect": true }),
        ),
        ("session.attach", json!({ "id": "one" })),
        ("turn.start", json!({ "id": closed })),
        ("session.hold", json!({ "id": closed, "hold": "lunch" })),
        ("sessions.list", json!({ "state": "sleeping" })),
        ("session.create", json!(["positional"])),
    ] {
        assert_eq!(
            client.refused(method, params.clone()).await,
            "bad_request",
            "{method} {params}"
        );
    }
    // An id no session has: not_found, whatever the method.
    for method in [
        "session.attach",
        "turn.start",
        "turn.cancel",
        "session.hold",
        "session.close",
    ] {
        let params = match method {
            "turn.start" => json!({ "id": 999, "prompt": "x" }),
            "session.hold" => json!({ "id": 999, "hold": "input" }),
            _ => json!({ "id": 999 }),
        };
        assert_eq!(
            client.refused(method, params).await,
            "not_found",
            "{method}"
        );
    }
    assert_eq!(
        client
            .refused("session.create", json!({ "name": "child", "parent": 999 }))
            .await,
        "not_found"
    );
    // A closed session takes no turn, hold or transport, nor children.
    assert_eq!(
        client
            .refused("turn.start", json!({ "id": closed, "prompt": "x" }))
            .await,
        "session_closed"
    );
    assert_eq!(
        client
            .refused("session.hold", json!({ "id": closed, "hold": "input" }))
            .await,
        "session_closed"
    );
    assert_eq!(
        client
            .refused("session.attach", json!({ "id": closed }))
            .await,
        "session_closed"
    );
    assert_eq!(
        client
            .refused(
                "session.create",
                json!({ "name": "child", "parent": closed })
            )
            .await,
        "session_closed"
    );
    // Closing it again reports how it ended (G2).
    assert_eq!(
        client.ok("session.close", json!({ "id": closed })).await,
        json!({ "end_reason": "user_close" })
    );

    // Nothing was written.
    let after = served.kernel.list_sessions(None).await.unwrap();
    assert_eq!(before, after);
    // The connection is still usable.
    let id = create(&mut client, "after").await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "hello" }))
        .await;
    let (chunks, ended) = client.turn(id).await;
    assert_eq!(chunks, ["fine"]);
    assert_eq!(ended["outcome"], "completed");
    served.shut_down().await;
}

#[tokio::test]
async fn a_second_turn_is_refused_while_one_is_in_flight_and_the_history_goes_with_each_prompt() {
    let seen: Requests = Arc::default();
    let provider = Arc::new(Recording {
        book: ScriptBook::new()
            .reply("first", TurnScript::new(["one", " reply"]))
            .reply("second", TurnScript::new(["two"]))
            .reply("hang", TurnScript::new(["..."]).end(ScriptedEnd::Hang)),
        seen: seen.clone(),
    });
    let mut served = Served::tcp(provider, |k| k, |g| g).await;
    let mut client = served.client().await;
    let id = create(&mut client, "chat").await;
    assert_eq!(
        client
            .ok("turn.start", json!({ "id": id, "prompt": "first" }))
            .await,
        json!({ "turn": 1 })
    );
    assert_eq!(client.turn(id).await.0, ["one", " reply"]);
    assert_eq!(
        client
            .ok("turn.start", json!({ "id": id, "prompt": "second" }))
            .await,
        json!({ "turn": 2 })
    );
    client.turn(id).await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "hang" }))
        .await;
    assert_eq!(client.expect("turn.chunk").await["text"], "...");
    assert_eq!(
        client
            .refused("turn.start", json!({ "id": id, "prompt": "again" }))
            .await,
        "wrong_state"
    );
    assert_eq!(
        client.ok("turn.cancel", json!({ "id": id })).await,
        json!({})
    );
    let ended = client.expect("turn.ended").await;
    assert_eq!(ended["outcome"], "cancelled");
    assert_eq!(ended["error"], Value::Null);

    let pair = |role: &str, text: &str| (role.to_owned(), text.to_owned());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0], [pair("user", "first")]);
    assert_eq!(
        seen[1],
        [
            pair("user", "first"),
            pair("assistant", "one reply"),
            pair("user", "second")
        ]
    );
    assert_eq!(seen[2].len(), 5, "{:?}", seen[2]);
    served.shut_down().await;
}

/// A user's "stop, then the next message": `turn.cancel` answers once the
/// turn has ended, so a `turn.start` sent as soon as it answers is taken,
/// even when the cancelled stream takes a while to close.
#[tokio::test]
async fn a_turn_start_right_after_turn_cancel_answers_is_taken() {
    let book = ScriptBook::new()
        .reply(
            "slow to stop",
            TurnScript::new(["..."])
                .end(ScriptedEnd::Hang)
                .close_delay(std::time::Duration::from_millis(300)),
        )
        .reply("next", TurnScript::new(["fine"]));
    let mut served = Served::tcp(Arc::new(book), |k| k, |g| g).await;
    let mut client = served.client().await;
    let id = create(&mut client, "chat").await;
    for round in 0..3 {
        client
            .ok("turn.start", json!({ "id": id, "prompt": "slow to stop" }))
            .await;
        assert_eq!(client.expect("turn.chunk").await["text"], "...", "{round}");
        assert_eq!(
            client.ok("turn.cancel", json!({ "id": id })).await,
            json!({})
        );
        client
            .ok("turn.start", json!({ "id": id, "prompt": "next" }))
            .await;
        let ended = client.expect("turn.ended").await;
        assert_eq!(ended["outcome"], "cancelled", "{round}: {ended}");
        assert_eq!(client.turn(id).await.0, ["fine"], "{round}");
    }
    served.shut_down().await;
}

#[tokio::test]
async fn two_clients_on_one_session_each_receive_every_chunk_in_order() {
    let chunks = numbered("c", 200);
    let provider = Arc::new(
        ScriptBook::new()
            .otherwise(TurnScript::new(chunks.clone()).chunk_delay(Duration::from_micros(200))),
    );
    let mut served = Served::tcp(provider, |k| k, |g| g).await;
    let mut first = served.client().await;
    let mut second = served.client().await;
    let id = create(&mut first, "shared").await;
    assert_eq!(
        second.ok("session.attach", json!({ "id": id })).await,
        json!({ "state": "registered" })
    );
    first
        .ok("turn.start", json!({ "id": id, "prompt": "go" }))
        .await;
    let (a, ended_a) = first.turn(id).await;
    let (b, ended_b) = second.turn(id).await;
    assert_eq!(a, chunks);
    assert_eq!(b, chunks);
    assert_eq!(ended_a, ended_b);
    assert_eq!(ended_a["turn"], 1);
    // A detached client is sent nothing more.
    assert_eq!(
        second.ok("session.detach", json!({ "id": id })).await,
        json!({ "state": "registered" })
    );
    first.ok("session.close", json!({ "id": id })).await;
    assert_eq!(
        first.expect("session.finalized").await["end_reason"],
        "user_close"
    );
    // Anything sent to it before this answer would be held, in order.
    second.ok("sessions.list", json!({})).await;
    assert!(second.held().is_empty(), "{:?}", second.held());
    served.shut_down().await;
}

#[tokio::test]
async fn a_slow_client_is_cut_off_and_detached_without_holding_back_the_turn_or_the_other() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let big = "x".repeat(8 * 1024);
    let chunks: Vec<String> = (0..1000).map(|i| format!("{i:04}{big}")).collect();
    // 8 MB at a chunk a millisecond: more than the socket buffers and the
    // slow client's queue hold, at a pace a reading client keeps up with.
    let provider = Arc::new(
        ScriptBook::new()
            .otherwise(TurnScript::new(chunks.clone()).chunk_delay(Duration::from_millis(1))),
    );
    let mut served = Served::tcp(provider, |k| k, |g| g.queue_frames(64)).await;
    let gateway_support::Address::Tcp(addr) = served.address.clone() else {
        unreachable!()
    };
    // The slow client: a small receive buffer, and it stops reading once it
    // has its session's id.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut slow, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), stream)
        .await
        .unwrap();
    let create = json!({"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {"name": "watched"}});
    slow.send(Message::text(create.to_string())).await.unwrap();
    let answer: Value =
        serde_json::from_str(slow.next().await.unwrap().unwrap().to_text().unwrap()).unwrap();
    let id = answer["result"]["id"].as_u64().unwrap();

    let mut fast = served.client().await;
    fast.ok("session.attach", json!({ "id": id })).await;
    assert_eq!(served.gateway.connections(), 2);
    fast.ok("turn.start", json!({ "id": id, "prompt": "go" }))
        .await;
    // The fast client gets the whole turn while the slow one reads nothing.
    let (got, ended) = fast.turn(id).await;
    assert_eq!(got.len(), chunks.len());
    assert!(got == chunks);
    assert_eq!(ended["outcome"], "completed");
    // The slow one was cut off: what it can still read ends before the turn does.
    let mut read = 0;
    while let Some(Ok(frame)) = slow.next().await {
        if let Message::Text(text) = frame {
            let message: Value = serde_json::from_str(text.as_str()).unwrap();
            assert_ne!(
                message["method"], "turn.ended",
                "the slow client was not cut off"
            );
            read += 1;
        }
    }
    assert!(read < chunks.len(), "it read {read} chunks");
    gateway_support::eventually(
        "the slow connection to be gone",
        Duration::from_millis(10),
        || {
            let gateway = served.gateway.clone();
            async move { gateway.connections() == 1 }
        },
    )
    .await;
    // Its transport is detached; the fast client's keeps the session.
    assert_eq!(
        fast.ok("session.attach", json!({ "id": id })).await,
        json!({ "state": "registered" })
    );
    served.shut_down().await;
}

/// The notifications up to `n` `session.finalized`, skipping turn
/// notifications: the finalized ids with their end reasons.
async fn finalized(client: &mut Client, n: usize) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let message = client.next_notification().await.expect("closed");
        if message["method"] == "session.finalized" {
            let params = &message["params"];
            seen.push((
                params["id"].as_u64().unwrap(),
                params["end_reason"].as_str().unwrap().to_owned(),
            ));
        }
    }
    seen
}

#[tokio::test]
async fn g3_max_sessions_evicts_the_least_recently_active_idle_session_never_a_running_or_held_one()
{
    let mut served = Served::tcp(book(), |k| k.lru_cap(Some(4)), |g| g).await;
    let mut client = served.client().await;
    let oldest = create(&mut client, "oldest").await;
    let active = create(&mut client, "active").await;
    let held = create(&mut client, "held").await;
    client
        .ok("session.hold", json!({ "id": held, "hold": "input" }))
        .await;
    let running = create(&mut client, "running").await;
    client
        .ok("turn.start", json!({ "id": running, "prompt": "hang" }))
        .await;
    // A turn makes "active" more recently active than "oldest".
    client
        .ok("turn.start", json!({ "id": active, "prompt": "hi" }))
        .await;
    let mut ended = 0;
    while ended < 1 {
        let message = client.next_notification().await.unwrap();
        if message["method"] == "turn.ended" {
            assert_eq!(message["params"]["id"], active);
            ended += 1;
        }
    }
    let fifth = create(&mut client, "fifth").await;
    assert_eq!(
        finalized(&mut client, 1).await,
        [(oldest, "lru_evict".to_owned())]
    );
    create(&mut client, "sixth").await;
    assert_eq!(
        finalized(&mut client, 1).await,
        [(active, "lru_evict".to_owned())]
    );
    create(&mut client, "seventh").await;
    assert_eq!(
        finalized(&mut client, 1).await,
        [(fifth, "lru_evict".to_owned())]
    );
    // The held one and the running one were never taken.
    assert_eq!(
        client.ok("session.attach", json!({ "id": held })).await,
        json!({ "state": "registered" })
    );
    assert_eq!(
        client.ok("session.attach", json!({ "id": running })).await,
        json!({ "state": "running" })
    );
    served.shut_down().await;
}

#[tokio::test]
async fn sessions_list_gives_the_rows_of_settle_sessions_json_and_healthz_answers() {
    let mut served = Served::tcp(book(), |k| k, |g| g).await;
    let mut client = served.client().await;
    let root = create(&mut client, "root").await;
    let child = client
        .ok("session.create", json!({ "name": "child", "parent": root }))
        .await["id"]
        .as_u64()
        .unwrap();
    client
        .ok("turn.start", json!({ "id": child, "prompt": "hi" }))
        .await;
    client.turn(child).await;
    client.ok("session.close", json!({ "id": child })).await;
    let page = client.ok("sessions.list", json!({})).await;
    assert_eq!(page["next_cursor"], Value::Null);
    let rows = page["sessions"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(settle_tests::keys(row), settle_tests::SESSION_KEYS);
    }
    let child_row = rows.iter().find(|r| r["id"] == child).unwrap();
    assert_eq!(child_row["parent"], root);
    assert_eq!(child_row["state"], "finalized");
    assert_eq!(child_row["end_reason"], "user_close");
    assert_eq!(child_row["outcome"], "completed");
    assert_eq!(child_row["turns"], 1);
    assert_eq!(child_row["chunks"], 1);
    let open = client
        .ok("sessions.list", json!({ "state": "registered" }))
        .await;
    let open: Vec<u64> = open["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(open, [root]);

    let gateway_support::Address::Tcp(addr) = served.address.clone() else {
        unreachable!()
    };
    let health = |addr| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        answer
    };
    let answer = health(addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");
    served.shut_down().await;
}
