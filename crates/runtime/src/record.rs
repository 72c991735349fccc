//! What the driver hands the recorder: the durable side of the effects it
//! executed, in the order the core decided them.

use std::sync::Arc;
use std::time::SystemTime;

use settle_core::{Finalize, Outcome, ShutdownSummary, Transition, TurnError, WorkId};
use settle_store::StoreError;
use tokio::sync::oneshot;

use crate::command::Reply;
use crate::report::ShutdownReport;
use crate::shared::SessionShared;

pub(crate) enum Record {
    /// Reserve a block of session ids; the answer goes back to the driver.
    ReserveIds { count: u32 },
    /// Write a registered session's row; answer the caller once committed.
    CreateSession {
        shared: Arc<SessionShared>,
        at: SystemTime,
        reply: Reply<Arc<SessionShared>>,
    },
    /// A timeline row.
    Transition {
        transition: Transition,
        at: SystemTime,
    },
    /// Open a turn's row, after the end of the session's previous turn
    /// (queued before it); `done` tells the work whether it may stream,
    /// `announce` the caller whether it has a turn.
    StartTurn {
        work: WorkId,
        at: SystemTime,
        input: Option<settle_store::TurnInput>,
        done: oneshot::Sender<Result<(), StoreError>>,
        announce: oneshot::Sender<Result<(), StoreError>>,
    },
    /// A work is over: end a turn's row, then tell whoever waits for it.
    EndTurn {
        work: WorkId,
        outcome: Outcome,
        error: Option<TurnError>,
        at: SystemTime,
        notify: Option<oneshot::Sender<crate::command::WorkEnd>>,
    },
    /// Commit every transcript now (G9).
    Flush,
    /// Run a session's finalize plan (SPEC §4).
    Finalize(Box<FinalizeJob>),
    /// Release a session for another process to adopt (SPEC §12), once
    /// every record before this one is applied.
    Release {
        session: settle_core::SessionId,
        at: SystemTime,
    },
    /// Every session is finalized: answer the shutdown's waiters once every
    /// record before this one is applied.
    ShutdownComplete {
        summary: Box<ShutdownSummary>,
        waiters: Vec<oneshot::Sender<ShutdownReport>>,
    },
}

pub(crate) struct FinalizeJob {
    pub plan: Finalize,
    pub at: SystemTime,
    /// `None` for a session the driver no longer knew (it never does today).
    pub shared: Option<Arc<SessionShared>>,
}
