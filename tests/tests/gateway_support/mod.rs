//! Shared by the gateway's tests: a gateway served over 127.0.0.1 or over
//! in-memory pipes (for tests on tokio's paused clock, where a real socket
//! would let the clock jump while a frame is in flight), and a WebSocket
//! client that matches answers to requests and keeps the notifications in
//! order.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use settle_gateway::{Gateway, GatewayBuilder, GatewayError};
use settle_runtime::{Kernel, KernelBuilder, ShutdownReport};
use settle_store::{MemoryStore, SessionStore};
use settle_stream::Provider;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

// How long a test waits for anything, as for the binary's tests: only a real
// hang trips it (on the paused clock it is virtual time, far past every
// timer of the tests).
use settle_tests::PATIENCE;

/// Where a test gateway listens.
#[derive(Clone)]
pub enum Address {
    Tcp(std::net::SocketAddr),
    Pipes(mpsc::UnboundedSender<DuplexStream>),
}

/// A gateway serving in the background, with its kernel and store.
pub struct Served {
    pub gateway: Gateway,
    pub kernel: Kernel,
    pub store: MemoryStore,
    pub address: Address,
    serving: Option<JoinHandle<Result<ShutdownReport, GatewayError>>>,
}

// In-memory connections, as an axum listener: the gateway crate's own
// tests' listener, one file for both.
#[path = "../../../crates/gateway/tests/support/pipes.rs"]
mod pipes;
use pipes::Pipes;

impl Served {
    /// A gateway on 127.0.0.1 (port chosen by the system).
    pub async fn tcp(
        provider: Arc<dyn Provider>,
        policy: impl FnOnce(KernelBuilder) -> KernelBuilder,
        options: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Served {
        Served::tcp_over(|store| Arc::new(store), provider, policy, options).await
    }

    /// [`Served::tcp`] over the store `wrap` makes of a fresh memory store
    /// (one that fails its reads, say).
    pub async fn tcp_over(
        wrap: impl FnOnce(MemoryStore) -> Arc<dyn SessionStore>,
        provider: Arc<dyn Provider>,
        policy: impl FnOnce(KernelBuilder) -> KernelBuilder,
        options: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = Address::Tcp(listener.local_addr().unwrap());
        Served::on(listener, address, wrap, provider, policy, options).await
    }

    /// A gateway on in-memory pipes, for tests on the paused clock.
    pub async fn pipes(
        provider: Arc<dyn Provider>,
        policy: impl FnOnce(KernelBuilder) -> KernelBuilder,
        options: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Served {
        Served::pipes_over(|store| Arc::new(store), provider, policy, options).await
    }

    /// A gateway on in-memory pipes over the store `wrap` makes of a fresh
    /// memory store (one that stalls a call, say).
    pub async fn pipes_over(
        wrap: impl FnOnce(MemoryStore) -> Arc<dyn SessionStore>,
        provider: Arc<dyn Provider>,
        policy: impl FnOnce(KernelBuilder) -> KernelBuilder,
        options: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Served {
        let (tx, rx) = mpsc::unbounded_channel();
        Served::on(
            Pipes(rx),
            Address::Pipes(tx),
            wrap,
            provider,
            policy,
            options,
        )
        .await
    }

    /// A kernel on a fresh store and a gateway serving it on `listener`.
    async fn on<L>(
        listener: L,
        address: Address,
        wrap: impl FnOnce(MemoryStore) -> Arc<dyn SessionStore>,
        provider: Arc<dyn Provider>,
        policy: impl FnOnce(KernelBuilder) -> KernelBuilder,
        options: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Served
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        let store = MemoryStore::new();
        let kernel =
            policy(Kernel::builder(wrap(store.clone())).settle_timeout(Duration::from_millis(500)))
                .start()
                .await
                .unwrap();
        let gateway = options(Gateway::builder(kernel.clone(), provider)).build();
        let serving = tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.serve(listener).await }
        });
        Served {
            gateway,
            kernel,
            store,
            address,
            serving: Some(serving),
        }
    }

    /// A new client connection.
    pub async fn client(&self) -> Client {
        match &self.address {
            Address::Tcp(addr) => connect(&addr.to_string()).await,
            Address::Pipes(tx) => {
                let (ours, theirs) = tokio::io::duplex(64 * 1024);
                tx.send(theirs).unwrap();
                let (ws, _) = tokio_tungstenite::client_async("ws://gateway/ws", ours)
                    .await
                    .unwrap();
                Client::new(ws)
            }
        }
    }

    /// Begins the shutdown and waits for `serve` to return its report.
    pub async fn shut_down(&mut self) -> ShutdownReport {
        self.gateway.shutdown();
        self.finished().await
    }

    /// Waits for `serve` to return (the kernel was shut down).
    pub async fn finished(&mut self) -> ShutdownReport {
        let serving = self.serving.take().expect("served once");
        tokio::time::timeout(PATIENCE, serving)
            .await
            .expect("the gateway stopped in time")
            .unwrap()
            .unwrap()
    }

    /// The store's row of session `id`.
    pub async fn row(&self, id: u64) -> settle_store::SessionRow {
        self.kernel
            .list_sessions(None)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.id.get() == id)
            .unwrap_or_else(|| panic!("no session {id}"))
    }
}

/// A client of the gateway at `ws://ADDR/ws`.
pub async fn connect(addr: &str) -> Client {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    Client::new(ws)
}

