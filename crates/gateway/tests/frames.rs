//! What the gateway sends back: every answer fits in a frame and within its
//! documented bounds, and an answer echoes its request's id exactly or the
//! request is refused. A gateway served on 127.0.0.1 over a fresh
//! in-memory store, and a plain WebSocket client that reads every frame.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use settle_gateway::{Gateway, GatewayBuilder, ScriptBook};
use settle_runtime::Kernel;
use settle_store::MemoryStore;
use settle_stream::{
    async_trait, Provider, ProviderStream, Request, StreamError, StreamErrorKind, TurnScript,
};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for a frame: only a hang trips it.
const PATIENCE: Duration = Duration::from_secs(30);

/// The default bound of one `sessions.list` or `session.read` answer.
const PAGE_BYTES: usize = 512 * 1024;

/// The bound of an error's message, its note of the cut included.
const MAX_MESSAGE_CHARS: usize = 600;

/// A provider whose every turn fails at once with `message`, as a model
/// that sends an SSE error event quoting a whole body does.
struct Failing(String);

#[async_trait]
impl Provider for Failing {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        Err(StreamErrorKind::Provider {
            message: self.0.clone(),
        }
        .into())
    }
}

/// A gateway serving in the background.
struct Served {
    gateway: Gateway,
    url: String,
}

impl Served {
    async fn start(provider: Arc<dyn Provider>) -> Served {
        Served::start_with(provider, |g| g).await
    }

    /// A gateway whose builder `options` set its limits.
    async fn start_with(
        provider: Arc<dyn Provider>,
        options: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Served {
        let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
            .start()
            .await
            .unwrap();
        let gateway =
            options(Gateway::builder(kernel, provider).drain_timeout(Duration::from_secs(1)))
                .build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/ws", listener.local_addr().unwrap());
        tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.serve(listener).await }
        });
        Served { gateway, url }
    }

    async fn client(&self) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(&self.url).await.unwrap();
        Client { ws, next_id: 0 }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.gateway.shutdown();
    }
}

