//! `settle.Kernel`: a running kernel over a store, and the process-wide
//! list of kernels that interpreter exit shuts down.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use settle_core::{SessionId, State};
use settle_runtime::{
    Config, Kernel, ShutdownReport, WeakKernel, DEFAULT_MAX_HISTORY_BYTES, DEFAULT_MAX_PROMPT_BYTES,
};
use settle_store::{MemoryStore, SessionStore, Store};
use tokio_util::sync::CancellationToken;

use crate::args::{StorePath, Text, Whole};
use crate::awaitable::{awaitable, finishing, ready, OnCancel};
use crate::budget::PyBudget;
use crate::errors;
use crate::other_sqlite;
use crate::process::{here, ForkSafe, Owner};
use crate::resume::Resumption;
use crate::secrets::Secrets;
use crate::session::PySession;
use crate::ties::Ties;

/// A turn's idle timeout unless the kernel or the turn sets one: the
/// runtime's, in seconds (`settle.DEFAULT_IDLE_TIMEOUT`).
pub(crate) const DEFAULT_IDLE_SECONDS: f64 = settle_stream::DEFAULT_IDLE_TIMEOUT.as_secs_f64();

/// The kernels opened in this process, for the shutdown at interpreter exit.
static OPEN: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// How long the shutdown at interpreter exit waits for a kernel past its
/// own bound (drain + settle timeout + flush budget), within which the
/// kernel gives its report whatever the store does (G9): only a kernel
/// that does not keep its bound is cut there.
const EXIT_MARGIN: Duration = Duration::from_secs(1);

/// A kernel opened in this process, as interpreter exit shuts it down.
struct Opened {
    /// The process that opened it (a forked child does not shut it down).
    pid: u32,
    kernel: WeakKernel,
    /// Its drain timeout.
    drain: Duration,
    /// The longest its shutdown takes with that drain, whatever the store
    /// does ([`Config::shutdown_bound`]).
    bound: Duration,
    /// Its SQLite file, for the `settle recover` it may leave to run.
    file: Option<PathBuf>,
    /// Set once the program's own `shutdown()` handed it the report: what
    /// it left is then the program's to say, not said again at exit.
    reported: Arc<AtomicBool>,
}

fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        errors::BadInput::new_err(format!(
            "{what} must be a number of seconds ≥ 0, not {value}"
        ))
    })
}

/// A running kernel: what a Python program holds. It registers sessions,
/// and it shuts them all down (G9) on `shutdown()`, at the end of an
/// `async with` block, on SIGINT/SIGTERM once `install_signal_handlers()`
/// was called, and at interpreter exit (bounded by drain + settle timeout +
/// flush budget).
#[pyclass(name = "Kernel", module = "settle", frozen)]
pub(crate) struct PyKernel {
    kernel: ForkSafe<Kernel>,
    drain: Duration,
    /// What its sessions keep of it.
    ties: Ties,
    /// The first signal the handlers received (0: none).
    signal: Arc<AtomicU32>,
    /// Its entry's `reported` in the kernels shut down at exit.
    reported: Arc<AtomicBool>,
}

/// A shutdown's report on its way to Python, and the flag it sets once it
/// is there.
struct Report(ShutdownReport, Arc<AtomicBool>);

impl<'py> IntoPyObject<'py> for Report {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let dict = PyDict::new(py);
        let Report(report, reported) = self;
        reported.store(true, Ordering::SeqCst);
        let ids = |ids: &[SessionId]| ids.iter().map(|id| id.get()).collect::<Vec<u64>>();
        let finalized = PyDict::new(py);
        for (id, reason) in &report.finalized {
            finalized.set_item(id.get(), reason.as_str())?;
        }
        dict.set_item("finalized", finalized)?;
        dict.set_item("drained", ids(&report.drained))?;
        dict.set_item("cancelled", ids(&report.cancelled))?;
        dict.set_item("detached", ids(&report.detached))?;
        dict.set_item("left_recoverable", ids(&report.left_recoverable))?;
        dict.set_item("store_failures", report.store_failures)?;
        dict.set_item("lease_lost", report.lease_lost)?;
        dict.set_item("lease_lost_why", report.lease_lost_why.as_deref())?;
        Ok(dict)
    }
}

