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
//! When a deadline wakes you, compare it with your clock and pass the current
//! time, not the deadline: the core never sees time go backwards.
//!
//! # The contract
//!
//! - Every [`Effect`] is an order that says everything needed to execute it
//!   (cancel this work, close its stream, detach it, record its end, record
//!   this transition, run this finalize plan). A start is answered with the
//!   id of the work it admitted ([`Handled::Started`]), so a driver keeps no
//!   pending start. A driver never inspects the core's state to learn what
//!   happened.
//! - Every report of a work names its [`WorkId`]; a report from an old work
//!   (detached, or long over) is a no-op, never applied to the current one.
//! - Each input gets one answer for a finalized, forgotten, closing or
//!   unknown session, whatever finalized it, from one table applied before
//!   dispatch (the table on [`Event`]); a forgotten session is remembered
//!   as finalized, never "not known".
//! - Slots, delegations, budgets and the loss of the lease are the core's
//!   decisions too ([`Policy::slots`], [`Event::Delegate`], [`Budget`] with
//!   [`Event::SetBudget`] and [`Event::Usage`], [`Event::LeaseLost`]).
//! - [`Core::poll_timeout`] says when and why ([`Deadline`]); after
//!   `handle_timeout(now)` it never names a time at or before `now`.
//! - [`State::can_move_to`] is the one transition table; every state change
//!   goes through it.
//!
//! # Example: a driver loop
//!
//! ```
//! use std::time::{Duration, Instant};
//! use settle_core::{Core, Effect, EndReason, Event, Outcome, Policy, Scope, SessionId, WorkId};
//!
//! let mut core = Core::new(Policy::default());
//! let start = Instant::now(); // the driver's clock, never the core's
//! let (root, child) = (SessionId(1), SessionId(2));
//!
//! fn drain(core: &mut Core, log: &mut Vec<Effect>) {
//!     while let Some(effect) = core.poll_effect() {
//!         // A real driver executes it: cancel a work's token, close its
//!         // stream, run the finalize plan. A subtree's cancel comes as set
//!         // effects (all its works' cancels in one), which `singles`
//!         // spells out one order at a time.
//!         log.extend(effect.singles());
//!     }
//! }
//! let mut log = Vec::new();
//!
//! // One tenant: no scope named, the LRU cap weighs every session alike.
//! core.handle(start, Event::Register { session: root, parent: None, scope: None })?;
//! core.handle(start, Event::Register { session: child, parent: Some(root), scope: None })?;
//! // A start answers the work it admitted; the driver starts it at once.
//! let work = core.handle(start, Event::StartTurn { session: child })?.started().unwrap();
//! assert_eq!(work, WorkId::turn(child, 1));
//! drain(&mut core, &mut log);
//!
//! // The root finishes while the child is mid-turn (seed 000): the child is
//! // cancelled first, and nothing is finalized while it is still live.
//! core.handle(start, Event::AgentFinished { session: root })?;
//! drain(&mut core, &mut log);
//! assert!(log.iter().any(|e| matches!(e, Effect::CancelWork { work: w, .. } if *w == work)));
//! assert!(!log.iter().any(|e| matches!(e, Effect::Finalize(_))));
//!
//! // The child ignores the cancel: at its settle deadline it is detached (G5),
//! // then the child and only then the root are finalized (G1).
//! let deadline = core.poll_timeout().expect("a settle deadline is armed");
//! core.handle_timeout(deadline.at + Duration::from_millis(3));
//! drain(&mut core, &mut log);
//! assert!(log.contains(&Effect::DetachWork { work }));
//! let finalized: Vec<(SessionId, EndReason)> = log
//!     .iter()
//!     .filter_map(|e| match e { Effect::Finalize(f) => Some((f.session, f.reason)), _ => None })
//!     .collect();
//! assert_eq!(finalized, vec![(child, EndReason::ParentFinished), (root, EndReason::Completed)]);
//! assert_eq!(core.session(child).unwrap().last_outcome(), Some(Outcome::Detached));
//! # Ok::<(), settle_core::Error>(())
//! ```

mod adoptee;
mod answer;
mod budget;
mod core;
mod deadlines;
mod effect;
mod error;
mod event;
mod forgotten;
mod hash;
mod id;
mod policy;
mod scope;
mod session;
mod sessions;
mod tree;
mod view;
pub mod vocabulary;

pub use crate::adoptee::Adoptee;
pub use crate::answer::{answer_finalized, answer_finalized_parent};
pub use crate::core::Core;
pub use budget::{Budget, BudgetLimit};
pub use deadlines::{Deadline, DeadlineKind};
pub use effect::{
    Cause, Effect, Finalize, FinalizeStep, HandOff, Move, ShutdownSummary, Transition, Transitions,
};
pub use error::{Error, Handled};
pub use event::{Event, Hold, Holds, Sweep};
pub use id::{SessionId, WorkId, WorkKind};
pub use policy::Policy;
pub use scope::Scope;
pub use view::SessionView;
pub use vocabulary::{
    CancelMode, ChunkKind, EndReason, Outcome, State, TurnError, TurnErrorKind, UnknownWord,
};
