//! What the handles ask of the driver, what works report to it, and what the
//! recorder tells it back. Each is an input the driver turns into one input
//! of the core (or none).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use settle_core::{Event, Handled, Outcome, SessionId, TurnError, WorkId};
use settle_store::StoreError;
use settle_stream::Provider;
use settle_stream::Request as TurnRequest;
use tokio::sync::oneshot;

use crate::error::RuntimeError;
use crate::report::ShutdownReport;
use crate::shared::SessionShared;
use crate::task_work::StartTask;
use crate::tracked::Tracked;

pub(crate) type Reply<T> = oneshot::Sender<Result<T, RuntimeError>>;

/// How a work ended, as its waiter is told.
pub(crate) type WorkEnd = (Outcome, Option<TurnError>);

/// A started turn's id, the receiver of its chunks and the receiver of its
/// end: what the session's handle makes its [`Turn`](crate::Turn) of.
pub(crate) type TurnStarted = (
    // The turn's id, cancelled if the caller went away before taking it.
    crate::unclaimed::Unclaimed,
    crate::chunk_queue::ChunkReceiver,
    oneshot::Receiver<WorkEnd>,
    // Answered once the turn's start is written (or could not be).
    crate::told::Announced,
    // How many times its opening was retried, counted by the driver.
    std::sync::Arc<std::sync::atomic::AtomicU32>,
);

/// A started task's id and the receiver of its end.
pub(crate) type TaskStarted = (WorkId, oneshot::Receiver<WorkEnd>);

pub(crate) enum Command {
    Register {
        name: Arc<str>,
        parent: Option<SessionId>,
        resumed_from: Option<SessionId>,
        /// Set in the same step as the registration.
        budget: Option<settle_core::Budget>,
        /// Whose it is, for the LRU cap; `None`: its parent's (the core's rule).
        scope: Option<settle_core::Scope>,
        /// Recorded with its row as who may use it through a gateway.
        principal: Option<Arc<str>>,
        /// The caller, until told (by the recorder, or its own patience).
        reply: crate::told::RegisterTold,
    },
    /// A registration whose caller was told it failed at the store timeout
    /// of its ask (see `told.rs`): withdrawn, as the recorder's
    /// `RegisterFailed` does.
    Withdraw { session: SessionId, error: String },
    StartTurn {
        session: SessionId,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
        /// This turn's own timeouts and retries; `None` for the kernel's.
        options: Option<Box<settle_stream::TurnOptions>>,
        reply: Reply<TurnStarted>,
    },
    StartTask {
        session: SessionId,
        start: StartTask,
        reply: Reply<TaskStarted>,
    },
    Core {
        event: Event,
        reply: Option<Reply<Handled>>,
    },
    /// A hold of `session` (or, with `release`, its release) whose caller
    /// waits for its record, until told by the recorder or its own
    /// patience (see `told.rs`).
    Holds {
        session: SessionId,
        hold: settle_core::Hold,
        release: bool,
        told: crate::told::HoldTold,
    },
    /// A handle for a session this kernel knows.
    Lookup {
        session: SessionId,
        reply: Reply<Arc<SessionShared>>,
    },
    /// A session's state, as the core has it now.
    State {
        session: SessionId,
        reply: Reply<settle_core::State>,
    },
    Shutdown {
        drain: Duration,
        reply: Option<oneshot::Sender<ShutdownReport>>,
    },
    /// Begin a shutdown that hands the sessions off (SPEC §12).
    Handoff {
        drain: Duration,
        reply: Option<oneshot::Sender<ShutdownReport>>,
    },
    /// The store gave this process a released tree of sessions (parents
    /// first, each with its recorded principal's scope, for the LRU cap):
    /// the core takes it on whole, or none of it.
    Adopt {
        tree: Vec<(settle_store::Adopted, settle_core::Scope)>,
        reply: Reply<Vec<Arc<SessionShared>>>,
    },
    /// The store says this session, unknown to the core, is finalized.
    Finalized { session: SessionId },
    /// The lease renewer lost this process's lease (G8).
    LeaseLost,
    /// How much the driver tracks (for tests of a long-lived kernel).
    Tracked { reply: oneshot::Sender<Tracked> },
}

/// What the recorder tells the driver after a store call.
#[derive(Debug)]
pub(crate) enum Ack {
    /// A block of session ids was reserved.
    Ids(Range<u64>),
    /// No ids could be reserved.
    IdsFailed(StoreError),
    /// A session's row could not be written: withdraw its registration
    /// (the store's cause, as its caller was told it).
    RegisterFailed(SessionId, String),
    /// The row of a session registered at the LRU cap is committed, and
    /// its caller told so: the core makes room for it now.
    Committed(SessionId),
    /// A hold's record could not be written: the core takes the hold back,
    /// then its caller is told the store's error (G12: "held" is said only
    /// of a hold an adopter would find).
    HoldUnwritten {
        session: SessionId,
        hold: settle_core::Hold,
        /// The caller, taken from its slot: it did not give up.
        reply: Reply<settle_core::Handled>,
        error: RuntimeError,
    },
}
