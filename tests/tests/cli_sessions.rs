//! `settle sessions` lists like the tools people know: newest first,
//! `--limit`, `--since`, a created column, `--tree`; `settle recover
//! --dry-run` lists what it would recover, with owners and leases, and
//! writes nothing; `settle recover --json` says what it recovered, from whom
//! and why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use nix::sys::signal::Signal;
use serde_json::Value;
use settle_tests::{assert_success, by_name, id_of, parse_json, Sandbox};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("examples")
        .join(format!("{name}.toml"))
}

/// A sandbox holding the sessions of `examples/scan.toml`: root (1) with
/// notes, recon (and its child ports) and web under it.
fn scanned() -> Sandbox {
    let sandbox = Sandbox::new();
    let out = sandbox.run(&["run", "--json", example("scan").to_str().unwrap()]);
    assert_success(&out, "settle run examples/scan.toml");
    sandbox
}

fn sessions_json(sandbox: &Sandbox, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["sessions", "--json"];
    all.extend_from_slice(args);
    let out = sandbox.run(&all);
    assert_success(&out, &format!("settle {all:?}"));
    parse_json(&out.stdout).as_array().unwrap().clone()
}

fn names(rows: &[Value]) -> Vec<&str> {
    rows.iter().map(|r| r["name"].as_str().unwrap()).collect()
}

fn text(sandbox: &Sandbox, args: &[&str]) -> String {
    let out = sandbox.run(args);
    assert_success(&out, &format!("settle {args:?}"));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn sessions_are_listed_newest_first_and_limited() {
    let sandbox = scanned();
    let all = sessions_json(&sandbox, &[]);
    assert_eq!(all.len(), 5);
    for pair in all.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            settle_tests::time(&a["created_at"]) >= settle_tests::time(&b["created_at"])
                && id_of(a) > id_of(b),
            "not newest first: {a} before {b}"
        );
    }
    let two = sessions_json(&sandbox, &["--limit", "2"]);
    assert_eq!(two, all[..2]);
    let finalized = sessions_json(&sandbox, &["--state", "finalized", "--limit", "3"]);
    assert_eq!(finalized, all[..3]);
}

#[test]
fn since_keeps_the_sessions_created_within_the_duration() {
    let sandbox = scanned();
    // The root was created two days ago, as far as the store knows.
    common::execute(
        sandbox.db().to_str().unwrap(),
        "UPDATE sessions SET created_at = created_at - 172800000 WHERE name = 'root'",
    );
    let recent = sessions_json(&sandbox, &["--since", "1d"]);
    assert_eq!(recent.len(), 4);
    assert!(!names(&recent).contains(&"root"));
    assert_eq!(sessions_json(&sandbox, &["--since", "2d1m"]).len(), 5);
    assert_eq!(sessions_json(&sandbox, &["--since", "1h30m"]).len(), 4);

    // The table says how old each one is.
    let table = text(&sandbox, &["sessions"]);
    let root = table.lines().find(|l| l.contains(" root ")).unwrap();
    assert!(root.trim_end().ends_with("2d ago"), "{table}");
    let header = table.lines().next().unwrap();
    assert!(header.contains("CREATED"), "{table}");
}

/// `(depth, name)` of `top` and its descendants, depth first, children by id.
fn depth_first(sessions: &[Value], top: u64, depth: usize) -> Vec<(usize, String)> {
    let session = sessions.iter().find(|s| id_of(s) == top).unwrap();
    let mut shape = vec![(depth, session["name"].as_str().unwrap().to_owned())];
    let mut kids: Vec<u64> = sessions
        .iter()
        .filter(|s| s["parent"] == top)
        .map(id_of)
        .collect();
    kids.sort_unstable();
    for kid in kids {
        shape.extend(depth_first(sessions, kid, depth + 1));
    }
    shape
}

