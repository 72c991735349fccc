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
//! # Tools, model options, budgets
//!
//! A turn's [`TurnRequest`] carries the [`ModelOptions`] a framework needs
//! (tools, `tool_choice`, `response_format`, temperature, `max_tokens`, any
//! other body field); the library puts each streamed tool call together
//! ([`Turn::tool_calls`], [`Turn::reply`]) and builds the assistant message
//! that goes back ([`Reply::to_message`]). A whole loop (model → tools
//! under [`SessionHandle::spawn`] → results → model) is `examples/tool-loop`:
//!
//! ```ignore
//! let done = session.run_turn(model.clone(), TurnRequest::new(history.clone()).options(tools)).await?.reply().await;
//! history.push(done.reply.to_message());
//! for call in &done.reply.tool_calls {
//!     let result = session.spawn(move |ctx| run_tool(ctx, call)).await?.await?;
//!     history.push(Message::tool_result(&call.id, result));
//! }
//! ```
//!
//! A [`Budget`] bounds what a session and its subtree may spend; the core
//! decides when it ran out, cancels the subtree children first (G1) and
//! finalizes it [`EndReason::BudgetExhausted`]:
//!
//! ```
//! # use std::sync::Arc;
//! # use settle_runtime::{Budget, EndReason, Kernel, TurnRequest};
//! # use settle_stream::{ScriptedProvider, TurnScript};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let kernel = Kernel::builder(Arc::new(settle_store::MemoryStore::new())).start().await?;
//! let agent = kernel.register_with_budget("agent", None, Budget::default().turns(1).tokens(50_000)).await?;
//! let model = Arc::new(ScriptedProvider::new([TurnScript::new(["one"]), TurnScript::new(["two"])]));
//! agent.run_turn(model.clone(), TurnRequest::prompt("go")).await?.outcome().await;
//! let refused = agent.run_turn(model, TurnRequest::prompt("again")).await.unwrap_err();
//! assert!(refused.is_budget_exhausted());
//! assert_eq!(agent.finalized().await?, EndReason::BudgetExhausted);
//! # Ok(()) }
//! ```
//!
//! Per turn, [`SessionHandle::run_turn_with`] sets [`TurnOptions`]: idle
//! and first-event timeouts and a [`RetryPolicy`] (a connect error, 429 or
//! 5xx before the first chunk is retried with bounded backoff, never after
//! a chunk was acknowledged, G7; an optional fallback provider).
//!
//! # What the kernel will do to your sessions on its own
//!
//! Some defaults exist for gateways (SPEC §5) and act on sessions a program
//! registered itself too. **Turn off what you do not want** on the builder:
//!
//! | what | default | end | turn it off |
//! |---|---|---|---|
//! | idle reap: a session with no turn, no hold, no child for the idle TTL | 30 min | `idle_reap` | `.idle_ttl(None)` |
//! | LRU eviction: a registration over the cap evicts the least recently active idle session of its [`Scope`] ([`Kernel::register_in`]; one scope for all by default), once its row is committed (one the store refuses evicts no one) | 1,000 open sessions | `lru_evict` | `.lru_cap(None)` |
//! | orphan reap: only sessions that had a transport attached and lost it | 60 s grace | `orphan_reap` | attach no transport |
//! | a turn's stream silent (no chunk; keepalives do not count) | 30 s ([`settle_stream::DEFAULT_IDLE_TIMEOUT`]) | turn `idle_timeout` | `.idle_timeout(None)`, or per turn |
//! | a turn's stream with no first event (its open included) | the idle timeout | turn `idle_timeout` | `.first_event_timeout(..)` (longer), or per turn |
//! | a cancelled work that does not unwind | 1 s settle timeout | turn `detached` | `.settle_timeout(..)` |
//! | a dropped [`SessionGuard`] | cancel | `cancelled` | [`SessionGuard::disarm`] |
//! | the lease not renewed in time (G8) | 30 s lease | nothing new starts, works cancelled | `.lease_ttl(..)` |
//! | every handle dropped | shutdown with no drain | `shutdown` | keep the [`Kernel`] |
//!
//! Nothing else ends a session: no budget unless one is set, no retry
//! unless a [`RetryPolicy`] asks. A held session ([`SessionHandle::hold`])
//! is never reclaimed automatically.
//!
//! # Metrics
//!
//! Counters, gauges and histograms go through the `metrics` facade (names
//! and labels in [`meter`]): install `metrics-exporter-prometheus` (or any
//! exporter) in the program before the kernel starts and they appear;
//! without one they cost nothing.
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
//! With the `otel-genai` feature the spans follow OpenTelemetry's GenAI
//! semantic conventions (opt-in while they are experimental): a turn is an
//! `invoke_agent {agent}` client span with `gen_ai.operation.name`,
//! `gen_ai.agent.name`, `gen_ai.conversation.id` (the session id),
//! `gen_ai.provider.name` ([`Provider::name`]), `gen_ai.usage.input_tokens`
//! and `gen_ai.usage.output_tokens` (from the usage chunks) and, when it
//! failed, `error.type` (the turn error's kind) with an error status; a
//! child session's span nests under its parent's, so an agent tree is one
//! trace. `tracing-opentelemetry` maps the fields; nothing more to add.
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

mod at_start;
mod backoff;
mod bus;
mod canceller;
mod chunk_append;
mod chunk_queue;
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
pub mod log_runs;
pub mod meter;
pub mod process;
mod record;
mod recorder;
mod report;
mod resume;
mod scopes;
mod sent;
mod session;
mod shared;
pub mod signals;
mod store_failures;
mod task;
mod task_context;
mod task_outcome;
mod task_work;
mod told;
mod tracked;
mod turn;
mod unclaimed;
mod work;

pub use canceller::WorkCanceller;
pub use config::{
    Config, DEFAULT_CHUNK_BUFFER, DEFAULT_CHUNK_BUFFER_BYTES, DEFAULT_MAX_HISTORY_BYTES,
    DEFAULT_MAX_PROMPT_BYTES,
};
pub use error::{RuntimeError, TaskError};
pub use event::LifecycleEvent;
pub use fleet::{Adoption, FleetSweep};
pub use guard::SessionGuard;
pub use hook::{SessionEnd, SessionEndHook};
pub use kernel::{Kernel, KernelBuilder, WeakKernel};
pub use log_runs::LogRuns;
pub use report::ShutdownReport;
pub use resume::Resumed;
pub use session::{SessionHandle, MAX_NAME_CHARS};
/// The core's refusals, as [`RuntimeError::Lifecycle`] carries them.
pub use settle_core::Error as LifecycleError;
pub use settle_core::{
    Budget, BudgetLimit, CancelMode, EndReason, Handled, Hold, Outcome, Policy, Scope, SessionId,
    State, TurnError, TurnErrorKind, UnknownWord, WorkId, WorkKind,
};
/// What a custom provider is written with: `#[async_trait] impl Provider`.
pub use settle_stream::{
    async_trait, DropClose, Provider, ProviderStream, StreamError, StreamErrorKind, StreamEvent,
};
pub use settle_stream::{
    Chunk, ChunkKind, Message, ModelOptions, Reply, Request as TurnRequest, RetryPolicy, Role,
    ToolCall, TurnOptions,
};
pub use task::TaskHandle;
pub use task_context::TaskContext;
pub use task_outcome::{TaskFailure, TaskOutcome};
#[doc(hidden)]
pub use tracing as __tracing;
#[doc(hidden)]
pub use tracked::Tracked;
pub use turn::{Turn, TurnReply, TurnResults};
