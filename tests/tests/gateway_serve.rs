//! `settle serve`, the binary: seed 004 with a real signal (SIGTERM mid-turn:
//! the running session drained, the idle one finalized at once, the closed
//! one left alone, exit 143), SIGINT (exit 130), bad options refused before
//! anything is written, and `sessions.list` answering what `settle sessions
//! --json` prints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod gateway_support;

use gateway_support::{connect, Client};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use settle_tests::{by_name, numbered, Running, Sandbox, PATIENCE};

/// Starts `settle serve` on a free port with the script book; its address.
fn serve(sandbox: &Sandbox, extra: &[&str]) -> (Running, String) {
    let book = settle_tests::long_book(sandbox);
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--scripted", &book];
    args.extend_from_slice(extra);
    let mut serving = sandbox.spawn(&args);
    let addr = serving.listening_address();
    (serving, addr)
}

async fn create(client: &mut Client, name: &str) -> u64 {
    client.ok("session.create", json!({ "name": name })).await["id"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_seed_004_sigterm_mid_turn_drains_it_finalizes_the_idle_one_and_exits_143() {
    let sandbox = Sandbox::new();
    let (mut serving, addr) = serve(&sandbox, &["--drain-timeout", "20s"]);
    let mut client = connect(&addr).await;
    let running = create(&mut client, "running").await;
    let idle = create(&mut client, "idle").await;
    let done = create(&mut client, "done").await;
    client.ok("session.close", json!({ "id": done })).await;
    assert_eq!(client.expect("session.finalized").await["id"], done);
    client
        .ok("turn.start", json!({ "id": running, "prompt": "long" }))
        .await;
    assert_eq!(client.expect("turn.chunk").await["text"], "l1");

    serving.signal(Signal::SIGTERM);
    // Everything from here to the close: the rest of the turn (some chunks
    // may come before the notice), the notice, the two ends.
    let seen = client.until_closed().await;
    let notice = seen
        .iter()
        .position(|m| m["method"] == "server.shutdown")
        .unwrap_or_else(|| panic!("no server.shutdown: {seen:#?}"));
    assert_eq!(seen[notice]["params"], json!({ "drain_ms": 20_000 }));
    assert!(
        seen[..notice].iter().all(|m| m["method"] == "turn.chunk"),
        "{seen:#?}"
    );
    let finalized: Vec<&Value> = seen
        .iter()
        .filter(|m| m["method"] == "session.finalized")
        .map(|m| &m["params"])
        .collect();
    assert_eq!(
        finalized,
        [
            &json!({ "id": idle, "end_reason": "shutdown" }),
            &json!({ "id": running, "end_reason": "shutdown" })
        ],
        "{seen:#?}"
    );
    let chunks: Vec<&str> = seen
        .iter()
        .filter(|m| m["method"] == "turn.chunk")
        .map(|m| m["params"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(chunks, numbered("l", 20)[1..]);
    let ended = seen
        .iter()
        .position(|m| m["method"] == "turn.ended")
        .unwrap();
    let running_end = seen
        .iter()
        .position(|m| m["params"] == json!({ "id": running, "end_reason": "shutdown" }))
        .unwrap();
    assert!(
        ended < running_end,
        "finalized before its turn ended: {seen:#?}"
    );
    assert_eq!(seen[ended]["params"]["outcome"], "completed");

    let status = serving.exits_within(PATIENCE, "the gateway after SIGTERM");
    assert_eq!(status.code(), Some(143), "{}", serving.stderr_text());
    let sessions = sandbox.sessions();
    let row = by_name(&sessions, "running");
    assert_eq!(row["end_reason"], "shutdown");
    assert_eq!(row["outcome"], "completed");
    assert_eq!(row["chunks"], 20);
    assert_eq!(by_name(&sessions, "idle")["end_reason"], "shutdown");
    assert_eq!(by_name(&sessions, "done")["end_reason"], "user_close");
    // The closed one was finalized once, and not touched by the sweep.
    let timeline = sandbox.show(done)["timeline"].clone();
    let finalizes = timeline
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["to"] == "finalized")
        .count();
    assert_eq!(finalizes, 1, "{timeline:#}");
}

/// G8: a process that cannot commit (another process holds the database's
/// write lock past its lease) stops and exits 3, and the signals that come
/// meanwhile do not end it by the signal instead: not while it shuts down,
/// not after its kernel stopped while it says what it left and lets its
/// store go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_g9_a_store_locked_past_the_lease_exits_3_whatever_signals_come_meanwhile() {
    let sandbox = Sandbox::new();
    let (mut serving, addr) = serve(&sandbox, &["--drain-timeout", "1s", "--lease-ttl", "2s"]);
    let mut client = connect(&addr).await;
    create(&mut client, "idle").await;
    let db = sandbox.db();
    let Some(lock) = common::SqliteLock::take(db.to_str().unwrap()) else {
        return;
    };
    // SIGTERM every 50 ms until it exits: one lands in every phase of the
    // stop, the window between the kernel's stop and the exit included.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = serving.exited_within(std::time::Duration::from_millis(50)) {
            break status;
        }
        assert!(started.elapsed() < PATIENCE, "it did not exit");
        serving.signal(Signal::SIGTERM);
    };
    lock.release();
    assert_eq!(
        (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status)
        ),
        (Some(3), None),
        "{}",
        serving.stderr_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_finalizes_every_session_and_exits_130_and_sessions_list_is_settle_sessions_json() {
    let sandbox = Sandbox::new();
    let (mut serving, addr) = serve(&sandbox, &[]);
    let mut client = connect(&addr).await;
    let id = create(&mut client, "one").await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    client.turn(id).await;
    let listed = client.ok("sessions.list", json!({})).await;
    assert_eq!(Value::Array(sandbox.sessions()), listed["sessions"]);
    assert_eq!(listed["next_cursor"], Value::Null);

    serving.signal(Signal::SIGINT);
    assert_eq!(
        client.expect("server.shutdown").await,
        json!({ "drain_ms": 5_000 })
    );
    assert_eq!(
        client.expect("session.finalized").await,
        json!({ "id": id, "end_reason": "shutdown" })
    );
    assert!(client.until_closed().await.is_empty());
    let status = serving.exits_within(PATIENCE, "the gateway after SIGTERM");
    assert_eq!(status.code(), Some(130), "{}", serving.stderr_text());
    assert_eq!(sandbox.sessions()[0]["end_reason"], "shutdown");
}

#[test]
fn g11_bad_options_are_refused_with_exit_2_before_the_store_is_touched() {
    let sandbox = Sandbox::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let book = settle_tests::long_book(&sandbox);
    let bad_book = sandbox
        .write("bad.toml", "[default]\nchunks = [\"a\"]\nend = \"later\"\n")
        .to_string_lossy()
        .into_owned();
    for args in [
        vec!["serve", "--listen", &taken, "--scripted", &book],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--scripted",
            "missing.toml",
        ],
        vec!["serve", "--listen", "127.0.0.1:0", "--scripted", &bad_book],
        vec!["serve", "--listen", "nowhere", "--scripted", &book],
        vec!["serve", "--max-sessions", "0", "--scripted", &book],
        vec!["serve", "--orphan-grace", "soon", "--scripted", &book],
    ] {
        let out = sandbox.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(!sandbox.db().exists(), "{args:?} created the database");
    }
}

