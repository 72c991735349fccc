//! Standard error that the process never waits on.
//!
//! A gateway logs what its clients make it log (a refused origin, a
//! message it could not read: a line each), and a line written straight to
//! a standard error nobody reads any more (a log shipper that hung, a pager
//! left paused, a full pipe) blocks the thread that writes it: a few hundred
//! lines, and every worker thread of the runtime waits in a write, no client
//! is answered and a signal ends nothing (G9's exit bound).
//!
//! A [`Sink`] puts a bounded queue in front of the writer, drained by a
//! thread of its own. A log line that does not fit is dropped, never waited
//! for; a run of dropped lines is said, with how many, where they would
//! have been. The process's own reports ([`crate::complain`]) wait for room
//! while the writer makes progress, and the exit waits for the queue the
//! same way ([`flush_stderr`]), so that a slow terminal loses nothing and a
//! stuck one holds nothing.
//!
//! Not `tracing-appender`'s non-blocking writer, which is otherwise this:
//! at exit with its queue full (standard error stuck), its guard reports
//! the failed shutdown with `println!`, to standard output, which a
//! gateway's supervisor usually reads as it reads standard error; stuck
//! there too, the exit would block in that write (or panic, on a closed
//! pipe). It also counts dropped lines without saying where in the log
//! they went missing.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

/// How many bytes of lines may wait for standard error: past it, new log
/// lines are dropped.
pub const QUEUE_BYTES: usize = 1 << 20;

/// How long a report line, or the exit, waits for standard error to take
/// one more line before it gives up on it.
pub const STALL: Duration = Duration::from_secs(1);

/// What waits for the writer: a line, or how many lines were dropped there.
enum Entry {
    Line(Vec<u8>),
    Dropped(u64),
}

struct State {
    entries: VecDeque<Entry>,
    /// Bytes of the lines in `entries`.
    bytes: usize,
    /// The writer holds an entry it took and has not finished writing.
    writing: bool,
    /// Entries written so far: progress, for those who wait on it.
    written: u64,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when an entry is queued.
    queued: Condvar,
    /// Signalled when an entry has been written.
    progressed: Condvar,
    capacity: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bounded queue of lines in front of a writer (standard error), written
/// by a thread of its own; see the [module documentation](self).
#[derive(Clone)]
pub struct Sink {
    shared: Arc<Shared>,
}

impl Sink {
    /// Starts the thread that writes the queued lines to `out`; at most
    /// `capacity` bytes of lines wait for it.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn start<W: Write + Send + 'static>(out: W, capacity: usize) -> std::io::Result<Sink> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                entries: VecDeque::new(),
                bytes: 0,
                writing: false,
                written: 0,
            }),
            queued: Condvar::new(),
            progressed: Condvar::new(),
            capacity,
        });
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("settle-log".into())
            .spawn(move || write_queued(&worker, out))?;
        Ok(Sink { shared })
    }

    /// Queues a log line; drops it when the queue is full (counted, and the
    /// count written in its place).
    pub fn log(&self, line: Vec<u8>) {
        let state = self.shared.lock();
        self.queue(state, line);
    }

    /// Queues `line` if it fits (or if nothing else waits, so that a line
    /// longer than the queue is still said), else counts it dropped.
    fn queue(&self, mut state: MutexGuard<'_, State>, line: Vec<u8>) {
        if state.bytes == 0 || state.bytes + line.len() <= self.shared.capacity {
            state.bytes += line.len();
            state.entries.push_back(Entry::Line(line));
        } else if let Some(Entry::Dropped(n)) = state.entries.back_mut() {
            *n += 1;
        } else {
            state.entries.push_back(Entry::Dropped(1));
        }
        drop(state);
        self.shared.queued.notify_one();
    }

    /// Queues a line the process must say: waits for room as long as the
    /// writer takes a line within `stall` each time; dropped, as a log line
    /// is, once it does not.
    pub fn say(&self, line: Vec<u8>, stall: Duration) {
        let capacity = self.shared.capacity;
        let full = |state: &State| state.bytes > 0 && state.bytes + line.len() > capacity;
        let (state, _) = self.wait_while(full, stall);
        self.queue(state, line);
    }

    /// Waits until every queued line is written, as long as the writer
    /// takes a line within `stall` each time. Whether everything was
    /// written.
    pub fn flush(&self, stall: Duration) -> bool {
        let waiting = |state: &State| !state.entries.is_empty() || state.writing;
        self.wait_while(waiting, stall).1
    }

    /// Waits while `waiting` holds, as long as the writer takes a line
    /// within `stall` each time: the state, locked, and whether `waiting`
    /// stopped holding (rather than the writer stalling).
    fn wait_while(
        &self,
        waiting: impl Fn(&State) -> bool,
        stall: Duration,
    ) -> (MutexGuard<'_, State>, bool) {
        let mut state = self.shared.lock();
        while waiting(&state) {
            let before = state.written;
            state = self
                .shared
                .progressed
                .wait_timeout(state, stall)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if state.written == before && waiting(&state) {
                return (state, false);
            }
        }
        (state, true)
    }
}

