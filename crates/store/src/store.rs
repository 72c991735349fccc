//! [`Store`]: the Diesel implementation of [`SessionStore`].

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use settle_core::{Holds, SessionId, State};

use crate::batch::{Applied, LifecycleWrite};
use crate::chain::Chain;
use crate::checkpoint::Checkpointer;
use crate::chunk::{ChunkReceipt, NewChunk};
use crate::conn::Db;
use crate::error::{OpenError, StoreError};
use crate::fleet::{Adopted, PeerRelease, Whereabouts};
use crate::lease::{OwnerId, OwnerInfo};
use crate::list::SessionFilter;
use crate::open::{open, Target};
use crate::options::StoreOptions;
use crate::page::TurnPage;
use crate::pool::ReadPool;
use crate::read::{MemoryRow, SessionDetail, SessionRow};
use crate::recover::{RecoverOptions, RecoveryCandidate, RecoveryReport};
use crate::session_store::SessionStore;
use crate::wal_backstop::WalBackstop;
use crate::writer::Writer;

/// A session store on SQLite or PostgreSQL. Cheap to clone: clones share one
/// writer thread and one read pool. When the last clone is dropped the writer
/// commits what was queued and closes its connection; dropping blocks until
/// then, or at most the close timeout ([`StoreOptions::close_timeout`]). From
/// async code, [`Store::close`] does that off the async workers.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

// Fields drop in order: the writer commits what is queued and closes first.
struct Inner {
    writer: Writer,
    pool: ReadPool,
    /// PostgreSQL: the lease's own connection.
    lease: Option<ReadPool>,
    _checkpointer: Option<Checkpointer>,
    location: String,
    postgres: bool,
    /// A shutdown gave up on its writes: closing does not wait for them.
    given_up: AtomicBool,
    /// The lifecycle batches handed one behind another (`apply_chained`).
    chain: Arc<Chain>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.given_up.load(Ordering::Acquire) {
            self.writer.leave_behind();
            if let Some(checkpointer) = self._checkpointer.as_mut() {
                checkpointer.leave_behind();
            }
        }
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.inner.location)
            .field("postgres", &self.inner.postgres)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open the store at `url` with default [`StoreOptions`].
    ///
    /// `url` is a `postgres://` or `postgresql://` URL, or else an SQLite path
    /// (optionally prefixed `sqlite://`); an SQLite file is created on first
    /// use. The schema is brought up to date. This blocks; from async code use
    /// [`Store::open_async`].
    pub fn open(url: impl AsRef<str>) -> Result<Store, OpenError> {
        Store::open_with(url, StoreOptions::default())
    }

    /// Open the store at `url` from async code: the blocking part (files,
    /// connections, migrations, which may wait for another process's lock)
    /// runs on tokio's blocking pool, not on an async worker. See
    /// [`Store::open`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("settle.db");
    /// let store = settle_store::Store::open_async(path.to_string_lossy()).await?;
    /// store.close().await;
    /// # Ok(()) }
    /// ```
    pub async fn open_async(url: impl Into<String>) -> Result<Store, OpenError> {
        Store::open_with_async(url, StoreOptions::default()).await
    }

    /// [`Store::open_async`] with `options`.
    pub async fn open_with_async(
        url: impl Into<String>,
        options: StoreOptions,
    ) -> Result<Store, OpenError> {
        let url = url.into();
        let location = Target::parse(&url).describe();
        tokio::task::spawn_blocking(move || Store::open_with(url, options))
            .await
            .map_err(|e| OpenError::Database {
                location,
                context: "opening the store on the blocking pool",
                message: e.to_string(),
            })?
    }

    /// Drop this handle from async code: when it is the last clone, closing
    /// (committing what is queued, waiting for the store's threads up to the
    /// close timeout) happens on tokio's blocking pool, not on an async
    /// worker.
    pub async fn close(self) {
        // A failed join only means the drop panicked; there is nothing left
        // to close.
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }

    /// The SQLite file `url` names (a path, `sqlite://path` or
    /// `sqlite:path`), as [`Store::open`] reads it; `None` for a
    /// PostgreSQL URL.
    pub fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
        match Target::parse(url) {
            Target::Sqlite(path) => Some(path),
            Target::Postgres(_) => None,
        }
    }

    /// Checks, touching nothing, that `url` names a location the store
    /// takes: a `postgres://` URL (its scheme in any case), or an SQLite
    /// path that is not empty, `:memory:`, an SQLite `file:` URI, a URL of
    /// another kind (`mysql://…`, `postgres:` without `//`) or libpq's
    /// keyword string (`host=… password=…`, refused without repeating it).
    /// [`Store::open`] checks the same first; a frontend that looks at the
    /// path itself before opening (is a file there?) asks this first.
    pub fn check_location(url: &str) -> Result<(), OpenError> {
        match Target::parse(url) {
            Target::Sqlite(path) => crate::open::check_sqlite_path(&path).map(|_| ()),
            Target::Postgres(_) => Ok(()),
        }
    }

    /// Open the store at `url` with `options`. See [`Store::open`].
    pub fn open_with(url: impl AsRef<str>, options: StoreOptions) -> Result<Store, OpenError> {
        let target = Target::parse(url.as_ref());
        let location = target.describe();
        let opened = open(&target, &options)?;
        let writer = Writer::spawn(
            opened.writer,
            options.batch_size(),
            options.flush_interval(),
            options.close_timeout(),
            match &target {
                Target::Postgres(url) => Some(options.bounded_pg_url(url)),
                Target::Sqlite(_) => None,
            },
            opened
                .checkpoint
                .as_deref()
                .map(|path| WalBackstop::new(path, options.wal_limit())),
        )
        .map_err(|e| OpenError::Database {
            location: location.clone(),
            context: "starting the writer thread",
            message: e.to_string(),
        })?;
        let checkpointer = opened
            .checkpoint
            .map(|path| {
                Checkpointer::spawn(
                    &path,
                    options.busy_timeout(),
                    options.durability(),
                    options.close_timeout(),
                    options.wal_limit(),
                )
            })
            .transpose()
            .map_err(|e| OpenError::Database {
                location: location.clone(),
                context: "starting the checkpoint thread",
                message: e.to_string(),
            })?;
        Ok(Store {
            inner: Arc::new(Inner {
                writer,
                pool: opened.pool,
                lease: opened.lease,
                _checkpointer: checkpointer,
                location,
                postgres: matches!(target, Target::Postgres(_)),
                given_up: AtomicBool::new(false),
                chain: Arc::default(),
            }),
        })
    }

    /// The path or (password-redacted) URL this store was opened at.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// Whether the store is on PostgreSQL (else SQLite).
    pub fn is_postgres(&self) -> bool {
        self.inner.postgres
    }

    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.inner.writer.call(f).await
    }

    /// One batch of lifecycle writes on the writer thread, as `writer`
    /// when given, `chained` behind the batch before it or not (see
    /// [`SessionStore::apply_chained`]).
    async fn apply_batch(
        &self,
        writer: Option<OwnerId>,
        batch: Vec<LifecycleWrite>,
        chained: bool,
    ) -> Vec<Result<Applied, StoreError>> {
        let n = batch.len();
        let chain = self.inner.chain.clone();
        let applied = self
            .write(move |db| chain.run(writer, chained, || crate::batch::apply(db, &batch, writer)))
            .await;
        match applied {
            Ok(results) => results,
            Err(e) => vec![Err(e); n],
        }
    }

    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let pool = self.inner.pool.clone();
        tokio::task::spawn_blocking(move || pool.with(f))
            .await
            .map_err(|_| StoreError::Unavailable)?
    }
}

