//! The `recover` row (SPEC §9): the work of `settle recover` on N sessions a
//! killed process left live, against a raw Diesel update of the same rows,
//! batched the same way.
//!
//! Set-up, once per size and untimed: an SQLite file (WAL) where one owner,
//! whose lease has run out (set to the epoch after the set-up, which ran
//! under a live one), holds N sessions, each registered with a turn open, as
//! a process killed mid-turn leaves them. Each round copies that
//! file twice, one copy per side.
//!
//! Ours: the store's recovery ([`SessionStore::recover`], what
//! `settle recover` calls once it has read the candidates for its report):
//! every session finalized with end reason `recovered` through the finalize
//! latch, its open turn `interrupted`, its timeline step recorded. The copy
//! is read back after: every row finalized and every turn ended.
//!
//! Baseline: the same rows with plain Diesel on a connection with the
//! store's pragmas and checkpoint policy (see [`crate::raw_sql`]): one query
//! for the sessions of owners whose lease ran out, then per piece of
//! [`RECOVER_BATCH`] sessions, one transaction as the store commits them, the
//! conditional update of their rows, the update of their open turns and a
//! multi-row insert of their timeline segments. It skips what the store does
//! on top: reading each piece before its compare-and-set (whose row counts
//! say which session's latch each write spent), and the process-liveness
//! check.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::prelude::*;
use settle_store::{OwnerInfo, RecoverOptions, SessionStore, Store};

use crate::raw_sql::{self, Checkpointer};
use crate::Result;

/// Sessions per transaction in the store's recovery today: 256
/// (`RECOVER_PER_TRANSACTION` in `crates/store/src/recover.rs`, which writes
/// each piece as sets). The baseline follows it; change both together.
pub const RECOVER_BATCH: usize = 256;

/// Registrations per set-up batch.
const SETUP_BATCH: usize = 4096;

mod db {
    diesel::table! {
        owners (id) {
            id -> BigInt,
            lease_expires_at -> BigInt,
        }
    }

    diesel::table! {
        sessions (id) {
            id -> BigInt,
            state -> Text,
            outcome -> Nullable<Text>,
            end_reason -> Nullable<Text>,
            open_turn -> Nullable<BigInt>,
            finalized_at -> Nullable<BigInt>,
            version -> BigInt,
            owner -> BigInt,
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
        timeline (id) {
            id -> BigInt,
            session -> BigInt,
            steps -> Text,
        }
    }

    diesel::joinable!(sessions -> owners (owner));
    diesel::allow_tables_to_appear_in_same_query!(owners, sessions);
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()).into())
}

/// The database a killed process left, made once; rounds copy it.
pub struct LeftLive {
    dir: tempfile::TempDir,
    template: PathBuf,
    n: usize,
    copies: usize,
}

