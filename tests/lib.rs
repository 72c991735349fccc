//! End-to-end tests of settle live in `tests/tests/`; this library holds their
//! shared helpers: finding (and building) the `settle` binary, running it
//! against a fresh database in a temporary folder, following its progress
//! lines while it runs, and reading its JSON.
//!
//! Every wait here polls for a condition under a generous deadline, so the
//! tests stay correct on a loaded machine; none asserts a tight timing.

// Test helpers: a failure is a panic with a message, as in the tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

/// The deadline of every wait on the binary: far above what any test needs
/// on an idle machine, so that only a real hang trips it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The `settle` binary of this workspace, built on first use.
///
/// Cargo builds only the binaries of the package under test for its
/// integration tests, and `settle` belongs to `settle-cli`; so the first call
/// runs `cargo build -p settle-cli --bin settle` (same profile and target
/// folder as these tests, a no-op when it is fresh) and takes the path cargo
/// reports. `SETTLE_BIN` overrides it with a prebuilt binary.
///
/// # Panics
/// When the build fails.
pub fn settle_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("SETTLE_BIN") {
            return PathBuf::from(bin);
        }
        pin(&build_settle())
    })
}

/// A hard link (or copy) of the freshly built binary that no later build
/// replaces, so that every test of this process runs the same binary even if
/// another build into the same target folder runs meanwhile. Named after the
/// build's inode; older pins are removed. Falls back to `built` itself.
fn pin(built: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let pinned = (|| -> std::io::Result<PathBuf> {
        let dir = built
            .parent()
            .ok_or(std::io::ErrorKind::NotFound)?
            .join("settle-e2e");
        std::fs::create_dir_all(&dir)?;
        let name = format!("settle-{}", std::fs::metadata(built)?.ino());
        let pinned = dir.join(&name);
        if !pinned.exists() {
            let partial = dir.join(format!("{name}.{}", std::process::id()));
            if std::fs::hard_link(built, &partial).is_err() {
                std::fs::copy(built, &partial)?;
            }
            std::fs::rename(&partial, &pinned)?;
        }
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_name() != name.as_str() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(pinned)
    })();
    pinned.unwrap_or_else(|_| built.to_path_buf())
}

fn build_settle() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("Cargo.toml");
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "settle-cli", "--bin", "settle"])
        .args(["--message-format", "json-render-diagnostics"])
        .arg("--manifest-path")
        .arg(&manifest)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // The tests run from <target>/<profile>/deps/: build into the same place.
    if let Some(profile_dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf))
    {
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            build.arg("--release");
        }
        if let Some(target_dir) = profile_dir.parent() {
            build.arg("--target-dir").arg(target_dir);
        }
    }
    without_package_env(&mut build);
    let output = build.output().expect("cannot run cargo to build `settle`");
    assert!(
        output.status.success(),
        "building `settle` failed ({})",
        output.status
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "settle")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .expect("cargo built `settle` but reported no executable")
}

/// Removes from `cargo` the variables that Cargo sets for a test of this
/// package (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, ...). A build script that
/// watches one of them (ring's does) would otherwise see it change between
/// the `cargo test` that built this test and the `cargo build` it runs, and
/// each would rebuild half the dependency tree for the other.
pub fn without_package_env(cargo: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_the_test = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
            || [
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&name);
        if set_for_the_test {
            cargo.env_remove(name);
        }
    }
}

