//! The recorder: one task that applies the kernel's durable writes in the
//! order the core decided them (rows, timeline, turns, finalize plans), so the
//! driver never waits on the store, and answers whoever waits for a write only
//! once it is committed (G7).
//!
//! Lifecycle writes are group-committed: everything queued when the recorder
//! wakes goes to the store as one batch ([`SessionStore::apply`]), applied in
//! one transaction with a result per write, each finalize still its row's
//! compare-and-set (G2). A registration, a turn start or a finalize waits for
//! the batch that holds it, and no longer. When the store applies batches in
//! the order they are handed to it ([`SessionStore::applies_in_order`], as
//! the database store's one writer thread does), the next batch is handed
//! over while one is still being committed, and the answers of the one
//! before go out meanwhile: the database never waits for the recorder. It
//! is handed chained behind that one ([`SessionStore::apply_chained`]): if
//! that one's transaction fails, this one is refused too and its writes
//! are tried again behind the failed ones, so that a write is never
//! committed ahead of one decided before it (a parent's finalize ahead of
//! its child's), even when the database takes writes again in between.
//!
//! A session's end is one write: the finalize carries the session's turn
//! end and transitions that the driver's same input ordered right before
//! it (`Outbox::push_finalize`), and those held for it here, so that its
//! row, its turn and its timeline segment are written by one lifecycle
//! write, answered once.
//!
//! A transition nobody waits for (a turn's end moving its session back to
//! `registered`, a cancel moving it to `cancelling`) is held for its
//! session's next write, so that both are one row update and one timeline
//! segment: for [`HOLD`](held::HOLD) while the store has nothing else to do,
//! and while it is busy for up to [`HOLD_BUSY`](held::HOLD_BUSY), so that a
//! loaded store (a teardown) is not handed writes that the next one carries
//! anyway.
//!
//! Every store call is bounded: by the store timeout, and once a shutdown has
//! begun by what is left of its budget (drain + settle timeout + flush budget),
//! so that a store that stops answering cannot hold the process (G9). What
//! could not be committed in time is left for recovery (G8) and named in the
//! [`ShutdownReport`].
//!
//! # Where each part lives
//!
//! - here: the [`Recorder`], its loop, and the records that are not
//!   lifecycle writes (a block of ids, the flush, the shutdown's end);
//! - `batch.rs`: the batching of lifecycle writes, from the records of one
//!   wake to the answer of each write;
//! - `pending.rs`: a batch as it is built and while the store applies it;
//! - `held.rs`: the hold buffer of transitions nobody waits for;
//! - `bounded.rs`: the bounded store calls, and what a failed one does;
//! - `unwritten.rs`: why a bounded call gave no answer;
//! - `retry.rs`: the writes a store blip left unwritten, tried again;
//! - `finalize.rs`: the finalize plan, once its row's latch is committed;
//! - `handoff.rs`: a session released for another process (SPEC §12);
//! - `holds.rs`: a session's holds, recorded for whoever adopts it;
//! - `shutdown.rs`: the shutdown report and its waiters.

mod batch;
mod bounded;
mod finalize;
mod handoff;
mod held;
mod holds;
mod pending;
mod reserve;
mod retry;
mod shutdown;
mod unwritten;

use std::sync::Arc;
use std::time::Duration;

use settle_store::{OwnerId, SessionStore};
use tokio::sync::{mpsc, watch};

use self::held::{hold_for, Held};
use self::pending::{InFlight, Pending};
use self::retry::Retries;
use crate::bus::EventBus;
use crate::command::{Ack, Command};
use crate::hook::HookRunner;
use crate::record::Record;
use crate::report::ShutdownReport;

/// How many queued records the recorder takes per wake (give or take the
/// last message: the driver sends one per wake, at most a chunk each).
const RECORD_BATCH: usize = 4096;

