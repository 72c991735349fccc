//! Shared by the fault suite (`crash_loop`, `faults_store`, `races`,
//! `bad_input`): the `settle` binary, its JSON read back, the invariants every
//! database must satisfy once the dust has settled, a seeded generator of
//! scenarios, and throwaway PostgreSQL databases.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

#[path = "../../../crates/store/tests/support/pg_cluster.rs"]
mod pg_cluster;
use pg_cluster::as_owner;
#[allow(unused_imports)] // not every test binary asks
pub use pg_cluster::is_root;
pub use pg_cluster::Cluster;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use serde_json::Value;
use settle_tests::{parse_persisted, Persisted};

// --- the binary --------------------------------------------------------------

/// `settle --db DB ARGS...`, with logging quiet and no inherited `SETTLE_DB`.
pub fn settle(db: &str) -> Command {
    let mut c = Command::new(settle_tests::settle_bin());
    c.arg("--db")
        .arg(db)
        .env_remove("SETTLE_DB")
        .env_remove("SETTLE_LOG")
        .stdin(Stdio::null());
    c
}

/// Runs `settle --db DB ARGS...` to its end.
pub fn settle_output(db: &str, args: &[&str]) -> Output {
    settle(db).args(args).output().expect("run settle")
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `settle sessions --json`.
pub fn sessions(db: &str) -> Result<Vec<Value>, String> {
    let out = settle_output(db, &["sessions", "--json"]);
    if never_made(db, &out) {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(format!(
            "`settle sessions --json` failed: {}",
            describe(&out)
        ));
    }
    let value: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`settle sessions --json` printed bad JSON: {e}"))?;
    value
        .as_array()
        .cloned()
        .ok_or_else(|| "`settle sessions --json` did not print an array".to_owned())
}

/// `settle show ID --json`.
pub fn show(db: &str, id: i64) -> Result<Value, String> {
    let out = settle_output(db, &["show", &id.to_string(), "--json"]);
    if !out.status.success() {
        return Err(format!(
            "`settle show {id} --json` failed: {}",
            describe(&out)
        ));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`settle show {id} --json` printed bad JSON: {e}"))
}

/// Starts `settle recover` without waiting for it.
pub fn spawn_recover(db: &str) -> Child {
    settle(db)
        .arg("recover")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start settle recover")
}

/// The count a finished `settle recover` printed.
/// Whether `out` is a read-only command's refusal of a store that a run
/// killed before it made its tables left without any (exit 2, nothing
/// written): there is nothing in it.
fn never_made(db: &str, out: &Output) -> bool {
    std::path::Path::new(db).is_file()
        && out.status.code() == Some(2)
        && String::from_utf8_lossy(&out.stderr).contains("holds no settle database")
}

pub fn recovered_count(out: &Output) -> Result<usize, String> {
    if !out.status.success() {
        return Err(format!("`settle recover` failed: {}", describe(out)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("recovered ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("`settle recover` printed {text:?}"))
}

/// `settle recover`: how many sessions it recovered.
pub fn recover(db: &str) -> Result<usize, String> {
    let out = settle_output(db, &["recover"]);
    if never_made(db, &out) {
        return Ok(0);
    }
    recovered_count(&out)
}

/// Sends `signal` (a name such as `TERM`) to a process.
pub fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Under `CI=true` a skipped fault is a failure; elsewhere it is said loudly.
pub fn skip(what: &str, why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{what} cannot run under CI=true: {why}");
    }
    eprintln!(
        "\n**************** SKIPPED: {what} ****************\n{why}\n\
         *************************************************\n"
    );
}

// --- a running `settle run` --------------------------------------------------

/// A `settle run` in progress, its stdout collected line by line as it comes.
pub struct Running {
    pub child: Child,
    pub started: Instant,
    lines: Arc<Mutex<Vec<String>>>,
    new_line: mpsc::Receiver<String>,
    reader: Option<thread::JoinHandle<()>>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Running {
    /// Starts `settle --db DB run SCENARIO EXTRA...` with stdout a pipe (so
    /// the progress is one timestamped line per event).
    pub fn start(db: &str, scenario: &Path, extra: &[&str]) -> Running {
        Running::start_with(settle(db), scenario, extra)
    }

    /// [`Running::start`] from a prepared command (another user, limits...).
    pub fn start_with(mut command: Command, scenario: &Path, extra: &[&str]) -> Running {
        let started = Instant::now();
        let mut child = command
            .arg("run")
            .arg(scenario)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start settle run");
        let stdout = child.stdout.take().expect("a stdout pipe");
        let stderr = child.stderr.take().expect("a stderr pipe");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, new_line) = mpsc::channel();
        let reader = {
            let lines = lines.clone();
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            })
        };
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
            text
        });
        Running {
            child,
            started,
            lines,
            new_line,
            reader: Some(reader),
            stderr: Some(stderr),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (at most `timeout`) for a line containing `needle`.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if self
            .lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
        {
            return true;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.new_line.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    /// How many lines so far contain `needle`.
    pub fn count_lines(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits for the process to end (killing it after `timeout`), then returns
    /// its status, every stdout line and its stderr.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for settle") {
                break status;
            }
            if Instant::now() >= deadline {
                timed_out = true;
                let _ = self.child.kill();
                break self.child.wait().expect("wait for settle");
            }
            thread::sleep(Duration::from_millis(5));
        };
        let elapsed = self.started.elapsed();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let lines = std::mem::take(&mut *self.lines.lock().unwrap());
        Finished {
            status,
            timed_out,
            elapsed,
            lines,
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a `settle run` left behind.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub timed_out: bool,
    pub elapsed: Duration,
    pub lines: Vec<String>,
    pub stderr: String,
}

impl Finished {
    pub fn persisted(&self) -> Vec<Persisted> {
        self.lines
            .iter()
            .filter_map(|l| parse_persisted(l))
            .collect()
    }

    /// The lines `settle` itself wrote to stderr (`settle: …`), not its log.
    pub fn said(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("settle: "))
            .collect()
    }

    pub fn signal(&self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(&self.status)
    }

    pub fn describe(&self) -> String {
        format!(
            "status {:?} after {:?}{}\n--- stdout ({} lines, last 40)\n{}\n--- stderr\n{}",
            self.status,
            self.elapsed,
            if self.timed_out { " (TIMED OUT)" } else { "" },
            self.lines.len(),
            self.lines[self.lines.len().saturating_sub(40)..].join("\n"),
            self.stderr
        )
    }
}

// --- the invariants ------------------------------------------------------------

/// What the check expects of the way the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The run was killed (or failed) and `settle recover` has run since:
    /// sessions it left live are `recovered`.
    Recovered,
    /// Like `Recovered`, after a run whose store writes failed: a turn whose
    /// end could not be written is still open when its session's finalize
    /// latch runs, which closes it as `interrupted` (the transcript is cut
    /// where the store stopped taking it), so `interrupted` may appear in a
    /// session that was not recovered.
    StoreFault,
    /// The run ended by itself or by a graceful shutdown (G9): nothing was
    /// left for recovery, no turn was interrupted, no session was finalized
    /// while its timeline shows it running or cancelling.
    Graceful,
}

/// What the database holds, read back through `settle sessions` and
/// `settle show`.
#[derive(Debug, Default)]
pub struct DbView {
    pub sessions: Vec<Value>,
    pub details: BTreeMap<i64, Value>,
}

impl DbView {
    pub fn read(db: &str) -> Result<DbView, String> {
        let sessions = sessions(db)?;
        let mut details = BTreeMap::new();
        for s in &sessions {
            let id = s["id"].as_i64().ok_or("a session without an id")?;
            details.insert(id, show(db, id)?);
        }
        Ok(DbView { sessions, details })
    }

    /// The ids of sessions that are not finalized.
    pub fn live(&self) -> Vec<i64> {
        self.sessions
            .iter()
            .filter(|s| s["state"] != "finalized")
            .filter_map(|s| s["id"].as_i64())
            .collect()
    }

    pub fn chunks(&self, session: i64, turn: u64) -> Vec<String> {
        self.details[&session]["turns"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["no"].as_u64() == Some(turn))
            .map(|t| {
                t["chunks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What a scenario scripts each agent to stream: agent name -> turns ->
/// chunks.
pub type Scripted = BTreeMap<String, Vec<Vec<String>>>;

/// Checks the database at `db` after a run (and, for [`Ending::Recovered`],
/// a recovery): every session finalized exactly once; every chunk in
/// `persisted` present, in order, in its turn; each turn's chunks a prefix of
/// what the scenario scripted (`scripted`: agent name -> turns -> chunks);
/// memory only from completed turns, none for a recovered session; and the
/// ending's own rules. Returns the view it read, or every violation found.
pub fn check_db(
    db: &str,
    memories: &[(i64, i64)],
    persisted: &[Persisted],
    scripted: &Scripted,
    ending: Ending,
) -> Result<DbView, String> {
    let view = DbView::read(db)?;
    let mut errors = Vec::new();
    for s in &view.sessions {
        let id = s["id"].as_i64().unwrap_or_default();
        let name = s["name"].as_str().unwrap_or_default();
        let end = s["end_reason"].as_str().unwrap_or("null");
        let who = format!("session {id} ({name}, end reason {end})");
        if s["state"] != "finalized" {
            errors.push(format!("{who} is {}, not finalized", s["state"]));
        }
        if s["finalized_at"].is_null() || s["end_reason"].is_null() {
            errors.push(format!("{who} has no finalized_at or end_reason"));
        }
        let detail = &view.details[&id];
        let timeline = detail["timeline"].as_array().cloned().unwrap_or_default();
        let finals: Vec<&Value> = timeline.iter().filter(|t| t["to"] == "finalized").collect();
        if finals.len() != 1 {
            errors.push(format!(
                "{who} has {} `finalized` transitions: {timeline:?}",
                finals.len()
            ));
        }
        if timeline.last().is_some_and(|t| t["to"] != "finalized") {
            errors.push(format!("{who}: a transition after finalized: {timeline:?}"));
        }
        if let Some(fin) = finals.first() {
            let cause = fin["cause"].as_str().unwrap_or_default();
            if !cause.contains(end) {
                errors.push(format!(
                    "{who}: the finalized transition's cause {cause:?} names another end reason"
                ));
            }
            let from = fin["from"].as_str().unwrap_or("null");
            let live_from = from == "running" || from == "cancelling";
            if live_from && (ending == Ending::Graceful || end != "recovered") {
                errors.push(format!(
                    "{who} was finalized from {from}: a live turn was reclaimed ({timeline:?})"
                ));
            }
        }
        let turns = detail["turns"].as_array().cloned().unwrap_or_default();
        for t in &turns {
            let no = t["no"].as_u64().unwrap_or_default();
            let outcome = t["outcome"].as_str();
            match outcome {
                None => errors.push(format!("{who}: turn {no} has no outcome")),
                Some("interrupted") if ending == Ending::Graceful => {
                    errors.push(format!("{who}: turn {no} interrupted without a crash"));
                }
                Some("interrupted") if end != "recovered" && ending != Ending::StoreFault => {
                    errors.push(format!("{who}: turn {no} interrupted, yet not recovered"));
                }
                _ => {}
            }
            if t["ended_at"].is_null() {
                errors.push(format!("{who}: turn {no} never ended"));
            }
            let chunks: Vec<String> = t["chunks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect();
            if let Some(script) = scripted.get(name) {
                let want = usize::try_from(no)
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| script.get(i));
                match want {
                    Some(want) if want.starts_with(&chunks) => {}
                    Some(want) => errors.push(format!(
                        "{who}: turn {no} holds {chunks:?}, not a prefix of the scripted {want:?}"
                    )),
                    None => errors.push(format!("{who}: turn {no} was never scripted")),
                }
            }
        }
        if ending == Ending::Graceful && end == "recovered" {
            errors.push(format!("{who} was recovered after a graceful end"));
        }
        for (session, turn) in memories.iter().filter(|(s, _)| *s == id) {
            let outcome = turns
                .iter()
                .find(|t| t["no"].as_i64() == Some(*turn))
                .and_then(|t| t["outcome"].as_str());
            if outcome != Some("completed") {
                errors.push(format!(
                    "{who}: memory committed from turn {turn} whose outcome is {outcome:?} (session {session})"
                ));
            }
            if end == "recovered" {
                errors.push(format!("{who}: memory committed for a recovered session"));
            }
        }
    }
    for p in persisted {
        let session = i64::try_from(p.session).expect("a session id fits the store's BIGINT");
        let Some(detail) = view.details.get(&session) else {
            errors.push(format!("persisted chunk of an unknown session: {p:?}"));
            continue;
        };
        if detail["session"]["name"] != p.name.as_str() {
            errors.push(format!("persisted chunk under another name: {p:?}"));
        }
        let chunks = view.chunks(session, u64::from(p.turn));
        if chunks.get(p.seq as usize) != Some(&p.text) {
            errors.push(format!(
                "chunk reported persisted is lost or out of order: {p:?}; the turn holds {chunks:?}"
            ));
        }
    }
    if errors.is_empty() {
        Ok(view)
    } else {
        Err(errors.join("\n"))
    }
}

// --- direct database access ----------------------------------------------------

#[derive(QueryableByName)]
struct MemoryTurn {
    #[diesel(sql_type = BigInt)]
    session: i64,
    #[diesel(sql_type = BigInt)]
    turn_no: i64,
}

/// `(session, turn)` of every memory row, read straight from the database
/// (none in a SQLite file a run killed early left without tables).
pub fn memory_turns(db: &str) -> Vec<(i64, i64)> {
    let sql = "SELECT session, turn_no FROM memories ORDER BY id";
    let rows: Vec<MemoryTurn> = if db.starts_with("postgres") {
        let mut c = PgConnection::establish(db).expect("connect to PostgreSQL");
        diesel::sql_query(sql).load(&mut c).expect("read memories")
    } else {
        let mut c = SqliteConnection::establish(db).expect("open the SQLite file");
        c.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA query_only = 1")
            .expect("configure the connection");
        match diesel::sql_query(sql).load(&mut c) {
            Ok(rows) => rows,
            Err(e) if e.to_string().contains("no such table: memories") => Vec::new(),
            Err(e) => panic!("read memories: {e}"),
        }
    };
    rows.into_iter().map(|r| (r.session, r.turn_no)).collect()
}

/// Runs `sql` on the database, outside settle.
pub fn execute(db: &str, sql: &str) {
    if db.starts_with("postgres") {
        PgConnection::establish(db)
            .expect("connect to PostgreSQL")
            .batch_execute(sql)
            .expect("execute");
    } else {
        SqliteConnection::establish(db)
            .expect("open the SQLite file")
            .batch_execute(sql)
            .expect("execute");
    }
}

// --- a small seeded generator --------------------------------------------------

/// SplitMix64: small, seedable, good enough to pick timings.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// `true` with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(1, 100) <= percent
    }
}

/// The soak knobs: `SETTLE_SOAK_ITERATIONS` (default `default`) and
/// `SETTLE_SOAK_SEED` (default: from the clock). Printed, so that a run can
/// be repeated.
pub fn soak_knobs(default: usize) -> (usize, u64) {
    let iterations = std::env::var("SETTLE_SOAK_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let seed = std::env::var("SETTLE_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000_000)
                .unwrap_or(1)
        });
    (iterations, seed)
}

/// A random scripted agent tree: TOML, and what each agent's turns stream.
pub struct RandomScenario {
    pub toml: String,
    pub scripted: Scripted,
    /// Roughly how long the root streams, in milliseconds: the run ends soon
    /// after (finishing the root winds its subtree down).
    pub root_ms: u64,
    /// A rough upper bound of how long the run takes, in milliseconds.
    pub estimate_ms: u64,
}

/// Shape of a random tree.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub agents: (u64, u64),
    pub turns: (u64, u64),
    pub chunks: (u64, u64),
    pub chunk_delay_ms: (u64, u64),
    pub spawn_after_ms: (u64, u64),
    /// Allow ends other than `complete`.
    pub odd_ends: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            agents: (2, 5),
            turns: (1, 3),
            chunks: (0, 4),
            chunk_delay_ms: (0, 30),
            spawn_after_ms: (0, 40),
            odd_ends: true,
        }
    }
}

