//! Session rows and their turns: creating a session, moving it between states
//! (conditionally, with a timeline row in the same transaction), opening and
//! ending turns. Every write is one conditional UPDATE whose affected-row count
//! says whether it applied; only when it did not is the row read, to say why.

use std::time::SystemTime;

use diesel::dsl::exists;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use serde_json::Value;
use settle_core::{Cause, EndReason, Outcome, SessionId, State, TurnError};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::lease::{check_owner, fence, store_now, OwnerId};
use crate::rules::allowed;
use crate::schema::{owners, sessions, turns};
use crate::time::{json_text, opt_word, session_id, sid, to_millis, word};
use crate::timeline::{record, Step};

/// What [`create_session`](crate::SessionStore::create_session) inserts.
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
        }
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

/// The states in which a session can still take a child.
const OPEN_STATES: [&str; 3] = ["registered", "running", "cancelling"];

/// The mutable columns of a session, as one read sees them.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) state: State,
    pub(crate) version: i64,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) open_turn: Option<u32>,
    pub(crate) closing: Option<EndReason>,
    pub(crate) owner: i64,
    /// When the owner's lease runs out.
    pub(crate) lease_expires_at: i64,
}

impl Current {
    /// Refuse an owner write once the owner's lease expired (at `now`, by
    /// the store's clock).
    pub(crate) fn fence(&self, now: i64) -> Result<(), StoreError> {
        fence(self.owner, self.lease_expires_at, now)
    }

    /// Whether the owner's lease expired at `now`.
    pub(crate) fn lease_expired(&self, now: i64) -> bool {
        self.fence(now).is_err()
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
    Option<String>,
    i64,
    i64,
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
            sessions::closing_reason,
            sessions::owner,
            owners::lease_expires_at,
        ))
        .first(c)
        .optional())
    .context("reading a session")?;
    row.map(
        |(state, version, outcome, open_turn, closing, owner, lease_expires_at)| {
            Ok(Current {
                state: word("sessions.state", &state)?,
                version,
                outcome: opt_word("sessions.outcome", outcome.as_deref())?,
                open_turn: open_turn.map(crate::time::turn_no).transpose()?,
                closing: opt_word("sessions.closing_reason", closing.as_deref())?,
                owner,
                lease_expires_at,
            })
        },
    )
    .transpose()
}

/// Whether the owner of the session being written (`sessions::owner` of the
/// row the statement is on) still holds its lease at `now`.
macro_rules! lease_live {
    ($now:expr) => {
        exists(
            owners::table
                .filter(owners::id.eq(sessions::owner))
                .filter(owners::lease_expires_at.gt($now)),
        )
    };
}
pub(crate) use lease_live;