#[async_trait]
impl SessionStore for Store {
    async fn register_owner(&self, owner: OwnerInfo, ttl: Duration) -> Result<OwnerId, StoreError> {
        self.write(move |db| crate::lease::register_owner(db, &owner, ttl))
            .await
    }

    /// On PostgreSQL the renewal goes on a connection of its own: queued
    /// on the writer's, it waited behind every write, and one write held
    /// by a lock another session keeps (a `LOCK TABLE`, a peer frozen in a
    /// transaction) let the lease run out on a healthy database (G8). The
    /// renewal is one statement on the `owners` row, which no other write
    /// of this store locks. SQLite has one writer at a time whatever the
    /// connection, and keeps the writer's.
    async fn renew_lease(&self, owner: OwnerId, ttl: Duration) -> Result<SystemTime, StoreError> {
        match self.inner.lease.clone() {
            Some(line) => tokio::task::spawn_blocking(move || {
                line.with(|db| crate::lease::renew_lease(db, owner, ttl))
            })
            .await
            .map_err(|_| StoreError::Unavailable)?,
            None => {
                self.write(move |db| crate::lease::renew_lease(db, owner, ttl))
                    .await
            }
        }
    }

    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        self.write(move |db| crate::ids::reserve(db, count)).await
    }

    fn append_chunk(&self, id: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt {
        self.inner.writer.append(id, turn, chunk)
    }

    fn withdraw_chunks(&self, id: SessionId, turn: u32, from: u32) {
        let withdraw = move |db: Db<'_>| crate::withdraw::withdraw(db, id, turn, from).map(drop);
        self.inner
            .writer
            .queue("withdraw the chunks given up on", withdraw);
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.write(|_| Ok(())).await
    }

    async fn apply(&self, batch: Vec<LifecycleWrite>) -> Vec<Result<Applied, StoreError>> {
        self.apply_batch(None, batch, false).await
    }

    async fn apply_as(
        &self,
        writer: OwnerId,
        batch: Vec<LifecycleWrite>,
    ) -> Vec<Result<Applied, StoreError>> {
        self.apply_batch(Some(writer), batch, false).await
    }

    async fn apply_chained(
        &self,
        writer: OwnerId,
        batch: Vec<LifecycleWrite>,
    ) -> Vec<Result<Applied, StoreError>> {
        self.apply_batch(Some(writer), batch, true).await
    }

    /// Every write goes to the one writer thread when its future is first
    /// polled, and the writer runs them in that order.
    fn applies_in_order(&self) -> bool {
        true
    }

    fn shutdown_gave_up(&self) {
        self.inner.given_up.store(true, Ordering::Release);
    }

    async fn recover(&self, options: RecoverOptions) -> Result<RecoveryReport, StoreError> {
        self.write(move |db| crate::recover::recover(db, &options))
            .await
    }

    async fn recovery_candidates(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<RecoveryCandidate>, StoreError> {
        self.read(move |db| crate::recover::candidates(db, &options))
            .await
    }

    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRow>, StoreError> {
        self.read(move |db| crate::list::list_sessions(db, &filter))
            .await
    }

    async fn last_session(&self, state: Option<State>) -> Result<Option<SessionId>, StoreError> {
        self.read(move |db| crate::list::last_session(db, state))
            .await
    }

    async fn session_detail(&self, id: SessionId) -> Result<SessionDetail, StoreError> {
        self.read(move |db| crate::read::session_detail(db, id))
            .await
    }

    async fn turn_page(
        &self,
        id: SessionId,
        turn: Option<u32>,
        from_seq: u32,
        max_chunks: usize,
    ) -> Result<TurnPage, StoreError> {
        self.read(move |db| crate::page::turn_page(db, id, turn, from_seq, max_chunks))
            .await
    }

    async fn memories(&self, id: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
        self.read(move |db| crate::read::memories(db, id)).await
    }

    async fn release(
        &self,
        owner: OwnerId,
        session: SessionId,
        holds: Holds,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.write(move |db| crate::fleet::release(db, owner, session, holds, at))
            .await
    }

    async fn release_all(
        &self,
        owner: OwnerId,
        sessions: Vec<crate::fleet::Release>,
    ) -> Vec<Result<(), StoreError>> {
        let n = sessions.len();
        match self
            .write(move |db| crate::fleet::release_all(db, owner, sessions))
            .await
        {
            Ok(results) => results,
            Err(failed) => vec![Err(failed); n],
        }
    }

    async fn record_holds(
        &self,
        owner: OwnerId,
        session: SessionId,
        holds: Holds,
    ) -> Result<(), StoreError> {
        self.write(move |db| crate::fleet::record_holds(db, owner, session, holds))
            .await
    }

    async fn adopt(
        &self,
        owner: OwnerId,
        session: SessionId,
        at: SystemTime,
    ) -> Result<Adopted, StoreError> {
        self.write(move |db| crate::fleet::adopt(db, owner, session, at))
            .await
    }

    async fn locate(&self, session: SessionId) -> Result<Whereabouts, StoreError> {
        self.read(move |db| crate::fleet::locate(db, session)).await
    }

    async fn release_expired(
        &self,
        owner: OwnerId,
        at: SystemTime,
    ) -> Result<PeerRelease, StoreError> {
        self.write(move |db| crate::fleet::release_expired(db, owner, at))
            .await
    }

    async fn reap_released(&self, idle_ttl: Duration) -> Result<Vec<SessionId>, StoreError> {
        self.write(move |db| crate::fleet::reap_released(db, idle_ttl))
            .await
    }

    async fn principal(&self, session: SessionId) -> Result<Option<String>, StoreError> {
        self.read(move |db| crate::fleet::principal(db, session))
            .await
    }

    async fn set_principal(
        &self,
        session: SessionId,
        principal: Option<String>,
    ) -> Result<(), StoreError> {
        self.write(move |db| crate::fleet::set_principal(db, session, principal.as_deref()))
            .await
    }
}
