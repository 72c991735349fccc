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
//! before go out meanwhile: the database never waits for the recorder.
//!
//! A transition nobody waits for (a turn's end moving its session back to
//! `registered`, a cancel moving it to `cancelling`) is held for its
//! session's next write, so that both are one row update and one timeline
//! segment: for [`HOLD`] while the store has nothing else to do, and while it
//! is busy for up to [`HOLD_BUSY`], so that a loaded store (a teardown) is not
//! handed writes that the next one carries anyway.
//!
//! Every store call is bounded: by the store timeout, and once a shutdown has
//! begun by what is left of its budget (drain + settle timeout + flush budget),
//! so that a store that stops answering cannot hold the process (G9). What
//! could not be committed in time is left for recovery (G8) and named in the
//! [`ShutdownReport`].

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use settle_core::{Finalize, FinalizeStep, SessionId, State};
use settle_store::{
    Applied, FinalizeRequest, Finalized, LifecycleWrite, NewSession, OwnerId, SessionStore,
    StoreError,
};
use tokio::sync::{mpsc, oneshot, watch};

use crate::bus::EventBus;
use crate::command::{Ack, Command, Reply, WorkEnd};
use crate::error::RuntimeError;
use crate::event::LifecycleEvent;
use crate::hook::{HookRunner, SessionEnd};
use crate::record::{FinalizeJob, Record};
use crate::report::ShutdownReport;
use crate::shared::SessionShared;

/// Maps keyed by session: foldhash on the teardown's hot path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Waits until `at` (never called without one).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs a store call within `bound`, and, once a shutdown has begun, within
/// its deadline: a shutdown that begins while the call is in flight (a
/// registration waiting on a stalled store) cuts it there.
async fn within<T>(
    bound: Duration,
    mut deadline: watch::Receiver<Option<tokio::time::Instant>>,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, Unwritten> {
    let started = tokio::time::Instant::now();
    let shutdown_ends = async move {
        match deadline.wait_for(Option::is_some).await.map(|at| *at) {
            Ok(Some(at)) => {
                tokio::time::sleep_until(at).await;
                at
            }
            _ => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        ended = tokio::time::timeout(bound, call) => match ended {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(Unwritten::from_store(error)),
            Err(_) => Err(Unwritten::TimedOut(bound)),
        },
        at = shutdown_ends => Err(Unwritten::TimedOut(at.saturating_duration_since(started))),
    }
}

/// How many queued records the recorder takes per wake.
const RECORD_BATCH: usize = 4096;

/// Why a bounded store call gave no answer.
#[derive(Debug, Clone)]
pub(crate) enum Unwritten {
    Failed(Arc<StoreError>),
    TimedOut(Duration),
}

impl Unwritten {
    fn from_store(error: StoreError) -> Self {
        Unwritten::Failed(Arc::new(error))
    }

    pub fn into_error(self, what: &'static str) -> RuntimeError {
        match self {
            Unwritten::Failed(error) => match Arc::try_unwrap(error) {
                Ok(error) => error.into(),
                Err(shared) => RuntimeError::Registration(shared),
            },
            Unwritten::TimedOut(after) => RuntimeError::StoreTimeout { what, after },
        }
    }

    /// The store's error, as a work waiting for its turn's row sees it.
    fn store_error(&self) -> StoreError {
        match self {
            Unwritten::Failed(error) => match error.as_ref() {
                StoreError::LeaseLost(owner) => StoreError::LeaseLost(*owner),
                StoreError::SessionClosed(id) => StoreError::SessionClosed(*id),
                _ => StoreError::Unavailable,
            },
            Unwritten::TimedOut(_) => StoreError::Unavailable,
        }
    }

    fn lease_lost(&self) -> bool {
        matches!(self, Unwritten::Failed(e) if matches!(e.as_ref(), StoreError::LeaseLost(_)))
    }
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unwritten::Failed(error) => error.fmt(f),
            Unwritten::TimedOut(after) => write!(f, "the store did not answer within {after:?}"),
        }
    }
}

