//! The `teardown durable` row: the teardown row's tree on the real store, an
//! SQLite file (WAL) in a temporary folder, timed from the root's cancel until
//! every session's finalize is committed, timeline included; against the
//! Python asyncio peer at the same size and shape (see [`crate::peer`]).
//!
//! Ours: a [`Kernel`] over a fresh [`Store`], no idle timeout, idle reap or
//! LRU cap; every session (the root included) runs one `ScriptedEnd::Hang`
//! turn. Before the timed part a `finalized()` wait is registered for every
//! session; the timed part is the root's `cancel(Immediate)` and those waits,
//! each answered once its session's finalize is committed. After it, untimed,
//! the database file itself is read back: every session row finalized, every
//! turn ended, every timeline an unbroken chain from `registered` to
//! `finalized`, every stream closed; a round that skipped any of it is an
//! error, not a figure.
//!
//! The phase breakdown runs separate rounds over a [`Clocked`] store and
//! watches every turn's outcome, so the timed rounds carry no instruments.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use futures_util::future::try_join_all;
use settle_runtime::{CancelMode, Handled, Kernel, SessionHandle, Turn, TurnRequest};
use settle_store::{SessionStore, Store};
use settle_stream::{Provider, ScriptedProvider};

use crate::clocked::{Clocked, FinalizeMarks};
use crate::teardown::{hanging, perf_control, wait_until};
use crate::Result;

/// The shape of the agent tree, as the peer's `--fanout` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// One root with N − 1 children.
    Flat,
    /// Every agent has this many children, filled breadth first (agent `i`
    /// is the child of agent `(i − 1) / k`).
    FanOut(usize),
}

impl Tree {
    /// Its name in the report.
    pub fn name(self) -> String {
        match self {
            Tree::Flat => "flat".to_owned(),
            Tree::FanOut(k) => format!("fan-out {k}"),
        }
    }

    /// Children per agent for a tree of `n`: the peer's `--fanout`.
    pub fn fanout(self, n: usize) -> usize {
        match self {
            Tree::Flat => n.max(1),
            Tree::FanOut(k) => k.max(1),
        }
    }
}

/// What the runtime-facing part of a round saw.
struct Teardown {
    /// When the timed part started (the cancel was sent).
    start: Instant,
    /// The timed part: the cancel until every `finalized()` answered.
    took: Duration,
    /// When every turn's outcome was answered, if watched.
    work_exited: Option<Duration>,
}

/// Every call the row makes on the runtime, in one place: start a runtime
/// over `store`, register the tree, start a hanging turn in every session,
/// register a `finalized()` wait for each, then (timed) cancel the root and
/// wait for all of them; shut down. With `watch_work`, a task also awaits
/// every turn's outcome, for the phase breakdown.
async fn teardown(
    store: Arc<dyn SessionStore>,
    tree: Tree,
    n: usize,
    provider: Arc<ScriptedProvider>,
    watch_work: bool,
) -> Result<Teardown> {
    let runtime = Kernel::builder(store)
        .idle_timeout(None)
        .idle_ttl(None)
        .lru_cap(None)
        .start()
        .await?;
    let fanout = tree.fanout(n);
    let mut sessions: Vec<SessionHandle> = vec![runtime.register("root", None).await?];
    // Breadth first, each level's registrations all in flight at once.
    while sessions.len() < n {
        let from = sessions.len();
        let to = n.min(fanout.saturating_mul(from).saturating_add(1));
        let parents: Vec<_> = (from..to)
            .map(|i| sessions[(i - 1) / fanout].id())
            .collect();
        let level = parents
            .into_iter()
            .zip(from..to)
            .map(|(parent, i)| runtime.register(format!("agent-{i}"), Some(parent)));
        sessions.extend(try_join_all(level).await?);
    }
    let dyn_provider: Arc<dyn Provider> = provider.clone();
    let turns: Vec<Turn> = try_join_all(
        sessions
            .iter()
            .map(|s| s.run_turn(dyn_provider.clone(), TurnRequest::prompt("go"))),
    )
    .await?;
    wait_until("every stream to open", || provider.stats().opened == n).await?;

    // Every wait is sent now: the first poll of each sends it. It is polled
    // with a waker that does nothing, so that the answers do not wake this
    // task one by one; the driver has taken every wait once it answers a
    // later command, a no-op cancel of a leaf's (empty) subtree.
    let mut waits: Vec<_> = sessions.iter().map(|s| Box::pin(s.finalized())).collect();
    let mut quiet = Context::from_waker(Waker::noop());
    if waits
        .iter_mut()
        .any(|w| w.as_mut().poll(&mut quiet).is_ready())
    {
        return Err("a finalized() wait answered before the cancel".into());
    }
    let leaf = sessions[n - 1].id();
    if runtime.cancel_subtree(leaf).await? != Handled::NoOp {
        return Err(format!("cancelling the empty subtree of {leaf} did something").into());
    }
    // The turns stay alive until the teardown is over: dropping a `Turn`
    // cancels it, and the cancel is what is timed.
    let (watcher, kept) = if watch_work {
        let watcher = tokio::spawn(async move {
            for turn in turns {
                turn.outcome().await;
            }
            Instant::now()
        });
        (Some(watcher), Vec::new())
    } else {
        (None, turns)
    };
    tokio::time::sleep(crate::teardown::SETTLE_PAUSE).await;
    // A stream closed before the cancel would be teardown done untimed.
    if provider.stats().close_finished != 0 {
        return Err("a stream closed before the timed cancel".into());
    }

    perf_control("enable");
    let start = Instant::now();
    let _ = sessions[0].cancel(CancelMode::Immediate).await?;
    // The root's first: by G1 it is answered last, so the others are ready
    // by then and this task wakes once.
    for wait in waits {
        wait.await?;
    }
    let took = start.elapsed();
    perf_control("disable");
    drop(kept);

    let work_exited = match watcher {
        Some(w) => Some(w.await?.saturating_duration_since(start)),
        None => None,
    };
    let report = runtime.shutdown(Duration::ZERO).await;
    if report.store_failures > 0 {
        return Err(format!("{} store writes failed", report.store_failures).into());
    }
    Ok(Teardown {
        start,
        took,
        work_exited,
    })
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()).into())
}

