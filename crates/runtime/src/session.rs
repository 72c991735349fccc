//! [`SessionHandle`]: one session of a [`Kernel`], and the kernel's methods
//! that hand one out ([`Kernel::register`], [`Kernel::session`]), beside the
//! handle they make so that the kernel's module does not import this one.

use std::sync::Arc;

use settle_core::{Budget, CancelMode, EndReason, Event, Handled, Hold, Scope, SessionId, State};
use settle_stream::Request as TurnRequest;
use settle_stream::{Provider, TurnOptions};
use tokio::sync::broadcast;

use crate::command::Command;
use crate::error::RuntimeError;
use crate::event::LifecycleEvent;
use crate::kernel::Kernel;
use crate::shared::{End, SessionShared};
use crate::task::TaskHandle;
use crate::task_context::TaskContext;
use crate::turn::Turn;

/// One session of a [`Kernel`]. Cheap to clone; every method is safe to
/// call at any time: after the session is finalized they return a
/// `SessionClosed` error (G10), or say it was already finalized (G2), also
/// once the kernel has stopped, and never panic. (`Stopped` is for a
/// session the kernel stopped before it could end: left for recovery.)
#[derive(Clone)]
pub struct SessionHandle {
    shared: Arc<SessionShared>,
    kernel: Kernel,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .finish()
    }
}

impl SessionHandle {
    pub(crate) fn new(shared: Arc<SessionShared>, kernel: Kernel) -> Self {
        SessionHandle { shared, kernel }
    }

