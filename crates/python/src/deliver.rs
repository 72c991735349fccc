//! How the kernel's results reach Python: event-loop mailboxes, and the one
//! thread that takes the GIL on the kernel's behalf.
//!
//! No runtime thread ever waits for the GIL. What is for an event loop (a
//! kernel call's result, a pump or a task to start or to cancel) is posted
//! to that loop's [`Mailbox`]: a queue the loop drains itself, on its own
//! thread, with one scheduled callback per batch. Only the first post to an
//! idle mailbox wakes the loop: the deliverer thread attaches to the
//! interpreter and calls `loop.call_soon_threadsafe(drain)` once (one
//! self-pipe write); everything posted until the drain runs goes with it,
//! and a drain that finds more when it is done schedules itself again with
//! a plain `call_soon`, from the loop's own thread, without waking anyone.
//! A subtree of ten thousand sessions torn down at once reaches its loop in
//! a handful of wakes, not in one per session, and the jobs themselves run
//! on the loop's thread, where the GIL already is.
//!
//! What needs the GIL but no loop (closing a coroutine never started) goes
//! to the deliverer thread directly. A mailbox whose loop is closed (or
//! gone) runs each job's fallback there instead, once: a kernel call's
//! result is dropped, a pump that cannot start reports that it failed, a
//! pump that cannot be cancelled counts as closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};

use pyo3::prelude::*;
use pyo3::types::PyWeakrefReference;
use tokio_util::sync::CancellationToken;

use crate::stranded::{Stranded, PROBE_EVERY};

/// What runs on the deliverer with the GIL held.
pub(crate) type Job = Box<dyn for<'py> FnOnce(Python<'py>) + Send>;

/// Where a loop's job runs: on its loop (with the loop), or nowhere because
/// the loop is closed or gone (then the job does its fallback).
pub(crate) enum Landing<'py> {
    /// On the loop's own thread, from its drain callback.
    Loop(&'py Bound<'py, PyAny>),
    /// The loop is closed or was collected: nothing can be scheduled on it.
    Closed,
}

/// A job for an event loop.
pub(crate) type LoopJob = Box<dyn for<'py> FnOnce(Python<'py>, Landing<'py>) + Send>;

/// The sending side of the deliverer.
pub(crate) struct Deliverer {
    jobs: mpsc::Sender<Job>,
    gate: Arc<Gate>,
    /// The mailboxes of the loops this process's kernels deliver to.
    mailboxes: Mailboxes,
}

/// The mailboxes, shared with the deliverer's thread, which probes them for
/// loops closed under pending work (see `stranded.rs`).
type Mailboxes = Arc<Mutex<Vec<Arc<Mailbox>>>>;

/// Keeps the deliverer away from an interpreter that is exiting: a thread
/// that asks for the GIL once finalization has begun is ended inside
/// CPython (`pthread_exit`), which no Rust frame survives.
#[derive(Default)]
struct Gate {
    /// Held by the deliverer for as long as it is attached.
    attached: Mutex<()>,
    /// Set once the interpreter is exiting; the deliverer never attaches again.
    closed: AtomicBool,
}

/// At most this many jobs per GIL acquisition, so Python threads get it back.
const BATCH: usize = 512;

/// An outbox this full is handed over before the loop's iteration ends.
const OUTBOX_BATCH: usize = 128;

impl Deliverer {
    /// Starts the deliverer's thread.
    pub fn start() -> std::io::Result<Arc<Deliverer>> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let gate = Arc::new(Gate::default());
        let mailboxes = Mailboxes::default();
        let (theirs, probed) = (gate.clone(), mailboxes.clone());
        std::thread::Builder::new()
            .name("settle-deliver".into())
            .spawn(move || run(queue, &theirs, &probed))?;
        Ok(Arc::new(Deliverer {
            jobs,
            gate,
            mailboxes,
        }))
    }

    /// Stops delivering for good, once the job in hand (if any) is done:
    /// what interpreter exit calls, with the GIL released.
    pub fn close(&self) {
        let _attached = self.gate.attached.lock();
        self.gate.closed.store(true, Ordering::Release);
    }

    /// Queues `job` to run on the deliverer's thread with the GIL held.
    pub fn send(&self, job: impl for<'py> FnOnce(Python<'py>) + Send + 'static) {
        let _ = self.jobs.send(Box::new(job));
    }

    /// The mailbox of `event_loop` (made on first use), for results to
    /// reach it. Called with the GIL held, usually on the loop's thread.
    pub fn mailbox(self: &Arc<Self>, event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<Mailbox>> {
        let mut mailboxes = self
            .mailboxes
            .lock()
            .map_err(|_| crate::errors::error("the settle mailboxes are poisoned"))?;
        let py = event_loop.py();
        if let Some(found) = mailboxes.iter().find(|m| m.is_for(py, event_loop)) {
            return Ok(found.clone());
        }
        // The mailboxes of loops that are gone are dropped here, so a
        // program that runs many loops one after another keeps few.
        mailboxes.retain(|m| m.loop_alive(py));
        let mailbox = Arc::new(Mailbox {
            event_loop: PyWeakrefReference::new(event_loop)?.unbind(),
            stranded: Mutex::new(Vec::new()),
            mail: Mutex::new(Mail::default()),
            outbox: Mutex::new(Outbox::default()),
            deliver: Arc::downgrade(self),
        });
        mailboxes.push(mailbox.clone());
        Ok(mailbox)
    }
}

