//! The batching of lifecycle writes: how the records of one wake become one
//! batch (a write about a session goes after the batch that registers it,
//! a record that is not a lifecycle write is a barrier), how a batch is
//! handed to the store and kept in flight, and how each of its writes is
//! answered once it is committed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use settle_core::{SessionId, State};
use settle_store::{
    Applied, FinalizeRequest, LifecycleWrite, NewSession, StoreError, TimelineStep,
};

use super::bounded::within;
use super::held::Held;
use super::pending::{Answer, BatchResults, InFlight, Pending};
use super::retry;
use super::unwritten::Unwritten;
use super::Recorder;
use crate::command::{Ack, Command};
use crate::record::Record;

/// Sets keyed by session: foldhash, as everywhere on the recorder's path.
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

impl Recorder {
    /// Adds one record to the batch, or, for a record that is not a
    /// lifecycle write, commits the batch so far and then applies it. `now`
    /// is when the records of this wake were taken (a held transition's
    /// hold counts from it).
    pub(super) async fn take(
        &mut self,
        record: Record,
        pending: &mut Pending,
        held: &mut Held,
        now: tokio::time::Instant,
    ) {
        // Releases queued go before anything behind them.
        if !self.releasing.is_empty() && !matches!(record, Record::Release { .. }) {
            self.release_queued().await;
        }
        let write = match record {
            Record::Release { session, holds, at } => {
                // Everything before a release is committed first (a
                // barrier); the releases that follow one another are one
                // store call.
                if self.releasing.is_empty() {
                    held.release_old(None, pending);
                    self.commit(std::mem::take(pending)).await;
                }
                self.releasing
                    .push(settle_store::Release { session, holds, at });
                None
            }
            Record::CreateSession {
                shared,
                at,
                principal,
                reply,
                room_owed,
            } => {
                let mut new = NewSession::new(shared.name.to_string(), self.owner)
                    .with_id(shared.id)
                    .at(at);
                new.principal = principal.map(|p| p.to_string());
                new.parent = shared.parent;
                new.resumed_from = shared.resumed_from;
                self.split_after(pending, &[shared.parent, shared.resumed_from])
                    .await;
                pending.registered.insert(shared.id);
                Some((
                    LifecycleWrite::Register(new),
                    Answer::Registered {
                        shared,
                        reply,
                        room_owed,
                    },
                ))
            }
            Record::Transition { transition: t, at } => {
                // Registration wrote the row, and the finalize latch writes
                // the last transition itself (G2): only the ones between go
                // here, held until the session's next write (see `HOLD`).
                if let (Some(from), true) = (t.from, t.to != State::Finalized) {
                    let step = TimelineStep {
                        from,
                        to: t.to,
                        cause: t.cause,
                        at,
                    };
                    held.hold(t.session, step, now);
                }
                None
            }
            Record::Transitions { set, at } => {
                // Each held until its session's next write, as one
                // transition record is.
                for m in &set.moves {
                    let step = TimelineStep {
                        from: m.from,
                        to: m.to,
                        cause: set.cause,
                        at,
                    };
                    held.hold(m.session, step, now);
                }
                None
            }
            Record::StartTurn {
                work,
                at,
                input,
                told,
            } => Some((
                LifecycleWrite::StartTurn {
                    session: work.session,
                    no: work.no,
                    input,
                    at,
                },
                Answer::TurnStarted {
                    session: work.session,
                    told,
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
            Record::Finalize(mut job) => {
                let session = job.plan.session;
                self.split_after(pending, &[Some(session)]).await;
                // Its end is one write: the transitions held for it and
                // those the job carries, its turn's end, then the latch.
                let steps = held.take(session).into_iter().chain(job.steps.drain(..));
                let plan = &job.plan;
                let mut request = FinalizeRequest::new(plan.reason)
                    .commit_memory(plan.commit_memory)
                    .at(job.at)
                    .after_steps(steps);
                request.turn_end = job.turn_end.take();
                if let Some(outcome) = plan.outcome {
                    request = request.with_outcome(outcome);
                }
                Some((
                    LifecycleWrite::Finalize {
                        session,
                        plan: request,
                    },
                    Answer::Finalized(job),
                ))
            }
            Record::ReserveIds { count } => {
                // Not a barrier: it touches the id counter only.
                self.reserve_ids(count);
                None
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
        let Some(mut batch) = self.hand(pending) else {
            return;
        };
        let results = batch.results_telling(self.store_timeout).await;
        self.answer_batch(batch, results).await;
    }

    /// Hands a batch to the store and keeps it in flight, answering the one
    /// before it (the store is already applying this one after it, so the
    /// database does not wait while those answers go out). A store that
    /// does not apply batches in the order they were handed to it is given
    /// one at a time.
    pub(super) async fn launch(&mut self, pending: Pending) {
        // While writes wait to be tried again, a write about to wait
        // behind them must wait behind the failures of the batch in flight
        // too, which its answer queues there: that answer comes first.
        if !self.store.applies_in_order() || !self.retries.is_empty() {
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
    pub(super) async fn land(&mut self) {
        if let Some(mut batch) = self.in_flight.take() {
            let results = batch.results_telling(self.store_timeout).await;
            self.answer_batch(batch, results).await;
        }
    }

    /// The store call of a batch, bounded as every call is; `None` for an
    /// empty one. Writes about a session whose earlier writes wait to be
    /// tried again wait behind them instead (see `retry.rs`).
    fn hand(&mut self, mut pending: Pending) -> Option<InFlight> {
        self.retries.divert(&mut pending, write_session);
        if self.stalled() {
            // The store has not answered for a store timeout: a work's end
            // waits for it no longer. Its reader is told now, its write
            // applied once the store takes it; so a reader is not held
            // much past the store timeout, however many calls wait on the
            // stalled store before its end's.
            for answer in pending.answers.iter_mut().chain(pending.after.iter_mut()) {
                answer.tell_turn_end_now();
            }
            self.retries.tell_turn_ends(std::time::Duration::ZERO);
        }
        let now = tokio::time::Instant::now();
        let copies = pending
            .writes
            .iter()
            .map(|w| retry::tried_again(w).then(|| (w.clone(), now)))
            .collect();
        self.hand_with(pending, copies, false)
    }

    /// Tells the driver whether the store is known stalled now, so that a
    /// turn's end it decides while the recorder waits on another store
    /// call (a hold's record, ids, a batch in flight) is told its reader at
    /// once rather than when the recorder comes to it.
    pub(super) fn note_stall(&self) {
        self.store_stalled
            .store(self.stalled(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the store is known not to be answering: it has not taken
    /// the writes that wait to be tried again (or are being tried) for a
    /// store timeout or longer. (A blip it heals from sooner tells a work's
    /// end once it is written, as when the store is well.)
    pub(super) fn stalled(&self) -> bool {
        self.calls_stalled
            .load(std::sync::atomic::Ordering::Relaxed)
            || self
                .retries
                .stalled_for(self.store_timeout, tokio::time::Instant::now())
    }

    /// Hands a batch whose writes come with their copies (see [`InFlight`]).
    pub(super) fn hand_with(
        &self,
        pending: Pending,
        copies: Vec<Option<(LifecycleWrite, tokio::time::Instant)>>,
        retry: bool,
    ) -> Option<InFlight> {
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
            crate::meter::batch(writes.len());
            // Fenced per writer: a session this process released, or that
            // another one adopted, is never written by it (G8, G12).
            let owner = self.owner;
            // Handed while the batch before it is in flight: chained behind
            // it, so that if that one fails, this one is refused and tried
            // again behind its writes rather than committed ahead of them.
            let chained = self.in_flight.is_some();
            Box::pin(within(self.bound(), self.deadline.clone(), async move {
                Ok(match chained {
                    true => store.apply_chained(owner, writes).await,
                    false => store.apply_as(owner, writes).await,
                })
            }))
        };
        Some(InFlight {
            answers,
            after,
            results,
            copies,
            retry,
        })
    }

    /// Answers each write of a batch with its result, then the works whose
    /// end has no row. A write the store failed in a way that may heal is
    /// queued to be tried again instead, when its waiter may wait for it
    /// (see `retry.rs`).
    pub(super) async fn answer_batch(&mut self, batch: InFlight, results: BatchResults) {
        let InFlight {
            answers,
            after,
            copies,
            retry,
            ..
        } = batch;
        if results.is_ok() {
            // The store took a transaction: answering again.
            self.calls_stalled
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        let results: Vec<Result<Applied, Unwritten>> = match results {
            Ok(results) => results
                .into_iter()
                .map(|r| r.map_err(Unwritten::from_store))
                .collect(),
            Err(unwritten) => answers.iter().map(|_| Err(unwritten.clone())).collect(),
        };
        // The sessions this kernel's own finalize of is tried again here:
        // looked up only in a retry batch with a write refused as finalized.
        let closed = |r: &Result<Applied, Unwritten>| matches!(r, Err(Unwritten::Failed(e)) if matches!(**e, StoreError::SessionClosed(_)));
        let finalizing: HashSet<SessionId> = match retry && results.iter().any(closed) {
            false => HashSet::default(),
            true => copies
                .iter()
                .flatten()
                .filter_map(|(write, _)| match write {
                    LifecycleWrite::Finalize { session, .. } => Some(*session),
                    _ => None,
                })
                .collect(),
        };
        let now = tokio::time::Instant::now();
        let mut requeued = false;
        for ((mut answer, result), copy) in answers.into_iter().zip(results).zip(copies) {
            let result = match (result, copy) {
                (Err(unwritten), Some((write, since))) if retry::may_heal(&unwritten) => {
                    if let Some(session) = write_session(&write) {
                        if !retry {
                            self.retrying(session, written_what(&write), &unwritten);
                        }
                        answer.note_failure(&unwritten);
                        if let Answer::Finalized(job) = &mut answer {
                            // It may have been committed all the same.
                            job.tried_again = true;
                        }
                        let last = unwritten;
                        let mut queued = retry::Queued {
                            write,
                            answer,
                            since,
                            last,
                        };
                        queued.tell_turn_end(self.store_timeout, now);
                        self.retries.push(session, queued);
                        requeued = true;
                        continue;
                    }
                    Err(unwritten)
                }
                // Its registration was refused to its caller and never
                // written: there is nothing to end, and nothing failed.
                (Err(Unwritten::Failed(error)), Some((write, _)))
                    if matches!(*error, StoreError::UnknownSession(_))
                        && write_session(&write).is_some_and(|s| self.retries.was_withdrawn(s)) =>
                {
                    if let Answer::Finalized(job) = &mut answer {
                        job.withdrawn = true;
                    }
                    Ok(Applied::Done)
                }
                (
                    Ok(applied @ Applied::Finalized(settle_store::Finalized::AlreadyFinalized)),
                    Some((write, _)),
                ) if write_session(&write).is_some_and(|s| self.retries.was_withdrawn(s)) => {
                    if let Answer::Finalized(job) = &mut answer {
                        job.withdrawn = true;
                    }
                    Ok(applied)
                }
                (Err(Unwritten::Failed(error)), Some((write, _)))
                    if retry && {
                        let follows =
                            write_session(&write).is_some_and(|s| finalizing.contains(&s));
                        retry::landed_before(&write, &error, follows)
                    } =>
                {
                    Ok(Applied::Done)
                }
                (result, _) => result,
            };
            self.answer(answer, result).await;
        }
        if retry && !requeued {
            self.retries.healed();
        }
        self.note_stall();
        for answer in after {
            self.answer(answer, Ok(Applied::Done)).await;
        }
    }

    pub(super) async fn answer(&mut self, answer: Answer, result: Result<Applied, Unwritten>) {
        if let Err(unwritten) = &result {
            if unwritten.lease_lost() {
                // Why, for the report: with what the store said to the
                // writes that failed before (a full disk), if any wait.
                let _ = self.lease_lost_why.set(match self.retries.last_said() {
                    Some(cause) => format!("{unwritten}, after writes that failed: {cause}"),
                    None => unwritten.to_string(),
                });
                // Another process may recover these sessions now: stop
                // everything at once rather than at the next renewal (G8).
                if let Some(commands) = self.commands.upgrade() {
                    let _ = commands.send(Command::LeaseLost);
                }
            }
        }
        match answer {
            Answer::Registered {
                shared,
                reply,
                room_owed,
            } => match (result, reply.take()) {
                (Ok(_), Some(caller)) => {
                    let id = shared.id;
                    caller.tell(Ok(shared));
                    if room_owed {
                        let _ = self.acks.send(Ack::Committed(id));
                    }
                }
                (Ok(_), None) => {
                    // Its caller was told it failed at the store timeout of
                    // its ask (and had it withdrawn), and it was written
                    // after all: ended, as one refused that may have been
                    // written is.
                    let unwritten = Unwritten::TimedOut(self.store_timeout);
                    self.retries.withdraw(shared.id, unwritten.clone());
                    let cause = unwritten.into_error("registering a session").to_string();
                    let _ = self.acks.send(Ack::RegisterFailed(shared.id, cause));
                }
                (Err(unwritten), caller) => {
                    self.failed(Some(shared.id), "register a session", &unwritten);
                    if retry::may_heal(&unwritten) {
                        // Its row may still be written: end it, once the
                        // store answers, so nothing the caller was told
                        // failed is left live.
                        self.retries.withdraw(shared.id, unwritten.clone());
                    }
                    let error = unwritten.into_error("registering a session");
                    let cause = error.to_string();
                    // The driver hears of it before the caller can ask
                    // for anything after it.
                    let _ = self.acks.send(Ack::RegisterFailed(shared.id, cause));
                    if let Some(caller) = caller {
                        caller.tell(Err(error));
                    }
                }
            },
            Answer::Withdrawn(session) => {
                // Answered (given up on or not): a later write about the
                // session that finds no row is a refusal again.
                self.retries.withdrawal_answered(session);
                self.withdrawn(session, &result);
            }
            Answer::Transition(session) => {
                if let Err(unwritten) = result {
                    self.failed(Some(session), "record a transition", &unwritten);
                }
            }
            Answer::TurnStarted { session, told } => {
                // No one waits for a start refused to its caller at the
                // store timeout and written later: its failure was said
                // when they were told, and the turn's failed end follows it.
                let Some(waiting) = told.take() else {
                    return;
                };
                let answer = match result {
                    Ok(_) => Ok(()),
                    Err(unwritten) => {
                        self.failed(Some(session), "start a turn", &unwritten);
                        Err(unwritten.store_error())
                    }
                };
                waiting.tell(answer);
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
            Answer::Finalized(mut job) => {
                // What it carried, as the writes' own answers would say.
                if let Ok(Applied::Finalized(settle_store::Finalized::Won(report))) = &result {
                    for refused in &report.refused {
                        let what = "record what a finalize carried";
                        self.failed(
                            Some(job.plan.session),
                            what,
                            &Unwritten::from_store(refused.clone()),
                        );
                    }
                }
                if let Some((notify, end)) = job.turn_notify.take() {
                    if let Err(unwritten) = &result {
                        self.failed(Some(job.plan.session), "end a turn", unwritten);
                    }
                    let _ = notify.send(end);
                }
                self.finalized(*job, result)
            }
        }
    }
}

impl Recorder {
    /// What the finalize withdrawing `session` (its registration refused
    /// to its caller) was answered.
    fn withdrawn(&mut self, session: SessionId, result: &Result<Applied, Unwritten>) {
        match result {
            Ok(Applied::Finalized(settle_store::Finalized::Won(_))) => {
                crate::store_failures::store_failure!(
                    self.failures,
                    crate::store_failures::StoreFailure::Withdrawn,
                    warn,
                    %session,
                    "a session whose registration was refused was written after all; it is finalized"
                )
            }
            // Given up at the end of a shutdown: recovery ends it.
            Err(unwritten) if retry::may_heal(unwritten) => {
                let what = "end a session whose registration was refused";
                self.failed(Some(session), what, unwritten);
                self.report.left_recoverable.push(session);
            }
            // Nothing was written (no such session), or it is ended.
            _ => {}
        }
    }
}

/// What a lifecycle write does, as a failure to do it is said.
fn written_what(write: &LifecycleWrite) -> &'static str {
    match write {
        LifecycleWrite::Register(_) => "register a session",
        LifecycleWrite::Transition { .. } => "record a transition",
        LifecycleWrite::StartTurn { .. } => "start a turn",
        LifecycleWrite::EndTurn { .. } => "end a turn",
        LifecycleWrite::Finalize { .. } => "end the durable row",
    }
}

/// The session a lifecycle write is about.
pub(super) fn write_session(write: &LifecycleWrite) -> Option<SessionId> {
    match write {
        LifecycleWrite::Register(new) => new.id,
        LifecycleWrite::Transition { session, .. }
        | LifecycleWrite::StartTurn { session, .. }
        | LifecycleWrite::EndTurn { session, .. }
        | LifecycleWrite::Finalize { session, .. } => Some(*session),
    }
}
