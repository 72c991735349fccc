//! G11, bad input is refused whole: a table of bad arguments, scenario files
//! and `--db` values, each run through the `settle` binary in a folder of its
//! own. Each must print exactly one line on stderr, starting `settle:` and
//! naming the offending thing, exit with the documented code (2 for bad input,
//! 3 for a server that cannot be reached), and leave every file of the folder
//! as it was: same names, same bytes, no new file (no `settle.db` for a bad
//! scenario, no database for a lookup that fails).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const OK_SCENARIO: &str =
    "name = \"ok\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = [\"a\"]\n";

/// One bad input: what to lay out in the folder, the arguments (the folder
/// is the working directory), the exit code, and what the line must name.
struct Case {
    name: &'static str,
    setup: fn(&Path),
    args: &'static [&'static str],
    code: i32,
    names: &'static str,
    /// Run as `nobody` (a root process may write anywhere).
    as_nobody: bool,
}

fn case(
    name: &'static str,
    setup: fn(&Path),
    args: &'static [&'static str],
    code: i32,
    names: &'static str,
) -> Case {
    Case {
        name,
        setup,
        args,
        code,
        names,
        as_nobody: false,
    }
}

fn nothing(_: &Path) {}

fn ok_scenario(dir: &Path) {
    fs::write(dir.join("ok.toml"), OK_SCENARIO).unwrap();
}

fn scenario(dir: &Path, file: &str, text: &str) {
    fs::write(dir.join(file), text).unwrap();
}

/// A settle database with one finished session, made by the binary itself.
fn database(dir: &Path, file: &str) {
    ok_scenario(dir);
    let db = dir.join(file);
    let out = common::settle(db.to_str().unwrap())
        .args(["run", "ok.toml", "--json"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    fs::remove_file(dir.join("ok.toml")).unwrap();
    // `settle` may exit with its write-ahead log still beside the database
    // (see `sqlite_companions`): fold it in, so the file holds everything.
    common::execute(db.to_str().unwrap(), "PRAGMA wal_checkpoint(TRUNCATE)");
}

/// A settle database whose sessions are still live: a `settle run` killed
/// (SIGKILL) while its root streams, its log folded into the file.
fn live_database(dir: &Path) {
    let scenario = dir.join("long.toml");
    fs::write(
        &scenario,
        "name = \"long\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\n\
         chunks = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\"]\nchunk_delay_ms = 1000\n",
    )
    .unwrap();
    let db = dir.join("settle.db");
    let mut run = common::Running::start(db.to_str().unwrap(), &scenario, &[]);
    assert!(
        run.wait_for_line(" persisted turn ", Duration::from_secs(60)),
        "the run never streamed"
    );
    run.child.kill().unwrap();
    let _ = run.finish(Duration::from_secs(10));
    fs::remove_file(&scenario).unwrap();
    common::execute(db.to_str().unwrap(), "PRAGMA wal_checkpoint(TRUNCATE)");
}

/// Drops SQLite's `-wal` and `-shm` companions of a database that was there
/// before: a process that only reads a WAL database may create them, or
/// remove ones left behind (`settle` does not always close its connections
/// before it exits, so they outlive it). The database file itself, every
/// other file, and any file next to a database that did not exist, still
/// count.
fn sqlite_companions(before: &mut Snapshot, after: &mut Snapshot) {
    let companion = |name: &str, before: &Snapshot| {
        ["-wal", "-shm"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| before.get(base).is_some_and(|f| f.0 == "file"))
        })
    };
    let names: Vec<String> = before.keys().chain(after.keys()).cloned().collect();
    for name in names {
        if companion(&name, before) {
            before.remove(&name);
            after.remove(&name);
        }
    }
}

