//! `settle-runtime`: the tokio driver of `settle`, and what a frontend embeds.
//!
//! (Crate docs are completed below once the API settles.)

mod clock;
mod command;
mod config;
mod driver;
mod error;
mod event;
mod hook;
mod recorder;
mod report;
mod runtime;
pub mod signals;
mod work;

pub use config::Config;
pub use error::RuntimeError;
pub use event::LifecycleEvent;
pub use hook::{SessionEnd, SessionEndHook};
pub use report::ShutdownReport;
pub use runtime::{Runtime, RuntimeBuilder, SessionHandle, Turn};
pub use settle_core::{
    CancelMode, EndReason, Handled, Hold, Outcome, Policy, SessionId, State, UnknownWord, WorkId,
};
pub use settle_stream::Request as TurnRequest;