/// A recovery's report on its way to Python.
struct Recovered(settle_store::RecoveryReport);

impl<'py> IntoPyObject<'py> for Recovered {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let Recovered(report) = self;
        let ids = |ids: &[SessionId]| ids.iter().map(|id| id.get()).collect::<Vec<u64>>();
        let dict = PyDict::new(py);
        dict.set_item("recovered", ids(&report.recovered))?;
        let turns: Vec<(u64, u32)> = report
            .interrupted_turns
            .iter()
            .map(|(id, turn)| (id.get(), *turn))
            .collect();
        dict.set_item("interrupted_turns", turns)?;
        dict.set_item("finalized_elsewhere", ids(&report.finalized_elsewhere))?;
        Ok(dict)
    }
}

/// A list of rows on its way to Python.
struct Rows(Vec<settle_store::SessionRow>);

impl<'py> IntoPyObject<'py> for Rows {
    type Target = pyo3::types::PyList;
    type Output = Bound<'py, pyo3::types::PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        crate::reads::sessions(py, &self.0)
    }
}

impl PyKernel {
    /// An awaitable of `work` on a clone of the kernel, on its runtime,
    /// dropped at once when its awaiter is cancelled: the call of every
    /// method that only asks the kernel something (a read, a wait).
    fn ask<'py, F, Fut, T>(&self, py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: FnOnce(Kernel) -> Fut,
        Fut: std::future::Future<Output = PyResult<T>> + Send + 'static,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let (kernel, here) = self.kernel.get()?;
        let work = work(kernel.clone());
        awaitable(py, here, CancellationToken::new(), OnCancel::Abort, work)
    }
}

