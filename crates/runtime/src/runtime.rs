use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use settle_core::{CancelMode, EndReason, Event, Handled, Hold, Outcome, SessionId, WorkId};
use settle_store::{OwnerInfo, SessionStore};
use settle_stream::Provider;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::command::{Command, Reply};
use crate::driver::Driver;
use crate::recorder::Recorder;
use crate::{Config, LifecycleEvent, RuntimeError, SessionEndHook, ShutdownReport, TurnRequest};

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    store: Arc<dyn SessionStore>,
    config: Config,
    hook: Option<Arc<dyn SessionEndHook>>,
}

impl RuntimeBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// How long cancelled work may take to unwind before it is detached (G5).
    pub fn settle_timeout(mut self, timeout: Duration) -> Self {
        self.config.policy.settle_timeout = timeout;
        self
    }

    /// How long running turns may finish once shutdown begins (G9).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config.drain_timeout = timeout;
        self
    }

    /// How long a provider stream may be silent before its turn times out.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.idle_timeout = timeout;
        self
    }

    /// How long an idle session lives before the idle reap claims it.
    pub fn idle_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.config.policy.idle_ttl = ttl;
        self
    }

    /// How many open sessions before the least recently active idle one is evicted.
    pub fn lru_cap(mut self, cap: Option<usize>) -> Self {
        self.config.policy.lru_cap = cap;
        self
    }

    /// How long a session may have lost its transport before the orphan reap.
    pub fn orphan_grace(mut self, grace: Duration) -> Self {
        self.config.policy.orphan_grace = grace;
        self
    }

    /// How many sessions may run turns at once.
    pub fn slots(mut self, slots: Option<usize>) -> Self {
        self.config.slots = slots;
        self
    }

    /// The `on_session_end` hook, fired once per finalized session.
    pub fn on_session_end(mut self, hook: impl SessionEndHook) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Starts the driver on the current tokio runtime: registers this process
    /// as an owner in the store, and recovers dead owners' sessions first if
    /// configured to.
    ///
    /// # Errors
    /// When the store cannot register the owner or the recovery fails.
    pub async fn start(self) -> Result<Runtime, RuntimeError> {
        let RuntimeBuilder {
            store,
            config,
            hook,
        } = self;
        let owner = store
            .register_owner(OwnerInfo::this_process(), config.lease_ttl)
            .await?;
        if config.recover_on_start {
            store
                .recover(settle_store::RecoverOptions::now_on_this_host())
                .await?;
        }
        let (command_tx, commands) = mpsc::unbounded_channel();
        let (record_tx, records) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(16 * 1024);
        let failures = Arc::new(AtomicUsize::new(0));
        let recorder = Recorder::new(
            store.clone(),
            hook,
            &config,
            events.clone(),
            command_tx.downgrade(),
            failures.clone(),
        );
        let recorder = tokio::spawn(recorder.run(records));
        let lease = tokio::spawn(renew_lease(store.clone(), owner, config.lease_ttl));
        let drain = config.drain_timeout;
        let driver = Driver::new(
            config,
            store,
            owner,
            commands,
            record_tx,
            events.clone(),
            failures.clone(),
        );
        let driver = tokio::spawn(driver.run());
        let finished = tokio::spawn(async move {
            let _ = driver.await;
            // The recorder ends once the driver's last record is applied.
            let _ = recorder.await;
            lease.abort();
        });
        Ok(Runtime {
            inner: Arc::new(Inner {
                commands: command_tx,
                events,
                failures,
                drain,
                finished: tokio::sync::Mutex::new(Some(finished)),
            }),
        })
    }
}