/// One timed round of ours on a fresh database; checked after.
pub fn ours(rt: &tokio::runtime::Runtime, tree: Tree, n: usize) -> Result<Duration> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("settle.db");
    let store = Store::open(path_str(&path)?)?;
    let provider = Arc::new(hanging(n));
    let round = rt.block_on(teardown(Arc::new(store), tree, n, provider.clone(), false))?;
    check(&path, tree, n, &provider)?;
    Ok(round.took)
}

/// Where the time of one teardown went: offsets from the cancel.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    /// Every turn's outcome was answered: every work had exited and the
    /// driver had taken its end.
    pub work_exited: Duration,
    /// Finalizes handed to and returned from the store.
    pub finalize: FinalizeMarks,
    /// Every `finalized()` answered (the figure the timed rounds time).
    pub answered: Duration,
    /// Store writes over the whole round (set-up included), by method, in
    /// the order of [`WRITES`](crate::clocked::WRITES).
    pub calls: [u64; crate::clocked::WRITES.len()],
}

/// One round of ours with the phase marks (not a timed round).
pub fn phases(rt: &tokio::runtime::Runtime, tree: Tree, n: usize) -> Result<Phases> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("settle.db");
    let store = Arc::new(Clocked::new(Store::open(path_str(&path)?)?));
    let provider = Arc::new(hanging(n));
    let round = rt.block_on(teardown(store.clone(), tree, n, provider.clone(), true))?;
    check(&path, tree, n, &provider)?;
    Ok(Phases {
        work_exited: round.work_exited.unwrap_or_default(),
        finalize: store.marks(round.start),
        answered: round.took,
        calls: store.calls(),
    })
}

mod db {
    diesel::table! {
        sessions (id) {
            id -> BigInt,
            state -> Text,
            outcome -> Nullable<Text>,
            finalized_at -> Nullable<BigInt>,
            /// The `last_segments` row of the session's last segment,
            /// which its finalize writes (schema version 8).
            last_segment -> Nullable<BigInt>,
        }
    }

    diesel::table! {
        turns (session, no) {
            session -> BigInt,
            no -> BigInt,
            outcome -> Nullable<Text>,
            ended_at -> Nullable<BigInt>,
        }
    }

    diesel::table! {
        last_segments (id) {
            id -> BigInt,
            steps -> Text,
        }
    }

    diesel::allow_tables_to_appear_in_same_query!(sessions, turns, last_segments);

    diesel::table! {
        timeline (id) {
            id -> BigInt,
            session -> BigInt,
            /// A segment: the JSON array of `[at, from, to, cause]` steps
            /// one write (or one batch) recorded for the session.
            steps -> Text,
        }
    }
}

/// A connection of our own to the database file, which waits for the
/// store's writer and checkpointer rather than failing on their locks.
pub(crate) fn read_back(path: &Path) -> Result<SqliteConnection> {
    use diesel::connection::SimpleConnection as _;
    let mut conn = SqliteConnection::establish(path_str(path)?)?;
    conn.batch_execute("PRAGMA busy_timeout = 10000")?;
    Ok(conn)
}

