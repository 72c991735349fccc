//! Who waits for a write a caller asked for (a registration, a turn's
//! start, a hold's record): told once, either by the recorder when the
//! store answers, or by the caller's own patience.
//!
//! The recorder hands writes to the store one batch after another, and
//! waits in its own loop for a batch ahead (and for a try again of writes a
//! blip left): a write asked for while the store is stalled behind another
//! would be answered only once those gave up, up to two store timeouts
//! after it was asked. So the caller keeps the store timeout itself,
//! counted from its ask: at that bound it takes its waiters out of the slot
//! it shares with the recorder, unless the recorder has, and tells them the
//! write failed, with what the store last said of it (or that it did not
//! answer). The write itself is the recorder's to finish:
//!
//! - a turn's start stays queued; once the store takes it, the turn's
//!   failed end, queued behind it, is written too, so the stored turns keep
//!   the kernel's numbers (see `recorder/retry.rs`);
//! - a registration is withdrawn from the kernel by its caller before the
//!   caller is told (its next ask finds it gone), and its row, if the store
//!   writes it after all, is ended, as one refused at the store timeout
//!   that may have been written is; one still waiting in the driver for
//!   its ids is dropped there, never registered. A caller that stops
//!   waiting before either (its future dropped) never takes the session it
//!   is told: the answer ends it ([`UnclaimedSession`]);
//! - a hold is taken back by its caller (a release queued to the kernel)
//!   before the caller is told it failed, so that a hold said failed is not
//!   in effect; its record, if the store writes it after all, is followed
//!   by the record of its taking back. A release is in effect here
//!   whatever its record does: its caller is answered at the bound as if
//!   it were written, and a record the store refused is owed, as the
//!   recorder's own answer says.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_core::{Event, Handled, SessionId, WorkId};
use settle_store::StoreError;
use tokio::sync::{mpsc, oneshot};

use crate::command::{Command, Reply};
use crate::error::RuntimeError;
use crate::shared::SessionShared;

struct Slot<W> {
    /// The waiters, until one side tells them.
    waiters: Option<W>,
    /// What the store said last of the write (a failure it may heal from).
    last: Option<StoreError>,
}

/// The waiters of one write, shared by the recorder and the caller.
pub(crate) struct Told<W>(Arc<Mutex<Slot<W>>>);

impl<W> Clone for Told<W> {
    fn clone(&self) -> Self {
        Told(self.0.clone())
    }
}

impl<W> std::fmt::Debug for Told<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.0.lock().is_ok_and(|slot| slot.waiters.is_some());
        f.debug_struct("Told").field("waiting", &waiting).finish()
    }
}

impl<W> Told<W> {
    /// A slot holding `waiters`.
    pub(crate) fn new(waiters: W) -> Told<W> {
        let slot = Slot {
            waiters: Some(waiters),
            last: None,
        };
        Told(Arc::new(Mutex::new(slot)))
    }

    /// The waiters, to be told now; `None` once they were.
    pub(crate) fn take(&self) -> Option<W> {
        self.0.lock().ok()?.waiters.take()
    }

    /// Runs `note` on the waiters while they wait, under the slot's lock
    /// (so the caller giving up sees it, or it does not run); `false` once
    /// they were told.
    pub(crate) fn while_waiting(&self, note: impl FnOnce(&mut W)) -> bool {
        let Ok(mut slot) = self.0.lock() else {
            return false;
        };
        match slot.waiters.as_mut() {
            Some(waiters) => {
                note(waiters);
                true
            }
            None => false,
        }
    }

    /// Notes what the store said of the write, for a caller told at its
    /// bound before the write is tried again.
    pub(crate) fn failed_with(&self, error: StoreError) {
        if let Ok(mut slot) = self.0.lock() {
            slot.last = Some(error);
        }
    }

    /// At the caller's bound: the waiters, unless the recorder took them,
    /// and what the store last said of the write (`None`: nothing yet, it
    /// did not answer).
    fn give_up(&self) -> Option<(W, Option<StoreError>)> {
        let mut slot = self.0.lock().ok()?;
        let waiters = slot.waiters.take()?;
        Some((waiters, slot.last.take()))
    }

