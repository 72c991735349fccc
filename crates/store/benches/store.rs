//! Chunk appends to SQLite through the store (WAL, writer thread, group
//! commit) against a raw batched insert of the same rows with plain Diesel
//! (one transaction per 256 rows), and the durability lag (append → ack) of a
//! streaming load. Target (SPEC §9): ≥ 0.7× the raw throughput; lag ≤ the
//! flush interval.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use settle_store::{
    Applied, LifecycleWrite, NewSession, OwnerInfo, SessionId, SessionStore, Store, StoreOptions,
};

const SESSIONS: usize = 8;
const PER_SESSION: usize = 1024;
const ROWS: usize = SESSIONS * PER_SESSION;
const BATCH: usize = 256;

diesel::table! {
    chunks (session, turn_no, seq) {
        session -> BigInt,
        turn_no -> BigInt,
        seq -> BigInt,
        text -> Text,
        kind -> Text,
        data -> Nullable<Text>,
    }
}

fn text(i: usize) -> String {
    format!("chunk {i:06} of a streamed reply, about sixty-four bytes long..")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A store at `path` with `SESSIONS` sessions, each with turn 1 open.
fn prepared(rt: &tokio::runtime::Runtime, path: &Path) -> (Store, Vec<SessionId>) {
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let ids = prepared_on(rt, &store);
    (store, ids)
}

/// Append `ROWS` chunks round-robin over the sessions, all in flight at once,
/// and wait for every acknowledgement.
fn store_round(rt: &tokio::runtime::Runtime, store: &Store, ids: &[SessionId]) -> Duration {
    let texts: Vec<String> = (0..ROWS).map(text).collect();
    let start = Instant::now();
    rt.block_on(async {
        let receipts: Vec<_> = texts
            .into_iter()
            .enumerate()
            .map(|(i, t)| store.append_chunk(ids[i % SESSIONS], 1, t.into()))
            .collect();
        for r in receipts {
            black_box(r.await.unwrap());
        }
    });
    start.elapsed()
}

/// The baseline: the same rows, plain Diesel, one transaction per `BATCH`.
struct Raw {
    conn: SqliteConnection,
    ids: Vec<i64>,
    next_seq: i64,
}

impl Raw {
    fn new(rt: &tokio::runtime::Runtime, path: &Path) -> Raw {
        // Same schema and the same rows to point at, made by the store.
        let (store, ids) = prepared(rt, path);
        drop(store);
        let mut conn = SqliteConnection::establish(path.to_str().unwrap()).unwrap();
        for pragma in [
            "PRAGMA busy_timeout = 5000",
            "PRAGMA journal_mode = WAL",
            "PRAGMA synchronous = NORMAL",
            "PRAGMA foreign_keys = ON",
        ] {
            conn.batch_execute(pragma).unwrap();
        }
        Raw {
            conn,
            ids: ids.iter().map(|i| i.get() as i64).collect(),
            next_seq: 0,
        }
    }

    fn round(&mut self) -> Duration {
        let texts: Vec<String> = (0..ROWS).map(text).collect();
        let start = Instant::now();
        let base = self.next_seq;
        let rows: Vec<_> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (
                    chunks::session.eq(self.ids[i % SESSIONS]),
                    chunks::turn_no.eq(1_i64),
                    chunks::seq.eq(base + (i / SESSIONS) as i64),
                    chunks::text.eq(t.as_str()),
                    chunks::kind.eq("text"),
                    chunks::data.eq(None::<&str>),
                )
            })
            .collect();
        for batch in rows.chunks(BATCH) {
            self.conn
                .immediate_transaction(|c| {
                    diesel::insert_into(chunks::table).values(batch).execute(c)
                })
                .unwrap();
        }
        self.next_seq += PER_SESSION as i64;
        start.elapsed()
    }
}

fn throughput(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let (store, ids) = prepared(&rt, &dir.path().join("store.db"));
    let mut raw = Raw::new(&rt, &dir.path().join("raw.db"));

    let mut group = c.benchmark_group("chunk_appends");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("store_group_commit", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| store_round(&rt, &store, &ids)).sum())
    });
    group.bench_function("raw_batched_insert", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| raw.round()).sum())
    });
    group.finish();

    // The same comparison as adjacent pairs of rounds, so that both sides of a
    // pair meet the same machine load; the median pair is the figure to quote.
    let mut ratios = Vec::new();
    let (mut s, mut r) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..30 {
        let (ds, dr) = (store_round(&rt, &store, &ids), raw.round());
        ratios.push(dr.as_secs_f64() / ds.as_secs_f64());
        s += ds;
        r += dr;
    }
    ratios.sort_by(f64::total_cmp);
    let rate = |d: Duration| 30.0 * ROWS as f64 / d.as_secs_f64();
    eprintln!(
        "\nchunk appends over 30 paired rounds: store {:.0}/s, raw batched insert {:.0}/s; \
         store/raw throughput median {:.2} (min {:.2}, max {:.2}; target >= 0.70)",
        rate(s),
        rate(r),
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
    );
}

/// A streaming load: every session appends a chunk each millisecond and waits
/// for its acknowledgement; the time from append to ack is the durability lag.
fn durability_lag(_: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let options = StoreOptions::default();
    let interval = options.flush_interval();
    let store = Store::open_with(dir.path().join("lag.db").to_str().unwrap(), options).unwrap();
    let ids = prepared_on(&rt, &store);
    let mut lags: Vec<Duration> = rt.block_on(async {
        let tasks: Vec<_> = ids
            .iter()
            .map(|&id| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(1));
                    let mut lags = Vec::with_capacity(2000);
                    for i in 0..2000 {
                        tick.tick().await;
                        let t = Instant::now();
                        store.append_chunk(id, 1, text(i).into()).await.unwrap();
                        lags.push(t.elapsed());
                    }
                    lags
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    lags.sort();
    let pct = |p: f64| lags[((lags.len() as f64 * p) as usize).min(lags.len() - 1)];
    eprintln!(
        "durability lag over {} streamed chunks ({} sessions at ~1000 chunks/s each): \
         p50 {:?}, p99 {:?}, max {:?} (flush interval {:?})\n",
        lags.len(),
        ids.len(),
        pct(0.50),
        pct(0.99),
        lags[lags.len() - 1],
        interval
    );
}

/// `SESSIONS` sessions in `store`, each with turn 1 open.
fn prepared_on(rt: &tokio::runtime::Runtime, store: &Store) -> Vec<SessionId> {
    rt.block_on(async {
        let owner = store
            .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
            .await
            .unwrap();
        let registrations = (0..SESSIONS)
            .map(|i| LifecycleWrite::Register(NewSession::new(format!("s{i}"), owner)))
            .collect();
        let ids: Vec<SessionId> = store
            .apply(registrations)
            .await
            .into_iter()
            .map(|r| match r {
                Ok(Applied::Registered(id)) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        let at = std::time::SystemTime::now();
        let starts = ids
            .iter()
            .map(|&session| LifecycleWrite::StartTurn {
                session,
                no: 1,
                input: None,
                at,
            })
            .collect();
        for r in store.apply(starts).await {
            assert!(matches!(r, Ok(Applied::Done)), "{r:?}");
        }
        ids
    })
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = throughput, durability_lag
}
criterion_main!(benches);