/// A client that reads every frame as it comes.
struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Client {
    async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.unwrap();
    }

    /// The next text frame, whole; `None` once the connection ended.
    async fn frame(&mut self) -> Option<String> {
        loop {
            let next = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("a frame within the patience");
            match next {
                Some(Ok(Message::Text(text))) => return Some(text.as_str().to_owned()),
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Calls `method`; the answer's frame, whole, skipping notifications.
    async fn call(&mut self, method: &str, params: Value) -> String {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&request.to_string()).await;
        loop {
            let frame = self
                .frame()
                .await
                .unwrap_or_else(|| panic!("the connection ended before {method} was answered"));
            let value: Value = serde_json::from_str(&frame).unwrap();
            if value["id"] == json!(id) {
                return frame;
            }
        }
    }

    /// Calls `method`; its result.
    async fn ok(&mut self, method: &str, params: Value) -> Value {
        let answer: Value = serde_json::from_str(&self.call(method, params).await).unwrap();
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// The next notification of `method`.
    async fn expect(&mut self, method: &str) -> Value {
        loop {
            let frame = self
                .frame()
                .await
                .unwrap_or_else(|| panic!("the connection ended before a {method}"));
            let value: Value = serde_json::from_str(&frame).unwrap();
            if value["method"] == method {
                return value["params"].clone();
            }
        }
    }
}

/// A session whose one turn failed (with the provider's error); its id
/// and its `turn.ended` params.
async fn failed_turn(client: &mut Client) -> (u64, Value) {
    let id = client.ok("session.create", json!({"name": "e"})).await["id"]
        .as_u64()
        .unwrap();
    client
        .ok("turn.start", json!({"id": id, "prompt": "hi"}))
        .await;
    (id, client.expect("turn.ended").await)
}

/// A provider failing with a message of 2,000,000 characters.
fn huge_error() -> Arc<dyn Provider> {
    Arc::new(Failing("E".repeat(2_000_000)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ended_error_message_is_at_most_600_characters_its_note_included() {
    let served = Served::start(huge_error()).await;
    let mut client = served.client().await;
    let (_, ended) = failed_turn(&mut client).await;
    let message = ended["error"]["message"].as_str().unwrap();
    assert!(
        message.chars().count() <= MAX_MESSAGE_CHARS,
        "{} characters: …{}",
        message.chars().count(),
        &message[message.len().saturating_sub(60)..]
    );
    assert!(message.ends_with(" characters in all)"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_read_of_a_turn_with_a_huge_error_fits_in_a_page_and_keeps_the_connection() {
    let served = Served::start(huge_error()).await;
    let mut client = served.client().await;
    let (id, _) = failed_turn(&mut client).await;
    let frame = client.call("session.read", json!({"id": id})).await;
    assert!(frame.len() <= PAGE_BYTES, "{} bytes", frame.len());
    let answer: Value = serde_json::from_str(&frame).unwrap();
    let message = answer["result"]["error"]["message"].as_str().unwrap();
    assert!(message.chars().count() <= MAX_MESSAGE_CHARS, "{message}");
    assert_eq!(answer["result"]["outcome"], "failed");
    // The connection is still usable.
    client.ok("sessions.list", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g11_a_number_id_that_cannot_be_echoed_exactly_is_refused_to_null_and_writes_nothing() {
    let served = Served::start(Arc::new(
        ScriptBook::new().otherwise(TurnScript::new(["ok"])),
    ))
    .await;
    let mut client = served.client().await;
    for id in [
        "18446744073709551616",
        "-9223372036854775809",
        "1e2",
        "1E2",
        "1.5",
        "1.0",
        "-0.0",
        "-0",
    ] {
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"session.create","params":{{"name":"x"}}}}"#
        );
        client.send_raw(&request).await;
        let frame = client.frame().await.unwrap();
        let answer: Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(answer["id"], Value::Null, "{id}: {frame}");
        assert_eq!(answer["error"]["code"], -32600, "{id}: {frame}");
        assert_eq!(
            answer["error"]["data"]["kind"], "bad_request",
            "{id}: {frame}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("`id`"), "{id}: {message}");
    }
    // Nothing was written.
    let page = client.ok("sessions.list", json!({})).await;
    assert_eq!(page["sessions"], json!([]));
    // Every id the gateway answers to is echoed as it was sent.
    for id in [
        "18446744073709551615",
        "-9223372036854775808",
        "0",
        "-1",
        r#""1e2""#,
    ] {
        let request = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"sessions.list"}}"#);
        client.send_raw(&request).await;
        let frame = client.frame().await.unwrap();
        assert!(frame.contains(&format!(r#""id":{id},"#)), "{id}: {frame}");
        assert!(frame.contains(r#""result""#), "{id}: {frame}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_list_since_takes_every_rfc_3339_time_offsets_and_lower_case_included() {
    let served = Served::start(Arc::new(
        ScriptBook::new().otherwise(TurnScript::new(["ok"])),
    ))
    .await;
    let mut client = served.client().await;
    client.ok("session.create", json!({"name": "a"})).await;
    for since in [
        "2020-01-01T00:00:00Z",
        "2020-01-01T00:00:00+01:00",
        "2020-01-01T00:00:00-05:00",
        "2020-01-01t00:00:00z",
        "2020-01-01T00:00:00.250+05:30",
    ] {
        let page = client.ok("sessions.list", json!({ "since": since })).await;
        assert_eq!(
            page["sessions"].as_array().map(Vec::len),
            Some(1),
            "{since}"
        );
    }
    // A time to come, with an offset: nothing registered at or after it.
    let page = client
        .ok(
            "sessions.list",
            json!({ "since": "9999-01-01T00:00:00+01:00" }),
        )
        .await;
    assert_eq!(page["sessions"], json!([]));
}

impl Client {
    /// Reads past any other frame to the closing frame; its code and reason,
    /// or `None` if the connection ended without one.
    async fn close_frame(&mut self) -> Option<(u16, String)> {
        loop {
            let next = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("a frame within the patience");
            match next {
                Some(Ok(Message::Close(Some(close)))) => {
                    return Some((u16::from(close.code), close.reason.as_str().to_owned()))
                }
                Some(Ok(Message::Close(None))) | Some(Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_ends_the_connection_with_close_1009_naming_the_limit() {
    let served = Served::start(huge_error()).await;
    let mut client = served.client().await;
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "sessions.list",
        "params": {"pad": "x".repeat(1024 * 1024)}});
    // The gateway ends the connection as soon as the frame's header says
    // its length, while the client may still be writing the rest: that
    // write may then fail (the socket reset), and the closing frame, which
    // came first, is still there to read.
    let _ = client.ws.send(Message::text(request.to_string())).await;
    let (code, reason) = client
        .close_frame()
        .await
        .expect("a closing frame, not a dropped connection");
    assert_eq!(code, 1009, "{reason}");
    assert!(reason.contains("1048576"), "the limit is named: {reason}");
    assert!(reason.len() <= 123, "a close reason fits its frame");
    // Nothing else was affected: a new connection is served.
    let mut other = served.client().await;
    other.ok("sessions.list", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_frame_that_is_not_utf8_ends_the_connection_with_close_1007() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    let served = Served::start(huge_error()).await;
    let mut client = served.client().await;
    let bytes: &[u8] = b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"\xff\xfe\"}";
    client
        .ws
        .send(Message::Frame(Frame::message(
            bytes.to_vec(),
            OpCode::Data(Data::Text),
            true,
        )))
        .await
        .unwrap();
    let (code, reason) = client
        .close_frame()
        .await
        .expect("a closing frame, not a dropped connection");
    assert_eq!(code, 1007, "{reason}");
    assert!(reason.contains("UTF-8"), "{reason}");
}

/// RFC 6455 §7.1.7: a connection failed for a protocol error is told so
/// with `1002` before it is closed, not dropped without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_breaks_the_websocket_protocol_ends_the_connection_with_close_1002() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    let served = Served::start(replying_ok()).await;
    let reserved_bit = || {
        let mut frame = Frame::message(b"{}".to_vec(), OpCode::Data(Data::Text), true);
        frame.header_mut().rsv1 = true;
        frame
    };
    let reserved_opcode = || Frame::message(b"{}".to_vec(), OpCode::Data(Data::Reserved(3)), true);
    for (what, frame) in [("rsv1", reserved_bit()), ("opcode 3", reserved_opcode())] {
        let mut client = served.client().await;
        client.ws.send(Message::Frame(frame)).await.unwrap();
        let (code, reason) = client
            .close_frame()
            .await
            .unwrap_or_else(|| panic!("{what}: a closing frame, not a dropped connection"));
        assert_eq!(code, 1002, "{what}: {reason}");
        assert!(reason.contains("protocol"), "{what}: {reason}");
        assert!(reason.len() <= 123, "a close reason fits its frame");
    }
    // Nothing else was affected: a new connection is served.
    let mut other = served.client().await;
    other.ok("sessions.list", json!({})).await;
}

/// RFC 6455 §5.5.1: a closing frame is answered with one before the
/// connection ends (the code echoed; one a client may not send is answered
/// 1002), so the client's close is a normal closure, not a dropped socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_closing_frame_is_answered_with_one() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    let served = Served::start(replying_ok()).await;
    for (sent, answered) in [(1000, 1000), (4000, 4000), (1004, 1002)] {
        let mut client = served.client().await;
        let frame = CloseFrame {
            code: CloseCode::from(sent),
            reason: "bye".into(),
        };
        client.ws.send(Message::Close(Some(frame))).await.unwrap();
        let (code, reason) = client
            .close_frame()
            .await
            .unwrap_or_else(|| panic!("{sent}: no closing frame in answer"));
        assert_eq!(code, answered, "{sent}: {reason}");
    }
    let mut other = served.client().await;
    other.ok("sessions.list", json!({})).await;
}

/// A provider whose every turn replies "ok".
fn replying_ok() -> Arc<dyn Provider> {
    Arc::new(ScriptBook::new().otherwise(TurnScript::new(["ok"])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_null_id_is_refused_to_null_and_writes_nothing() {
    let served = Served::start(replying_ok()).await;
    let mut client = served.client().await;
    client
        .send_raw(r#"{"jsonrpc":"2.0","id":null,"method":"session.create","params":{"name":"x"}}"#)
        .await;
    let frame = client.frame().await.unwrap();
    let answer: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!(answer["id"], Value::Null, "{frame}");
    assert_eq!(answer["error"]["code"], -32600, "{frame}");
    assert_eq!(answer["error"]["data"]["kind"], "bad_request", "{frame}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("`id`"), "{message}");
    let page = client.ok("sessions.list", json!({})).await;
    assert_eq!(page["sessions"], json!([]), "nothing was written");
    // Without an `id` it is a notification: carried out, not answered.
    client
        .send_raw(r#"{"jsonrpc":"2.0","method":"session.create","params":{"name":"x"}}"#)
        .await;
    let page = client.ok("sessions.list", json!({})).await;
    assert_eq!(page["sessions"].as_array().map(Vec::len), Some(1), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_over_the_rate_limit_is_not_answered() {
    let served = Served::start_with(replying_ok(), |g| g.requests_per_second(Some(2))).await;
    let mut client = served.client().await;
    // Two are carried out, four are over the rate: none is answered.
    for _ in 0..6 {
        client
            .send_raw(r#"{"jsonrpc":"2.0","method":"sessions.list"}"#)
            .await;
    }
    // A request over the rate is answered, to its id: the first frame sent.
    client
        .send_raw(r#"{"jsonrpc":"2.0","id":"over","method":"sessions.list"}"#)
        .await;
    let frame = client.frame().await.unwrap();
    let answer: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!(answer["id"], "over", "{frame}");
    assert_eq!(answer["error"]["data"]["kind"], "rate_limited", "{frame}");
}
