//! The store's side of a durable teardown, and batched registration.
//!
//! **teardown**: a 10,000-session tree (fan-out 10) on an SQLite file in WAL
//! mode, every session running turn 1; one batch carries, per session, leaves
//! first, what the runtime's recorder hands the store when the tree is torn
//! down: `running → cancelling`, the turn's end (`cancelled`), `cancelling →
//! settled`, and the finalize (latch, timeline row, memory step). Timed from
//! the call until the batch is committed. Beside it, the Python asyncio peer
//! (`../shared/peers/asyncio_teardown.py`, one UPDATE per session in one
//! transaction) at the same size and shape, run as a subprocess; its whole
//! teardown is the budget of ours, runtime included (SPEC §9).
//!
//! **register**: 10,000 registrations under one root, 256 per batch, against
//! a raw Diesel insert of the same rows (each session's row and its first
//! timeline segment), 256 per transaction. Target (SPEC §9, through the runtime): ≥ 0.5× the raw insert.
//!
//! `SETTLE_BENCH_SESSIONS` changes the teardown's size (e.g. 100000).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use settle_core::{CancelMode, Cause, EndReason, Outcome, State};
use settle_store::{
    Applied, FinalizeRequest, LifecycleWrite, NewSession, OwnerId, OwnerInfo, SessionId,
    SessionStore, Store,
};

const FANOUT: usize = 10;
const BATCH: usize = 256;

fn sessions() -> usize {
    std::env::var("SETTLE_BENCH_SESSIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn applied(results: Vec<Result<Applied, settle_store::StoreError>>) -> Vec<Applied> {
    results.into_iter().map(Result::unwrap).collect()
}

/// A root session of `owner` in `store`.
async fn register_root(store: &Store, owner: OwnerId) -> SessionId {
    let root = LifecycleWrite::Register(NewSession::new("root", owner));
    match applied(store.apply(vec![root]).await)[..] {
        [Applied::Registered(id)] => id,
        ref other => panic!("{other:?}"),
    }
}

/// A store at `path` holding a tree of `n` sessions (fan-out `FANOUT`), every
/// one running turn 1; the ids in registration order (parents first).
fn running_tree(rt: &tokio::runtime::Runtime, path: &Path, n: usize) -> (Store, Vec<SessionId>) {
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let ids = rt.block_on(async {
        let owner = store
            .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
            .await
            .unwrap();
        let mut ids: Vec<SessionId> = Vec::with_capacity(n);
        // Level by level, so that every parent has its id before its children.
        let mut level = 0..1;
        while level.start < n {
            let end = level.end.min(n);
            for part in (level.start..end).collect::<Vec<_>>().chunks(BATCH) {
                let batch = part
                    .iter()
                    .map(|&i| {
                        let new = NewSession::new(format!("agent-{i}"), owner);
                        LifecycleWrite::Register(match i {
                            0 => new,
                            _ => new.with_parent(ids[(i - 1) / FANOUT]),
                        })
                    })
                    .collect();
                for a in applied(store.apply(batch).await) {
                    let Applied::Registered(id) = a else {
                        panic!("{a:?}")
                    };
                    ids.push(id);
                }
            }
            level = end..end + (end - level.start) * FANOUT;
        }
        for part in ids.chunks(BATCH) {
            let now = SystemTime::now();
            let batch = part
                .iter()
                .flat_map(|&session| {
                    [
                        LifecycleWrite::StartTurn {
                            session,
                            no: 1,
                            input: None,
                            at: now,
                        },
                        LifecycleWrite::Transition {
                            session,
                            from: State::Registered,
                            to: State::Running,
                            cause: Cause::TurnStarted,
                            at: now,
                        },
                    ]
                })
                .collect();
            applied(store.apply(batch).await);
        }
        ids
    });
    (store, ids)
}

/// What the recorder hands the store for the teardown of `ids`, leaves first.
fn teardown_batch(ids: &[SessionId]) -> Vec<LifecycleWrite> {
    let at = SystemTime::now();
    ids.iter()
        .rev()
        .flat_map(|&session| {
            [
                LifecycleWrite::Transition {
                    session,
                    from: State::Running,
                    to: State::Cancelling,
                    cause: Cause::CancelRequested(CancelMode::Immediate),
                    at,
                },
                LifecycleWrite::EndTurn {
                    session,
                    no: 1,
                    outcome: Outcome::Cancelled,
                    error: None,
                    at,
                },
                LifecycleWrite::Transition {
                    session,
                    from: State::Cancelling,
                    to: State::Settled,
                    cause: Cause::TurnEnded(Outcome::Cancelled),
                    at,
                },
                LifecycleWrite::Finalize {
                    session,
                    plan: FinalizeRequest::new(EndReason::Cancelled).at(at),
                },
            ]
        })
        .collect()
}

/// One teardown on a fresh tree: the time of the batch alone.
fn teardown_round(rt: &tokio::runtime::Runtime, n: usize) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = running_tree(rt, &dir.path().join("tree.db"), n);
    let batch = teardown_batch(&ids);
    let start = Instant::now();
    let results = rt.block_on(store.apply(batch));
    let took = start.elapsed();
    let won = results
        .iter()
        .filter(|r| matches!(r, Ok(Applied::Finalized(f)) if f.won()))
        .count();
    assert_eq!(won, n, "every session finalized once");
    black_box(results);
    took
}