#[test]
fn tree_indents_each_session_under_its_parent() {
    let sandbox = scanned();
    let table = text(&sandbox, &["sessions", "--tree"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    let name_of = |line: &str| {
        // The name column starts after the id and two spaces.
        let rest = line.trim_start().split_once("  ").unwrap().1;
        let depth = rest.len() - rest.trim_start().len();
        let name = rest.split_whitespace().next().unwrap().to_owned();
        (depth / 2, name)
    };
    let shape: Vec<(usize, String)> = rows.iter().map(|l| name_of(l)).collect();
    // Children in the order they were created (by id): recon and web race.
    let all = sessions_json(&sandbox, &[]);
    let root = id_of(by_name(&all, "root"));
    let expected = depth_first(&all, root, 0);
    assert_eq!(shape, expected, "{table}");
    assert_eq!(shape[0], (0, "root".to_owned()));
    assert!(shape.contains(&(2, "ports".to_owned())), "{table}");
    // --json follows the same order.
    let json = sessions_json(&sandbox, &["--tree"]);
    let in_order: Vec<String> = expected.into_iter().map(|(_, name)| name).collect();
    assert_eq!(names(&json), in_order);
    let root = by_name(&json, "root");
    assert!(root["parent"].is_null());
}

#[test]
fn recover_dry_run_lists_the_live_sessions_and_writes_nothing_then_recover_json_takes_them() {
    let sandbox = Sandbox::new();
    let scenario = sandbox.write(
        "long.toml",
        "name = \"long\"\n\
         [[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\", \"j\", \"k\", \"l\", \"m\", \"n\"]\nchunk_delay_ms = 1000\n\
         [[agent]]\nname = \"worker\"\nparent = \"root\"\n[[agent.turn]]\nchunks = [\"w1\", \"w2\", \"w3\", \"w4\", \"w5\", \"w6\", \"w7\", \"w8\", \"w9\"]\nchunk_delay_ms = 1000\n",
    );
    let mut run = sandbox.spawn(&["run", scenario.to_str().unwrap()]);
    run.wait_for("both agents to stream", |out| {
        ["root#", "worker#"].iter().all(|who| {
            out.lines()
                .any(|l| l.contains(who) && l.contains(" persisted turn "))
        })
    });
    let pid = u64::from(run.pid());
    run.signal(Signal::SIGKILL);
    let (status, _) = run.wait();
    assert_eq!(status.code(), None, "killed by the signal");

    // The killed run's log folded into the database file, so that the file
    // holds everything and any write would change its bytes.
    let db = sandbox.db();
    common::execute(db.to_str().unwrap(), "PRAGMA wal_checkpoint(TRUNCATE)");
    let before = std::fs::read(&db).unwrap();

    // --dry-run: what would be recovered, whose it was, when its lease ends.
    let listing = text(&sandbox, &["recover", "--dry-run"]);
    let mut lines = listing.lines();
    assert_eq!(
        lines.next(),
        Some("would recover 2 sessions (2 interrupted turns); nothing was written"),
        "{listing}"
    );
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "NAME", "STATE", "TURN", "HOST", "PID", "MACHINE", "LEASE", "EXPIRES", "WHY"]
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "{listing}");
    for (row, name) in rows.iter().zip(["worker", "root"]) {
        assert_eq!(row[1], name, "{listing}");
        assert_eq!(row[2], "running", "{listing}");
        assert_eq!(row[3], "1", "{listing}");
        assert_eq!(row[5], pid.to_string(), "{listing}");
        assert_eq!(row[8], "process_gone", "{listing}");
    }

    let out = sandbox.run(&["recover", "--dry-run", "--json"]);
    assert_success(&out, "settle recover --dry-run --json");
    let would = parse_json(&out.stdout);
    assert_eq!(would["dry_run"], true, "{would:#}");
    let listed = would["recovered"].as_array().unwrap();
    assert_eq!(names(listed), ["worker", "root"], "{would:#}");
    for session in listed {
        assert_eq!(session["state"], "running", "{session}");
        assert_eq!(session["interrupted_turn"], 1, "{session}");
        assert_eq!(session["why"], "process_gone", "{session}");
        let owner = &session["owner"];
        assert_eq!(owner["pid"], pid, "{session}");
        assert_eq!(owner["host"], settle_store::local_host_name(), "{session}");
        assert!(owner["machine"].is_string(), "{session}");
        // The lease runs from the owner's start.
        assert!(
            settle_tests::time(&owner["lease_expires_at"])
                > settle_tests::time(&owner["started_at"]),
            "{session}"
        );
    }
    assert_eq!(would["owners_gone"].as_array().unwrap().len(), 1);

    // Nothing was written: the same bytes, the sessions still live.
    assert!(
        std::fs::read(&db).unwrap() == before,
        "the dry run changed the database"
    );
    let live = sandbox.sessions();
    assert!(live.iter().all(|s| s["state"] == "running"), "{live:#?}");

    // recover --json takes them over and says whose they were.
    let out = sandbox.run(&["recover", "--json"]);
    assert_success(&out, "settle recover --json");
    let report = parse_json(&out.stdout);
    assert_eq!(report["dry_run"], false, "{report:#}");
    let recovered = report["recovered"].as_array().unwrap();
    assert_eq!(
        names(recovered),
        ["worker", "root"],
        "children first: {report:#}"
    );
    for (session, listed) in recovered.iter().zip(listed) {
        assert_eq!(session["interrupted_turn"], 1, "{session}");
        assert_eq!(session["owner"], listed["owner"], "{session}");
        assert_eq!(session["state"], "running", "{session}");
        assert_eq!(session["why"], "process_gone", "{session}");
    }
    assert!(by_name(recovered, "root")["parent"].is_null());
    let owners = report["owners_gone"].as_array().unwrap();
    assert_eq!(owners.len(), 1, "{report:#}");
    assert_eq!(owners[0]["why"], "process_gone");
    assert_eq!(owners[0]["owner"], listed[0]["owner"]["id"]);
    assert_eq!(report["finalized_elsewhere"], serde_json::json!([]));
    for session in sandbox.sessions() {
        assert_eq!(session["end_reason"], "recovered", "{session}");
    }

    // Nothing is left for a second run, or a dry run.
    let again = parse_json(&sandbox.run(&["recover", "--json"]).stdout);
    assert_eq!(again["recovered"], serde_json::json!([]));
    assert_eq!(
        text(&sandbox, &["recover", "--dry-run"]),
        "would recover 0 sessions (0 interrupted turns); nothing was written\n"
    );
}