fn cases() -> Vec<Case> {
    vec![
        // --- arguments ---
        case("unknown command", nothing, &["frobnicate"], 2, "frobnicate"),
        case(
            "no command at all",
            nothing,
            &[],
            2,
            "a command is required",
        ),
        case(
            "unknown option",
            ok_scenario,
            &["run", "--frobnicate", "ok.toml"],
            2,
            "--frobnicate",
        ),
        case(
            "serve --advertise that is not a ws:// URL",
            nothing,
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--advertise",
                "http://gw-a/ws",
            ],
            2,
            "http://gw-a/ws",
        ),
        case(
            "serve --advertise with no host",
            nothing,
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--advertise",
                "ws:///ws",
            ],
            2,
            "names no host",
        ),
        case(
            "serve --lease-ttl of zero",
            nothing,
            &["serve", "--listen", "127.0.0.1:0", "--lease-ttl", "0s"],
            2,
            "--lease-ttl",
        ),
        case(
            "duration without unit",
            ok_scenario,
            &["run", "ok.toml", "--settle-timeout", "5"],
            2,
            "--settle-timeout",
        ),
        case(
            "negative duration",
            ok_scenario,
            &["run", "ok.toml", "--settle-timeout", "-1s"],
            2,
            "`-1s` is negative",
        ),
        case(
            "duration option given the next flag for its value",
            ok_scenario,
            &["run", "ok.toml", "--settle-timeout", "--json"],
            2,
            "for '--settle-timeout",
        ),
        case(
            "unknown duration unit",
            ok_scenario,
            &["run", "ok.toml", "--drain-timeout", "2x"],
            2,
            "--drain-timeout",
        ),
        case(
            "duration over the 24h limit",
            ok_scenario,
            &["run", "ok.toml", "--settle-timeout", "1d1s"],
            2,
            "24h limit",
        ),
        case(
            "duration missing the last unit",
            ok_scenario,
            &["run", "ok.toml", "--idle-timeout", "1m30"],
            2,
            "--idle-timeout",
        ),
        case(
            "duration too large",
            ok_scenario,
            &["run", "ok.toml", "--idle-timeout", "99999999999999999999ms"],
            2,
            "--idle-timeout",
        ),
        case(
            "a lease that lasts no time",
            ok_scenario,
            &["run", "ok.toml", "--lease-ttl", "0s"],
            2,
            "--lease-ttl",
        ),
        case(
            "a store timeout without unit",
            ok_scenario,
            &["run", "ok.toml", "--store-timeout", "10"],
            2,
            "--store-timeout",
        ),
        case(
            "a flush budget over the 24h limit",
            ok_scenario,
            &["run", "ok.toml", "--flush-budget", "25h"],
            2,
            "24h limit",
        ),
        case("run without a scenario", nothing, &["run"], 2, "SCENARIO"),
        case("show of a non-number", nothing, &["show", "abc"], 2, "abc"),
        case(
            "show of a negative id",
            nothing,
            &["show", "--", "-4"],
            2,
            "-4",
        ),
        case(
            "unknown state",
            nothing,
            &["sessions", "--state", "bogus"],
            2,
            "bogus",
        ),
        case(
            "sessions --since without a unit",
            |d| database(d, "settle.db"),
            &["sessions", "--since", "90"],
            2,
            "--since",
        ),
        case(
            "sessions --since not a duration",
            |d| database(d, "settle.db"),
            &["sessions", "--since", "yesterday"],
            2,
            "yesterday",
        ),
        case(
            "sessions --limit 0",
            |d| database(d, "settle.db"),
            &["sessions", "--limit", "0"],
            2,
            "--limit",
        ),
        case(
            "sessions --limit not a number",
            |d| database(d, "settle.db"),
            &["sessions", "--limit", "ten"],
            2,
            "ten",
        ),
        case(
            "sessions --limit negative",
            |d| database(d, "settle.db"),
            &["sessions", "--limit=-3"],
            2,
            "-3",
        ),
        // A negative number is a value its option refuses, named as such;
        // not an "unexpected argument".
        case(
            "sessions --limit negative, apart",
            |d| database(d, "settle.db"),
            &["sessions", "--limit", "-1"],
            2,
            "for '--limit <N>'",
        ),
        case(
            "show of a negative id without --",
            nothing,
            &["show", "-4"],
            2,
            "not a session id",
        ),
        case(
            "chat with an API key a header cannot carry",
            nothing,
            &["chat", "--api-key", "sk-line1\nline2-secret"],
            2,
            "API key",
        ),
        // The key from a file, so that it is not in every `ps` listing:
        // a file that cannot be read is named, a key is never quoted.
        case(
            "chat --api-key-file missing",
            nothing,
            &["chat", "--api-key-file", "missing.key"],
            2,
            "missing.key",
        ),
        case(
            "chat --api-key-file empty",
            |d| fs::write(d.join("empty.key"), "\n").unwrap(),
            &["chat", "--api-key-file", "empty.key"],
            2,
            "empty.key",
        ),
        case(
            "chat --api-key-file of two lines",
            |d| fs::write(d.join("two.key"), "sk-first-secret\nsk-second-secret\n").unwrap(),
            &["chat", "--api-key-file", "two.key"],
            2,
            "two.key",
        ),
        case(
            "chat --api-key and --api-key-file",
            |d| fs::write(d.join("one.key"), "sk-file-secret\n").unwrap(),
            &["chat", "--api-key", "sk-flag", "--api-key-file", "one.key"],
            2,
            "cannot be used with",
        ),
        case(
            "serve --max-sessions negative",
            nothing,
            &["serve", "--max-sessions", "-5"],
            2,
            "for '--max-sessions",
        ),
        // A negative duration apart from its option is that option's bad
        // value too, and an option given no value before the next flag
        // says which flag it took.
        case(
            "chat --idle-timeout negative, apart",
            nothing,
            &[
                "chat",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--idle-timeout",
                "-1s",
            ],
            2,
            "for '--idle-timeout",
        ),
        case(
            "sessions --since negative, apart",
            |d| database(d, "settle.db"),
            &["sessions", "--since", "-2h"],
            2,
            "`-2h` is negative",
        ),
        case(
            "recover with an unknown option",
            |d| database(d, "settle.db"),
            &["recover", "--all"],
            2,
            "--all",
        ),
        case(
            "recover --dry-run with an unknown option",
            |d| database(d, "settle.db"),
            &["recover", "--dry-run", "--force"],
            2,
            "--force",
        ),
        case(
            "chat --resume of a non-number",
            nothing,
            &["chat", "--resume", "abc"],
            2,
            "abc",
        ),
        case(
            "chat --resume without an id",
            nothing,
            &["chat", "--resume"],
            2,
            "--resume",
        ),
        case(
            "chat --resume with --last",
            |d| database(d, "settle.db"),
            &["chat", "--resume", "1", "--last"],
            2,
            "--last",
        ),
        // Found from outside: accepted, then every turn refused (exit 0).
        case(
            "chat --max-prompt-bytes 0",
            nothing,
            &["chat", "--max-prompt-bytes", "0"],
            2,
            "--max-prompt-bytes",
        ),
        case(
            "serve --max-history-bytes 0KiB",
            nothing,
            &["serve", "--max-history-bytes", "0KiB"],
            2,
            "--max-history-bytes",
        ),
        case(
            "export of a non-number",
            |d| database(d, "settle.db"),
            &["export", "first"],
            2,
            "first",
        ),
        case(
            "export in an unknown format",
            |d| database(d, "settle.db"),
            &["export", "1", "--format", "pdf"],
            2,
            "pdf",
        ),
        case(
            "export -o into a missing folder",
            |d| database(d, "settle.db"),
            &["export", "1", "-o", "no/such/dir/s.md"],
            2,
            "no/such/dir",
        ),
        case(
            "export -o a directory",
            |d| {
                database(d, "settle.db");
                fs::create_dir(d.join("out")).unwrap();
            },
            &["export", "1", "--format", "jsonl", "-o", "out"],
            2,
            "out",
        ),
        case(
            "show of an id past what the database holds",
            |d| database(d, "settle.db"),
            &["show", "9223372036854775808"],
            2,
            "9223372036854775808",
        ),
        case(
            "export -o the database itself",
            |d| database(d, "settle.db"),
            &["export", "1", "-o", "settle.db"],
            2,
            "database's own file",
        ),
        case(
            "show --trace onto the database itself",
            |d| database(d, "settle.db"),
            &["show", "1", "--trace", "./settle.db"],
            2,
            "database's own file",
        ),
        case(
            "export -o another SQLite database",
            |d| {
                database(d, "settle.db");
                database(d, "other.db");
            },
            &["export", "1", "-o", "other.db"],
            2,
            "SQLite database",
        ),
        case(
            "show --trace into a missing folder",
            |d| database(d, "settle.db"),
            &["show", "1", "--trace", "no/such/dir/t.json"],
            2,
            "no/such/dir",
        ),
        case(
            "show --trace with --json",
            |d| database(d, "settle.db"),
            &["show", "1", "--trace", "t.json", "--json"],
            2,
            "--trace",
        ),
        case(
            "show --trace without a file",
            |d| database(d, "settle.db"),
            &["show", "1", "--trace"],
            2,
            "--trace",
        ),
        // --- scenario files ---
        case(
            "missing scenario file",
            nothing,
            &["run", "missing.toml"],
            2,
            "missing.toml",
        ),
        case(
            "directory as scenario",
            |d| fs::create_dir(d.join("folder.toml")).unwrap(),
            &["run", "folder.toml"],
            2,
            "folder.toml",
        ),
        case(
            "empty scenario",
            |d| scenario(d, "empty.toml", ""),
            &["run", "empty.toml"],
            2,
            "empty.toml",
        ),
        case(
            "non-UTF-8 scenario",
            |d| fs::write(d.join("latin1.toml"), b"name = \"caf\xe9\"\n").unwrap(),
            &["run", "latin1.toml"],
            2,
            "latin1.toml",
        ),
        case(
            "invalid TOML",
            |d| scenario(d, "broken.toml", "name = \"x\"\n[[agent]\nname = 1\n"),
            &["run", "broken.toml"],
            2,
            "broken.toml",
        ),
        case(
            "unknown key",
            |d| scenario(d, "key.toml", &format!("colour = \"red\"\n{OK_SCENARIO}")),
            &["run", "key.toml"],
            2,
            "colour",
        ),
        case(
            "two roots",
            |d| {
                scenario(
                    d,
                    "roots.toml",
                    &format!(
                        "{OK_SCENARIO}[[agent]]\nname = \"second\"\n[[agent.turn]]\nchunks = []\n"
                    ),
                )
            },
            &["run", "roots.toml"],
            2,
            "second",
        ),
        case(
            "a cycle of parents",
            |d| {
                scenario(
                    d,
                    "cycle.toml",
                    &format!(
                        "{OK_SCENARIO}[[agent]]\nname = \"x\"\nparent = \"y\"\n[[agent.turn]]\nchunks = []\n\
                         [[agent]]\nname = \"y\"\nparent = \"x\"\n[[agent.turn]]\nchunks = []\n"
                    ),
                )
            },
            &["run", "cycle.toml"],
            2,
            "cycle",
        ),
        case(
            "unknown parent",
            |d| {
                scenario(d, "orphan.toml", &format!("{OK_SCENARIO}[[agent]]\nname = \"kid\"\nparent = \"ghost\"\n[[agent.turn]]\nchunks = []\n"))
            },
            &["run", "orphan.toml"],
            2,
            "ghost",
        ),
        case(
            "duplicate agent names",
            |d| {
                scenario(d, "dup.toml", &format!("{OK_SCENARIO}[[agent]]\nname = \"root\"\nparent = \"root\"\n[[agent.turn]]\nchunks = []\n"))
            },
            &["run", "dup.toml"],
            2,
            "root",
        ),
        case(
            "agent without a turn",
            |d| {
                scenario(
                    d,
                    "idle.toml",
                    &format!("{OK_SCENARIO}[[agent]]\nname = \"lazy\"\nparent = \"root\"\n"),
                )
            },
            &["run", "idle.toml"],
            2,
            "lazy",
        ),
        case(
            "unknown turn end",
            |d| {
                scenario(d, "end.toml", "name = \"e\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = []\nend = \"explode\"\n")
            },
            &["run", "end.toml"],
            2,
            "explode",
        ),
        case(
            "negative delay",
            |d| {
                scenario(d, "neg.toml", "name = \"n\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = []\nchunk_delay_ms = -5\n")
            },
            &["run", "neg.toml"],
            2,
            "chunk_delay_ms",
        ),
        case(
            "agent count of zero",
            |d| {
                scenario(d, "zero.toml", &format!("{OK_SCENARIO}[[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 0\n[[agent.turn]]\n"))
            },
            &["run", "zero.toml"],
            2,
            "count",
        ),
        case(
            "agent count over the cap",
            |d| {
                scenario(d, "many.toml", &format!("{OK_SCENARIO}[[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 5000000\n[[agent.turn]]\n"))
            },
            &["run", "many.toml"],
            2,
            "1000000 agents",
        ),
        case(
            "parent naming a counted entry",
            |d| {
                scenario(d, "counted.toml", &format!("{OK_SCENARIO}[[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 2\n[[agent.turn]]\n[[agent]]\nname = \"k\"\nparent = \"w\"\n[[agent.turn]]\n"))
            },
            &["run", "counted.toml"],
            2,
            "\"w-1\" to \"w-2\"",
        ),
        case(
            "huge scenario (over 1 MiB)",
            |d| {
                let mut text = OK_SCENARIO.to_owned();
                text.push_str(&format!("# {}\n", "x".repeat(1024 * 1024)));
                scenario(d, "huge.toml", &text)
            },
            &["run", "huge.toml"],
            2,
            "huge.toml",
        ),
        case(
            "symlink loop",
            |d| std::os::unix::fs::symlink("loop.toml", d.join("loop.toml")).unwrap(),
            &["run", "loop.toml"],
            2,
            "loop.toml",
        ),
        // --- database locations ---
        case(
            "--db in a missing folder",
            ok_scenario,
            &["--db", "no/such/folder/s.db", "run", "ok.toml"],
            2,
            "no/such/folder",
        ),
        case(
            "--db empty",
            ok_scenario,
            &["--db", "", "run", "ok.toml"],
            2,
            "path is empty",
        ),
        case(
            "--db an in-memory database",
            ok_scenario,
            &["--db", ":memory:", "run", "ok.toml"],
            2,
            "in-memory",
        ),
        case(
            "--db an SQLite URI",
            ok_scenario,
            &["--db", "file:x.db?mode=ro", "run", "ok.toml"],
            2,
            "URI",
        ),
        case(
            "--db a symbolic link to nothing (the link is kept)",
            |d| {
                ok_scenario(d);
                std::os::unix::fs::symlink(d.join("gone").join("target.db"), d.join("link.db"))
                    .unwrap();
            },
            &["--db", "link.db", "run", "ok.toml"],
            2,
            "symbolic link",
        ),
        case(
            "--idle-timeout of zero (a hang would never end)",
            ok_scenario,
            &["run", "ok.toml", "--idle-timeout", "0ms"],
            2,
            "--idle-timeout",
        ),
        case(
            "--db a directory",
            |d| fs::create_dir(d.join("dbdir")).unwrap(),
            &["--db", "dbdir", "sessions"],
            2,
            "dbdir",
        ),
        case(
            "--db a file that is not a database",
            |d| {
                scenario(
                    d,
                    "notes.txt",
                    "these are notes, not a database\n".repeat(20).as_str(),
                )
            },
            &["--db", "notes.txt", "sessions"],
            2,
            "notes.txt",
        ),
        case(
            "--db a corrupt database",
            |d| {
                database(d, "corrupt.db");
                // Keep the 100-byte header, turn the rest of every page to garbage.
                let path = d.join("corrupt.db");
                let mut bytes = fs::read(&path).unwrap();
                for (i, b) in bytes.iter_mut().enumerate().skip(100) {
                    *b = (i as u8).wrapping_mul(31) ^ 0xa5;
                }
                fs::write(&path, bytes).unwrap();
            },
            &["--db", "corrupt.db", "sessions"],
            2,
            "corrupt.db",
        ),
        case(
            "--db another program's SQLite database",
            |d| {
                common::execute(
                    d.join("other.db").to_str().unwrap(),
                    "CREATE TABLE accounts (id INTEGER PRIMARY KEY)",
                )
            },
            &["--db", "other.db", "sessions"],
            2,
            "other.db",
        ),
        case(
            "--db a database of a future schema version",
            |d| {
                database(d, "future.db");
                common::execute(
                    d.join("future.db").to_str().unwrap(),
                    "UPDATE settle_meta SET value = 99 WHERE key = 'schema_version'",
                );
            },
            &["--db", "future.db", "sessions"],
            2,
            "99",
        ),
        Case {
            as_nobody: true,
            ..case(
                "--db in a read-only folder",
                |d| {
                    ok_scenario(d);
                    let ro = d.join("ro");
                    fs::create_dir(&ro).unwrap();
                    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
                },
                &["--db", "ro/settle.db", "run", "ok.toml"],
                2,
                "ro/settle.db",
            )
        },
        Case {
            as_nobody: true,
            ..case(
                // `sessions` reads it (cli_sessions); `recover` would write.
                "--db a read-only database file, to a command that writes",
                |d| {
                    database(d, "locked.db");
                    fs::set_permissions(d.join("locked.db"), fs::Permissions::from_mode(0o444))
                        .unwrap();
                },
                &["--db", "locked.db", "recover"],
                2,
                "locked.db",
            )
        },
        case(
            "sessions on an empty file",
            |d| fs::write(d.join("empty.db"), b"").unwrap(),
            &["--db", "empty.db", "sessions"],
            2,
            "empty.db",
        ),
        case(
            "recover on an empty file",
            |d| fs::write(d.join("empty.db"), b"").unwrap(),
            &["--db", "empty.db", "recover"],
            2,
            "empty.db",
        ),
        case(
            "show on an SQLite database with no tables",
            |d| {
                common::execute(
                    d.join("bare.db").to_str().unwrap(),
                    "PRAGMA user_version = 7",
                )
            },
            &["--db", "bare.db", "show", "1"],
            2,
            "bare.db",
        ),
        case(
            "sessions on a file that is not a database",
            |d| fs::write(d.join("notes.txt"), b"just some notes\n").unwrap(),
            &["--db", "notes.txt", "sessions"],
            2,
            "notes.txt",
        ),
        case(
            "--db an unreachable PostgreSQL server",
            nothing,
            &["--db", "postgres://127.0.0.1:1/x", "sessions"],
            3,
            "127.0.0.1:1",
        ),
        // --- lookups ---
        case(
            "show of a missing id",
            |d| database(d, "settle.db"),
            &["show", "42"],
            2,
            "42",
        ),
        case(
            "show in a folder with no database",
            nothing,
            &["show", "1"],
            2,
            "settle.db",
        ),
        case(
            "export of a missing id",
            |d| database(d, "settle.db"),
            &["export", "42", "-o", "s.md"],
            2,
            "42",
        ),
        case(
            "show --trace of a missing id",
            |d| database(d, "settle.db"),
            &["show", "42", "--trace", "t.json"],
            2,
            "42",
        ),
        case(
            "export in a folder with no database",
            nothing,
            &["export", "1", "-o", "s.md"],
            2,
            "settle.db",
        ),
        case(
            "show --trace in a folder with no database",
            nothing,
            &["show", "1", "--trace", "t.json"],
            2,
            "settle.db",
        ),
        case(
            "sessions in a folder with no database",
            nothing,
            &["sessions"],
            2,
            "settle.db",
        ),
        case(
            "sessions --json in a folder with no database",
            nothing,
            &["sessions", "--json", "--tree"],
            2,
            "settle.db",
        ),
        case(
            "recover in a folder with no database",
            nothing,
            &["recover"],
            2,
            "settle.db",
        ),
        case(
            "recover --json of a missing --db",
            nothing,
            &["--db", "gone/away.db", "recover", "--json"],
            2,
            "gone/away.db",
        ),
        case(
            "recover --dry-run in a folder with no database",
            nothing,
            &["recover", "--dry-run"],
            2,
            "settle.db",
        ),
        case(
            "recover --dry-run --json of a missing --db",
            nothing,
            &["--db", "gone/away.db", "recover", "--dry-run", "--json"],
            2,
            "gone/away.db",
        ),
        case(
            "chat --resume of a missing id",
            |d| database(d, "settle.db"),
            &["chat", "--resume", "42"],
            2,
            "42",
        ),
        case(
            "chat --resume of a session still live",
            live_database,
            &["chat", "--resume", "1"],
            2,
            "session 1 is running",
        ),
        case(
            "chat --last with no finished session",
            live_database,
            &["chat", "--last"],
            2,
            "--last",
        ),
        case(
            "chat --resume in a folder with no database",
            nothing,
            &["chat", "--resume", "1"],
            2,
            "settle.db",
        ),
        case(
            "chat --last in a folder with no database",
            nothing,
            &["chat", "--last"],
            2,
            "settle.db",
        ),
        case(
            "show of a dangling link",
            |d| std::os::unix::fs::symlink("nowhere.db", d.join("link.db")).unwrap(),
            &["--db", "link.db", "show", "1"],
            2,
            "link.db",
        ),
    ]
}