/// Insert a session (and its first timeline row) and return its id.
pub(crate) fn create_session(db: Db<'_>, new: &NewSession) -> Result<SessionId, StoreError> {
    let parent = new.parent.map(sid).transpose()?;
    let resumed_from = new.resumed_from.map(sid).transpose()?;
    let owner = new.owner.raw()?;
    let at = to_millis(new.created_at);
    write_tx!(db, |c| {
        let now = store_now(Db::from(&mut *c))?;
        if let (Some(raw), Some(previous)) = (resumed_from, new.resumed_from) {
            let found: i64 = sessions::table
                .filter(sessions::id.eq(raw))
                .count()
                .get_result(c)
                .context("looking up the resumed session")?;
            if found == 0 {
                return Err(StoreError::UnknownSession(previous));
            }
        }
        // Touching the parent row both checks that it is open and, on
        // PostgreSQL, locks it against a concurrent finalize until we commit.
        let tree = match (parent, new.parent) {
            (Some(p), Some(parent_id)) => {
                let tree: Option<i64> = diesel::update(
                    sessions::table
                        .filter(sessions::id.eq(p))
                        .filter(sessions::state.eq_any(OPEN_STATES)),
                )
                .set(sessions::version.eq(sessions::version))
                .returning(sessions::tree)
                .get_result(c)
                .optional()
                .context("checking the parent session")?;
                match tree {
                    Some(t) => Some(t),
                    None => {
                        return Err(match current(Db::from(&mut *c), p)? {
                            None => StoreError::UnknownSession(parent_id),
                            Some(cur) => StoreError::ParentClosed {
                                parent: parent_id,
                                state: cur.state,
                            },
                        })
                    }
                }
            }
            _ => None,
        };
        check_owner(Db::from(&mut *c), new.owner, now)?;
        // Every id comes from the reservation counter, so explicit and
        // allocated ids never collide.
        let id = match new.id {
            Some(id) => sid(id)?,
            None => {
                let range = reserve_ids_on!(&mut *c, 1_u32)?;
                sid(SessionId(range.start))?
            }
        };
        let inserted: Result<i64, DieselError> = diesel::insert_into(sessions::table)
            .values((
                sessions::id.eq(id),
                sessions::name.eq(&new.name),
                sessions::parent.eq(parent),
                sessions::tree.eq(tree.unwrap_or(0)),
                sessions::state.eq(State::Registered.as_str()),
                sessions::created_at.eq(at),
                sessions::version.eq(0_i64),
                sessions::owner.eq(owner),
                sessions::resumed_from.eq(resumed_from),
            ))
            .returning(sessions::id)
            .get_result(c);
        let id = match inserted {
            Ok(id) => id,
            Err(DieselError::DatabaseError(DatabaseErrorKind::ForeignKeyViolation, _)) => {
                return Err(StoreError::UnknownOwner(new.owner))
            }
            Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                return Err(StoreError::DuplicateSession(session_id(id)))
            }
            Err(e) => return Err(e).context("inserting a session"),
        };
        if tree.is_none() {
            diesel::update(sessions::table.find(id))
                .set(sessions::tree.eq(id))
                .execute(c)
                .context("rooting a session's tree")?;
        }
        record(
            Db::from(&mut *c),
            id,
            Step {
                at,
                from: None,
                to: State::Registered,
                cause: &Cause::Registered.to_string(),
            },
        )?;
        Ok(session_id(id))
    })
}

/// Move session `id` from `from` to `to`, only if it is in `from` now.
pub(crate) fn transition(
    db: Db<'_>,
    id: SessionId,
    from: State,
    to: State,
    cause: &str,
    at: SystemTime,
) -> Result<(), StoreError> {
    let raw = sid(id)?;
    if !allowed(from, to) {
        return Err(StoreError::InvalidTransition {
            session: id,
            from,
            to,
        });
    }
    let at = to_millis(at);
    write_tx!(db, |c| {
        let now = store_now(Db::from(&mut *c))?;
        let moved = diesel::update(
            sessions::table
                .filter(sessions::id.eq(raw))
                .filter(sessions::state.eq(from.as_str()))
                .filter(lease_live!(now)),
        )
        .set((
            sessions::state.eq(to.as_str()),
            sessions::version.eq(sessions::version + 1),
        ))
        .execute(c)
        .context("moving a session to a new state")?;
        if moved == 0 {
            return Err(match current(Db::from(&mut *c), raw)? {
                None => StoreError::UnknownSession(id),
                Some(cur) if cur.lease_expired(now) => StoreError::LeaseLost(cur.owner_id()),
                Some(cur) if cur.state == State::Finalized => StoreError::SessionClosed(id),
                Some(cur) => StoreError::StateMismatch {
                    session: id,
                    expected: from,
                    found: cur.state,
                },
            });
        }
        record(
            Db::from(&mut *c),
            raw,
            Step {
                at,
                from: Some(from),
                to,
                cause,
            },
        )
    })
}

