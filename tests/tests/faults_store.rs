//! Store faults under a running `settle run`, made with real faults rather
//! than code hooks: a SQLite database locked by another process beyond the
//! busy timeout, a database and its folder made read-only, a full disk (a
//! tiny tmpfs), a PostgreSQL server restarted, and PostgreSQL connections
//! terminated by an administrator.
//!
//! A fault shorter than the store timeout (10 s) is absorbed: the writes it
//! failed are said and tried again, and the run exits 0 with every chunk.
//! Each time: the process never panics; when a store write failed for good
//! it says so and exits 3; every chunk it reported as persisted is in the database, in
//! order; and once the fault has cleared `settle recover` finishes the job:
//! every session finalized exactly once, memory only from completed turns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{check_db, memory_turns, Ending, Finished, Running, Scripted};

/// The role this test binary plays when re-run as a helper process.
const ROLE: &str = "SETTLE_FAULTS_ROLE";

/// A root and two children, each streaming `chunks` chunks of `size` bytes,
/// `delay_ms` apart, over two turns.
fn steady(chunks: usize, delay_ms: u64, size: usize) -> (String, Scripted) {
    let mut toml = String::from("name = \"steady\"\nsettle_timeout_ms = 300\n");
    let mut scripted = BTreeMap::new();
    for (name, parent) in [
        ("root", None),
        ("left", Some("root")),
        ("right", Some("root")),
    ] {
        toml.push_str(&format!("\n[[agent]]\nname = \"{name}\"\n"));
        if let Some(parent) = parent {
            toml.push_str(&format!("parent = \"{parent}\"\nspawn_after_ms = 5\n"));
        }
        let mut turns = Vec::new();
        for t in 1..=2 {
            let texts: Vec<String> = (0..chunks)
                .map(|k| {
                    let head = format!("{name}-t{t}-c{k}-");
                    let pad = size.saturating_sub(head.len());
                    format!("{head}{}", "x".repeat(pad))
                })
                .collect();
            toml.push_str(&settle_tests::turn_toml(&texts, delay_ms));
            turns.push(texts);
        }
        scripted.insert(name.to_owned(), turns);
    }
    (toml, scripted)
}

