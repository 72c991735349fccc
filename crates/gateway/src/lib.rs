//! `settle-gateway`: the session gateway of `settle` (`settle serve`), a
//! second frontend over the runtime, embeddable as a library.
//!
//! Clients (a TUI, a desktop app, a script) speak JSON-RPC 2.0 over
//! WebSocket at `ws://ADDR/ws`, one text frame per message: they create
//! sessions, attach to them and detach, run turns whose chunks they receive
//! as notifications once persisted (a chunk larger than a frame in parts),
//! read a turn back from the store, hold sessions while a person is asked
//! for input, close them, list them a page at a time. `GET /healthz` answers `ok` (503 once
//! shutting down). The protocol is in `docs/gateway.md`.
//!
//! Each connection is a transport of the sessions it attaches to. The
//! gateway holds no lifecycle logic of its own: a dropped connection
//! detaches its transports, and what follows (the orphan reap once the grace
//! has passed and no turn runs, the transport-closed reclaim, the idle reap,
//! the LRU eviction, the shutdown sweep that drains running turns instead of
//! finalizing them mid-turn) is decided by the kernel's core, under the
//! policy set on the [`KernelBuilder`](settle_runtime::KernelBuilder).
//!
//! # Embedding it
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use futures_util::{SinkExt, StreamExt};
//! use settle_gateway::{Gateway, ScriptBook};
//! use settle_runtime::Kernel;
//! use settle_store::MemoryStore; // or settle_store::Store::open("settle.db")
//! use settle_stream::TurnScript;
//! use tokio_tungstenite::tungstenite::Message;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
//!     .orphan_grace(Duration::from_secs(60))
//!     .lru_cap(Some(1000))
//!     .start()
//!     .await?;
//! // Any settle_stream::Provider: an OpenAiProvider, or scripted replies.
//! let provider = Arc::new(ScriptBook::new().otherwise(TurnScript::new(["hello", ", world"])));
//! let gateway = Gateway::builder(kernel, provider)
//!     .drain_timeout(Duration::from_secs(5))
//!     .build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let serving = tokio::spawn({
//!     let gateway = gateway.clone();
//!     async move { gateway.serve(listener).await }
//! });
//!
//! // A client: create a session (this connection is attached to it), run a turn.
//! let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
//! let call = |id: u32, method: &str, params: serde_json::Value| {
//!     let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
//!     Message::text(request.to_string())
//! };
//! ws.send(call(1, "session.create", serde_json::json!({"name": "demo"}))).await?;
//! ws.send(call(2, "turn.start", serde_json::json!({"id": 1, "prompt": "hi"}))).await?;
//! let mut reply = String::new();
//! while let Some(frame) = ws.next().await {
//!     let message: serde_json::Value = serde_json::from_str(frame?.to_text()?)?;
//!     match message["method"].as_str() {
//!         Some("turn.chunk") => reply.push_str(message["params"]["text"].as_str().unwrap_or("")),
//!         Some("turn.ended") => break,
//!         _ => {} // the answers to the two requests
//!     }
//! }
//! assert_eq!(reply, "hello, world");
//!
//! // SIGTERM would do the same (see settle_runtime::signals): drain, finalize, close.
//! gateway.shutdown();
//! let report = serving.await??;
//! assert_eq!(report.finalized.len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # The server stack, and why
//!
//! [axum](https://docs.rs/axum)'s WebSocket support, on hyper and
//! tokio-tungstenite: a maintained stack where the connection is a plain
//! stream and sink in a task of ours, so the gateway sees every way a
//! client goes (a close frame, a reset, a read error, a half-open socket
//! caught by the keepalive) and detaches its transports on each, and owns
//! the bounded queue that protects the turns and the other clients from a
//! slow one. jsonrpsee was the other candidate; its server manages the
//! connection itself and offers no hook at the moment a client drops, which
//! is the one event a gateway of transports is about, and its subscription
//! buffers are not ours to bound and cut. JSON-RPC itself is a few dozen
//! lines ([`protocol`]).
//!
//! Connections are accepted by a loop of the gateway's own on hyper's
//! HTTP/1 server rather than by `axum::serve`, whose shutdown waits for
//! every connection to end by itself: here a request head has a timeout,
//! and no connection, upgraded or not, outlives the shutdown.
//!
//! # On a network
//!
//! [`GatewayBuilder::tokens`] requires a bearer token on every upgrade and
//! makes each session its creator's alone; [`GatewayBuilder::allow_origin`]
//! lists the web origins allowed; [`GatewayBuilder::tls`] serves `wss://`;
//! the builder's other setters bound connections, sessions and requests.
//! Their defaults are in `docs/gateway.md`.

mod accept;
mod auth;
mod closing;
mod connection;
mod connections;
mod conversation;
mod error;
mod excerpt;
mod fleet;
mod gateway;
mod limits;
mod listing;
mod methods;
mod origin;
mod outbox;
mod ownership;
mod params;
mod parts;
mod principals;
pub mod protocol;
mod pump;
mod rate;
mod read_ahead;
mod reading;
mod refusals;
mod scripted;
mod shared;
mod slots;
mod strict_json;
mod table;
mod tls;
mod upgrade;

pub use auth::{TokenFileError, Tokens, MIN_TOKEN_CHARS};
pub use error::{GatewayError, ScriptBookError};
pub use fleet::Fleet;
pub use gateway::{Gateway, GatewayBuilder};
pub use origin::parse_origin;
pub use params::MAX_NAME_CHARS;
pub use protocol::ErrorKind;
pub use scripted::ScriptBook;
pub use tls::{Tls, TlsError};
