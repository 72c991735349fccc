//! What a connection does while one of its requests waits on the store (a
//! `session.close` behind a locked database): it still reads its socket, so
//! the client's pings are answered and its pongs heard, and the requests it
//! sends meanwhile are answered after the one waiting, in order.
//!
//! A gateway on in-memory pipes over a store whose writes can be held, so
//! that the tests run on tokio's paused clock, and a client that speaks
//! WebSocket by hand, so that the test decides which pings it answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{json, Value};
use settle_gateway::{Gateway, GatewayBuilder, ScriptBook};
use settle_runtime::Kernel;
use settle_store::{
    Applied, ChunkReceipt, LifecycleWrite, MemoryRow, MemoryStore, NewChunk, OwnerId, OwnerInfo,
    RecoverOptions, RecoveryCandidate, RecoveryReport, SessionDetail, SessionFilter, SessionId,
    SessionRow, SessionStore, State, StoreError,
};
use settle_stream::TurnScript;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

#[path = "support/pipes.rs"]
mod pipes;
use pipes::Pipes;

/// How long a test waits for a frame: virtual time, past every timer of
/// these tests.
const PATIENCE: Duration = Duration::from_secs(600);

/// The opcodes of the frames these tests read and send (RFC 6455 §5.2).
const TEXT: u8 = 0x1;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// A [`MemoryStore`] whose lifecycle writes (and flushes) wait while it is
/// held, as on a database another process has locked: they are written
/// once it is let go. Reads and the lease go on.
#[derive(Clone)]
struct Holdable {
    inner: MemoryStore,
    held: watch::Sender<bool>,
}

impl Holdable {
    fn new() -> Holdable {
        Holdable {
            inner: MemoryStore::new(),
            held: watch::channel(false).0,
        }
    }

    fn hold(&self) {
        self.held.send_replace(true);
    }

    fn let_go(&self) {
        self.held.send_replace(false);
    }

    async fn while_held(&self) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|held| !held).await;
    }
}

#[async_trait]
impl SessionStore for Holdable {
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError> {
        self.inner.register_owner(owner, ttl).await
    }
    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        self.inner.renew_lease(owner, ttl).await
    }
    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        self.inner.reserve_ids(count).await
    }
    fn append_chunk(&self, id: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt {
        self.inner.append_chunk(id, turn, chunk)
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.while_held().await;
        self.inner.flush().await
    }
    async fn apply(&self, batch: Vec<LifecycleWrite>) -> Vec<Result<Applied, StoreError>> {
        self.while_held().await;
        self.inner.apply(batch).await
    }
    fn applies_in_order(&self) -> bool {
        self.inner.applies_in_order()
    }
    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError> {
        self.inner.recover(options).await
    }
    async fn recovery_candidates(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<RecoveryCandidate>, StoreError> {
        self.inner.recovery_candidates(options).await
    }
    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRow>, StoreError> {
        self.inner.list_sessions(filter).await
    }
    async fn last_session(&self, state: Option<State>) -> Result<Option<SessionId>, StoreError> {
        self.inner.last_session(state).await
    }
    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        self.inner.session_detail(id).await
    }
    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
        self.inner.memories(id).await
    }
    async fn principal(&self, session: SessionId) -> Result<Option<String>, StoreError> {
        self.inner.principal(session).await
    }
    async fn set_principal(
        &self,
        session: SessionId,
        principal: Option<String>,
    ) -> Result<(), StoreError> {
        self.inner.set_principal(session, principal).await
    }
}

/// A gateway serving in the background on pipes, over a store that can be
/// held.
struct Served {
    gateway: Gateway,
    pipes: mpsc::UnboundedSender<DuplexStream>,
    store: Holdable,
}

impl Served {
    /// A gateway whose builder `options` set its limits, replying "ok".
    async fn start(options: impl FnOnce(GatewayBuilder) -> GatewayBuilder) -> Served {
        let store = Holdable::new();
        let kernel = Kernel::builder(Arc::new(store.clone()))
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
        Served {
            gateway,
            pipes,
            store,
        }
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
        Raw { io: ours }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.store.let_go();
        self.gateway.shutdown();
    }
}

/// A WebSocket client by hand: it answers nothing unless told to.
struct Raw {
    io: DuplexStream,
}