/// Once a shutdown has begun, the longest wait between two tries of the
/// writes a store blip left unwritten: its budget is a few seconds.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// Waits until `at` (never called without one).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) struct Recorder {
    pub store: Arc<dyn SessionStore>,
    /// Set while the store has taken nothing for a store timeout, for the
    /// driver, which then tells a turn's end as soon as it decides it
    /// (see `note_stall`).
    pub store_stalled: Arc<std::sync::atomic::AtomicBool>,
    /// Set when a store call of the recorder's own (ids, a hold's record,
    /// a release, a flush) was not answered within its bound, until one
    /// is: the store is then known stalled too (see `stalled`).
    pub calls_stalled: Arc<std::sync::atomic::AtomicBool>,
    pub owner: OwnerId,
    pub hooks: HookRunner,
    /// The works' tracker, to count what outlives the shutdown.
    pub works: tokio_util::task::TaskTracker,
    pub store_timeout: Duration,
    pub events: EventBus,
    pub acks: mpsc::UnboundedSender<Ack>,
    pub commands: mpsc::WeakUnboundedSender<Command>,
    pub failures: Arc<crate::store_failures::StoreFailures>,
    pub report: ShutdownReport,
    /// Once a shutdown began: when its budget runs out (set by the driver
    /// the moment it begins, so a call already in flight is cut at it too).
    pub deadline: watch::Receiver<Option<tokio::time::Instant>>,
    /// Where the final report is kept for late askers.
    pub last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
    /// Why the lease was lost, once the renewer says (for the report).
    pub lease_lost_why: Arc<std::sync::OnceLock<String>>,
    /// The batch the store is applying while the next one is built, when
    /// the store applies batches in the order they were handed to it.
    pub in_flight: Option<InFlight>,
    /// The writes a store blip left unwritten, to try again.
    pub retries: Retries,
    /// The holds records a store blip refused, to write once it heals.
    pub owed_holds: holds::OwedHolds,
    /// Whether the shutdown's time for the store's writes was said to have
    /// run out (once: every write left fails then).
    pub spent_said: std::cell::Cell<bool>,
    /// The reservation of session ids in flight, if any (see `reserve`).
    pub reserving: Option<tokio::task::JoinHandle<()>>,
    /// Sessions to release for adoption, queued while releases come one
    /// after another, released as one call before any other record is
    /// taken (see `handoff`).
    pub releasing: Vec<settle_store::Release>,
}

