//! The one thread that takes the GIL on the kernel's behalf.
//!
//! No runtime thread ever waits for the GIL: a result for Python is queued
//! here, and this thread attaches to the interpreter, runs every queued job
//! (each schedules a callback on its event loop with
//! `call_soon_threadsafe`) and detaches. A burst of results costs one GIL
//! acquisition, and a Python program busy on the GIL slows only this thread,
//! never the kernel's driver or the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use pyo3::Python;

/// What runs on the deliverer with the GIL held.
pub(crate) type Job = Box<dyn for<'py> FnOnce(Python<'py>) + Send>;

/// The sending side of the deliverer.
pub(crate) struct Deliverer {
    jobs: mpsc::Sender<Job>,
    gate: Arc<Gate>,
}

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

impl Deliverer {
    /// Starts the deliverer's thread.
    pub fn start() -> std::io::Result<Deliverer> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let gate = Arc::new(Gate::default());
        let theirs = gate.clone();
        std::thread::Builder::new()
            .name("settle-deliver".into())
            .spawn(move || run(queue, &theirs))?;
        Ok(Deliverer { jobs, gate })
    }

    /// Stops delivering for good, once the job in hand (if any) is done:
    /// what interpreter exit calls, with the GIL released.
    pub fn close(&self) {
        let _attached = self.gate.attached.lock();
        self.gate.closed.store(true, Ordering::Release);
    }

    /// Queues `job` to run with the GIL held.
    pub fn send(&self, job: impl for<'py> FnOnce(Python<'py>) + Send + 'static) {
        let _ = self.jobs.send(Box::new(job));
    }
}

fn run(queue: mpsc::Receiver<Job>, gate: &Gate) {
    while let Ok(first) = queue.recv() {
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
