//! How the gateway ends a connection for a timeout: with a closing frame
//! saying why (RFC 6455 §7.4), not a dropped socket. A gateway on in-memory
//! pipes, so that the tests run on tokio's paused clock (a real socket
//! would let the clock jump while a frame is in flight), and a client that
//! speaks WebSocket by hand, so that it answers no ping: a WebSocket
//! library would, and would fail on the pong owed once the socket is gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use settle_gateway::{Gateway, GatewayBuilder, ScriptBook};
use settle_runtime::Kernel;
use settle_store::MemoryStore;
use settle_stream::TurnScript;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[path = "support/pipes.rs"]
mod pipes;
use pipes::Pipes;

/// How long a test waits for a frame: virtual time, past every timer of
/// these tests.
const PATIENCE: Duration = Duration::from_secs(300);

/// The opcodes of the frames these tests read (RFC 6455 §5.2).
const TEXT: u8 = 0x1;
const CLOSE: u8 = 0x8;

/// A gateway serving in the background on pipes.
struct Served {
    gateway: Gateway,
    pipes: mpsc::UnboundedSender<DuplexStream>,
}

impl Served {
    /// A gateway whose builder `options` set its limits, replying "ok".
    async fn start(options: impl FnOnce(GatewayBuilder) -> GatewayBuilder) -> Served {
        let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
            .start()
            .await
            .unwrap();
        let provider = Arc::new(ScriptBook::new().otherwise(TurnScript::new(["ok"])));
        let gateway = options(Gateway::builder(kernel, provider)).build();
        let (pipes, accepted) = mpsc::unbounded_channel();
        tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.serve(Pipes(accepted)).await }
        });
        Served { gateway, pipes }
    }

    /// A new connection, upgraded.
    async fn client(&self) -> Raw {
        let (mut ours, theirs) = tokio::io::duplex(64 * 1024);
        self.pipes.send(theirs).unwrap();
        ours.write_all(
            b"GET /ws HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n\
              Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              Sec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
        // The response head byte by byte: nothing after it is read with it.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(ours.read_u8().await.unwrap());
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Raw {
            io: ours,
            next_id: 0,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.gateway.shutdown();
    }
}

/// A WebSocket client by hand: it reads the frames as they come, and
/// answers nothing, pings included.
struct Raw {
    io: DuplexStream,
    next_id: u64,
}

impl Raw {
    /// Sends `text` in one text frame, masked as a client's must be.
    async fn send(&mut self, text: &str) {
        let mask = [0x1f, 0x2e, 0x3d, 0x4c];
        let mut frame = vec![0x80 | TEXT];
        match u16::try_from(text.len()) {
            Ok(len) if len < 126 => frame.push(0x80 | len as u8),
            Ok(len) => {
                frame.push(0x80 | 126);
                frame.extend(len.to_be_bytes());
            }
            Err(_) => panic!("a test frame of {} bytes", text.len()),
        }
        frame.extend(mask);
        frame.extend(text.bytes().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        self.io.write_all(&frame).await.unwrap();
    }

    /// The next frame, its opcode and payload; `None` once the connection
    /// ended.
    async fn frame(&mut self) -> Option<(u8, Vec<u8>)> {
        let io = &mut self.io;
        let read = async {
            let mut head = [0u8; 2];
            io.read_exact(&mut head).await.ok()?;
            let len = match head[1] & 0x7f {
                126 => u64::from(io.read_u16().await.ok()?),
                127 => io.read_u64().await.ok()?,
                len => u64::from(len),
            };
            let mut payload = vec![0; usize::try_from(len).unwrap()];
            io.read_exact(&mut payload).await.ok()?;
            Some((head[0] & 0x0f, payload))
        };
        tokio::time::timeout(PATIENCE, read)
            .await
            .expect("a frame within the patience")
    }

    /// The next message, skipping pings.
    async fn message(&mut self) -> Value {
        loop {
            match self.frame().await {
                Some((TEXT, text)) => return serde_json::from_slice(&text).unwrap(),
                Some((CLOSE, _)) | None => panic!("the connection ended"),
                Some(_) => {}
            }
        }
    }

    /// Calls `method`; its result, past the notifications that come first.
    async fn ok(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&request.to_string()).await;
        loop {
            let message = self.message().await;
            if message["id"] == json!(id) {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }

    /// Waits for the closing frame, which must come: how long it took from
    /// now, its code and its reason.
    async fn timed_close(&mut self) -> (Duration, u16, String) {
        let start = Instant::now();
        let (code, reason) = self
            .close_frame()
            .await
            .expect("a closing frame, not a dropped connection");
        (start.elapsed(), code, reason)
    }

    /// Reads past any other frame to the closing frame; its code and
    /// reason, or `None` if the connection ended without one.
    async fn close_frame(&mut self) -> Option<(u16, String)> {
        loop {
            let (opcode, payload) = self.frame().await?;
            if opcode == CLOSE {
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                let reason = String::from_utf8(payload[2..].to_vec()).unwrap();
                return Some((code, reason));
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_connection_closed_for_the_idle_timeout_is_told_so_in_a_closing_frame() {
    let idle = Duration::from_secs(10);
    let served = Served::start(|g| g.keepalive(None).connection_idle_timeout(Some(idle))).await;
    let mut client = served.client().await;
    let (closed, code, reason) = client.timed_close().await;
    assert!(closed >= idle && closed < idle * 2, "{closed:?}");
    assert_eq!(code, 1000, "{reason}");
    assert!(reason.contains("idle"), "{reason}");
    assert!(reason.contains("10s"), "the timeout is named: {reason}");
    assert!(reason.len() <= 123, "a close reason fits its frame");
    // Then the connection ends.
    assert_eq!(client.frame().await, None);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_answering_pings_is_told_so_in_a_closing_frame() {
    let every = Duration::from_secs(10);
    let served = Served::start(|g| g.keepalive(Some(every)).connection_idle_timeout(None)).await;
    let mut client = served.client().await;
    // Attached to a session, as a client watching a turn would be.
    client
        .ok("session.create", json!({"name": "watched"}))
        .await;
    let (closed, code, reason) = client.timed_close().await;
    assert!(closed > every * 2 && closed <= every * 3, "{closed:?}");
    assert_eq!(code, 1011, "{reason}");
    assert!(reason.contains("ping"), "{reason}");
    assert!(reason.len() <= 123, "a close reason fits its frame");
    assert_eq!(client.frame().await, None);
    assert_eq!(served.gateway.connections(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_connection_whose_sessions_were_all_finalized_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_secs(10);
    let served = Served::start(|g| g.keepalive(None).connection_idle_timeout(Some(idle))).await;
    let mut watcher = served.client().await;
    let id = watcher
        .ok("session.create", json!({"name": "watched"}))
        .await["id"]
        .clone();
    // Attached to a session, it outlasts the idle timeout many times over.
    tokio::time::sleep(idle * 3).await;
    let mut closer = served.client().await;
    closer.ok("session.close", json!({"id": id})).await;
    let finalized = watcher.message().await;
    assert_eq!(finalized["method"], "session.finalized", "{finalized}");
    // From its session's end it is attached to none: the timeout applies.
    let (closed, code, reason) = watcher.timed_close().await;
    assert!(closed >= idle && closed < idle * 2, "{closed:?}");
    assert_eq!(code, 1000, "{reason}");
}

#[tokio::test(start_paused = true)]
async fn a_finalized_session_leaves_its_connection_which_stays_attached_to_the_others() {
    let idle = Duration::from_secs(10);
    let served = Served::start(|g| g.keepalive(None).connection_idle_timeout(Some(idle))).await;
    let mut watcher = served.client().await;
    let gone = watcher.ok("session.create", json!({"name": "gone"})).await["id"].clone();
    let kept = watcher
        .ok(
            "session.create",
            json!({"name": "kept", "close_on_disconnect": true}),
        )
        .await["id"]
        .clone();
    let mut closer = served.client().await;
    closer.ok("session.close", json!({"id": gone})).await;
    let finalized = watcher.message().await;
    assert_eq!(finalized["params"]["id"], gone, "{finalized}");
    // Still attached to the other, it outlasts the idle timeout.
    tokio::time::sleep(idle * 3).await;
    watcher.ok("sessions.list", json!({})).await;
    // Its end detaches the session left, which closes on disconnect.
    drop(watcher);
    let mut checker = served.client().await;
    let deadline = Instant::now() + idle;
    loop {
        let page = checker
            .ok("sessions.list", json!({"state": "finalized"}))
            .await;
        let ids: Vec<&Value> = page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| &row["id"])
            .collect();
        if ids.contains(&&kept) {
            break;
        }
        assert!(Instant::now() < deadline, "{kept} is not finalized: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