async fn renew_lease(store: Arc<dyn SessionStore>, owner: settle_store::OwnerId, ttl: Duration) {
    let mut every = tokio::time::interval((ttl / 3).max(Duration::from_millis(10)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(error) = store.renew_lease(owner, ttl).await {
            tracing::error!(%error, "failed to renew this process's lease on its sessions");
        }
    }
}

struct Inner {
    commands: mpsc::UnboundedSender<Command>,
    events: broadcast::Sender<LifecycleEvent>,
    failures: Arc<AtomicUsize>,
    drain: Duration,
    finished: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

/// A running `settle` runtime: the handle frontends hold. Cheap to clone.
///
/// One driver task owns the lifecycle core; every method here is a message to
/// it. When the last clone is dropped the runtime shuts down with no drain.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder over `store`, with the defaults of SPEC §3–5.
    pub fn builder(store: Arc<dyn SessionStore>) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            config: Config::default(),
            hook: None,
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .commands
            .send(make(tx))
            .map_err(|_| RuntimeError::Stopped)?;
        rx.await.map_err(|_| RuntimeError::Stopped)?
    }

    /// Registers a session named `name` under `parent` (G1: the parent must be
    /// open and not winding down). Refused while shutting down.
    ///
    /// # Errors
    /// [`RuntimeError::Lifecycle`] when the core refuses, [`RuntimeError::Store`]
    /// when the row cannot be written.
    pub async fn register(
        &self,
        name: impl Into<String>,
        parent: Option<SessionId>,
    ) -> Result<SessionHandle, RuntimeError> {
        let name = name.into();
        let id = self
            .ask(|reply| Command::Register {
                name,
                parent,
                reply,
            })
            .await?;
        Ok(SessionHandle {
            id,
            runtime: self.clone(),
        })
    }

    /// A handle for a session this runtime registered earlier.
    pub fn session(&self, id: SessionId) -> SessionHandle {
        SessionHandle {
            id,
            runtime: self.clone(),
        }
    }

    /// Cancels every live descendant of `session`, never `session` itself.
    ///
    /// # Errors
    /// When the session is unknown or the runtime stopped.
    pub async fn cancel_subtree(&self, session: SessionId) -> Result<Handled, RuntimeError> {
        self.core(Event::CancelDescendants { session }).await
    }

    async fn core(&self, event: Event) -> Result<Handled, RuntimeError> {
        self.ask(|reply| Command::Core {
            event,
            reply: Some(reply),
        })
        .await
    }

    /// Starts the graceful shutdown (G9) without waiting for it.
    pub fn begin_shutdown(&self, drain: Duration) {
        let _ = self
            .inner
            .commands
            .send(Command::Shutdown { drain, reply: None });
    }

    /// Ends the drain now (what a second signal does).
    pub fn skip_drain(&self) {
        let _ = self.inner.commands.send(Command::Core {
            event: Event::SkipDrain,
            reply: None,
        });
    }

    /// Shuts down (G9): no new session or turn, transcripts flushed, idle
    /// sessions finalized, running turns drained for `drain`, then cancelled,
    /// settled and finalized. Returns what it did once every session is
    /// finalized and every write is applied.
    pub async fn shutdown(&self, drain: Duration) -> ShutdownReport {
        let (tx, rx) = oneshot::channel();
        let sent = self.inner.commands.send(Command::Shutdown {
            drain,
            reply: Some(tx),
        });
        let report = match sent {
            Ok(()) => rx.await.unwrap_or_default(),
            Err(_) => ShutdownReport::default(),
        };
        self.finished().await;
        report
    }

    /// Shuts down with the configured drain timeout.
    pub async fn shutdown_default(&self) -> ShutdownReport {
        self.shutdown(self.inner.drain).await
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

    /// Lifecycle events for progress displays.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.inner.events.subscribe()
    }

    /// How many store writes have failed so far (the CLI exits 3 when any did).
    pub fn store_failures(&self) -> usize {
        self.inner.failures.load(Ordering::Relaxed)
    }
}

/// One session of a [`Runtime`]. Cheap to clone; every method is safe to
/// call at any time: after the session is finalized they return a
/// `SessionClosed` error (G10), never panic.
#[derive(Clone, Debug)]
pub struct SessionHandle {
    id: SessionId,
    runtime: Runtime,
}

impl SessionHandle {
    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Starts a turn against `provider`. The returned [`Turn`] yields each
    /// chunk once the store has acknowledged it (G7).
    ///
    /// # Errors
    /// When the session is closing, finalized, the runtime is shutting down,
    /// or no slot is free.
    pub async fn run_turn(
        &self,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
    ) -> Result<Turn, RuntimeError> {
        let session = self.id;
        self.runtime
            .ask(|reply| Command::StartTurn {
                session,
                provider,
                request,
                reply,
            })
            .await
            .map_err(|e| self.closed(e))
    }

    /// The agent is done: its live descendants are cancelled and finalized
    /// first, then it is (G1). Returns the end reason once it is finalized.
    ///
    /// # Errors
    /// `SessionClosed` when it was already finalized.
    pub async fn finish(&self) -> Result<EndReason, RuntimeError> {
        let _ = self
            .event(Event::AgentFinished { session: self.id })
            .await?;
        self.finalized().await
    }