/// Reads the database file back: did the round do all of its work?
fn check(path: &Path, tree: Tree, n: usize, provider: &ScriptedProvider) -> Result<()> {
    use db::{last_segments, sessions, timeline, turns};
    let mut conn = read_back(path)?;
    let rows: i64 = sessions::table.count().get_result(&mut conn)?;
    let finalized: i64 = sessions::table
        .filter(sessions::state.eq("finalized"))
        .filter(sessions::finalized_at.is_not_null())
        .count()
        .get_result(&mut conn)?;
    // A turn's end is in its row, or, for a turn whose end its session's
    // finalize carried, in the finalized session's row (schema version 8:
    // it ended at `finalized_at` with the session's outcome).
    let in_row: i64 = turns::table
        .filter(turns::outcome.is_not_null())
        .filter(turns::ended_at.is_not_null())
        .count()
        .get_result(&mut conn)?;
    let with_session: i64 = turns::table
        .inner_join(sessions::table.on(sessions::id.eq(turns::session)))
        .filter(turns::ended_at.is_null())
        .filter(sessions::state.eq("finalized"))
        .filter(sessions::outcome.is_not_null())
        .filter(sessions::finalized_at.is_not_null())
        .count()
        .get_result(&mut conn)?;
    let ended = in_row + with_session;
    let mut segments: Vec<(i64, i64, String)> = timeline::table
        .select((timeline::session, timeline::id, timeline::steps))
        .load(&mut conn)?;
    let last: Vec<(i64, String)> = sessions::table
        .inner_join(
            last_segments::table.on(last_segments::id.nullable().eq(sessions::last_segment)),
        )
        .select((sessions::id, last_segments::steps))
        .load(&mut conn)?;
    // Each session's segments in order, its last one last.
    segments.extend(
        last.into_iter()
            .map(|(session, steps)| (session, i64::MAX, steps)),
    );
    segments.sort_unstable_by_key(|(session, id, _)| (*session, *id));
    let mut steps: Vec<(i64, Option<String>, String)> = Vec::new();
    for (session, _, segment) in segments {
        let parsed: Vec<serde_json::Value> = serde_json::from_str(&segment)?;
        for step in parsed {
            let from = step.get(1).and_then(|v| v.as_str()).map(str::to_owned);
            let to = step.get(2).and_then(|v| v.as_str()).unwrap_or_default();
            steps.push((session, from, to.to_owned()));
        }
    }
    let complete = complete_timelines(&steps);
    let closed = provider.stats().close_finished;
    let want = n as i64;
    if rows != want || finalized != want || ended != want || complete != n || closed != n {
        return Err(format!(
            "teardown durable {} {n}: {rows} session rows, {finalized} finalized, {ended} turns ended, \
             {complete} complete timelines, {closed} streams closed; expected {n} of each",
            tree.name()
        )
        .into());
    }
    Ok(())
}

/// How many sessions have a timeline that runs unbroken from `registered`
/// (no previous state) to `finalized`, each step leaving the state the one
/// before entered. `steps` is ordered by session, then by row id.
fn complete_timelines(steps: &[(i64, Option<String>, String)]) -> usize {
    steps
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|chain| {
            let starts = matches!(chain.first(), Some((_, None, to)) if to == "registered");
            let ends = chain.last().is_some_and(|(_, _, to)| to == "finalized");
            let linked = chain
                .windows(2)
                .all(|w| w[1].1.as_deref() == Some(w[0].2.as_str()));
            starts && ends && linked
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(session: i64, from: Option<&str>, to: &str) -> (i64, Option<String>, String) {
        (session, from.map(str::to_owned), to.to_owned())
    }

    #[test]
    fn a_timeline_counts_only_when_unbroken_from_registered_to_finalized() {
        let steps = [
            step(1, None, "registered"),
            step(1, Some("registered"), "running"),
            step(1, Some("running"), "finalized"),
            // Not finalized.
            step(2, None, "registered"),
            step(2, Some("registered"), "running"),
            // A step missing in the middle.
            step(3, None, "registered"),
            step(3, Some("running"), "finalized"),
            // No registration.
            step(4, Some("running"), "finalized"),
            step(5, None, "registered"),
            step(5, Some("registered"), "finalized"),
        ];
        assert_eq!(complete_timelines(&steps), 2);
    }

    #[test]
    fn fan_out_ten_is_the_peers_tree_and_flat_has_one_parent() {
        assert_eq!(Tree::FanOut(10).fanout(100_000), 10);
        assert_eq!(Tree::Flat.fanout(1_000), 1_000);
        assert_eq!(Tree::FanOut(10).name(), "fan-out 10");
    }
}
