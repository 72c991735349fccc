//! The `register` row: sessions registered per second through the runtime
//! on an SQLite [`Store`], against a raw Diesel insert of the same rows into
//! the same schema, batched as the store batches them.
//!
//! Ours: a fresh database and a [`Kernel`] over it with one root session;
//! timed, `Kernel::register` of N children of the root, all in flight at
//! once, until every handle is back (each registration answers once its row
//! is committed). The round's runtime is then dropped with its tokio runtime,
//! not shut down: finalizing the sessions is another row's work.
//!
//! Baseline: a fresh database with the same schema, owner and root (made by
//! the store), then plain Diesel on its own connection with the store's
//! pragmas: for each session the row a registration writes (the session,
//! with its tree, state and owner) and its `registered` timeline row,
//! [`STORE_BATCH`] sessions per transaction, multi-row inserts, ids chosen by
//! the bench, each statement prepared once (see [`crate::raw_sql`]), and the
//! store's checkpoint policy (a passive checkpoint every 100 ms on a thread
//! of its own, none inside a commit). It skips what the store does on top:
//! checking the parent is open (G1) and reading back the id SQLite allocated.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::Sqlite;
use futures_util::future::try_join_all;
use settle_runtime::{Kernel, SessionId};
use settle_store::{NewSession, OwnerInfo, SessionStore, Store};

use crate::raw_sql::{self, Checkpointer, Values};
use crate::Result;

/// How many registrations the baseline commits in one transaction. The store
/// group-commits what the recorder has queued when it wakes (up to 4,096
/// records, one transaction, multi-row inserts), however many that is; the
/// baseline takes a fixed 256 per transaction, each batch two multi-row
/// `INSERT`s.
pub const STORE_BATCH: usize = 256;

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()).into())
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("agent-{i}")).collect()
}

/// Every call the row makes on the runtime: start a runtime over `store`
/// with a root, then (timed) register `names` under it, all in flight.
async fn register_all(store: Arc<dyn SessionStore>, names: Vec<String>) -> Result<Duration> {
    let runtime = Kernel::builder(store)
        .idle_timeout(None)
        .idle_ttl(None)
        .lru_cap(None)
        .start()
        .await?;
    let root = runtime.register("root", None).await?.id();
    let n = names.len();
    let start = Instant::now();
    let handles = try_join_all(
        names
            .into_iter()
            .map(|name| runtime.register(name, Some(root))),
    )
    .await?;
    let took = start.elapsed();
    if handles.len() != n {
        return Err(format!("registered {} sessions, asked {n}", handles.len()).into());
    }
    Ok(took)
}

/// One round of ours: `n` registrations on a fresh database.
pub fn ours(n: usize) -> Result<Duration> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("settle.db");
    let store = Store::open(path_str(&path)?)?;
    let names = names(n);
    // Its own tokio runtime, dropped at the end of the round with the
    // runtime's tasks, so that nothing of this round runs into the next.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |c| c.get()))
        .enable_all()
        .build()?;
    let took = rt.block_on(register_all(Arc::new(store), names))?;
    rt.shutdown_background();
    let mut conn = crate::durable::read_back(&path)?;
    let rows: i64 = db::sessions::table.count().get_result(&mut conn)?;
    if rows != n as i64 + 1 {
        return Err(
            format!("register: {rows} session rows after {n} registrations and a root").into(),
        );
    }
    Ok(took)
}

mod db {
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
}

/// One round of the baseline: the same rows on a fresh database.
pub fn baseline(n: usize) -> Result<Duration> {
    use db::sessions;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("raw.db");
    let (owner, root) = {
        let store = Store::open(path_str(&path)?)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let owner = store
                .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
                .await?;
            let root = crate::store_bench::register(&store, vec![NewSession::new("root", owner)])
                .await?
                .pop()
                .ok_or("no root registered")?;
            Ok::<_, crate::Error>((owner, root))
        })?
    };
    let owner = i64::try_from(owner.0)?;
    let root = raw_id(root)?;
    let mut conn = raw_sql::sqlite(path_str(&path)?)?;
    let _checkpointer = Checkpointer::spawn(path_str(&path)?)?;
    let names = names(n);

    let start = Instant::now();
    let at = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    // The `registered` step of each session's timeline, as the store
    // encodes it: a segment `[[at, from, to, cause]]`.
    let step = format!(r#"[[{at},null,"registered","registered"]]"#);
    for (b, batch) in names.chunks(STORE_BATCH).enumerate() {
        let first = root + 1 + (b * STORE_BATCH) as i64;
        conn.immediate_transaction(|c| {
            let rows: Vec<SessionRow<'_>> = batch
                .iter()
                .zip(first..)
                .map(|(name, id)| SessionRow {
                    id,
                    name,
                    parent: Some(root),
                    tree: root,
                    created_at: at,
                    owner,
                })
                .collect();
            Values::insert(SESSION_INSERT, &rows).execute(c)?;
            let steps: Vec<TimelineRow<'_>> = (first..)
                .take(batch.len())
                .map(|session| TimelineRow {
                    session,
                    steps: &step,
                })
                .collect();
            Values::insert(TIMELINE_INSERT, &steps).execute(c)?;
            Ok::<_, diesel::result::Error>(())
        })?;
    }
    let took = start.elapsed();

    let rows: i64 = sessions::table.count().get_result(&mut conn)?;
    if rows != n as i64 + 1 {
        return Err(format!("register baseline: {rows} session rows, expected {}", n + 1).into());
    }
    Ok(took)
}

const SESSION_INSERT: &str = "INSERT INTO sessions (id, name, parent, tree, state, created_at, \
                              version, owner) VALUES ";
const TIMELINE_INSERT: &str = "INSERT INTO timeline (session, steps) VALUES ";

/// A session row as a registration writes it (state `registered`,
/// version 0).
struct SessionRow<'a> {
    id: i64,
    name: &'a str,
    parent: Option<i64>,
    tree: i64,
    created_at: i64,
    owner: i64,
}

impl raw_sql::Row<Sqlite> for SessionRow<'_> {
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_bind_param::<BigInt, _>(&self.id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.name)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.parent)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.tree)?;
        out.push_sql(", 'registered', ");
        out.push_bind_param::<BigInt, _>(&self.created_at)?;
        out.push_sql(", 0, ");
        out.push_bind_param::<BigInt, _>(&self.owner)
    }
}

/// A session's `registered` timeline segment.
struct TimelineRow<'a> {
    session: i64,
    steps: &'a str,
}

impl raw_sql::Row<Sqlite> for TimelineRow<'_> {
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_bind_param::<BigInt, _>(&self.session)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.steps)
    }
}

fn raw_id(id: SessionId) -> Result<i64> {
    Ok(i64::try_from(id.get())?)
}