/// What to do with one write's result, once its batch is committed.
enum Answer {
    Registered {
        shared: Arc<SessionShared>,
        reply: Reply<Arc<SessionShared>>,
    },
    Transition(SessionId),
    TurnStarted {
        session: SessionId,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    TurnEnded {
        session: SessionId,
        notify: Option<oneshot::Sender<WorkEnd>>,
        end: WorkEnd,
    },
    Finalized(Box<FinalizeJob>),
}

/// The writes of one batch and what to answer for each.
#[derive(Default)]
struct Pending {
    writes: Vec<LifecycleWrite>,
    answers: Vec<Answer>,
    /// Works whose end has no row (tasks): answered after the batch too, so
    /// that every answer keeps the order of the core's effects.
    after: Vec<Answer>,
    /// Sessions registered in this batch: a later write about one of them
    /// goes in the next batch, once its row exists.
    registered: HashSet<SessionId>,
}

pub(crate) struct Recorder {
    pub store: Arc<dyn SessionStore>,
    pub owner: OwnerId,
    pub hooks: HookRunner,
    /// The works' tracker, to count what outlives the shutdown.
    pub works: tokio_util::task::TaskTracker,
    pub store_timeout: Duration,
    pub events: EventBus,
    pub acks: mpsc::UnboundedSender<Ack>,
    pub commands: mpsc::WeakUnboundedSender<Command>,
    pub failures: Arc<AtomicUsize>,
    pub report: ShutdownReport,
    /// Once a shutdown began: when its budget runs out (set by the driver
    /// the moment it begins, so a call already in flight is cut at it too).
    pub deadline: watch::Receiver<Option<tokio::time::Instant>>,
    /// Where the final report is kept for late askers.
    pub last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
    /// The batch the store is applying while the next one is built, when
    /// the store applies batches in the order they were handed to it.
    pub in_flight: Option<InFlight>,
}

/// What a batch's store call gives back: a result per write, or why none.
type BatchResults = Result<Vec<Result<Applied, StoreError>>, Unwritten>;

/// A batch handed to the store and not answered yet.
pub(crate) struct InFlight {
    answers: Vec<Answer>,
    after: Vec<Answer>,
    results: Pin<Box<dyn Future<Output = BatchResults> + Send>>,
}

/// How long a transition nobody waits for may wait for its session's next
/// write, to be committed with it (one row update and one timeline segment
/// instead of two), while the store has nothing else to do. A crash loses at
/// most this much of timelines that no one was told about (at most
/// [`HOLD_BUSY`] while the store is busy); recovery reads the session as it
/// was before them.
const HOLD: Duration = Duration::from_millis(100);

/// How long such a transition may wait while the store is busy: while a
/// batch is in flight or the recorder has other writes for the store, one
/// whose [`HOLD`] has passed keeps waiting for its session's next write, up
/// to this long. A loaded store is then not handed writes that the next one
/// carries anyway: in a teardown longer than [`HOLD`], a session's cancel,
/// its turn's end and its finalize are still one row update and one timeline
/// segment, not two of each.
const HOLD_BUSY: Duration = Duration::from_secs(1);

/// Timeline transitions held back, per session (see [`HOLD`]).
#[derive(Default)]
struct Held {
    writes: HashMap<SessionId, HeldWrites>,
    /// When each session's first held transition came, oldest first. An
    /// entry is current while its session still holds what it was queued
    /// for (the same time); one whose session's transitions went with its
    /// next write since, even if it holds newer ones now, is skipped.
    since: VecDeque<(tokio::time::Instant, SessionId)>,
}

/// One session's held transitions, and when the first of them came.
struct HeldWrites {
    since: tokio::time::Instant,
    writes: Vec<LifecycleWrite>,
}

impl Held {
    fn hold(&mut self, session: SessionId, write: LifecycleWrite) {
        let since = &mut self.since;
        let held = self.writes.entry(session).or_insert_with(|| {
            let now = tokio::time::Instant::now();
            since.push_back((now, session));
            HeldWrites {
                since: now,
                writes: Vec::new(),
            }
        });
        held.writes.push(write);
    }

