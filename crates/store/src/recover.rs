//! Recovery (G8): finalize the sessions that a crashed process left live.
//!
//! A session is taken over when it is not finalized and its owner's lease has
//! expired, or its owner ran on this host and its process is gone. Each such
//! session goes through the finalize latch ([`latch`](crate::latch): so two
//! recoverers, or a recoverer and a batch's finalize, finalize it once), with
//! end reason `recovered`; its open turn becomes `interrupted`; no memory is
//! committed; the transcript is left as it was. Running it again finds nothing.
//!
//! [`candidates`] is the same search without the writes, for
//! `settle recover --dry-run`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{EndReason, SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::latch::{spend, Ending};
use crate::lease::{store_now, HostIdentity, OwnerColumns, OwnerId, OwnerRow, OWNER_COLUMNS};
use crate::schema::{owners, sessions};
use crate::time::{session_id, to_millis, turn_no, word};

/// Where and when recovery runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverOptions {
    /// Where the recoverer runs: owners in the same place (same machine
    /// identity and PID namespace) are checked for a live process.
    pub here: HostIdentity,
    /// The recoverer's time, recorded as the recovered sessions' finalize
    /// time. Leases are judged by the store's clock, never by this.
    pub now: SystemTime,
}

impl RecoverOptions {
    /// Recover from this process's place, now.
    pub fn now_on_this_host() -> Self {
        RecoverOptions {
            here: HostIdentity::this_process(),
            now: SystemTime::now(),
        }
    }
}

/// Why an owner's sessions were taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OwnerGone {
    /// Its lease expired.
    LeaseExpired,
    /// It ran in the recoverer's place (machine and PID namespace) and its
    /// process no longer exists.
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

/// A session that recovery would take over, with its owner and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryCandidate {
    /// The session.
    pub session: SessionId,
    /// Its name.
    pub name: String,
    /// Its state now (anything but finalized).
    pub state: State,
    /// The turn still open, which recovery would mark `interrupted`.
    pub open_turn: Option<u32>,
    /// The process that owns it.
    pub owner: OwnerRow,
    /// Why its owner counts as gone.
    pub reason: OwnerGone,
}

type LiveColumns = (i64, String, String, Option<i64>, OwnerColumns);

/// Every session left live by a gone owner, newest first (children before
/// their parents), read in one snapshot. Writes nothing.
pub(crate) fn candidates(
    mut db: Db<'_>,
    opts: &RecoverOptions,
) -> Result<Vec<RecoveryCandidate>, StoreError> {
    let now = store_now(db.reborrow())?;
    let live: Vec<LiveColumns> = read_tx!(db, |c| sessions::table
        .inner_join(owners::table)
        .filter(sessions::state.ne(State::Finalized.as_str()))
        // A released session was left for adoption, not by a crash.
        .filter(sessions::released_at.is_null())
        .order(sessions::id.desc())
        .select((
            sessions::id,
            sessions::name,
            sessions::state,
            sessions::open_turn,
            OWNER_COLUMNS,
        ))
        .load(c))
    .context("looking for sessions left live")?;

    let mut verdicts: BTreeMap<i64, Option<OwnerGone>> = BTreeMap::new();
    let mut found = Vec::new();
    for (id, name, state, open_turn, owner) in live {
        let owner = OwnerRow::from_columns(owner)?;
        let verdict = *verdicts
            .entry(owner.id.raw()?)
            .or_insert_with(|| verdict(&owner, now, &opts.here));
        let Some(reason) = verdict else { continue };
        found.push(RecoveryCandidate {
            session: session_id(id),
            name,
            state: word("sessions.state", &state)?,
            open_turn: open_turn.map(turn_no).transpose()?,
            owner,
            reason,
        });
    }
    Ok(found)
}

/// Whether `owner` is gone at `now` (milliseconds, the store's clock), seen
/// from `here`: its lease expired, or it shares processes with `here` (same
/// machine identity and PID namespace, never a host name alone) and its
/// process is gone.
pub(crate) fn verdict(owner: &OwnerRow, now: i64, here: &HostIdentity) -> Option<OwnerGone> {
    if to_millis(owner.lease_expires_at) <= now {
        Some(OwnerGone::LeaseExpired)
    } else if owner.identity.shares_processes_with(here)
        && crate::sys::process_is_gone(i64::from(owner.pid)) == Some(true)
    {
        Some(OwnerGone::ProcessGone)
    } else {
        None
    }
}

/// Recover every session left live by a gone owner.
pub(crate) fn recover(mut db: Db<'_>, opts: &RecoverOptions) -> Result<RecoveryReport, StoreError> {
    let now = to_millis(opts.now);
    let found = candidates(db.reborrow(), opts)?;
    let mut report = RecoveryReport::default();
    for candidate in &found {
        let gone = (candidate.owner.id, candidate.reason);
        if !report.owners_gone.contains(&gone) {
            report.owners_gone.push(gone);
        }
    }
    report.owners_gone.sort();
    for candidate in found {
        let RecoveryCandidate {
            session: id,
            owner,
            reason: gone,
            ..
        } = candidate;
        let cause = match gone {
            OwnerGone::LeaseExpired => {
                format!("recovered: the lease of owner {} expired", owner.id)
            }
            OwnerGone::ProcessGone => format!(
                "recovered: owner {} (process {} on {}) is gone",
                owner.id, owner.pid, owner.host
            ),
        };
        let ending = Ending {
            reason: EndReason::Recovered,
            outcome: None,
            at: now,
            owner: owner.id.raw()?,
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