/// The queue of one event loop. It holds only a weak reference to its
/// loop: a mailbox never keeps a loop alive.
pub(crate) struct Mailbox {
    event_loop: Py<PyWeakrefReference>,
    /// The works pending on its loop, for the probe (see `stranded.rs`).
    stranded: Mutex<Vec<Weak<dyn Stranded>>>,
    mail: Mutex<Mail>,
    /// The other way: what the loop's thread has for the kernel (a pump's
    /// stream closed), handed over once per iteration of the loop.
    outbox: Mutex<Outbox>,
    deliver: std::sync::Weak<Deliverer>,
}

/// What the loop's thread has for the kernel, until its flush runs.
#[derive(Default)]
struct Outbox {
    closed: Vec<CancellationToken>,
    /// A flush is scheduled on the loop.
    scheduled: bool,
}

#[derive(Default)]
struct Mail {
    jobs: Vec<LoopJob>,
    /// A drain is scheduled on the loop (or the deliverer is asked to
    /// schedule one): a post does not wake the loop again.
    scheduled: bool,
    /// The loop is closed or gone: jobs run their fallback at once.
    closed: bool,
}

impl Mailbox {
    /// Registers a work whose Python side runs on this loop: if the loop
    /// closes under it, the deliverer's probe ends it.
    pub fn watch(&self, work: Weak<dyn Stranded>) {
        if let Ok(mut stranded) = self.stranded.lock() {
            // Those gone are let go of as the list doubles, so it stays
            // about as long as the works alive.
            if stranded.len() == stranded.capacity() {
                stranded.retain(|w| w.strong_count() > 0);
            }
            stranded.push(work);
        }
    }

    /// The works registered and alive (the dead ones let go of).
    fn watched(&self) -> Vec<Arc<dyn Stranded>> {
        let Ok(mut stranded) = self.stranded.lock() else {
            return Vec::new();
        };
        stranded.retain(|w| w.strong_count() > 0);
        stranded.iter().filter_map(Weak::upgrade).collect()
    }

    /// Whether any registered work is alive.
    fn watches_any(&self) -> bool {
        self.stranded
            .lock()
            .is_ok_and(|s| s.iter().any(|w| w.strong_count() > 0))
    }

    fn is_for(&self, py: Python<'_>, event_loop: &Bound<'_, PyAny>) -> bool {
        self.event_loop
            .bind(py)
            .upgrade()
            .is_some_and(|l| l.is(event_loop))
    }

    fn loop_alive(&self, py: Python<'_>) -> bool {
        self.event_loop.bind(py).upgrade().is_some()
    }

    /// Whether its loop is closed or gone, found by asking the loop; a
    /// mailbox that finds it so closes (its queued jobs run their fallback).
    /// A work started on a loop that then closed with the work's task still
    /// pending (a task made while `asyncio.run` was cancelling the ones it
    /// knew, or a loop closed without cancelling its tasks) never runs
    /// again and hears nothing more; those who wait for it on another loop
    /// ask here.
    pub fn loop_closed(&self, py: Python<'_>) -> bool {
        if self.mail.lock().map_or(true, |mail| mail.closed) {
            return true;
        }
        let closed = match self.event_loop.bind(py).upgrade() {
            None => true,
            Some(event_loop) => event_loop
                .call_method0(pyo3::intern!(py, "is_closed"))
                .and_then(|closed| closed.is_truthy())
                .unwrap_or(false),
        };
        if closed {
            self.close(py);
        }
        closed
    }

    /// Queues `job` for the loop; the first job of a batch wakes it (through
    /// the deliverer thread). Never waits for the GIL.
    pub fn post(
        self: &Arc<Self>,
        job: impl for<'py> FnOnce(Python<'py>, Landing<'py>) + Send + 'static,
    ) {
        let Some(deliver) = self.deliver.upgrade() else {
            return;
        };
        let job: LoopJob = Box::new(job);
        let wake = match self.mail.lock() {
            Ok(mut mail) if !mail.closed => {
                mail.jobs.push(job);
                !std::mem::replace(&mut mail.scheduled, true)
            }
            _ => {
                deliver.send(move |py| job(py, Landing::Closed));
                return;
            }
        };
        if wake {
            let mailbox = self.clone();
            deliver.send(move |py| mailbox.wake(py));
        }
    }