#[pymethods]
impl PyKernel {
    /// Opens the store at `db` (an SQLite file's path, a `str` or an
    /// `os.PathLike` such as `pathlib.Path`, the file created if missing; or
    /// a `postgres://` URL; `None` for a store in memory) and starts a
    /// kernel on it. Times are in seconds: `settle_timeout` (G5),
    /// `drain_timeout` (G9), `idle_timeout` (a stream silent this long ends
    /// its turn `idle_timeout`; `None` for none; a turn may set its own).
    ///
    /// The kernel's two reclaimers of idle sessions are **off by default**
    /// here: a Python program holds its sessions and ends them itself
    /// (`finish()`, `close()`, the shutdown), and a reclaimer finalizes a
    /// session whether or not a `Session` of it is still held. Turned on:
    /// `idle_ttl` (seconds: a session idle this long is finalized
    /// `idle_reap`) and `lru_cap` (a number: registering a session past
    /// this many open ones first finalizes the least recently active idle
    /// ones, `lru_evict`; registering raises `Error` when none can be).
    /// "Idle" is between turns: no turn running, no spawned task, no live
    /// child, no `hold()`; a session mid-turn is never reclaimed (G3), but
    /// one whose program is between two of its turns (running a tool in
    /// its own code, waiting for a person) is, and its next call raises
    /// `SessionClosed`: `hold()` it for that time. (The SPEC's defaults for
    /// a gateway, `settle serve`, are 30 minutes and 1,000.)
    ///
    /// `store_timeout` (seconds) bounds each call that waits for the store
    /// to write (a registration, a turn's start): past it the call raises
    /// `StoreError` with what the store last said (a locked file, a full
    /// disk), and the write is still made once the store heals (a
    /// registration refused so is withdrawn). `0` refuses whatever the
    /// store does not take at once.
    ///
    /// `max_turn_chunks` and `max_turn_bytes` bound what one turn may
    /// stream (its chunks, the bytes of their payloads): the chunk past
    /// either is neither stored nor read, and the turn ends `failed`
    /// (`too_large`). `None` (the default) for no bound: a source that
    /// never stops then grows the process's memory and the database
    /// without bound, so bound the turns of sources you do not trust
    /// (`settle serve` and `settle chat` use 100,000 chunks and 64 MiB).
    ///
    /// `max_prompt_bytes` (1 MiB by default) and `max_history_bytes` (16
    /// MiB) bound what a turn sends: each message of its `input`, and the
    /// whole of it; a turn over either raises `BadInput` at `turn()`,
    /// nothing sent or written. `None` for no limit. A conversation whose
    /// replies are unbounded outgrows the second: raise it, or bound the
    /// replies (`max_turn_bytes`).
    ///
    /// `recover=True` first finalizes the sessions crashed processes left
    /// live (`recover()`, as `settle recover` does): for a program that
    /// restarts after a crash on the same database and continues its
    /// conversations (`resume`).
    ///
    /// Do not open the same SQLite file with Python's `sqlite3` module in
    /// this process: the package carries its own SQLite, and two copies in
    /// one process do not see each other's locks (a write of one can land
    /// in the other's transaction). A file another copy has open here is
    /// refused (`BadInput`; Linux); read it through `sessions()` and
    /// `transcript()`, or from another process.
    ///
    /// `secrets` (strings; one string is one secret) are masked as `***`
    /// in every turn's error, as the turn tells it (`turn.error`) and the
    /// store keeps it: what the source raised (a 401 from a server that
    /// echoes the client's API key) or a chunk's `error` said. So are, by
    /// default, the values of the variables the common clients read their
    /// keys from (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
    /// `AZURE_OPENAI_API_KEY`, `GROQ_API_KEY`, `MISTRAL_API_KEY`,
    /// `TOGETHER_API_KEY`, `DEEPSEEK_API_KEY`, `OPENROUTER_API_KEY`,
    /// `SETTLE_API_KEY`), read now, when at least 8 characters long. The
    /// longest is masked first, in any case of its letters, and so is each
    /// piece of one 12 characters or more long (a key a server echoes cut
    /// short, or with its end starred). A key it is not told of, or one a
    /// server escaped, is not; nor is anything in a task's
    /// exception, which is raised to whoever awaits the task as the very
    /// object the coroutine raised, and never stored.
    ///
    /// `lease_ttl` (seconds, 30 by default) is how long this process's
    /// lease on its sessions lasts unrenewed (it is renewed every tenth of
    /// it, so an outage of 26 s of 30 is always ridden out). A store that
    /// answers nothing for that long (another process holding its lock, a
    /// full disk, a server down) stops the kernel
    /// (`shutting_down` becomes true, calls raise `ShuttingDown`), its live
    /// sessions left for `settle recover` or a fleet's peer, since they
    /// may be taken over meanwhile; a program opens a new kernel once the
    /// store is back. A longer lease rides out longer outages, and makes a
    /// crashed process's sessions wait as long for recovery.
    ///
    /// Raises `BadInput` for a database that cannot be opened (or a secret
    /// that is not UTF-8, or a `lease_ttl` of no time), `TypeError` for a
    /// secret that is not a string, `StoreError` when the store fails.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (db = Some(StorePath("settle.db".to_owned())), *, settle_timeout = 1.0, drain_timeout = 5.0, idle_timeout = Some(DEFAULT_IDLE_SECONDS), idle_ttl = None, lru_cap = None, store_timeout = 10.0, max_turn_chunks = None, max_turn_bytes = None, max_prompt_bytes = Some(Whole(DEFAULT_MAX_PROMPT_BYTES)), max_history_bytes = Some(Whole(DEFAULT_MAX_HISTORY_BYTES)), secrets = None, lease_ttl = 30.0, recover = false))]
    fn open<'py>(
        py: Python<'py>,
        db: Option<StorePath>,
        settle_timeout: f64,
        drain_timeout: f64,
        idle_timeout: Option<f64>,
        idle_ttl: Option<f64>,
        lru_cap: Option<Whole<usize>>,
        store_timeout: f64,
        max_turn_chunks: Option<Whole<usize>>,
        max_turn_bytes: Option<Whole<usize>>,
        max_prompt_bytes: Option<Whole<usize>>,
        max_history_bytes: Option<Whole<usize>>,
        secrets: Option<Bound<'py, PyAny>>,
        lease_ttl: f64,
        recover: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let secrets = Arc::new(Secrets::new(Secrets::given(secrets.as_ref())?));
        // A lease of no time would be lost at once.
        let lease_ttl = seconds(lease_ttl, "lease_ttl")
            .ok()
            .filter(|ttl| !ttl.is_zero())
            .ok_or_else(|| {
                errors::BadInput::new_err(format!(
                    "lease_ttl must be a number of seconds > 0, not {lease_ttl}"
                ))
            })?;
        let (db, lru_cap) = (db.map(|d| d.0), lru_cap.map(|c| c.0));
        let max_turn_chunks = at_least_one(max_turn_chunks, "max_turn_chunks")?;
        let max_turn_bytes = at_least_one(max_turn_bytes, "max_turn_bytes")?;
        let max_prompt_bytes = some_room(max_prompt_bytes, "max_prompt_bytes")?;
        let max_history_bytes = some_room(max_history_bytes, "max_history_bytes")?;
        let settle = seconds(settle_timeout, "settle_timeout")?;
        let store_timeout = seconds(store_timeout, "store_timeout")?;
        let drain = seconds(drain_timeout, "drain_timeout")?;
        let idle = idle_timeout
            .map(|t| seconds(t, "idle_timeout"))
            .transpose()?;
        let idle_ttl = idle_ttl.map(|t| seconds(t, "idle_ttl")).transpose()?;
        let owner = Owner::now()?;
        let here = here()?;
        awaitable(
            py,
            &here,
            CancellationToken::new(),
            OnCancel::Finish,
            async move {
                let (store, file): (Arc<dyn SessionStore>, _) = match db {
                    None => (Arc::new(MemoryStore::new()), None),
                    Some(db) => {
                        let file = Store::sqlite_file(&db);
                        if let Some(refusal) = file.as_deref().and_then(other_sqlite::refusal) {
                            return Err(errors::BadInput::new_err(refusal));
                        }
                        if let Some(file) = &file {
                            other_sqlite::begin(file);
                        }
                        let store = Store::open_async(db)
                            .await
                            .map_err(|e| errors::BadInput::new_err(e.to_string()))?;
                        if let Some(file) = &file {
                            other_sqlite::opened(file);
                        }
                        (Arc::new(store), file)
                    }
                };
                let config = Config::default()
                    .settle_timeout(settle)
                    .drain_timeout(drain)
                    .idle_timeout(idle)
                    .idle_ttl(idle_ttl)
                    .lru_cap(lru_cap)
                    .store_timeout(store_timeout)
                    .lease_ttl(lease_ttl)
                    .max_turn_chunks(max_turn_chunks)
                    .max_turn_bytes(max_turn_bytes)
                    .max_prompt_bytes(max_prompt_bytes)
                    .max_history_bytes(max_history_bytes)
                    .recover_on_start(recover);
                let bound = config.shutdown_bound(drain);
                let reported = Arc::new(AtomicBool::new(false));
                let kernel = Kernel::builder(store)
                    .with_config(config)
                    .start()
                    .await
                    .map_err(errors::runtime)?;
                if let Ok(mut open) = OPEN.lock() {
                    // A kernel let go is kept until it has stopped: exit
                    // waits for its shutdown too.
                    open.retain(|opened| {
                        opened.kernel.upgrade().is_some() || !opened.kernel.is_stopped()
                    });
                    open.push(Opened {
                        pid: std::process::id(),
                        kernel: kernel.downgrade(),
                        drain,
                        bound,
                        // Named whole: the process may have changed its
                        // directory by the time it exits.
                        file: file.map(|f| std::path::absolute(&f).unwrap_or(f)),
                        reported: reported.clone(),
                    });
                }
                Ok(PyKernel {
                    kernel: ForkSafe::new(kernel, owner.clone()),
                    drain,
                    ties: Ties {
                        owner,
                        idle,
                        secrets,
                        settle,
                    },
                    signal: Arc::new(AtomicU32::new(0)),
                    reported,
                })
            },
        )
    }

    /// Registers a root session (or a child of `parent`, a `Session` or an
    /// id), with a `settle.Budget` for it and its subtree if given. Raises
    /// `ShuttingDown` during a shutdown, `SessionClosed` when the parent is
    /// finalized, `BadInput` when it is unknown.
    ///
    /// `scope` names whose it is for `lru_cap` (a tenant, a user): at the
    /// cap a new session evicts only idle sessions of its own scope, and
    /// raises `Error` rather than end another scope's. Without one it is
    /// in its parent's scope (`Session.child` too), a root in the shared
    /// one. Cancelling the task that awaits it before it answers cancels
    /// the session it makes, which nobody would hold.
    #[pyo3(signature = (name, parent = None, *, budget = None, scope = None))]
    fn register<'py>(
        &self,
        py: Python<'py>,
        name: Text,
        parent: Option<Bound<'py, PyAny>>,
        budget: Option<PyRef<'py, PyBudget>>,
        scope: Option<Text>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Text(name) = name;
        let budget = budget.map(|b| b.get());
        if let Err(error) = crate::task::check_write(py) {
            let (_, here) = self.kernel.get()?;
            return crate::awaitable::raising(py, here, error);
        }
        let parent = parent.as_ref().map(session_id).transpose()?;
        let (kernel, here) = self.kernel.get()?;
        let scope = scope.map(|Text(s)| kernel.scope_of(Some(&s)));
        let (kernel, ties) = (kernel.clone(), self.ties.clone());
        finishing(py, here, async move {
            let session = match (budget, scope) {
                (None, None) => kernel.register(name, parent).await,
                (Some(budget), None) => kernel.register_with_budget(name, parent, budget).await,
                (None, Some(scope)) => kernel.register_in(scope, name, parent).await,
                (Some(budget), Some(scope)) => {
                    kernel
                        .register_in_with_budget(scope, name, parent, budget)
                        .await
                }
            };
            let session = session.map_err(errors::runtime)?;
            Ok(crate::registered::Registered::new(session, ties))
        })
    }

    /// A handle on session `id`: an open one, or a finalized one whose
    /// methods raise `SessionClosed`. Raises `SessionClosed` itself when
    /// this kernel finalized it but the store has not written its end yet
    /// (a finalize in flight, a store that stalls): its end reason is not
    /// known to give a handle. Raises `BadInput` when it is unknown, and
    /// when the store has it live but another process owns it (the
    /// message says so: one a crashed process left is recovered with
    /// `recover()` or `settle recover`, then resumed); `StoreError` when the store cannot
    /// say in time.
    fn session<'py>(&self, py: Python<'py>, id: Whole<u64>) -> PyResult<Bound<'py, PyAny>> {
        let Whole(id) = id;
        let ties = self.ties.clone();
        self.ask(py, |kernel| async move {
            let session = kernel
                .session(SessionId(id))
                .await
                .map_err(errors::runtime)?;
            Ok(PySession::new(session, ties))
        })
    }

    /// Registers a new root session named `name` that continues the
    /// finalized session `id` (a `Session` or an id): finished, closed, or
    /// finalized by recovery after a crash. Its row names the one it
    /// continues (`resumed_from` in `sessions()`). Resolves to a
    /// `settle.Resumed`: the new `session`, the conversation so far
    /// (`history`, message dicts) and the tool calls of its last reply that
    /// no tool has answered yet (`pending_tool_calls`), to run and send
    /// back with `history` as the next turn's `input=`.
    ///
    /// Raises `BadInput` when `id` is unknown or not finalized (it may
    /// still be live, here or in another process; one left by a crash is
    /// recovered first, with `recover()` or `settle recover`), `ShuttingDown` during a
    /// shutdown, `StoreError` when the store fails.
    fn resume<'py>(
        &self,
        py: Python<'py>,
        id: Bound<'py, PyAny>,
        name: Text,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Text(name) = name;
        if let Err(error) = crate::task::check_write(py) {
            let (_, here) = self.kernel.get()?;
            return crate::awaitable::raising(py, here, error);
        }
        let from = session_id(&id)?;
        let (kernel, here) = self.kernel.get()?;
        let (kernel, ties) = (kernel.clone(), self.ties.clone());
        finishing(py, here, async move {
            let resumed = kernel.resume(from, name).await.map_err(errors::runtime)?;
            Ok(Resumption::new(resumed, ties))
        })
    }

    /// Resolves to the sessions of the store (those in `state`, if given),
    /// oldest first, as dicts with the fields of `settle sessions --json`
    /// (`id`, `name`, `parent`, `state`, `outcome`, `end_reason`, `turns`,
    /// `chunks`, `created_at`, `finalized_at`, `resumed_from`, `owner`: where
    /// clients reach the live process that owns it, the address it
    /// advertised, or `None`, as once it is finalized). Raises
    /// `BadInput` for a state that is not one (a string that is not
    /// UTF-8 among them). Read from the store, where a session's state
    /// between turns is written in batches: a session may read `running`
    /// for up to 100 ms (a second while the store is busy) after its turn
    /// ended; `session.state()` asks the kernel and is never behind.
    #[pyo3(signature = (state = None))]
    fn sessions<'py>(&self, py: Python<'py>, state: Option<Text>) -> PyResult<Bound<'py, PyAny>> {
        let state = state
            .map(|Text(s)| s.parse::<State>())
            .transpose()
            .map_err(|e| errors::BadInput::new_err(e.to_string()))?;
        self.ask(py, |kernel| async move {
            let rows = kernel.list_sessions(state).await.map_err(errors::runtime)?;
            Ok(Rows(rows))
        })
    }

    /// Finalizes the sessions crashed processes left live (G8), as `settle
    /// recover` does, and resolves to what it did: `recovered` (ids,
    /// children before parents, each finalized `recovered` with its
    /// transcript kept), `interrupted_turns` (`[id, turn]` pairs, the turns
    /// that were open) and `finalized_elsewhere` (ids another process
    /// finalized or took meanwhile). A session is taken once its owner is
    /// gone: its lease ran out, or it ran on this machine and its process
    /// no longer exists; never a live process's, this kernel's among them.
    /// Idempotent, and safe beside another recoverer; a recovered session
    /// can then be resumed (`resume`). `Kernel.open(..., recover=True)`
    /// runs it once at the start. Raises `StoreError` when the store fails.
    fn recover<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.ask(py, |kernel| async move {
            let report = kernel.recover().await.map_err(errors::runtime)?;
            Ok(Recovered(report))
        })
    }

    /// Shuts down (G9): no new session or turn, transcripts flushed, idle
    /// sessions finalized `shutdown`, running turns drained for `drain`
    /// seconds (default: the kernel's drain timeout), then cancelled,
    /// settled and finalized. Resolves to a report (`finalized`: id to end
    /// reason, each committed by the store; `drained`, `cancelled`,
    /// `detached`, `left_recoverable`: ids, the last those whose finalize
    /// the store did not commit, for `settle recover`; `store_failures`;
    /// `lease_lost`: the kernel had stopped on losing its lease, G8;
    /// `lease_lost_why`: why, with what the store said last, or `None`) once
    /// every session is finalized, or once the bound ran out on a stalled
    /// store.
    #[pyo3(signature = (drain = None))]
    fn shutdown<'py>(&self, py: Python<'py>, drain: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let drain = match drain {
            Some(d) => seconds(d, "drain")?,
            None => self.drain,
        };
        let (kernel, here) = self.kernel.get()?;
        let kernel = kernel.clone();
        let reported = self.reported.clone();
        finishing(py, here, async move {
            Ok(Report(kernel.shutdown(drain).await, reported))
        })
    }

    /// Starts the graceful shutdown without waiting for it.
    #[pyo3(signature = (drain = None))]
    fn begin_shutdown(&self, drain: Option<f64>) -> PyResult<()> {
        let drain = match drain {
            Some(d) => seconds(d, "drain")?,
            None => self.drain,
        };
        self.kernel.get()?.0.begin_shutdown(drain);
        Ok(())
    }

    /// Ends a shutdown's drain now (what a second signal does).
    fn skip_drain(&self) -> PyResult<()> {
        self.kernel.get()?.0.skip_drain();
        Ok(())
    }

    /// Whether a shutdown has begun.
    #[getter]
    fn shutting_down(&self) -> PyResult<bool> {
        Ok(self.kernel.get()?.0.is_shutting_down())
    }

    /// Resolves once the kernel has stopped: its shutdown is complete.
    fn stopped<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.ask(py, |kernel| async move {
            kernel.stopped().await;
            Ok(crate::awaitable::Nothing)
        })
    }

    /// Installs handlers of SIGINT, SIGTERM and SIGHUP on the running loop
    /// (`loop.add_signal_handler`, so call it from the main thread; from
    /// another, `settle.Error`): the first signal starts the graceful
    /// shutdown (G9), every later one skips the rest of the drain.
    /// `received_signal` then says which came first. Several kernels may
    /// install them on one loop: a signal reaches each.
    fn install_signal_handlers(&self, py: Python<'_>) -> PyResult<()> {
        let (kernel, here) = self.kernel.get()?;
        crate::signals::install(py, kernel, here, self.drain, self.signal.clone())
    }

    /// The first signal the handlers received, as its number; `None` if none.
    #[getter]
    fn received_signal(&self) -> Option<u32> {
        match self.signal.load(Ordering::Acquire) {
            0 => None,
            n => Some(n),
        }
    }

    /// How many store writes failed so far.
    #[getter]
    fn store_failures(&self) -> PyResult<usize> {
        Ok(self.kernel.get()?.0.store_failures())
    }

    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        ready(py, slf.into_any())
    }

    /// Shuts down as `shutdown()` does, with the kernel's drain timeout,
    /// and resolves to `False`: an exception raised in the `async with`
    /// block goes on up (the report is `shutdown()`'s to give). Left by
    /// the close of its coroutine (`close()`: the collector, or the
    /// interpreter's exit, closing a coroutine its closed loop left
    /// pending), it begins the shutdown and waits for nothing.
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        kind: Bound<'py, PyAny>,
        _value: Bound<'py, PyAny>,
        traceback: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (kernel, here) = self.kernel.get()?;
        if crate::awaitable::closing_coroutine(py, &kind, &traceback) {
            // The block's coroutine is being closed: nothing can be
            // awaited, so the shutdown begins and is not waited for.
            kernel.begin_shutdown(self.drain);
            return crate::awaitable::done_at_once(py);
        }
        let (kernel, drain) = (kernel.clone(), self.drain);
        finishing(py, here, async move {
            kernel.shutdown(drain).await;
            Ok(false)
        })
    }
}

