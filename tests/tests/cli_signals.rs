//! `settle run` interrupted: SIGTERM and SIGINT mid-run shut down gracefully
//! (G9) and exit 143 / 130; a second signal skips the drain; `kill -9` loses
//! nothing the run reported as persisted, and `settle recover` finalizes what
//! it left live (G7, G8).
//!
//! Each test writes a scenario with slow turns into its temporary folder,
//! waits for progress lines before it signals, and checks the store after.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use settle_tests::{
    assert_children_finalized_first, by_name, id_of, numbered, persisted_chunks, turn_toml,
    Running, Sandbox, PATIENCE,
};

/// A turn of `n` chunks named `prefix1..prefixN`, `delay_ms` apart.
fn turn(prefix: &str, n: usize, delay_ms: u64, extra: &str) -> String {
    format!("{}{extra}\n", turn_toml(&numbered(prefix, n), delay_ms))
}

fn agent(name: &str, parent: Option<&str>) -> String {
    match parent {
        Some(parent) => {
            format!("[[agent]]\nname = \"{name}\"\nparent = \"{parent}\"\nspawn_after_ms = 10\n")
        }
        None => format!("[[agent]]\nname = \"{name}\"\n"),
    }
}

/// A tree mid-turn for long enough to be interrupted: the root and "worker"
/// stream slowly for 12 s; "quick" ends its one short turn within any drain;
/// "stubborn", under the worker, ignores its cancellation.
fn slow_tree(sandbox: &Sandbox) -> String {
    let text = [
        "name = \"slow\"\nsettle_timeout_ms = 500\n".to_owned(),
        agent("root", None),
        turn("root", 60, 200, ""),
        agent("worker", Some("root")),
        turn("work", 60, 200, ""),
        agent("quick", Some("root")),
        turn("quick", 4, 150, ""),
        agent("stubborn", Some("worker")),
        turn(
            "stuck",
            60,
            200,
            "end = \"ignore_cancel\"\nignore_ms = 600000",
        ),
    ]
    .concat();
    sandbox
        .write("slow.toml", &text)
        .to_string_lossy()
        .into_owned()
}

/// Starts `settle run` on `scenario` with `options`, and waits until every
/// agent named in `streaming` has had a chunk persisted.
fn start(sandbox: &Sandbox, scenario: &str, options: &[&str], streaming: &[&str]) -> Running {
    let mut args = vec!["run"];
    args.extend_from_slice(options);
    args.push(scenario);
    let mut run = sandbox.spawn(&args);
    run.wait_for("every agent to stream", |out| {
        streaming.iter().all(|name| {
            out.lines()
                .any(|l| l.contains(&format!(" {name}#")) && l.contains(" persisted turn "))
        })
    });
    run
}

