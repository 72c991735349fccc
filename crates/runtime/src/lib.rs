//! `settle-runtime`: the tokio driver of `settle`, and what a frontend embeds.
//!
//! A frontend (a scan runner that spawns sub-agents, a chat gateway, the
//! `settle` command line) starts one [`Kernel`] over a session store and
//! drives its agents through [`SessionHandle`]s: register sessions in a tree,
//! run turns against a provider, finish, cancel, close. The kernel makes the
//! teardown correct on every path: descendants are cancelled, settled and
//! finalized before their ancestors (G1), every session is finalized exactly
//! once (G2), sweepers never take a live turn (G3), every provider stream is
//! closed (G4), a work that ignores its cancel is detached after the settle
//! timeout (G5), a chunk reaches the frontend only once the store has it
//! (G7), shutdown drains, cancels and finalizes within its bounds whatever the
//! store does (G9), and a closed session's handle fails with
//! [`RuntimeError::SessionClosed`] (G10).
//!
//! # Embedding it
//!
//! A frontend in about forty lines: a root agent whose guard winds its
//! subtree down on any exit path, a child that runs a shell tool as a task
//! and streams a turn (a `Stream` of persisted chunks), and a graceful
//! shutdown on signals.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use settle_runtime::{process, signals, EndReason, Kernel, TurnRequest};
//! use settle_store::MemoryStore; // or settle_store::Store::open_async("settle.db")
//! use settle_stream::{ScriptedProvider, TurnScript}; // or OpenAiProvider
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
//!     .settle_timeout(Duration::from_secs(1))
//!     .on_session_end(|end: settle_runtime::SessionEnd| println!("{} ended: {}", end.name, end.reason))
//!     .start()
//!     .await?;
//! // SIGINT/SIGTERM/SIGHUP start the graceful shutdown; every later one skips the drain.
//! tokio::spawn(signals::shutdown_on_signals(&kernel, Duration::from_secs(5))?);
//!
//! // A `?` or a panic below drops the guard: the root is cancelled, children first (G1).
//! let root = kernel.register("root", None).await?.guard();
//! let recon = kernel.register("recon", Some(root.id())).await?;
//!
//! // A tool call under the lifecycle: cancelled with its session, detached
//! // past the settle timeout, its process group killed and reaped.
//! let tool = recon
//!     .spawn(|ctx| async move {
//!         let mut echo = tokio::process::Command::new("echo");
//!         echo.arg("22/tcp open");
//!         process::output(&ctx, echo).await
//!     })
//!     .await?;
//! let found = String::from_utf8_lossy(&tool.join().await??.stdout).trim().to_owned();
//!
//! // A turn is a Stream of chunks the store already has (G7).
//! let provider = Arc::new(ScriptedProvider::new([TurnScript::new(["port 22", " is open"])]));
//! let turn = recon.run_turn(provider, TurnRequest::prompt(found)).await?;
//! let reply: String = turn.filter_map(|chunk| async move { chunk.as_text().map(str::to_owned) }).collect().await;
//! assert_eq!(reply, "port 22 is open");
//!
//! // Finishing the root winds its subtree down first (G1), then it is finalized.
//! assert_eq!(root.finish().await?, EndReason::Completed);
//! assert_eq!(recon.finalized().await?, EndReason::ParentFinished);
//! assert!(recon.run_turn(Arc::new(ScriptedProvider::new([])), TurnRequest::prompt("more")).await.is_err()); // G10
//! let report = kernel.shutdown(Duration::from_secs(5)).await;
//! assert_eq!(report.store_failures, 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Observability
//!
//! Every turn, task, finalize and end hook runs inside a
//! `session{id,name,parent}` span (a turn's is `turn{no}`), so a `tracing`
//! subscriber sees the lifecycle with no code of the embedder's. For
//! OpenTelemetry, add `tracing-opentelemetry`'s layer to the subscriber:
//!
//! ```ignore
//! use tracing_subscriber::prelude::*;
//! let tracer = opentelemetry_otlp::new_pipeline().tracing().install_batch(runtime::Tokio)?;
//! tracing_subscriber::registry()
//!     .with(tracing_opentelemetry::layer().with_tracer(tracer))
//!     .init();
//! ```
//!
//! With the `serde` feature, the vocabulary and the result types
//! ([`ShutdownReport`], [`LifecycleEvent`], [`SessionEnd`]) serialize with
//! their stable spellings.
//!
//! # How it works, and why the driver decides nothing
//!
//! One task, the driver, owns the sans-IO lifecycle core (`settle-core`).
//! Every handle method is a message to it, every work reports to it under its
//! `WorkId`, and after each input it executes the effects the core ordered,
//! as they say: start this work, cancel its token, close its stream, detach
//! it, record its end, run this finalize plan. It never inspects the core's
//! state to infer what happened. That is deliberate: the first version of
//! this crate rebuilt lifecycle decisions in the driver (comparing snapshots
//! of a work before and after an input, reading states to guess what a cancel
//! meant), and that is where its teardown bugs lived. Now the core is the one
//! place that decides, for every frontend, and it is property-tested.
//!
//! The driver does no I/O. A second task, the recorder, applies the durable
//! writes in the order the core decided them, and answers whoever waits for a
//! write only once it is committed; its answers come back to the driver as
//! inputs. Each work runs on its own tracked task with its own cancellation
//! token.
//!
//! # Shutdown
//!
//! [`Kernel::shutdown`] (or [`signals::shutdown_on_signals`]) starts no new
//! session or turn, flushes every transcript, finalizes idle sessions at
//! once, lets running turns finish within the drain, then cancels them,
//! settles them (exited or detached) and finalizes them; it returns a
//! [`ShutdownReport`] once every write is applied, or once drain + settle
//! timeout + flush budget have passed on a store that stopped answering (what
//! was left is named in the report, for `settle recover`). Dropping every
//! handle shuts down with no drain. A process killed before that leaves its
//! sessions for `settle_store`'s recovery (G8).

mod bus;
mod clock;
mod command;
mod config;
mod driver;
mod error;
mod event;
mod fleet;
mod guard;
mod hook;
mod ids;
mod kernel;
mod lease;
mod limits;
pub mod process;
mod record;
mod recorder;
mod report;
mod resume;
mod sent;
mod session;
mod shared;
pub mod signals;
mod task;
mod task_context;
mod task_work;
mod tracked;
mod turn;
mod work;

pub use config::{Config, DEFAULT_MAX_HISTORY_BYTES, DEFAULT_MAX_PROMPT_BYTES};
pub use error::{RuntimeError, TaskError};
pub use event::LifecycleEvent;
pub use fleet::{Adoption, FleetSweep};
pub use guard::SessionGuard;
pub use hook::{SessionEnd, SessionEndHook};
pub use kernel::{Kernel, KernelBuilder, WeakKernel};
pub use report::ShutdownReport;
pub use resume::Resumed;
pub use session::SessionHandle;
pub use settle_core::{
    CancelMode, EndReason, Handled, Hold, Outcome, Policy, SessionId, State, TurnError,
    TurnErrorKind, UnknownWord, WorkId, WorkKind,
};
pub use settle_stream::{Chunk, ChunkKind, Request as TurnRequest};
pub use task::TaskHandle;
pub use task_context::TaskContext;
#[doc(hidden)]
pub use tracked::Tracked;
pub use turn::Turn;