    /// Moves `session`'s held transitions into `pending`, ahead of its next write.
    fn release(&mut self, session: SessionId, pending: &mut Pending) {
        if let Some(held) = self.writes.remove(&session) {
            for write in held.writes {
                pending.writes.push(write);
                pending.answers.push(Answer::Transition(session));
            }
        }
    }

    /// Moves every transition held since before `older_than` into `pending`
    /// (all of them with `None`). Entries at the front that are not current
    /// any more are dropped whatever their age, so that they neither pile up
    /// for as long as a hold lasts nor end a later hold of the same session
    /// early.
    fn release_old(&mut self, older_than: Option<tokio::time::Instant>, pending: &mut Pending) {
        while let Some(&(since, session)) = self.since.front() {
            let current = self.writes.get(&session).is_some_and(|h| h.since == since);
            if current && older_than.is_some_and(|limit| since > limit) {
                break;
            }
            self.since.pop_front();
            if current {
                self.release(session, pending);
            }
        }
    }

    /// When the oldest held transition must be committed: [`HOLD`] after
    /// it came, or [`HOLD_BUSY`] while the store is `busy`.
    fn due(&self, busy: bool) -> Option<tokio::time::Instant> {
        self.since.front().map(|(since, _)| *since + hold_for(busy))
    }
}

/// How long a held transition may wait: [`HOLD_BUSY`] while the store is
/// `busy`, [`HOLD`] otherwise.
fn hold_for(busy: bool) -> Duration {
    if busy {
        HOLD_BUSY
    } else {
        HOLD
    }
}

impl Recorder {
    pub async fn run(mut self, mut records: mpsc::UnboundedReceiver<Record>) {
        let mut batch = Vec::with_capacity(RECORD_BATCH);
        let mut held = Held::default();
        loop {
            let due = held.due(self.in_flight.is_some());
            let in_flight = async {
                match self.in_flight.as_mut() {
                    Some(batch) => batch.results.as_mut().await,
                    None => std::future::pending().await,
                }
            };
            let received = tokio::select! {
                biased;
                // A batch is answered as soon as it is committed.
                results = in_flight => {
                    if let Some(batch) = self.in_flight.take() {
                        self.answer_batch(batch.answers, batch.after, results).await;
                    }
                    continue;
                }
                n = records.recv_many(&mut batch, RECORD_BATCH) => n,
                () = sleep_until(due), if due.is_some() => 0,
            };
            if received == 0 && due.is_none() {
                // The driver is gone and nothing is held: done.
                break;
            }
            let mut pending = Pending::default();
            for record in batch.drain(..) {
                self.take(record, &mut pending, &mut held).await;
            }
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
            self.launch(std::mem::take(&mut pending)).await;
            if closed && held.writes.is_empty() {
                break;
            }
        }
        self.land().await;
    }

    /// The bound of a store call now.
    fn bound(&self) -> Duration {
        match *self.deadline.borrow() {
            Some(deadline) => deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(self.store_timeout),
            None => self.store_timeout,
        }
    }

    /// Runs a store call within its bound. (Not an `async fn`: the future
    /// holds no reference to the recorder, whose batch in flight is not
    /// `Sync`.)
    fn bounded<T, F>(&self, call: F) -> impl Future<Output = Result<T, Unwritten>> + use<T, F>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        within(self.bound(), self.deadline.clone(), call)
    }

