//! The one task that owns the core, and executes what it orders.
//!
//! It decides nothing about the lifecycle: it is one flat `match` over the
//! commands of handles, the reports of works and the answers of the
//! recorder, each turned into one input of the core, and one flat `match`
//! over the effects the core orders. All it does, mechanically:
//!
//! - turns each command into one input of the core (or answers it from its
//!   own tables: a session's shared half, the core's state of it), and a
//!   start the core admitted (`Handled::Started`) into a spawned work;
//! - after every input, drains the core's effects and executes each as it
//!   says: cancels a work's token, closes its stream, detaches it, hands its
//!   end, the transitions the core marks for the timeline and the finalize
//!   plan to the recorder, forgets a finalized session;
//! - keeps one timer for the core's next deadline and, after every wake,
//!   compares that deadline with the clock itself (a steady stream of
//!   commands cannot push a settle deadline past its bound, G5);
//! - does no I/O: the store is written by the recorder, whose answers come
//!   back here as inputs (a registration's row, a block of ids).
//!
//! It never looks at the core's state to guess what an input did: what the
//! core decided comes out as effects, and only effects are executed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use settle_core::{
    Adoptee, CancelMode, Core, Effect, Event, Handled, Scope, SessionId, State, WorkId,
};
use settle_store::SessionStore;
use settle_stream::Request as TurnRequest;
use settle_stream::{Provider, TurnOptions, WorkSignal};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::EventBus;
use crate::clock::Clock;
use crate::command::{Ack, Command, Reply, TurnStarted};
use crate::config::Config;
use crate::error::RuntimeError;
use crate::event::LifecycleEvent;
use crate::ids::IdBlock;
use crate::record::{FinalizeJob, HoldsTold, Outbox, Record};
use crate::report::ShutdownReport;
use crate::shared::SessionShared;
use crate::store_failures::StoreFailures;
use crate::task_work::{self, StartTask};
use crate::tracked::Tracked;
use crate::unclaimed::Unclaimed;
use crate::work::{self, WorkHandle};

/// The driver's tables, keyed by ids it was handed: foldhash, not SipHash,
/// on the teardown's hot path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How many reports (or acknowledgements) the driver takes per wake.
const BATCH: usize = 512;

/// What a start command brought, for the work the core admits (or for the
/// refusal it answers): never kept past the input that asks the core.
enum Start {
    Turn {
        provider: Arc<dyn Provider>,
        request: TurnRequest,
        options: Option<Box<TurnOptions>>,
        reply: Reply<TurnStarted>,
    },
    Task {
        start: StartTask,
        reply: Reply<crate::command::TaskStarted>,
    },
}

impl Start {
    /// Whether its caller stopped waiting for the answer.
    fn is_abandoned(&self) -> bool {
        match self {
            Start::Turn { reply, .. } => reply.is_closed(),
            Start::Task { reply, .. } => reply.is_closed(),
        }
    }

    /// Answers the caller that the start was refused.
    fn refuse(self, refused: RuntimeError) {
        match self {
            Start::Turn { reply, .. } => {
                let _ = reply.send(Err(refused));
            }
            Start::Task { reply, .. } => {
                let _ = reply.send(Err(refused));
            }
        }
    }
}

/// A registration waiting for a block of ids.
struct Parked {
    name: Arc<str>,
    parent: Option<SessionId>,
    resumed_from: Option<SessionId>,
    budget: Option<settle_core::Budget>,
    scope: Option<Scope>,
    principal: Option<Arc<str>>,
    reply: crate::told::RegisterTold,
}

pub(crate) struct Channels {
    pub commands: mpsc::UnboundedReceiver<Command>,
    /// Where the driver's own answers send a command back to it: a started
    /// turn whose caller went away cancels itself through it.
    pub loopback: mpsc::WeakUnboundedSender<Command>,
    pub acks: mpsc::UnboundedReceiver<Ack>,
    pub recorder: mpsc::UnboundedSender<Vec<Record>>,
    /// Where the driver publishes the shutdown's deadline: the recorder
    /// cuts even a store call already in flight at it.
    pub shutdown_deadline: watch::Sender<Option<tokio::time::Instant>>,
    /// Only handed to works, for their chunks: the driver itself never awaits it.
    pub store: Arc<dyn SessionStore>,
}

