//! The store row: chunk appends to SQLite through the [`Store`] (WAL, one
//! writer thread, group commit) against a raw batched insert of the same rows
//! with plain Diesel, one transaction per `batch` rows on both sides; and the
//! durability lag (append → acknowledgement) of a streaming load, against the
//! flush interval. The logic is that of `crates/store/benches/store.rs`, with
//! the batch size as a parameter.
//!
//! The raw side inserts each batch with one multi-row statement that stays
//! prepared, and checkpoints as the store does, on a thread of its own (see
//! [`crate::raw_sql`]).

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use diesel::backend::Backend;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Text};
use diesel::sqlite::SqliteConnection;
use settle_store::{
    Applied, LifecycleWrite, NewSession, OwnerInfo, SessionId, SessionStore, Store, StoreOptions,
};

use crate::raw_sql::{self, Checkpointer, Values};
use crate::Result;

/// Sessions the chunks are spread over, round-robin.
pub const SESSIONS: usize = 8;

fn text(i: usize) -> String {
    format!("chunk {i:06} of a streamed reply, about sixty-four bytes long..")
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()).into())
}

/// Register `sessions` in `store` in one batch: their ids, in order.
pub async fn register(
    store: &dyn SessionStore,
    sessions: Vec<NewSession>,
) -> Result<Vec<SessionId>> {
    let batch = sessions.into_iter().map(LifecycleWrite::Register).collect();
    store
        .apply(batch)
        .await
        .into_iter()
        .map(|answer| match answer? {
            Applied::Registered(id) => Ok(id),
            other => Err(format!("a registration answered {other:?}").into()),
        })
        .collect()
}

/// `SESSIONS` sessions in `store`, each with turn 1 open.
fn prepared_on(rt: &tokio::runtime::Runtime, store: &Store) -> Result<Vec<SessionId>> {
    rt.block_on(async {
        let owner = store
            .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
            .await?;
        let sessions = (0..SESSIONS)
            .map(|i| NewSession::new(format!("s{i}"), owner))
            .collect();
        let ids = register(store, sessions).await?;
        let at = SystemTime::now();
        let starts = ids
            .iter()
            .map(|&session| LifecycleWrite::StartTurn {
                session,
                no: 1,
                input: None,
                at,
            })
            .collect();
        for answer in store.apply(starts).await {
            if !matches!(answer?, Applied::Done) {
                return Err("a turn start answered something else".into());
            }
        }
        Ok(ids)
    })
}

/// Ours: a store whose writer commits at most `batch` chunks per transaction.
pub struct Ours {
    store: Store,
    ids: Vec<SessionId>,
    rows: usize,
}

impl Ours {
    /// A fresh store at `path`.
    pub fn new(
        rt: &tokio::runtime::Runtime,
        path: &Path,
        batch: usize,
        rows: usize,
    ) -> Result<Ours> {
        let options = StoreOptions::default().with_batch_size(batch);
        let store = Store::open_with(path_str(path)?, options)?;
        let ids = prepared_on(rt, &store)?;
        Ok(Ours { store, ids, rows })
    }

    /// Appends `rows` chunks round-robin over the sessions, all in flight at
    /// once, and waits for every acknowledgement.
    pub fn round(&self, rt: &tokio::runtime::Runtime) -> Result<Duration> {
        let texts: Vec<String> = (0..self.rows).map(text).collect();
        let start = Instant::now();
        rt.block_on(async {
            let receipts: Vec<_> = texts
                .into_iter()
                .enumerate()
                .map(|(i, t)| self.store.append_chunk(self.ids[i % SESSIONS], 1, t.into()))
                .collect();
            for r in receipts {
                black_box(r.await?);
            }
            Ok::<_, settle_store::StoreError>(())
        })?;
        Ok(start.elapsed())
    }
}

/// One chunk row as the raw side binds it.
pub struct ChunkRow<'a> {
    /// The session.
    pub session: i64,
    /// Its turn.
    pub turn_no: i64,
    /// The chunk's sequence number in the turn.
    pub seq: i64,
    /// The text.
    pub text: &'a str,
}