    /// The caller's wait for `answer`, until `deadline`: the answer
    /// (`None`: the kernel stopped without one), or, at the bound, the
    /// waiters given up with what the store said last. When the recorder
    /// took the waiters first, its answer is on its way and is waited for.
    ///
    /// The caller's own clone of the slot keeps `answer`'s sender alive, so
    /// a command the kernel dropped as it stopped (sent as its driver
    /// ended) never closes `answer`: `stopped` (the kernel's) ends the wait
    /// then, instead of the store timeout. The recorder tells what it took
    /// before it ends, so an answer given is in `answer` by then.
    async fn wait<T>(
        &self,
        mut answer: oneshot::Receiver<T>,
        deadline: tokio::time::Instant,
        stopped: impl std::future::Future<Output = ()>,
    ) -> Result<Option<T>, (W, Option<StoreError>)> {
        let timed = {
            let within = tokio::time::timeout_at(deadline, &mut answer);
            tokio::select! {
                biased;
                told = within => Some(told),
                () = stopped => None,
            }
        };
        match timed {
            Some(Ok(told)) => return Ok(told.ok()),
            Some(Err(_)) => {}
            None => {
                if let Ok(told) = answer.try_recv() {
                    return Ok(Some(told));
                }
                return match self.give_up() {
                    // Nobody will answer: the kernel stopped without it.
                    Some(_) => Ok(None),
                    None => Ok(answer.await.ok()),
                };
            }
        }
        match self.give_up() {
            Some(given_up) => Err(given_up),
            None => Ok(answer.await.ok()),
        }
    }
}

/// Who waits for a turn's start to be written.
pub(crate) struct StartWaiters {
    /// The turn.
    work: WorkId,
    /// Where the core hears that its start was refused.
    commands: mpsc::WeakUnboundedSender<Command>,
    /// The work, which streams once the start is written.
    done: oneshot::Sender<Result<(), StoreError>>,
    /// The caller, who is given the turn once its start is written.
    announce: oneshot::Sender<Result<(), StoreError>>,
}

impl StartWaiters {
    /// Tells the work and the caller how the start went. A refusal is told
    /// to the core first ([`Event::StartRefused`]): the caller's next start,
    /// asked as soon as it hears, then waits for the refused turn's end
    /// (its work fails on its own) instead of being refused as if that turn
    /// still ran.
    pub(crate) fn tell(self, answer: Result<(), StoreError>) {
        if answer.is_err() {
            if let Some(commands) = self.commands.upgrade() {
                let event = Event::StartRefused { work: self.work };
                let _ = commands.send(Command::Core { event, reply: None });
            }
        }
        let _ = self.announce.send(answer.clone());
        let _ = self.done.send(answer);
    }
}

/// The waiters of a turn's start.
pub(crate) type StartTold = Told<StartWaiters>;

impl StartTold {
    /// The waiters of `work`'s start, the work's (`done`) and the caller's:
    /// the caller waits on the [`Announced`], at the latest until
    /// `deadline`; a refusal is told to the core through `commands` first.
    pub(crate) fn start(
        work: WorkId,
        commands: mpsc::WeakUnboundedSender<Command>,
        done: oneshot::Sender<Result<(), StoreError>>,
        deadline: tokio::time::Instant,
    ) -> (StartTold, Announced) {
        let (announce, told) = oneshot::channel();
        let slot = Told::new(StartWaiters {
            work,
            commands,
            done,
            announce,
        });
        let announced = Announced {
            told,
            slot: slot.clone(),
            deadline,
        };
        (slot, announced)
    }
}

/// The caller's side of a turn's start: answered once the start is written,
/// or could not be.
pub(crate) struct Announced {
    told: oneshot::Receiver<Result<(), StoreError>>,
    slot: StartTold,
    /// The store timeout from the start's write handed on: a start that
    /// first waited for a cancelled turn's end (the settle timeout bounds
    /// that, G5) is not refused for that wait as if the store had not
    /// answered.
    deadline: tokio::time::Instant,
}