/// A tree whose root is quiet while the fault lasts: its first turn ends
/// at once, its second streams one chunk after `quiet_ms`, once the fault has
/// cleared. A `busy` child streams all along (its writes meet the fault). So
/// the root's second turn shows whether the store came back without a new
/// process.
fn comeback(quiet_ms: u64) -> (String, Scripted) {
    let toml = format!(
        "name = \"comeback\"\nsettle_timeout_ms = 300\n\
         [[agent]]\nname = \"root\"\n\
         [[agent.turn]]\nchunks = [\"root-t1-c0\"]\nchunk_delay_ms = 20\n\
         [[agent.turn]]\nchunks = [\"root-t2-c0\"]\nchunk_delay_ms = {quiet_ms}\n\
         [[agent]]\nname = \"busy\"\nparent = \"root\"\n\
         [[agent.turn]]\nchunks = [{}]\nchunk_delay_ms = 25\n",
        (0..80)
            .map(|k| format!("\"busy-t1-c{k}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut scripted = BTreeMap::new();
    scripted.insert(
        "root".to_owned(),
        vec![vec!["root-t1-c0".to_owned()], vec!["root-t2-c0".to_owned()]],
    );
    scripted.insert(
        "busy".to_owned(),
        vec![(0..80).map(|k| format!("busy-t1-c{k}")).collect()],
    );
    (toml, scripted)
}

/// After a [`comeback`] run: the root's second turn, after the fault, was
/// written and completed, and the run finalized the root itself.
fn assert_came_back(fault: &str, db: &str, run: &Finished) {
    let sessions = common::sessions(db).unwrap();
    let root = sessions.iter().find(|s| s["name"] == "root").unwrap();
    let id = root["id"].as_i64().unwrap();
    let detail = common::show(db, id).unwrap();
    let turn2 = detail["turns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["no"] == 2);
    assert!(
        turn2.is_some_and(|t| t["outcome"] == "completed" && t["chunks"][0] == "root-t2-c0")
            && root["end_reason"] == "completed",
        "{fault}: the store did not come back once the fault cleared: root {root}, turn 2 {turn2:?}\n{}",
        run.describe()
    );
}

/// What every fault must leave: no panic, failures reported and exit 3 when
/// writes failed, and after `settle recover` (the fault cleared) a database
/// in order with everything acknowledged in it. Returns a one-line summary.
fn after_the_fault(fault: &str, run: &Finished, db: &str, scripted: &Scripted) -> String {
    let context = || format!("fault: {fault}\n{}", run.describe());
    if std::env::var("SETTLE_FAULTS_VERBOSE").is_ok() {
        eprintln!("--- {fault}\n{}\n{}", run.lines.join("\n"), run.stderr);
    }
    assert!(!run.timed_out, "the run never ended\n{}", context());
    assert!(
        !run.stderr.contains("panicked"),
        "settle panicked\n{}",
        context()
    );
    let store_errors = run
        .lines
        .iter()
        .filter(|l| l.contains("STORE ERROR"))
        .count();
    let code = run.status.code();
    if store_errors > 0 {
        assert_eq!(
            code,
            Some(3),
            "store writes failed, yet exit {code:?}\n{}",
            context()
        );
    }
    if code == Some(3) {
        assert!(
            run.stderr.contains("store write(s) failed")
                || run.stderr.lines().any(|l| l.starts_with("settle: ")),
            "exit 3 without saying why on stderr\n{}",
            context()
        );
    } else {
        assert!(
            matches!(code, Some(0 | 1)),
            "unexpected exit {code:?}\n{}",
            context()
        );
    }
    let recovered = common::recover(db).unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert_eq!(
        common::recover(db).unwrap(),
        0,
        "a second recovery found more\n{}",
        context()
    );
    let persisted = run.persisted();
    let view = check_db(
        db,
        &memory_turns(db),
        &persisted,
        scripted,
        if store_errors > 0 {
            Ending::StoreFault
        } else {
            Ending::Recovered
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let summary = format!(
        "{fault}: exit {code:?}, {store_errors} store errors reported, {} chunks acknowledged and kept, \
         {recovered} of {} sessions finalized by `settle recover` afterwards",
        persisted.len(),
        view.sessions.len()
    );
    eprintln!("{summary}");
    summary
}

// --- SQLite locked by another process ------------------------------------------

/// Helper process: holds `BEGIN EXCLUSIVE` on the database for a while.
fn child_hold_lock() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let db = std::env::var("SETTLE_FAULTS_DB").unwrap();
    let hold: u64 = std::env::var("SETTLE_FAULTS_HOLD_MS")
        .unwrap()
        .parse()
        .unwrap();
    let mut c = diesel::sqlite::SqliteConnection::establish(&db).unwrap();
    c.batch_execute("PRAGMA busy_timeout = 10000; BEGIN EXCLUSIVE")
        .unwrap();
    println!("LOCKED");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_millis(hold));
    c.batch_execute("COMMIT").unwrap();
}

/// Not a test: the entry point of this binary's helper processes.
#[test]
fn child_process() {
    if std::env::var(ROLE).as_deref() == Ok("hold_lock") {
        child_hold_lock();
    }
}

/// Holds the database's write lock from another process for `hold`, once
/// a [`comeback`] run whose root is quiet for `quiet_ms` has persisted its
/// first chunks; the finished run.
fn locked_mid_run(db: &str, quiet_ms: u64, hold: Duration) -> (Finished, Scripted) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("comeback.toml");
    let (toml, scripted) = comeback(quiet_ms);
    std::fs::write(&file, toml).unwrap();
    let run = Running::start(db, &file, &[]);
    assert!(run.wait_for_line("persisted turn 1 chunk 1", Duration::from_secs(10)));
    let mut locker = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "hold_lock")
        .env("SETTLE_FAULTS_DB", db)
        .env("SETTLE_FAULTS_HOLD_MS", hold.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(locker.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("LOCKED"))),
        "the helper could not lock the database"
    );
    let run = run.finish(Duration::from_secs(60));
    assert!(locker.wait().unwrap().success());
    (run, scripted)
}

/// A fault the run absorbed: it met it and said so (a write tried again),
/// failed no write for good, and exited 0.
fn assert_absorbed(fault: &str, run: &Finished, summary: &str) {
    assert!(
        run.lines.iter().any(|l| l.contains("store retry")),
        "{fault}: met no failure?\n{}",
        run.describe()
    );
    assert!(
        summary.contains("exit Some(0)") && summary.contains(" 0 store errors"),
        "{fault}: not absorbed within the store timeout: {summary}\n{}",
        run.describe()
    );
}

/// Past SQLite's 5 s busy timeout, within the 10 s store timeout: the
/// writes the lock failed are tried again until it is gone.
#[test]
fn sqlite_locked_beyond_the_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::db_in(dir.path());
    let (run, scripted) = locked_mid_run(&db, 4000, Duration::from_millis(5800));
    let fault = "SQLite locked for 5.8 s by another process (busy timeout 5 s)";
    assert_came_back(fault, &db, &run);
    let summary = after_the_fault(fault, &run, &db, &scripted);
    assert_absorbed(fault, &run, &summary);
}

