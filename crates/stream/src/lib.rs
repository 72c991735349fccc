//! Provider streams that always close.
//!
//! Everything between a session's work and a model provider lives here:
//!
//! - [`Guarded`] closes a provider stream exactly once, on every path: normal
//!   end, error, explicit [`close`](Close::close), drop (G4). [`Close`] is the
//!   close trait, [`close_best_effort`] the one closer every path uses.
//! - [`IdleTimeout`] ends a stream whose provider sends no event (keepalives
//!   do not count) for the idle timeout, or no first event within the
//!   first-event timeout. It only times out: `Guarded<IdleTimeout<S>>`
//!   guards the stream once and closes it before the timeout is reported.
//! - [`Work`] and [`WorkControl`] are how a runtime runs a turn's work and
//!   executes a lifecycle core's orders on it: spawn it (tracked, its
//!   stream attached to its own [`Scope`] before it can produce, each
//!   [`Chunk`] through a [`ChunkSink`] first), cancel it at most once (G6),
//!   close its stream from outside ([`CloseHandle`]), detach it (write
//!   access revoked first). The work reports [`WorkSignal`]s: stream
//!   attached, stream closed, and its [`WorkEnd`] exactly once, a panic
//!   included. The settle deadline is the core's, not this crate's (G5).
//! - [`Provider`] opens one stream per turn from a [`Request`] (the
//!   [`Message`]s so far, serde-serializable so a turn's input can be
//!   stored): [`ScriptedProvider`] plays the turn scripts of a scenario,
//!   [`OpenAiProvider`] talks to an OpenAI-compatible server. A stream
//!   yields [`Chunk`]s of a [`ChunkKind`] (text, reasoning, tool calls,
//!   usage), and ends with at most one [`StreamError`], which reads as the
//!   turn's [`TurnError`](settle_core::TurnError): a kind and a message
//!   that says why.
//!
//! Wrapping a provider stream:
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use settle_stream::{Guarded, IdleTimeout, Provider, Request, ScriptedProvider};
//! use settle_stream::{StreamEvent, TurnScript};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), settle_stream::StreamError> {
//! let provider = ScriptedProvider::new([TurnScript::new(["hello", ", world"])]);
//! let stream = provider.open(&Request::prompt("greet me")).await?;
//! let mut stream = Guarded::new(IdleTimeout::new(stream, Duration::from_secs(30)));
//!
//! let mut reply = String::new();
//! while let Some(event) = stream.next().await {
//!     if let StreamEvent::Chunk(chunk) = event? {
//!         reply.push_str(chunk.as_text().unwrap_or_default());
//!     }
//! }
//! assert_eq!(reply, "hello, world");
//! // The end was only reported once the provider stream was closed.
//! assert!(stream.is_closed());
//! assert_eq!(provider.stats().close_finished, 1);
//! # Ok(())
//! # }
//! ```

mod attach;
mod chunk;
mod close;
mod drop_close;
mod error;
mod event;
mod guarded;
mod hidden;
mod idle_timeout;
mod openai;
mod openai_chunk;
mod provider;
mod reply;
mod request;
mod retry;
mod run;
mod scripted;
mod secrets;
mod signal;
mod sink;
mod split_surrogates;
mod sse;
mod sync;
mod tool_call;
mod work;

/// The attribute a custom [`Provider`] is implemented with
/// (`#[async_trait] impl Provider for MyModel`), re-exported so that a
/// provider needs no dependency of its own for it.
pub use async_trait::async_trait;
pub use attach::{Attached, CloseHandle, Cut, ForceClosed, Scope};
pub use chunk::{Chunk, InvalidChunk};
pub use close::{close_best_effort, close_within, close_without_waiting, Close, ASYNC_CLOSE_BOUND};
pub use drop_close::DropClose;
pub use error::{
    quote, CloseError, FirstEventTimedOut, IdleTimedOut, StreamError, StreamErrorKind, Truncation,
};
pub use event::{StreamEvent, StreamItem};
pub use guarded::Guarded;
pub use hidden::hides;
pub use idle_timeout::IdleTimeout;
pub use openai::{
    OpenAiConfig, OpenAiProvider, OpenAiStream, DEFAULT_HEADERS_TIMEOUT, DEFAULT_MAX_EVENT_BYTES,
};
pub use openai_chunk::OpenAiChunks;
pub use provider::{EventStream, Provider, ProviderStream};
pub use reply::{usage_tokens, Reply, ReplyBuilder};
pub use request::{text_of_parts, Message, ModelOptions, Request, Role};
pub use retry::RetryPolicy;
pub use run::{TurnOptions, DEFAULT_IDLE_TIMEOUT};
pub use scripted::{
    ScriptStats, ScriptedEnd, ScriptedPanic, ScriptedProvider, ScriptedStream, TurnScript,
    DEFAULT_IGNORE,
};
pub use secrets::{mask_key, shown_url};
pub use settle_core::ChunkKind;
pub use signal::{CancelledBy, Keyed, SignalSink, WorkEnd, WorkSignal};
pub use sink::{ChunkSink, FnSink, SinkError};
pub use sse::{SseDecoder, SseError};
pub use tokio_util::sync::CancellationToken;
pub use tool_call::{ToolCall, ToolCalls};
pub use work::{CancelIssued, Detached, Work, WorkControl};
