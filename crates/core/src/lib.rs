//! settle-core (work in progress).
mod id;
pub mod vocabulary;

pub use id::SessionId;
pub use vocabulary::{CancelMode, EndReason, Outcome, State, UnknownWord};