/// Past the 10 s store timeout: the turn whose chunk could not be written
/// in time fails, the run says a write failed and exits 3, and the store
/// comes back once the lock is gone.
#[test]
fn sqlite_locked_beyond_the_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::db_in(dir.path());
    let (run, scripted) = locked_mid_run(&db, 13_000, Duration::from_millis(11_500));
    let fault = "SQLite locked for 11.5 s by another process (store timeout 10 s)";
    assert_came_back(fault, &db, &run);
    let summary = after_the_fault(fault, &run, &db, &scripted);
    assert!(
        summary.contains("exit Some(3)"),
        "the lock caused no failure?\n{}",
        run.describe()
    );
}

// --- SQLite made read-only -----------------------------------------------------

#[test]
fn sqlite_made_read_only_mid_run() {
    let dir = common::open_tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = common::db_in(&data);
    let file = dir.path().join("steady.toml");
    let (toml, scripted) = steady(12, 60, 16);
    std::fs::write(&file, toml).unwrap();
    // Root may write anywhere: run settle as `nobody`, from a copy of the
    // binary that `nobody` can reach, on a folder it owns.
    let command = if common::is_root() {
        let copy = dir.path().join("settle");
        std::fs::copy(settle_tests::settle_bin(), &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ok = Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&copy)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            common::skip(
                "read-only fault",
                "running as root, and `runuser -u nobody` does not work",
            );
            return;
        }
        let status = Command::new("chown")
            .args(["nobody"])
            .arg(&data)
            .status()
            .unwrap();
        assert!(status.success());
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"])
            .arg(&copy)
            .arg("--db")
            .arg(&db);
        c.env_remove("SETTLE_DB").env_remove("SETTLE_LOG");
        c
    } else {
        common::settle(&db)
    };
    let run = Running::start_with(command, &file, &[]);
    assert!(run.wait_for_line("persisted turn 1 chunk 1", Duration::from_secs(10)));
    let read_only = |mode: u32| {
        for suffix in ["", "-wal", "-shm"] {
            let path = PathBuf::from(format!("{db}{suffix}"));
            if path.exists() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        let folder = if mode == 0o444 { 0o555 } else { 0o755 };
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(folder)).unwrap();
    };
    read_only(0o444);
    let run = run.finish(Duration::from_secs(30));
    // The fault clears: write access comes back.
    read_only(0o644);
    after_the_fault(
        "database, -wal, -shm and folder made read-only mid-run",
        &run,
        &db,
        &scripted,
    );
}

// --- disk full -------------------------------------------------------------------

#[test]
fn sqlite_disk_full_mid_run() {
    if !common::is_root() {
        common::skip("disk-full fault", "mounting a tmpfs needs root");
        return;
    }
    let fs = match common::Tmpfs::mount("4m") {
        Ok(fs) => fs,
        Err(why) => {
            // Mount privileges are not something CI can be asked for.
            eprintln!("\n*** SKIPPED: disk-full fault: {why} ***\n");
            return;
        }
    };
    let db = common::db_in(fs.path());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("comeback.toml");
    let (toml, scripted) = comeback(3000);
    std::fs::write(&file, toml).unwrap();
    let run = Running::start(&db, &file, &[]);
    assert!(run.wait_for_line("persisted turn 1 chunk 1", Duration::from_secs(10)));
    let filler = fs.path().join("filler");
    let filled = common::fill(&filler);
    // Writes fail while the disk is full...
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while run.count_lines("store retry") == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // ...until space comes back, mid-run.
    std::fs::remove_file(&filler).unwrap();
    let run = run.finish(Duration::from_secs(30));
    let fault = format!("disk full (tmpfs filled with {filled} bytes) mid-run, then freed");
    assert_came_back(&fault, &db, &run);
    let summary = after_the_fault(&fault, &run, &db, &scripted);
    assert_absorbed(&fault, &run, &summary);
}

// --- PostgreSQL ----------------------------------------------------------------