/// Open turn `no` of session `id`: only while the session is registered or
/// running, not closing, and has no other open turn.
pub(crate) fn start_turn(
    db: Db<'_>,
    id: SessionId,
    no: u32,
    input: Option<&Value>,
    at: SystemTime,
) -> Result<(), StoreError> {
    let raw = sid(id)?;
    let at = to_millis(at);
    let input = input.map(json_text);
    write_tx!(db, |c| {
        let now = store_now(Db::from(&mut *c))?;
        let opened = diesel::update(
            sessions::table
                .filter(sessions::id.eq(raw))
                .filter(lease_live!(now))
                .filter(sessions::state.eq_any(["registered", "running"]))
                .filter(sessions::closing_reason.is_null())
                .filter(sessions::open_turn.is_null()),
        )
        .set((
            sessions::open_turn.eq(Some(i64::from(no))),
            sessions::version.eq(sessions::version + 1),
        ))
        .execute(c)
        .context("opening a turn")?;
        if opened == 0 {
            return Err(match current(Db::from(&mut *c), raw)? {
                None => StoreError::UnknownSession(id),
                Some(cur) if cur.lease_expired(now) => StoreError::LeaseLost(cur.owner_id()),
                Some(cur) if cur.state == State::Finalized => StoreError::SessionClosed(id),
                Some(Current {
                    closing: Some(reason),
                    ..
                }) => StoreError::SessionClosing {
                    session: id,
                    reason,
                },
                Some(Current {
                    open_turn: Some(open),
                    ..
                }) => StoreError::TurnInFlight { session: id, open },
                Some(cur) => StoreError::NotAcceptingTurns {
                    session: id,
                    state: cur.state,
                },
            });
        }
        let inserted = diesel::insert_into(turns::table)
            .values((
                turns::session.eq(raw),
                turns::no.eq(i64::from(no)),
                turns::started_at.eq(at),
                turns::next_seq.eq(0_i64),
                turns::input.eq(input.as_deref()),
            ))
            .execute(c);
        match inserted {
            Ok(_) => Ok(()),
            Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                Err(StoreError::TurnExists {
                    session: id,
                    turn: no,
                })
            }
            Err(e) => Err(e).context("inserting a turn"),
        }
    })
}

/// End turn `no` of session `id` with `outcome` (and, when it failed, `error`);
/// later chunks for it are refused.
pub(crate) fn end_turn(
    db: Db<'_>,
    id: SessionId,
    no: u32,
    outcome: Outcome,
    error: Option<&TurnError>,
    at: SystemTime,
) -> Result<(), StoreError> {
    let raw = sid(id)?;
    let at = to_millis(at);
    write_tx!(db, |c| {
        let now = store_now(Db::from(&mut *c))?;
        let ended = diesel::update(
            turns::table
                .filter(turns::session.eq(raw))
                .filter(turns::no.eq(i64::from(no)))
                .filter(turns::ended_at.is_null())
                .filter(exists(
                    sessions::table
                        .filter(sessions::id.eq(raw))
                        .filter(sessions::state.ne(State::Finalized.as_str()))
                        .filter(lease_live!(now)),
                )),
        )
        .set((
            turns::ended_at.eq(Some(at)),
            turns::outcome.eq(Some(outcome.as_str())),
            turns::error_kind.eq(error.map(|e| e.kind.as_str())),
            turns::error_message.eq(error.map(|e| e.message.as_str())),
        ))
        .execute(c)
        .context("ending a turn")?;
        if ended == 0 {
            return Err(why_turn_refused(Db::from(&mut *c), id, no, now)?);
        }
        diesel::update(
            sessions::table
                .filter(sessions::id.eq(raw))
                .filter(sessions::open_turn.eq(i64::from(no))),
        )
        .set((
            sessions::open_turn.eq(None::<i64>),
            sessions::outcome.eq(Some(outcome.as_str())),
            sessions::version.eq(sessions::version + 1),
        ))
        .execute(c)
        .context("recording a turn's outcome on its session")?;
        Ok(())
    })
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