/// A temporary folder with a database in it, where `settle` runs.
pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// A fresh, empty folder.
    ///
    /// # Panics
    /// When no temporary folder can be made.
    pub fn new() -> Self {
        Sandbox {
            dir: tempfile::Builder::new()
                .prefix("settle-e2e-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The database of this sandbox (a SQLite file in it).
    pub fn db(&self) -> PathBuf {
        self.path().join("test.db")
    }

    /// Writes `text` to a file of the sandbox and returns its path.
    ///
    /// # Panics
    /// When the file cannot be written.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, text).expect("write a file into the sandbox");
        path
    }

    /// `settle ARGS...`, run from the sandbox with no stdin and no
    /// inherited `SETTLE_*` settings: without `--db`, so on `settle.db` in
    /// the sandbox.
    pub fn command_default_db(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(settle_bin());
        cmd.current_dir(self.path())
            .env_remove("SETTLE_DB")
            .env_remove("SETTLE_LOG")
            .env_remove("SETTLE_BASE_URL")
            .env_remove("SETTLE_MODEL")
            .env_remove("SETTLE_API_KEY")
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// `settle ARGS... --db <db>`, run from the sandbox (see
    /// [`Sandbox::command_default_db`]).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command_default_db(args);
        cmd.arg("--db").arg(self.db());
        cmd
    }

    /// Runs `cmd` to its end (within [`PATIENCE`]).
    ///
    /// # Panics
    /// When it cannot start or outlives the deadline.
    pub fn run_command(&self, mut cmd: Command) -> Output {
        finish(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
    }

    /// Runs `settle ARGS...` to its end (within [`PATIENCE`]).
    ///
    /// # Panics
    /// When it cannot start or outlives the deadline.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_command(self.command(args))
    }

    /// `settle sessions --json`, parsed.
    ///
    /// # Panics
    /// When it fails or prints no JSON array.
    pub fn sessions(&self) -> Vec<Value> {
        let out = self.run(&["sessions", "--json"]);
        assert_success(&out, "settle sessions --json");
        match parse_json(&out.stdout) {
            Value::Array(rows) => rows,
            other => panic!("`sessions --json` is not an array: {other}"),
        }
    }

    /// `settle show ID --json`, parsed.
    ///
    /// # Panics
    /// When it fails or prints no JSON.
    pub fn show(&self, id: u64) -> Value {
        let id = id.to_string();
        let out = self.run(&["show", &id, "--json"]);
        assert_success(&out, "settle show --json");
        parse_json(&out.stdout)
    }

    /// `settle recover`: its one line of output.
    ///
    /// # Panics
    /// When it fails.
    pub fn recover(&self) -> String {
        let out = self.run(&["recover"]);
        assert_success(&out, "settle recover");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The memory committed for session `id` (turn, content), read from the
    /// store directly: the command line does not print it.
    ///
    /// # Panics
    /// When the store cannot be read.
    pub fn memories(&self, id: u64) -> Vec<(u32, String)> {
        use settle_store::SessionStore;
        let store = settle_store::Store::open(self.db().to_string_lossy()).expect("open the store");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(store.memories(settle_store::SessionId(id)))
            .expect("read memories")
            .into_iter()
            .map(|m| (m.turn, m.content))
            .collect()
    }

    /// Starts `settle ARGS...` in the background with piped stdin and
    /// stdout, following its stdout line by line.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.spawn_command(self.command(args))
    }

    /// Starts `cmd` (see [`Sandbox::spawn`]): for a `--db` given in its
    /// arguments, with [`Sandbox::command_default_db`].
    ///
    /// # Panics
    /// When it cannot start.
    pub fn spawn_command(&self, mut cmd: Command) -> Running {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Running::start(cmd)
    }
}

impl Running {
    /// For a `settle serve`: waits for its listening line and returns the
    /// address it listens on (`HOST:PORT`, from `ws://HOST:PORT/ws` or
    /// `wss://`).
    ///
    /// # Panics
    /// When it never says it is listening.
    pub fn listening_address(&mut self) -> String {
        self.wait_for("the listening line", |out| out.contains("/ws\n"));
        let line = self
            .output()
            .lines()
            .find(|l| l.contains("listening on "))
            .expect("a listening line")
            .to_owned();
        line.split("://")
            .nth(1)
            .expect("an address")
            .trim_end_matches("/ws")
            .to_owned()
    }
}

/// The script book of the gateway tests, written into `sandbox`: "long"
/// streams twenty chunks (`l1`..`l20`) 100 ms apart, anything else answers
/// "ok". Its path.
pub fn long_book(sandbox: &Sandbox) -> String {
    let chunks: Vec<String> = numbered("l", 20)
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect();
    let text = format!(
        "[default]\nchunks = [\"ok\"]\n\n[prompt.long]\nchunks = [{}]\nchunk_delay_ms = 100\n",
        chunks.join(", ")
    );
    sandbox
        .write("book.toml", &text)
        .to_string_lossy()
        .into_owned()
}

/// Runs `cmd` to its end within [`PATIENCE`], killing it past that.
fn finish(cmd: &mut Command) -> Output {
    let mut child = cmd.spawn().expect("cannot start `settle`");
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_within(&mut child, PATIENCE)
        .unwrap_or_else(|| panic!("`{cmd:?}` did not end within {PATIENCE:?}"));
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Waits for `child` to exit, polling, for at most `limit`; kills it past
/// that and returns `None`.
pub fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `settle` process running in the background, its stdout followed as it
/// arrives (partial lines too: the chat's reply has no newline until it ends).
pub struct Running {
    child: Child,
    pieces: Receiver<String>,
    stdout: String,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Running {
    fn start(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("cannot start `settle`");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let stderr = drain(child.stderr.take());
        let (tx, pieces) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut bytes = Vec::new();
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => bytes.extend_from_slice(&buf[..n]),
                }
                // Forward whole UTF-8 characters only.
                let valid = match std::str::from_utf8(&bytes) {
                    Ok(text) => text.len(),
                    Err(e) => e.valid_up_to(),
                };
                let text = String::from_utf8_lossy(&bytes[..valid]).into_owned();
                bytes.drain(..valid);
                if tx.send(text).is_err() {
                    return;
                }
            }
        });
        Running {
            child,
            pieces,
            stdout: String::new(),
            stderr: Some(stderr),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stdin, to type into.
    ///
    /// # Panics
    /// When stdin was closed already.
    pub fn stdin(&mut self) -> &mut ChildStdin {
        self.child.stdin.as_mut().expect("stdin is open")
    }

    /// Closes its stdin (end of input, like Ctrl-D).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Everything it printed on stdout so far.
    pub fn output(&mut self) -> &str {
        while let Ok(piece) = self.pieces.try_recv() {
            self.stdout.push_str(&piece);
        }
        &self.stdout
    }

    /// Waits until what it printed so far satisfies `done` (within
    /// [`PATIENCE`]).
    ///
    /// # Panics
    /// When it does not, or its stdout closed first.
    pub fn wait_for(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let start = Instant::now();
        loop {
            if done(self.output()) {
                return;
            }
            let left = PATIENCE.saturating_sub(start.elapsed());
            match self
                .pieces
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(piece) => self.stdout.push_str(&piece),
                Err(RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(_) => {
                    let status = wait_within(&mut self.child, Duration::from_secs(5));
                    let stderr = self.stderr_text();
                    panic!(
                        "gave up waiting for {what} (process: {status:?})\nstdout:\n{}\nstderr:\n{stderr}",
                        self.stdout
                    );
                }
            }
        }
    }

    /// Sends `signal` to the process.
    ///
    /// # Panics
    /// When the signal cannot be sent.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = i32::try_from(self.pid()).expect("pid fits in i32");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("send a signal");
    }

    /// Its exit status, if it exits within `limit` (it is left running
    /// otherwise).
    pub fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its exit status once it exits within `limit`.
    ///
    /// # Panics
    /// When it does not: with every thread's stack (by `gdb`, when the
    /// machine has it) and what it printed on stderr, then kills it, so a
    /// hang seen once says where it hung.
    pub fn exits_within(&mut self, limit: Duration, what: &str) -> ExitStatus {
        if let Some(status) = self.exited_within(limit) {
            return status;
        }
        let stacks = Command::new("gdb")
            .args(["-p", &self.pid().to_string(), "-batch", "-nx"])
            .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
            .stdin(Stdio::null())
            .output()
            .map_or_else(
                |e| format!("(no stacks: gdb: {e})"),
                |out| String::from_utf8_lossy(&out.stdout).into_owned(),
            );
        let _ = self.child.kill();
        let _ = wait_within(&mut self.child, Duration::from_secs(5));
        let stderr = self.stderr_text();
        panic!(
            "{what}: not exited within {limit:?}\nstacks:\n{stacks}\nstderr:\n{stderr}\nstdout:\n{}",
            self.output()
        );
    }

    /// Waits for the process to exit (within [`PATIENCE`]); returns its exit
    /// status and everything it printed on stdout.
    ///
    /// # Panics
    /// When it does not exit in time.
    pub fn wait(&mut self) -> (ExitStatus, String) {
        let status = wait_within(&mut self.child, PATIENCE)
            .unwrap_or_else(|| panic!("`settle` did not exit within {PATIENCE:?}"));
        // The pipe closed with the process (unless it left a child holding
        // it): read what is left of it.
        let start = Instant::now();
        loop {
            match self.pieces.recv_timeout(Duration::from_millis(200)) {
                Ok(piece) => self.stdout.push_str(&piece),
                Err(RecvTimeoutError::Timeout) if start.elapsed() < PATIENCE => {}
                Err(_) => break,
            }
        }
        (status, self.stdout.clone())
    }

    /// What it printed on stderr (once it has exited).
    pub fn stderr_text(&mut self) -> String {
        // Exited, its pipe is closed, but the thread reading it may not have
        // seen that yet: wait for it (bounded, in case a child of the
        // process still holds the pipe).
        if let Ok(Some(_)) = self.child.try_wait() {
            let start = Instant::now();
            while self.stderr.as_ref().is_some_and(|h| !h.is_finished())
                && start.elapsed() < PATIENCE
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        match self.stderr.take() {
            Some(handle) if handle.is_finished() => {
                String::from_utf8_lossy(&handle.join().unwrap_or_default()).into_owned()
            }
            Some(handle) => {
                self.stderr = Some(handle);
                "(still running)".to_owned()
            }
            None => String::new(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failed test must not leave its process behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panics with the output of a command that failed.
///
/// # Panics
/// When `out` did not exit 0.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "`{what}` failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Parses a command's stdout as JSON.
///
/// # Panics
/// When it is not JSON.
pub fn parse_json(stdout: &[u8]) -> Value {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(stdout)))
}

/// The sorted keys of a JSON object.
///
/// # Panics
/// When `value` is not an object.
pub fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// The keys of a session in `sessions --json` (SPEC §7, `resumed_from`,
/// and `owner`, SPEC §12), sorted.
pub const SESSION_KEYS: [&str; 12] = [
    "chunks",
    "created_at",
    "end_reason",
    "finalized_at",
    "id",
    "name",
    "outcome",
    "owner",
    "parent",
    "resumed_from",
    "state",
    "turns",
];

/// The session named `name` among `sessions`.
///
/// # Panics
/// When there is none.
pub fn by_name<'a>(sessions: &'a [Value], name: &str) -> &'a Value {
    sessions
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no session named {name} in {sessions:#?}"))
}

/// A session's id.
///
/// # Panics
/// When it has none.
pub fn id_of(session: &Value) -> u64 {
    session["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id: {session}"))
}

/// Parses an RFC 3339 timestamp of the JSON output.
///
/// # Panics
/// When it is not one.
pub fn time(value: &Value) -> SystemTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {value}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("bad timestamp {text}: {e}"))
}