/// Found from outside: `recover --json` listed every session of the store
/// after it recovered, to name parents; one unreadable row anywhere (an
/// outcome word another version wrote) then failed it with exit 3 and no
/// report, after it had written. It reads only its candidates' rows, and
/// before it writes.
#[test]
fn recover_json_reports_what_it_recovered_whatever_other_rows_hold() {
    let sandbox = scanned();
    let db = sandbox.db();
    let scenario = sandbox.write(
        "long.toml",
        "name = \"long\"\n\
         [[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\"]\nchunk_delay_ms = 1000\n",
    );
    let mut run = sandbox.spawn(&["run", scenario.to_str().unwrap()]);
    run.wait_for("the agent to stream", |out| {
        out.lines()
            .any(|l| l.contains("root#") && l.contains(" persisted turn "))
    });
    run.signal(Signal::SIGKILL);
    let _ = run.wait();
    let done = id_of(by_name(
        &sessions_json(&sandbox, &["--state", "finalized"]),
        "recon",
    ));
    common::execute(
        db.to_str().unwrap(),
        &format!("UPDATE sessions SET outcome = 'weird' WHERE id = {done}"),
    );
    for args in [
        &["recover", "--dry-run", "--json"][..],
        &["recover", "--json"],
    ] {
        let out = sandbox.run(args);
        assert_success(&out, &args.join(" "));
        let report = parse_json(&out.stdout);
        let listed = report["recovered"].as_array().unwrap();
        assert_eq!(names(listed), ["root"], "{report:#}");
        assert!(listed[0]["parent"].is_null(), "{report:#}");
    }
}

