//! The one task that owns the core. It `select!`s over commands, work reports
//! and the core's next deadline, passes the current time on every wake, and
//! drains the core's effects after every input.

use std::collections::HashMap;
use std::sync::Arc;

use settle_core::{
    CancelMode, Core, Effect, EndReason, Event, Handled, Outcome, SessionId, State, WorkId,
};
use settle_store::{NewSession, OwnerId, SessionStore};
use tokio::sync::{broadcast, mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::command::{Command, WorkReport, WorkReportKind};
use crate::recorder::{FinalizeJob, Record};
use crate::work::{self, WorkHandle};
use crate::{Config, LifecycleEvent, RuntimeError, Turn};

struct Entry {
    token: CancellationToken,
    slot: Option<OwnedSemaphorePermit>,
    delegates: Vec<SessionId>,
    waiters: Vec<oneshot::Sender<EndReason>>,
}

/// How many work reports the driver takes per wake.
const REPORT_BATCH: usize = 256;

pub(crate) struct Driver {
    pub core: Core,
    pub clock: Clock,
    pub config: Config,
    pub store: Arc<dyn SessionStore>,
    pub owner: OwnerId,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub reports: mpsc::UnboundedReceiver<WorkReport>,
    pub report_tx: mpsc::UnboundedSender<WorkReport>,
    pub recorder: mpsc::UnboundedSender<Record>,
    pub events: broadcast::Sender<LifecycleEvent>,
    /// Store writes that failed (shared with the recorder).
    pub failures: Arc<std::sync::atomic::AtomicUsize>,
    pub slots: Option<Arc<Semaphore>>,
    pub names: HashMap<SessionId, Arc<str>>,
    sessions: HashMap<SessionId, Entry>,
    works: HashMap<WorkId, WorkHandle>,
    shutdown_waiters: Vec<oneshot::Sender<crate::ShutdownReport>>,
    done: bool,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Config,
        store: Arc<dyn SessionStore>,
        owner: OwnerId,
        commands: mpsc::UnboundedReceiver<Command>,
        recorder: mpsc::UnboundedSender<Record>,
        events: broadcast::Sender<LifecycleEvent>,
        failures: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        let (report_tx, reports) = mpsc::unbounded_channel();
        Driver {
            core: Core::new(config.policy.clone()),
            clock: Clock::new(),
            slots: config.slots.map(|n| Arc::new(Semaphore::new(n))),
            config,
            store,
            owner,
            commands,
            reports,
            report_tx,
            recorder,
            events,
            failures,
            names: HashMap::new(),
            sessions: HashMap::new(),
            works: HashMap::new(),
            shutdown_waiters: Vec::new(),
            done: false,
        }
    }

    pub async fn run(mut self) {
        let mut commands_open = true;
        // One timer, reset only when the core's next deadline moves: building
        // a new one on every wake costs a timer-wheel insert and removal per
        // input, which dominates a teardown of thousands of sessions.
        let mut timer = Box::pin(tokio::time::sleep(std::time::Duration::ZERO));
        let mut armed: Option<std::time::Instant> = None;
        let mut reports = Vec::with_capacity(REPORT_BATCH);
        while !self.done {
            let deadline = self.core.poll_timeout();
            if deadline != armed {
                if let Some(at) = deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed = deadline;
            }
            tokio::select! {
                biased;
                n = self.reports.recv_many(&mut reports, REPORT_BATCH) => {
                    for report in reports.drain(..n) {
                        self.on_report(report);
                        // The drain rule: effects after every input.
                        self.execute_effects();
                    }
                }
                command = self.commands.recv(), if commands_open => match command {
                    Some(command) => self.on_command(command).await,
                    None => {
                        // Every handle is gone: nobody can drive the sessions any more.
                        commands_open = false;
                        self.begin_shutdown(std::time::Duration::ZERO, None);
                    }
                },
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    // The current time, not the deadline: the core never sees time go back.
                    let now = self.clock.now();
                    self.core.handle_timeout(now);
                }
            }
            self.execute_effects();
        }
        // Every session is finalized, so no work may write any more; one that
        // is still around (it ignored its cancel) is abandoned, not left running.
        for (_, mut handle) in self.works.drain() {
            handle.detach();
        }
    }

    async fn on_command(&mut self, command: Command) {
        match command {
            Command::Register {
                name,
                parent,
                reply,
            } => {
                let result = self.register(name, parent).await;
                let _ = reply.send(result);
            }
            Command::StartTurn {
                session,
                provider,
                request,
                reply,
            } => {
                let result = self.start_turn(session, provider, request);
                let _ = reply.send(result);
            }
            Command::Core { event, reply } => {
                // An agent that finishes from inside its own turn ends that
                // turn with it: the core forgets the work at once.
                let finishing = match event {
                    Event::AgentFinished { session } => {
                        self.core.session(session).and_then(|v| v.work())
                    }
                    _ => None,
                };
                let result = self.handle(event);
                if let Some(work) = finishing {
                    self.forgotten(work);
                }
                if let Some(reply) = reply {
                    let _ = reply.send(result.map_err(RuntimeError::from));
                }
            }
            Command::Delegate { from, to, reply } => {
                let result = self.delegate(from, to);
                let _ = reply.send(result);
            }
            Command::WaitFinalized { session, reply } => match self.core.session(session) {
                Some(view) if view.state() == State::Finalized => {
                    // Answered by the recorder, after the finalize plan it has
                    // queued for this session: the durable row is ended first.
                    let reason = view.closing().unwrap_or(EndReason::Completed);
                    let _ = self.recorder.send(Record::Notify { reply, reason });
                }
                Some(_) => {
                    if let Some(entry) = self.sessions.get_mut(&session) {
                        entry.waiters.push(reply);
                    }
                }
                None => drop(reply),
            },
            Command::Shutdown { drain, reply } => self.begin_shutdown(drain, reply),
        }
    }

    fn handle(&mut self, event: Event) -> Result<Handled, settle_core::Error> {
        let now = self.clock.now();
        self.core.handle(now, event)
    }

    async fn register(
        &mut self,
        name: String,
        parent: Option<SessionId>,
    ) -> Result<SessionId, RuntimeError> {
        // Refuse before the durable row exists, so a refused registration writes nothing.
        self.core.check_register(parent)?;
        let id = self
            .store
            .create_session(NewSession {
                name: name.clone(),
                parent,
                owner: self.owner,
                created_at: self.clock.wall(self.clock.now()),
                resumed_from: None,
            })
            .await?;
        let _ = self.handle(Event::Register {
            session: id,
            parent,
        })?;
        // The session's scope is a child of its parent's: a cancelled parent's
        // children are born cancelled.
        let token = parent
            .and_then(|p| self.sessions.get(&p))
            .map_or_else(CancellationToken::new, |p| p.token.child_token());
        self.sessions.insert(
            id,
            Entry {
                token,
                slot: None,
                delegates: Vec::new(),
                waiters: Vec::new(),
            },
        );
        let name: Arc<str> = name.into();
        self.names.insert(id, name.clone());
        let _ = self.events.send(LifecycleEvent::Registered {
            session: id,
            name: name.to_string(),
            parent,
            at: self.clock.wall(self.clock.now()),
        });
        Ok(id)
    }

    fn start_turn(
        &mut self,
        session: SessionId,
        provider: Arc<dyn settle_stream::Provider>,
        request: crate::TurnRequest,
    ) -> Result<Turn, RuntimeError> {
        let Some(entry) = self.sessions.get_mut(&session) else {
            return Err(match self.core.session(session) {
                Some(_) => RuntimeError::SessionClosed(session),
                None => settle_core::Error::UnknownSession(session).into(),
            });
        };
        if entry.slot.is_none() {
            if let Some(slots) = &self.slots {
                let permit = slots
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| RuntimeError::NoSlot(self.config.slots.unwrap_or_default()))?;
                entry.slot = Some(permit);
            }
        }
        let session_token = entry.token.clone();
        let _ = self.handle(Event::StartTurn { session })?;
        let Some(work) = self.core.session(session).and_then(|v| v.work()) else {
            return Err(RuntimeError::SessionClosed(session));
        };
        // The turn's row is written by the recorder, in order after the end
        // of the previous turn (which the store must see first).
        let (started_tx, started) = oneshot::channel();
        let at = self.clock.wall(self.clock.now());
        let _ = self.recorder.send(Record::StartTurn {
            work,
            at,
            done: started_tx,
        });
        let (handle, turn) = work::spawn(work::WorkContext {
            work,
            provider,
            request,
            started,
            session_token: &session_token,
            store: self.store.clone(),
            reports: self.report_tx.clone(),
            events: self.events.clone(),
            failures: self.failures.clone(),
            idle_timeout: self.config.idle_timeout,
        });
        self.works.insert(work, handle);
        Ok(turn)
    }

    fn delegate(&mut self, from: SessionId, to: SessionId) -> Result<(), RuntimeError> {
        for id in [from, to] {
            if !self.sessions.contains_key(&id) {
                return Err(RuntimeError::SessionClosed(id));
            }
        }
        if let Some(entry) = self.sessions.get_mut(&from) {
            entry.delegates.push(to);
        }
        Ok(())
    }

    fn begin_shutdown(
        &mut self,
        drain: std::time::Duration,
        reply: Option<oneshot::Sender<crate::ShutdownReport>>,
    ) {
        if let Some(reply) = reply {
            self.shutdown_waiters.push(reply);
        }
        if self.core.is_shutting_down() {
            // A second request only waits for the first one's end.
            return;
        }
        let running: Vec<SessionId> = self
            .core
            .sessions()
            .filter(|s| s.state() == State::Running)
            .map(|s| s.id())
            .collect();
        let _ = self.recorder.send(Record::ShutdownBegan { running });
        let _ = self.handle(Event::BeginShutdown { drain });
    }

    fn on_report(&mut self, report: WorkReport) {
        // A report from a work that was detached (or replaced) changes nothing.
        let Some(handle) = self.works.get_mut(&report.work) else {
            return;
        };
        let session = report.work.session;
        let event = match report.kind {
            WorkReportKind::StreamAttached => Event::StreamAttached { session },
            WorkReportKind::StreamClosed => Event::StreamClosed { session },
            WorkReportKind::Ended(outcome) => {
                let outcome_tx = handle.outcome.take();
                self.works.remove(&report.work);
                let _ = self.handle(Event::TurnEnded { session, outcome });
                let recorded = self
                    .core
                    .session(session)
                    .and_then(|v| v.last_outcome())
                    .unwrap_or(outcome);
                self.end_turn(report.work, recorded);
                if let Some(tx) = outcome_tx {
                    let _ = tx.send(recorded);
                }
                return;
            }
        };
        let _ = self.handle(event);
    }

    /// The core ended `work`'s turn without waiting for the work (its agent
    /// finished from inside it). Its end is recorded now, ahead of any
    /// finalize the same input decided, and the work is abandoned (its
    /// writes revoked, its stream closed), so nothing writes to the session
    /// after its row is ended.
    fn forgotten(&mut self, work: WorkId) {
        if self.core.session(work.session).and_then(|v| v.work()) == Some(work) {
            return;
        }
        let Some(mut handle) = self.works.remove(&work) else {
            return;
        };
        handle.detach();
        let outcome = self
            .core
            .session(work.session)
            .and_then(|v| v.last_outcome())
            .unwrap_or(Outcome::Completed);
        self.end_turn(work, outcome);
        if let Some(tx) = handle.outcome.take() {
            let _ = tx.send(outcome);
        }
    }

    fn end_turn(&mut self, work: WorkId, outcome: Outcome) {
        let at = self.clock.wall(self.clock.now());
        let _ = self.recorder.send(Record::EndTurn { work, outcome, at });
        let _ = self.events.send(LifecycleEvent::TurnEnded {
            session: work.session,
            turn: work.turn,
            outcome,
        });
    }

    /// Executes every effect the core queued, in order.
    fn execute_effects(&mut self) {
        let mut flush = false;
        while let Some(effect) = self.core.poll_effect() {
            match effect {
                Effect::CancelWork { work, mode } => {
                    let session_level = self
                        .core
                        .session(work.session)
                        .is_some_and(|v| v.state() != State::Running);
                    if mode == CancelMode::Immediate {
                        // A session-level cancel cancels the session's scope,
                        // and the work's scope (its child) with it; a turn
                        // cancel only the work's.
                        let session_token = self
                            .sessions
                            .get(&work.session)
                            .filter(|_| session_level)
                            .map(|entry| &entry.token);
                        match (session_token, self.works.get(&work)) {
                            (Some(token), _) => cancel_once(token),
                            (None, Some(handle)) => cancel_once(handle.scope.token()),
                            (None, None) => {}
                        }
                    }
                    // Graceful: the turn may finish; the settle deadline bounds it.
                }
                Effect::CloseStream { work } => {
                    // The work closes its own stream when its scope is
                    // cancelled (a scope born cancelled closes one that raced
                    // the attach). Forcing it closed from outside is for a
                    // detach only: a work gets its bounded chance first (G5).
                    if let Some(handle) = self.works.get(&work) {
                        cancel_once(handle.scope.token());
                    }
                }
                Effect::DetachWork { work } => {
                    if let Some(mut handle) = self.works.remove(&work) {
                        tracing::warn!(session = %work.session, turn = work.turn,
                            "work ignored cancellation past the settle deadline; detached");
                        handle.detach();
                        if let Some(tx) = handle.outcome.take() {
                            let _ = tx.send(Outcome::Detached);
                        }
                    }
                    let _ = self.recorder.send(Record::Detached { work });
                    let _ = self.events.send(LifecycleEvent::Detached {
                        session: work.session,
                        turn: work.turn,
                    });
                    self.end_turn(work, Outcome::Detached);
                }
                Effect::FlushTranscript { .. } => flush = true,
                Effect::Transition(t) => {
                    let at = self.clock.wall(t.at);
                    if matches!(t.to, State::Settled | State::Finalized) {
                        if let Some(entry) = self.sessions.get(&t.session) {
                            cancel_once(&entry.token);
                        }
                    }
                    // Events are for displays: none are built when nobody listens.
                    if self.events.receiver_count() > 0 {
                        let _ = self.events.send(LifecycleEvent::Transition {
                            session: t.session,
                            from: t.from,
                            to: t.to,
                            cause: t.cause.to_string(),
                            at,
                        });
                    }
                    let _ = self.recorder.send(Record::Transition {
                        session: t.session,
                        from: t.from,
                        to: t.to,
                        cause: t.cause,
                        at,
                    });
                }
                Effect::Finalize(plan) => {
                    let entry = self.sessions.remove(&plan.session);
                    let (slot, delegates, waiters) = match entry {
                        Some(e) => (e.slot, e.delegates, e.waiters),
                        None => (None, Vec::new(), Vec::new()),
                    };
                    let name = self
                        .names
                        .remove(&plan.session)
                        .unwrap_or_else(|| Arc::from(""));
                    let _ = self.recorder.send(Record::Finalize(Box::new(FinalizeJob {
                        plan,
                        name,
                        slot,
                        delegates,
                        waiters,
                    })));
                }
                Effect::ShutdownComplete => {
                    let waiters = std::mem::take(&mut self.shutdown_waiters);
                    let _ = self.recorder.send(Record::ShutdownComplete { waiters });
                    self.done = true;
                }
            }
        }
        if flush {
            let _ = self.recorder.send(Record::Flush);
        }
    }
}

/// Cancels `token` unless it already is: a cancelled token's subtree is
/// already cancelled, and cancelling again takes its lock for nothing.
fn cancel_once(token: &CancellationToken) {
    if !token.is_cancelled() {
        token.cancel();
    }
}
