//! `settle-core`: the sans-IO lifecycle state machine of `settle`.
//!
//! A [`Core`] tracks a tree (or forest) of agent sessions through the
//! lifecycle `registered → running → cancelling → settled → finalized` and
//! makes the teardown guarantees of `settle` hold by construction:
//! descendants are settled before their ancestors close (G1), each session is
//! finalized exactly once (G2), no automatic reclaim takes a live turn (G3),
//! every cancelled work settles or is detached by its deadline (G5), no work
//! is cancelled twice (G6), and shutdown drains, cancels and finalizes
//! everything in order (G9).
//!
//! It does no I/O, spawns nothing and never reads a clock: time comes in as an
//! argument, and what must happen comes out as [`Effect`]s for a driver to
//! execute (the model of quinn-proto and str0m).
//!
//! # The drain rule
//!
//! **After every input ([`Core::handle`] or [`Core::handle_timeout`]), drain
//! [`Core::poll_effect`] until it returns `None`, then read
//! [`Core::poll_timeout`], before the next input.** Effects are ordered and the
//! order carries the guarantees; the next deadline moves with every input.
//! When a deadline wakes you, pass the current time, not the deadline.
//!
//! # Example: a driver loop
//!
//! ```
//! use std::time::{Duration, Instant};
//! use settle_core::{Core, Effect, Event, Outcome, Policy, SessionId};
//!
//! let mut core = Core::new(Policy::default());
//! let start = Instant::now(); // the driver's clock, never the core's
//! let (root, child) = (SessionId(1), SessionId(2));
//!
//! fn drain(core: &mut Core, log: &mut Vec<Effect>) {
//!     while let Some(effect) = core.poll_effect() {
//!         // A real driver executes it: cancel a token, close a stream, run the finalize plan.
//!         log.push(effect);
//!     }
//! }
//! let mut log = Vec::new();
//!
//! core.handle(start, Event::Register { session: root, parent: None })?;
//! drain(&mut core, &mut log);
//! core.handle(start, Event::Register { session: child, parent: Some(root) })?;
//! drain(&mut core, &mut log);
//! core.handle(start, Event::StartTurn { session: child })?;
//! drain(&mut core, &mut log);
//!
//! // The root finishes while the child is mid-turn (seed 000): the child is
//! // cancelled first, and nothing is finalized while it is still live.
//! core.handle(start, Event::AgentFinished { session: root })?;
//! drain(&mut core, &mut log);
//! assert!(log.iter().any(|e| matches!(e, Effect::CancelWork { work, .. } if work.session == child)));
//! assert!(!log.iter().any(|e| matches!(e, Effect::Finalize(_))));
//!
//! // The child ignores the cancel: at its settle deadline it is detached (G5),
//! // then the child and only then the root are finalized (G1).
//! let deadline = core.poll_timeout().expect("a settle deadline is armed");
//! core.handle_timeout(deadline + Duration::from_millis(3));
//! drain(&mut core, &mut log);
//! let finalized: Vec<SessionId> = log
//!     .iter()
//!     .filter_map(|e| match e { Effect::Finalize(f) => Some(f.session), _ => None })
//!     .collect();
//! assert_eq!(finalized, vec![child, root]);
//! assert_eq!(core.session(child).unwrap().last_outcome(), Some(Outcome::Detached));
//! # Ok::<(), settle_core::Error>(())
//! ```

mod core;
mod deadlines;
mod effect;
mod error;
mod event;
mod hash;
mod id;
mod policy;
mod session;
mod tree;
pub mod vocabulary;

pub use crate::core::Core;
pub use effect::{Cause, Effect, Finalize, FinalizeStep, Transition, WorkId};
pub use error::{Error, Handled};
pub use event::{Event, Hold, Sweep};
pub use id::SessionId;
pub use policy::Policy;
pub use session::SessionView;
pub use vocabulary::{
    CancelMode, ChunkKind, EndReason, Outcome, State, TurnError, TurnErrorKind, UnknownWord,
};