    /// Queues `event` for the driver without waiting (from `drop`).
    pub(crate) fn send_now(&self, event: Event) {
        let _ = self.kernel.send(Command::Core { event, reply: None });
    }

    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.shared.id
    }

    /// The session's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The session that spawned it.
    pub fn parent(&self) -> Option<SessionId> {
        self.shared.parent
    }

    /// Whether the session's finalize has run (its row ended, or left for
    /// recovery when the store could not end it): every method of a closed
    /// handle answers as the core answers a finalized session.
    pub fn is_closed(&self) -> bool {
        self.shared.end().is_some()
    }

    /// What a start through this handle that never reached the kernel (a
    /// frontend stopped it on the way) answers its caller when the session
    /// is finalized: the core's table for a start of a finalized session
    /// (G10, `SessionClosed`), the same as a start the kernel refused.
    /// `None` while the session is not finalized: the stop is the caller's
    /// to report.
    pub fn start_refused_if_closed(&self) -> Option<RuntimeError> {
        if !self.is_closed() {
            return None;
        }
        let start = Event::StartTurn { session: self.id() };
        match settle_core::answer_finalized(&start) {
            Some(Err(refused)) => Some(refused.into()),
            _ => None,
        }
    }

    /// The kernel it belongs to.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Registers a child of this session named `name`, in this session's
    /// scope: `kernel.register(name, Some(self.id()))`.
    ///
    /// # Errors
    /// As [`Kernel::register`].
    pub async fn child(&self, name: impl Into<String>) -> Result<SessionHandle, RuntimeError> {
        self.child_as(name.into(), None).await
    }

    /// Registers a child of this session as [`child`](Self::child) does,
    /// with a [`Budget`] for it and its subtree:
    /// `kernel.register_with_budget(name, Some(self.id()), budget)`.
    ///
    /// # Errors
    /// As [`Kernel::register`].
    pub async fn child_with_budget(
        &self,
        name: impl Into<String>,
        budget: Budget,
    ) -> Result<SessionHandle, RuntimeError> {
        self.child_as(name.into(), Some(budget)).await
    }

    async fn child_as(
        &self,
        name: String,
        budget: Option<Budget>,
    ) -> Result<SessionHandle, RuntimeError> {
        let registered = match budget {
            None => self.kernel.register(name, Some(self.id())).await,
            Some(budget) => {
                self.kernel
                    .register_with_budget(name, Some(self.id()), budget)
                    .await
            }
        };
        match registered {
            // A stopped kernel answers for a session its stop finalized as
            // the core answered before the stop (`SessionClosed`), not
            // as for one left for recovery.
            Err(RuntimeError::Stopped) if self.stopped_finalized().await => {
                match settle_core::answer_finalized_parent(self.id()) {
                    Err(error) => Err(error.into()),
                    Ok(_) => Err(RuntimeError::Stopped),
                }
            }
            registered => registered,
        }
    }

    /// Starts a turn against `provider`. The returned [`Turn`] yields each
    /// chunk once the store has acknowledged it (G7); dropping it before its
    /// end cancels the turn.
    ///
    /// Send `request` as the provider must see it: the whole conversation
    /// (a chat's history and its new prompt), or a fresh prompt. The store
    /// keeps only what the turn adds to the conversation: the messages after
    /// what the previous turn was sent and its reply, when the request
    /// begins with them (see [`TurnInput`](settle_store::TurnInput)); show,
    /// export and [`Kernel::resume`] rebuild the rest.
    ///
    /// While the session's previous turn was cancelled (its `Turn` dropped)
    /// and is still unwinding, the start waits for that turn's end, at most
    /// the settle timeout (G5), then is answered as any start.
    ///
    /// # Errors
    /// [`RuntimeError::TooLarge`] when a message is over
    /// [`max_prompt_bytes`](crate::Config::max_prompt_bytes) or the request
    /// over [`max_history_bytes`](crate::Config::max_history_bytes), before
    /// anything is sent or written; and when the session is closing,
    /// finalized, a turn is already in flight, the kernel is shutting down,
    /// or no slot is free. [`RuntimeError::Store`] when the store did not
    /// take the turn's start within the store timeout: the turn is refused
    /// and never streams, yet it had its number; once the store heals it
    /// is written ended `failed` with the store's cause, so the stored
    /// turns are numbered without a gap.
    pub async fn run_turn(
        &self,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
    ) -> Result<Turn, RuntimeError> {
        self.start_turn(provider, request, None).await
    }

    /// Starts a turn with its own timeouts and retries instead of the
    /// kernel's ([`Config::turn_options`](crate::Config::turn_options)): a
    /// longer first-event timeout for a model that thinks, a shorter idle
    /// timeout for a tool-calling step, a fallback provider. Otherwise as
    /// [`run_turn`](Self::run_turn).
    ///
    /// # Errors
    /// As [`run_turn`](Self::run_turn).
    pub async fn run_turn_with(
        &self,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
        options: TurnOptions,
    ) -> Result<Turn, RuntimeError> {
        self.start_turn(provider, request, Some(Box::new(options)))
            .await
    }

    async fn start_turn(
        &self,
        provider: Arc<dyn Provider>,
        request: TurnRequest,
        options: Option<Box<TurnOptions>>,
    ) -> Result<Turn, RuntimeError> {
        self.kernel.limits().check(&request)?;
        // The caller is told within the store timeout of its start's write
        // handed on: at once for most starts, after the turn before has
        // ended for one that waited for that (see `told.rs`).
        let patience = self.kernel.store_timeout();
        let session = self.id();
        let started = self
            .kernel
            .ask(|reply| Command::StartTurn {
                session,
                provider,
                request,
                options,
                reply,
            })
            .await;
        let started = self
            .unless_stopped(started, Event::StartTurn { session })
            .await;
        let (work, chunks, outcome, announced, retries) = started?;
        let turn = Turn::new(work.claim(), chunks, outcome, retries)
            .cancel_on_drop(self.kernel.commands());
        // A turn is announced only once its start is written: one the store
        // did not take is refused here, with the store's own cause (its
        // work fails on its own, and the handle is dropped without a
        // cancel). A caller gone while it waits drops the handle, which
        // cancels the turn.
        match announced.wait(patience, self.kernel.stopped()).await {
            Some(Ok(())) => Ok(turn),
            Some(Err(error)) => {
                turn.refused();
                Err(RuntimeError::from_store("starting a turn", error))
            }
            None => Err(RuntimeError::Stopped),
        }
    }

    /// Spawns a task the session owns: a tool call, a subprocess (see
    /// [`process`](crate::process)), any future. It falls under the session's
    /// lifecycle like a turn: cancelled when the session is (its
    /// [`TaskContext::token`]), given the settle timeout to unwind, then
    /// detached, its write access revoked (G1, G5, G6). It may run beside a
    /// turn; the session is not finalized while it runs.
    ///
    /// # Errors
    /// When the session is closing, finalized, or the kernel is shutting down.
    pub async fn spawn<F, Fut, T>(&self, make: F) -> Result<TaskHandle<T>, RuntimeError>
    where
        F: FnOnce(TaskContext) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.start_task(crate::task_work::prepare(make)).await
    }

    /// As [`spawn`](Self::spawn), a task whose output says how it ended
    /// ([`TaskOutcome`](crate::TaskOutcome)): a tool returning `Err` ends
    /// `failed` (its error, kind `task` with the error's words, announced
    /// in its `WorkEnded` event), one that says it stopped on its own
    /// `cancelled`; its caller gets the output all the same. The store
    /// records a task's end when it is the last work of its session to end
    /// (the session's outcome, "task ended: failed" in its timeline); it
    /// keeps no row per task. (A task of [`spawn`](Self::spawn) that
    /// returns ends `completed` whatever it returned.)
    ///
    /// ```ignore
    /// let scan = session
    ///     .spawn_with_outcome(|ctx| async move { run_scan(ctx).await }) // -> Result<Report, ScanError>
    ///     .await?;
    /// let report = scan.join().await?; // an Err ends the task `failed`
    /// ```
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn).
    pub async fn spawn_with_outcome<F, Fut, T>(
        &self,
        make: F,
    ) -> Result<TaskHandle<T>, RuntimeError>
    where
        F: FnOnce(TaskContext) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: crate::TaskOutcome + Send + 'static,
    {
        self.start_task(crate::task_work::prepare_labelled(make, |output: &T| {
            output.task_outcome()
        }))
        .await
    }

    /// Asks the kernel to start a prepared task and returns its handle.
    async fn start_task<T>(
        &self,
        (start, result): (
            crate::task_work::StartTask,
            tokio::sync::oneshot::Receiver<Result<T, String>>,
        ),
    ) -> Result<TaskHandle<T>, RuntimeError> {
        let session = self.id();
        let started = self
            .kernel
            .ask(|reply| Command::StartTask {
                session,
                start,
                reply,
            })
            .await;
        let started = self
            .unless_stopped(started, Event::StartTask { session })
            .await;
        let (work, outcome) = started?;
        Ok(crate::task::handle(
            work,
            result,
            outcome,
            self.kernel.commands(),
        ))
    }

    /// The agent is done: its own works are cancelled, its live descendants
    /// cancelled and finalized first, then it is (G1). Returns the end reason
    /// once it is finalized: `completed`, `failed` or `cancelled` after its
    /// last turn (`shutdown` during a shutdown). The finish is queued to
    /// the kernel when this is called, before the returned future is
    /// polled: a call made after it (a child's turn, from any task) is seen
    /// after it, and dropping the future does not take it back.
    ///
    /// # Errors
    /// `AlreadyFinalized` when it was already finalized (G2: nothing
    /// changed; [`close`](Self::close) answers its end reason instead).
    pub fn finish(
        &self,
    ) -> impl std::future::Future<Output = Result<EndReason, RuntimeError>> + Send + 'static {
        let asked = self.event_now(Event::AgentFinished { session: self.id() });
        let this = self.clone();
        async move {
            match asked.await? {
                Handled::AlreadyFinalized => Err(RuntimeError::AlreadyFinalized(this.id())),
                _ => this.finalized().await,
            }
        }
    }

    /// Cancels the session: descendants first, then its own works (G1, G5),
    /// all in `mode`: [`CancelMode::Graceful`] lets the running turns of the
    /// session and of its descendants finish (each bounded by the settle
    /// timeout) and starts no more; [`CancelMode::Immediate`] cuts them.
    /// Queued to the kernel when this is called, as
    /// [`finish`](Self::finish) is.
    ///
    /// # Errors
    /// When the kernel stopped.
    pub fn cancel(
        &self,
        mode: CancelMode,
    ) -> impl std::future::Future<Output = Result<Handled, RuntimeError>> + Send + 'static {
        self.event_now(Event::Cancel {
            session: self.id(),
            mode,
        })
    }

    /// Cancels only the turn in flight (a chat's "stop"), without its
    /// [`Turn`]; the session stays open. The cancel is queued to the kernel
    /// when this is called, before the returned future is polled, so a
    /// turn started after this call, awaited or not, waits for the
    /// cancelled turn's end instead of being refused because it still runs.
    /// Answers `Applied` when a turn was cancelled, `NoOp` when none ran
    /// (or it was cancelled already), `AlreadyFinalized` for a finalized
    /// session.
    ///
    /// # Errors
    /// When the kernel stopped.
    pub fn cancel_turn(
        &self,
    ) -> impl std::future::Future<Output = Result<Handled, RuntimeError>> + Send + 'static {
        self.event_now(Event::CancelTurn { session: self.id() })
    }

    /// Closes the session on a user's request: cancel first, then finalize
    /// (`user_close`). Returns the end reason once finalized; closing a closed
    /// session is a no-op that reports its end reason (G2). Queued to the
    /// kernel when this is called, as [`finish`](Self::finish) is.
    ///
    /// # Errors
    /// When the kernel stopped.
    pub fn close(
        &self,
    ) -> impl std::future::Future<Output = Result<EndReason, RuntimeError>> + Send + 'static {
        let asked = self.event_now(Event::UserClose { session: self.id() });
        let this = self.clone();
        async move {
            let _ = asked.await?;
            this.finalized().await
        }
    }

    /// Marks the session as waiting on `hold`: no automatic path reclaims
    /// it, in this process or (SPEC §12) in one that adopts it. Answered
    /// once the hold's record is committed, so that a process killed right
    /// after leaves it held for its adopter, and at the latest at the store
    /// timeout from this call, wherever its record waits.
    ///
    /// # Errors
    /// `SessionClosed` when finalized; [`RuntimeError::Store`] or
    /// [`RuntimeError::StoreTimeout`] when the store did not take the
    /// hold's record (a failure that may heal, a lock or a full disk, is
    /// tried again up to the store timeout, as a registration is): the
    /// hold is then taken back (not held; asking again holds once).
    pub async fn hold(&self, hold: Hold) -> Result<Handled, RuntimeError> {
        let event = Event::Hold {
            session: self.id(),
            hold,
        };
        let answered = self.kernel.holds_command(self.id(), hold, false).await;
        self.answered(answered, &event).await
    }

    /// Ends a hold. Answered once its record is written or the store's
    /// refusal said (logged and counted), at the latest at the store
    /// timeout from this call: the release is in effect here
    /// either way, and a record the store did not take leaves the session
    /// held only for an adopter, which then reclaims nothing.
    ///
    /// # Errors
    /// When the kernel stopped.
    pub async fn release(&self, hold: Hold) -> Result<Handled, RuntimeError> {
        let event = Event::Release {
            session: self.id(),
            hold,
        };
        let answered = self.kernel.holds_command(self.id(), hold, true).await;
        self.answered(answered, &event).await
    }

    /// Records that this session delegated to `to`: if this session is
    /// finalized first, `to` is interrupted (SPEC §4 step 6).
    ///
    /// # Errors
    /// `SessionClosed` when either is finalized.
    pub async fn delegate(&self, to: &SessionHandle) -> Result<(), RuntimeError> {
        let (from, to) = (self.id(), to.id());
        self.event(Event::Delegate { from, to }).await.map(|_| ())
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
            session: self.id(),
            close_on_disconnect,
        })
        .await
    }

    /// A transport detached; the orphan reap (or the transport-closed reclaim)
    /// may follow.
    ///
    /// # Errors
    /// When the kernel stopped.
    pub async fn detach_transport(&self) -> Result<Handled, RuntimeError> {
        self.event(Event::TransportDetached { session: self.id() })
            .await
    }

    /// The session's state now, as the lifecycle core has it (the store's
    /// row may lag behind it): `Finalized` from the moment its finalize is
    /// ordered. Once the kernel has stopped, `Finalized` for a session the
    /// stop finalized, as a finalized session's other calls answer.
    ///
    /// # Errors
    /// `Stopped` when the kernel stopped without finalizing it (left for
    /// recovery).
    pub async fn state(&self) -> Result<State, RuntimeError> {
        let session = self.id();
        let state = self
            .kernel
            .ask(|reply| Command::State { session, reply })
            .await;
        match state {
            Err(RuntimeError::Stopped) if self.stopped_finalized().await => Ok(State::Finalized),
            other => other,
        }
    }

    /// This session's own lifecycle events from now on: its transitions,
    /// chunks, turn ends and finalize.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.shared.subscribe()
    }

    /// Waits until the session is finalized (its row ended) and returns its
    /// end reason.
    ///
    /// # Errors
    /// [`RuntimeError::LeftForRecovery`] when the store did not commit the
    /// end of its row (a stalled store at shutdown, a lost lease): the
    /// session is done here and its row is left live, for `settle
    /// recover` or, in a fleet, a peer (G8); [`RuntimeError::Stopped`] when
    /// the kernel stopped before either.
    pub async fn finalized(&self) -> Result<EndReason, RuntimeError> {
        let end = match self.shared.end() {
            Some(end) => Some(end),
            None => tokio::select! {
                end = self.shared.finalized() => Some(end),
                () = self.kernel.finished() => self.shared.end(),
            },
        };
        match end {
            Some(End::Finalized(reason)) => Ok(reason),
            Some(End::Unwritten) => Err(RuntimeError::LeftForRecovery(self.id())),
            None => Err(RuntimeError::Stopped),
        }
    }

    /// Feeds `event` to the core, whose answer table says what a closed
    /// session gets (the table on `settle_core::Event`): `AlreadyFinalized`
    /// to a request to end it or let go of it, `SessionClosed` to a request
    /// to use it, whether or not the core still keeps its record.
    async fn event(&self, event: Event) -> Result<Handled, RuntimeError> {
        let answered = self.kernel.core(event.clone()).await;
        self.answered(answered, &event).await
    }

    /// [`event`](Self::event), queued to the kernel now: the returned
    /// future only waits for the answer.
    fn event_now(
        &self,
        event: Event,
    ) -> impl std::future::Future<Output = Result<Handled, RuntimeError>> + Send + 'static {
        let asked = self.kernel.ask_now(|reply| Command::Core {
            event: event.clone(),
            reply: Some(reply),
        });
        let this = self.clone();
        async move { this.answered(asked.answer().await, &event).await }
    }

    /// The core's answer to `event`, unless the kernel had stopped: then
    /// what `event` gets from a stopped kernel ([`answer_stopped`](Self::answer_stopped)).
    async fn answered(
        &self,
        answered: Result<Handled, RuntimeError>,
        event: &Event,
    ) -> Result<Handled, RuntimeError> {
        match answered {
            Err(RuntimeError::Stopped) => self.answer_stopped(event).await,
            answered => answered,
        }
    }

    /// What `event` gets once the kernel has stopped: if the session was
    /// finalized, the answer the core's table gives a finalized session
    /// (the same as before the stop, G2, G10); else (left for recovery, or
    /// stopped before its end) `Stopped`. Its driver ends before its
    /// recorder has committed the last finalizes, so the answer waits for
    /// the whole stop, which says how the session ended, at most the store
    /// timeout (a finalize the store has not taken by then is one a stalled
    /// store leaves for recovery; and a kernel whose runtime is gone never
    /// says it stopped).
    async fn answer_stopped(&self, event: &Event) -> Result<Handled, RuntimeError> {
        match (
            self.stopped_finalized().await,
            settle_core::answer_finalized(event),
        ) {
            (true, Some(answer)) => answer.map_err(RuntimeError::from),
            _ => Err(RuntimeError::Stopped),
        }
    }

    /// Whether the kernel's stop finalized this session, once it says (see
    /// [`answer_stopped`](Self::answer_stopped)).
    async fn stopped_finalized(&self) -> bool {
        let _ = tokio::time::timeout(self.kernel.store_timeout(), self.kernel.stopped()).await;
        matches!(self.shared.end(), Some(End::Finalized(_)))
    }

    /// `result`, unless it is `Stopped`: then what `event` gets from a
    /// stopped kernel ([`answer_stopped`](Self::answer_stopped)).
    async fn unless_stopped<T>(
        &self,
        result: Result<T, RuntimeError>,
        event: Event,
    ) -> Result<T, RuntimeError> {
        match result {
            Err(RuntimeError::Stopped) => match self.answer_stopped(&event).await {
                Err(error) => Err(error),
                // The table lets nothing start in a finalized session.
                Ok(_) => Err(RuntimeError::Stopped),
            },
            other => other,
        }
    }
}