/// What the driver shares with the rest of the kernel.
pub(crate) struct Parts {
    pub clock: Clock,
    pub events: EventBus,
    pub works: TaskTracker,
    pub ids: IdBlock,
    pub failures: Arc<StoreFailures>,
    pub shutting_down: CancellationToken,
    /// Where the last shutdown's report is kept (the recorder writes it;
    /// the driver does when the recorder is gone).
    pub last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
    /// Set by the recorder while the store has taken nothing for a store
    /// timeout (see `Recorder::note_stall`).
    pub store_stalled: Arc<AtomicBool>,
}

pub(crate) struct Driver {
    core: Core,
    clock: Clock,
    /// The time of the current wake (see `tick`).
    now: std::time::Instant,
    /// `now` on the wall clock, mapped once per wake: every record of the
    /// wake's inputs is stamped with it (five per session in a teardown).
    wall_now: std::time::SystemTime,
    config: Config,
    commands: mpsc::UnboundedReceiver<Command>,
    loopback: mpsc::WeakUnboundedSender<Command>,
    reports: mpsc::UnboundedReceiver<(WorkId, WorkSignal)>,
    report_tx: mpsc::UnboundedSender<(WorkId, WorkSignal)>,
    acks: mpsc::UnboundedReceiver<Ack>,
    /// The recorder's records, sent once per wake (in chunks for a big one).
    recorder: Outbox,
    shutdown_deadline: watch::Sender<Option<tokio::time::Instant>>,
    store: Arc<dyn SessionStore>,
    events: EventBus,
    works_tracker: TaskTracker,
    ids: IdBlock,
    parked: VecDeque<Parked>,
    /// Turn starts the core answered `TurnSettling`, by session: each is
    /// asked again once that session's turn has ended (its `EndWork`),
    /// which the settle deadline bounds (G5).
    settling: HashMap<SessionId, Vec<Start>>,
    /// Starts whose turn before has ended, to ask the core again at the
    /// end of the wake (not from inside the effects that freed them).
    unsettled: VecDeque<(SessionId, Start)>,
    /// What the handles of each open session share (nothing the core
    /// decides with); dropped when its finalize is executed.
    sessions: HashMap<SessionId, Arc<SessionShared>>,
    works: HashMap<WorkId, WorkHandle>,
    shutdown_waiters: Vec<oneshot::Sender<ShutdownReport>>,
    /// Store writes that failed, counted by the works' chunk writes too.
    failures: Arc<StoreFailures>,
    /// Told when a shutdown begins, for frontends waiting to start more.
    shutting_down: CancellationToken,
    /// The metrics moved by the effects it executes.
    meter: crate::meter::Meter,
    /// Set once the recorder's task ended before the driver (it panicked):
    /// the report a shutdown gets then, nothing more being written.
    recorder_lost: Option<ShutdownReport>,
    /// The caller of the hold or release being handled, until its
    /// `RecordHolds` effect takes it to the recorder.
    holds_told: Option<(SessionId, HoldsTold)>,
    last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
    /// The store has taken nothing for a store timeout: a turn's end is
    /// told its reader as soon as it is decided, not when written.
    store_stalled: Arc<AtomicBool>,
    done: bool,
}

impl Driver {
    pub fn new(config: Config, channels: Channels, parts: Parts) -> Self {
        let (report_tx, reports) = mpsc::unbounded_channel();
        let policy = config.policy.clone().slots(config.slots);
        let now = parts.clock.now();
        Driver {
            core: Core::new(policy),
            now,
            wall_now: parts.clock.wall(now),
            clock: parts.clock,
            config,
            commands: channels.commands,
            loopback: channels.loopback,
            reports,
            report_tx,
            acks: channels.acks,
            recorder: Outbox::new(channels.recorder),
            shutdown_deadline: channels.shutdown_deadline,
            store: channels.store,
            events: parts.events,
            works_tracker: parts.works,
            ids: parts.ids,
            parked: VecDeque::new(),
            settling: HashMap::default(),
            unsettled: VecDeque::new(),
            sessions: HashMap::default(),
            works: HashMap::default(),
            shutdown_waiters: Vec::new(),
            failures: parts.failures,
            shutting_down: parts.shutting_down,
            meter: crate::meter::Meter::default(),
            recorder_lost: None,
            holds_told: None,
            last_report: parts.last_report,
            store_stalled: parts.store_stalled,
            done: false,
        }
    }