/// The peer script: `SETTLE_PEER_SCRIPT`, else `shared/peers/` beside the
/// repository (or beside the folder of worktrees it is in).
fn peer_script() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("SETTLE_PEER_SCRIPT") {
        return Some(path.into());
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    ["../shared", "../../shared"]
        .iter()
        .map(|up| repo.join(up).join("peers/asyncio_teardown.py"))
        .find(|p| p.exists())
}

/// The peer's median teardown at `n` sessions, if `python3` and the script
/// are here.
fn peer_ms(n: usize) -> Option<f64> {
    let out = Command::new("python3")
        .arg(peer_script()?)
        .args([
            &n.to_string(),
            "--fanout",
            &FANOUT.to_string(),
            "--runs",
            "3",
            "--json",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let line = String::from_utf8_lossy(&out.stdout);
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    value["median_ms"].as_f64()
}

fn teardown(c: &mut Criterion) {
    let rt = runtime();
    let n = sessions();
    let mut group = c.benchmark_group("teardown_batch");
    group.throughput(Throughput::Elements(n as u64));
    group.sample_size(10);
    group.bench_function(format!("sqlite_{n}_sessions"), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| teardown_round(&rt, n)).sum())
    });
    group.finish();

    // Side by side with the peer, alternating, so both meet the same load.
    let mut ours = Vec::new();
    let mut peer = Vec::new();
    for _ in 0..3 {
        ours.push(teardown_round(&rt, n).as_secs_f64() * 1000.0);
        if let Some(ms) = peer_ms(n) {
            peer.push(ms);
        }
    }
    ours.sort_by(f64::total_cmp);
    peer.sort_by(f64::total_cmp);
    match peer.get(peer.len() / 2) {
        Some(p) => eprintln!(
            "\nteardown batch, {n} sessions (fan-out {FANOUT}): store {:.1} ms (median of 3), \
             asyncio peer {p:.1} ms (median of 3 medians); store/peer {:.2}\n",
            ours[1],
            ours[1] / p
        ),
        None => eprintln!(
            "\nteardown batch, {n} sessions: store {:.1} ms (median of 3); \
             the peer was not run (no python3 or no peer script)\n",
            ours[1]
        ),
    }
}

diesel::table! {
    sessions (id) {
        id -> BigInt,
        name -> Text,
        parent -> Nullable<BigInt>,
        tree -> BigInt,
        state -> Text,
        created_at -> BigInt,
        version -> BigInt,
        owner -> BigInt,
    }
}

diesel::table! {
    timeline (id) {
        id -> BigInt,
        session -> BigInt,
        steps -> Text,
    }
}

const REGISTRATIONS: usize = 10_000;