    /// Schedules a drain on the loop (on the deliverer's thread); a loop
    /// that is closed or gone closes the mailbox instead.
    fn wake(self: Arc<Self>, py: Python<'_>) {
        let Some(event_loop) = self.event_loop.bind(py).upgrade() else {
            self.close(py);
            return;
        };
        if Drain::schedule(py, &self, &event_loop, "call_soon_threadsafe").is_err() {
            // `Event loop is closed`: nothing will run on it again.
            self.close(py);
        }
    }

    /// The loop is closed: every queued job (and every later one) runs its
    /// fallback, here. The first time, the bridge lets go of what was
    /// still pending on the loop (`_bridge.loop_closed`).
    fn close(&self, py: Python<'_>) {
        let (jobs, first) = match self.mail.lock() {
            Ok(mut mail) => {
                let first = !std::mem::replace(&mut mail.closed, true);
                mail.scheduled = false;
                (std::mem::take(&mut mail.jobs), first)
            }
            Err(_) => return,
        };
        for job in jobs {
            job(py, Landing::Closed);
        }
        if let (true, Some(event_loop)) = (first, self.event_loop.bind(py).upgrade()) {
            let forgotten = crate::awaitable::bridge(py)
                .and_then(|b| b.call_method1(pyo3::intern!(py, "loop_closed"), (event_loop,)));
            if let Err(error) = forgotten {
                tracing::debug!(%error, "could not let go of a closed loop's work");
            }
        }
    }
}

impl Mailbox {
    /// Cancels `token` (what a Rust future waits on) from the loop's
    /// thread, at the next iteration of the loop, with every other one the
    /// loop's tasks cancelled meanwhile: a thousand pumps that end in one
    /// iteration wake the kernel's threads once, not a thousand times (each
    /// wake of a parked thread is a system call on the loop's thread).
    pub fn cancel_soon(self: &Arc<Self>, py: Python<'_>, token: CancellationToken) {
        let (schedule, full) = match self.outbox.lock() {
            Ok(mut outbox) => {
                outbox.closed.push(token);
                let full = outbox.closed.len() >= OUTBOX_BATCH;
                let full = full.then(|| std::mem::take(&mut outbox.closed));
                (!std::mem::replace(&mut outbox.scheduled, true), full)
            }
            Err(_) => {
                token.cancel();
                return;
            }
        };
        // A full batch goes now, so the kernel works on it while the loop
        // goes on with the rest of the iteration.
        for token in full.into_iter().flatten() {
            token.cancel();
        }
        if !schedule {
            return;
        }
        let scheduled = self.event_loop.bind(py).upgrade().map(|event_loop| {
            Bound::new(
                py,
                Flush {
                    mailbox: self.clone(),
                },
            )
            .and_then(|flush| event_loop.call_method1(pyo3::intern!(py, "call_soon"), (flush,)))
        });
        if !matches!(scheduled, Some(Ok(_))) {
            self.flush();
        }
    }

    fn flush(&self) {
        let tokens = match self.outbox.lock() {
            Ok(mut outbox) => {
                outbox.scheduled = false;
                std::mem::take(&mut outbox.closed)
            }
            Err(_) => return,
        };
        for token in tokens {
            token.cancel();
        }
    }
}

/// The callback that hands a mailbox's outbox to the kernel; dropped unrun
/// (its loop closed first), it hands it over all the same.
#[pyclass(module = "settle._settle", frozen)]
struct Flush {
    mailbox: Arc<Mailbox>,
}

#[pymethods]
impl Flush {
    fn __call__(&self) {
        self.mailbox.flush();
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.mailbox.flush();
    }
}

/// The callback that drains a mailbox on its loop's thread.
#[pyclass(module = "settle._settle", frozen)]
struct Drain {
    mailbox: Arc<Mailbox>,
    /// Scheduled on the loop and not run yet.
    pending: AtomicBool,
}

impl Drain {
    /// Schedules a drain of `mailbox` on `event_loop` with its method
    /// `how` (`call_soon_threadsafe` from another thread, `call_soon` from
    /// the loop's own).
    fn schedule(
        py: Python<'_>,
        mailbox: &Arc<Mailbox>,
        event_loop: &Bound<'_, PyAny>,
        how: &str,
    ) -> PyResult<()> {
        let drain = Bound::new(
            py,
            Drain {
                mailbox: mailbox.clone(),
                pending: AtomicBool::new(false),
            },
        )?;
        event_loop.call_method1(how, (drain.clone(),))?;
        drain.get().pending.store(true, Ordering::Release);
        Ok(())
    }
}

