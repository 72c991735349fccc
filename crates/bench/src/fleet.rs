//! The `fleet appends` rows (SPEC §9, §12): chunk appends per second to one
//! PostgreSQL from 1, 2 and 4 processes, [`SESSIONS`] sessions each, against
//! raw batched inserts of the same rows from the same number of processes.
//!
//! Each process is this binary again (`--fleet-child`), so the processes are
//! real ones with their own connections, as a fleet's are. Each sets up its
//! own owner and sessions with a turn open (through the store, untimed),
//! says `ready`, and waits for `go`, which the bench sends to all of them at
//! once; then, timed:
//!
//! - ours: a [`Store`] on the server appends its chunks round-robin over its
//!   sessions, all in flight, and waits for every acknowledgement (the
//!   writer group-commits up to its batch size, [`BATCH`] by default);
//! - raw: one Diesel connection inserts the same rows, [`BATCH`] per
//!   statement, each batch one prepared multi-row `INSERT` (see
//!   [`crate::raw_sql`]) committed on its own (one statement is atomic, so a
//!   `BEGIN` and `COMMIT` around it would only add two round trips),
//!   sequence numbers chosen by the process. It skips what the store does on
//!   top: reserving sequence numbers on the open turn under the owner's
//!   lease, which the store does in the same one statement.
//!
//! Each prints when it started and ended (wall clock); a round's figure is
//! every process's rows over the span from the first start to the last end.
//!
//! The server is `SETTLE_TEST_PG_URL` (an admin URL: the bench makes a
//! database of its own there and drops it after), else a throwaway cluster
//! started with `initdb`/`pg_ctl` as the tests start theirs (fsync off on
//! both sides); with neither the rows are skipped, and say so.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel::pg::PgConnection;
use diesel::prelude::*;
use settle_store::{OwnerInfo, SessionId, SessionStore, Store};

use crate::measure::{interleave, Plan, Sense};
use crate::raw_sql::Values;
use crate::report::{grouped, Row, Target};
use crate::store_bench::{ChunkRow, CHUNK_INSERT};
use crate::{progress, Result};

// The tests' throwaway cluster, shared as one source file.
#[path = "../../store/tests/support/pg_cluster.rs"]
mod pg_cluster;

/// Sessions per process.
pub const SESSIONS: usize = 100;

/// Rows per raw statement: the store's default batch size.
pub const BATCH: usize = 256;

/// The sizes of the fleet rows.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Process counts, one row each.
    pub processes: Vec<usize>,
    /// Chunks each process appends per round.
    pub chunks: usize,
    /// Rounds per row.
    pub plan: Plan,
}

/// Where the rows run.
pub struct Server {
    /// The URL of the bench's own database.
    url: String,
    /// The admin URL, to drop that database after (a server we were given).
    admin: Option<(String, String)>,
    /// Where the server came from, for the note.
    from: &'static str,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some((admin, name)) = &self.admin {
            if let Ok(mut conn) = PgConnection::establish(admin) {
                let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn);
            }
        }
    }
}

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base.rfind('/') {
        Some(i) if i >= scheme_end => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

impl Server {
    /// The URL of the bench's own database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the server came from, for a row's note.
    pub fn from(&self) -> &'static str {
        self.from
    }
}

/// A server and a fresh database on it for the rows of `purpose`, or why
/// there is none.
pub fn server(purpose: &str) -> Result<std::result::Result<Server, String>> {
    let (admin, from, drop_after) = match std::env::var("SETTLE_TEST_PG_URL") {
        Ok(url) => (url, "the server of SETTLE_TEST_PG_URL", true),
        Err(_) => {
            if pg_cluster::pg_bin_dir().is_none() {
                return Ok(Err(
                    "SETTLE_TEST_PG_URL is unset and no PostgreSQL server binaries (initdb, \
                     pg_ctl) were found"
                        .to_owned(),
                ));
            }
            let cluster = pg_cluster::start_cluster("settle-bench-pg-")?;
            (
                cluster.admin_url,
                "a throwaway cluster of this run (fsync off)",
                false,
            )
        }
    };
    let name = format!("settle_bench_{purpose}_{}", std::process::id());
    let mut conn = PgConnection::establish(&admin)?;
    diesel::sql_query(format!("DROP DATABASE IF EXISTS {name}")).execute(&mut conn)?;
    diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut conn)?;
    let url = with_database(&admin, &name);
    // The schema, once, before any process races to make it.
    drop(Store::open(&url)?);
    Ok(Ok(Server {
        url,
        admin: drop_after.then_some((admin, name)),
        from,
    }))
}

fn text(i: usize) -> String {
    format!("chunk {i:06} of a streamed reply, about sixty-four bytes long..")
}