/// The statement head of a raw chunk insert.
pub const CHUNK_INSERT: &str = "INSERT INTO chunks (session, turn_no, seq, \"text\") VALUES ";

impl<DB> raw_sql::Row<DB> for ChunkRow<'_>
where
    DB: Backend + HasSqlType<BigInt> + HasSqlType<Text>,
    i64: ToSql<BigInt, DB>,
    str: ToSql<Text, DB>,
{
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_bind_param::<BigInt, _>(&self.session)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.turn_no)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.seq)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.text)
    }
}

/// The baseline: the same rows, plain Diesel, one transaction per `batch`,
/// each batch one prepared multi-row `INSERT`.
pub struct Raw {
    conn: SqliteConnection,
    _checkpointer: Checkpointer,
    ids: Vec<i64>,
    next_seq: i64,
    batch: usize,
    rows: usize,
}

impl Raw {
    /// A fresh database at `path`, with the store's schema and sessions (made
    /// by the store), opened with the store's pragmas and checkpoint policy.
    pub fn new(
        rt: &tokio::runtime::Runtime,
        path: &Path,
        batch: usize,
        rows: usize,
    ) -> Result<Raw> {
        let store = Store::open(path_str(path)?)?;
        let ids = prepared_on(rt, &store)?;
        drop(store);
        let conn = raw_sql::sqlite(path_str(path)?)?;
        Ok(Raw {
            conn,
            _checkpointer: Checkpointer::spawn(path_str(path)?)?,
            ids: ids.iter().map(|i| i.get() as i64).collect(),
            next_seq: 0,
            batch,
            rows,
        })
    }

    /// Inserts the round's rows, `batch` per transaction.
    pub fn round(&mut self) -> Result<Duration> {
        let texts: Vec<String> = (0..self.rows).map(text).collect();
        let start = Instant::now();
        let base = self.next_seq;
        let rows: Vec<_> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| ChunkRow {
                session: self.ids[i % SESSIONS],
                turn_no: 1,
                seq: base + (i / SESSIONS) as i64,
                text: t.as_str(),
            })
            .collect();
        for batch in rows.chunks(self.batch) {
            self.conn
                .immediate_transaction(|c| Values::insert(CHUNK_INSERT, batch).execute(c))?;
        }
        self.next_seq += self.rows.div_ceil(SESSIONS) as i64;
        Ok(start.elapsed())
    }
}

/// Durability lag percentiles of a streaming load.
#[derive(Debug, Clone, Copy)]
pub struct Lag {
    /// The median lag.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The largest.
    pub max: Duration,
    /// The store's flush interval.
    pub interval: Duration,
    /// How many chunks were timed.
    pub samples: usize,
}

/// Every session appends a chunk each millisecond, `per_session` times, and
/// waits for its acknowledgement; the time from append to ack is the lag.
pub fn durability_lag(path: &Path, per_session: usize) -> Result<Lag> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let options = StoreOptions::default();
    let interval = options.flush_interval();
    let store = Store::open_with(path_str(path)?, options)?;
    let ids = prepared_on(&rt, &store)?;
    let mut lags: Vec<Duration> = rt.block_on(async {
        let tasks: Vec<_> = ids
            .iter()
            .map(|&id| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(1));
                    let mut lags = Vec::with_capacity(per_session);
                    for i in 0..per_session {
                        tick.tick().await;
                        let t = Instant::now();
                        store.append_chunk(id, 1, text(i).into()).await?;
                        lags.push(t.elapsed());
                    }
                    Ok::<_, settle_store::StoreError>(lags)
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        Ok::<_, crate::Error>(all)
    })?;
    lags.sort();
    Ok(Lag {
        p50: crate::measure::quantile(&lags, 0.50),
        p99: crate::measure::quantile(&lags, 0.99),
        max: lags.last().copied().unwrap_or_default(),
        interval,
        samples: lags.len(),
    })
}
