//! Owners and their leases (G8): a process registers itself as an owner, owns
//! the sessions it creates, and keeps them by renewing its lease. Recovery takes
//! a session over only once its owner's lease has expired, or once the owner's
//! process is gone from the same machine and PID namespace.
//!
//! Expiry is judged by the store's clock — PostgreSQL's, or on SQLite (one
//! machine) the local one — when a lease is granted, renewed, checked by a
//! write, and checked by recovery; never by a recoverer's own clock. A lease
//! that expired stays lost: it cannot be renewed, and every write of its
//! owner (a session's rows, turns, chunks, finalize) is refused with
//! [`StoreError::LeaseLost`] in the write's own transaction, so a process
//! that woke up late never writes over a recovery.

use std::fmt;
use std::time::{Duration, SystemTime};

use diesel::prelude::*;

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::schema::owners;
use crate::time::{duration_millis, from_millis, to_millis};

/// The identity of an owning process, allocated by the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerId(pub u64);

impl OwnerId {
    pub(crate) fn raw(self) -> Result<i64, StoreError> {
        i64::try_from(self.0).map_err(|_| StoreError::OutOfRange {
            what: "owner id",
            value: self.0,
        })
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a process runs, as recovery compares it: a pid names the same
/// process in two places only when both have the same machine identity
/// (`/etc/machine-id`, else the boot id) and the same PID namespace (the
/// inode of `/proc/self/ns/pid`). Two containers, or two cloned machines,
/// with the same host name differ here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostIdentity {
    /// The machine identity, if it could be read.
    pub machine: Option<String>,
    /// The PID namespace, if it could be read.
    pub pid_namespace: Option<u64>,
}

impl HostIdentity {
    /// Where this process runs.
    pub fn this_process() -> Self {
        HostIdentity {
            machine: crate::sys::machine_id(),
            pid_namespace: crate::sys::pid_namespace(),
        }
    }

    /// Where this process runs, read once: a fleet's lookups judge a peer
    /// from it on every `locate` and adoption.
    pub(crate) fn here() -> &'static HostIdentity {
        static HERE: std::sync::OnceLock<HostIdentity> = std::sync::OnceLock::new();
        HERE.get_or_init(HostIdentity::this_process)
    }

    /// A place known to share processes with none: recovery from it trusts
    /// leases alone.
    pub fn unknown() -> Self {
        HostIdentity {
            machine: None,
            pid_namespace: None,
        }
    }

    /// Whether a pid here names the same process as the same pid in
    /// `other`: both identities known and equal.
    pub fn shares_processes_with(&self, other: &HostIdentity) -> bool {
        matches!(
            (&self.machine, &other.machine, self.pid_namespace, other.pid_namespace),
            (Some(a), Some(b), Some(x), Some(y)) if a == b && x == y
        )
    }
}

/// Who owns sessions: a process on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerInfo {
    /// The host name, for people reading recovery's report; recovery never
    /// decides by it.
    pub host: String,
    /// Where the process runs, compared by recovery's "process gone" shortcut.
    pub identity: HostIdentity,
    /// The process id, checked for liveness by recovery from the same place.
    pub pid: u32,
    /// When the process started.
    pub started_at: SystemTime,
    /// Where clients reach the process (a gateway's advertised URL, SPEC
    /// §12), if anywhere.
    pub advertise: Option<String>,
}

impl OwnerInfo {
    /// This process, on this host, starting now.
    pub fn this_process() -> Self {
        OwnerInfo {
            host: crate::sys::host_name(),
            identity: HostIdentity::this_process(),
            pid: std::process::id(),
            started_at: SystemTime::now(),
            advertise: None,
        }
    }

    /// The same, advertising where clients reach the process.
    pub fn advertising(mut self, url: impl Into<String>) -> Self {
        self.advertise = Some(url.into());
        self
    }
}

/// An owner as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRow {
    /// Its id.
    pub id: OwnerId,
    /// The host name it gave.
    pub host: String,
    /// Where it runs (unknown for owners registered before this was kept).
    pub identity: HostIdentity,
    /// Its process id there.
    pub pid: u32,
    /// When its process started.
    pub started_at: SystemTime,
    /// When its lease runs out unless renewed.
    pub lease_expires_at: SystemTime,
}

/// The columns of an owner, in [`OWNER_COLUMNS`] order.
pub(crate) type OwnerColumns = (i64, String, i64, i64, i64, Option<String>, Option<i64>);

/// The owner columns [`OwnerRow::from_columns`] reads.
pub(crate) const OWNER_COLUMNS: (
    owners::id,
    owners::host,
    owners::pid,
    owners::started_at,
    owners::lease_expires_at,
    owners::machine,
    owners::pid_namespace,
) = (
    owners::id,
    owners::host,
    owners::pid,
    owners::started_at,
    owners::lease_expires_at,
    owners::machine,
    owners::pid_namespace,
);

