//! The durable side of settle's session lifecycle: transcripts, turns, the
//! timeline, memory, the finalize latch, leases and recovery, on a real
//! database through Diesel — SQLite by default (a file, created on first use),
//! PostgreSQL when several processes share one store.
//!
//! **One write path**: every lifecycle write — a registration, a transition,
//! a turn's start or end, a finalize — is a [`LifecycleWrite`] in a batch
//! given to [`SessionStore::apply`], which answers each write on its own.
//! What else the trait writes is not the lifecycle: the owner's lease, id
//! reservations, the transcript's chunks, and recovery.
//!
//! The guarantees this crate carries (see the project's SPEC):
//!
//! - **G2 finalize exactly once**: a finalize
//!   ([`LifecycleWrite::Finalize`]) is a conditional UPDATE (compare-and-set
//!   on the state and a version), so exactly one writer wins across
//!   connections and processes; so is recovery's.
//! - **G7 nothing acknowledged is lost**: a chunk's [`ChunkReceipt`] resolves
//!   only after the transaction holding it committed; memory is committed only
//!   from completed turns.
//! - **G8 recovery**: [`SessionStore::recover`] finalizes, once, the sessions
//!   of owners whose lease expired (by the store's clock, never the
//!   recoverer's) or whose process is gone from the same machine and PID
//!   namespace ([`HostIdentity`]; a host name alone never counts). An owner
//!   whose lease expired writes nothing more: its renewal and every write of
//!   its own fail with [`StoreError::LeaseLost`], checked in the write's
//!   transaction.
//! - **G10 closed handles fail loudly**: any write to a finalized session is
//!   refused with [`StoreError::SessionClosed`]; a write to an ended turn with
//!   [`StoreError::TurnClosed`].
//! - **G11 bad input is refused whole**: a bad location gives one
//!   [`OpenError`] and nothing is written.
//!
//! The reclaim claim (G3) is the core's, which owns every lifecycle fact:
//! it re-evaluates the reclaim predicate and marks the session closing in
//! one step of its state machine, and the store records the finalize that
//! follows.
//!
//! Diesel is synchronous, so it never runs on an async worker: every write
//! goes through one writer thread per [`Store`] (which group-commits chunk
//! appends), every read through a connection pool on `spawn_blocking`.
//!
//! Lifecycle writes are group-committed too: [`SessionStore::apply`] applies
//! its batch in one transaction with multi-row statements. The timeline
//! keeps the transitions one session gets from one batch in one segment;
//! a session's last segment (the one its finalize writes) is named from its
//! row, shared by the sessions a batch ended alike, and a turn whose end
//! the finalize carried ends with the session's row. So a teardown writes
//! one row per session, its own, in a conditional update per set of
//! sessions that reads nothing first (G2 still holds row by row).
//!
//! [`MemoryStore`] keeps the same rules in memory and answers at once, for
//! tests under tokio's paused clock and for benchmarks that stub the store out.
//!
//! # What a commit survives
//!
//! SQLite runs in WAL mode. With the default [`Durability::Normal`]
//! (`synchronous = NORMAL`) a write that was answered survives the process
//! being killed (`kill -9`, a panic, an out-of-memory kill) but an
//! operating-system crash or a power loss may lose the last commits (never
//! the database itself); [`Durability::Full`]
//! ([`StoreOptions::with_durability`]) syncs every commit to the disk before
//! answering it, so it survives a power loss too, at the disk's cost per
//! commit. PostgreSQL keeps its server's own settings.
//!
//! # Who may read the file
//!
//! A SQLite file the store creates is readable and writable by its owner
//! only (mode `0600`, less what the umask takes), and so are its `-wal` and
//! `-shm` companions, which SQLite makes with the database's mode:
//! transcripts hold what users typed and what models answered. A file that
//! was there keeps its mode; `chmod` one to share it.
//!
//! # Building: PostgreSQL support is always built in
//!
//! libpq, PostgreSQL's client library, is compiled from source with the crate
//! (pq-sys's bundled build), like SQLite is: building needs a C compiler and
//! nothing else — no `libpq-dev`, no `pg_config`. Two things follow:
//!
//! - TLS to PostgreSQL is a cargo feature, `postgres-tls` (off by default),
//!   because it links OpenSSL, whose headers (`libssl-dev`) a fresh machine
//!   may lack. Without it a URL that asks for TLS (`sslmode=require`) is
//!   refused on open with [`OpenError::TlsNotBuilt`], which names the
//!   feature; `sslmode=prefer`, libpq's default, connects in plain text.
//!   Build the binary with it: `cargo build -p settle-cli -F settle-store/postgres-tls`.
//! - A URL without a host (`postgres:///settle`) looks for the server's
//!   socket in `/tmp`, libpq's own default; a distribution's server may keep
//!   it elsewhere: say so in the URL (`postgres:///settle?host=/var/run/postgresql`).
//!
//! # Building: the SQLite the benchmarks measured
//!
//! The benchmarks measure SQLite built multi-threaded (`SQLITE_THREADSAFE=2`:
//! no mutex per call, safe because no connection is ever shared by two
//! threads). That build flag is an environment variable of the build
//! (`LIBSQLITE3_FLAGS`), which this workspace's `.cargo/config.toml` sets and
//! which a dependency cannot set for its embedder: set it in the embedding
//! program's own `.cargo/config.toml` (see [`sqlite_threading`], which also
//! tells which build a program has).
//!
//! # Opening a store and recovering
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use settle_store::{
//!     Applied, LifecycleWrite, NewSession, OwnerInfo, RecoverOptions, SessionStore, Store,
//! };
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("settle.db");
//! let store = Store::open(path.to_str().ok_or("not UTF-8")?)?;
//!
//! let runtime = tokio::runtime::Runtime::new()?;
//! runtime.block_on(async {
//!     // A process registers itself and owns the sessions it creates.
//!     let owner = store.register_owner(OwnerInfo::this_process(), Duration::from_secs(30)).await?;
//!     let registered = store
//!         .apply(vec![LifecycleWrite::Register(NewSession::new("root", owner))])
//!         .await;
//!     let Some(Ok(Applied::Registered(id))) = registered.first().cloned() else {
//!         return Err(format!("not registered: {registered:?}").into());
//!     };
//!
//!     // At start-up, finalize whatever crashed processes left live. Our own
//!     // lease is live and our process is running, so nothing is recovered.
//!     let report = store.recover(RecoverOptions::now_on_this_host()).await?;
//!     assert!(report.recovered.is_empty());
//!     assert_eq!(store.last_session(None).await?, Some(id));
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(()) }
//! ```