impl Recorder {
    pub async fn run(mut self, mut records: mpsc::UnboundedReceiver<Vec<Record>>) {
        let mut batch: Vec<Vec<Record>> = Vec::new();
        let mut held = Held::default();
        loop {
            let due = held.due(self.in_flight.is_some());
            self.hurry_in_shutdown();
            let retry_due = self.retries.due();
            let holds_due = self.owed_holds.due();
            let store_timeout = self.store_timeout;
            let in_flight = async {
                match self.in_flight.as_mut() {
                    // Its turns' readers told at their deadline meanwhile.
                    Some(batch) => batch.results_telling(store_timeout).await,
                    None => std::future::pending().await,
                }
            };
            let received = tokio::select! {
                biased;
                // A batch is answered as soon as it is committed.
                results = in_flight => {
                    if let Some(batch) = self.in_flight.take() {
                        self.answer_batch(batch, results).await;
                    }
                    continue;
                }
                // Left in flight: the records that come meanwhile are
                // taken, and the readers of works' ends they carry told at
                // once that the store is stalled (see `hand`).
                () = sleep_until(retry_due), if retry_due.is_some() => {
                    self.retry_in_flight().await;
                    continue;
                }
                () = sleep_until(holds_due), if holds_due.is_some() => {
                    self.retry_holds().await;
                    continue;
                }
                n = records.recv_many(&mut batch, 1) => n,
                () = sleep_until(due), if due.is_some() => 0,
            };
            // As many records as are waiting, up to a batch's worth: a
            // subtree's cancel or a shutdown is many messages, and each
            // batch stays one bounded store call.
            let mut taken: usize = batch.iter().map(Vec::len).sum();
            while taken < RECORD_BATCH {
                match records.try_recv() {
                    Ok(more) => {
                        taken += more.len();
                        batch.push(more);
                    }
                    Err(_) => break,
                }
            }
            if received == 0 && due.is_none() {
                // The driver is gone and nothing is held: done.
                break;
            }
            let mut pending = Pending::for_records(taken);
            let now = tokio::time::Instant::now();
            // The store calls a record makes are waited for in turn, each
            // up to the store timeout: once the store is known stalled, the
            // readers of the works' ends that wait behind them are told now
            // (their writes stay in order), not one store timeout per call
            // ahead of them later.
            // `told_upto`: the groups whose ends were told ahead so far;
            // records that come meanwhile are taken into this round too.
            let mut groups = std::mem::take(&mut batch);
            let (mut at, mut told_upto) = (0, 0);
            while at < groups.len() {
                let mut queue = std::mem::take(&mut groups[at]).into_iter();
                at += 1;
                let mut told_here = told_upto >= at;
                while let Some(mut record) = queue.next() {
                    if self.stalled() {
                        if !told_here {
                            told_here = true;
                            tell_ends(std::iter::once(&mut record));
                            tell_ends(queue.as_mut_slice().iter_mut());
                        }
                        while let Ok(more) = records.try_recv() {
                            groups.push(more);
                        }
                        tell_ends(groups[told_upto.max(at)..].iter_mut().flatten());
                        told_upto = groups.len();
                    }
                    self.take(record, &mut pending, &mut held, now).await;
                }
            }
            groups.clear();
            batch = groups;
            let closed = received == 0 && records.is_closed() && records.is_empty();
            if closed {
                held.release_old(None, &mut pending);
            } else {
                // A busy store gets held transitions only past `HOLD_BUSY`.
                let busy = self.in_flight.is_some() || !pending.writes.is_empty();
                if let Some(limit) = tokio::time::Instant::now().checked_sub(hold_for(busy)) {
                    held.release_old(Some(limit), &mut pending);
                }
            }
            self.release_queued().await;
            self.launch(std::mem::take(&mut pending)).await;
            if closed && held.writes.is_empty() {
                break;
            }
        }
        self.land().await;
        self.settle_retries().await;
        self.reserved().await;
    }

    /// A record that is not a lifecycle write, applied between batches.
    async fn control(&mut self, record: Record) {
        match record {
            Record::Flush => {
                if !self.retries.is_empty() {
                    self.retry().await;
                }
                self.flush().await;
            }
            Record::Holds {
                session,
                holds,
                told,
            } => self.record_holds(session, holds, told).await,
            Record::ShutdownComplete { summary, waiters } => {
                self.settle_retries().await;
                self.complete_shutdown(summary, waiters).await;
            }
            // Lifecycle writes, and the records `take` handles itself (a
            // reservation beside the writes, a release queued with those
            // that follow it), never reach here.
            Record::ReserveIds { .. }
            | Record::Release { .. }
            | Record::CreateSession { .. }
            | Record::Transition { .. }
            | Record::Transitions { .. }
            | Record::StartTurn { .. }
            | Record::EndTurn { .. }
            | Record::Finalize(_) => {}
        }
    }
}

/// Tells the readers of the works' ends `records` carry how they ended,
/// now, without writing them (see the recorder's loop): a turn's end, alone
/// or carried by its session's finalize. Each is told once.
fn tell_ends<'a>(records: impl Iterator<Item = &'a mut Record>) {
    for record in records {
        match record {
            Record::EndTurn {
                outcome,
                error,
                notify,
                ..
            } => {
                if let Some(notify) = notify.take() {
                    let _ = notify.send((*outcome, error.clone()));
                }
            }
            Record::Finalize(job) => {
                if let Some((notify, end)) = job.turn_notify.take() {
                    let _ = notify.send(end);
                }
            }
            _ => {}
        }
    }
}
