//! A store that stops answering under `settle run` (G8, G9), made with real
//! faults: every process of a PostgreSQL server stopped with SIGSTOP (its
//! host still acknowledges TCP, so nothing fails: it just never answers),
//! mid-run, and a SQLite database held
//! by the `sqlite3` shell in `BEGIN EXCLUSIVE` for longer than the run.
//!
//! Each time `settle` gets SIGTERM while the store is stalled, and must:
//! exit within drain + settle timeout + flush budget + 1 s, with code 3 and
//! one line on stderr that says how many sessions it left and to run
//! `settle recover`; once the store answers again, `settle recover` must
//! finalize exactly those, and every chunk the run printed as persisted must
//! be in the store, in order.
//!
//! The PostgreSQL server is a cluster this test binary starts for itself
//! (never a shared one: it is stopped), found by its data folder. Knobs:
//! `SETTLE_STALL_ITERATIONS` (how many runs of each case; default 1) and `SETTLE_SOAK_SEED` (the moment of the fault; printed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{check_db, memory_turns, Ending, Rng, Running, Scripted};

const DRAIN: Duration = Duration::from_secs(1);
/// The scenarios' `settle_timeout_ms`.
const SETTLE: Duration = Duration::from_secs(1);
/// The runtime's default, given explicitly.
const FLUSH_BUDGET: Duration = Duration::from_secs(2);
const MARGIN: Duration = Duration::from_secs(1);
const ARGS: [&str; 4] = ["--drain-timeout", "1s", "--flush-budget", "2s"];

/// The exit bound of G9 these runs are held to.
fn bound() -> Duration {
    DRAIN + SETTLE + FLUSH_BUDGET + MARGIN
}

/// One run at a time: the bound is measured (two runs at once on two cores
/// would measure each other), and the PostgreSQL cases stop the same server.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A scenario of `agents` (the first the root, the others its children,
/// spawned `spawn_ms` after it), each streaming `turns` turns of `chunks`
/// chunks `delay_ms` apart.
fn scenario(
    agents: usize,
    turns: usize,
    chunks: usize,
    delay_ms: u64,
    spawn_ms: u64,
) -> (String, Scripted) {
    staggered(agents, turns, chunks, delay_ms, spawn_ms, 0)
}

/// [`scenario`] with child `a` spawned `spawn_ms + a * step_ms` after the
/// root: a steady stream of registrations.
fn staggered(
    agents: usize,
    turns: usize,
    chunks: usize,
    delay_ms: u64,
    spawn_ms: u64,
    step_ms: u64,
) -> (String, Scripted) {
    let mut toml = format!(
        "name = \"stall\"\nsettle_timeout_ms = {}\n",
        SETTLE.as_millis()
    );
    let mut scripted = BTreeMap::new();
    for a in 0..agents {
        let name = format!("a{a}");
        toml.push_str(&format!("\n[[agent]]\nname = \"{name}\"\n"));
        if a > 0 {
            let at = spawn_ms + a as u64 * step_ms;
            toml.push_str(&format!("parent = \"a0\"\nspawn_after_ms = {at}\n"));
        }
        let mut script = Vec::new();
        for t in 1..=turns {
            let texts: Vec<String> = (0..chunks).map(|k| format!("{name}-t{t}-c{k}")).collect();
            toml.push_str(&settle_tests::turn_toml(&texts, delay_ms));
            script.push(texts);
        }
        scripted.insert(name, script);
    }
    (toml, scripted)
}

/// What one stalled run came to.
struct Figures {
    took: Duration,
    left: usize,
    sessions: usize,
    acknowledged: usize,
}