/// Found from outside: a negative id (which settle never writes) was read
/// as its absolute value, so `sessions` listed two sessions with one id and
/// `recover` named an id nobody typed. It is a value the store does not
/// understand, said as such, with its value.
#[test]
fn a_negative_session_id_is_an_unexpected_value_not_another_sessions_id() {
    let sandbox = scanned();
    let db = sandbox.db();
    let recon = id_of(by_name(&sessions_json(&sandbox, &[]), "recon"));
    common::execute(
        db.to_str().unwrap(),
        &format!("PRAGMA foreign_keys = OFF; UPDATE sessions SET id = -{recon} WHERE id = {recon}"),
    );
    let out = sandbox.run(&["sessions"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let told = String::from_utf8_lossy(&out.stderr);
    assert!(
        told.contains(&format!("\"-{recon}\" in sessions.id")),
        "{told}"
    );
    assert_eq!(told.lines().count(), 1, "{told}");
}

/// A store with one row another program changed: the listing that fails on
/// it names the one session whose row to look at, among thousands.
#[test]
fn an_unexpected_value_in_a_listing_names_the_session_whose_row_holds_it() {
    let sandbox = scanned();
    let db = sandbox.db();
    let web = id_of(by_name(&sessions_json(&sandbox, &[]), "web"));
    common::execute(
        db.to_str().unwrap(),
        &format!("UPDATE sessions SET outcome = 'bogus' WHERE id = {web}"),
    );
    let out = sandbox.run(&["sessions"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let told = String::from_utf8_lossy(&out.stderr);
    assert!(
        told.contains(&format!("\"bogus\" in sessions.outcome of session {web};")),
        "{told}"
    );
    assert_eq!(told.lines().count(), 1, "{told}");
}

/// `settle ARGS...` on the sandbox's database as a user who may read the
/// file and its folder but write neither: `nobody` when the tests run as
/// root (root may write anything), else this user, with the write bits of
/// the file and the folder taken away.
fn as_reader(sandbox: &Sandbox, args: &[&str]) -> std::process::Output {
    as_another(sandbox, 0o444, args)
}

/// [`as_reader`], with the database file's mode `db_mode` meanwhile.
fn as_another(sandbox: &Sandbox, db_mode: u32, args: &[&str]) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let set = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    set(&sandbox.db(), db_mode);
    set(sandbox.path(), 0o555);
    let mut command = if common::is_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "nobody", "--"])
            .arg(settle_tests::settle_bin());
        c
    } else {
        std::process::Command::new(settle_tests::settle_bin())
    };
    let out = command
        .arg("--db")
        .arg(sandbox.db())
        .args(args)
        .env_remove("SETTLE_DB")
        .env_remove("SETTLE_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    // Given back, so that the sandbox can be removed.
    set(sandbox.path(), 0o755);
    set(&sandbox.db(), 0o644);
    out
}

/// An operator reading a service's database, or a copy on a read-only
/// mount: the reading commands read a file this user may not write (SQLite
/// opened read-only), and nothing is written, not even beside it; the one
/// that writes, `recover`, is refused in one line.
#[test]
fn reading_commands_read_a_database_this_user_may_not_write_and_write_nothing() {
    let sandbox = scanned();
    let files_before: Vec<_> = std::fs::read_dir(sandbox.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let bytes_before = std::fs::read(sandbox.db()).unwrap();

    let out = as_reader(&sandbox, &["sessions", "--json"]);
    assert_success(&out, "settle sessions --json as a reader");
    let rows = parse_json(&out.stdout).as_array().unwrap().clone();
    assert_eq!(rows.len(), 5, "every session of the scan is listed");
    let root = id_of(by_name(&rows, "root"));
    let out = as_reader(&sandbox, &["show", &root.to_string(), "--json"]);
    assert_success(&out, "settle show as a reader");
    assert_eq!(parse_json(&out.stdout)["session"]["name"], "root");
    let out = as_reader(&sandbox, &["export", &root.to_string()]);
    assert_success(&out, "settle export as a reader");
    let out = as_reader(&sandbox, &["recover", "--dry-run"]);
    assert_success(&out, "settle recover --dry-run as a reader");

    let out = as_reader(&sandbox, &["recover"]);
    assert_eq!(out.status.code(), Some(2), "recover writes: refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("for writing"), "{err}");

    let files_after: Vec<_> = std::fs::read_dir(sandbox.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files_after, files_before, "nothing made beside the file");
    assert!(
        std::fs::read(sandbox.db()).unwrap() == bytes_before,
        "the file is as it was"
    );
}

/// A database `settle` made is its owner's only (transcripts hold what
/// users typed): another user's reading command is told in one line that
/// it may not read the file (exit 2), not that it may not write it, and
/// nothing is written.
#[test]
fn a_database_this_user_may_not_read_is_told_as_unreadable() {
    use std::os::unix::fs::PermissionsExt;
    let sandbox = scanned();
    let mode = std::fs::metadata(sandbox.db())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(
        mode, 0o600,
        "settle run made its database for its owner only"
    );
    let bytes_before = std::fs::read(sandbox.db()).unwrap();
    // Root reads anything: `nobody` is the other user then; else this
    // user, with the read bits taken away.
    let db_mode = if common::is_root() { 0o600 } else { 0o200 };
    for args in [&["sessions"][..], &["show", "1", "--json"]] {
        let out = as_another(&sandbox, db_mode, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("cannot read the database"), "{err}");
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    assert!(std::fs::read(sandbox.db()).unwrap() == bytes_before);
}

/// A tmpfs of this test's own (made read-only later); `None`, said as a
/// skip, where this process may not mount one.
fn a_tmpfs_to_make_read_only() -> Option<common::Tmpfs> {
    if !common::is_root() {
        common::skip("read-only mount", "mounting needs root");
        return None;
    }
    match common::Tmpfs::mount("16m") {
        Ok(fs) => Some(fs),
        Err(why) => {
            eprintln!("\n*** SKIPPED: read-only mount: {why} ***\n");
            None
        }
    }
}

/// Found from outside: on a read-only mount every reading command failed
/// with exit 3 ("unable to open database file"), while the README says a
/// copy on a read-only mount is read. SQLite may not make the WAL index
/// there, and its refusal was not taken for the read-only one it is.
#[test]
fn reading_commands_read_a_database_on_a_read_only_mount() {
    let Some(fs) = a_tmpfs_to_make_read_only() else {
        return;
    };
    let sandbox = scanned();
    let copy = fs.path().join("copy.db");
    std::fs::copy(sandbox.db(), &copy).unwrap();
    fs.remount_read_only();
    let db = copy.to_str().unwrap();
    let rows = common::settle_output(db, &["sessions", "--json"]);
    assert_success(&rows, "settle sessions on a read-only mount");
    let rows = parse_json(&rows.stdout).as_array().unwrap().clone();
    assert_eq!(rows.len(), 5, "every session of the scan is listed");
    let root = id_of(by_name(&rows, "root")).to_string();
    for args in [
        &["show", &root, "--json"][..],
        &["export", &root],
        &["recover", "--dry-run"],
    ] {
        let out = common::settle_output(db, args);
        assert_success(&out, &format!("settle {args:?} on a read-only mount"));
    }
}

/// A copy on a read-only mount that has its write-ahead log but not the
/// log's index (copied while a run wrote, without its `-shm`): the file
/// alone is not every commit, and SQLite cannot make the index there. The
/// reading commands say so and what to do, in one line (exit 2), where
/// they said only "unable to open database file" (exit 3).
#[test]
fn a_read_only_copy_with_its_log_but_not_the_logs_index_says_what_to_copy() {
    let Some(fs) = a_tmpfs_to_make_read_only() else {
        return;
    };
    let sandbox = Sandbox::new();
    let scenario = sandbox.path().join("long.toml");
    std::fs::write(
        &scenario,
        "name = \"long\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = [\"a\", \"b\", \"c\"]\nchunk_delay_ms = 5000\n",
    )
    .unwrap();
    let running = sandbox.spawn(&["run", scenario.to_str().unwrap()]);
    let wal = PathBuf::from(format!("{}-wal", sandbox.db().display()));
    let start = std::time::Instant::now();
    while !wal.exists() && start.elapsed() < settle_tests::PATIENCE {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Copied while it writes: the file and its log, not the index.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let copy = fs.path().join("copy.db");
    std::fs::copy(sandbox.db(), &copy).unwrap();
    std::fs::copy(&wal, fs.path().join("copy.db-wal")).unwrap();
    running.signal(nix::sys::signal::Signal::SIGKILL);
    fs.remount_read_only();
    let out = common::settle_output(copy.to_str().unwrap(), &["sessions"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("copy the -shm file with it"), "{stderr}");
}
