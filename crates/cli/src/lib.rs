//! `settle-cli`: the `settle` command line as a library, so its pieces (the
//! scenario files of `settle run`, the JSON shapes, the runner) can be tested
//! and reused; `main.rs` is the thin binary over it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), settle_cli::Failure> {
//! use std::sync::Arc;
//! use settle_cli::{open_store, runner, scenario::Scenario};
//!
//! let scenario = Arc::new(Scenario::load("examples/scan.toml").map_err(settle_cli::Failure::bad_input)?);
//! let store = Arc::new(open_store("settle.db")?);
//! let kernel = settle_runtime::Kernel::builder(store).start().await.map_err(settle_cli::Failure::store)?;
//! let root = runner::run(scenario, kernel.clone()).await;
//! kernel.shutdown(std::time::Duration::ZERO).await;
//! # Ok(()) }
//! ```

/// `print!` that ignores a closed pipe (see [`say`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::say(&format!($($arg)*)) };
}

/// `eprintln!` that never panics: a standard error that cannot be written
/// (a full disk under the log file, a closed pipe) loses the line, not the
/// process (see [`complain`]).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::complain(&format!("{}\n", format_args!($($arg)*))) };
}

/// `println!` that ignores a closed pipe (see [`say`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::say("\n") };
    ($($arg:tt)*) => { $crate::say(&format!("{}\n", format_args!($($arg)*))) };
}

pub mod chat;
pub mod display;
pub mod duration;
pub mod escape;
pub mod export;
pub mod input_limits;
pub mod listing;
pub mod live;
pub mod log_sink;
pub mod model_server;
pub mod open_files;
pub mod outfile;
pub mod output;
pub mod prompt_line;
pub mod reply_limits;
pub mod runner;
pub mod scenario;
pub mod shutdown;
pub mod table;
pub mod terminal;
pub mod trace;
pub mod transcript;
pub mod turn_timeouts;

#[cfg(test)]
mod test_support;

use std::io::Write;

use std::time::Duration;

use settle_store::{OpenError, SessionId, Store, StoreError, StoreOptions};

/// How long closing the store waits for its threads when a command ends.
///
/// Every write a command needs was awaited before it ends (a kernel's
/// shutdown commits within its budget, or names what it left for recovery),
/// so closing only waits for a healthy store's threads to stop, which takes
/// milliseconds; a thread blocked on a store that stopped answering is left
/// behind, and the exit keeps the shutdown's bound (G9).
pub const CLOSE_TIMEOUT: Duration = Duration::from_millis(250);

fn options() -> StoreOptions {
    StoreOptions::default().with_close_timeout(CLOSE_TIMEOUT)
}

/// Writes to stdout, ignoring a closed pipe (`settle sessions | head`): a
/// reader that has seen enough is not an error. Any other failure (a full
/// disk under `> file`) is kept, nothing more is written, and
/// [`stdout_failure`] says it at the end, so that output lost is never
/// lost silently.
pub fn say(text: &str) {
    if STDOUT_FAILED.get().is_some() {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = STDOUT_FAILED.set(e.to_string());
        }
    }
}

/// Why stdout could not be written, once it could not (see [`say`]).
static STDOUT_FAILED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The failure to write stdout, if a write failed for any reason but a
/// reader that closed its pipe: the command's output is lost. A bad-input
/// failure, as `-o` a path that cannot be written is: a command that only
/// reads ends with it, one that wrote says it and keeps its own code.
pub fn stdout_failure() -> Option<Failure> {
    STDOUT_FAILED
        .get()
        .map(|why| Failure::bad_input(format!("cannot write the output to standard output: {why}")))
}