impl Raw {
    /// Sends one frame of `opcode` with `payload`, masked as a client's must be.
    async fn send_frame(&mut self, opcode: u8, payload: &[u8]) {
        let mask = [0x1f, 0x2e, 0x3d, 0x4c];
        let mut frame = vec![0x80 | opcode];
        match u16::try_from(payload.len()) {
            Ok(len) if len < 126 => frame.push(0x80 | len as u8),
            Ok(len) => {
                frame.push(0x80 | 126);
                frame.extend(len.to_be_bytes());
            }
            Err(_) => panic!("a test frame of {} bytes", payload.len()),
        }
        frame.extend(mask);
        frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        self.io.write_all(&frame).await.unwrap();
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_frame(TEXT, request.to_string().as_bytes()).await;
    }

    /// The next frame, its opcode and payload; `None` once the connection
    /// ended.
    async fn frame(&mut self) -> Option<(u8, Vec<u8>)> {
        tokio::time::timeout(PATIENCE, self.frame_now())
            .await
            .expect("a frame within the patience")
    }

    async fn frame_now(&mut self) -> Option<(u8, Vec<u8>)> {
        let io = &mut self.io;
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
    }

    /// The next message, answering the gateway's pings on the way.
    async fn message(&mut self) -> Value {
        loop {
            match self.frame().await {
                Some((TEXT, text)) => return serde_json::from_slice(&text).unwrap(),
                Some((PING, payload)) => self.send_frame(PONG, &payload).await,
                Some((CLOSE, payload)) => panic!(
                    "the gateway closed the connection: {}",
                    String::from_utf8_lossy(payload.get(2..).unwrap_or_default())
                ),
                None => panic!("the connection ended"),
                Some(_) => {}
            }
        }
    }

    /// Waits `long`, answering the gateway's pings; anything else that
    /// comes fails the test.
    async fn quiet_for(&mut self, long: Duration) {
        let until = Instant::now() + long;
        while let Ok(frame) = tokio::time::timeout_at(until, self.frame_now()).await {
            match frame {
                Some((PING, payload)) => self.send_frame(PONG, &payload).await,
                Some((CLOSE, payload)) => panic!(
                    "the gateway closed the connection: {}",
                    String::from_utf8_lossy(payload.get(2..).unwrap_or_default())
                ),
                Some((opcode, payload)) => {
                    panic!("{opcode}: {}", String::from_utf8_lossy(&payload))
                }
                None => panic!("the connection ended"),
            }
        }
    }

    /// The answer to request `id`, past the notifications that come first.
    async fn answer(&mut self, id: u64) -> Value {
        loop {
            let message = self.message().await;
            if message.get("id").is_some() {
                assert_eq!(message["id"], json!(id), "answers come in order");
                return message;
            }
        }
    }
}

/// A session made on `client` (request id 1).
async fn session(client: &mut Raw) -> Value {
    client
        .request(1, "session.create", json!({"name": "waits"}))
        .await;
    client.answer(1).await["result"]["id"].clone()
}

