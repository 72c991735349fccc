use std::sync::Arc;
use std::time::Duration;

use settle_core::{Event, Handled, SessionId};
use settle_store::{OwnerId, OwnerInfo, SessionStore};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::at_start::at_start;
use crate::bus::EventBus;
use crate::clock::Clock;
use crate::command::{Command, Reply};
use crate::config::{setters, settings, Config};
use crate::driver::{Channels, Driver, Parts};
use crate::error::RuntimeError;
use crate::event::LifecycleEvent;
use crate::hook::{HookRunner, SessionEndHook};
use crate::ids::{IdBlock, BLOCK};
use crate::limits::InputLimits;
use crate::recorder::Recorder;
use crate::report::ShutdownReport;
use crate::store_failures::StoreFailures;
use crate::tracked::Tracked;

/// Builds a [`Kernel`]. Every field of [`Config`] has a setter here too.
pub struct KernelBuilder {
    store: Arc<dyn SessionStore>,
    config: Config,
    hook: Option<Arc<dyn SessionEndHook>>,
}

impl std::fmt::Debug for KernelBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KernelBuilder {
    /// Starts from `config` instead of the defaults; setters called after
    /// this one change it further.
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The `on_session_end` hook, fired once per finalized session, after its
    /// row is ended (SPEC §4 step 4), or could not be: the hook still fires
    /// then, told so by [`SessionEnd::row_ended`](crate::SessionEnd::row_ended).
    ///
    /// Hooks run on tasks of their own, up to
    /// [`hook_concurrency`](crate::Config::hook_concurrency) at once (64):
    /// a tree's hooks start in the order its sessions were finalized
    /// (children first), but may end in any order, so a parent's hook may
    /// run before its children's have finished. A hook that needs its
    /// children's results waits for them itself.
    #[must_use]
    pub fn on_session_end(mut self, hook: impl SessionEndHook) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Starts the kernel on the current tokio runtime: registers this process
    /// as an owner in the store, reserves a first block of session ids, and
    /// recovers dead owners' sessions first if configured to.
    ///
    /// Each of these store calls is tried again while the store fails in a
    /// way that may heal (a lock held by another process, a server
    /// restarting), within the store timeout from its first try.
    ///
    /// # Errors
    /// When the store cannot register the owner, reserve ids or recover,
    /// within the store timeout.
    pub async fn start(self) -> Result<Kernel, RuntimeError> {
        let KernelBuilder {
            store,
            config,
            hook,
        } = self;
        let bound = config.store_timeout;
        let me = OwnerInfo {
            advertise: config.advertise.clone(),
            ..OwnerInfo::this_process()
        };
        let owner = at_start(bound, "registering this process", || {
            store.register_owner(me.clone(), config.lease_ttl)
        })
        .await?;
        if config.recover_on_start {
            at_start(bound, "recovering sessions", || {
                store.recover(settle_store::RecoverOptions::now_on_this_host())
            })
            .await?;
        }
        let first = at_start(bound, "reserving session ids", || store.reserve_ids(BLOCK)).await?;

        let (command_tx, commands) = mpsc::unbounded_channel();
        let (record_tx, records) = mpsc::unbounded_channel();
        let (ack_tx, acks) = mpsc::unbounded_channel();
        let (deadline_tx, deadline) = tokio::sync::watch::channel(None);
        let events = EventBus::new();
        let failures = Arc::new(StoreFailures::default());
        let shutting_down = tokio_util::sync::CancellationToken::new();
        let last_report = Arc::new(std::sync::OnceLock::new());
        let lease_lost_why = Arc::new(std::sync::OnceLock::new());
        let stopped = tokio_util::sync::CancellationToken::new();
        let works = TaskTracker::new();
        let hooks = HookRunner::new(hook, config.hook_timeout, config.hook_concurrency);
        let hook_calls = hooks.calls();
        let store_stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let recorder = Recorder {
            store: store.clone(),
            store_stalled: store_stalled.clone(),
            calls_stalled: Default::default(),
            owner,
            hooks,
            works: works.clone(),
            store_timeout: config.store_timeout,
            events: events.clone(),
            acks: ack_tx,
            commands: command_tx.downgrade(),
            failures: failures.clone(),
            report: ShutdownReport::default(),
            deadline,
            last_report: last_report.clone(),
            lease_lost_why: lease_lost_why.clone(),
            in_flight: None,
            retries: Default::default(),
            owed_holds: Default::default(),
            spent_said: Default::default(),
            reserving: None,
            releasing: Vec::new(),
        };
        let recorder = tokio::spawn(recorder.run(records));
        let lease = tokio::spawn(crate::lease::renew(
            store.clone(),
            owner,
            config.lease_ttl,
            command_tx.downgrade(),
            events.clone(),
            lease_lost_why.clone(),
        ));
        let drain = config.drain_timeout;
        let settle = config.policy.settle_timeout;
        let limits = InputLimits::of(&config);
        let driver = Driver::new(
            config,
            Channels {
                commands,
                loopback: command_tx.downgrade(),
                acks,
                recorder: record_tx,
                shutdown_deadline: deadline_tx,
                store: store.clone(),
            },
            Parts {
                clock: Clock::new(),
                events: events.clone(),
                works: works.clone(),
                ids: IdBlock::new(first),
                failures: failures.clone(),
                shutting_down: shutting_down.clone(),
                last_report: last_report.clone(),
                store_stalled,
            },
        );
        let driver = tokio::spawn(driver.run());
        // Cancelled once this task ends, or is dropped with the runtime it
        // runs on (a program that drops its runtime without a shutdown):
        // either way the kernel has stopped, and its handles say so at once.
        let stopped_on_drop = stopped.clone().drop_guard();
        let said = failures.clone();
        let finished = tokio::spawn(async move {
            let _stopped = stopped_on_drop;
            let _ = driver.await;
            // The recorder ends once the driver's last record is applied.
            let _ = recorder.await;
            // Nothing writes any more: the store failures counted and not
            // logged one by one are said now.
            said.say_unwritten();
            lease.abort();
        });
        Ok(Kernel {
            inner: Arc::new(Inner {
                commands: command_tx,
                events,
                failures,
                drain,
                settle,
                store_timeout: bound,
                scopes: crate::scopes::Scopes::default(),
                limits,
                store,
                owner,
                last_report,
                lease_lost_why,
                shutting_down,
                stopped,
                finished: tokio::sync::Mutex::new(Some(finished)),
                hook_calls,
            }),
        })
    }
}