/// The turn numbers of `session` that completed.
fn completed_turns(shown: &Value) -> Vec<u64> {
    shown["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["outcome"] == "completed")
        .map(|t| t["no"].as_u64().unwrap())
        .collect()
}

/// G9 after a signal: every session finalized, children first, each with a
/// settled outcome; memory only from completed turns; nothing for
/// `recover` to do.
fn assert_shut_down_gracefully(sandbox: &Sandbox) -> Vec<Value> {
    let sessions = sandbox.sessions();
    assert_eq!(sessions.len(), 4, "{sessions:#?}");
    assert_children_finalized_first(&sessions);
    for session in &sessions {
        let name = session["name"].as_str().unwrap();
        let outcome = session["outcome"].as_str().unwrap();
        assert!(
            ["cancelled", "detached", "completed"].contains(&outcome),
            "{name}: outcome {outcome}"
        );
        let end = session["end_reason"].as_str().unwrap();
        if outcome == "completed" {
            // It ended its turns within the drain, and so finished on its own
            // or was swept by the shutdown.
            assert!(["completed", "shutdown"].contains(&end), "{name}: {end}");
        } else {
            assert_eq!(end, "shutdown", "{name} was cut by the shutdown");
        }
        // Memory only from completed turns, never from a cut one (G7, G9).
        let shown = sandbox.show(id_of(session));
        let completed = completed_turns(&shown);
        for (turn, _) in sandbox.memories(id_of(session)) {
            assert!(
                completed.contains(&u64::from(turn)),
                "{name}: memory from turn {turn}, which did not complete"
            );
        }
        for turn in shown["turns"].as_array().unwrap() {
            assert!(turn["outcome"].is_string(), "{name}: a turn left open");
        }
    }
    // The worker was mid-turn throughout: cut. The stubborn one ignored the
    // cancellation: detached after the settle timeout (G5).
    assert_eq!(by_name(&sessions, "worker")["outcome"], "cancelled");
    assert_eq!(by_name(&sessions, "stubborn")["outcome"], "detached");
    assert_eq!(
        sandbox.recover(),
        "recovered 0 sessions (0 interrupted turns)"
    );
    sessions
}

#[test]
fn g9_sigterm_mid_run_shuts_down_gracefully_and_exits_143() {
    let sandbox = Sandbox::new();
    let scenario = slow_tree(&sandbox);
    let mut run = start(
        &sandbox,
        &scenario,
        &["--drain-timeout", "300ms"],
        &["root", "worker", "stubborn"],
    );
    run.signal(Signal::SIGTERM);
    let (status, _) = run.wait();
    assert_eq!(status.code(), Some(143), "{}", run.stderr_text());
    let sessions = assert_shut_down_gracefully(&sandbox);
    // The root was mid-way through its 12-second turn.
    let root = by_name(&sessions, "root");
    assert_eq!(root["outcome"], "cancelled");
    assert_eq!(sandbox.memories(id_of(root)), []);
}

/// SIGHUP (the terminal went away) is a graceful shutdown too, and its exit
/// code, 129, is the one the help lists.
#[test]
fn g9_sighup_mid_run_shuts_down_gracefully_and_exits_129() {
    signal_mid_run(Signal::SIGHUP, 129);
}

/// `signal` mid-run on the slow tree: a graceful shutdown, exit `code`.
fn signal_mid_run(signal: Signal, code: i32) {
    let sandbox = Sandbox::new();
    let scenario = slow_tree(&sandbox);
    let mut run = start(
        &sandbox,
        &scenario,
        &["--drain-timeout", "300ms"],
        &["root", "worker", "stubborn"],
    );
    run.signal(signal);
    let (status, _) = run.wait();
    assert_eq!(status.code(), Some(code), "{}", run.stderr_text());
    assert_shut_down_gracefully(&sandbox);
}

/// Every exit code `settle` can end with is listed in its help.
#[test]
fn the_help_lists_every_exit_code() {
    let out = Sandbox::new().run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let section = help
        .split("Exit codes:")
        .nth(1)
        .unwrap_or_else(|| panic!("no exit codes in the help:\n{help}"));
    for (code, says) in [
        ("0", "done"),
        ("1", "root"),
        ("2", "bad input"),
        ("3", "store"),
        ("129", "SIGHUP"),
        ("130", "SIGINT"),
        ("143", "SIGTERM"),
    ] {
        assert!(
            section
                .lines()
                .any(|l| l.trim_start().starts_with(code) && l.contains(says)),
            "exit {code} ({says}) is not in:\n{section}"
        );
    }
}

#[test]
fn g9_sigint_mid_run_shuts_down_gracefully_and_exits_130() {
    signal_mid_run(Signal::SIGINT, 130);
}

#[test]
fn g9_a_second_signal_skips_the_drain() {
    // With a ten-minute drain, only the second signal can make the run end
    // before its 12-second turns do: the worker's turn is then cut, not
    // completed.
    let sandbox = Sandbox::new();
    let scenario = slow_tree(&sandbox);
    let mut run = start(
        &sandbox,
        &scenario,
        &["--drain-timeout", "10m"],
        &["root", "worker", "stubborn"],
    );
    run.signal(Signal::SIGTERM);
    // Signals that arrive together may be delivered as one: repeat the second
    // until the process is gone (every later one just skips the drain again).
    let start = Instant::now();
    let status = loop {
        if let Some(status) = run.exited_within(Duration::from_millis(300)) {
            break status;
        }
        assert!(start.elapsed() < PATIENCE, "the run did not end");
        run.signal(Signal::SIGTERM);
    };
    assert_eq!(status.code(), Some(143), "{}", run.stderr_text());
    let sessions = assert_shut_down_gracefully(&sandbox);
    assert_eq!(by_name(&sessions, "root")["outcome"], "cancelled");
}

#[test]
fn g7_g8_kill_9_loses_no_persisted_chunk_and_recover_finalizes_the_rest() {
    let sandbox = Sandbox::new();
    let text = [
        "name = \"crash\"\n".to_owned(),
        agent("root", None),
        turn("root", 100, 50, ""),
        agent("worker", Some("root")),
        turn("work", 100, 40, ""),
        agent("helper", Some("worker")),
        turn("help", 100, 30, ""),
    ]
    .concat();
    let scenario = sandbox.write("crash.toml", &text);
    let mut run = start(
        &sandbox,
        scenario.to_str().unwrap(),
        &[],
        &["root", "worker", "helper"],
    );
    run.wait_for("a dozen persisted chunks", |out| {
        persisted_chunks(out).len() >= 12
    });
    run.signal(Signal::SIGKILL);
    let (status, log) = run.wait();
    assert_eq!(status.code(), None, "killed by the signal");

    // Left live: nothing finalized, the turns open.
    let before = sandbox.sessions();
    assert_eq!(before.len(), 3);
    for session in &before {
        assert_ne!(session["state"], "finalized", "{session}");
    }

    // G7: every chunk printed as persisted is in the store, in order.
    let persisted = persisted_chunks(&log);
    assert!(persisted.len() >= 12, "{log}");
    let mut shown: BTreeMap<u64, Value> = BTreeMap::new();
    for p in &persisted {
        let detail = shown
            .entry(p.session)
            .or_insert_with(|| sandbox.show(p.session));
        let chunks = &detail["turns"][p.turn as usize - 1]["chunks"];
        assert_eq!(
            chunks[p.seq as usize],
            p.text.as_str(),
            "{p:?} lost:\n{detail:#}"
        );
    }
    // ... and printed in order: within a turn, 0, 1, 2, ...
    let mut next: BTreeMap<(u64, u32), u32> = BTreeMap::new();
    for p in &persisted {
        let seq = next.entry((p.session, p.turn)).or_insert(0);
        assert_eq!(p.seq, *seq, "{p:?} out of order");
        *seq += 1;
    }

    // G8: the process is gone (and reaped), so recovery on this host takes
    // its sessions over at once, children first; and only once.
    assert_eq!(
        sandbox.recover(),
        "recovered 3 sessions (3 interrupted turns)"
    );
    assert_eq!(
        sandbox.recover(),
        "recovered 0 sessions (0 interrupted turns)"
    );
    let after = sandbox.sessions();
    assert_children_finalized_first(&after);
    for session in &after {
        let name = session["name"].as_str().unwrap();
        assert_eq!(session["end_reason"], "recovered", "{name}");
        assert_eq!(session["outcome"], "interrupted", "{name}");
        let detail = sandbox.show(id_of(session));
        let turns = detail["turns"].as_array().unwrap();
        assert_eq!(turns.last().unwrap()["outcome"], "interrupted", "{name}");
        // The transcript is intact: what was there before recovery still is.
        assert_eq!(
            detail["turns"]
                .as_array()
                .map(|t| t.iter().map(|t| t["chunks"].clone()).collect::<Vec<_>>()),
            shown.get(&id_of(session)).map(|d| d["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["chunks"].clone())
                .collect::<Vec<_>>()),
            "{name}: transcript changed by recovery"
        );
        // An interrupted turn commits no memory.
        assert_eq!(sandbox.memories(id_of(session)), [], "{name}");
    }
}

/// The bound of a shutdown whose drain and settle timeout are both 1 s, with
/// room for a loaded machine: a run that ignored the signal would take two
/// minutes.
const BOUND: Duration = Duration::from_secs(8);

/// A root whose one turn takes 3 s, and a child that would spawn after two
/// minutes.
fn late_child(sandbox: &Sandbox) -> String {
    let text = [
        "name = \"late\"\nsettle_timeout_ms = 1000\n".to_owned(),
        agent("root", None),
        turn("root", 2, 1500, ""),
        "[[agent]]\nname = \"late\"\nparent = \"root\"\nspawn_after_ms = 120000\n".to_owned(),
        turn("late", 1, 10, ""),
    ]
    .concat();
    sandbox
        .write("late.toml", &text)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn g9_a_signal_while_an_agent_waits_to_spawn_ends_the_run_in_time() {
    let sandbox = Sandbox::new();
    let scenario = late_child(&sandbox);
    let mut run = start(&sandbox, &scenario, &["--drain-timeout", "1s"], &["root"]);
    let signalled = Instant::now();
    run.signal(Signal::SIGINT);
    let status = run
        .exited_within(BOUND)
        .unwrap_or_else(|| panic!("still running {BOUND:?} after SIGINT"));
    assert_eq!(status.code(), Some(130), "{}", run.stderr_text());
    assert!(signalled.elapsed() < BOUND);
    let sessions = sandbox.sessions();
    assert_eq!(
        sessions.len(),
        1,
        "the late child never registered: {sessions:#?}"
    );
    assert_eq!(sessions[0]["state"], "finalized");
    assert_eq!(sessions[0]["end_reason"], "shutdown");
}

#[test]
fn g9_a_second_signal_while_an_agent_waits_to_spawn_skips_the_drain() {
    let sandbox = Sandbox::new();
    let scenario = late_child(&sandbox);
    let mut run = start(&sandbox, &scenario, &["--drain-timeout", "10m"], &["root"]);
    run.signal(Signal::SIGINT);
    // A ten-minute drain: only the second signal can end the run now.
    assert!(run.exited_within(Duration::from_millis(500)).is_none());
    run.signal(Signal::SIGINT);
    let status = run
        .exited_within(BOUND)
        .unwrap_or_else(|| panic!("the second SIGINT did not end the run within {BOUND:?}"));
    assert_eq!(status.code(), Some(130), "{}", run.stderr_text());
    let sessions = sandbox.sessions();
    assert_eq!(sessions[0]["state"], "finalized");
    assert_eq!(sessions[0]["outcome"], "cancelled");
}

#[test]
fn g9_a_parent_finishing_during_the_drain_spares_its_childrens_turns() {
    let sandbox = Sandbox::new();
    let text = [
        "name = \"drain\"\n".to_owned(),
        agent("root", None),
        turn("r", 2, 300, ""),
        turn("again", 20, 250, ""),
        agent("child", Some("root")),
        turn("c", 8, 400, ""),
    ]
    .concat();
    let scenario = sandbox
        .write("drain.toml", &text)
        .to_string_lossy()
        .into_owned();
    let mut run = start(&sandbox, &scenario, &["--drain-timeout", "10s"], &["child"]);
    run.signal(Signal::SIGINT);
    let (status, _) = run.wait();
    assert_eq!(status.code(), Some(130), "{}", run.stderr_text());
    let sessions = sandbox.sessions();
    assert_children_finalized_first(&sessions);
    let child = by_name(&sessions, "child");
    assert_eq!(child["outcome"], "completed", "{child}");
    assert_eq!(child["chunks"], 8, "the child's turn was cut: {child}");
    for session in &sessions {
        assert_eq!(session["end_reason"], "shutdown", "{session}");
    }
}

/// What the kernel of process `pid` waits in (Linux), e.g. `pipe_write`.
fn waits_in(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

#[test]
fn g9_a_second_signal_while_run_writes_its_summary_lets_it_finish_and_exit_130() {
    use std::io::Read;
    use std::process::Stdio;
    let sandbox = Sandbox::new();
    // Enough sessions that `--json` outgrows a pipe's buffer, which this
    // test does not read: the run is then held writing its summary.
    let scenario = sandbox.write(
        "fan.toml",
        "name = \"fan\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = [\"a\", \"b\"]\nchunk_delay_ms = 60000\n\
         [[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 600\n[[agent.turn]]\nchunks = [\"x\"]\n",
    );
    let mut child = sandbox
        .command(&[
            "run",
            scenario.to_str().unwrap(),
            "--json",
            "--drain-timeout",
            "0ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let signal = |s: Signal| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()), s).unwrap();
    };
    // Once the agents run (the root's turn is mid-stream for a minute).
    let started = Instant::now();
    let listed = || {
        let out = sandbox.run(&["sessions", "--json"]);
        match out.status.success() {
            true => serde_json::from_slice::<Vec<Value>>(&out.stdout).map_or(0, |rows| rows.len()),
            false => 0,
        }
    };
    while listed() < 601 {
        assert!(started.elapsed() < PATIENCE, "the agents never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(Signal::SIGINT);
    while !waits_in(pid).contains("pipe") {
        assert!(
            started.elapsed() < PATIENCE,
            "the run never got to write its summary ({})",
            waits_in(pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Mid-summary: the drain is over, so there is nothing to skip.
    let waited = waits_in(pid);
    signal(Signal::SIGINT);
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "{status:?}, waiting in {waited}, {} bytes",
        out.len()
    );
    let summary: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("the summary was cut ({} bytes): {e}", out.len()));
    assert_eq!(summary["exit"], 130);
    assert_eq!(summary["sessions"].as_array().unwrap().len(), 601);
}