    pub async fn run(mut self) {
        let mut commands_open = true;
        // One timer, reset only when the core's next deadline moves.
        let mut timer = Box::pin(tokio::time::sleep(Duration::ZERO));
        let mut armed = None;
        let mut reports = Vec::with_capacity(BATCH);
        let mut acks = Vec::with_capacity(BATCH);
        let mut ending: std::collections::HashSet<WorkId, foldhash::fast::RandomState> =
            std::collections::HashSet::default();
        while !self.done {
            let deadline = self.core.poll_timeout().map(|d| d.at);
            if deadline != armed {
                if let Some(at) = deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed = deadline;
            }
            tokio::select! {
                biased;
                () = &mut timer, if armed.is_some() => armed = None,
                n = self.reports.recv_many(&mut reports, BATCH) => {
                    self.tick();
                    reports.truncate(n);
                    self.on_reports(&mut reports, &mut ending);
                }
                n = self.acks.recv_many(&mut acks, BATCH), if self.recorder_lost.is_none() => {
                    self.tick();
                    if n == 0 {
                        // Closed: the recorder is gone. A closed channel is
                        // always ready; polling it again would spin.
                        self.lose_recorder();
                    }
                    for ack in acks.drain(..n) {
                        self.on_ack(ack);
                    }
                }
                command = self.commands.recv(), if commands_open => match command {
                    Some(command) => {
                        self.tick();
                        // The reports sent before this command was (a task's
                        // end, before its caller had the result and asked for
                        // what follows) may have arrived after the reports
                        // were polled in this pass: they go first (G6).
                        while reports.len() < BATCH {
                            match self.reports.try_recv() {
                                Ok(report) => reports.push(report),
                                Err(_) => break,
                            }
                        }
                        if !reports.is_empty() {
                            self.on_reports(&mut reports, &mut ending);
                        }
                        // So do the recorder's answers sent before it (a
                        // registration withdrawn, told to its caller, who
                        // then asked for a shutdown).
                        if self.recorder_lost.is_none() {
                            while let Ok(ack) = self.acks.try_recv() {
                                self.on_ack(ack);
                            }
                        }
                        self.on_command(command);
                    }
                    None => {
                        // Every handle is gone: nobody can drive the sessions any more.
                        commands_open = false;
                        self.begin_shutdown(Duration::ZERO, None, Event::BeginShutdown { drain: Duration::ZERO });
                    }
                },
            }
            // quinn's `drive_timer`: whatever woke us, a deadline that is due
            // is handled now, with the current time.
            self.tick();
            if self.core.poll_timeout().is_some_and(|d| d.at <= self.now) {
                self.core.handle_timeout(self.now);
                self.execute();
            }
            self.ask_again();
            self.recorder.flush();
        }
        self.recorder.flush();
        // Every session is finalized, so no work may write any more; one that
        // is still around is abandoned, not left running.
        for (_, mut handle) in self.works.drain() {
            handle.detach();
        }
        for parked in self.parked.drain(..) {
            parked.reply.tell(Err(RuntimeError::Stopped));
        }
        let waiting = self.settling.drain().flat_map(|(_, starts)| starts);
        for start in waiting.chain(self.unsettled.drain(..).map(|(_, start)| start)) {
            start.refuse(RuntimeError::Stopped);
        }
    }

    /// Asks the core again for each start whose turn before has ended, in
    /// the order they came; the core answers each as it would a new one.
    fn ask_again(&mut self) {
        while let Some((session, start)) = self.unsettled.pop_front() {
            if !start.is_abandoned() {
                self.start(Event::StartTurn { session }, start);
            }
        }
    }

    /// The recorder's task ended before the driver: it panicked (a store
    /// whose call panics, a log writer that panics when its disk is full),
    /// and nothing more can be written. Said once; the kernel shuts down at
    /// once, and its report leaves every session still open for recovery
    /// (G8), as a stalled store's does.
    fn lose_recorder(&mut self) {
        tracing::error!(
            live = self.sessions.len(),
            "the store's recorder stopped (it panicked): nothing more can be written; \
             shutting down, every live session left for `settle recover`"
        );
        self.failures.add();
        self.recorder_lost = Some(ShutdownReport {
            left_recoverable: self.sessions.keys().copied().collect(),
            store_failures: self.failures.count(),
            ..ShutdownReport::default()
        });
        let zero = Duration::ZERO;
        self.begin_shutdown(zero, None, Event::BeginShutdown { drain: zero });
    }

    /// Reads the clock once per wake: every input of the wake carries the
    /// same time (the core never sees it go back).
    fn tick(&mut self) {
        self.now = self.clock.now();
        self.wall_now = self.clock.wall(self.now);
    }

    /// The wall-clock time of a core instant: the wake's own, mapped once
    /// in `tick`, or any other.
    fn wall(&self, at: std::time::Instant) -> std::time::SystemTime {
        match at == self.now {
            true => self.wall_now,
            false => self.clock.wall(at),
        }
    }