/// The writer's thread: each entry in turn, for as long as the process
/// lives. A line that cannot be written (a closed pipe, a full disk) is
/// lost, never reported on the same failing stream.
fn write_queued<W: Write>(shared: &Shared, mut out: W) {
    loop {
        let entry = {
            let mut state = shared.lock();
            let entry = loop {
                if let Some(entry) = state.entries.pop_front() {
                    break entry;
                }
                state = shared
                    .queued
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            };
            if let Entry::Line(line) = &entry {
                state.bytes -= line.len();
            }
            state.writing = true;
            entry
        };
        let _ = match entry {
            Entry::Line(line) => out.write_all(&line),
            Entry::Dropped(n) => writeln!(
                out,
                "settle: {n} log line{} dropped here: standard error did not take them in time",
                if n == 1 { "" } else { "s" }
            ),
        };
        let _ = out.flush();
        let mut state = shared.lock();
        state.writing = false;
        state.written += 1;
        drop(state);
        shared.progressed.notify_all();
    }
}

/// One log line as the log library formats it, queued whole once dropped.
pub struct Line<'a> {
    sink: &'a Sink,
    bytes: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if !self.bytes.is_empty() {
            self.sink.log(std::mem::take(&mut self.bytes));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            sink: self,
            bytes: Vec::new(),
        }
    }
}

static STDERR: OnceLock<Sink> = OnceLock::new();

/// Puts the process's standard error behind a [`Sink`] (once): from then
/// on [`crate::complain`] queues its lines there too. The sink, or `None`
/// when its thread could not be started (standard error is then written
/// directly, as before).
pub fn install_stderr() -> Option<&'static Sink> {
    if let Some(sink) = STDERR.get() {
        return Some(sink);
    }
    let sink = Sink::start(std::io::stderr(), QUEUE_BYTES).ok()?;
    Some(STDERR.get_or_init(|| sink))
}

/// The sink in front of standard error, once [`install_stderr`] put it there.
pub fn stderr_sink() -> Option<&'static Sink> {
    STDERR.get()
}

/// Before the process exits: writes what waits for standard error, as long
/// as it takes lines (see [`Sink::flush`]). Nothing to do without a sink.
pub fn flush_stderr() {
    if let Some(sink) = STDERR.get() {
        sink.flush(STALL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A writer that takes nothing until `open` is sent (saying on
    /// `entered` that it waits), then everything.
    struct Gate {
        entered: mpsc::Sender<()>,
        open: Option<mpsc::Receiver<()>>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Some(open) = self.open.take() {
                let _ = self.entered.send(());
                let _ = open.recv();
            }
            self.out.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn g9_log_lines_past_a_stuck_writer_are_dropped_and_counted_not_waited_for() {
        let (open, gate) = mpsc::channel();
        let (entered, stuck) = mpsc::channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink::start(
            Gate {
                entered,
                open: Some(gate),
                out: Arc::clone(&out),
            },
            64,
        )
        .unwrap();
        // The writer is stuck on the first; the queue holds six more of 10
        // bytes; the rest are dropped, none waited for.
        sink.log(b"line 0000\n".to_vec());
        stuck.recv().unwrap();
        for n in 1..20 {
            sink.log(format!("line {n:04}\n").into_bytes());
        }
        open.send(()).unwrap();
        assert!(sink.flush(Duration::from_secs(60)));
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8, "{text}");
        assert!(lines[..7].iter().all(|l| l.starts_with("line ")), "{text}");
        assert_eq!(
            lines[7],
            "settle: 13 log lines dropped here: standard error did not take them in time"
        );
    }

    #[test]
    fn a_writer_that_keeps_up_gets_every_line_in_order() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let (open, gate) = mpsc::channel();
        let (entered, _) = mpsc::channel();
        open.send(()).unwrap();
        let sink = Sink::start(
            Gate {
                entered,
                open: Some(gate),
                out: Arc::clone(&out),
            },
            QUEUE_BYTES,
        )
        .unwrap();
        for n in 0..100 {
            sink.say(format!("{n}\n").into_bytes(), Duration::from_secs(60));
        }
        assert!(sink.flush(Duration::from_secs(60)));
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let expected: String = (0..100).map(|n| format!("{n}\n")).collect();
        assert_eq!(text, expected);
    }
}