/// Shuts down every kernel this process opened and still holds, and waits
/// for those it let go (a kernel whose every handle is dropped shuts itself
/// down, with no drain), all at once, with the GIL released, then stops
/// handing results to Python: what
/// `atexit` runs, at interpreter exit only. Each kernel is waited for
/// within its own bound (its drain + settle timeout + flush budget, G9, and
/// a margin of a second), or within `timeout` seconds if that is given.
/// One that left sessions unfinalized (the store did not commit them in
/// time, or the kernel had lost its lease) says so in one line on
/// `sys.stderr`: how many, and the `settle recover` that finishes them.
#[pyfunction]
#[pyo3(signature = (timeout = None))]
pub(crate) fn shutdown_all(py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
    let cap = timeout.map(|t| seconds(t, "timeout")).transpose()?;
    let pid = std::process::id();
    let kernels: Vec<(Option<Kernel>, Opened)> = match OPEN.lock() {
        Ok(mut open) => open
            .drain(..)
            .filter(|opened| opened.pid == pid)
            .map(|opened| (opened.kernel.upgrade(), opened))
            .collect(),
        Err(_) => Vec::new(),
    };
    let here = here()?;
    let said = py.detach(|| {
        let said = here.runtime.block_on(async move {
            let shutdowns: Vec<_> = kernels
                .into_iter()
                .map(|(kernel, opened)| {
                    let limit = cap.unwrap_or_else(|| opened.bound.saturating_add(EXIT_MARGIN));
                    tokio::spawn(async move {
                        let report = match kernel {
                            Some(kernel) => {
                                tokio::time::timeout(limit, kernel.shutdown(opened.drain))
                                    .await
                                    .ok()
                            }
                            // Let go by the program: it shuts itself down
                            // (with no drain); its end is waited for too.
                            None => {
                                match tokio::time::timeout(limit, opened.kernel.stopped()).await {
                                    Ok(()) => match opened.kernel.last_report() {
                                        Some(report) => Some(report),
                                        None => return None,
                                    },
                                    Err(_) => None,
                                }
                            }
                        };
                        // The program's own shutdown handed it the report.
                        if opened.reported.load(Ordering::SeqCst) {
                            return None;
                        }
                        left_at_exit(report.as_ref(), limit, opened.file.as_deref())
                    })
                })
                .collect();
            let mut said = Vec::new();
            for shutdown in shutdowns {
                if let Ok(Some(line)) = shutdown.await {
                    said.push(line);
                }
            }
            said
        });
        // Nothing reaches Python from here on: the interpreter is exiting.
        here.deliver.close();
        said
    });
    for line in said {
        say(py, &line);
    }
    Ok(())
}