#[tokio::test(start_paused = true)]
async fn a_request_waiting_on_the_store_leaves_the_clients_pings_answered() {
    let served = Served::start(|g| g).await;
    let mut client = served.client().await;
    let id = session(&mut client).await;
    served.store.hold();
    client.request(2, "session.close", json!({"id": id})).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The close waits on the store; every ping meanwhile is answered at
    // once, and nothing else comes (the close's answer waits for its end).
    for n in 0..6u8 {
        client.send_frame(PING, &[b'p', n]).await;
        let (opcode, payload) = tokio::time::timeout(Duration::from_secs(2), client.frame_now())
            .await
            .unwrap_or_else(|_| panic!("ping {n} was not answered within 2 s"))
            .expect("the connection is open");
        assert_eq!((opcode, payload), (PONG, vec![b'p', n]));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    served.store.let_go();
    let closed = client.answer(2).await;
    assert_eq!(closed["result"]["end_reason"], "user_close", "{closed}");
}

#[tokio::test(start_paused = true)]
async fn a_client_answering_every_ping_is_not_closed_while_its_request_waits_on_the_store() {
    let every = Duration::from_secs(30);
    let served = Served::start(|g| g.keepalive(Some(every))).await;
    let mut client = served.client().await;
    let id = session(&mut client).await;
    served.store.hold();
    client.request(2, "session.close", json!({"id": id})).await;
    // Four keepalive intervals: twice what a silent client is given. The
    // client answers each ping, and says nothing else.
    let wait = every * 4;
    let until = Instant::now() + wait;
    let mut pings = 0;
    while let Ok(frame) = tokio::time::timeout_at(until, client.frame_now()).await {
        match frame {
            Some((PING, payload)) => {
                pings += 1;
                client.send_frame(PONG, &payload).await;
            }
            Some((CLOSE, payload)) => panic!(
                "closed after {pings} pings: {}",
                String::from_utf8_lossy(payload.get(2..).unwrap_or_default())
            ),
            Some((opcode, payload)) => panic!(
                "{opcode}: {} before the store answered",
                String::from_utf8_lossy(&payload)
            ),
            None => panic!("the connection ended after {pings} pings"),
        }
    }
    served.store.let_go();
    let closed = client.answer(2).await;
    assert_eq!(closed["result"]["end_reason"], "user_close", "{closed}");
    // And the connection goes on, not closed for a silence it did not keep.
    client.quiet_for(Duration::from_secs(5)).await;
    client.request(3, "sessions.list", json!({})).await;
    let listed = client.answer(3).await;
    assert!(listed.get("result").is_some(), "{listed}");
    assert_eq!(served.gateway.connections(), 1);
    assert!(
        pings >= 3,
        "the keepalive pings while the request waits: {pings}"
    );
}

#[tokio::test(start_paused = true)]
async fn requests_sent_behind_one_waiting_on_the_store_are_answered_after_it_in_order() {
    let served = Served::start(|g| g).await;
    let mut client = served.client().await;
    let id = session(&mut client).await;
    served.store.hold();
    client.request(2, "session.close", json!({"id": id})).await;
    // Sent behind it: they depend on it, as a list after a close does.
    for n in 3..=6 {
        client
            .request(n, "sessions.list", json!({"state": "finalized"}))
            .await;
    }
    // Read meanwhile, and not carried out: the ping behind them is
    // answered, and nothing else comes.
    client.send_frame(PING, b"behind").await;
    let (opcode, payload) = tokio::time::timeout(Duration::from_secs(2), client.frame_now())
        .await
        .expect("the ping behind the requests is answered")
        .expect("the connection is open");
    assert_eq!((opcode, payload.as_slice()), (PONG, &b"behind"[..]));
    tokio::time::sleep(Duration::from_secs(30)).await;
    served.store.let_go();
    let closed = client.answer(2).await;
    assert_eq!(closed["result"]["end_reason"], "user_close", "{closed}");
    for n in 3..=6 {
        let listed = client.answer(n).await;
        // Each carried out once the close was answered: it sees its end.
        assert_eq!(
            listed["result"]["sessions"][0]["id"], id,
            "request {n}: {listed}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn requests_past_the_read_ahead_bound_wait_in_the_socket_and_the_client_is_not_taken_for_gone(
) {
    let every = Duration::from_secs(30);
    let served = Served::start(|g| g.keepalive(Some(every))).await;
    let mut client = served.client().await;
    let id = session(&mut client).await;
    served.store.hold();
    client.request(2, "session.close", json!({"id": id})).await;
    // More than the gateway reads ahead (16 requests), then a ping.
    let last = 2 + 20;
    for n in 3..=last {
        client
            .request(n, "sessions.list", json!({"state": "finalized"}))
            .await;
    }
    client.send_frame(PING, b"past").await;
    // The socket is not read past the bound: the ping waits behind the
    // requests, and the gateway, which cannot hear the client meanwhile,
    // neither pings it nor takes it for gone, however long the store waits.
    let waited = tokio::time::timeout(every * 4, client.frame_now()).await;
    assert!(waited.is_err(), "{waited:?}");
    served.store.let_go();
    // Then each is answered, in order, and the ping (a control frame, sent
    // as soon as it is read, maybe before answers queued ahead of it).
    let mut answered = Vec::new();
    let mut ponged = false;
    while answered.len() < 21 || !ponged {
        match client.frame().await.expect("the connection is open") {
            (TEXT, text) => {
                let message: Value = serde_json::from_slice(&text).unwrap();
                if message["method"] == "session.finalized" {
                    continue;
                }
                match message["id"].as_u64().unwrap() {
                    2 => assert_eq!(message["result"]["end_reason"], "user_close", "{message}"),
                    _ => assert_eq!(message["result"]["sessions"][0]["id"], id, "{message}"),
                }
                answered.push(message["id"].as_u64().unwrap());
            }
            (PONG, payload) => {
                assert_eq!(payload, b"past");
                ponged = true;
            }
            (PING, payload) => client.send_frame(PONG, &payload).await,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(answered, (2..=last).collect::<Vec<_>>(), "in order");
    client.quiet_for(every * 3).await;
    assert_eq!(served.gateway.connections(), 1);
}