pub fn random_scenario(rng: &mut Rng, shape: Shape) -> RandomScenario {
    let settle_ms = rng.range(50, 200);
    let idle_ms = rng.range(150, 300);
    let mut toml = format!(
        "name = \"random\"\nsettle_timeout_ms = {settle_ms}\nidle_timeout_ms = {idle_ms}\n"
    );
    let mut scripted = BTreeMap::new();
    let agents = rng.range(shape.agents.0, shape.agents.1);
    let mut root_ms = 0;
    for a in 0..agents {
        let name = format!("a{a}");
        toml.push_str(&format!("\n[[agent]]\nname = \"{name}\"\n"));
        if a > 0 {
            let parent = rng.range(0, a - 1);
            let after = rng.range(shape.spawn_after_ms.0, shape.spawn_after_ms.1);
            toml.push_str(&format!(
                "parent = \"a{parent}\"\nspawn_after_ms = {after}\n"
            ));
        }
        let mut turns = Vec::new();
        let mut total = 0;
        for t in 1..=rng.range(shape.turns.0, shape.turns.1) {
            let n = rng.range(shape.chunks.0, shape.chunks.1);
            let chunks: Vec<String> = (0..n).map(|k| format!("{name}-t{t}-c{k}")).collect();
            let delay = rng.range(shape.chunk_delay_ms.0, shape.chunk_delay_ms.1);
            total += delay * n;
            toml.push_str(&settle_tests::turn_toml(&chunks, delay));
            if shape.odd_ends {
                match rng.range(1, 20) {
                    1..=2 => toml.push_str("end = \"fail\"\n"),
                    3..=4 => toml.push_str("end = \"self_cancel\"\n"),
                    5 => {
                        toml.push_str("end = \"hang\"\n");
                        total += idle_ms;
                    }
                    6..=7 => {
                        let ignore = rng.range(10, 150);
                        toml.push_str(&format!("end = \"ignore_cancel\"\nignore_ms = {ignore}\n"));
                        total += ignore;
                    }
                    _ => {}
                }
                if rng.chance(20) {
                    toml.push_str(&format!("close_delay_ms = {}\n", rng.range(1, 20)));
                }
            }
            turns.push(chunks);
        }
        if a == 0 {
            root_ms = total;
        }
        scripted.insert(name, turns);
    }
    RandomScenario {
        toml,
        scripted,
        root_ms,
        estimate_ms: root_ms + settle_ms + 50,
    }
}