/// The PostgreSQL faults take turns: a restart would also hit the other test.
static ONE_PG_FAULT_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `scenario` on a database of this suite's own PostgreSQL server
/// (one PostgreSQL fault at a time), brings `fault` about once the run
/// printed `started`, and hands the run's end to `check` with the
/// database's URL and what was scripted.
fn pg_fault_mid_run(
    scenario: (String, Scripted),
    started: &str,
    fault: impl FnOnce(),
    check: impl FnOnce(&str, &Finished, &Scripted),
) {
    let _turn = ONE_PG_FAULT_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = common::own_cluster() else {
        return;
    };
    let pg = common::PgDb::new(&cluster.admin_url);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scenario.toml");
    let (toml, scripted) = scenario;
    std::fs::write(&file, toml).unwrap();
    let run = Running::start(&pg.url, &file, &[]);
    assert!(run.wait_for_line(started, Duration::from_secs(10)));
    fault();
    let run = run.finish(Duration::from_secs(60));
    check(&pg.url, &run, &scripted);
}

/// This suite's own PostgreSQL server (started by [`pg_fault_mid_run`]).
fn own_cluster() -> &'static common::Cluster {
    common::own_cluster().expect("started by pg_fault_mid_run")
}

/// Restarts the server under a [`comeback`] run; with `come_back`, also
/// asks that the root's write after the restart succeed.
fn restart_mid_run(come_back: bool) {
    let restart = || assert!(own_cluster().restart(), "pg_ctl restart failed");
    pg_fault_mid_run(
        comeback(4000),
        "persisted turn 1 chunk 2",
        restart,
        |db, run, scripted| {
            if come_back {
                assert_came_back("PostgreSQL server restarted", db, run);
            }
            let fault = "PostgreSQL server restarted (pg_ctl restart -m fast) mid-run";
            after_the_fault(fault, run, db, scripted);
        },
    );
}

/// A PostgreSQL server down for 6 s, within the 10 s store timeout, is
/// absorbed: every write it failed is tried again until the server is back,
/// and the run exits 0 with every chunk. It used to fail every streaming
/// turn: the check of whether a failed chunk had landed waits on the read
/// pool, whose own tries to reconnect came at growing intervals (up to 15
/// s apart), the last before the store timeout 67 ms before the server was
/// ready.
#[test]
fn postgres_down_for_six_seconds_is_absorbed_within_the_store_timeout() {
    let down = || {
        let down = own_cluster().down_for(Duration::from_secs(6));
        assert!(down, "pg_ctl stop/start failed");
    };
    // Three agents streaming all along, 5 s a turn: their writes meet the
    // outage, and each waits on the read pool to learn whether its failed
    // chunk landed.
    pg_fault_mid_run(
        steady(200, 25, 24),
        "persisted turn 1 chunk 20",
        down,
        |db, run, scripted| {
            let fault = "PostgreSQL stopped for 6 s mid-run (store timeout 10 s)";
            let summary = after_the_fault(fault, run, db, scripted);
            assert_absorbed(fault, run, &summary);
        },
    );
}

#[test]
fn postgres_server_restarted_mid_run() {
    restart_mid_run(false);
}

/// After a PostgreSQL restart the store's writer must come back by itself:
/// when every write that fails meets the server still down, it remembers the
/// connection is lost and establishes it again before the next write, so the
/// first write after the server is back succeeds (it used to fail with "The
/// transaction manager is broken", losing the root's one chunk after the
/// restart).
#[test]
fn postgres_writer_comes_back_after_a_restart() {
    restart_mid_run(true);
}

#[test]
fn postgres_connections_terminated_mid_run() {
    let _turn = ONE_PG_FAULT_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let Some(admin) = common::pg_admin_url() else {
        return;
    };
    let pg = common::PgDb::new(&admin);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("comeback.toml");
    let (toml, scripted) = comeback(1500);
    std::fs::write(&file, toml).unwrap();
    let run = Running::start(&pg.url, &file, &[]);
    assert!(run.wait_for_line("persisted turn 1 chunk 2", Duration::from_secs(10)));
    let terminated = pg.terminate_backends();
    assert!(terminated > 0, "no settle connection to terminate");
    let run = run.finish(Duration::from_secs(60));
    assert_came_back("PostgreSQL connections terminated", &pg.url, &run);
    after_the_fault(
        &format!("{terminated} PostgreSQL connections terminated (pg_terminate_backend) mid-run"),
        &run,
        &pg.url,
        &scripted,
    );
}
