//! `settle-runtime`: the tokio driver of `settle`, and what a frontend embeds.
//!
//! A frontend (a scan runner that spawns sub-agents, a chat gateway, the
//! `settle` command line) starts one [`Runtime`] over a session store and
//! drives its agents through [`SessionHandle`]s: register sessions in a tree,
//! run turns against a provider, finish, cancel, close. The runtime makes the
//! teardown correct on every path: descendants are cancelled, settled and
//! finalized before their ancestors (G1), every session is finalized exactly
//! once (G2), sweepers never take a live turn (G3), every provider stream is
//! closed (G4), a work that ignores its cancel is detached after the settle
//! timeout (G5), a chunk reaches the frontend only once the store has it
//! (G7), shutdown drains, cancels and finalizes within its bounds (G9), and a
//! closed session's handle fails with [`RuntimeError::SessionClosed`] (G10).
//!
//! Inside, one task owns the sans-IO lifecycle core (`settle-core`) and
//! executes its effects; every handle method is a message to it. A second
//! task applies the durable writes in the order the core decided them, so
//! the driver never waits on the store. Each turn runs on its own task,
//! inside a cancellation scope that is a child of its session's.
//!
//! # Embedding it
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use settle_runtime::{signals, EndReason, Outcome, Runtime, TurnRequest};
//! use settle_store::MemoryStore; // or settle_store::Store::open("settle.db")
//! use settle_stream::{ScriptedProvider, TurnScript};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = Runtime::builder(Arc::new(MemoryStore::new()))
//!     .settle_timeout(Duration::from_secs(1))
//!     .on_session_end(|end: settle_runtime::SessionEnd| println!("{} ended: {}", end.name, end.reason))
//!     .start()
//!     .await?;
//! // SIGINT/SIGTERM/SIGHUP start the graceful shutdown; a second one skips the drain.
//! tokio::spawn(signals::shutdown_on_signals(runtime.clone(), Duration::from_secs(5))?);
//!
//! let root = runtime.register("root", None).await?;
//! let child = runtime.register("recon", Some(root.id())).await?;
//!
//! let provider = Arc::new(ScriptedProvider::new([
//!     TurnScript::new(["port 22 open", ", port 80 open"]),
//! ]));
//! let mut turn = child.run_turn(provider, TurnRequest::prompt("scan")).await?;
//! let mut reply = String::new();
//! while let Some(chunk) = turn.next_chunk().await {
//!     reply.push_str(&chunk); // already persisted (G7)
//! }
//! assert_eq!(turn.outcome().await, Outcome::Completed);
//!
//! // Finishing the root winds its subtree down first (G1).
//! assert_eq!(root.finish().await?, EndReason::Completed);
//! let report = runtime.shutdown(Duration::from_secs(5)).await;
//! assert_eq!(report.store_failures, 0);
//! assert!(child.finish().await.is_err()); // closed handles fail loudly (G10)
//! # Ok(())
//! # }
//! ```
//!
//! # Shutdown
//!
//! [`Runtime::shutdown`] (or [`signals::shutdown_on_signals`]) starts no new
//! session or turn, flushes every transcript, finalizes idle sessions at
//! once, lets running turns finish within the drain, then cancels them,
//! settles them (exited or detached) and finalizes them; it returns a
//! [`ShutdownReport`] once every write is applied. Dropping every handle
//! shuts down with no drain. A process killed before that leaves its
//! sessions for `settle_store`'s recovery (G8).

mod clock;
mod command;
mod config;
mod driver;
mod error;
mod event;
mod hook;
mod ids;
mod kernel;
mod lease;
mod record;
mod recorder;
mod report;
mod session;
mod shared;
pub mod signals;
mod turn;
mod work;

pub use config::Config;
pub use error::RuntimeError;
pub use event::LifecycleEvent;
pub use hook::{SessionEnd, SessionEndHook};
pub use kernel::{Kernel, KernelBuilder, WeakKernel};
pub use report::ShutdownReport;
pub use session::SessionHandle;
pub use settle_core::{
    CancelMode, EndReason, Handled, Hold, Outcome, Policy, SessionId, State, TurnError,
    TurnErrorKind, UnknownWord, WorkId, WorkKind,
};
pub use settle_stream::Request as TurnRequest;
pub use turn::Turn;