impl OwnerRow {
    pub(crate) fn from_columns(
        (id, host, pid, started_at, lease, machine, pid_namespace): OwnerColumns,
    ) -> Result<Self, StoreError> {
        Ok(OwnerRow {
            id: OwnerId(id.unsigned_abs()),
            host,
            identity: HostIdentity {
                machine,
                pid_namespace: pid_namespace.map(i64::unsigned_abs),
            },
            pid: u32::try_from(pid).map_err(|_| StoreError::Corrupt {
                session: None,
                column: "owners.pid",
                value: pid.to_string(),
            })?,
            started_at: from_millis(started_at),
            lease_expires_at: from_millis(lease),
        })
    }
}

/// This host's name as [`OwnerInfo::this_process`] records it.
pub fn local_host_name() -> String {
    crate::sys::host_name()
}

/// PostgreSQL's clock, in milliseconds since the UNIX epoch. A statement of
/// its own type, so Diesel keeps it prepared (its `sql_query` is parsed
/// again every time, and every batch and chunk commit reads the clock).
struct ClockNow;

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for ClockNow {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> diesel::QueryResult<()> {
        out.push_sql("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint");
        Ok(())
    }
}

impl diesel::query_builder::QueryId for ClockNow {
    type QueryId = ClockNow;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for ClockNow {
    type SqlType = diesel::sql_types::BigInt;
}

impl<Conn> RunQueryDsl<Conn> for ClockNow {}

/// The store's clock, in milliseconds since the UNIX epoch: PostgreSQL's
/// (shared by every process on the store), or on SQLite this machine's.
pub(crate) fn store_now(db: Db<'_>) -> Result<i64, StoreError> {
    match db {
        Db::Sqlite(_) => Ok(to_millis(SystemTime::now())),
        Db::Pg(c) => ClockNow
            .get_result::<i64>(c)
            .context("reading the store's clock"),
    }
}

/// Insert an owner whose lease runs `ttl` from now, by the store's clock.
pub(crate) fn register_owner(
    mut db: Db<'_>,
    info: &OwnerInfo,
    ttl: Duration,
) -> Result<OwnerId, StoreError> {
    let expires = store_now(db.reborrow())?.saturating_add(duration_millis(ttl));
    let pid_namespace = info
        .identity
        .pid_namespace
        .map(|ns| i64::try_from(ns).unwrap_or(i64::MAX));
    let id: i64 = on_db!(db, |c| diesel::insert_into(owners::table)
        .values((
            owners::host.eq(&info.host),
            owners::pid.eq(i64::from(info.pid)),
            owners::started_at.eq(to_millis(info.started_at)),
            owners::lease_expires_at.eq(expires),
            owners::machine.eq(info.identity.machine.as_deref()),
            owners::pid_namespace.eq(pid_namespace),
            owners::advertise.eq(info.advertise.as_deref()),
        ))
        .returning(owners::id)
        .get_result(c))
    .context("registering an owner")?;
    Ok(OwnerId(id.unsigned_abs()))
}

/// Extend a live lease to `ttl` from now, by the store's clock. A lease that
/// has already expired cannot be renewed: its sessions may be under recovery.
pub(crate) fn renew_lease(
    mut db: Db<'_>,
    owner: OwnerId,
    ttl: Duration,
) -> Result<SystemTime, StoreError> {
    let raw = owner.raw()?;
    // The clock is read once the write lock is held (SQLite's `BEGIN
    // IMMEDIATE`): read before, it would be as old as the wait for a lock
    // another process holds, and a lease that ran out meanwhile would be
    // renewed (G8).
    let (renewed, expires) = write_tx!(db.reborrow(), |c| {
        let now = store_now(Db::from(&mut *c))?;
        let expires = now.saturating_add(duration_millis(ttl));
        let renewed = diesel::update(
            owners::table
                .filter(owners::id.eq(raw))
                .filter(owners::lease_expires_at.gt(now)),
        )
        .set(owners::lease_expires_at.eq(expires))
        .execute(c)
        .context("renewing a lease")?;
        Ok::<_, StoreError>((renewed, expires))
    })?;
    if renewed == 1 {
        return Ok(from_millis(expires));
    }
    let exists: i64 = on_db!(db, |c| owners::table
        .filter(owners::id.eq(raw))
        .count()
        .get_result(c))
    .context("looking up an owner")?;
    Err(if exists == 0 {
        StoreError::UnknownOwner(owner)
    } else {
        StoreError::LeaseLost(owner)
    })
}

/// Refuse a write of `owner` whose lease expired at `expires` (by the
/// store's clock reading `now`).
pub(crate) fn fence(owner: i64, expires: i64, now: i64) -> Result<(), StoreError> {
    if expires > now {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(OwnerId(owner.unsigned_abs())))
    }
}