/// Register `REGISTRATIONS` children of one root through the store, `BATCH`
/// per batch.
fn store_register_round(
    rt: &tokio::runtime::Runtime,
    store: &Store,
    owner: OwnerId,
    root: SessionId,
) -> Duration {
    let start = Instant::now();
    rt.block_on(async {
        for first in (0..REGISTRATIONS).step_by(BATCH) {
            let batch = (first..(first + BATCH).min(REGISTRATIONS))
                .map(|i| {
                    LifecycleWrite::Register(
                        NewSession::new(format!("agent-{i}"), owner).with_parent(root),
                    )
                })
                .collect();
            black_box(applied(store.apply(batch).await));
        }
    });
    start.elapsed()
}

/// The same rows with plain Diesel, `BATCH` per transaction.
fn raw_register_round(
    conn: &mut SqliteConnection,
    owner: i64,
    root: i64,
    next_id: &mut i64,
) -> Duration {
    let start = Instant::now();
    for first in (0..REGISTRATIONS).step_by(BATCH) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let ids: Vec<i64> = (0..(BATCH.min(REGISTRATIONS - first)) as i64)
            .map(|k| *next_id + k)
            .collect();
        *next_id += ids.len() as i64;
        let names: Vec<String> = (first..first + ids.len())
            .map(|i| format!("agent-{i}"))
            .collect();
        let rows: Vec<_> = ids
            .iter()
            .zip(&names)
            .map(|(&id, name)| {
                (
                    sessions::id.eq(id),
                    sessions::name.eq(name.as_str()),
                    sessions::parent.eq(Some(root)),
                    sessions::tree.eq(root),
                    sessions::state.eq("registered"),
                    sessions::created_at.eq(now),
                    sessions::version.eq(0_i64),
                    sessions::owner.eq(owner),
                )
            })
            .collect();
        let step = format!("[[{now},null,\"registered\",\"registered\"]]");
        let steps: Vec<_> = ids
            .iter()
            .map(|&id| (timeline::session.eq(id), timeline::steps.eq(step.as_str())))
            .collect();
        conn.immediate_transaction(|c| {
            diesel::insert_into(sessions::table)
                .values(&rows)
                .execute(c)?;
            diesel::insert_into(timeline::table)
                .values(&steps)
                .execute(c)
        })
        .unwrap();
    }
    start.elapsed()
}

fn register(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store.db").to_str().unwrap()).unwrap();
    let (owner, root) = rt.block_on(async {
        let owner = store
            .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
            .await
            .unwrap();
        let root = register_root(&store, owner).await;
        (owner, root)
    });
    // The raw side gets the same schema, made by the store, and its own file.
    let raw_path = dir.path().join("raw.db");
    let (raw_owner, raw_root) = {
        let raw = Store::open(raw_path.to_str().unwrap()).unwrap();
        rt.block_on(async {
            let owner = raw
                .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
                .await
                .unwrap();
            let root = register_root(&raw, owner).await;
            (owner.0 as i64, root.get() as i64)
        })
    };
    let mut conn = SqliteConnection::establish(raw_path.to_str().unwrap()).unwrap();
    conn.batch_execute(
        "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )
    .unwrap();
    let mut next_id = raw_root + 1;

    let mut group = c.benchmark_group("register");
    group.throughput(Throughput::Elements(REGISTRATIONS as u64));
    group.sample_size(10);
    group.bench_function("store_batches_of_256", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| store_register_round(&rt, &store, owner, root))
                .sum()
        })
    });
    group.bench_function("raw_diesel_batches_of_256", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| raw_register_round(&mut conn, raw_owner, raw_root, &mut next_id))
                .sum()
        })
    });
    group.finish();

    let mut ratios = Vec::new();
    for _ in 0..10 {
        let s = store_register_round(&rt, &store, owner, root);
        let r = raw_register_round(&mut conn, raw_owner, raw_root, &mut next_id);
        ratios.push(r.as_secs_f64() / s.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    eprintln!(
        "\nregistration over 10 paired rounds of {REGISTRATIONS}: store/raw throughput median {:.2} \
         (min {:.2}, max {:.2}; target >= 0.50)\n",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    targets = teardown, register
}
criterion_main!(benches);
