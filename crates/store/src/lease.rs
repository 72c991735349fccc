//! Owners and their leases (G8): a process registers itself as an owner, owns
//! the sessions it creates, and keeps them by renewing its lease. Recovery takes
//! a session over only once its owner's lease has expired, or once the owner's
//! process is gone from this host.

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

/// Who owns sessions: a process on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerInfo {
    /// The host name, compared with [`RecoverOptions::this_host`](crate::RecoverOptions::this_host).
    pub host: String,
    /// The process id, checked for liveness by recovery on the same host.
    pub pid: u32,
    /// When the process started.
    pub started_at: SystemTime,
}

impl OwnerInfo {
    /// This process, on this host, starting now.
    pub fn this_process() -> Self {
        OwnerInfo {
            host: crate::sys::host_name(),
            pid: std::process::id(),
            started_at: SystemTime::now(),
        }
    }
}

/// An owner as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRow {
    /// Its id.
    pub id: OwnerId,
    /// The host it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// When its process started.
    pub started_at: SystemTime,
    /// When its lease runs out unless renewed.
    pub lease_expires_at: SystemTime,
}

impl OwnerRow {
    pub(crate) fn from_columns(
        (id, host, pid, started_at, lease): (i64, String, i64, i64, i64),
    ) -> Result<Self, StoreError> {
        Ok(OwnerRow {
            id: OwnerId(id.unsigned_abs()),
            host,
            pid: u32::try_from(pid).map_err(|_| StoreError::Corrupt {
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

/// Insert an owner whose lease runs `ttl` from now.
pub(crate) fn register_owner(
    db: Db<'_>,
    info: &OwnerInfo,
    ttl: Duration,
) -> Result<OwnerId, StoreError> {
    let now = to_millis(SystemTime::now());
    let expires = now.saturating_add(duration_millis(ttl));
    let id: i64 = on_db!(db, |c| diesel::insert_into(owners::table)
        .values((
            owners::host.eq(&info.host),
            owners::pid.eq(i64::from(info.pid)),
            owners::started_at.eq(to_millis(info.started_at)),
            owners::lease_expires_at.eq(expires),
        ))
        .returning(owners::id)
        .get_result(c))
    .context("registering an owner")?;
    Ok(OwnerId(id.unsigned_abs()))
}

/// Extend a live lease to `ttl` from now. A lease that has already expired
/// cannot be renewed: its sessions may be under recovery.
pub(crate) fn renew_lease(
    mut db: Db<'_>,
    owner: OwnerId,
    ttl: Duration,
) -> Result<SystemTime, StoreError> {
    let raw = owner.raw()?;
    let now = to_millis(SystemTime::now());
    let expires = now.saturating_add(duration_millis(ttl));
    let renewed = on_db!(db.reborrow(), |c| diesel::update(
        owners::table
            .filter(owners::id.eq(raw))
            .filter(owners::lease_expires_at.gt(now))
    )
    .set(owners::lease_expires_at.eq(expires))
    .execute(c))
    .context("renewing a lease")?;
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