/// Refuses a session name no store keeps: PostgreSQL's text holds no NUL
/// (U+0000), and a registration it refuses fails the writes of its batch
/// with it (a turn's start, another session's end); refused alike on every
/// store, before the kernel sees it. So is a blank one, or one longer than
/// [`MAX_NAME_CHARS`]: one rule for every frontend (the gateway's
/// `session.create`, Python's `register`, a Rust embedder's).
pub(crate) fn check_name(name: &str) -> Result<(), RuntimeError> {
    if name.contains('\0') {
        return Err(RuntimeError::NulInName);
    }
    if name.trim().is_empty() {
        return Err(RuntimeError::BlankName);
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(RuntimeError::NameTooLong {
            chars,
            max: MAX_NAME_CHARS,
        });
    }
    Ok(())
}

/// The longest session name accepted, in characters, by every frontend.
pub const MAX_NAME_CHARS: usize = 128;

impl Kernel {
    /// Registers a session named `name` under `parent` (G1: the parent must be
    /// open and not winding down), and returns its handle once its row is
    /// committed. Refused while shutting down. It is in its parent's
    /// [`Scope`], a root in [`Scope::SHARED`](settle_core::Scope::SHARED):
    /// at the LRU cap it may evict, and be evicted for, any other session
    /// of that scope (see [`register_in`](Self::register_in)). The core
    /// makes that room when it accepts the registration, before its row is
    /// written: a registration the store then fails (`Store`,
    /// `StoreTimeout`) has still evicted the idle session it made room
    /// with, as the LRU reclaim would have (G3: never a running or held
    /// one); one the core refuses (`OverCapacity`) changes nothing.
    ///
    /// A `parent` this kernel does not keep (finalized in an earlier run,
    /// or by another process) is looked up in the store as
    /// [`session`](Self::session) does: a finalized one is refused
    /// `SessionClosed`, as any finalized parent; one live in another
    /// process `LiveElsewhere`; only an id the store has never had is
    /// `Lifecycle(UnknownSession)`.
    ///
    /// Dropping the returned future before it is ready (a timeout around
    /// it, its task aborted) gives the registration up: a session made for
    /// it meanwhile, which nobody can hold, is cancelled once made, as one
    /// whose guard was dropped is, rather than left live.
    ///
    /// # Errors
    /// [`RuntimeError::Lifecycle`] when the core refuses, [`RuntimeError::Store`]
    /// or [`RuntimeError::StoreTimeout`] when the row cannot be written;
    /// [`RuntimeError::Stopped`] once the kernel has stopped.
    pub async fn register(
        &self,
        name: impl Into<String>,
        parent: Option<SessionId>,
    ) -> Result<SessionHandle, RuntimeError> {
        self.register_as(name.into(), parent, None, None, None)
            .await
    }