#[macro_use]
mod conn;
#[macro_use]
mod ids;

mod batch;
mod chain;
mod checkpoint;
mod chunk;
mod durability;
mod error;
mod fleet;
mod input;
mod latch;
mod lease;
mod list;
mod memory;
mod open;
mod options;
mod page;
mod pool;
mod read;
mod recover;
mod redact;
mod rows;
mod rules;
mod schema;
mod session;
mod session_store;
mod sqlite_build;
mod store;
mod sys;
mod thread;
mod time;
mod timeline;
mod wal_backstop;
mod withdraw;
mod writer;

pub use batch::{Applied, LifecycleWrite};
pub use chunk::{ChunkAck, ChunkReceipt, NewChunk};
pub use durability::Durability;
pub use error::{DbError, OpenError, StoreError};
pub use fleet::{Adopted, PeerRelease, Release, Whereabouts};
pub use input::{Conversation, TurnInput};
pub use latch::{
    FinalizeReport, FinalizeRequest, FinalizeStep, Finalized, StepFailure, TimelineStep, TurnEnding,
};
pub use lease::{local_host_name, HostIdentity, OwnerId, OwnerInfo, OwnerRow};
pub use list::{ListCursor, ListOrder, SessionFilter};
pub use memory::MemoryStore;
pub use options::StoreOptions;
pub use page::TurnPage;
pub use read::{ChunkRow, MemoryRow, SessionDetail, SessionRow, TimelineRow, TurnRow};
pub use recover::{OwnerGone, RecoverOptions, RecoveryCandidate, RecoveryReport};
pub use session::NewSession;
pub use session_store::SessionStore;
pub use sqlite_build::{sqlite_threading, SqliteThreading};
pub use store::Store;
pub use time::rfc3339;

pub use settle_core::{
    Cause, ChunkKind, EndReason, Holds, Outcome, SessionId, State, TurnError, TurnErrorKind,
};
