//! What the driver hands the recorder: the durable side of the effects it
//! executed, in the order the core decided them, one message per wake.

use std::sync::Arc;
use std::time::SystemTime;

use settle_core::{Finalize, Outcome, ShutdownSummary, Transition, Transitions, TurnError, WorkId};
use settle_store::{TimelineStep, TurnEnding};
use tokio::sync::oneshot;

use tokio::sync::mpsc;

use crate::command::WorkEnd;
use crate::report::ShutdownReport;
use crate::shared::SessionShared;

pub(crate) enum Record {
    /// Reserve a block of session ids; the answer goes back to the driver.
    ReserveIds { count: u32 },
    /// Write a registered session's row; answer the caller once committed.
    CreateSession {
        shared: Arc<SessionShared>,
        at: SystemTime,
        /// Who may use it through a gateway, written with its row.
        principal: Option<Arc<str>>,
        reply: crate::told::RegisterTold,
        /// Registered at the LRU cap: tell the core once the row is
        /// committed ([`Ack::Committed`](crate::command::Ack::Committed)),
        /// so that it makes room then.
        room_owed: bool,
    },
    /// A timeline row.
    Transition {
        transition: Transition,
        at: SystemTime,
    },
    /// A step on the timeline of each session of a subtree's cancel.
    Transitions {
        set: Box<Transitions>,
        at: SystemTime,
    },
    /// Open a turn's row, after the end of the session's previous turn
    /// (queued before it); `told` tells the work whether it may stream and
    /// the caller whether it has a turn, unless the caller's patience told
    /// them first.
    StartTurn {
        work: WorkId,
        at: SystemTime,
        input: Option<settle_store::TurnInput>,
        told: crate::told::StartTold,
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
        holds: settle_core::Holds,
        at: SystemTime,
    },
    /// Record a session's holds for whoever adopts it (SPEC §5), in order
    /// with the records before it; then tell whoever asked for the change.
    Holds {
        session: settle_core::SessionId,
        holds: settle_core::Holds,
        told: Option<HoldsTold>,
    },
    /// Every session is finalized: answer the shutdown's waiters once every
    /// record before this one is applied.
    ShutdownComplete {
        summary: Box<ShutdownSummary>,
        waiters: Vec<oneshot::Sender<ShutdownReport>>,
    },
}

/// The caller of a hold or a release, answered once its record is committed
/// (G12: a hold a caller was told of is one an adopter finds).
#[derive(Debug)]
pub(crate) struct HoldsTold {
    /// The hold asked for; `None` for a release. A hold whose record the
    /// store refused is taken back before its caller is told why.
    pub hold: Option<settle_core::Hold>,
    /// The caller, until told: by the recorder once the record is
    /// committed (or refused), or by its own patience at its store
    /// timeout, which takes a hold back itself.
    pub told: crate::told::HoldTold,
    /// When the driver took the call: its store timeout counts from here,
    /// not from when the recorder comes to it behind other writes.
    pub asked: tokio::time::Instant,
}

pub(crate) struct FinalizeJob {
    pub plan: Finalize,
    pub at: SystemTime,
    /// `None` for a session the driver no longer knew (it never does today).
    pub shared: Option<Arc<SessionShared>>,
    /// The session's timeline steps that the same input ordered before its
    /// finalize, written with it ([`Outbox::push_finalize`]).
    pub steps: smallvec::SmallVec<[TimelineStep; 2]>,
    /// Its turn's end that the same input ordered, written with it.
    pub turn_end: Option<TurnEnding>,
    /// Who waits for that turn's end, and what to tell them once it is
    /// committed (before the rest of the plan, as its own answer was).
    pub turn_notify: Option<(oneshot::Sender<WorkEnd>, WorkEnd)>,
    /// Its write was tried and the store gave no answer it could keep (it
    /// timed out, a connection was lost at its commit): tried again, a row
    /// found finalized already was ended by that try.
    pub tried_again: bool,
    /// Its session's registration was refused to its caller and was never
    /// written: the store had no row to end.
    pub withdrawn: bool,
}

impl FinalizeJob {
    /// The plan of `plan`'s session, ordered at `at`, carrying nothing yet.
    pub fn new(plan: Finalize, at: SystemTime, shared: Option<Arc<SessionShared>>) -> Self {
        FinalizeJob {
            plan,
            at,
            shared,
            steps: smallvec::SmallVec::new(),
            turn_end: None,
            turn_notify: None,
            tried_again: false,
            withdrawn: false,
        }
    }
}

