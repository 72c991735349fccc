//! Crash loops (G2, G7, G8, G9): `settle run` on a random agent tree, killed
//! at a random moment, over and over.
//!
//! - SIGKILL: then `settle recover`, and every session is finalized exactly
//!   once, every chunk the run reported as persisted is there and in order,
//!   no memory comes from an interrupted turn, a recovered session is
//!   finalized by the recovery alone, and a second recovery finds nothing.
//! - SIGTERM: the run shuts down by itself (exit 143) within its budget, and
//!   the database satisfies G9 with no recovery: nothing left live, no turn
//!   interrupted, no session finalized while running.
//!
//! `SETTLE_SOAK_ITERATIONS` sets the number of runs (default 30 each),
//! `SETTLE_SOAK_SEED` the first seed (default from the clock; printed). Each
//! seed fixes the tree, the timings and the moment of the signal; a failure
//! prints the command that repeats it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{check_db, memory_turns, random_scenario, Ending, Rng, Running, Shape};

const DEFAULT_ITERATIONS: usize = 30;

fn repro(test: &str, seed: u64) -> String {
    format!(
        "SETTLE_SOAK_SEED={seed} SETTLE_SOAK_ITERATIONS=1 cargo test -p settle-tests --test crash_loop {test} -- --nocapture"
    )
}

fn soak(test: &str, one: fn(u64) -> Result<String, String>) {
    let (iterations, first) = common::soak_knobs(DEFAULT_ITERATIONS);
    eprintln!("{test}: {iterations} iterations from seed {first}");
    let started = Instant::now();
    let mut failures = Vec::new();
    for i in 0..iterations {
        let seed = first + i as u64;
        match one(seed) {
            Ok(summary) => eprintln!("  seed {seed}: {summary}"),
            Err(error) => {
                eprintln!(
                    "  seed {seed}: FAILED\n{error}\n  reproduce: {}",
                    repro(test, seed)
                );
                failures.push(seed);
            }
        }
    }
    eprintln!(
        "{test}: {iterations} iterations in {:?}, {} failed",
        started.elapsed(),
        failures.len()
    );
    if let Some(seed) = failures.first() {
        panic!(
            "{} of {iterations} iterations failed (seeds {failures:?}); reproduce the first with:\n  {}",
            failures.len(),
            repro(test, *seed)
        );
    }
}

/// A random tree, run, killed with SIGKILL at a random moment, recovered.
fn kill_and_recover(seed: u64) -> Result<String, String> {
    let mut rng = Rng::new(seed);
    let scenario = random_scenario(&mut rng, Shape::default());
    let dir = tempfile::tempdir().unwrap();
    let db = common::db_in(dir.path());
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, &scenario.toml).unwrap();
    // Up to about the run's end (some runs finish first); the process needs
    // some 20 ms to open the database and start.
    let kill_at = Duration::from_millis(rng.range(0, scenario.estimate_ms + 20));

    let mut run = Running::start(&db, &file, &[]);
    std::thread::sleep(kill_at.saturating_sub(run.started.elapsed()));
    let killed = run.child.try_wait().unwrap().is_none();
    if killed {
        let _ = run.child.kill();
    }
    let run = run.finish(Duration::from_secs(10));
    let context = || {
        format!(
            "scenario:\n{}\nkill at {kill_at:?}\n{}",
            scenario.toml,
            run.describe()
        )
    };
    if run.stderr.contains("panicked") {
        return Err(format!("settle panicked\n{}", context()));
    }
    match (run.signal(), run.status.code()) {
        (Some(9), _) if killed => {}
        // It ended by itself before the kill: done, or the root failed.
        (None, Some(0 | 1)) => {}
        _ => return Err(format!("unexpected end of the run\n{}", context())),
    }
    // A file may not exist yet if the kill came before the database was made.
    if !dir.path().join("settle.db").exists() {
        return Ok(format!(
            "killed at {kill_at:?}, before the database existed"
        ));
    }
    let before = common::DbView::read(&db).map_err(|e| format!("{e}\n{}", context()))?;
    let live = before.live().len();
    let recovered = common::recover(&db).map_err(|e| format!("{e}\n{}", context()))?;
    if recovered != live {
        return Err(format!(
            "`settle recover` recovered {recovered} sessions, but {live} were live: {:?}\n{}",
            before.live(),
            context()
        ));
    }
    let again = common::recover(&db)?;
    if again != 0 {
        return Err(format!(
            "a second `settle recover` recovered {again} more\n{}",
            context()
        ));
    }
    let memories = memory_turns(&db);
    let persisted = run.persisted();
    let view = check_db(
        &db,
        &memories,
        &persisted,
        &scenario.scripted,
        Ending::Recovered,
    )
    .map_err(|e| format!("{e}\n{}", context()))?;
    Ok(format!(
        "{} at {kill_at:?}: {} sessions, {live} recovered, {} chunks reported persisted",
        if killed { "killed" } else { "finished" },
        view.sessions.len(),
        persisted.len()
    ))
}