    /// Cancels the session: descendants first, then its own work (G1, G5).
    ///
    /// # Errors
    /// When the runtime stopped.
    pub async fn cancel(&self, mode: CancelMode) -> Result<Handled, RuntimeError> {
        self.event(Event::Cancel {
            session: self.id,
            mode,
        })
        .await
    }

    /// Cancels only the turn in flight; the session stays open.
    ///
    /// # Errors
    /// `SessionClosed` when finalized.
    pub async fn cancel_turn(&self) -> Result<Handled, RuntimeError> {
        self.event(Event::CancelTurn { session: self.id }).await
    }

    /// Closes the session on a user's request: cancel first, then finalize
    /// (`user_close`). Returns the end reason once finalized; closing a closed
    /// session is a no-op that reports its end reason (G2).
    ///
    /// # Errors
    /// When the runtime stopped.
    pub async fn close(&self) -> Result<EndReason, RuntimeError> {
        let _ = self.event(Event::UserClose { session: self.id }).await?;
        self.finalized().await
    }

    /// Marks the session as waiting on `hold`: no automatic path reclaims it.
    ///
    /// # Errors
    /// `SessionClosed` when finalized.
    pub async fn hold(&self, hold: Hold) -> Result<Handled, RuntimeError> {
        self.event(Event::Hold {
            session: self.id,
            hold,
        })
        .await
    }

    /// Ends a hold.
    ///
    /// # Errors
    /// `SessionClosed` when finalized.
    pub async fn release(&self, hold: Hold) -> Result<Handled, RuntimeError> {
        self.event(Event::Release {
            session: self.id,
            hold,
        })
        .await
    }

    /// Records that this session delegated to `to`: if this session is
    /// finalized first, `to` is interrupted (SPEC §4 step 6).
    ///
    /// # Errors
    /// `SessionClosed` when either is finalized.
    pub async fn delegate(&self, to: &SessionHandle) -> Result<(), RuntimeError> {
        let (from, to) = (self.id, to.id);
        self.runtime
            .ask(|reply| Command::Delegate { from, to, reply })
            .await
    }

    /// A transport (socket, window) attached to the session.
    ///
    /// # Errors
    /// `SessionClosed` when finalized.
    pub async fn attach_transport(
        &self,
        close_on_disconnect: bool,
    ) -> Result<Handled, RuntimeError> {
        self.event(Event::TransportAttached {
            session: self.id,
            close_on_disconnect,
        })
        .await
    }

    /// A transport detached; the orphan reap (or the transport-closed reclaim)
    /// may follow.
    ///
    /// # Errors
    /// `SessionClosed` when finalized.
    pub async fn detach_transport(&self) -> Result<Handled, RuntimeError> {
        self.event(Event::TransportDetached { session: self.id })
            .await
    }

    /// Waits until the session is finalized and returns its end reason.
    ///
    /// # Errors
    /// When the runtime stopped before it was.
    pub async fn finalized(&self) -> Result<EndReason, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        let session = self.id;
        self.runtime
            .inner
            .commands
            .send(Command::WaitFinalized { session, reply: tx })
            .map_err(|_| RuntimeError::Stopped)?;
        rx.await.map_err(|_| RuntimeError::Stopped)
    }

    async fn event(&self, event: Event) -> Result<Handled, RuntimeError> {
        self.runtime.core(event).await.map_err(|e| self.closed(e))
    }

    fn closed(&self, error: RuntimeError) -> RuntimeError {
        if error.is_session_closed() {
            RuntimeError::SessionClosed(self.id)
        } else {
            error
        }
    }
}

/// A turn in flight: its persisted chunks, then its outcome.
#[derive(Debug)]
pub struct Turn {
    pub(crate) work: WorkId,
    pub(crate) chunks: mpsc::UnboundedReceiver<String>,
    pub(crate) outcome: oneshot::Receiver<Outcome>,
}

impl Turn {
    /// Which work this is.
    pub fn work(&self) -> WorkId {
        self.work
    }

    /// The next chunk, once persisted; `None` when the turn has ended.
    pub async fn next_chunk(&mut self) -> Option<String> {
        self.chunks.recv().await
    }

    /// How the turn ended: waits for it. `Interrupted` if the runtime stopped
    /// before it could say.
    pub async fn outcome(self) -> Outcome {
        self.outcome.await.unwrap_or(Outcome::Interrupted)
    }
}