    /// Adds one record to the batch, or, for a record that is not a
    /// lifecycle write, commits the batch so far and then applies it.
    async fn take(&mut self, record: Record, pending: &mut Pending, held: &mut Held) {
        let write = match record {
            Record::CreateSession { shared, at, reply } => {
                let mut new = NewSession::new(shared.name.to_string(), self.owner)
                    .with_id(shared.id)
                    .at(at);
                new.parent = shared.parent;
                new.resumed_from = shared.resumed_from;
                self.split_after(pending, &[shared.parent, shared.resumed_from])
                    .await;
                pending.registered.insert(shared.id);
                Some((
                    LifecycleWrite::Register(new),
                    Answer::Registered { shared, reply },
                ))
            }
            Record::Transition { transition: t, at } => {
                // Registration wrote the row, and the finalize latch writes
                // the last transition itself (G2): only the ones between go
                // here, held until the session's next write (see `HOLD`).
                if let (Some(from), true) = (t.from, t.to != State::Finalized) {
                    held.hold(
                        t.session,
                        LifecycleWrite::Transition {
                            session: t.session,
                            from,
                            to: t.to,
                            cause: t.cause,
                            at,
                        },
                    );
                }
                None
            }
            Record::StartTurn {
                work,
                at,
                input,
                done,
            } => Some((
                LifecycleWrite::StartTurn {
                    session: work.session,
                    no: work.no,
                    input,
                    at,
                },
                Answer::TurnStarted {
                    session: work.session,
                    done,
                },
            )),
            Record::EndTurn {
                work,
                outcome,
                error,
                at,
                notify,
            } => {
                let answer = Answer::TurnEnded {
                    session: work.session,
                    notify,
                    end: (outcome, error.clone()),
                };
                match work.turn_no() {
                    Some(no) => Some((
                        LifecycleWrite::EndTurn {
                            session: work.session,
                            no,
                            outcome,
                            error,
                            at,
                        },
                        answer,
                    )),
                    None => {
                        pending.after.push(answer);
                        None
                    }
                }
            }
            Record::Finalize(job) => {
                let plan = &job.plan;
                let mut request = FinalizeRequest::new(plan.reason)
                    .commit_memory(plan.commit_memory)
                    .at(job.at);
                if let Some(outcome) = plan.last_outcome {
                    request = request.with_outcome(outcome);
                }
                Some((
                    LifecycleWrite::Finalize {
                        session: plan.session,
                        plan: request,
                    },
                    Answer::Finalized(job),
                ))
            }
            other => {
                // Everything before a barrier is committed first.
                held.release_old(None, pending);
                self.commit(std::mem::take(pending)).await;
                self.control(other).await;
                None
            }
        };
        if let Some((write, answer)) = write {
            if let Some(session) = write_session(&write) {
                if !matches!(write, LifecycleWrite::Register(_)) {
                    self.split_after(pending, &[Some(session)]).await;
                    held.release(session, pending);
                }
            }
            pending.writes.push(write);
            pending.answers.push(answer);
        }
    }

    /// Commits the batch so far if it registers one of `sessions`: a write
    /// about a session goes in a batch after the one that creates its row.
    async fn split_after(&mut self, pending: &mut Pending, sessions: &[Option<SessionId>]) {
        let needed = sessions
            .iter()
            .flatten()
            .any(|s| pending.registered.contains(s));
        if needed {
            self.commit(std::mem::take(pending)).await;
        }
    }

    /// Applies a batch in one transaction and answers each of its writes,
    /// after every batch handed to the store before it.
    async fn commit(&mut self, pending: Pending) {
        self.land().await;
        let Some(batch) = self.hand(pending) else {
            return;
        };
        let results = batch.results.await;
        self.answer_batch(batch.answers, batch.after, results).await;
    }