settings!(setters!(KernelBuilder, [config]));

struct Inner {
    commands: mpsc::UnboundedSender<Command>,
    events: EventBus,
    failures: Arc<StoreFailures>,
    drain: Duration,
    /// How long a cancelled work is given to unwind (G5).
    settle: Duration,
    store_timeout: Duration,
    /// The LRU cap's scope of each principal.
    scopes: crate::scopes::Scopes,
    /// The size limits of a turn's request.
    limits: InputLimits,
    store: Arc<dyn SessionStore>,
    owner: OwnerId,
    /// The report of the shutdown, once it completed (a shutdown the kernel
    /// began itself, on a lost lease or when every handle was dropped, has no
    /// other waiter).
    last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
    /// Why the lease was lost, once it was: set before the shutdown it
    /// begins, so whoever sees that shutdown begun can tell it.
    lease_lost_why: Arc<std::sync::OnceLock<String>>,
    /// Cancelled by the driver when a shutdown begins, whoever asked for it.
    shutting_down: tokio_util::sync::CancellationToken,
    /// Cancelled once the driver and the recorder have stopped.
    stopped: tokio_util::sync::CancellationToken,
    finished: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// Its `on_session_end` hooks in flight: a shutdown asked by one of
    /// them does not wait for that one.
    hook_calls: Arc<crate::hook::HookCalls>,
}