/// Every file under `dir`: kind, mode and a hash of its bytes (or of the
/// target of a link).
type Snapshot = BTreeMap<String, (String, u32, u64)>;

fn snapshot(dir: &Path) -> Snapshot {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(folder) = stack.pop() {
        for entry in fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mut hasher = DefaultHasher::new();
            let kind = if meta.file_type().is_symlink() {
                fs::read_link(&path).unwrap().hash(&mut hasher);
                "link"
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir"
            } else {
                fs::read(&path).unwrap().hash(&mut hasher);
                "file"
            };
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            files.insert(name, (kind.to_owned(), meta.mode(), hasher.finish()));
        }
    }
    files
}

/// Runs `case` in a folder of its own; returns what went wrong, if anything.
fn run_case(case: &Case, bin: &Path) -> Result<(), String> {
    let dir = common::open_tempdir();
    (case.setup)(dir.path());
    let mut command = if case.as_nobody {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let mut before = snapshot(dir.path());
    let out = command
        .args(case.args)
        .current_dir(dir.path())
        .env_remove("SETTLE_DB")
        .env_remove("SETTLE_LOG")
        .output()
        .unwrap();
    let mut after = snapshot(dir.path());
    sqlite_companions(&mut before, &mut after);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let mut problems = Vec::new();
    if out.status.code() != Some(case.code) {
        problems.push(format!("exit {:?}, not {}", out.status.code(), case.code));
    }
    if lines.len() != 1 {
        problems.push(format!("{} lines on stderr, not 1", lines.len()));
    }
    // Every secret these cases give ends `-secret`: none is ever quoted.
    if stderr.contains("-secret") || String::from_utf8_lossy(&out.stdout).contains("-secret") {
        problems.push("a secret is quoted".to_string());
    }
    match lines.first() {
        Some(line) if line.starts_with("settle: ") && line.contains(case.names) => {}
        Some(_) => problems.push(format!(
            "the line does not start `settle: ` and name {:?}",
            case.names
        )),
        None => {}
    }
    if before != after {
        problems.push(format!(
            "files changed:\nbefore {before:?}\nafter  {after:?}"
        ));
    }
    if problems.is_empty() {
        eprintln!("ok  {:<44} exit {}  {}", case.name, case.code, lines[0]);
        Ok(())
    } else {
        Err(format!(
            "{}: settle {:?}\n  {}\n  stderr: {stderr}\n  stdout: {}",
            case.name,
            case.args,
            problems.join("\n  "),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

#[test]
fn g11_bad_input_is_refused_whole() {
    let cases = cases();
    assert!(cases.len() >= 25, "{} cases", cases.len());
    // `nobody` may not be able to reach the build folder: run a copy of the
    // binary from a folder everyone can read.
    let shared = common::open_tempdir();
    let copy = shared.path().join("settle");
    fs::copy(settle_tests::settle_bin(), &copy).unwrap();
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).unwrap();
    let can_be_nobody = common::is_root()
        && Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&copy)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in &cases {
        if case.as_nobody && !can_be_nobody && common::is_root() {
            common::skip(
                case.name,
                "running as root, and `runuser -u nobody` does not work",
            );
            continue;
        }
        let bin = if case.as_nobody && can_be_nobody {
            copy.as_path()
        } else {
            settle_tests::settle_bin()
        };
        ran += 1;
        if let Err(e) = run_case(case, bin) {
            failures.push(e);
        }
    }
    eprintln!("{ran} bad inputs tried, {} refused wrongly", failures.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// A PostgreSQL URL that is not one (bad brackets, ports, options, escapes,
/// spaces), or a location meant for another kind of store (another
/// scheme, libpq's keyword string), is bad input: exit 2, one line, nothing
/// written (no file of its name), for every command that
/// opens the store. And no line ever carries its password: not the masked
/// URL's, not inside what the client library quotes back, not in part.
#[test]
fn g11_a_malformed_postgresql_url_is_bad_input_and_never_shows_its_password() {
    // (URL, the secret it holds)
    let malformed = [
        ("postgres://postgres:SECRETPW@[::1/settle", "SECRETPW"),
        ("postgres://u:HUNTER22@host:notaport/db", "HUNTER22"),
        ("postgres://u:PASSWD99@h:99999/db", "PASSWD99"),
        ("postgres://u:TOPSECRET@h/db?sslmode=bogus", "TOPSECRET"),
        ("postgresql://u:OPENSESAME@/db?host=%zz", "OPENSESAME"),
        ("postgres://u:XYZZY123@h/db?nosuchoption=1", "XYZZY123"),
        (
            "postgres://u@h/db?password=QUERYPW1&sslmode=bogus",
            "QUERYPW1",
        ),
        ("postgres://u:ESC%41PED@[::1/db", "ESCAPED"),
        ("postgres://u:ESC%41PED@[::1/db", "ESC%41PED"),
        // Found from outside: a space in the URL was taken for a server
        // that did not answer (3).
        ("postgres://u:SPACEPW@127.0.0.1:1/my db", "SPACEPW"),
        // Not PostgreSQL URLs at all, but no SQLite path either: each
        // made a file of its name, libpq's keyword string one named with
        // its password, which every later message showed.
        (
            "host=127.0.0.1 port=1 password=KEYWORDPW dbname=x",
            "KEYWORDPW",
        ),
        ("mysql://u:MYSQLPW@h/db", "MYSQLPW"),
        ("postgres:u:NOSLASHPW@h/db", "NOSLASHPW"),
        // Found by a second look: spaces around `=`, a keyword past the
        // first word, and a URL in quotes or after a space (an env file
        // that keeps its quotes, a paste).
        (
            "host = 127.0.0.1 password = SPACEDPW dbname = x",
            "SPACEDPW",
        ),
        ("sslpassword=SSLKEYPW host=h", "SSLKEYPW"),
        ("\"postgres://u:QUOTEDPW@127.0.0.1:1/x\"", "QUOTEDPW"),
        (" postgres://u:LEADINGPW@127.0.0.1:1/x", "LEADINGPW"),
        ("<mysql://u:BRACKETPW@h/db>", "BRACKETPW"),
    ];
    // Well formed, but the server is not there: a store error (3), and no
    // password either, even one with an `@` in it that libpq reads apart.
    let unreachable = [
        ("postgres://u:SECRETPW@127.0.0.1:1/x", "SECRETPW"),
        ("postgres://u:AT@SIGN@127.0.0.1:1/x", "AT@SIGN"),
        ("postgres://u:AT@SIGN@127.0.0.1:1/x", "AT"),
        // A URL's scheme is case-insensitive.
        ("POSTGRES://u:UPPERPW@127.0.0.1:1/x", "UPPERPW"),
    ];
    let commands: [&[&str]; 6] = [
        &["sessions"],
        &["run", "ok.toml"],
        &["show", "1"],
        &["export", "1"],
        &["recover"],
        &["chat", "--last"],
    ];
    let mut failures = Vec::new();
    let cases = malformed
        .iter()
        .map(|case| (case, 2))
        .chain(unreachable.iter().map(|case| (case, 3)));
    for ((url, secret), code) in cases {
        for args in commands {
            let dir = common::open_tempdir();
            ok_scenario(dir.path());
            let before = snapshot(dir.path());
            let out = common::settle(url)
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            let after = snapshot(dir.path());
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let mut problems = Vec::new();
            if stderr.contains(secret) || stdout.contains(secret) {
                problems.push(format!("the password {secret:?} is shown"));
            }
            if out.status.code() != Some(code) {
                problems.push(format!("exit {:?}, not {code}", out.status.code()));
            }
            if stderr.lines().count() != 1 || !stderr.starts_with("settle: ") {
                problems.push("not one line starting `settle: `".to_owned());
            }
            if before != after {
                problems.push("files changed".to_owned());
            }
            if !problems.is_empty() {
                failures.push(format!(
                    "{url} {args:?}: {}\n  stderr: {stderr}",
                    problems.join("; ")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// A PostgreSQL server without the database the URL names is bad input for
/// every command, those that write as well as those that only read (SPEC §7:
/// a database location is input): exit 2, one line naming it.
#[test]
fn g11_a_missing_postgresql_database_is_bad_input_for_every_command() {
    let Some(admin) = common::pg_admin_url() else {
        return;
    };
    let name = format!("settle_missing_{}", std::process::id());
    let url = common::with_database(&admin, &name);
    let commands: [&[&str]; 5] = [
        &["sessions"],
        &["recover"],
        &["run", "ok.toml"],
        &["chat", "--last"],
        &["serve", "--listen", "127.0.0.1:0"],
    ];
    let mut failures = Vec::new();
    for args in commands {
        let dir = common::open_tempdir();
        ok_scenario(dir.path());
        let before = snapshot(dir.path());
        let out = common::settle(&url)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let one_line = stderr.lines().count() == 1 && stderr.starts_with("settle: ");
        if out.status.code() != Some(2) || !one_line || !stderr.contains(&name) {
            failures.push(format!(
                "{args:?}: exit {:?}, stderr: {stderr}",
                out.status.code()
            ));
        }
        assert_eq!(before, snapshot(dir.path()), "{args:?} wrote a file");
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Found from outside: `settle export 3 > chat.md` on a full disk said
/// nothing and exited 0, the export lost. Output that cannot be written
/// (here `/dev/full`) is one line naming standard output; a command that
/// only reads then exits 2, as `-o` a file that cannot be written does,
/// and one that wrote (a run) keeps the code that says what it did. A
/// reader that closes its pipe early (`settle sessions | head -1`) is no
/// failure.
#[test]
fn g11_output_that_cannot_be_written_is_said_and_a_reading_command_ends_2() {
    let dir = common::open_tempdir();
    database(dir.path(), "settle.db");
    let db = dir.path().join("settle.db");
    let db = db.to_str().unwrap();
    ok_scenario(dir.path());
    let commands: [(&[&str], i32); 6] = [
        (&["sessions"], 2),
        (&["sessions", "--json"], 2),
        (&["show", "1", "--json"], 2),
        (&["export", "1"], 2),
        (&["recover", "--dry-run"], 2),
        (&["run", "ok.toml", "--json"], 0),
    ];
    for (args, code) in commands {
        let full = fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = common::settle(db)
            .args(args)
            .current_dir(dir.path())
            .stdout(full)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("settle: cannot write the output to standard output"),
            "{args:?}: {stderr}"
        );
    }
    // A pipe whose reader is gone: no failure.
    let mut listing = common::settle(db)
        .args(["sessions"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(listing.stdout.take());
    let out = listing.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
}

/// `settle chat` reads its prompts from standard input: one it cannot read
/// (a directory) is bad input, refused before a session is registered
/// (exit 2, one line, no database), not taken for a Ctrl-D that ends a
/// chat it opened and closed.
#[test]
fn g11_chat_refuses_a_standard_input_it_cannot_read() {
    let dir = common::open_tempdir();
    let before = snapshot(dir.path());
    let out = Command::new(settle_tests::settle_bin())
        .args(["chat", "--base-url", "http://127.0.0.1:9/v1"])
        .stdin(fs::File::open(dir.path()).unwrap())
        .current_dir(dir.path())
        .env_remove("SETTLE_DB")
        .env_remove("SETTLE_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("settle: ") && lines[0].contains("standard input"),
        "{stderr}"
    );
    assert_eq!(snapshot(dir.path()), before, "files changed");
}