/// Writes `text` to standard error, ignoring a failure: `eprintln!` panics
/// when standard error cannot be written, and a process whose log sits on
/// the disk its store just filled must still say what it can and exit with
/// its own code. Once [`log_sink::install_stderr`] put standard error behind
/// a queue (a gateway), the line is queued there, never waited on longer
/// than standard error keeps taking lines.
pub fn complain(text: &str) {
    if let Some(sink) = log_sink::stderr_sink() {
        sink.say(text.as_bytes().to_vec(), log_sink::STALL);
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// Exit codes (the specification, §7).
pub mod exit {
    /// See the specification, §7.
    pub const DONE: u8 = 0;
    /// See the specification, §7.
    pub const ROOT_FAILED: u8 = 1;
    /// See the specification, §7.
    pub const BAD_INPUT: u8 = 2;
    /// See the specification, §7.
    pub const STORE: u8 = 3;
}

/// A failure that ends the process with one line on stderr and an exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The one line printed on stderr.
    pub message: String,
}

impl Failure {
    /// Bad input (exit 2).
    pub fn bad_input(message: impl std::fmt::Display) -> Self {
        Failure {
            code: exit::BAD_INPUT,
            message: message.to_string(),
        }
    }

    /// A store failure (exit 3).
    pub fn store(message: impl std::fmt::Display) -> Self {
        Failure {
            code: exit::STORE,
            message: message.to_string(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::store(error)
    }
}

/// A session id on the command line (`settle show 3`, `settle chat --resume 3`):
/// anything but a whole number the database can hold (up to 2^63 − 1) is
/// bad input, said in one line.
pub fn parse_id(text: &str) -> Result<SessionId, String> {
    let refused =
        || format!("`{text}` is not a session id: ids are whole numbers, see `settle sessions`");
    let id: SessionId = text.parse().map_err(|_| refused())?;
    match i64::try_from(id.get()) {
        Ok(_) => Ok(id),
        Err(_) => Err(refused()),
    }
}

/// Opens an existing store for a command that only reads it, or recovers it
/// (`sessions`, `show`, `export`, `recover`): a SQLite file that is not there,
/// that is empty or holds no settle tables, or a PostgreSQL database that does
/// not exist, is bad input (exit 2) and nothing is created or written.
pub fn open_existing_store(db: &str) -> Result<Store, Failure> {
    refuse_missing(db)?;
    Store::open_with(db, options().with_existing_only(true)).map_err(sort_open_error)
}

/// Opens an existing store for a command that only reads it (`sessions`,
/// `show`, `export`, `recover --dry-run`), as [`open_existing_store`]
/// does; a SQLite file this user may not write (a service's database, a
/// copy on a read-only mount) is then opened to read it only
/// ([`StoreOptions::read_only`](settle_store::StoreOptions::read_only)),
/// and nothing is written.
pub fn open_store_to_read(db: &str) -> Result<Store, Failure> {
    refuse_missing(db)?;
    match Store::open_with(db, options().with_existing_only(true)) {
        Err(OpenError::ReadOnly { .. }) => {
            Store::open_with(db, options().with_read_only(true)).map_err(sort_open_error)
        }
        opened => opened.map_err(sort_open_error),
    }
}

/// Refuses a location that names no database (bad input, repeating no
/// password), then says there is none when nothing is at the SQLite path
/// `db` names (a dangling link counts as nothing: SQLite would create its
/// target).
fn refuse_missing(db: &str) -> Result<(), Failure> {
    Store::check_location(db).map_err(sort_open_error)?;
    let Some(path) = Store::sqlite_file(db) else {
        return Ok(());
    };
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::bad_input(format!(
            "there is no database at {}; `settle run` or `settle chat` creates one, or pass --db with the path of one",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Opens (creating a SQLite file if need be) the store, sorting its errors
/// into bad input (2) and store failures (3).
pub fn open_store(db: &str) -> Result<Store, Failure> {
    Store::open_with(db, options()).map_err(sort_open_error)
}

/// A location that names no usable database (a bad path or URL, a missing
/// PostgreSQL database) is bad input for every command; a server or file
/// that fails is a store error.
fn sort_open_error(error: OpenError) -> Failure {
    match error {
        OpenError::Unreachable { .. }
        | OpenError::Rejected { .. }
        | OpenError::Migration { .. }
        | OpenError::Database { .. } => Failure::store(error),
        _ => Failure::bad_input(error),
    }
}