/// The line a kernel's shutdown at exit says when it left sessions for
/// recovery, as the command line's (`report` is `None` when it did not end
/// within `limit`); `None` when it left none.
fn left_at_exit(
    report: Option<&ShutdownReport>,
    limit: Duration,
    file: Option<&std::path::Path>,
) -> Option<String> {
    let recover = match file {
        Some(file) => format!(
            "settle --db {} recover",
            shell_word(&file.to_string_lossy())
        ),
        None => "settle recover".to_owned(),
    };
    let Some(report) = report else {
        return Some(format!(
            "settle: the shutdown at exit did not end within {:.1} s; its sessions may be left \
             unfinalized: run `{recover}` once the store is healthy",
            limit.as_secs_f64()
        ));
    };
    let left = report.left_recoverable.len();
    let sessions = if left == 1 { "session" } else { "sessions" };
    // Counted when the kernel gave up waiting: a write the store had
    // queued may still land, so the count is an upper bound.
    if report.lease_lost {
        let why = report
            .lease_lost_why
            .as_deref()
            .map(|why| format!(" ({})", settle_stream::quote(why)))
            .unwrap_or_default();
        Some(format!(
            "settle: this process lost its lease on its sessions{why}, so its kernel stopped; up \
             to {left} {sessions} left for recovery (another process may have taken them \
             already): run `{recover}`"
        ))
    } else if left > 0 {
        Some(format!(
            "settle: up to {left} {sessions} left unfinalized at exit (the store did not commit \
             them in time; some may have landed since); run `{recover}` once the store is healthy"
        ))
    } else {
        None
    }
}