impl Announced {
    /// How the start went, at the latest at its deadline (the store
    /// timeout, `patience`, from its write handed on, which for a start
    /// nothing held back is its ask); `None` when the kernel stopped
    /// without saying.
    pub(crate) async fn wait(
        self,
        patience: Duration,
        stopped: impl std::future::Future<Output = ()>,
    ) -> Option<Result<(), StoreError>> {
        match self.slot.wait(self.told, self.deadline, stopped).await {
            Ok(told) => told,
            // At the bound: both sides are told, the work and this caller.
            Err((waiters, last)) => {
                let refused = last.unwrap_or(StoreError::TimedOut { after: patience });
                waiters.tell(Err(refused.clone()));
                Some(Err(refused))
            }
        }
    }
}

/// The caller of a registration, until told, and the session it was
/// registered as once the driver has (so that a caller giving up has the
/// kernel withdraw it).
pub(crate) struct RegisterWaiter {
    reply: Reply<UnclaimedSession>,
    session: Option<SessionId>,
    /// Where a registration nobody took is ended.
    commands: mpsc::WeakUnboundedSender<Command>,
}

/// The caller of a registration, until told.
pub(crate) type RegisterTold = Told<RegisterWaiter>;

impl RegisterWaiter {
    /// Tells the caller `answer`.
    pub(crate) fn tell(self, answer: Result<Arc<SessionShared>, RuntimeError>) {
        let commands = self.commands;
        let _ = self.reply.send(answer.map(|shared| UnclaimedSession {
            shared: Some(shared),
            commands,
        }));
    }
}

/// A registered session on its way to its caller. A caller that gave up
/// before it was told (a timeout around its wait, its task aborted) never
/// takes it: the answer is dropped unsent, or unread in the channel, and
/// the session, which nobody can hold, is ended as an abandoned one is
/// (`Event::Abandoned`: cancelled, or left to a shutdown that began),
/// instead of staying live for the process's life.
pub(crate) struct UnclaimedSession {
    shared: Option<Arc<SessionShared>>,
    commands: mpsc::WeakUnboundedSender<Command>,
}

impl UnclaimedSession {
    /// Taken by its caller, who is given its handle.
    fn claim(mut self) -> Option<Arc<SessionShared>> {
        self.shared.take()
    }
}

impl Drop for UnclaimedSession {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        if let Some(commands) = self.commands.upgrade() {
            let event = Event::Abandoned { session: shared.id };
            let _ = commands.send(Command::Core { event, reply: None });
        }
    }
}

impl RegisterTold {
    /// Waits for the registration `send` hands to the kernel, at the latest
    /// until `deadline` (the store timeout, `patience`, from the ask). At
    /// the bound, a registration the driver made is withdrawn (through
    /// `commands`, with the error the caller is given) before this returns, so that
    /// the caller's next ask finds it gone; one it has not made yet never
    /// will be.
    ///
    /// # Errors
    /// As the kernel refuses it; the store's last error or
    /// [`RuntimeError::StoreTimeout`] at the bound; `Stopped` when the kernel
    /// stopped without saying.
    pub(crate) async fn registered(
        send: impl FnOnce(RegisterTold) -> Result<(), RuntimeError>,
        commands: mpsc::WeakUnboundedSender<Command>,
        deadline: tokio::time::Instant,
        patience: Duration,
        stopped: impl std::future::Future<Output = ()>,
    ) -> Result<Arc<SessionShared>, RuntimeError> {
        let (reply, answer) = oneshot::channel();
        let slot = Told::new(RegisterWaiter {
            reply,
            session: None,
            commands,
        });
        send(slot.clone())?;
        let (waiter, last) = match slot.wait(answer, deadline, stopped).await {
            Ok(answer) => {
                let registered = answer.ok_or(RuntimeError::Stopped)??;
                return registered.claim().ok_or(RuntimeError::Stopped);
            }
            Err(given_up) => given_up,
        };
        let what = "registering a session";
        let error = match last {
            Some(last) => RuntimeError::from_store(what, last),
            None => RuntimeError::StoreTimeout {
                what,
                after: patience,
                writing: true,
            },
        };
        if let (Some(session), Some(commands)) = (waiter.session, waiter.commands.upgrade()) {
            let error = error.to_string();
            let _ = commands.send(Command::Withdraw { session, error });
        }
        Err(error)
    }