impl LeftLive {
    /// `n` live sessions with an open turn each, their owner's lease run out.
    pub fn new(n: usize) -> Result<LeftLive> {
        let dir = tempfile::tempdir()?;
        let template = dir.path().join("left-live.db");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let store = Store::open(path_str(&template)?)?;
            let owner = store
                .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
                .await?;
            let mut made = 0;
            while made < n {
                let range = made..n.min(made + SETUP_BATCH);
                let ids = crate::mid_turn::sessions_mid_turn(&store, owner, "agent", range).await?;
                made += ids.len();
            }
            store.close().await;
            Ok::<_, crate::Error>(())
        })?;
        // The process is "killed": its lease ran out long ago (the store
        // refuses writes under an expired lease, so the set-up ran under a
        // live one). Then the WAL is folded into the file, so that a copy of
        // the file is whole.
        let mut conn = crate::durable::read_back(&template)?;
        diesel::update(db::owners::table)
            .set(db::owners::lease_expires_at.eq(0_i64))
            .execute(&mut conn)?;
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "PRAGMA wal_checkpoint(TRUNCATE)",
        )?;
        drop(conn);
        Ok(LeftLive {
            dir,
            template,
            n,
            copies: 0,
        })
    }

    fn copy(&mut self) -> Result<PathBuf> {
        self.copies += 1;
        let path = self.dir.path().join(format!("copy-{}.db", self.copies));
        std::fs::copy(&self.template, &path)?;
        Ok(path)
    }

    /// One round of ours on a fresh copy; checked after.
    pub fn ours(&mut self, rt: &tokio::runtime::Runtime) -> Result<Duration> {
        let path = self.copy()?;
        let store = Store::open(path_str(&path)?)?;
        let (took, report) = rt.block_on(async {
            let start = std::time::Instant::now();
            let report = store.recover(RecoverOptions::now_on_this_host()).await?;
            let took = start.elapsed();
            store.close().await;
            Ok::<_, crate::Error>((took, report))
        })?;
        if report.recovered.len() != self.n || report.interrupted_turns.len() != self.n {
            return Err(format!(
                "recover: {} sessions recovered and {} turns interrupted, expected {}",
                report.recovered.len(),
                report.interrupted_turns.len(),
                self.n
            )
            .into());
        }
        check(&path, self.n)?;
        std::fs::remove_file(&path)?;
        Ok(took)
    }

    /// One round of the baseline on a fresh copy; checked after.
    pub fn baseline(&mut self) -> Result<Duration> {
        use db::{owners, sessions, timeline, turns};
        let path = self.copy()?;
        let mut conn = raw_sql::sqlite(path_str(&path)?)?;
        let checkpointer = Checkpointer::spawn(path_str(&path)?)?;
        let start = std::time::Instant::now();
        let now = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
        let live: Vec<(i64, String)> = sessions::table
            .inner_join(owners::table)
            .filter(sessions::state.ne("finalized"))
            .filter(owners::lease_expires_at.le(now))
            .order(sessions::id.desc())
            .select((sessions::id, sessions::state))
            .load(&mut conn)?;
        let cause = "recovered: the lease of the owner expired";
        for batch in live.chunks(RECOVER_BATCH) {
            conn.immediate_transaction(|c| {
                let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
                diesel::update(
                    sessions::table
                        .filter(sessions::id.eq_any(&ids))
                        .filter(sessions::state.ne("finalized")),
                )
                .set((
                    sessions::state.eq("finalized"),
                    sessions::end_reason.eq(Some("recovered")),
                    sessions::finalized_at.eq(Some(now)),
                    sessions::outcome.eq(Some("interrupted")),
                    sessions::open_turn.eq(None::<i64>),
                    sessions::version.eq(sessions::version + 1),
                ))
                .execute(c)?;
                diesel::update(
                    turns::table
                        .filter(turns::session.eq_any(&ids))
                        .filter(turns::ended_at.is_null()),
                )
                .set((
                    turns::ended_at.eq(Some(now)),
                    turns::outcome.eq(Some("interrupted")),
                ))
                .execute(c)?;
                let steps: Vec<_> = batch
                    .iter()
                    .map(|(id, from)| {
                        (
                            timeline::session.eq(*id),
                            timeline::steps
                                .eq(format!(r#"[[{now},"{from}","finalized","{cause}"]]"#)),
                        )
                    })
                    .collect();
                diesel::insert_into(timeline::table)
                    .values(&steps)
                    .execute(c)?;
                Ok::<_, diesel::result::Error>(())
            })?;
        }
        let took = start.elapsed();
        drop(checkpointer);
        drop(conn);
        check(&path, self.n)?;
        std::fs::remove_file(&path)?;
        Ok(took)
    }
}

/// Every session row of `path` finalized and every turn ended.
fn check(path: &Path, n: usize) -> Result<()> {
    use db::{sessions, turns};
    let mut conn = crate::durable::read_back(path)?;
    let finalized: i64 = sessions::table
        .filter(sessions::state.eq("finalized"))
        .filter(sessions::end_reason.eq("recovered"))
        .count()
        .get_result(&mut conn)?;
    let ended: i64 = turns::table
        .filter(turns::outcome.eq("interrupted"))
        .filter(turns::ended_at.is_not_null())
        .count()
        .get_result(&mut conn)?;
    if finalized != n as i64 || ended != n as i64 {
        return Err(format!(
            "recover: {finalized} sessions recovered and {ended} turns interrupted in the file, \
             expected {n}"
        )
        .into());
    }
    Ok(())
}