    /// Registers a session as [`register_in`](Self::register_in) does,
    /// recorded in the store as `principal`'s in the same write as its row
    /// ([`principal`](Self::principal)): a gateway's client, who alone may
    /// use it, on this process after a restart and on every process of a
    /// fleet. A registration the store refused records nothing.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_for(
        &self,
        principal: &str,
        scope: Scope,
        name: impl Into<String>,
        parent: Option<SessionId>,
    ) -> Result<SessionHandle, RuntimeError> {
        let principal = Some(Arc::from(principal));
        self.register_as(name.into(), parent, None, Some(scope), principal)
            .await
    }

    /// Registers a session as [`register`](Self::register) does, in
    /// `scope` (for a principal, [`scope_of`](Self::scope_of)): at the LRU
    /// cap it evicts only idle sessions of that scope, the least recently
    /// active first, and is refused with `Lifecycle(OverCapacity)` when it
    /// has none to evict, however many of other scopes are idle. Its
    /// [`child`](SessionHandle::child)ren are in the same scope; under a
    /// `parent` of another scope it is in `scope` all the same.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_in(
        &self,
        scope: Scope,
        name: impl Into<String>,
        parent: Option<SessionId>,
    ) -> Result<SessionHandle, RuntimeError> {
        self.register_as(name.into(), parent, None, Some(scope), None)
            .await
    }

    /// Registers a session in `scope` as [`register_in`](Self::register_in)
    /// does, with a [`Budget`] as [`register_with_budget`](Self::register_with_budget)
    /// sets one, in the same step.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_in_with_budget(
        &self,
        scope: Scope,
        name: impl Into<String>,
        parent: Option<SessionId>,
        budget: Budget,
    ) -> Result<SessionHandle, RuntimeError> {
        self.register_as(name.into(), parent, Some(budget), Some(scope), None)
            .await
    }

    /// Registers a session as [`register`](Self::register) does, with a
    /// [`Budget`] for it and every session under it: the turns they start,
    /// the tokens their usage reports count, the wall time from now.
    /// Children registered under it count against it (and may have
    /// budgets of their own). Exceeding it cancels the subtree, children
    /// first (G1), and finalizes every session of it with
    /// [`EndReason::BudgetExhausted`]; the turn that would go past the turn
    /// limit is refused with `Lifecycle(BudgetExhausted)`. A reply its
    /// provider said is done ([`StreamEvent::Finished`](settle_stream::StreamEvent::Finished),
    /// an OpenAI finish reason) is not cut by its own usage report, which
    /// servers send after it: it ends as it did (`completed`, or `failed`
    /// truncated), and the rest of the subtree is cancelled at once.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_with_budget(
        &self,
        name: impl Into<String>,
        parent: Option<SessionId>,
        budget: Budget,
    ) -> Result<SessionHandle, RuntimeError> {
        self.register_as(name.into(), parent, Some(budget), None, None)
            .await
    }

    async fn register_as(
        &self,
        name: String,
        parent: Option<SessionId>,
        budget: Option<Budget>,
        scope: Option<Scope>,
        principal: Option<Arc<str>>,
    ) -> Result<SessionHandle, RuntimeError> {
        check_name(&name)?;
        let name: Arc<str> = name.into();
        let register = || {
            let (name, principal) = (name.clone(), principal.clone());
            self.register_command(move |reply| Command::Register {
                name,
                parent,
                resumed_from: None,
                budget,
                scope,
                principal,
                reply,
            })
        };
        let shared = match register().await {
            // A parent the core does not keep (finalized in an earlier run,
            // forgotten since, another process's): looked up in the store
            // as `session` does, which teaches the core a finalized one,
            // and asked again, so that the core answers as for any
            // finalized parent (`SessionClosed`) and never "not known" for
            // a session that exists.
            Err(RuntimeError::Lifecycle(settle_core::Error::UnknownSession(p)))
                if Some(p) == parent =>
            {
                self.session(p).await?;
                register().await?
            }
            registered => registered?,
        };
        Ok(SessionHandle::new(shared, self.clone()))
    }

    /// A handle for session `id`: an open session of this kernel, or a
    /// finalized one (finalized here, in an earlier run, or by another
    /// process), whose handle is closed: every method answers as the core
    /// answers a finalized session (`SessionClosed` to using it,
    /// `AlreadyFinalized` to ending it, its end reason to
    /// [`close`](SessionHandle::close)), never "not known".
    ///
    /// # Errors
    /// `Lifecycle(UnknownSession)` when neither the kernel nor the store
    /// has it; for an id the kernel does not know, `StoreTimeout` when the
    /// store did not answer within the store timeout and `Store` when it
    /// failed (whether the session exists is not known then);
    /// `LiveElsewhere` when the store has it
    /// live and another process owns it (a crashed one's is recovered with
    /// `settle recover`); `SessionClosed` when the kernel finalized it but
    /// the store's row does not say so yet (its finalize not committed) or
    /// cannot be read in time. Once the kernel has stopped, a session the
    /// store has finalized still gets its closed handle, and any other
    /// `Stopped`.
    pub async fn session(&self, id: SessionId) -> Result<SessionHandle, RuntimeError> {
        let found = self
            .ask(|reply| Command::Lookup { session: id, reply })
            .await;
        // A stopped kernel keeps no table: the store says how a session
        // ended, as for one this kernel never knew.
        let stopped = matches!(found, Err(RuntimeError::Stopped));
        let known = match found {
            Ok(shared) => return Ok(SessionHandle::new(shared, self.clone())),
            Err(RuntimeError::SessionClosed(_)) => true,
            Err(RuntimeError::Lifecycle(settle_core::Error::UnknownSession(_))) => false,
            Err(RuntimeError::Stopped) => false,
            Err(error) => return Err(error),
        };
        let unknown = || RuntimeError::from(settle_core::Error::UnknownSession(id));
        let bound = self.store_timeout();
        let read = tokio::time::timeout(bound, self.store().session_detail(id)).await;
        let row = match read {
            Ok(Ok(detail)) if detail.session.state == settle_core::State::Finalized => {
                detail.session
            }
            _ if known => return Err(RuntimeError::SessionClosed(id)),
            _ if stopped => return Err(RuntimeError::Stopped),
            // Live in the store, and not here: another process's.
            Ok(Ok(detail)) => {
                return Err(RuntimeError::LiveElsewhere {
                    session: id,
                    state: detail.session.state,
                })
            }
            Ok(Err(settle_store::StoreError::UnknownSession(_))) => return Err(unknown()),
            // Whether it exists is not known: said as the store's failure,
            // not as "no such session".
            Ok(Err(error)) => return Err(RuntimeError::Store(error)),
            Err(_) => {
                return Err(RuntimeError::StoreTimeout {
                    what: "looking a session up",
                    after: bound,
                    writing: false,
                })
            }
        };
        let Some(reason) = row.end_reason else {
            return Err(if known {
                RuntimeError::SessionClosed(id)
            } else {
                unknown()
            });
        };
        if !known && !stopped {
            // The core learns the fact, so its table answers for it.
            self.send(Command::Finalized { session: id })?;
        }
        let shared = SessionShared::closed(&row, reason);
        Ok(SessionHandle::new(shared, self.clone()))
    }
}