/// Checks G1 on a finished store: every session is finalized, and no
/// session was finalized after its parent.
///
/// # Panics
/// When a session is not finalized or was finalized after its parent.
pub fn assert_children_finalized_first(sessions: &[Value]) {
    for session in sessions {
        assert_eq!(session["state"], "finalized", "not finalized: {session}");
        let Some(parent) = session["parent"].as_u64() else {
            continue;
        };
        let parent = sessions
            .iter()
            .find(|s| s["id"] == parent)
            .unwrap_or_else(|| panic!("unknown parent {parent} of {session}"));
        assert!(
            time(&session["finalized_at"]) <= time(&parent["finalized_at"]),
            "G1: {} was finalized after its parent {}",
            session["name"],
            parent["name"]
        );
    }
}

/// `n` chunks `prefix1`..`prefixN`.
pub fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

/// The `[[agent.turn]]` table of a scenario's TOML that streams `chunks`,
/// `delay_ms` apart. The chunks hold no quote or backslash.
pub fn turn_toml(chunks: &[String], delay_ms: u64) -> String {
    let quoted: Vec<String> = chunks.iter().map(|c| format!("\"{c}\"")).collect();
    format!(
        "[[agent.turn]]\nchunks = [{}]\nchunk_delay_ms = {delay_ms}\n",
        quoted.join(", ")
    )
}