// --- PostgreSQL ------------------------------------------------------------------

// A throwaway cluster this test binary started (a watchdog stops it when the
// binary exits); restarting it is this suite's own need.
impl Cluster {
    /// Restarts the server (fast shutdown: every connection is dropped).
    pub fn restart(&self) -> bool {
        as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-m", "fast", "restart"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stops the server (fast: every connection is dropped), keeps it down
    /// for `down`, and starts it again: a restart that takes its time, as
    /// a failover or an upgrade does. Whether both steps succeeded.
    pub fn down_for(&self, down: Duration) -> bool {
        let pg_ctl = |args: &[&str]| {
            as_owner(&self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let stopped = pg_ctl(&["-w", "-m", "fast", "stop"]);
        thread::sleep(down);
        let started = pg_ctl(&["-w", "-o", &self.options, "start"]);
        stopped && started
    }
}

/// The admin URL of a PostgreSQL server: `SETTLE_TEST_PG_URL`, else a cluster
/// of our own. `None` (said loudly; a failure under `CI=true`) when neither.
pub fn pg_admin_url() -> Option<String> {
    if let Ok(url) = std::env::var("SETTLE_TEST_PG_URL") {
        if !url.is_empty() {
            return Some(url);
        }
    }
    own_cluster().map(|c| c.admin_url.clone())
}

/// A cluster of our own (needed to restart the server), or `None` after
/// saying why.
pub fn own_cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(|| pg_cluster::start_cluster("settle-faults-pg-")) {
        Ok(c) => Some(c),
        Err(why) => {
            skip("PostgreSQL test", why);
            None
        }
    }
}

/// `admin` with its database replaced by `name`.
pub fn with_database(admin: &str, name: &str) -> String {
    let (scheme, rest) = admin.split_once("://").expect("a URL");
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, format!("?{q}")),
        None => (rest, String::new()),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    format!("{scheme}://{authority}/{name}{query}")
}

/// A fresh PostgreSQL database, dropped again at the end of the test.
pub struct PgDb {
    pub url: String,
    admin: String,
    name: String,
}

impl PgDb {
    pub fn new(admin: &str) -> PgDb {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!(
            "settle_faults_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let mut conn = PgConnection::establish(admin).expect("connect as admin");
        conn.batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .expect("create a test database");
        PgDb {
            url: with_database(admin, &name),
            admin: admin.to_owned(),
            name,
        }
    }

    /// Ends every other connection to this database (as a DBA would).
    pub fn terminate_backends(&self) -> usize {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let mut conn = PgConnection::establish(&self.admin).expect("connect as admin");
        let sql = format!(
            "SELECT count(pg_terminate_backend(pid))::bigint AS n FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            self.name
        );
        let rows: Vec<Count> = diesel::sql_query(sql).load(&mut conn).expect("terminate");
        rows.first()
            .map_or(0, |r| usize::try_from(r.n).unwrap_or(0))
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        if let Ok(mut conn) = PgConnection::establish(&self.admin) {
            let _ = conn.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A temporary folder that other users (`nobody`) may enter.
pub fn open_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("settle-faults-")
        .tempdir()
        .expect("a temporary folder");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// The database path in `dir` as a string.
pub fn db_in(dir: &Path) -> String {
    dir.join("settle.db")
        .to_str()
        .expect("UTF-8 path")
        .to_owned()
}

// --- a server that stops answering ---------------------------------------------

/// A whole-number knob from the environment (`SETTLE_STALL_ITERATIONS=20`),
/// else `default`.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The parent process id of `pid`, from `/proc/PID/stat` (`None` once gone).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: the name may hold spaces and parentheses.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

fn signal_pid(pid: i32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
}

impl Cluster {
    /// The postmaster's process id, from the first line of
    /// `DATA/postmaster.pid` (so only this cluster's server is ever named).
    pub fn postmaster(&self) -> i32 {
        let text = fs::read_to_string(self.data.join("postmaster.pid"))
            .expect("the cluster's postmaster.pid");
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid on the first line of postmaster.pid")
    }

    /// Every process of this server: its postmaster and the postmaster's
    /// children (backends, writers, launchers).
    pub fn server_processes(&self) -> Vec<i32> {
        let postmaster = self.postmaster();
        let mut pids = vec![postmaster];
        for entry in fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if parent_of(pid) == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Stops every process of the server with SIGSTOP, as a hung host or a
    /// frozen VM would: its kernel still accepts and acknowledges TCP, but
    /// nothing answers. They continue (SIGCONT) when the guard is dropped, so
    /// a failing test never leaves the server stopped.
    pub fn stop(&self) -> StoppedServer {
        use nix::sys::signal::Signal;
        let postmaster = self.postmaster();
        // The postmaster first: stopped, it forks no new backend.
        signal_pid(postmaster, Signal::SIGSTOP);
        let mut stopped = vec![postmaster];
        // Twice: a backend forked just before the postmaster stopped shows
        // up in the second look.
        for _ in 0..2 {
            for pid in self.server_processes() {
                if !stopped.contains(&pid) {
                    signal_pid(pid, Signal::SIGSTOP);
                    stopped.push(pid);
                }
            }
            thread::sleep(Duration::from_millis(5));
        }
        StoppedServer { pids: stopped }
    }
}

/// A PostgreSQL server stopped with SIGSTOP; dropping it continues it.
pub struct StoppedServer {
    pids: Vec<i32>,
}

impl StoppedServer {
    /// How many processes were stopped.
    pub fn processes(&self) -> usize {
        self.pids.len()
    }

    /// Continues the server (SIGCONT to every process stopped).
    pub fn resume(self) {
        drop(self);
    }
}

impl Drop for StoppedServer {
    fn drop(&mut self) {
        for pid in &self.pids {
            signal_pid(*pid, nix::sys::signal::Signal::SIGCONT);
        }
    }
}

// --- SQLite held by another process ----------------------------------------------

/// The `sqlite3` shell holding `BEGIN EXCLUSIVE` on a database, until
/// [`SqliteLock::release`] (or drop) commits and quits it.
pub struct SqliteLock {
    shell: Child,
}

impl SqliteLock {
    /// Starts `sqlite3 DB`, takes the exclusive lock and waits until the
    /// shell says it holds it. `None` (said loudly; a failure under
    /// `CI=true`) when there is no `sqlite3` shell.
    pub fn take(db: &str) -> Option<SqliteLock> {
        use std::io::Write;
        let shell = Command::new("sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut shell = match shell {
            Ok(shell) => shell,
            Err(e) => {
                skip(
                    "SQLite lock fault",
                    &format!("cannot run the `sqlite3` shell ({e}); install the sqlite3 package"),
                );
                return None;
            }
        };
        let mut stdin = shell.stdin.take().expect("the shell's stdin");
        stdin
            .write_all(b".timeout 10000\nBEGIN EXCLUSIVE;\nSELECT 'LOCKED';\n")
            .expect("type into the sqlite3 shell");
        stdin.flush().expect("type into the sqlite3 shell");
        shell.stdin = Some(stdin);
        let stdout = shell.stdout.take().expect("the shell's stdout");
        let mut lines = BufReader::new(stdout).lines();
        let locked = lines.any(|l| l.is_ok_and(|l| l.trim() == "LOCKED"));
        assert!(locked, "the sqlite3 shell did not take the lock");
        Some(SqliteLock { shell })
    }

    /// Commits (releasing the lock) and waits for the shell to quit.
    pub fn release(mut self) {
        self.quit();
    }

    fn quit(&mut self) {
        use std::io::Write;
        if let Some(mut stdin) = self.shell.stdin.take() {
            let _ = stdin.write_all(b"COMMIT;\n.quit\n");
        }
        let _ = self.shell.wait();
    }
}

impl Drop for SqliteLock {
    fn drop(&mut self) {
        self.quit();
    }
}

// --- disk full -------------------------------------------------------------------

/// A tmpfs of `size` mounted on a fresh folder, unmounted on drop.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mounting a tmpfs was refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Makes the file system read-only: every write fails with EROFS,
    /// whoever asks, root too.
    pub fn remount_read_only(&self) {
        let status = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(self.0.path())
            .status()
            .unwrap();
        assert!(status.success(), "remount read-only");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// Fills the file system holding `path` until a write fails.
pub fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 16 * 1024];
    let mut written = 0u64;
    while file.write_all(&block).is_ok() {
        written += block.len() as u64;
    }
    // Whatever is left is smaller than a block: take it byte by byte.
    while file.write_all(&[0]).is_ok() && file.flush().is_ok() {
        written += 1;
        if written & 4095 == 0 && file.sync_all().is_err() {
            break;
        }
    }
    written
}