/// `word` as one word of a shell command: as is when it is plain, else
/// single-quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Writes `line` to `sys.stderr` (where the program's own errors go), or
/// to the process's stderr when Python's is gone.
fn say(py: Python<'_>, line: &str) {
    let written = py.import("sys").and_then(|sys| {
        let stderr = sys.getattr("stderr")?;
        stderr.call_method1("write", (format!("{line}\n"),))?;
        stderr.call_method0("flush")
    });
    if written.is_err() {
        // Not `eprintln!`: it panics when standard error cannot be written.
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// The session `obj` names: a `Session`, or its id.
fn session_id(obj: &Bound<'_, PyAny>) -> PyResult<SessionId> {
    match obj.cast::<PySession>() {
        Ok(session) => Ok(SessionId(session.get().id_value())),
        Err(_) => Ok(SessionId(obj.extract::<Whole<u64>>()?.0)),
    }
}

/// A turn's bound given as a whole number: at least 1 (a bound of 0 ends
/// every turn at its first chunk), or `None` for none.
/// A limit of a turn's request in bytes: `None` for none; `0`, which
/// would refuse every request, is refused.
fn some_room(limit: Option<Whole<usize>>, name: &str) -> PyResult<Option<usize>> {
    match limit.map(|b| b.0) {
        Some(0) => Err(errors::BadInput::new_err(format!(
            "{name}=0 refuses every turn's request: give a number of bytes, or None for no limit"
        ))),
        limit => Ok(limit),
    }
}

fn at_least_one(bound: Option<Whole<usize>>, name: &str) -> PyResult<Option<usize>> {
    match bound.map(|b| b.0) {
        Some(0) => Err(errors::BadInput::new_err(format!(
            "{name}=0 ends every turn at its first chunk: give at least 1, or None for no bound"
        ))),
        bound => Ok(bound),
    }
}
