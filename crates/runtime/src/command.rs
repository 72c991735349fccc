//! What the handles ask of the driver, and what works report to it.

use std::sync::Arc;

use settle_core::{EndReason, Event, Handled, Outcome, SessionId, WorkId};
use settle_stream::Provider;
use tokio::sync::oneshot;

use crate::{RuntimeError, ShutdownReport, Turn, TurnRequest};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, RuntimeError>>;

pub(crate) enum Command {
    Register {
        name: String,
        parent: Option<SessionId>,
        reply: Reply<SessionId>,
    },
    StartTurn {
        session: SessionId,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
        reply: Reply<Turn>,
    },
    Core {
        event: Event,
        reply: Option<Reply<Handled>>,
    },
    Delegate {
        from: SessionId,
        to: SessionId,
        reply: Reply<()>,
    },
    WaitFinalized {
        session: SessionId,
        reply: oneshot::Sender<EndReason>,
    },
    Shutdown {
        drain: std::time::Duration,
        reply: Option<oneshot::Sender<ShutdownReport>>,
    },
}

/// A work's report about itself.
#[derive(Debug)]
pub(crate) struct WorkReport {
    pub work: WorkId,
    pub kind: WorkReportKind,
}

#[derive(Debug)]
pub(crate) enum WorkReportKind {
    StreamAttached,
    StreamClosed,
    Ended(Outcome),
}