    /// Hands a batch to the store and keeps it in flight, answering the one
    /// before it (the store is already applying this one after it, so the
    /// database does not wait while those answers go out). A store that
    /// does not apply batches in the order they were handed to it is given
    /// one at a time.
    async fn launch(&mut self, pending: Pending) {
        if !self.store.applies_in_order() {
            return self.commit(pending).await;
        }
        let Some(mut next) = self.hand(pending) else {
            return;
        };
        // The first poll hands the batch to the store (see
        // `SessionStore::applies_in_order`); a store that applied it at once
        // has its results kept in the future.
        if let Poll::Ready(results) = next
            .results
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            next.results = Box::pin(std::future::ready(results));
        }
        self.land().await;
        self.in_flight = Some(next);
    }

    /// Waits for the batch in flight, if any, and answers it.
    async fn land(&mut self) {
        if let Some(batch) = self.in_flight.take() {
            let results = batch.results.await;
            self.answer_batch(batch.answers, batch.after, results).await;
        }
    }

    /// The store call of a batch, bounded as every call is; `None` for an
    /// empty one.
    fn hand(&self, pending: Pending) -> Option<InFlight> {
        let Pending {
            writes,
            answers,
            after,
            ..
        } = pending;
        if writes.is_empty() && after.is_empty() {
            return None;
        }
        let results: Pin<Box<dyn Future<Output = BatchResults> + Send>> = if writes.is_empty() {
            Box::pin(std::future::ready(Ok(Vec::new())))
        } else {
            let store = self.store.clone();
            Box::pin(within(self.bound(), self.deadline.clone(), async move {
                Ok(store.apply(writes).await)
            }))
        };
        Some(InFlight {
            answers,
            after,
            results,
        })
    }

    /// Answers each write of a batch with its result, then the works whose
    /// end has no row.
    async fn answer_batch(
        &mut self,
        answers: Vec<Answer>,
        after: Vec<Answer>,
        results: BatchResults,
    ) {
        match results {
            Ok(results) => {
                for (answer, result) in answers.into_iter().zip(results) {
                    self.answer(answer, result.map_err(Unwritten::from_store))
                        .await;
                }
            }
            Err(unwritten) => {
                for answer in answers {
                    self.answer(answer, Err(unwritten.clone())).await;
                }
            }
        }
        for answer in after {
            self.answer(answer, Ok(Applied::Done)).await;
        }
    }

    async fn answer(&mut self, answer: Answer, result: Result<Applied, Unwritten>) {
        if let Err(unwritten) = &result {
            if unwritten.lease_lost() {
                // Another process may recover these sessions now: stop
                // everything at once rather than at the next renewal (G8).
                if let Some(commands) = self.commands.upgrade() {
                    let _ = commands.send(Command::LeaseLost);
                }
            }
        }
        match answer {
            Answer::Registered { shared, reply } => match result {
                Ok(_) => {
                    let _ = reply.send(Ok(shared));
                }
                Err(unwritten) => {
                    self.failed(Some(shared.id), "register a session", &unwritten);
                    let _ = reply.send(Err(unwritten.into_error("registering a session")));
                    let _ = self.acks.send(Ack::RegisterFailed(shared.id));
                }
            },
            Answer::Transition(session) => {
                if let Err(unwritten) = result {
                    self.failed(Some(session), "record a transition", &unwritten);
                }
            }
            Answer::TurnStarted { session, done } => {
                let answer = match result {
                    Ok(_) => Ok(()),
                    Err(unwritten) => {
                        self.failed(Some(session), "start a turn", &unwritten);
                        Err(unwritten.store_error())
                    }
                };
                let _ = done.send(answer);
            }
            Answer::TurnEnded {
                session,
                notify,
                end,
            } => {
                if let Err(unwritten) = result {
                    self.failed(Some(session), "end a turn", &unwritten);
                }
                if let Some(notify) = notify {
                    let _ = notify.send(end);
                }
            }
            Answer::Finalized(job) => self.finalized(*job, result),
        }
    }

    /// A record that is not a lifecycle write, applied between batches.
    async fn control(&mut self, record: Record) {
        match record {
            Record::ReserveIds { count } => {
                let ack = match self.bounded(self.store.reserve_ids(count)).await {
                    Ok(range) => Ack::Ids(range),
                    Err(Unwritten::Failed(error)) => {
                        Ack::IdsFailed(Arc::try_unwrap(error).unwrap_or(StoreError::Unavailable))
                    }
                    Err(Unwritten::TimedOut(_)) => Ack::IdsFailed(StoreError::Unavailable),
                };
                let _ = self.acks.send(ack);
            }
            Record::Flush => {
                self.report.flushed_in_budget = match self.bounded(self.store.flush()).await {
                    Ok(()) => true,
                    Err(unwritten) => {
                        self.failed(None, "flush transcripts", &unwritten);
                        false
                    }
                };
            }
            Record::ShutdownComplete { summary, waiters } => {
                let until = self
                    .deadline
                    .borrow()
                    .unwrap_or_else(|| tokio::time::Instant::now() + self.store_timeout);
                let mut report = std::mem::take(&mut self.report);
                report.hooks_abandoned = self.hooks.settle(until).await;
                report.works_abandoned = self.works.len();
                report.drained = summary.drained;
                report.cancelled = summary.cancelled;
                report.detached = summary.detached.iter().map(|w| w.session).collect();
                report.store_failures = self.failures.load(Ordering::Relaxed);
                report.lease_lost = summary.lease_lost;
                let _ = self.last_report.set(report.clone());
                for waiter in waiters {
                    let _ = waiter.send(report.clone());
                }
            }
            // Lifecycle writes never reach here.
            Record::CreateSession { .. }
            | Record::Transition { .. }
            | Record::StartTurn { .. }
            | Record::EndTurn { .. }
            | Record::Finalize(_) => {}
        }
    }

    /// The rest of the finalize plan of SPEC §4, once the row's latch was
    /// committed (or could not be): each step best-effort, in order.
    fn finalized(&mut self, job: FinalizeJob, result: Result<Applied, Unwritten>) {
        let FinalizeJob { plan, shared, .. } = job;
        let session = plan.session;
        let span = match &shared {
            Some(shared) => {
                tracing::info_span!(parent: &shared.span, "finalize", reason = %plan.reason)
            }
            None => tracing::Span::none(),
        };
        let _entered = span.enter();
        let mut memory_committed = false;
        for step in Finalize::PLAN {
            match step {
                // The store's writer applies writes in order: every chunk
                // appended before this plan was committed before its latch.
                FinalizeStep::PersistTranscript => {}
                // Committed inside the latch's transaction, so memory is never
                // committed for a session someone else finalized (G2, G7).
                FinalizeStep::CommitMemory => {}
                FinalizeStep::EndRow => match &result {
                    Ok(Applied::Finalized(Finalized::Won(report))) => {
                        memory_committed = report.memories > 0;
                        for failed in &report.failed_steps {
                            tracing::warn!(%session, step = failed.step.as_str(), error = %failed.error, "finalize step failed; the rest ran");
                        }
                    }
                    Ok(_) => {
                        tracing::warn!(%session, "the durable row was already finalized elsewhere");
                    }
                    Err(unwritten) => {
                        self.failed(Some(session), "end the durable row", unwritten);
                        if plan.in_shutdown {
                            self.report.left_recoverable.push(session);
                        }
                    }
                },
                FinalizeStep::EndHook => {
                    let name = shared
                        .as_ref()
                        .map(|s| s.name.to_string())
                        .unwrap_or_default();
                    let span = shared.as_ref().map(|s| s.span.clone());
                    self.hooks.fire(
                        span,
                        SessionEnd {
                            session,
                            name,
                            reason: plan.reason,
                            completed: plan.completed(),
                            interrupted: plan.interrupted(),
                        },
                    );
                }
                // The core freed the slot and interrupted the delegations
                // when it ordered the plan (steps 5 and 6 are its decisions).
                FinalizeStep::ReleaseSlot | FinalizeStep::InterruptDelegations => {}
            }
        }
        if plan.in_shutdown {
            self.report.finalized.push((session, plan.reason));
        }
        self.events
            .emit(shared.as_deref(), || LifecycleEvent::Finalized {
                session,
                reason: plan.reason,
                memory_committed,
            });
        if let Some(shared) = shared {
            shared.set_finalized(plan.reason);
        }
    }

    fn failed(&self, session: Option<SessionId>, what: &str, unwritten: &Unwritten) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(?session, error = %unwritten, "failed to {what}");
        self.events.emit(None, || LifecycleEvent::StoreFailed {
            session,
            message: format!("failed to {what}: {unwritten}"),
        });
    }
}