    /// Notes that the driver registered it as `session`; `false` when its
    /// caller gave up first (it is then not registered).
    pub(crate) fn registering(&self, session: SessionId) -> bool {
        self.while_waiting(|waiter| waiter.session = Some(session))
    }

    /// Tells the caller `answer`, unless it was told already.
    pub(crate) fn tell(&self, answer: Result<Arc<SessionShared>, RuntimeError>) {
        if let Some(waiter) = self.take() {
            waiter.tell(answer);
        }
    }
}

/// The caller of a hold or a release, until told.
pub(crate) type HoldTold = Told<Reply<Handled>>;

impl HoldTold {
    /// Tells the caller `answer`, unless it was told already (it gave up).
    pub(crate) fn tell(&self, answer: Result<Handled, RuntimeError>) {
        if let Some(reply) = self.take() {
            let _ = reply.send(answer);
        }
    }

    /// Waits for the hold or release that `send` hands to the kernel, at
    /// the latest until `deadline` (the store timeout, `patience`, from the
    /// ask). At the bound a hold is taken back (`taken_back`, the release
    /// of a hold, through `commands`: queued behind it) before its caller
    /// is told the store's last error, or that it did not answer; a
    /// release (no `taken_back`) is answered as applied: it is in effect
    /// here either way.
    ///
    /// # Errors
    /// As the kernel refuses it; for a hold, the store's error at the
    /// bound; `Stopped` when the kernel stopped without saying.
    pub(crate) async fn changed(
        taken_back: Option<Event>,
        send: impl FnOnce(HoldTold) -> Result<(), RuntimeError>,
        commands: mpsc::WeakUnboundedSender<Command>,
        deadline: tokio::time::Instant,
        patience: Duration,
        stopped: impl std::future::Future<Output = ()>,
    ) -> Result<Handled, RuntimeError> {
        let (reply, answer) = oneshot::channel();
        let slot = Told::new(reply);
        send(slot.clone())?;
        let last = match slot.wait(answer, deadline, stopped).await {
            Ok(answer) => return answer.ok_or(RuntimeError::Stopped)?,
            Err((_, last)) => last,
        };
        let Some(event) = taken_back else {
            return Ok(Handled::Applied);
        };
        if let Some(commands) = commands.upgrade() {
            let _ = commands.send(Command::Core { event, reply: None });
        }
        let what = "recording a session's hold";
        Err(match last {
            Some(last) => RuntimeError::from_store(what, last),
            None => RuntimeError::StoreTimeout {
                what,
                after: patience,
                writing: true,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tokio::time::Instant;

    use super::Told;

    /// G9: a registration (or a start) sent as the driver ended, its
    /// command dropped unanswered, is answered when the kernel stops, not
    /// at the store timeout: the caller's own clone of the slot keeps the
    /// reply's sender alive, so its receiver never closes by itself (a
    /// `settle run` agent registering as a SIGTERM landed held the exit 10 s).
    #[tokio::test(start_paused = true)]
    async fn a_wait_whose_command_was_dropped_as_the_kernel_stopped_ends_with_the_stop() {
        let (reply, answer) = oneshot::channel::<u8>();
        let slot = Told::new(reply);
        // The command's clone, dropped by the stopping driver.
        drop(slot.clone());
        let asked = Instant::now();
        let stopped = tokio::time::sleep(Duration::from_millis(10));
        let waited = slot.wait(answer, asked + Duration::from_secs(600), stopped);
        assert!(matches!(waited.await, Ok(None)), "not told it stopped");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{:?}",
            asked.elapsed()
        );

        // An answer told before the stop is the answer.
        let (reply, answer) = oneshot::channel::<u8>();
        let slot = Told::new(reply);
        if let Some(reply) = slot.take() {
            let _ = reply.send(7);
        }
        let waited = slot.wait(answer, Instant::now() + Duration::from_secs(600), async {});
        assert!(matches!(waited.await, Ok(Some(7))));
    }
}