/// A running `settle` kernel: what a frontend holds. Cheap to clone.
///
/// One driver task owns the lifecycle core; every method here is a message to
/// it. When the last clone (and the last
/// [`SessionHandle`](crate::SessionHandle)) is dropped, the kernel shuts down
/// with no drain. A [`WeakKernel`] does not keep it alive.
///
/// Its tasks run on the tokio runtime it was started on, which must run
/// until [`shutdown`](Self::shutdown) returns; its methods (and its
/// handles') are called from within a tokio runtime with its time driver
/// on (`enable_all`), that one or another, as they wait with tokio's
/// timers. A kernel whose runtime was dropped without a shutdown has
/// stopped: its methods answer `Stopped`, and what it left live is
/// recovered as a crashed process's is.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<Inner>,
}

/// A [`Kernel`] that does not keep it running (for watchers such as the
/// signal handler, and a host that waits at its exit for a kernel its
/// program let go: one whose every handle is dropped shuts itself down).
#[derive(Clone)]
pub struct WeakKernel {
    inner: std::sync::Weak<Inner>,
    stopped: tokio_util::sync::CancellationToken,
    last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
}

impl WeakKernel {
    /// The kernel, if it is still held somewhere.
    pub fn upgrade(&self) -> Option<Kernel> {
        self.inner.upgrade().map(|inner| Kernel { inner })
    }

    /// Waits until the kernel has stopped, held or not (see
    /// [`Kernel::stopped`]).
    pub fn stopped(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.stopped.clone().cancelled_owned()
    }

    /// Whether the kernel has stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped.is_cancelled()
    }

    /// The report of the kernel's shutdown once it completed, whoever began
    /// it (the kernel itself, when its last handle was dropped).
    pub fn last_report(&self) -> Option<ShutdownReport> {
        self.last_report.get().cloned()
    }
}