#[pymethods]
impl Drain {
    fn __call__(slf: &Bound<'_, Self>) {
        let py = slf.py();
        let this = slf.get();
        this.pending.store(false, Ordering::Release);
        let mailbox = &this.mailbox;
        let jobs = match mailbox.mail.lock() {
            Ok(mut mail) => std::mem::take(&mut mail.jobs),
            Err(_) => return,
        };
        let Some(event_loop) = mailbox.event_loop.bind(py).upgrade() else {
            mailbox.close(py);
            return;
        };
        for job in jobs {
            job(py, Landing::Loop(&event_loop));
        }
        // What came in meanwhile goes with the next iteration of the loop,
        // scheduled from here: no thread switch, no self-pipe write.
        let again = match mailbox.mail.lock() {
            Ok(mut mail) => {
                mail.scheduled = !mail.jobs.is_empty();
                mail.scheduled
            }
            Err(_) => false,
        };
        if again && Drain::schedule(py, mailbox, &event_loop, "call_soon").is_err() {
            mailbox.close(py);
        }
    }
}

impl Drop for Drain {
    /// A drain dropped unrun (its loop was closed with the callback still
    /// pending): the mailbox's jobs would wait forever, so the deliverer is
    /// asked to wake it again, which finds the loop closed and runs their
    /// fallbacks.
    fn drop(&mut self) {
        if !self.pending.load(Ordering::Acquire) {
            return;
        }
        let Some(deliver) = self.mailbox.deliver.upgrade() else {
            return;
        };
        let mailbox = self.mailbox.clone();
        deliver.send(move |py| mailbox.wake(py));
    }
}

fn run(queue: mpsc::Receiver<Job>, gate: &Gate, mailboxes: &Mailboxes) {
    // One thread state for the thread's whole life. Attaching a thread that
    // has none makes one and detaching deletes it again, with its frame
    // stack (an `mmap` and a `munmap`): a teardown of 1,000 agents paid that
    // about once per session. Attached once here and detached at once, the
    // thread keeps its state, and every attach in `serve` only takes the GIL.
    let mut queue = Some(queue);
    let _ = Python::try_attach(|py| {
        py.detach(|| -> () {
            if let Some(queue) = queue.take() {
                serve(queue, gate, mailboxes);
            }
            // Never back into the attach above: the queue closes only once
            // the kernel's side is gone, which may be during interpreter
            // exit, when attaching again would end this thread inside
            // CPython. The thread is never joined; it waits here until the
            // process ends.
            loop {
                std::thread::park();
            }
        })
    });
    // Still here only if the interpreter could not be attached at all (the
    // closure above never returns): serve as before, attaching per batch.
    if let Some(queue) = queue.take() {
        serve(queue, gate, mailboxes);
    }
}

/// The probe for loops closed under pending work, as a job, if any mailbox
/// has a work alive: each such mailbox asks its loop whether it is closed,
/// and a closed one ends its works.
fn probe(mailboxes: &Mailboxes) -> Option<Job> {
    let watching: Vec<Arc<Mailbox>> = mailboxes
        .lock()
        .ok()?
        .iter()
        .filter(|m| m.watches_any())
        .cloned()
        .collect();
    if watching.is_empty() {
        return None;
    }
    Some(Box::new(move |py| {
        for mailbox in watching {
            if mailbox.loop_closed(py) {
                for work in mailbox.watched() {
                    work.end_if_loop_closed(py);
                }
            }
        }
    }))
}

/// Runs each job with the GIL held, a batch per attach, until the queue
/// closes or the interpreter exits; probes for loops closed under pending
/// work when it has been idle for a while.
fn serve(queue: mpsc::Receiver<Job>, gate: &Gate, mailboxes: &Mailboxes) {
    let mut probed_at = std::time::Instant::now();
    loop {
        let wait = PROBE_EVERY.saturating_sub(probed_at.elapsed());
        // About once a second, busy or not: a look for loops closed under
        // pending work, only where there is any (no GIL otherwise).
        let probed = wait.is_zero().then(|| {
            probed_at = std::time::Instant::now();
            probe(mailboxes)
        });
        let first = match probed {
            Some(Some(job)) => job,
            Some(None) => continue,
            None => match queue.recv_timeout(wait) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
            },
        };
        let mut first = Some(first);
        let _attached = gate.attached.lock();
        if gate.closed.load(Ordering::Acquire) {
            std::mem::forget(first);
            continue;
        }
        let attached = Python::try_attach(|py| {
            if let Some(job) = first.take() {
                job(py);
            }
            for job in queue.try_iter().take(BATCH) {
                job(py);
            }
        });
        if attached.is_none() {
            // The interpreter is exiting: nothing can be delivered, and a
            // Python object must not be touched (or dropped) any more.
            std::mem::forget(first);
            for job in queue.try_iter() {
                std::mem::forget(job);
            }
        }
    }
}