/// A gateway killed mid-turn and started again by its supervisor with
/// `--recover` ends what its crashed run left live before it serves (as
/// `settle recover` does: only owners whose lease ran out or whose process
/// is gone), so its clients find those sessions ended `recovered`, their
/// turn `interrupted`, and can resume them, with no operator. Without it,
/// they are left for `settle recover` (`left_for_recovery`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_gateway_started_with_recover_ends_what_its_crashed_run_left() {
    let sandbox = Sandbox::new();
    let (mut serving, addr) = serve(&sandbox, &[]);
    let mut client = connect(&addr).await;
    let running = create(&mut client, "running").await;
    let idle = create(&mut client, "idle").await;
    client
        .ok("turn.start", json!({ "id": running, "prompt": "long" }))
        .await;
    assert_eq!(client.expect("turn.chunk").await["text"], "l1");
    serving.signal(Signal::SIGKILL);
    serving.exits_within(PATIENCE, "the gateway after SIGKILL");

    let (mut serving, addr) = serve(&sandbox, &["--recover"]);
    let mut client = connect(&addr).await;
    let listed = client.ok("sessions.list", json!({})).await;
    let rows = listed["sessions"].as_array().unwrap();
    for name in ["running", "idle"] {
        let row = by_name(rows, name);
        assert_eq!(row["state"], "finalized", "{rows:#?}");
        assert_eq!(row["end_reason"], "recovered", "{rows:#?}");
    }
    let read = client.ok("session.read", json!({ "id": running })).await;
    assert_eq!(read["outcome"], "interrupted", "{read:#?}");
    assert_eq!(read["chunks"][0]["text"], "l1", "{read:#?}");
    assert_eq!(
        client
            .refused("session.attach", json!({ "id": idle }))
            .await,
        "session_closed"
    );
    serving.signal(Signal::SIGTERM);
    serving.exits_within(PATIENCE, "the gateway after SIGTERM");
}