/// The session a lifecycle write is about.
fn write_session(write: &LifecycleWrite) -> Option<SessionId> {
    match write {
        LifecycleWrite::Register(new) => new.id,
        LifecycleWrite::Transition { session, .. }
        | LifecycleWrite::StartTurn { session, .. }
        | LifecycleWrite::EndTurn { session, .. }
        | LifecycleWrite::Finalize { session, .. } => Some(*session),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use settle_core::Cause;

    use super::*;

    fn step(session: u64) -> LifecycleWrite {
        LifecycleWrite::Transition {
            session: SessionId(session),
            from: State::Running,
            to: State::Registered,
            cause: Cause::TurnEnded(settle_core::Outcome::Completed),
            at: SystemTime::UNIX_EPOCH,
        }
    }

    fn released(pending: &Pending) -> Vec<SessionId> {
        pending
            .answers
            .iter()
            .filter_map(|a| match a {
                Answer::Transition(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    /// A session whose held transitions went with its next write leaves no
    /// entry behind for as long as a hold lasts: the entries at the front are
    /// dropped at the next release, whatever their age, and those still held
    /// stay until their own time.
    #[tokio::test(start_paused = true)]
    async fn entries_of_released_sessions_do_not_wait_for_their_hold() {
        let mut held = Held::default();
        held.hold(SessionId(1), step(1));
        held.hold(SessionId(2), step(2));
        tokio::time::advance(Duration::from_millis(10)).await;
        held.hold(SessionId(3), step(3));

        // Session 1's next write takes its transition along.
        let mut pending = Pending::default();
        held.release(SessionId(1), &mut pending);
        assert_eq!(released(&pending), [SessionId(1)]);
        assert_eq!(held.since.len(), 3, "released lazily, at the next release");

        // Nothing is old enough to go, but session 1's entry is dropped.
        let mut pending = Pending::default();
        let long_ago = tokio::time::Instant::now() - Duration::from_millis(50);
        held.release_old(Some(long_ago), &mut pending);
        assert!(released(&pending).is_empty());
        assert_eq!(held.since.len(), 2);
        assert_eq!(held.due(false), Some(held.since[0].0 + HOLD));

        // Past the first hold, session 2 goes and session 3 stays.
        let mut pending = Pending::default();
        let first_due = held.since[0].0;
        held.release_old(Some(first_due), &mut pending);
        assert_eq!(released(&pending), [SessionId(2)]);
        assert_eq!(held.since.len(), 1);
        assert!(held.writes.contains_key(&SessionId(3)));
    }

    /// A session held again after its transitions went with a write keeps
    /// the time of its new hold: the old entry does not end it early.
    #[tokio::test(start_paused = true)]
    async fn a_session_held_again_keeps_the_time_of_its_new_hold() {
        let mut held = Held::default();
        held.hold(SessionId(1), step(1));
        let first = tokio::time::Instant::now();
        held.release(SessionId(1), &mut Pending::default());
        tokio::time::advance(Duration::from_millis(50)).await;
        held.hold(SessionId(1), step(1));

        // The first hold's time has passed, the second's has not.
        let mut pending = Pending::default();
        held.release_old(Some(first), &mut pending);
        assert!(released(&pending).is_empty(), "the new hold ended early");
        assert_eq!(held.since.len(), 1);
        assert_eq!(
            held.due(false),
            Some(first + Duration::from_millis(50) + HOLD)
        );

        let mut pending = Pending::default();
        held.release_old(Some(first + Duration::from_millis(50)), &mut pending);
        assert_eq!(released(&pending), [SessionId(1)]);
        assert!(held.since.is_empty() && held.writes.is_empty());
    }
}