/// One `persisted turn N chunk K: "text"` line of `settle run`'s plain
/// progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persisted {
    /// The session's name (empty when the line names only its id).
    pub name: String,
    /// The session's id.
    pub session: u64,
    /// The turn, from 1.
    pub turn: u32,
    /// The chunk's position in its turn, from 0.
    pub seq: u32,
    /// Its text.
    pub text: String,
}

/// Every persisted-chunk line of a plain progress log, in order.
///
/// A line reads `<time>  <name>#<id>  persisted turn <n> chunk <k>: "<text>"`,
/// the text quoted as a Rust string literal; the tests' chunks hold no quote
/// or backslash, so the quotes are simply stripped.
pub fn persisted_chunks(log: &str) -> Vec<Persisted> {
    log.lines().filter_map(parse_persisted).collect()
}

/// One persisted-chunk line (see [`persisted_chunks`]); `None` for any other
/// line.
pub fn parse_persisted(line: &str) -> Option<Persisted> {
    let (head, rest) = line.split_once(" persisted turn ")?;
    let who = head.split_whitespace().nth(1)?;
    let (name, session) = who.rsplit_once('#')?;
    let (turn, rest) = rest.split_once(" chunk ")?;
    let (seq, text) = rest.split_once(": ")?;
    Some(Persisted {
        name: name.to_owned(),
        session: session.parse().ok()?,
        turn: turn.parse().ok()?,
        seq: seq.parse().ok()?,
        text: text.strip_prefix('"')?.strip_suffix('"')?.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_persisted_line() {
        let line = r#"2026-01-01T00:00:00.000Z  worker#12                persisted turn 2 chunk 3: "step 4""#;
        assert_eq!(
            parse_persisted(line),
            Some(Persisted {
                name: "worker".to_owned(),
                session: 12,
                turn: 2,
                seq: 3,
                text: "step 4".to_owned()
            })
        );
        assert_eq!(
            parse_persisted("2026  worker#1  turn 1 ended: completed"),
            None
        );
    }
}

/// The README's Rust example, compiled as a doctest so that it stays true to
/// the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