/// The fleet rows.
pub fn rows(sizes: &Sizes) -> Result<Vec<Row>> {
    let server = match server("fleet")? {
        Ok(server) => server,
        Err(why) => {
            progress(&format!("fleet appends: skipped: {why}"));
            return Ok(vec![Row::ours_only(
                "fleet appends",
                "skipped",
                "k rows/s",
                f64::NAN,
                Target::ratio_at_least(0.7),
                0,
            )
            .with_note(format!("not run: {why}"))]);
        }
    };
    let mut rows = Vec::new();
    for &p in &sizes.processes {
        progress(&format!(
            "fleet appends {p} process{} × {SESSIONS} sessions, {} chunks each: {} + {} rounds",
            if p == 1 { "" } else { "es" },
            grouped(sizes.chunks as i64),
            sizes.plan.warmup,
            sizes.plan.rounds
        ));
        let pairs = interleave(
            sizes.plan,
            || round(&server.url, "ours", p, sizes.chunks),
            || round(&server.url, "raw", p, sizes.chunks),
        )?;
        let total = (p * sizes.chunks) as f64;
        let rate = |d: Duration| total / d.as_secs_f64() / 1e3;
        rows.push(
            Row::compared(
                "fleet appends",
                format!(
                    "{p} process{} × {SESSIONS} sessions",
                    if p == 1 { "" } else { "es" }
                ),
                "k rows/s",
                rate(pairs.ours_median()),
                rate(pairs.base_median()),
                pairs.ratios(Sense::ThroughputRatio),
                Target::ratio_at_least(0.7),
                sizes.plan.rounds,
            )
            .with_note(format!(
                "{} chunks per process per round, every process's rows over the span from the \
                 first start to the last end; ours: a Store per process, all appends in flight; \
                 raw: plain Diesel, one prepared multi-row INSERT of {BATCH} rows per statement, \
                 each committed on its own; on {}",
                grouped(sizes.chunks as i64),
                server.from
            )),
        );
    }
    drop(server);
    Ok(rows)
}

/// A started process and its pipes.
struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Process {
    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim().to_owned())
    }
}

/// One round of `side` from `p` processes: the span from the first start to
/// the last end.
fn round(url: &str, side: &str, p: usize, chunks: usize) -> Result<Duration> {
    let mut processes = Vec::with_capacity(p);
    for _ in 0..p {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--fleet-child", side, url, &chunks.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        processes.push(Process {
            child,
            stdin,
            stdout,
        });
    }
    for process in &mut processes {
        let line = process.line()?;
        if line != "ready" {
            return Err(format!("a fleet process said {line:?} instead of ready").into());
        }
    }
    for process in &mut processes {
        writeln!(process.stdin, "go")?;
        process.stdin.flush()?;
    }
    let (mut first, mut last) = (u128::MAX, 0_u128);
    for process in &mut processes {
        let line = process.line()?;
        let span: Vec<u128> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [start, end] = span[..] else {
            return Err(format!("a fleet process said {line:?} instead of its span").into());
        };
        first = first.min(start);
        last = last.max(end);
    }
    for process in &mut processes {
        let status = process.child.wait()?;
        if !status.success() {
            return Err(format!("a fleet process failed ({status})").into());
        }
    }
    let nanos = u64::try_from(last.saturating_sub(first))?;
    Ok(Duration::from_nanos(nanos))
}

fn unix_nanos() -> Result<u128> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos())
}

/// `SESSIONS` sessions of a fresh owner, each with turn 1 open.
async fn sessions(store: &Store) -> Result<Vec<SessionId>> {
    let owner = store
        .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
        .await?;
    crate::mid_turn::sessions_mid_turn(store, owner, "fleet", 0..SESSIONS).await
}

/// The `--fleet-child` process: set up, say `ready`, wait for `go`, append
/// `chunks` chunks as `side` says, print the span.
pub fn child(side: &str, url: &str, chunks: usize) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let store = Store::open(url)?;
    let ids = rt.block_on(sessions(&store))?;
    let texts: Vec<String> = (0..chunks).map(text).collect();
    let mut raw = match side {
        "ours" => None,
        "raw" => Some(PgConnection::establish(url)?),
        other => return Err(format!("no fleet side {other:?}").into()),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    if go.trim() != "go" {
        return Err(format!("the bench said {go:?} instead of go").into());
    }
    let start = unix_nanos()?;
    let clock = Instant::now();
    match &mut raw {
        None => rt.block_on(async {
            let receipts: Vec<_> = texts
                .into_iter()
                .enumerate()
                .map(|(i, t)| store.append_chunk(ids[i % SESSIONS], 1, t.into()))
                .collect();
            for receipt in receipts {
                receipt.await?;
            }
            Ok::<_, settle_store::StoreError>(())
        })?,
        Some(conn) => {
            let raw_ids: Vec<i64> = ids
                .iter()
                .map(|id| i64::try_from(id.get()))
                .collect::<std::result::Result<_, _>>()?;
            let rows: Vec<ChunkRow<'_>> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| ChunkRow {
                    session: raw_ids[i % SESSIONS],
                    turn_no: 1,
                    seq: (i / SESSIONS) as i64,
                    text: t,
                })
                .collect();
            for batch in rows.chunks(BATCH) {
                Values::insert(CHUNK_INSERT, batch).execute(conn)?;
            }
        }
    }
    let end = start + clock.elapsed().as_nanos();
    writeln!(out, "{start} {end}")?;
    out.flush()?;
    drop(out);
    rt.block_on(store.close());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced_and_its_options_kept() {
        assert_eq!(
            with_database("postgres://u@h:5/postgres", "x"),
            "postgres://u@h:5/x"
        );
        assert_eq!(
            with_database("postgres://u@h:5/db?sslmode=disable", "x"),
            "postgres://u@h:5/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h:5", "x"), "postgres://u@h:5/x");
    }
}
