//! The kernel's log lines, for Python's `logging` (logger `settle`): a
//! store that blipped and the writes tried again, a work detached at the
//! settle deadline, a shutdown's sessions left for recovery. Without this
//! a Python program saw none of them.
//!
//! The lines are made on the kernel's own threads (its runtime's workers,
//! the store's writer), which must never wait for the interpreter: a
//! bridge that takes the GIL to log there (as `pyo3-log` does) would let a
//! busy interpreter, or one blocked on the kernel, stall the kernel. So a
//! line is formatted where it is made and queued (at most [`QUEUED`]; one
//! that does not fit is dropped and counted, never waited for), and a
//! thread of the package's own takes the queue with the GIL released while
//! it waits, and hands each line to `logging` (`settle/__init__.py`). The
//! level is `SETTLE_LOG`'s (the command line's variable, an env-filter),
//! warnings and errors by default. A process whose global `tracing`
//! subscriber is already set (another extension's) keeps it.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::Level;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{EnvFilter, Layer};

/// How many lines wait for the forwarding thread at most.
const QUEUED: usize = 1024;

/// A line: its `logging` level number, the module that made it, its text.
type Line = (u8, String, String);

/// The lines waiting, and how many were dropped since the last taken. A
/// reader waits on the condition variable with the lock released, so a
/// reader that takes what is there without waiting (the exit's last
/// lines) never waits for one that is waiting.
#[derive(Default)]
struct Queue {
    lines: Mutex<(VecDeque<Line>, u64)>,
    came: Condvar,
}

fn queue() -> &'static Queue {
    static QUEUE: OnceLock<Queue> = OnceLock::new();
    QUEUE.get_or_init(Queue::default)
}

/// `logging`'s number for `level`.
fn logging_level(level: &Level) -> u8 {
    if *level == Level::ERROR {
        40
    } else if *level == Level::WARN {
        30
    } else if *level == Level::INFO {
        20
    } else {
        10
    }
}

/// An event's fields in order, a space between, as the command line's log
/// (`tracing_subscriber`'s default format) writes them: a field named
/// `message` (the event's text, and one the event names so) by its value
/// alone, the others as `name=value`, a string quoted.
#[derive(Default)]
struct Text {
    line: String,
    started: bool,
}

impl Text {
    /// The space before each field but the first: a `message` field after
    /// the event's text was glued onto it ("stopping the turncould not
    /// persist a chunk").
    fn next(&mut self) -> &mut String {
        if self.started {
            self.line.push(' ');
        }
        self.started = true;
        &mut self.line
    }
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.next().push_str(value),
            _ => self.record_debug(field, &value),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        let line = self.next();
        let _ = match name {
            "message" => write!(line, "{value:?}"),
            // A raw identifier (`r#type = ...`) is named without its prefix.
            name => write!(
                line,
                "{}={value:?}",
                name.strip_prefix("r#").unwrap_or(name)
            ),
        };
    }
}

/// The layer that queues each line for Python.
struct ToPython;

impl<S: tracing::Subscriber> Layer<S> for ToPython {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut text = Text::default();
        event.record(&mut text);
        let line = (
            logging_level(meta.level()),
            meta.target().to_owned(),
            text.line,
        );
        let queue = queue();
        let mut waiting = queue.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.0.len() < QUEUED {
            waiting.0.push_back(line);
            queue.came.notify_one();
        } else {
            waiting.1 += 1;
        }
    }
}

/// Sends the kernel's log lines to the queue Python reads, unless the
/// process has a global subscriber already. Only `tracing`'s: the `log`
/// crate's logger is left to whoever sets it (another extension's
/// `pyo3-log`, say).
pub(crate) fn install() {
    let filter = EnvFilter::try_from_env("SETTLE_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let subscriber = tracing_subscriber::registry().with(ToPython.with_filter(filter));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The next line, waiting at most `timeout` seconds with the GIL released
/// (`None` when none came), or first how many were dropped since the last
/// call, when some were.
#[pyfunction]
pub(crate) fn _next_log_line(py: Python<'_>, timeout: f64) -> Option<Line> {
    let queue = queue();
    let wait = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
    py.detach(|| {
        let waiting = queue.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut waiting, _) = queue
            .came
            .wait_timeout_while(waiting, wait, |(lines, dropped)| {
                lines.is_empty() && *dropped == 0
            })
            .unwrap_or_else(PoisonError::into_inner);
        let dropped = std::mem::take(&mut waiting.1);
        if dropped > 0 {
            return Some((
                30,
                "settle".to_owned(),
                format!("{dropped} log lines were dropped: the queue to Python's logging was full"),
            ));
        }
        waiting.0.pop_front()
    })
}