/// A random tree, run, sent SIGTERM at a random moment after it started:
/// the graceful shutdown (G9) alone must leave the database in order.
fn terminate(seed: u64) -> Result<String, String> {
    let mut rng = Rng::new(seed);
    let scenario = random_scenario(&mut rng, Shape::default());
    let dir = tempfile::tempdir().unwrap();
    let db = common::db_in(dir.path());
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, &scenario.toml).unwrap();
    let drain = rng.range(0, 300);
    let settle_timeout = rng.range(50, 200);
    let signal_after = Duration::from_millis(rng.range(0, scenario.root_ms));
    let drain_arg = format!("{drain}ms");
    let settle_arg = format!("{settle_timeout}ms");
    let run = Running::start(
        &db,
        &file,
        &[
            "--drain-timeout",
            &drain_arg,
            "--settle-timeout",
            &settle_arg,
        ],
    );
    // The signal handlers are in place once the root is registered.
    if !run.wait_for_line("registered (root)", Duration::from_secs(10)) {
        return Err(format!(
            "the root never registered\n{}",
            run.finish(Duration::ZERO).describe()
        ));
    }
    std::thread::sleep(signal_after);
    let mut run = run;
    let signalled = run.child.try_wait().unwrap().is_none();
    let sent = Instant::now();
    if signalled {
        common::send_signal(run.pid(), "TERM");
    }
    // Bounded: drain + settle timeout + a margin (SPEC §7).
    let budget = Duration::from_millis(drain + settle_timeout) + Duration::from_secs(3);
    let run = run.finish(budget + Duration::from_secs(5));
    let took = sent.elapsed();
    let context = || {
        format!(
            "scenario:\n{}\nSIGTERM {signal_after:?} after the root registered, drain {drain} ms, settle {settle_timeout} ms\n{}",
            scenario.toml,
            run.describe()
        )
    };
    if run.stderr.contains("panicked") {
        return Err(format!("settle panicked\n{}", context()));
    }
    match (run.status.code(), run.signal()) {
        (Some(143), _) if signalled => {}
        // The run had ended, or was ending, when the signal came.
        (Some(0 | 1), _) => {}
        // The kernel had stopped and the process was exiting when the
        // signal came: a signal after the shutdown gets its default action
        // back (`settle_runtime::signals`), so it ended the process. That
        // is only right if nothing was left running, which the checks below
        // make sure of (no session for `settle recover`, every one finalized
        // as the scenario says).
        (None, Some(15)) if signalled => {}
        _ => return Err(format!("unexpected end of the run\n{}", context())),
    }
    if signalled && took > budget {
        return Err(format!(
            "the shutdown took {took:?}, over its budget of {budget:?}\n{}",
            context()
        ));
    }
    let recovered = common::recover(&db).map_err(|e| format!("{e}\n{}", context()))?;
    if recovered != 0 {
        return Err(format!(
            "a graceful shutdown left {recovered} sessions for `settle recover`\n{}",
            context()
        ));
    }
    let memories = memory_turns(&db);
    let persisted = run.persisted();
    let view = check_db(
        &db,
        &memories,
        &persisted,
        &scenario.scripted,
        Ending::Graceful,
    )
    .map_err(|e| format!("{e}\n{}", context()))?;
    Ok(format!(
        "exit {:?} {took:?} after SIGTERM at {signal_after:?}: {} sessions, {} chunks reported persisted",
        run.status.code(),
        view.sessions.len(),
        persisted.len()
    ))
}

#[test]
fn g7_g8_crash_loop_sigkill_then_recover() {
    soak("g7_g8_crash_loop_sigkill_then_recover", kill_and_recover);
}

#[test]
fn g9_crash_loop_sigterm_shuts_down_gracefully() {
    soak("g9_crash_loop_sigterm_shuts_down_gracefully", terminate);
}
