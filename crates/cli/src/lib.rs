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

/// `println!` that ignores a closed pipe (see [`say`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::say("\n") };
    ($($arg:tt)*) => { $crate::say(&format!("{}\n", format_args!($($arg)*))) };
}

pub mod chat;
pub mod display;
pub mod duration;
pub mod output;
pub mod runner;
pub mod scenario;
pub mod shutdown;

use std::io::Write;

use settle_store::{OpenError, Store, StoreError};

/// Writes to stdout, ignoring a closed pipe (`settle sessions | head`): a
/// reader that has seen enough is not an error.
pub fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
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

/// Opens (creating a SQLite file if need be) the store, sorting its errors
/// into bad input (2) and store failures (3).
pub fn open_store(db: &str) -> Result<Store, Failure> {
    Store::open(db).map_err(|error| match error {
        OpenError::Unreachable { .. }
        | OpenError::MissingDatabase { .. }
        | OpenError::Rejected { .. }
        | OpenError::Migration { .. }
        | OpenError::Database { .. } => Failure::store(error),
        _ => Failure::bad_input(error),
    })
}
