//! Recovery (G8): finalize the sessions that a crashed process left live.
//!
//! A session is taken over when it is not finalized and its owner's lease has
//! expired, or its owner ran on this host and its process is gone. Each such
//! session goes through the same latch as [`finalize`](crate::SessionStore::finalize)
//! (so two recoverers, or a recoverer and a finalizer, finalize it once), with
//! end reason `recovered`; its open turn becomes `interrupted`; no memory is
//! committed; the transcript is left as it was. Running it again finds nothing.

use std::collections::BTreeMap;
use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{EndReason, SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::latch::{spend, Ending};
use crate::lease::OwnerId;
use crate::schema::{owners, sessions};
use crate::time::{session_id, to_millis};

/// Where and when recovery runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverOptions {
    /// This host's name: owners on it are checked for a live process.
    pub this_host: String,
    /// The time leases are compared with (and the sessions finalized at).
    pub now: SystemTime,
}

impl RecoverOptions {
    /// Recover as this host, now.
    pub fn now_on_this_host() -> Self {
        RecoverOptions {
            this_host: crate::sys::host_name(),
            now: SystemTime::now(),
        }
    }
}

/// Why an owner's sessions were taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerGone {
    /// Its lease expired.
    LeaseExpired,
    /// It ran on this host and its process no longer exists.
    ProcessGone,
}

/// What one recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Sessions this call finalized with end reason `recovered`, children
    /// before parents.
    pub recovered: Vec<SessionId>,
    /// Turns that were open and are now `interrupted`.
    pub interrupted_turns: Vec<(SessionId, u32)>,
    /// Owners found gone, and why.
    pub owners_gone: Vec<(OwnerId, OwnerGone)>,
    /// Sessions that another process finalized while this one looked at them.
    pub finalized_elsewhere: Vec<SessionId>,
}

/// Recover every session left live by a gone owner.
pub(crate) fn recover(mut db: Db<'_>, opts: &RecoverOptions) -> Result<RecoveryReport, StoreError> {
    let now = to_millis(opts.now);
    // Newest first: children are created after their parents, so they are
    // finalized before them (G1).
    let live: Vec<(i64, i64, String, i64, i64)> = on_db!(db.reborrow(), |c| sessions::table
        .inner_join(owners::table)
        .filter(sessions::state.ne(State::Finalized.as_str()))
        .order(sessions::id.desc())
        .select((
            sessions::id,
            owners::id,
            owners::host,
            owners::pid,
            owners::lease_expires_at,
        ))
        .load(c))
    .context("looking for sessions left live")?;

    let mut verdicts: BTreeMap<i64, Option<OwnerGone>> = BTreeMap::new();
    for (_, owner, host, pid, lease) in &live {
        verdicts.entry(*owner).or_insert_with(|| {
            if *lease <= now {
                Some(OwnerGone::LeaseExpired)
            } else if *host == opts.this_host && crate::sys::process_is_gone(*pid) == Some(true) {
                Some(OwnerGone::ProcessGone)
            } else {
                None
            }
        });
    }

    let mut report = RecoveryReport {
        owners_gone: verdicts
            .iter()
            .filter_map(|(o, v)| v.map(|v| (OwnerId(o.unsigned_abs()), v)))
            .collect(),
        ..RecoveryReport::default()
    };
    for (raw, owner, host, pid, _) in &live {
        let Some(gone) = verdicts.get(owner).copied().flatten() else {
            continue;
        };
        let id = session_id(*raw);
        let cause = match gone {
            OwnerGone::LeaseExpired => format!("recovered: the lease of owner {owner} expired"),
            OwnerGone::ProcessGone => {
                format!("recovered: owner {owner} (process {pid} on {host}) is gone")
            }
        };
        let ending = Ending {
            reason: EndReason::Recovered,
            outcome: None,
            at: now,
            owner: Some(*owner),
            cause: &cause,
        };
        let spent = write_tx!(db.reborrow(), |c| spend(Db::from(c), id, &ending))?;
        match spent {
            Some(spent) => {
                tracing::info!(session = %id, ?gone, "recovered a session left live");
                report.recovered.push(id);
                if let Some(turn) = spent.interrupted {
                    report.interrupted_turns.push((id, turn));
                }
            }
            None => report.finalized_elsewhere.push(id),
        }
    }
    Ok(report)
}
