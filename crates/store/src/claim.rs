//! The reclaim claim (G3, SPEC §5): one conditional UPDATE that succeeds only
//! if the session is `registered`, not already closing, and has no open turn,
//! and marks it closing in the same statement. The predicate is evaluated by
//! the database at the moment of the claim, so a turn that starts between
//! "looked idle" and "claimed" makes the claim miss; a closing session admits
//! no new turn.

use diesel::dsl::{exists, not};
use diesel::prelude::*;
use settle_core::{EndReason, SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::lease::store_now;
use crate::schema::{owners, sessions, turns};
use crate::session::{current, lease_live};
use crate::time::sid;

/// The answer to a [`claim`](crate::SessionStore::claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Claim {
    /// The session is now closing for the given reason; finalize it next.
    Claimed,
    /// The session may not be reclaimed now.
    NotEligible(Ineligible),
}

/// Why a session could not be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ineligible {
    /// It is already finalized.
    Finalized,
    /// It is not `registered` (running, cancelling or settled).
    State(State),
    /// It was already claimed by a reclaim path.
    Closing(EndReason),
    /// A turn is open (its work may still write).
    TurnInFlight(u32),
}

/// Claim session `id` for reclaim with `reason`.
pub(crate) fn claim(db: Db<'_>, id: SessionId, reason: EndReason) -> Result<Claim, StoreError> {
    let raw = sid(id)?;
    write_tx!(db, |c| {
        let now = store_now(Db::from(&mut *c))?;
        let claimed = diesel::update(
            sessions::table
                .filter(sessions::id.eq(raw))
                .filter(lease_live!(now))
                .filter(sessions::state.eq(State::Registered.as_str()))
                .filter(sessions::closing_reason.is_null())
                .filter(sessions::open_turn.is_null())
                .filter(not(exists(
                    turns::table
                        .filter(turns::session.eq(raw))
                        .filter(turns::ended_at.is_null()),
                ))),
        )
        .set((
            sessions::closing_reason.eq(Some(reason.as_str())),
            sessions::version.eq(sessions::version + 1),
        ))
        .execute(c)
        .context("claiming a session")?;
        if claimed == 1 {
            return Ok(Claim::Claimed);
        }
        let why = match current(Db::from(&mut *c), raw)? {
            None => return Err(StoreError::UnknownSession(id)),
            Some(cur) if cur.lease_expired(now) => {
                return Err(StoreError::LeaseLost(cur.owner_id()))
            }
            Some(cur) if cur.state == State::Finalized => Ineligible::Finalized,
            Some(cur) => match (cur.closing, cur.open_turn) {
                (Some(r), _) => Ineligible::Closing(r),
                (None, Some(t)) => Ineligible::TurnInFlight(t),
                (None, None) => Ineligible::State(cur.state),
            },
        };
        Ok(Claim::NotEligible(why))
    })
}
