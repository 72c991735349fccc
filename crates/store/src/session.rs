//! Session rows: what a registration inserts ([`NewSession`]), and one
//! session's mutable columns read on their own, for the writes outside a
//! batch (recovery's latch, a refused chunk append) to say why they missed.
//! The lifecycle writes themselves are the batch's
//! ([`SessionStore::apply`](crate::SessionStore::apply)).

use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{Outcome, SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::lease::{fence, OwnerId};
use crate::schema::{owners, sessions, turns};
use crate::time::{opt_word, sid, word};

/// A session to register, as
/// [`LifecycleWrite::Register`](crate::LifecycleWrite::Register) carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    /// Its id, reserved with [`reserve_ids`](crate::SessionStore::reserve_ids);
    /// `None` to have one allocated.
    pub id: Option<SessionId>,
    /// A human-readable name (need not be unique).
    pub name: String,
    /// The parent session, which must exist and be open; `None` for a root.
    pub parent: Option<SessionId>,
    /// The owning process.
    pub owner: OwnerId,
    /// When the session was registered.
    pub created_at: SystemTime,
    /// The session this one continues (`settle chat --resume`), which must
    /// exist; `None` for a fresh start.
    pub resumed_from: Option<SessionId>,
    /// Who may use it through a gateway, recorded in the same write as its
    /// row ([`SessionStore::principal`](crate::SessionStore::principal));
    /// `None`: nobody's in particular.
    pub principal: Option<String>,
}

impl NewSession {
    /// A root session named `name`, owned by `owner`, registered now.
    pub fn new(name: impl Into<String>, owner: OwnerId) -> Self {
        NewSession {
            id: None,
            name: name.into(),
            parent: None,
            owner,
            created_at: SystemTime::now(),
            resumed_from: None,
            principal: None,
        }
    }

    /// Record it as `principal`'s (a gateway's client), with its row.
    pub fn for_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// Register it under `id`, reserved earlier with
    /// [`reserve_ids`](crate::SessionStore::reserve_ids).
    pub fn with_id(mut self, id: SessionId) -> Self {
        self.id = Some(id);
        self
    }

    /// Make it a child of `parent`.
    pub fn with_parent(mut self, parent: SessionId) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Record it as the continuation of `previous`.
    pub fn resuming(mut self, previous: SessionId) -> Self {
        self.resumed_from = Some(previous);
        self
    }

    /// Record it as registered at `at`.
    pub fn at(mut self, at: SystemTime) -> Self {
        self.created_at = at;
        self
    }
}

/// The mutable columns of a session, as one read sees them.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) state: State,
    pub(crate) version: i64,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) open_turn: Option<u32>,
    pub(crate) owner: i64,
    /// When the owner's lease runs out.
    pub(crate) lease_expires_at: i64,
    /// Whether its owner released it for adoption (SPEC §12).
    pub(crate) released: bool,
}

impl Current {
    /// Whether the owner's lease expired at `now` (by the store's clock).
    pub(crate) fn lease_expired(&self, now: i64) -> bool {
        fence(self.owner, self.lease_expires_at, now).is_err()
    }

    /// The owner.
    pub(crate) fn owner_id(&self) -> OwnerId {
        OwnerId(self.owner.unsigned_abs())
    }
}

type CurrentColumns = (
    String,
    i64,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
);

/// Read the mutable columns of session `id` and its owner's lease, if it
/// exists.
pub(crate) fn current(db: Db<'_>, id: i64) -> Result<Option<Current>, StoreError> {
    let row: Option<CurrentColumns> = on_db!(db, |c| sessions::table
        .inner_join(owners::table)
        .filter(sessions::id.eq(id))
        .select((
            sessions::state,
            sessions::version,
            sessions::outcome,
            sessions::open_turn,
            sessions::owner,
            owners::lease_expires_at,
            sessions::released_at,
        ))
        .first(c)
        .optional())
    .context("reading a session")?;
    row.map(
        |(state, version, outcome, open_turn, owner, lease_expires_at, released_at)| {
            Ok(Current {
                state: word("sessions.state", &state)?,
                version,
                outcome: opt_word("sessions.outcome", outcome.as_deref())?,
                open_turn: open_turn.map(crate::time::turn_no).transpose()?,
                owner,
                lease_expires_at,
                released: released_at.is_some(),
            })
        },
    )
    .transpose()
}

/// Why a write to turn `no` of session `id` was refused: the session is
/// unknown, its owner's lease expired (at `now`), it is finalized, or the
/// turn is unknown or has ended.
pub(crate) fn why_turn_refused(
    mut db: Db<'_>,
    id: SessionId,
    no: u32,
    now: i64,
) -> Result<StoreError, StoreError> {
    let raw = sid(id)?;
    match current(db.reborrow(), raw)? {
        None => return Ok(StoreError::UnknownSession(id)),
        Some(cur) if cur.lease_expired(now) => return Ok(StoreError::LeaseLost(cur.owner_id())),
        Some(cur) if cur.state == State::Finalized => return Ok(StoreError::SessionClosed(id)),
        Some(_) => {}
    }
    let ended: Option<Option<i64>> = on_db!(db, |c| turns::table
        .find((raw, i64::from(no)))
        .select(turns::ended_at)
        .first(c)
        .optional())
    .context("reading a turn")?;
    Ok(match ended {
        None => StoreError::UnknownTurn {
            session: id,
            turn: no,
        },
        Some(_) => StoreError::TurnClosed {
            session: id,
            turn: no,
        },
    })
}
