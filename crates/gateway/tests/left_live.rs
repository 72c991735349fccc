//! What a gateway says of a session another process left live in its store
//! (G8): a process that crashed, or lost its lease, leaves its sessions'
//! rows live until `settle recover` ends them, and a gateway started again
//! on the same database lists them. Such a session is read from the store
//! like any other, and every method that needs it served here says why it
//! is not and what ends it: never `not_found` for a session the list shows.
//! Another principal's is `not_found` still, as a session that does not
//! exist.
//!
//! Two kernels on one in-memory store: the first, which registered the
//! sessions and is never asked again, stands for the process that stopped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use settle_gateway::{Gateway, ScriptBook, Tokens};
use settle_runtime::Kernel;
use settle_store::MemoryStore;
use settle_stream::TurnScript;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for a frame: only a hang trips it.
const PATIENCE: Duration = Duration::from_secs(30);

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";

/// A gateway serving in the background over `store`, with the tokens of
/// alice and bob, or none.
struct Served {
    gateway: Gateway,
    url: String,
}

impl Served {
    async fn start(store: &MemoryStore, tokens: bool) -> Served {
        let kernel = Kernel::builder(Arc::new(store.clone()))
            .start()
            .await
            .unwrap();
        let provider = Arc::new(ScriptBook::new().otherwise(TurnScript::new(["left", " behind"])));
        let mut builder =
            Gateway::builder(kernel, provider).drain_timeout(Duration::from_millis(100));
        if tokens {
            builder =
                builder.tokens(Tokens::parse(&format!("alice {ALICE}\nbob {BOB}\n")).unwrap());
        }
        let gateway = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/ws", listener.local_addr().unwrap());
        tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.serve(listener).await }
        });
        Served { gateway, url }
    }

    async fn client(&self, token: Option<&str>) -> Client {
        let mut request = self.url.as_str().into_client_request().unwrap();
        if let Some(token) = token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        Client { ws, next_id: 0 }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.gateway.shutdown();
    }
}

struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Client {
    /// The next message; `None` once the connection ended.
    async fn message(&mut self) -> Option<Value> {
        loop {
            let next = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("a frame within the patience");
            match next {
                Some(Ok(Message::Text(text))) => return Some(serde_json::from_str(&text).unwrap()),
                Some(Ok(Message::Close(_)) | Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Calls `method`; its answer, whole.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ws
            .send(Message::text(request.to_string()))
            .await
            .unwrap();
        loop {
            let message = self
                .message()
                .await
                .unwrap_or_else(|| panic!("the connection ended before {method} was answered"));
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    async fn ok(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call(method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    async fn expect(&mut self, method: &str) -> Value {
        loop {
            let message = self.message().await.expect("the connection is open");
            if message["method"] == method {
                return message["params"].clone();
            }
        }
    }
}

/// The process that stopped: its gateway, and the client of its sessions.
/// Kept while a test runs, never asked again.
struct Stopped {
    _served: Served,
    _client: Client,
}

/// Sessions of the process that stopped, made by `token`'s principal:
/// one whose turn streamed two chunks, and one that ran nothing.
async fn left_by_a_stopped_process(
    store: &MemoryStore,
    token: Option<&str>,
) -> (Stopped, u64, u64) {
    let stopped = Served::start(store, token.is_some()).await;
    let mut client = stopped.client(token).await;
    let streamed = client
        .ok("session.create", json!({"name": "streamed"}))
        .await["id"]
        .as_u64()
        .unwrap();
    client
        .ok("turn.start", json!({"id": streamed, "prompt": "go"}))
        .await;
    let ended = client.expect("turn.ended").await;
    assert_eq!(ended["outcome"], "completed", "{ended}");
    let idle = client.ok("session.create", json!({"name": "idle"})).await["id"]
        .as_u64()
        .unwrap();
    // Its process stops serving them without ending them: their rows stay
    // live, owned by it and by no other process. (Its kernel runs on,
    // never asked again, its client attached; a crash leaves the same
    // rows.)
    let stopped = Stopped {
        _served: stopped,
        _client: client,
    };
    (stopped, streamed, idle)
}

/// The methods that need a session served by this process, for `id`.
fn served_methods(id: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("session.attach", json!({"id": id})),
        ("session.detach", json!({"id": id})),
        ("turn.start", json!({"id": id, "prompt": "again"})),
        ("turn.cancel", json!({"id": id})),
        ("session.hold", json!({"id": id, "hold": "input"})),
        ("session.release", json!({"id": id, "hold": "input"})),
        ("session.close", json!({"id": id})),
        ("session.create", json!({"name": "child", "parent": id})),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_session_a_stopped_process_left_live_is_read_and_said_left_for_recovery_never_not_found(
) {
    let store = MemoryStore::new();
    let (_stopped, streamed, idle) = left_by_a_stopped_process(&store, None).await;
    let restarted = Served::start(&store, false).await;
    let mut client = restarted.client(None).await;

    // Listed, live: the stopped process never ended them.
    let listed = client.ok("sessions.list", json!({})).await;
    let rows = listed["sessions"].as_array().unwrap();
    let ids: Vec<u64> = rows.iter().map(|row| row["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [streamed, idle], "{listed}");
    assert!(
        rows.iter().all(|row| row["state"] != "finalized"),
        "{listed}"
    );

    // What it streamed is read from the store (G7), as for any session.
    let read = client.ok("session.read", json!({"id": streamed})).await;
    assert_eq!(read["turns"], 1, "{read}");
    assert_eq!(read["outcome"], "completed", "{read}");
    let texts: Vec<&str> = read["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|chunk| chunk["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["left", " behind"], "{read}");
    let read = client.ok("session.read", json!({"id": idle})).await;
    assert_eq!(read["turns"], 0, "{read}");

    // Whatever needs it served here says why it is not, and what ends it.
    for id in [streamed, idle] {
        for (method, params) in served_methods(id) {
            let answer = client.call(method, params).await;
            let error = &answer["error"];
            assert_eq!(
                error["data"]["kind"], "left_for_recovery",
                "{method}: {answer}"
            );
            assert_eq!(error["code"], -32009, "{method}: {answer}");
            let message = error["message"].as_str().unwrap();
            assert!(message.contains(&format!("session {id} ")), "{message}");
            assert!(message.contains("settle recover"), "{message}");
            assert!(message.contains("session.read"), "{message}");
            assert!(!message.contains("see sessions.list"), "{message}");
        }
    }
    // An id nobody has is still not_found.
    let unknown = client.call("session.attach", json!({"id": 999})).await;
    assert_eq!(unknown["error"]["data"]["kind"], "not_found", "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_another_principals_stopped_process_left_live_is_not_found_as_one_that_does_not_exist(
) {
    let store = MemoryStore::new();
    let (_stopped, streamed, _) = left_by_a_stopped_process(&store, Some(ALICE)).await;
    let restarted = Served::start(&store, true).await;
    let mut alice = restarted.client(Some(ALICE)).await;
    let mut bob = restarted.client(Some(BOB)).await;

    // Alice's own: read, and said left for recovery.
    alice.ok("session.read", json!({"id": streamed})).await;
    let attached = alice.call("session.attach", json!({"id": streamed})).await;
    assert_eq!(
        attached["error"]["data"]["kind"], "left_for_recovery",
        "{attached}"
    );

    // To bob it does not exist: every answer is the one for an id nobody
    // has, the echoed id aside.
    let listed = bob.ok("sessions.list", json!({})).await;
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let nobodys = 999;
    let mut methods = served_methods(streamed);
    methods.push(("session.read", json!({"id": streamed})));
    let mut unknown = served_methods(nobodys);
    unknown.push(("session.read", json!({"id": nobodys})));
    for ((method, params), (_, unknown_params)) in methods.into_iter().zip(unknown) {
        let answer = bob.call(method, params).await;
        let expected = bob.call(method, unknown_params).await;
        let said = |answer: &Value| {
            serde_json::to_string(&answer["error"])
                .unwrap()
                .replace(&streamed.to_string(), "ID")
                .replace(&nobodys.to_string(), "ID")
        };
        assert_eq!(
            answer["error"]["data"]["kind"], "not_found",
            "{method}: {answer}"
        );
        assert_eq!(said(&answer), said(&expected), "{method}");
    }
}