    /// Feeds one input to the core and executes what it ordered.
    /// Takes a batch of works' reports. A work closes its stream just
    /// before it ends: when both reports are in the batch, the end alone
    /// says it all (the core forgets the work and its stream with it).
    fn on_reports(
        &mut self,
        reports: &mut Vec<(WorkId, WorkSignal)>,
        ending: &mut std::collections::HashSet<WorkId, foldhash::fast::RandomState>,
    ) {
        ending.clear();
        ending.extend(
            reports
                .iter()
                .filter(|(_, s)| matches!(s, WorkSignal::Ended(_)))
                .map(|(w, _)| *w),
        );
        for report in reports.drain(..) {
            let closing = matches!(report.1, WorkSignal::StreamClosed);
            if closing && ending.contains(&report.0) {
                continue;
            }
            self.on_report(report);
        }
    }

    fn input(&mut self, event: Event) -> Result<Handled, settle_core::Error> {
        let handled = self.core.handle(self.now, event);
        self.execute();
        handled
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Register {
                name,
                parent,
                resumed_from,
                budget,
                scope,
                principal,
                reply,
            } => self.register(Parked {
                name,
                parent,
                resumed_from,
                budget,
                scope,
                principal,
                reply,
            }),
            Command::StartTurn {
                session,
                provider,
                request,
                options,
                reply,
            } => self.start_turn(session, provider, request, options, reply),
            Command::StartTask {
                session,
                start,
                reply,
            } => self.start(Event::StartTask { session }, Start::Task { start, reply }),
            Command::Core { event, reply } => {
                let skipping = matches!(event, Event::SkipDrain);
                let result = self.input(event);
                if skipping {
                    self.skip_drain_budget();
                }
                if let Some(reply) = reply {
                    let _ = reply.send(result.map_err(RuntimeError::from));
                }
            }
            // A hold's or a release's caller is answered by the recorder
            // once the holds it changed are committed (or by its own
            // patience); any other answer (a no-op, a refusal) is the
            // core's, now.
            Command::Holds {
                session,
                hold,
                release,
                told,
            } => {
                let (event, hold) = match release {
                    false => (Event::Hold { session, hold }, Some(hold)),
                    true => (Event::Release { session, hold }, None),
                };
                let asked = tokio::time::Instant::now();
                self.holds_told = Some((session, HoldsTold { hold, told, asked }));
                let result = self.input(event);
                // Not handed to the recorder: no record to wait for.
                if let Some((_, unrecorded)) = self.holds_told.take() {
                    unrecorded.told.tell(result.map_err(RuntimeError::from));
                }
            }
            // The core's state of it says what a missing entry means: its
            // finalize was executed (closed), or it was never registered here.
            Command::Lookup { session, reply } => {
                let found = match (self.sessions.get(&session), self.core.state(session)) {
                    (Some(shared), _) => Ok(shared.clone()),
                    (None, Some(_)) => Err(RuntimeError::SessionClosed(session)),
                    (None, None) => Err(settle_core::Error::UnknownSession(session).into()),
                };
                let _ = reply.send(found);
            }
            Command::State { session, reply } => {
                let state = self
                    .core
                    .state(session)
                    .ok_or_else(|| settle_core::Error::UnknownSession(session).into());
                let _ = reply.send(state);
            }
            Command::Shutdown { drain, reply } => {
                self.begin_shutdown(drain, reply, Event::BeginShutdown { drain });
            }
            Command::Tracked { reply } => {
                let _ = reply.send(Tracked {
                    core_sessions: self.core.sessions().count(),
                    sessions: self.sessions.len(),
                    works: self.works.len(),
                });
            }
            Command::Handoff { drain, reply } => {
                self.begin_shutdown(drain, reply, Event::BeginHandoff { drain });
            }
            Command::Adopt { tree, reply } => self.adopt(tree, reply),
            Command::Finalized { session } => {
                self.core.remember_finalized(session);
            }
            Command::LeaseLost => self.begin_shutdown(Duration::ZERO, None, Event::LeaseLost),
            Command::Withdraw { session, error } => self.withdraw(session, error),
        }
    }

    fn register(&mut self, parked: Parked) {
        // Registrations keep their order while ids are on their way.
        if !self.parked.is_empty() {
            self.parked.push_back(parked);
        } else if let Some(parked) = self.try_register(parked) {
            self.parked.push_back(parked);
        }
    }

    /// Registers under the next reserved id; hands the registration back when
    /// the block is empty (a refill is on its way).
    fn try_register(&mut self, parked: Parked) -> Option<Parked> {
        let Some(id) = self.ids.take(&mut self.recorder) else {
            return Some(parked);
        };
        let Parked {
            name,
            parent,
            resumed_from,
            budget,
            scope,
            principal,
            reply,
        } = parked;
        let session = SessionId(id);
        if !reply.registering(session) {
            // Its caller was told it failed at the store timeout while it
            // waited here for its ids: it is not registered.
            return None;
        }
        let registered = self.core.handle(
            self.now,
            Event::Register {
                session,
                parent,
                scope,
            },
        );
        match registered {
            Err(refused) => {
                reply.tell(Err(refused.into()));
            }
            Ok(handled) => {
                if let Some(budget) = budget {
                    // The same step: nothing of it runs before its budget.
                    let set = self
                        .core
                        .handle(self.now, Event::SetBudget { session, budget });
                    if let Err(error) = set {
                        tracing::error!(%error, "the core refused a new session's budget");
                    }
                }
                let parent_span = parent.and_then(|p| self.sessions.get(&p)).map(|p| &p.span);
                let shared = SessionShared::new(session, name, parent, resumed_from, parent_span);
                self.sessions.insert(session, shared.clone());
                // The row goes first: every record the registration's
                // effects queue is about a session the store has.
                let at = self.wall_now;
                let room_owed = handled == Handled::EvictsOnCommit;
                self.recorder.push(Record::CreateSession {
                    shared,
                    at,
                    principal,
                    reply,
                    room_owed,
                });
            }
        }
        self.execute();
        None
    }

    /// The store gave this process `tree` (SPEC §12): the core takes it on
    /// whole, or refuses it (a shutdown began, the cap has no room for all
    /// of it) and the caller releases it again. Answered in the tree's
    /// order.
    fn adopt(
        &mut self,
        tree: Vec<(settle_store::Adopted, Scope)>,
        reply: Reply<Vec<Arc<SessionShared>>>,
    ) {
        let members = tree
            .iter()
            .map(|(adopted, scope)| Adoptee {
                session: adopted.session,
                parent: adopted.parent,
                turns: adopted.turns,
                last_outcome: adopted.last_outcome,
                holds: adopted.holds,
                scope: *scope,
            })
            .collect();
        match self.core.handle(self.now, Event::AdoptTree { members }) {
            Err(refused) => {
                let _ = reply.send(Err(refused.into()));
            }
            Ok(_) => {
                let mut taken = Vec::with_capacity(tree.len());
                for (adopted, _) in tree {
                    let session = adopted.session;
                    let parent = self.core.session(session).and_then(|s| s.parent());
                    let parent_span = parent.and_then(|p| self.sessions.get(&p)).map(|p| &p.span);
                    let shared =
                        SessionShared::new(session, adopted.name.into(), parent, None, parent_span);
                    self.sessions.insert(session, shared.clone());
                    taken.push(shared);
                }
                let _ = reply.send(Ok(taken));
            }
        }
        self.execute();
    }

    fn start_turn(
        &mut self,
        session: SessionId,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
        options: Option<Box<TurnOptions>>,
        reply: Reply<TurnStarted>,
    ) {
        let start = Start::Turn {
            provider,
            request,
            options,
            reply,
        };
        self.start(Event::StartTurn { session }, start);
    }

    /// Asks the core to admit a start: the work it names is spawned with
    /// what the command brought, after the input's effects (its transition
    /// is recorded before the work's first write); a refusal answers the
    /// caller.
    fn start(&mut self, event: Event, start: Start) {
        let admitted = self.core.handle(self.now, event);
        self.execute();
        match admitted {
            Ok(Handled::Started(work)) => self.start_work(work, start),
            Ok(other) => {
                tracing::error!(?other, "the core answered a start without a work");
                start.refuse(RuntimeError::Stopped);
            }
            // Its turn before was cancelled and is still unwinding: the
            // start waits for that turn's end instead of being refused.
            Err(settle_core::Error::TurnSettling { session, .. })
                if matches!(start, Start::Turn { .. }) =>
            {
                self.settling.entry(session).or_default().push(start);
            }
            Err(refused) => start.refuse(refused.into()),
        }
    }

    /// Feeds the input that begins a shutdown (`BeginShutdown`, or
    /// `LeaseLost`, which begins one with no drain) and publishes the
    /// shutdown's deadline for the recorder's writes.
    fn begin_shutdown(
        &mut self,
        drain: Duration,
        reply: Option<oneshot::Sender<ShutdownReport>>,
        event: Event,
    ) {
        self.shutdown_waiters.extend(reply);
        if self.core.is_shutting_down() {
            let _ = self.input(event);
            return;
        }
        // The recorder's budget for the shutdown's writes starts now.
        let bound = self.config.shutdown_bound(drain);
        let deadline = crate::clock::after(bound);
        self.shutdown_deadline.send_replace(Some(deadline));
        let _ = self.input(event);
        self.shutting_down.cancel();
        for parked in self.parked.drain(..) {
            parked
                .reply
                .tell(Err(settle_core::Error::ShuttingDown.into()));
        }
    }

    /// A second signal skips the rest of the drain: the shutdown's budget
    /// for the store's writes loses the drain's part too (what is left is
    /// the settle timeout and the flush budget, from now), so that a
    /// stalled store does not hold the process for a drain nobody waits
    /// for. Only ever brought closer.
    fn skip_drain_budget(&mut self) {
        let Some(current) = *self.shutdown_deadline.borrow() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let sooner = now
            .checked_add(self.config.shutdown_bound(Duration::ZERO))
            .filter(|&at| at < current);
        if let Some(at) = sooner {
            self.shutdown_deadline.send_replace(Some(at));
        }
    }

    fn on_report(&mut self, (work, signal): (WorkId, WorkSignal)) {
        let event = match signal {
            WorkSignal::StreamAttached => Event::StreamAttached { work },
            WorkSignal::StreamClosed => Event::StreamClosed { work },
            WorkSignal::Usage { tokens } => Event::Usage { work, tokens },
            // Not a lifecycle fact: the work is still opening its stream.
            WorkSignal::Retrying {
                attempt,
                delay,
                fallback,
                error,
            } => {
                crate::meter::turn_retry();
                if let Some(handle) = self.works.get(&work) {
                    handle
                        .retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                if let Some(shared) = self.sessions.get(&work.session) {
                    self.events
                        .emit(Some(shared), || LifecycleEvent::TurnRetried {
                            session: work.session,
                            work,
                            attempt,
                            delay,
                            fallback,
                            error,
                        });
                }
                return;
            }
            WorkSignal::Ended(end) => {
                if let Some(handle) = self.works.get_mut(&work) {
                    handle.error = end.error().cloned();
                    handle.reported_end();
                }
                Event::WorkEnded {
                    work,
                    outcome: end.outcome(),
                }
            }
        };
        // A report from a forgotten session is as stale as one from a gone work.
        let _ = self.input(event);
    }

    fn on_ack(&mut self, ack: Ack) {
        match ack {
            Ack::Ids(range) => {
                self.ids.refill(range);
                while let Some(parked) = self.parked.pop_front() {
                    if let Some(parked) = self.try_register(parked) {
                        self.parked.push_front(parked);
                        break;
                    }
                }
            }
            Ack::IdsFailed(error) => {
                self.ids.failed();
                tracing::error!(%error, "no session ids could be reserved");
                let error = Arc::new(error);
                for parked in self.parked.drain(..) {
                    parked
                        .reply
                        .tell(Err(RuntimeError::Registration(error.clone())));
                }
            }
            Ack::RegisterFailed(session, error) => self.withdraw(session, error),
            Ack::Committed(session) => {
                // Stale (finalized since, or a shutdown began): a no-op.
                let _ = self.input(Event::Committed { session });
            }
            Ack::HoldUnwritten {
                session,
                hold,
                reply,
                error,
            } => {
                // Finalized since: nothing is held any more, and nothing to take back.
                let _ = self.input(Event::Release { session, hold });
                let _ = reply.send(Err(error));
            }
        }
    }

    /// A registration its caller was told failed: gone from the kernel, as
    /// if never registered (no transition says it went), and whoever was
    /// told it came is told it did not. Nothing when it is gone already.
    fn withdraw(&mut self, session: SessionId, error: String) {
        if let Ok(Handled::Applied) = self.input(Event::Withdraw { session }) {
            let shared = self.sessions.remove(&session);
            self.meter.left(State::Registered);
            self.events
                .emit(shared.as_deref(), || LifecycleEvent::Withdrawn {
                    session,
                    error,
                });
        }
    }

    /// Executes every effect the core queued, in order, as it says.
    fn execute(&mut self) {
        while let Some(effect) = self.core.poll_effect() {
            match effect {
                Effect::CancelWork { work, mode } => self.cancel_work(work, mode),
                Effect::CancelWorks { works, mode } => {
                    for work in works {
                        self.cancel_work(work, mode);
                    }
                }
                Effect::CloseStream { work } => {
                    if let Some(handle) = self.works.get(&work) {
                        handle.close_stream();
                    }
                }
                Effect::DetachWork { work } => {
                    if let Some(handle) = self.works.get_mut(&work) {
                        tracing::warn!(%work, "work ignored cancellation past the settle deadline; detached");
                        handle.detach();
                    }
                    self.meter.detached();
                    let shared = self.sessions.get(&work.session);
                    self.events
                        .emit(shared.map(Arc::as_ref), || LifecycleEvent::Detached {
                            session: work.session,
                            work,
                        });
                }
                Effect::EndWork { work, outcome } => {
                    // Empty but for a start behind a cancelled turn: no
                    // lookup per work on a teardown's path.
                    if work.kind == settle_core::WorkKind::Turn && !self.settling.is_empty() {
                        if let Some(starts) = self.settling.remove(&work.session) {
                            let session = work.session;
                            self.unsettled
                                .extend(starts.into_iter().map(|start| (session, start)));
                        }
                    }
                    let handle = self.works.remove(&work);
                    let (error, notify, cancelled_at) = match handle {
                        Some(mut h) => {
                            h.ended(outcome);
                            (h.error.take(), h.outcome.take(), h.cancelled_at)
                        }
                        None => (None, None, None),
                    };
                    let settled = cancelled_at.map(|at| self.now.saturating_duration_since(at));
                    self.meter.work_ended(work.kind, outcome, settled);
                    let shared = self.sessions.get(&work.session);
                    self.events
                        .emit(shared.map(Arc::as_ref), || LifecycleEvent::WorkEnded {
                            session: work.session,
                            work,
                            outcome,
                            error: error.clone(),
                        });
                    let at = self.wall_now;
                    let stalled = self.store_stalled.load(Ordering::Relaxed);
                    let notify =
                        crate::record::told_if_store_failed(notify, outcome, &error, stalled);
                    self.recorder.push(Record::EndTurn {
                        work,
                        outcome,
                        error,
                        at,
                        notify,
                    });
                }
                Effect::FlushTranscripts => {
                    self.recorder.push(Record::Flush);
                }
                Effect::Transition(t) => {
                    self.meter.transition(t.from, t.to);
                    let at = self.wall(t.at);
                    self.announce(&t, at);
                    if t.timeline() {
                        self.recorder.push(Record::Transition { transition: t, at });
                    }
                }
                Effect::Transitions(set) => {
                    for m in &set.moves {
                        self.meter.transition(Some(m.from), m.to);
                    }
                    let at = self.wall(set.at);
                    for t in set.iter() {
                        self.announce(&t, at);
                    }
                    // Each move is a step of its session's timeline.
                    self.recorder.push(Record::Transitions { set, at });
                }
                Effect::Finalize(plan) => {
                    self.meter.finalized(plan.reason);
                    let session = plan.session;
                    let shared = self.sessions.remove(&session);
                    let at = self.wall_now;
                    match (&self.recorder_lost, shared) {
                        // Nothing writes its end: its handles are told it
                        // was left for recovery.
                        (Some(_), Some(shared)) => shared.set_unwritten(),
                        (Some(_), None) => {}
                        (None, shared) => self
                            .recorder
                            .push_finalize(FinalizeJob::new(plan, at, shared)),
                    }
                    // Its record is no use to the core any more (G2 holds in
                    // the store's latch; a long-lived kernel must not grow).
                    self.core.forget(session);
                }
                Effect::HandOff(handoff) => {
                    // Its handles answer as the core does now: another
                    // process's session (the core has let go of it, idle).
                    self.sessions.remove(&handoff.session);
                    self.meter.left(State::Registered);
                    let at = self.wall_now;
                    self.recorder.push(Record::Release {
                        session: handoff.session,
                        holds: handoff.holds,
                        at,
                    });
                }
                Effect::RecordHolds { session, holds } => {
                    let told = self
                        .holds_told
                        .take_if(|(asked, _)| *asked == session)
                        .map(|(_, told)| told);
                    self.recorder.push(Record::Holds {
                        session,
                        holds,
                        told,
                    });
                }
                Effect::ShutdownComplete(summary) => {
                    let waiters = std::mem::take(&mut self.shutdown_waiters);
                    match &self.recorder_lost {
                        // No recorder to write the report: it is this one.
                        Some(report) => {
                            let _ = self.last_report.set(report.clone());
                            for waiter in waiters {
                                let _ = waiter.send(report.clone());
                            }
                        }
                        None => self
                            .recorder
                            .push(Record::ShutdownComplete { summary, waiters }),
                    }
                    self.done = true;
                }
            }
        }
    }

    /// Asks a work to stop, as [`Effect::CancelWork`] orders.
    fn cancel_work(&mut self, work: WorkId, mode: CancelMode) {
        let now = self.now;
        if let Some(handle) = self.works.get_mut(&work) {
            handle.cancelled_at.get_or_insert(now);
            // Graceful: the turn may finish; the settle deadline bounds it.
            if mode == CancelMode::Immediate {
                handle.cancel();
            }
        }
    }

    /// Tells whoever listens that a session moved, as `t` says (at `at` on
    /// the wall clock).
    fn announce(&self, t: &settle_core::Transition, at: std::time::SystemTime) {
        let shared = self.sessions.get(&t.session);
        self.events
            .emit(shared.map(Arc::as_ref), || match (t.from, shared) {
                (None, Some(shared)) => LifecycleEvent::Registered {
                    session: t.session,
                    name: shared.name.to_string(),
                    parent: shared.parent,
                    at,
                },
                _ => LifecycleEvent::Transition {
                    session: t.session,
                    from: t.from,
                    to: t.to,
                    cause: t.cause.to_string(),
                    at,
                },
            });
    }

    /// Starts the work the core admitted, with what its command brought.
    fn start_work(&mut self, work: WorkId, start: Start) {
        let Some(shared) = self.sessions.get(&work.session) else {
            start.refuse(RuntimeError::SessionClosed(work.session));
            return;
        };
        match start {
            Start::Turn {
                provider,
                request,
                options,
                reply,
            } => {
                // The turn's row is written by the recorder, in order after
                // the end of the previous turn; the work streams once it is
                // committed.
                let (started_tx, started) = oneshot::channel();
                let deadline = crate::clock::after(self.config.store_timeout);
                let (told, announced) = crate::told::StartTold::start(
                    work,
                    self.loopback.clone(),
                    started_tx,
                    deadline,
                );
                let at = self.wall_now;
                // Only what the turn adds to the conversation is stored.
                let input = {
                    let mut sent = shared.sent();
                    let (input, next) = crate::sent::split(sent.as_deref(), &request.messages);
                    *sent = Some(Box::new(next));
                    input
                };
                self.recorder.push(Record::StartTurn {
                    work,
                    at,
                    input: Some(input),
                    told,
                });
                let (handle, turn) = work::spawn_turn(work::TurnContext {
                    work,
                    provider,
                    request,
                    started,
                    shared: shared.clone(),
                    reports: self.report_tx.clone(),
                    store: self.store.clone(),
                    store_timeout: self.config.store_timeout,
                    settle_timeout: self.config.policy.settle_timeout,
                    failures: self.failures.clone(),
                    events: self.events.clone(),
                    options: options.map_or_else(|| self.config.turn_options(), |o| *o),
                    chunk_buffer: self.config.chunk_buffer,
                    chunk_buffer_bytes: self.config.chunk_buffer_bytes,
                    tracker: &self.works_tracker,
                });
                let retries = handle.retries.clone();
                self.works.insert(work, handle);
                let (work, chunks, outcome) = turn;
                let work = Unclaimed::new(work, self.loopback.clone());
                // A caller gone already (its start dropped before this
                // answer) gets the turn cancelled here, before the next
                // command is taken: its next start, maybe right behind in
                // the channel, then waits for this turn's end, as after any
                // cancel, instead of being refused for a turn it never had.
                // (An answer dropped unread cancels through `Unclaimed`.)
                if let Err(Ok((work, ..))) =
                    reply.send(Ok((work, chunks, outcome, announced, retries)))
                {
                    let work = work.claim();
                    let _ = self.input(Event::CancelWork { work });
                }
            }
            Start::Task { start, reply } => {
                let (ctx, token, revoked) = task_work::context(work);
                let (outcome_tx, outcome) = oneshot::channel();
                let span = tracing::info_span!(parent: &shared.span, "task", no = work.no);
                let task = self
                    .works_tracker
                    .spawn(tracing::Instrument::instrument(
                        start(ctx, self.report_tx.clone()),
                        span,
                    ))
                    .abort_handle();
                let handle = WorkHandle::task(token, revoked, task, outcome_tx);
                self.works.insert(work, handle);
                let _ = reply.send(Ok((work, outcome)));
            }
        }
    }
}
