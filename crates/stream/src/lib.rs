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
//! - [`Scope`], [`CloseHandle`], [`Turn`], [`TurnControl`], [`TurnExit`] and
//!   [`settle`] are the handoff a runtime uses to run a turn: attach its
//!   stream to the session's cancellation scope before it can produce,
//!   cancel it, wait a bounded time for it to unwind (G5), never cancel it
//!   twice (G6), and detach it.
//! - [`Provider`] opens one stream per turn: [`ScriptedProvider`] plays the
//!   turn scripts of a scenario, [`OpenAiProvider`] talks to an
//!   OpenAI-compatible server.
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
mod error;
mod event;
mod guarded;
mod handoff;
mod idle_timeout;
mod openai;
mod provider;
mod request;
mod scripted;
mod sink;
mod sync;

pub use attach::{Attached, CloseHandle, Cut, ForceClosed, Scope};
pub use chunk::{Chunk, InvalidChunk};
pub use close::{close_best_effort, close_without_waiting, Close};
pub use error::{
    CloseError, FirstEventTimedOut, IdleTimedOut, StreamError, StreamErrorKind, Truncation,
};
pub use event::{Event, StreamEvent};
pub use guarded::Guarded;
pub use handoff::{
    run_turn, settle, CancelIssued, CancelledBy, Detached, Settled, Turn, TurnControl, TurnEnd,
    TurnExit, TurnId, TurnOptions, DEFAULT_IDLE_TIMEOUT, DEFAULT_SETTLE_TIMEOUT,
};
pub use idle_timeout::IdleTimeout;
pub use openai::{OpenAiConfig, OpenAiProvider, OpenAiStream, DEFAULT_HEADERS_TIMEOUT};
pub use provider::{EventStream, Provider, ProviderStream};
pub use request::{Message, Request, Role};
pub use scripted::{
    ScriptStats, ScriptedEnd, ScriptedPanic, ScriptedProvider, ScriptedStream, TurnScript,
    DEFAULT_IGNORE,
};
pub use settle_core::ChunkKind;
pub use sink::{ChunkSink, FnSink, SinkError};
pub use tokio_util::sync::CancellationToken;
