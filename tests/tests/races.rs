//! Races between processes and signals (G2, G3, G8, G9).
//!
//! - Two `settle recover` at once, on one database (SQLite file and
//!   PostgreSQL), after a `kill -9` left many sessions live mid-turn: each
//!   session is finalized exactly once, by one of them, and the two counts
//!   they print add up to the number of live sessions.
//! - SIGTERM during a burst of registrations and turn starts (many agents
//!   spawned at 0 ms): exit 143, every session finalized once, and none
//!   reclaimed mid-turn: no `finalized` transition while the timeline shows
//!   the session `running` or `cancelling`, no turn left open or
//!   `interrupted`, nothing left for `settle recover`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{check_db, memory_turns, Ending, Rng, Running, Scripted};

/// A root and `children` agents spawned at once, each streaming `chunks`
/// chunks `delay_ms` apart; the root streams for as long.
fn burst(children: usize, chunks: usize, delay_ms: u64) -> (String, Scripted) {
    let mut toml = String::from("name = \"burst\"\nsettle_timeout_ms = 200\n");
    let mut scripted = BTreeMap::new();
    for a in 0..=children {
        let name = format!("a{a}");
        toml.push_str(&format!("\n[[agent]]\nname = \"{name}\"\n"));
        if a > 0 {
            toml.push_str("parent = \"a0\"\nspawn_after_ms = 0\n");
        }
        let mut turns = Vec::new();
        for t in 1..=2 {
            let texts: Vec<String> = (0..chunks).map(|k| format!("{name}-t{t}-c{k}")).collect();
            toml.push_str(&settle_tests::turn_toml(&texts, delay_ms));
            turns.push(texts);
        }
        scripted.insert(name, turns);
    }
    (toml, scripted)
}

/// Kills a run once all its sessions are mid-turn, then races two
/// recoveries on its database.
fn two_recoveries(db: &str, round: usize) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("burst.toml");
    let children = 40;
    let (toml, scripted) = burst(children, 40, 40);
    std::fs::write(&file, &toml).unwrap();
    let mut run = Running::start(db, &file, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while run.count_lines("turn started") < children + 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(run.wait_for_line("persisted turn 1 chunk 1", Duration::from_secs(10)));
    run.child.kill().unwrap();
    let run = run.finish(Duration::from_secs(10));
    assert_eq!(run.signal(), Some(9), "round {round}: {}", run.describe());

    let before = common::DbView::read(db).unwrap();
    let live = before.live();
    assert!(
        live.len() >= children,
        "round {round}: only {} live sessions to race on\n{}",
        live.len(),
        run.describe()
    );
    let (a, b) = (common::spawn_recover(db), common::spawn_recover(db));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (na, nb) = (
        common::recovered_count(&a).unwrap(),
        common::recovered_count(&b).unwrap(),
    );
    assert_eq!(
        na + nb,
        live.len(),
        "round {round}: the two recoveries recovered {na} + {nb}, but {} sessions were live",
        live.len()
    );
    assert_eq!(
        common::recover(db).unwrap(),
        0,
        "round {round}: a third recovery found more"
    );
    let view = check_db(
        db,
        &memory_turns(db),
        &run.persisted(),
        &scripted,
        Ending::Recovered,
    )
    .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", run.describe()));
    let recovered = view
        .sessions
        .iter()
        .filter(|s| s["end_reason"] == "recovered")
        .count();
    assert_eq!(recovered, live.len(), "round {round}: recovered sessions");
    eprintln!(
        "round {round}: {} live sessions, recovered {na} + {nb}",
        live.len()
    );
}

#[test]
fn g2_g8_two_recoveries_at_once_sqlite() {
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        two_recoveries(&common::db_in(dir.path()), round);
    }
}

#[test]
fn g2_g8_two_recoveries_at_once_postgres() {
    let Some(admin) = common::pg_admin_url() else {
        return;
    };
    for round in 0..3 {
        let db = common::PgDb::new(&admin);
        two_recoveries(&db.url, round);
    }
}

/// SIGTERM while dozens of agents register and start their turns.
fn terminate_during_burst(db: &str, seed: u64) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("burst.toml");
    let (toml, scripted) = burst(60, 6, 15);
    std::fs::write(&file, &toml).unwrap();
    let run = Running::start(db, &file, &["--drain-timeout", "100ms"]);
    assert!(run.wait_for_line("registered (root)", Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(rng.range(0, 8)));
    common::send_signal(run.pid(), "TERM");
    let sent = Instant::now();
    let run = run.finish(Duration::from_secs(10));
    let took = sent.elapsed();
    assert_eq!(
        run.status.code(),
        Some(143),
        "seed {seed}: not ended by the graceful shutdown\n{}",
        run.describe()
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.describe());
    // Drain (100 ms) + settle timeout (200 ms) + a margin.
    assert!(
        took < Duration::from_secs(3),
        "seed {seed}: shutdown took {took:?}"
    );
    assert_eq!(
        common::recover(db).unwrap(),
        0,
        "seed {seed}: the shutdown left sessions for recovery\n{}",
        run.describe()
    );
    let view = check_db(
        db,
        &memory_turns(db),
        &run.persisted(),
        &scripted,
        Ending::Graceful,
    )
    .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", run.describe()));
    eprintln!(
        "seed {seed}: {} sessions registered before the shutdown, all finalized once in {took:?}",
        view.sessions.len()
    );
}

#[test]
fn g3_g9_sigterm_during_a_burst_of_registrations() {
    let (_, first) = common::soak_knobs(0);
    for i in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        terminate_during_burst(&common::db_in(dir.path()), first + i);
    }
}

#[test]
fn g3_g9_sigterm_during_a_burst_of_registrations_postgres() {
    let Some(admin) = common::pg_admin_url() else {
        return;
    };
    let (_, first) = common::soak_knobs(0);
    for i in 0..2 {
        let db = common::PgDb::new(&admin);
        terminate_during_burst(&db.url, first + i);
    }
}