/// Connects to `ws://ADDR/ws` with these headers: the client, or the
/// HTTP status the upgrade was refused with.
pub async fn connect_with(addr: &str, headers: &[(&str, &str)]) -> Result<Client, u16> {
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => Ok(Client::new(ws)),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(other) => panic!("{other}"),
    }
}

/// A client of `principal`'s token.
pub async fn connect_as(addr: &str, token: &str) -> Client {
    connect_with(addr, &[("authorization", &format!("Bearer {token}"))])
        .await
        .unwrap_or_else(|status| panic!("refused with {status}"))
}

type Sink = Box<
    dyn futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Send + Unpin,
>;

/// A WebSocket client of the gateway.
pub struct Client {
    sink: Sink,
    incoming: mpsc::UnboundedReceiver<Value>,
    /// Notifications read while waiting for an answer, in order.
    held: VecDeque<Value>,
    next_id: u64,
    reader: tokio::task::AbortHandle,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Both halves go: the socket is dropped, with no closing frame.
        self.reader.abort();
    }
}

impl Client {
    /// A client over an open WebSocket (one made with headers of its own, or over TLS).
    pub fn new<S>(ws: WebSocketStream<S>) -> Client
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sink, mut stream) = ws.split();
        let sink: SplitSink<WebSocketStream<S>, Message> = sink;
        let (tx, incoming) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            while let Some(Ok(frame)) = stream.next().await {
                if let Message::Text(text) = frame {
                    let value: Value =
                        serde_json::from_str(text.as_str()).expect("JSON from the gateway");
                    if tx.send(value).is_err() {
                        return;
                    }
                }
            }
        })
        .abort_handle();
        Client {
            sink: Box::new(sink),
            incoming,
            held: VecDeque::new(),
            next_id: 0,
            reader,
        }
    }

    /// Sends one text frame as it is.
    pub async fn send_raw(&mut self, text: &str) {
        self.sink
            .send(Message::text(text.to_owned()))
            .await
            .unwrap();
    }

    /// Sends a request and waits for its answer: the result, or the error object.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.send_raw(&request.to_string()).await;
        self.answer_to(&json!(id)).await
    }

    /// Waits for the answer to `id`, holding the notifications that come first.
    pub async fn answer_to(&mut self, id: &Value) -> Result<Value, Value> {
        loop {
            let message = self
                .recv()
                .await
                .expect("the connection closed before the answer");
            if message.get("method").is_some() {
                self.held.push_back(message);
                continue;
            }
            assert_eq!(message["jsonrpc"], "2.0", "{message}");
            if &message["id"] == id {
                return match message.get("result") {
                    Some(result) => Ok(result.clone()),
                    None => Err(message["error"].clone()),
                };
            }
            panic!("an answer to another request: {message}");
        }
    }

    /// A request that must succeed.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        self.call(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    /// A request that must fail: its `data.kind`.
    pub async fn refused(&mut self, method: &str, params: Value) -> String {
        let error = self
            .call(method, params)
            .await
            .expect_err(&format!("{method} was accepted"));
        error["data"]["kind"].as_str().unwrap().to_owned()
    }

    async fn recv(&mut self) -> Option<Value> {
        tokio::time::timeout(PATIENCE, self.incoming.recv())
            .await
            .expect("no message from the gateway in time")
    }

    /// The next notification (held ones first); `None` once the connection closed.
    pub async fn next_notification(&mut self) -> Option<Value> {
        if let Some(held) = self.held.pop_front() {
            return Some(held);
        }
        let message = self.recv().await?;
        assert!(
            message.get("method").is_some(),
            "an answer nobody asked for: {message}"
        );
        Some(message)
    }

    /// The next notification, which must be `method`: its params.
    pub async fn expect(&mut self, method: &str) -> Value {
        let message = self
            .next_notification()
            .await
            .unwrap_or_else(|| panic!("closed while waiting for {method}"));
        assert_eq!(message["method"], method, "{message}");
        message["params"].clone()
    }

    /// The chunks of session `id`'s turn up to its `turn.ended`, skipping
    /// nothing: any other notification in between fails the test.
    pub async fn turn(&mut self, id: u64) -> (Vec<String>, Value) {
        let mut chunks = Vec::new();
        loop {
            let message = self.next_notification().await.expect("closed mid-turn");
            let params = &message["params"];
            assert_eq!(params["id"], id, "{message}");
            match message["method"].as_str() {
                Some("turn.chunk") => chunks.push(params["text"].as_str().unwrap().to_owned()),
                Some("turn.ended") => return (chunks, params.clone()),
                _ => panic!("not a turn notification: {message}"),
            }
        }
    }

    /// Waits until the gateway has closed the connection; the notifications
    /// it sent before, in order.
    pub async fn until_closed(&mut self) -> Vec<Value> {
        let mut seen: Vec<Value> = self.held.drain(..).collect();
        while let Some(message) = self.recv().await {
            seen.push(message);
        }
        seen
    }

    /// The notifications read while waiting for answers, not taken yet.
    pub fn held(&self) -> &VecDeque<Value> {
        &self.held
    }

    /// Closes the connection from this side, with a closing frame.
    pub async fn close(mut self) {
        let _ = self.sink.close().await;
    }
}

/// The ids of a `sessions.list` page, in its order.
pub fn listed_ids(page: &serde_json::Value) -> Vec<u64> {
    page["sessions"]
        .as_array()
        .expect("a page of sessions")
        .iter()
        .map(|r| r["id"].as_u64().expect("a session id"))
        .collect()
}

/// Waits (within [`PATIENCE`]) until `check` holds, polling every `every`.
pub async fn eventually<F, Fut>(what: &str, every: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}