/// The driver's end of the recorder's channel. Records queue here as the
/// driver executes its inputs' effects and cross over as one message per
/// wake of the driver, in order (a wake's hundreds of work reports are one
/// send, not one each); a wake that orders more than [`Outbox::CHUNK`] (a
/// subtree's cancel) sends them in chunks as it goes, so the recorder takes
/// the first ones on the other core while the driver still executes the
/// rest.
pub(crate) struct Outbox {
    tx: mpsc::UnboundedSender<Vec<Record>>,
    queued: Vec<Record>,
}

impl Outbox {
    /// How many records an input queues before they go over anyway.
    pub const CHUNK: usize = 256;

    pub fn new(tx: mpsc::UnboundedSender<Vec<Record>>) -> Self {
        Outbox {
            tx,
            queued: Vec::new(),
        }
    }

    /// Queues `record` behind every record queued before it.
    pub fn push(&mut self, record: Record) {
        self.queued.push(record);
        if self.queued.len() >= Self::CHUNK {
            self.flush();
        }
    }

    /// Queues `job` behind every record queued before it, carrying the
    /// records just before it that are about its session (its turn's end
    /// and its transitions, which the core orders right before its
    /// finalize): its end is then one write, one row update and one
    /// timeline segment, answered once. Records already handed over, or
    /// behind a record about another session, go as they are.
    pub fn push_finalize(&mut self, mut job: FinalizeJob) {
        let session = job.plan.session;
        let mut steps: smallvec::SmallVec<[TimelineStep; 2]> = smallvec::SmallVec::new();
        while let Some(last) = self.queued.last() {
            match last {
                Record::Transition { transition, .. } if transition.session == session => {}
                Record::EndTurn { work, .. }
                    if work.session == session
                        && work.turn_no().is_some()
                        && job.turn_end.is_none() => {}
                _ => break,
            }
            match self.queued.pop() {
                Some(Record::Transition { transition, at }) => {
                    if let Some(from) = transition.from {
                        steps.push(TimelineStep {
                            from,
                            to: transition.to,
                            cause: transition.cause,
                            at,
                        });
                    }
                }
                Some(Record::EndTurn {
                    work,
                    outcome,
                    error,
                    at,
                    notify,
                }) => {
                    let no = work.turn_no().unwrap_or(work.no);
                    job.turn_notify = notify.map(|notify| (notify, (outcome, error.clone())));
                    job.turn_end = Some(TurnEnding {
                        no,
                        outcome,
                        error,
                        at,
                    });
                }
                _ => {}
            }
        }
        steps.reverse();
        job.steps = steps;
        self.push(Record::Finalize(Box::new(job)));
    }

    /// Hands everything queued to the recorder. The driver calls it at the
    /// end of each wake, before it waits again, so nothing it ordered waits
    /// for a later wake.
    pub fn flush(&mut self) {
        if !self.queued.is_empty() {
            // Room for as many as last time, up to a chunk: not grown one
            // doubling at a time.
            let room = Vec::with_capacity(self.queued.len().min(Self::CHUNK));
            let _ = self.tx.send(std::mem::replace(&mut self.queued, room));
        }
    }
}

/// A turn the store failed (its chunk was not taken), or one that ended
/// while the store has taken nothing for a store timeout (`stalled`), is
/// told how it ended at once, and `None` is left to tell later: its end's
/// write waits on the same store, behind the other turns' ends, and gives
/// its reader nothing to wait for (the write goes on as any other). Any
/// other turn's `notify` is given back, to be told once its end is written.
pub(crate) fn told_if_store_failed(
    notify: Option<oneshot::Sender<WorkEnd>>,
    outcome: Outcome,
    error: &Option<TurnError>,
    stalled: bool,
) -> Option<oneshot::Sender<WorkEnd>> {
    let store_failed = stalled
        || error
            .as_ref()
            .is_some_and(|e| e.kind == settle_core::TurnErrorKind::Store);
    match notify {
        Some(told) if store_failed => {
            let _ = told.send((outcome, error.clone()));
            None
        }
        notify => notify,
    }
}