/// Sends SIGTERM to `run` while its store is stalled, then checks what G8
/// and G9 ask once `resume` has made the store answer again. With `exact`,
/// the count `settle` printed must be the number of sessions the store holds
/// unfinalized; without (registrations were in flight), at least that many
/// and at most the number it registered (a registration that timed out may
/// or may not have reached the store, so its session is counted as left).
fn sigterm_on_a_stalled_store(
    fault: &str,
    run: Running,
    resume: impl FnOnce(),
    db: &str,
    scripted: &Scripted,
    exact: bool,
) -> Figures {
    let sent = Instant::now();
    common::send_signal(run.pid(), "TERM");
    let run = run.finish(Duration::from_secs(30));
    let took = sent.elapsed();
    resume();
    let context = || format!("fault: {fault}\n{}", run.describe());
    assert!(!run.timed_out, "the run never ended\n{}", context());
    assert!(
        !run.stderr.contains("panicked"),
        "settle panicked\n{}",
        context()
    );
    assert_eq!(run.status.code(), Some(3), "not exit 3\n{}", context());
    assert!(
        took <= bound(),
        "exited {took:?} after SIGTERM, over the bound of {:?} (drain + settle timeout + flush budget + 1 s)\n{}",
        bound(),
        context()
    );

    // One line on stderr from settle itself (the rest is the log).
    let said = run.said();
    assert_eq!(said.len(), 1, "not one line from settle\n{}", context());
    let line = said[0];
    assert!(
        line.contains("left unfinalized") && line.contains("`settle recover`"),
        "the line does not say what was left and what to run: {line}"
    );
    let left: usize = line
        .strip_prefix("settle: up to ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    assert!(left > 0, "{line}");

    // The store answers again: what it holds unfinalized is what was left.
    let live = common::DbView::read(db)
        .unwrap_or_else(|e| panic!("{e}\n{}", context()))
        .live()
        .len();
    let registered = run
        .lines
        .iter()
        .filter(|l| l.contains(" registered "))
        .count();
    if exact {
        assert_eq!(
            left,
            live,
            "settle said {left} left, the store holds {live} unfinalized\n{}",
            context()
        );
    } else {
        assert!(
            live <= left && left <= registered,
            "settle said {left} left, the store holds {live} unfinalized of {registered} registered\n{}",
            context()
        );
    }
    let recovered = common::recover(db).unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert_eq!(
        recovered,
        live,
        "`settle recover` finalized another number\n{}",
        context()
    );
    assert_eq!(
        common::recover(db).unwrap(),
        0,
        "a second recovery found more"
    );
    let persisted = run.persisted();
    // When every session was left, every one is `recovered`, and only those
    // may hold an interrupted turn.
    let ending = if exact {
        Ending::Recovered
    } else {
        Ending::StoreFault
    };
    let view = check_db(db, &memory_turns(db), &persisted, scripted, ending)
        .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    Figures {
        took,
        left,
        sessions: view.sessions.len(),
        acknowledged: persisted.len(),
    }
}

/// Runs `case` `iterations` times from `seed` on, then prints the figures:
/// every run held the bound (a failing run panics with its seed), and the
/// worst exit time against the bound.
fn soak(name: &str, iterations: usize, seed: u64, mut case: impl FnMut(u64) -> Option<Figures>) {
    let mut worst = Duration::ZERO;
    let mut done = 0;
    let started = Instant::now();
    for i in 0..iterations as u64 {
        let Some(figures) = case(seed + i) else {
            return;
        };
        eprintln!(
            "{name} seed {}: exit 3 {:?} after SIGTERM (bound {:?}), {} sessions said left, {} in the store, every one recovered once, {} acknowledged chunks kept",
            seed + i,
            figures.took,
            bound(),
            figures.left,
            figures.sessions,
            figures.acknowledged
        );
        worst = worst.max(figures.took);
        done += 1;
    }
    eprintln!(
        "{name}: {done}/{iterations} within the bound, worst exit {worst:?} against {:?}, in {:?}",
        bound(),
        started.elapsed()
    );
}

/// What moment of a run a stall lands at: waits for it (from `rng`) and says
/// what it waited for.
type Moment = fn(&Running, &mut Rng, u64) -> String;

/// Runs a stalled-PostgreSQL case: `settle run` of `scenario` on a fresh
/// database of the suite's own cluster, every server process stopped at
/// `moment`, then SIGTERM; `exact` as in [`sigterm_on_a_stalled_store`].
fn postgres_stopped(name: &str, scenario: (String, Scripted), moment: Moment, exact: bool) {
    let _one = one_at_a_time();
    let Some(cluster) = common::own_cluster() else {
        return;
    };
    let (_, seed) = common::soak_knobs(0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stall.toml");
    let (toml, scripted) = scenario;
    std::fs::write(&file, toml).unwrap();
    soak(
        name,
        common::knob("SETTLE_STALL_ITERATIONS", 1),
        seed,
        |seed| {
            let mut rng = Rng::new(seed);
            let pg = common::PgDb::new(&cluster.admin_url);
            let run = Running::start(&pg.url, &file, &ARGS);
            let after = moment(&run, &mut rng, seed);
            let stopped = cluster.stop();
            let fault = format!(
                "seed {seed}: PostgreSQL stopped (SIGSTOP to its {} processes) after {after}, then SIGTERM",
                stopped.processes()
            );
            Some(sigterm_on_a_stalled_store(
                &fault,
                run,
                || stopped.resume(),
                &pg.url,
                &scripted,
                exact,
            ))
        },
    );
}

/// Waits until 2 to 8 chunks were persisted.
fn mid_turn(run: &Running, rng: &mut Rng, seed: u64) -> String {
    let after = rng.range(2, 8);
    assert!(
        run.wait_for_line(
            &format!("persisted turn 1 chunk {after}"),
            Duration::from_secs(20)
        ),
        "seed {seed}: the run did not get going"
    );
    format!("chunk {after}")
}

/// Case 1: PostgreSQL stopped mid-run (a root and two children, each one
/// turn of 20 chunks 50 ms apart, stopped after 2 to 8 chunks), then SIGTERM.
#[test]
fn g9_postgres_stopped_mid_run_then_sigterm() {
    postgres_stopped(
        "postgres stopped mid-run",
        scenario(3, 1, 20, 50, 5),
        mid_turn,
        true,
    );
}

/// Case 3: a SQLite database held by the `sqlite3` shell in `BEGIN
/// EXCLUSIVE` from mid-run until after `settle` has exited (longer than the
/// run, and than the store's 5 s busy timeout), with SIGTERM meanwhile.
#[test]
fn g9_sqlite_locked_by_another_process_for_longer_than_the_run() {
    let _one = one_at_a_time();
    let (_, seed) = common::soak_knobs(0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stall.toml");
    let (toml, scripted) = scenario(3, 1, 20, 50, 5);
    std::fs::write(&file, toml).unwrap();
    soak(
        "sqlite locked by the sqlite3 shell",
        common::knob("SETTLE_STALL_ITERATIONS", 1),
        seed,
        |seed| {
            let mut rng = Rng::new(seed);
            let data = tempfile::tempdir().unwrap();
            let db = common::db_in(data.path());
            let run = Running::start(&db, &file, &ARGS);
            let after = mid_turn(&run, &mut rng, seed);
            let lock = common::SqliteLock::take(&db)?;
            // Let the run meet the lock before the signal.
            std::thread::sleep(Duration::from_millis(300));
            let fault = format!(
                "seed {seed}: SQLite held in BEGIN EXCLUSIVE by the sqlite3 shell after {after}, then SIGTERM"
            );
            Some(sigterm_on_a_stalled_store(
                &fault,
                run,
                || lock.release(),
                &db,
                &scripted,
                true,
            ))
        },
    );
}

/// Case 2: PostgreSQL stopped during a burst of registrations (forty
/// children spawned 15 ms apart; stopped after 3 to 12 of them registered),
/// then SIGTERM. A registration the store cannot commit fails instead of
/// hanging; what was left is counted as left (it may or may not have reached
/// the store).
#[test]
fn g9_postgres_stopped_during_a_burst_of_registrations_then_sigterm() {
    postgres_stopped(
        "postgres stopped during registrations",
        staggered(41, 1, 10, 100, 100, 15),
        |run, rng, seed| {
            let after = rng.range(3, 12) as usize;
            let deadline = Instant::now() + Duration::from_secs(20);
            // The root's line, then one per child.
            while run.count_lines(" registered ") < after + 1 {
                assert!(
                    Instant::now() < deadline,
                    "seed {seed}: the registrations did not come"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            format!("{after} children registered")
        },
        false,
    );
}

/// The lease TTL the paused-process case runs with, and how long the
/// process stays stopped (past it).
const LEASE_TTL: Duration = Duration::from_secs(2);
const PAUSE: Duration = Duration::from_millis(3_500);

/// Case 4: the `settle` process itself stopped (SIGSTOP) for longer than its
/// lease, while a `settle recover` in another process finalizes its
/// sessions. Continued (SIGCONT), it must notice the loss, write nothing as
/// the owner of the expired lease, stop and exit 3 with one line; every
/// session is finalized exactly once (by the recovery), and every chunk it
/// printed as persisted is in the store.
fn lease_expires_while_paused(db: &str, seed: u64, file: &std::path::Path, scripted: &Scripted) {
    let mut rng = Rng::new(seed);
    let ttl = format!("{}ms", LEASE_TTL.as_millis());
    let run = Running::start(db, file, &["--drain-timeout", "1s", "--lease-ttl", &ttl]);
    let after = rng.range(2, 6);
    assert!(
        run.wait_for_line(
            &format!("persisted turn 1 chunk {after}"),
            Duration::from_secs(20)
        ),
        "seed {seed}: the run did not get going"
    );
    // Until the lease has expired by the store's clock, a recovery must not
    // take the sessions of a live (if stopped) owner.
    let (paused, early) = stop_between_writes(&run, db, seed);
    std::thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
    let recovered = common::recover(db).unwrap();
    // What the store holds once the recovery took the sessions: the owner of
    // the expired lease must not change any of it.
    let at_recovery = common::DbView::read(db).unwrap();
    common::send_signal(run.pid(), "CONT");
    let resumed = Instant::now();
    let run = run.finish(Duration::from_secs(30));
    let took = resumed.elapsed();
    let context = || format!("seed {seed}, {db}\n{}", run.describe());
    assert_eq!(early, 0, "recovered a live owner's sessions\n{}", context());
    assert!(!run.timed_out, "the run never ended\n{}", context());
    assert_eq!(run.status.code(), Some(3), "not exit 3\n{}", context());
    assert!(
        took <= Duration::from_secs(5),
        "took {took:?} after SIGCONT to stop\n{}",
        context()
    );
    let said = run.said();
    assert_eq!(said.len(), 1, "not one line from settle\n{}", context());
    assert!(
        said[0].contains("lost its lease") && said[0].contains("`settle recover`"),
        "the line does not say the lease was lost: {}",
        said[0]
    );
    let view = common::DbView::read(db).unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert_eq!(
        recovered,
        view.sessions.len(),
        "the concurrent recovery did not take every session\n{}",
        context()
    );
    assert!(view.live().is_empty(), "{}", context());
    assert_eq!(
        common::recover(db).unwrap(),
        0,
        "a second recovery found more"
    );
    // Nothing was written after the loss: every session reads as the
    // recovery left it. (A chunk committed just before the stop may be
    // printed only after SIGCONT, so the printed lines are not the measure;
    // the store is. `check_db` then finds every printed chunk in it.)
    for (id, detail) in &at_recovery.details {
        assert_eq!(
            view.details.get(id),
            Some(detail),
            "session {id} changed after its recovery\n{}",
            context()
        );
    }
    let persisted = run.persisted();
    check_db(
        db,
        &memory_turns(db),
        &persisted,
        scripted,
        Ending::Recovered,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    eprintln!(
        "lease lost while paused, seed {seed}: exit 3 {took:?} after SIGCONT, {recovered} sessions recovered once, {} chunks kept",
        persisted.len()
    );
}

/// Stops the run with SIGSTOP and runs `settle recover` while it is stopped;
/// returns when it stopped and what that recovery took. A process stopped
/// inside a transaction keeps its locks (SQLite's write lock, PostgreSQL's
/// row locks until the server's idle-in-transaction timeout ends its
/// session), so a recovery meanwhile waits: then the run is continued and
/// stopped again a moment later, until a stop lands between two writes.
fn stop_between_writes(run: &Running, db: &str, seed: u64) -> (Instant, usize) {
    for _ in 0..20 {
        common::send_signal(run.pid(), "STOP");
        let paused = Instant::now();
        let mut recover = common::spawn_recover(db);
        let waited = loop {
            if recover.try_wait().unwrap().is_some() {
                break false;
            }
            if paused.elapsed() > Duration::from_secs(1) {
                let _ = recover.kill();
                break true;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let out = recover.wait_with_output().unwrap();
        if !waited {
            if let Ok(count) = common::recovered_count(&out) {
                return (paused, count);
            }
        }
        common::send_signal(run.pid(), "CONT");
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("seed {seed}: twenty stops in a row landed inside a write");
}

fn lease_scenario(dir: &std::path::Path) -> (std::path::PathBuf, Scripted) {
    let file = dir.join("lease.toml");
    let (toml, scripted) = scenario(3, 1, 60, 100, 5);
    std::fs::write(&file, toml).unwrap();
    (file, scripted)
}

#[test]
fn g8_a_process_paused_past_its_lease_stops_and_its_sessions_are_recovered_once_sqlite() {
    let _one = one_at_a_time();
    let (_, seed) = common::soak_knobs(0);
    let dir = tempfile::tempdir().unwrap();
    let (file, scripted) = lease_scenario(dir.path());
    for i in 0..common::knob("SETTLE_STALL_ITERATIONS", 1) as u64 {
        let data = tempfile::tempdir().unwrap();
        lease_expires_while_paused(&common::db_in(data.path()), seed + i, &file, &scripted);
    }
}

#[test]
fn g8_a_process_paused_past_its_lease_stops_and_its_sessions_are_recovered_once_postgres() {
    let _one = one_at_a_time();
    let Some(cluster) = common::own_cluster() else {
        return;
    };
    let (_, seed) = common::soak_knobs(0);
    let dir = tempfile::tempdir().unwrap();
    let (file, scripted) = lease_scenario(dir.path());
    for i in 0..common::knob("SETTLE_STALL_ITERATIONS", 1) as u64 {
        let pg = common::PgDb::new(&cluster.admin_url);
        lease_expires_while_paused(&pg.url, seed + i, &file, &scripted);
    }
}
