//! A batch of lifecycle writes as the recorder builds it ([`Pending`]: its
//! writes, and what to answer for each once it is committed) and as the
//! store applies it ([`InFlight`]).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use settle_core::SessionId;
use settle_store::{Applied, LifecycleWrite, StoreError};
use tokio::sync::oneshot;

use super::unwritten::Unwritten;
use crate::command::WorkEnd;
use crate::record::FinalizeJob;
use crate::shared::SessionShared;
use crate::told::{RegisterTold, StartTold};

/// What to do with one write's result, once its batch is committed.
pub(super) enum Answer {
    Registered {
        shared: Arc<SessionShared>,
        /// The caller, until told (here, or by its own patience: see
        /// `told.rs`).
        reply: RegisterTold,
        /// Registered at the LRU cap: the driver is told once it is
        /// committed (see [`Ack::Committed`](crate::command::Ack::Committed)).
        room_owed: bool,
    },
    Transition(SessionId),
    TurnStarted {
        session: SessionId,
        /// Who waits for the start, until told (here, or by the caller's
        /// own patience: see `start_told.rs`).
        told: StartTold,
    },
    TurnEnded {
        session: SessionId,
        notify: Option<oneshot::Sender<WorkEnd>>,
        end: WorkEnd,
    },
    Finalized(Box<FinalizeJob>),
    /// The finalize of a session whose registration was refused to its
    /// caller but may have been written after all (see `retry.rs`).
    Withdrawn(SessionId),
}

impl Answer {
    /// The waiters of a turn's start, taken out to be told now (the write
    /// stays queued with an answer that tells no one); `None` for any other
    /// write, or a start whose waiters were told already.
    pub(super) fn take_start_waiting(&mut self) -> Option<Answer> {
        match self {
            Answer::TurnStarted { session, told } => {
                let waiters = told.take()?;
                Some(Answer::TurnStarted {
                    session: *session,
                    told: StartTold::new(waiters),
                })
            }
            _ => None,
        }
    }

    /// Tells the reader of a turn's end how it ended, before its write is
    /// committed (once: the answer then tells no one of it): a turn's
    /// end, alone or carried by its session's finalize, whose reader may
    /// wait no longer for a store that is not answering. The write itself
    /// is still applied, and its other answers given, once the store takes
    /// it.
    pub(super) fn tell_turn_end_now(&mut self) {
        match self {
            Answer::TurnEnded { notify, end, .. } => {
                if let Some(notify) = notify.take() {
                    let _ = notify.send(end.clone());
                }
            }
            Answer::Finalized(job) => {
                if let Some((notify, end)) = job.turn_notify.take() {
                    let _ = notify.send(end);
                }
            }
            _ => {}
        }
    }

    /// Whether it has a turn's end to tell a reader (not told yet).
    pub(super) fn tells_turn_end(&self) -> bool {
        match self {
            Answer::TurnEnded { notify, .. } => notify.is_some(),
            Answer::Finalized(job) => job.turn_notify.is_some(),
            _ => false,
        }
    }

    /// Notes what the store said of a registration or a turn's start that
    /// is to be tried again, for its caller if told at its own bound
    /// meanwhile.
    pub(super) fn note_failure(&self, unwritten: &Unwritten) {
        match self {
            Answer::TurnStarted { told, .. } => told.failed_with(unwritten.store_error()),
            Answer::Registered { reply, .. } => reply.failed_with(unwritten.store_error()),
            _ => {}
        }
    }
}

/// The writes of one batch and what to answer for each.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) writes: Vec<LifecycleWrite>,
    pub(super) answers: Vec<Answer>,
    /// Works whose end has no row (tasks): answered after the batch too, so
    /// that every answer keeps the order of the core's effects.
    pub(super) after: Vec<Answer>,
    /// Sessions registered in this batch: a later write about one of them
    /// goes in the next batch, once its row exists.
    pub(super) registered: HashSet<SessionId>,
}

impl Pending {
    /// An empty batch with room for the writes of `records` records and the
    /// transitions they take along from the hold buffer, so that a wake of
    /// thousands of records (a teardown) does not grow its vectors one
    /// doubling at a time.
    pub(super) fn for_records(records: usize) -> Pending {
        let room = records.saturating_mul(2);
        Pending {
            writes: Vec::with_capacity(room),
            answers: Vec::with_capacity(room),
            ..Pending::default()
        }
    }
}

/// What a batch's store call gives back: a result per write, or why none.
pub(super) type BatchResults = Result<Vec<Result<Applied, StoreError>>, Unwritten>;

/// A batch handed to the store and not answered yet.
pub(crate) struct InFlight {
    pub(super) answers: Vec<Answer>,
    pub(super) after: Vec<Answer>,
    pub(super) results: Pin<Box<dyn Future<Output = BatchResults> + Send>>,
    /// Beside each answer, a copy of its write and since when it waits,
    /// for the writes to try again if the store fails them (see `retry.rs`).
    pub(super) copies: Vec<Option<(LifecycleWrite, tokio::time::Instant)>>,
    /// Whether the batch is a retry of writes that failed before.
    pub(super) retry: bool,
}

impl InFlight {
    /// When the first reader of a turn's end this batch carries, not told
    /// yet, has waited `patience` (the store timeout) since its write was
    /// first tried: a try again of a write the store refused before that
    /// may be in flight past it.
    pub(super) fn tell_due(&self, patience: std::time::Duration) -> Option<tokio::time::Instant> {
        self.answers
            .iter()
            .zip(&self.copies)
            .filter(|(answer, _)| answer.tells_turn_end())
            .filter_map(|(_, copy)| copy.as_ref().map(|(_, since)| *since + patience))
            .min()
    }

    /// Tells the readers of the turns' ends that have waited `patience` by
    /// `now`; their writes stay in flight.
    pub(super) fn tell_waited(&mut self, patience: std::time::Duration, now: tokio::time::Instant) {
        for (answer, copy) in self.answers.iter_mut().zip(&self.copies) {
            if copy
                .as_ref()
                .is_some_and(|(_, since)| now.duration_since(*since) >= patience)
            {
                answer.tell_turn_end_now();
            }
        }
    }

    /// The store's results, the readers of turns' ends told at their
    /// deadline meanwhile (see [`tell_due`](Self::tell_due)).
    pub(super) async fn results_telling(&mut self, patience: std::time::Duration) -> BatchResults {
        loop {
            let due = self.tell_due(patience);
            let wait = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                results = self.results.as_mut() => return results,
                () = wait => self.tell_waited(patience, tokio::time::Instant::now()),
            }
        }
    }
}