impl std::fmt::Debug for WeakKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeakKernel").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("owner", &self.inner.owner)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// A builder over `store`, with the defaults of SPEC §3–5.
    pub fn builder(store: Arc<dyn SessionStore>) -> KernelBuilder {
        KernelBuilder {
            store,
            config: Config::default(),
            hook: None,
        }
    }

    /// A handle that does not keep the kernel running.
    pub fn downgrade(&self) -> WeakKernel {
        WeakKernel {
            inner: Arc::downgrade(&self.inner),
            stopped: self.inner.stopped.clone(),
            last_report: self.inner.last_report.clone(),
        }
    }

    pub(crate) fn send(&self, command: Command) -> Result<(), RuntimeError> {
        self.inner
            .commands
            .send(command)
            .map_err(|_| RuntimeError::Stopped)
    }

    pub(crate) async fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, RuntimeError> {
        self.ask_now(make).answer().await
    }

    /// [`ask`](Self::ask), with the command queued to the kernel when this
    /// is called, before the answer is awaited: whatever the caller asks
    /// next is decided after it.
    pub(crate) fn ask_now<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Asked<T> {
        let (tx, rx) = oneshot::channel();
        Asked {
            sent: self.send(make(tx)),
            answer: rx,
        }
    }

    /// Sends a registration and waits for it, within the store timeout of
    /// this ask (see `told.rs`).
    pub(crate) async fn register_command(
        &self,
        make: impl FnOnce(crate::told::RegisterTold) -> Command,
    ) -> Result<Arc<crate::shared::SessionShared>, RuntimeError> {
        let patience = self.store_timeout();
        let deadline = crate::clock::after(patience);
        let send = |reply| self.send(make(reply));
        let stopped = self.stopped();
        let commands = self.commands();
        crate::told::RegisterTold::registered(send, commands, deadline, patience, stopped).await
    }

    /// Sends a hold of `session` (or, with `release`, its release) and
    /// waits for its record, within the store timeout of this ask (see
    /// `told.rs`).
    pub(crate) async fn holds_command(
        &self,
        session: SessionId,
        hold: settle_core::Hold,
        release: bool,
    ) -> Result<Handled, RuntimeError> {
        let patience = self.store_timeout();
        let deadline = crate::clock::after(patience);
        let send = |told| {
            self.send(Command::Holds {
                session,
                hold,
                release,
                told,
            })
        };
        let (stopped, commands) = (self.stopped(), self.commands());
        let taken_back = (!release).then_some(Event::Release { session, hold });
        crate::told::HoldTold::changed(taken_back, send, commands, deadline, patience, stopped)
            .await
    }

    pub(crate) fn commands(&self) -> mpsc::WeakUnboundedSender<Command> {
        self.inner.commands.downgrade()
    }

    /// The store, for the kernel's methods that read it in other files.
    pub(crate) fn store(&self) -> &Arc<dyn SessionStore> {
        &self.inner.store
    }

    /// The size limits of a turn's request.
    pub(crate) fn limits(&self) -> InputLimits {
        self.inner.limits
    }

    /// How long a cancelled work is given to unwind before it is detached
    /// (G5): the longest a cancelled turn takes to end.
    pub fn settle_timeout(&self) -> Duration {
        self.inner.settle
    }

    /// The bound of a call to the store.
    pub(crate) fn store_timeout(&self) -> Duration {
        self.inner.store_timeout
    }

    /// This process's identity in the store: the owner of its sessions.
    pub fn owner(&self) -> OwnerId {
        self.inner.owner
    }

    /// The [`Scope`](settle_core::Scope) of `principal`'s sessions, for
    /// [`register_in`](Self::register_in): one of its own for each name,
    /// the same for the kernel's life, and
    /// [`Scope::SHARED`](settle_core::Scope::SHARED) for none. A session
    /// adopted from the fleet is put in its recorded principal's.
    pub fn scope_of(&self, principal: Option<&str>) -> settle_core::Scope {
        self.inner.scopes.of(principal)
    }

    /// The most recent finalized session of the store, if any (what
    /// `settle chat --last` resumes).
    ///
    /// # Errors
    /// When the store cannot be read within the store timeout.
    pub async fn last_finalized(&self) -> Result<Option<SessionId>, RuntimeError> {
        let last = self
            .inner
            .store
            .last_session(Some(settle_core::State::Finalized));
        self.read_store("finding the last session", last).await
    }

    /// A write to the store, bounded by the store timeout: its error as a
    /// [`RuntimeError::Store`], or [`RuntimeError::StoreTimeout`] saying
    /// `what` did not answer in time and may still be written (a read goes
    /// through [`read_store`](Self::read_store)).
    pub(crate) async fn store_call<T>(
        &self,
        what: &'static str,
        call: impl std::future::Future<Output = Result<T, settle_store::StoreError>>,
    ) -> Result<T, RuntimeError> {
        let after = self.store_timeout();
        match tokio::time::timeout(after, call).await {
            Ok(result) => result.map_err(RuntimeError::Store),
            Err(_) => Err(RuntimeError::StoreTimeout {
                what,
                after,
                writing: true,
            }),
        }
    }

    /// Every session of the store, or those in `state`, by id: the rows
    /// `settle sessions --json` prints (the store's view, which may lag
    /// behind the core by the writes still in flight).
    ///
    /// # Errors
    /// When the store fails or does not answer within the store timeout.
    pub async fn list_sessions(
        &self,
        state: Option<settle_core::State>,
    ) -> Result<Vec<settle_store::SessionRow>, RuntimeError> {
        let filter = settle_store::SessionFilter::all()
            .in_state_opt(state)
            .oldest_first();
        self.list_sessions_where(filter).await
    }

    /// The sessions `filter` selects, as the store has them (one page of a
    /// listing: see [`SessionFilter::after`](settle_store::SessionFilter::after)).
    ///
    /// # Errors
    /// When the store fails or does not answer within the store timeout.
    pub async fn list_sessions_where(
        &self,
        filter: settle_store::SessionFilter,
    ) -> Result<Vec<settle_store::SessionRow>, RuntimeError> {
        self.read_store("listing sessions", self.inner.store.list_sessions(filter))
            .await
    }

    /// One session's row, turns and timeline, as the store has them.
    ///
    /// # Errors
    /// `Store(UnknownSession)` when the store has no such session; when the
    /// store fails or does not answer within the store timeout.
    pub async fn session_detail(
        &self,
        id: SessionId,
    ) -> Result<settle_store::SessionDetail, RuntimeError> {
        self.read_store("reading a session", self.inner.store.session_detail(id))
            .await
    }

    /// Finalizes the sessions crashed processes left live (G8), as
    /// `settle recover` does: each `recovered`, its open turn marked
    /// `interrupted`, its transcript kept, children before parents, once
    /// its owner is gone (its lease ran out by the store's clock, or it ran
    /// on this machine and its process no longer exists); never a live
    /// owner's, this kernel's among them. Idempotent, and safe beside
    /// another recoverer. A session it recovered can then be resumed. What
    /// [`recover_on_start`](crate::Config::recover_on_start) runs once at
    /// the start; this is for a process that lives on while others die.
    ///
    /// # Errors
    /// When the store fails; it is not bounded by the store timeout (a
    /// recovery of many sessions takes as long as it takes, committed in
    /// pieces: one stopped half-way leaves the rest for the next).
    pub async fn recover(&self) -> Result<settle_store::RecoveryReport, RuntimeError> {
        let options = settle_store::RecoverOptions::now_on_this_host();
        self.inner
            .store
            .recover(options)
            .await
            .map_err(|e| RuntimeError::from_store("recovering sessions", e))
    }

    /// Turn `turn` of `id` (its last when `None`) with at most `max_chunks`
    /// of its chunks from `from_seq`, and how many turns the session has:
    /// one page of a transcript, read without the rest of the session
    /// ([`SessionStore::turn_page`](settle_store::SessionStore::turn_page)).
    ///
    /// # Errors
    /// As [`session_detail`](Self::session_detail).
    pub async fn turn_page(
        &self,
        id: SessionId,
        turn: Option<u32>,
        from_seq: u32,
        max_chunks: usize,
    ) -> Result<settle_store::TurnPage, RuntimeError> {
        let read = self.inner.store.turn_page(id, turn, from_seq, max_chunks);
        self.read_store("reading a page of a session", read).await
    }

    /// A store read within the store timeout (its timeout says nothing was
    /// written).
    pub(crate) async fn read_store<T>(
        &self,
        what: &'static str,
        read: impl std::future::Future<Output = Result<T, settle_store::StoreError>>,
    ) -> Result<T, RuntimeError> {
        let after = self.inner.store_timeout;
        tokio::time::timeout(after, read)
            .await
            .map_err(|_| RuntimeError::StoreTimeout {
                what,
                after,
                writing: false,
            })?
            .map_err(RuntimeError::from)
    }

    /// Cancels every live descendant of `session`, never `session` itself.
    ///
    /// # Errors
    /// When the session is unknown or the kernel stopped.
    pub async fn cancel_subtree(&self, session: SessionId) -> Result<Handled, RuntimeError> {
        self.core(Event::CancelDescendants { session }).await
    }

    pub(crate) async fn core(&self, event: Event) -> Result<Handled, RuntimeError> {
        self.ask(|reply| Command::Core {
            event,
            reply: Some(reply),
        })
        .await
    }

    /// Starts the graceful shutdown (G9) without waiting for it.
    pub fn begin_shutdown(&self, drain: Duration) {
        let _ = self.send(Command::Shutdown { drain, reply: None });
    }

    /// Whether a shutdown has begun (asked for, or forced by a lost lease).
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.is_cancelled()
    }

    /// Resolves once a shutdown has begun, whoever began it: what a frontend
    /// waiting to start more work (a spawn delay, a prompt) selects on.
    pub async fn shutdown_begun(&self) {
        self.inner.shutting_down.cancelled().await;
    }

    /// Why this kernel lost its lease on its sessions (G8), once it has: the
    /// shutdown it then began has no drain. Set before that shutdown
    /// begins, so a frontend that saw [`shutdown_begun`](Self::shutdown_begun)
    /// resolve can tell a lost lease from a shutdown someone asked for.
    pub fn lease_lost(&self) -> Option<&str> {
        self.inner.lease_lost_why.get().map(String::as_str)
    }

    /// Ends the drain now (what a second signal does).
    pub fn skip_drain(&self) {
        let _ = self.send(Command::Core {
            event: Event::SkipDrain,
            reply: None,
        });
    }

    /// Shuts down (G9): no new session or turn, transcripts flushed, idle
    /// sessions finalized, running turns drained for `drain`, then cancelled,
    /// settled and finalized. Returns what it did once every session is
    /// finalized and every write applied, or once the shutdown's budget
    /// (drain + settle timeout + flush budget) ran out on a stalled store:
    /// then [`ShutdownReport::left_recoverable`] names what was left. Asked
    /// of a kernel that stopped without one (the tokio runtime it was
    /// started on was dropped), it returns at once a report that says so,
    /// [`ShutdownReport::stopped_without_shutdown`]. Called from this
    /// kernel's own `on_session_end` hook, it waits for every other hook,
    /// not for the one that called it.
    pub async fn shutdown(&self, drain: Duration) -> ShutdownReport {
        // Asked by one of this kernel's own end hooks (a program that stops
        // once its root agent ended): the shutdown waits for every hook but
        // that one, which waits for it.
        let _asked_by_hook = self.inner.hook_calls.shutdown_asked_by_own_hook();
        let (tx, rx) = oneshot::channel();
        let answered = match self.send(Command::Shutdown {
            drain,
            reply: Some(tx),
        }) {
            Ok(()) => rx.await.ok(),
            Err(_) => None,
        };
        self.finished().await;
        answered
            .or_else(|| self.inner.last_report.get().cloned())
            .unwrap_or_else(|| self.stopped_without_shutdown())
    }

    /// The report of a shutdown asked of a kernel that had stopped without
    /// one (its runtime dropped): nothing was drained or finalized by it,
    /// and what it left live is recovered as a crashed process's is.
    fn stopped_without_shutdown(&self) -> ShutdownReport {
        ShutdownReport {
            stopped_without_shutdown: true,
            store_failures: self.store_failures(),
            ..ShutdownReport::default()
        }
    }

    /// Shuts down with the configured drain timeout.
    pub async fn shutdown_default(&self) -> ShutdownReport {
        self.shutdown(self.inner.drain).await
    }

    /// A token cancelled once the kernel has stopped (its driver and its
    /// recorder ended, after a shutdown): what a watcher that must outlive
    /// it (the signal handlers) selects on.
    pub fn stopped(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.inner.stopped.clone().cancelled_owned()
    }

    /// Waits until the driver and its recorder have stopped (after a shutdown).
    pub async fn finished(&self) {
        // The lock is held across the wait, so a second caller (a concurrent
        // `shutdown`) waits for the same end instead of returning early.
        let mut finished = self.inner.finished.lock().await;
        if let Some(handle) = finished.as_mut() {
            let _ = handle.await;
            *finished = None;
        }
    }

    /// Lifecycle events of every session, for progress displays. A
    /// subscriber that falls far behind misses events (it is told how many);
    /// the store's record is always complete. For one session's events, see
    /// [`SessionHandle::subscribe`](crate::SessionHandle::subscribe).
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.inner.events.subscribe()
    }

    /// How much the kernel keeps track of now; `None` once it stopped.
    #[doc(hidden)]
    pub async fn tracked(&self) -> Option<Tracked> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Tracked { reply: tx }).ok()?;
        rx.await.ok()
    }

    /// How many store writes have failed so far, for good (the CLI exits 3
    /// when any did): one a store blip held back and a later try wrote is
    /// not counted.
    pub fn store_failures(&self) -> usize {
        self.inner.failures.count()
    }
}

/// A command queued to the kernel ([`Kernel::ask_now`]), its answer to come.
pub(crate) struct Asked<T> {
    sent: Result<(), RuntimeError>,
    answer: oneshot::Receiver<Result<T, RuntimeError>>,
}

impl<T> Asked<T> {
    /// The kernel's answer; `Stopped` when it stopped without one.
    pub(crate) async fn answer(self) -> Result<T, RuntimeError> {
        self.sent?;
        self.answer.await.map_err(|_| RuntimeError::Stopped)?
    }
}
