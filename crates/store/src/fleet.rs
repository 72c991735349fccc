//! A fleet of processes on one database (SPEC §12): where a session's owner
//! is, handing a session off, adopting it, releasing the sessions of a peer
//! whose lease expired, and reaping released sessions nobody adopted.
//!
//! Every move of a session between processes is one conditional update of
//! its row (a compare-and-set on its version), inside a write transaction,
//! judged by the store's clock: two processes racing to adopt one session
//! adopt it once, and a sweeper racing an adoption either finalizes it or
//! finds it owned (G2, G3). A released session keeps its last owner in
//! `owner`; `released_at` says since when nobody owns it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use diesel::prelude::*;
use settle_core::{EndReason, Holds, Outcome, SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::latch::{spend, Ending};
use crate::lease::OwnerId;
use crate::schema::{owners, released_holds, session_principals, sessions, turns};
use crate::time::{
    duration_millis, known_sid, opt_word, session_id, sid, to_millis, turn_no, word,
};
use crate::timeline::{record, Step};

/// Where a session is, as a process that may not own it asks (SPEC §12).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Whereabouts {
    /// A process owns it.
    Owned {
        /// The owner.
        owner: OwnerId,
        /// Where clients reach that process, if it said.
        advertise: Option<String>,
        /// Whether its lease is live by the store's clock.
        live: bool,
    },
    /// Released by its owner: any process of the fleet may adopt it.
    Released,
    /// Finalized: nobody may use it any more.
    Finalized,
}

/// A session adopted by this process ([`SessionStore::adopt`](crate::SessionStore::adopt)):
/// what it needs to go on with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Adopted {
    /// The session.
    pub session: SessionId,
    /// Its name.
    pub name: String,
    /// Its parent, if it has one.
    pub parent: Option<SessionId>,
    /// Turns it ran so far: the next one is `turns + 1`.
    pub turns: u32,
    /// How its last turn ended.
    pub last_outcome: Option<Outcome>,
    /// The holds it had (SPEC §5), for this process's core to keep: those
    /// it was released with, or, when its owner crashed, the last its
    /// owner recorded ([`SessionStore::record_holds`](crate::SessionStore::record_holds)).
    pub holds: Holds,
    /// Who may use it through a gateway, as recorded with
    /// [`SessionStore::set_principal`](crate::SessionStore::set_principal).
    pub principal: Option<String>,
    /// The turn a crashed owner left open, marked `interrupted` by this
    /// adoption (G8), if any.
    pub interrupted_turn: Option<u32>,
    /// The other live sessions of its tree, adopted with it: parents
    /// before children (a tree moves whole, so that G1 holds in one
    /// process). Empty in each of them.
    pub with: Vec<Adopted>,
}

/// What releasing the sessions of peers whose lease expired did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerRelease {
    /// Sessions released for adoption.
    pub released: Vec<SessionId>,
    /// Turns left open by their owner, marked `interrupted` (G8).
    pub interrupted_turns: Vec<(SessionId, u32)>,
}

type RowColumns = (
    String,
    i64,
    Option<String>,
    Option<i64>,
    i64,
    Option<i64>,
    String,
    Option<i64>,
);

/// A session's row as the fleet's moves read it.
struct Row {
    state: State,
    version: i64,
    outcome: Option<Outcome>,
    open_turn: Option<u32>,
    owner: i64,
    released_at: Option<i64>,
    name: String,
    parent: Option<i64>,
}

fn row(db: Db<'_>, id: i64) -> Result<Option<Row>, StoreError> {
    let found: Option<RowColumns> = on_db!(db, |c| sessions::table
        .filter(sessions::id.eq(id))
        .select((
            sessions::state,
            sessions::version,
            sessions::outcome,
            sessions::open_turn,
            sessions::owner,
            sessions::released_at,
            sessions::name,
            sessions::parent,
        ))
        .first(c)
        .optional())
    .context("reading a session")?;
    found
        .map(
            |(state, version, outcome, open_turn, owner, released_at, name, parent)| {
                Ok(Row {
                    state: word("sessions.state", &state)?,
                    version,
                    outcome: opt_word("sessions.outcome", outcome.as_deref())?,
                    open_turn: open_turn.map(turn_no).transpose()?,
                    owner,
                    released_at,
                    name,
                    parent,
                })
            },
        )
        .transpose()
}

/// The lease of `owner` and where it advertised itself: `(expires, advertise)`.
fn owner(db: Db<'_>, owner: i64) -> Result<Option<(i64, Option<String>)>, StoreError> {
    on_db!(db, |c| owners::table
        .filter(owners::id.eq(owner))
        .select((owners::lease_expires_at, owners::advertise))
        .first(c)
        .optional())
    .context("reading an owner")
}

/// Whether owner `raw` is gone at `now` (its lease expired, or, on this
/// machine and PID namespace, its process is gone: as recovery judges),
/// and where clients reached it. An owner with no row is gone.
fn owner_gone(mut db: Db<'_>, raw: i64, now: i64) -> Result<(bool, Option<String>), StoreError> {
    let found: Option<(crate::lease::OwnerColumns, Option<String>)> =
        on_db!(db.reborrow(), |c| owners::table
            .filter(owners::id.eq(raw))
            .select((crate::lease::OWNER_COLUMNS, owners::advertise))
            .first(c)
            .optional())
        .context("reading an owner")?;
    let Some((columns, advertise)) = found else {
        return Ok((true, None));
    };
    let owner = crate::lease::OwnerRow::from_columns(columns)?;
    let gone = crate::recover::verdict(&owner, now, crate::lease::HostIdentity::here()).is_some();
    Ok((gone, advertise))
}

/// Refused with `LeaseLost` unless `me` holds its lease at `now`.
fn holds_lease(db: Db<'_>, me: OwnerId, now: i64) -> Result<i64, StoreError> {
    let raw = me.raw()?;
    match owner(db, raw)? {
        Some((expires, _)) if expires > now => Ok(raw),
        Some(_) => Err(StoreError::LeaseLost(me)),
        None => Err(StoreError::UnknownOwner(me)),
    }
}

/// Where `id` is.
pub(crate) fn locate(mut db: Db<'_>, id: SessionId) -> Result<Whereabouts, StoreError> {
    let now = crate::lease::store_now(db.reborrow())?;
    let Some(r) = row(db.reborrow(), known_sid(id)?)? else {
        return Err(StoreError::UnknownSession(id));
    };
    if r.state == State::Finalized {
        return Ok(Whereabouts::Finalized);
    }
    if r.released_at.is_some() {
        return Ok(Whereabouts::Released);
    }
    let (gone, advertise) = owner_gone(db, r.owner, now)?;
    Ok(Whereabouts::Owned {
        owner: OwnerId(r.owner.unsigned_abs()),
        advertise,
        live: !gone,
    })
}

/// Release `id`, idle and owned by `me`, for another process to adopt,
/// with its `holds` (kept for the adopter; held, it is not reaped).
pub(crate) fn release(
    db: Db<'_>,
    me: OwnerId,
    id: SessionId,
    holds: Holds,
    at: SystemTime,
) -> Result<(), StoreError> {
    let one = Release {
        session: id,
        holds,
        at,
    };
    release_all(db, me, vec![one])?
        .pop()
        .unwrap_or(Err(StoreError::UnknownSession(id)))
}

/// One session to release for adoption ([`SessionStore::release_all`](crate::SessionStore::release_all)):
/// its id, its holds (kept for its adopter) and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The session, idle and owned by the releasing process.
    pub session: SessionId,
    /// Its holds, kept for its adopter ([`Adopted::holds`]).
    pub holds: Holds,
    /// When it is released (its timeline step's time).
    pub at: SystemTime,
}

/// Release each of `sessions` as [`release`] does, in one transaction: the
/// lease checked once, each row then checked, moved and given its timeline
/// step on its own, so that one refused (not idle, not `me`'s) leaves the
/// others released. A database failure fails the whole transaction (`Err`):
/// none is released.
pub(crate) fn release_all(
    mut db: Db<'_>,
    me: OwnerId,
    sessions: Vec<Release>,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    write_tx!(db.reborrow(), |c| {
        let mut db = Db::from(c);
        bound_lock_waits(db.reborrow())?;
        let now = crate::lease::store_now(db.reborrow())?;
        let mine = holds_lease(db.reborrow(), me, now)?;
        let mut results = Vec::with_capacity(sessions.len());
        for one in &sessions {
            results.push(release_one(db.reborrow(), me, mine, now, one)?);
        }
        Ok(results)
    })
}

/// Releases one session in the transaction of [`release_all`]: `Err` for
/// a database failure (the transaction's), `Ok(Err)` for this session's
/// refusal.
fn release_one(
    mut db: Db<'_>,
    me: OwnerId,
    mine: i64,
    now: i64,
    one: &Release,
) -> Result<Result<(), StoreError>, StoreError> {
    let id = one.session;
    let raw = match sid(id) {
        Ok(raw) => raw,
        Err(refused) => return Ok(Err(refused)),
    };
    let Some(r) = row(db.reborrow(), raw)? else {
        return Ok(Err(StoreError::UnknownSession(id)));
    };
    if r.state == State::Finalized {
        return Ok(Err(StoreError::SessionClosed(id)));
    }
    // Released by this owner already: a try whose answer was lost (the
    // connection died after the commit) landed, and this one is done.
    if r.owner == mine && r.released_at.is_some() {
        return Ok(Ok(()));
    }
    if r.owner != mine || r.released_at.is_some() {
        return Ok(Err(StoreError::HandedOff {
            session: id,
            owner: me,
        }));
    }
    if r.state != State::Registered || r.open_turn.is_some() {
        return Ok(Err(StoreError::StateMismatch {
            session: id,
            expected: State::Registered,
            found: r.state,
        }));
    }
    let moved = on_db!(db.reborrow(), |c| diesel::update(
        sessions::table
            .filter(sessions::id.eq(raw))
            .filter(sessions::version.eq(r.version)),
    )
    .set((
        sessions::released_at.eq(Some(now)),
        sessions::version.eq(sessions::version + 1),
    ))
    .execute(c))
    .context("releasing a session")?;
    if moved != 1 {
        // Its row is locked by this transaction on SQLite and was read in
        // it on PostgreSQL: another writer got there in between.
        return Ok(Err(StoreError::HandedOff {
            session: id,
            owner: me,
        }));
    }
    keep_holds(db.reborrow(), raw, one.holds)?;
    let step = Step {
        at: to_millis(one.at),
        from: Some(State::Registered),
        to: State::Registered,
        cause: "handoff",
    };
    record(db, raw, step)?;
    Ok(Ok(()))
}

/// The first steps of a move of `me`'s on session `id` (`raw`): the lock
/// wait bounded, `me`'s lease checked by the store's clock, the row read.
/// Gives `me`'s raw id, the store's time and the row.
fn my_move(
    mut db: Db<'_>,
    me: OwnerId,
    id: SessionId,
    raw: i64,
) -> Result<(i64, i64, Row), StoreError> {
    bound_lock_waits(db.reborrow())?;
    let now = crate::lease::store_now(db.reborrow())?;
    let mine = holds_lease(db.reborrow(), me, now)?;
    match row(db, raw)? {
        Some(r) => Ok((mine, now, r)),
        None => Err(StoreError::UnknownSession(id)),
    }
}

/// Keeps `holds` as session `raw`'s, in place of what was kept: none
/// keeps nothing.
fn keep_holds(mut db: Db<'_>, raw: i64, holds: Holds) -> Result<(), StoreError> {
    on_db!(db.reborrow(), |c| diesel::delete(
        released_holds::table.find(raw)
    )
    .execute(c))
    .context("replacing a session's holds")?;
    if holds.is_empty() {
        return Ok(());
    }
    on_db!(db, |c| diesel::insert_into(released_holds::table)
        .values((
            released_holds::session.eq(raw),
            released_holds::pending_input.eq(i64::from(holds.pending_input)),
            released_holds::delegation.eq(i64::from(holds.delegation)),
        ))
        .execute(c))
    .context("keeping a session's holds")?;
    Ok(())
}

/// Records `holds` as session `id`'s while `me` owns it, live and not
/// released, so that whoever adopts it (after a handoff, or after `me`
/// crashed and its lease expired) keeps them ([`Adopted::holds`]). A
/// session finalized, released or owned elsewhere since is left as it is:
/// its holds are no longer `me`'s to say.
pub(crate) fn record_holds(
    mut db: Db<'_>,
    me: OwnerId,
    id: SessionId,
    holds: Holds,
) -> Result<(), StoreError> {
    let raw = sid(id)?;
    write_tx!(db.reborrow(), |c| {
        let mut db = Db::from(c);
        let (mine, _, r) = my_move(db.reborrow(), me, id, raw)?;
        if r.state == State::Finalized || r.owner != mine || r.released_at.is_some() {
            return Ok(());
        }
        keep_holds(db, raw, holds)
    })
}

/// How long a move of the fleet waits for a row lock another session
/// holds (an operator's `SELECT … FOR UPDATE`, a peer frozen inside a
/// transaction) before it gives up: the store has one writer, and a move
/// waiting on a lock holds every write of this process behind it.
const FLEET_LOCK_WAIT: &str = "SET LOCAL lock_timeout = '2s'";

/// Bounds the lock waits of the transaction `db` is in (PostgreSQL; SQLite
/// has one writer and its busy timeout).
pub(crate) fn bound_lock_waits(db: Db<'_>) -> Result<(), StoreError> {
    if let Db::Pg(c) = db {
        diesel::sql_query(FLEET_LOCK_WAIT)
            .execute(c)
            .context("bounding the lock waits of a fleet move")?;
    }
    Ok(())
}

/// Adopt `id` for `me` with the rest of its tree: every live session from
/// its topmost live ancestor down, each released or left by an owner whose
/// lease expired (its open turn then marked `interrupted`, G8), in one
/// transaction. A tree is created in one process and released whole, so
/// it moves whole: no process can adopt a parent and finalize it while
/// another runs its child (G1). Each session is one conditional update;
/// the loser of a race is told where the winner is (`Elsewhere`), and
/// takes none of the tree.
pub(crate) fn adopt(
    mut db: Db<'_>,
    me: OwnerId,
    id: SessionId,
    at: SystemTime,
) -> Result<Adopted, StoreError> {
    let raw = known_sid(id)?;
    write_tx!(db.reborrow(), |c| {
        let mut db = Db::from(c);
        bound_lock_waits(db.reborrow())?;
        let now = crate::lease::store_now(db.reborrow())?;
        let mine = holds_lease(db.reborrow(), me, now)?;
        let tree = live_tree(db.reborrow(), raw)?;
        let mut adopted = Vec::with_capacity(tree.len());
        for member in tree {
            let one = adopt_one(db.reborrow(), mine, now, member, at);
            match one {
                Ok(one) => adopted.push(one),
                // What stops another of the tree stops this one: said of
                // the session asked for.
                Err(StoreError::Elsewhere { advertise, .. }) => {
                    return Err(StoreError::Elsewhere {
                        session: id,
                        advertise,
                    })
                }
                Err(StoreError::NotReleased { state, .. }) => {
                    return Err(StoreError::NotReleased { session: id, state })
                }
                Err(other) => return Err(other),
            }
        }
        let asked = adopted
            .iter()
            .position(|a| a.session == id)
            .ok_or(StoreError::UnknownSession(id))?;
        let mut main = adopted.remove(asked);
        main.with = adopted;
        Ok(main)
    })
}

/// The live sessions of `raw`'s tree, parents before children: its
/// topmost ancestor that is not finalized, and every live descendant of
/// that one. `raw` itself is among them (unknown: an error at its read).
fn live_tree(mut db: Db<'_>, raw: i64) -> Result<Vec<i64>, StoreError> {
    let mut seen = std::collections::HashSet::from([raw]);
    let mut top = raw;
    loop {
        let parent: Option<Option<i64>> = on_db!(db.reborrow(), |c| sessions::table
            .filter(sessions::id.eq(top))
            .select(sessions::parent)
            .first(c)
            .optional())
        .context("reading a session's parent")?;
        let Some(parent) = parent.flatten().filter(|p| !seen.contains(p)) else {
            break;
        };
        let state: Option<String> = on_db!(db.reborrow(), |c| sessions::table
            .filter(sessions::id.eq(parent))
            .select(sessions::state)
            .first(c)
            .optional())
        .context("reading a session's parent")?;
        match state {
            Some(state) if state != State::Finalized.as_str() => {
                seen.insert(parent);
                top = parent;
            }
            _ => break,
        }
    }
    // Down from the top, each session once: the ancestors met on the way
    // up are among the descendants here, and must be taken too.
    let mut tree = vec![top];
    let mut queued = std::collections::HashSet::from([top]);
    let mut next = 0;
    while let Some(&at) = tree.get(next) {
        next += 1;
        let children: Vec<i64> = on_db!(db.reborrow(), |c| sessions::table
            .filter(sessions::parent.eq(at))
            .filter(sessions::state.ne(State::Finalized.as_str()))
            .select(sessions::id)
            .order(sessions::id)
            .load(c))
        .context("reading a session's children")?;
        for child in children {
            if queued.insert(child) {
                tree.push(child);
            }
        }
    }
    if !queued.contains(&raw) {
        tree.push(raw);
    }
    Ok(tree)
}

/// Adopts session `raw` for `mine` inside the caller's transaction: one
/// conditional update, read again when a concurrent move made it miss.
fn adopt_one(
    mut db: Db<'_>,
    mine: i64,
    now: i64,
    raw: i64,
    at: SystemTime,
) -> Result<Adopted, StoreError> {
    let id = session_id(raw)?;
    // A compare-and-set: a concurrent move makes it miss; read again.
    for _ in 0..64 {
        let Some(r) = row(db.reborrow(), raw)? else {
            return Err(StoreError::UnknownSession(id));
        };
        if r.state == State::Finalized {
            return Err(StoreError::SessionClosed(id));
        }
        let (gone, advertise) = owner_gone(db.reborrow(), r.owner, now)?;
        let abandoned = r.released_at.is_none() && gone && r.owner != mine;
        if r.released_at.is_none() && !abandoned {
            return Err(match r.owner == mine {
                true => StoreError::NotReleased {
                    session: id,
                    state: r.state,
                },
                false => StoreError::Elsewhere {
                    session: id,
                    advertise,
                },
            });
        }
        // Released sessions are idle; an abandoned one is taken over
        // only from `registered` or `running` (its turn interrupted).
        if !matches!(r.state, State::Registered | State::Running) {
            return Err(StoreError::NotReleased {
                session: id,
                state: r.state,
            });
        }
        let outcome = match r.open_turn {
            Some(_) => Some(Outcome::Interrupted),
            None => r.outcome,
        };
        let won = on_db!(db.reborrow(), |c| diesel::update(
            sessions::table
                .filter(sessions::id.eq(raw))
                .filter(sessions::version.eq(r.version)),
        )
        .set((
            sessions::owner.eq(mine),
            sessions::released_at.eq(None::<i64>),
            sessions::state.eq(State::Registered.as_str()),
            sessions::open_turn.eq(None::<i64>),
            sessions::outcome.eq(outcome.map(Outcome::as_str)),
            sessions::version.eq(sessions::version + 1),
        ))
        .execute(c))
        .context("adopting a session")?;
        if won == 0 {
            continue;
        }
        let at = to_millis(at);
        let interrupted_turn = match r.open_turn {
            Some(no) => {
                interrupt(db.reborrow(), raw, no, at)?;
                record(
                    db.reborrow(),
                    raw,
                    Step {
                        at,
                        from: Some(r.state),
                        to: State::Registered,
                        cause: "turn ended: interrupted",
                    },
                )?;
                Some(no)
            }
            None => None,
        };
        let step = Step {
            at,
            from: Some(State::Registered),
            to: State::Registered,
            cause: "adopted",
        };
        record(db.reborrow(), raw, step)?;
        let turns: Option<i64> = on_db!(db.reborrow(), |c| turns::table
            .filter(turns::session.eq(raw))
            .select(diesel::dsl::max(turns::no))
            .first(c))
        .context("counting a session's turns")?;
        let principal = principal_of(db.reborrow(), raw)?;
        let holds = take_holds(db.reborrow(), raw)?;
        return Ok(Adopted {
            session: id,
            name: r.name,
            parent: r.parent.map(session_id).transpose()?,
            turns: turns.map(turn_no).transpose()?.unwrap_or(0),
            last_outcome: outcome,
            holds,
            principal,
            interrupted_turn,
            with: Vec::new(),
        });
    }
    Err(StoreError::Unavailable)
}

/// The holds session `raw` was released with, taken off the store by its
/// adopter (none: it was released, or its owner crashed, with none).
fn take_holds(mut db: Db<'_>, raw: i64) -> Result<Holds, StoreError> {
    let kept: Option<(i64, i64)> = on_db!(db.reborrow(), |c| released_holds::table
        .find(raw)
        .select((released_holds::pending_input, released_holds::delegation))
        .first(c)
        .optional())
    .context("reading a released session's holds")?;
    let Some((pending_input, delegation)) = kept else {
        return Ok(Holds::default());
    };
    on_db!(db, |c| diesel::delete(released_holds::table.find(raw))
        .execute(c))
    .context("taking a released session's holds")?;
    // Written from `u16`s: a count out of range is the row's fault.
    let count = |n: i64, column: &'static str| {
        u16::try_from(n).map_err(|_| StoreError::Corrupt {
            session: None,
            column,
            value: n.to_string(),
        })
    };
    Ok(Holds {
        pending_input: count(pending_input, "released_holds.pending_input")?,
        delegation: count(delegation, "released_holds.delegation")?,
    })
}

/// Ends turn `no` of session `raw` `interrupted`, if it is still open.
fn interrupt(db: Db<'_>, raw: i64, no: u32, at: i64) -> Result<(), StoreError> {
    on_db!(db, |c| diesel::update(
        turns::table
            .filter(turns::session.eq(raw))
            .filter(turns::no.eq(i64::from(no)))
            .filter(turns::ended_at.is_null()),
    )
    .set((
        turns::ended_at.eq(Some(at)),
        turns::outcome.eq(Some(Outcome::Interrupted.as_str())),
    ))
    .execute(c))
    .context("interrupting a turn")?;
    Ok(())
}

/// Release, for adoption, every session that a gone peer left `registered`
/// or `running` (its open turn marked `interrupted`, G8): one whose lease
/// expired, or, as recovery judges it, one of this machine and PID
/// namespace whose process is gone, its lease still running. Sessions it
/// left cancelling or settled were ending anyway: `settle recover`
/// finalizes those.
pub(crate) fn release_expired(
    mut db: Db<'_>,
    me: OwnerId,
    at: SystemTime,
) -> Result<PeerRelease, StoreError> {
    let now = crate::lease::store_now(db.reborrow())?;
    let mine = holds_lease(db.reborrow(), me, now)?;
    // Peers with a running lease whose process is gone from here.
    let leased: Vec<crate::lease::OwnerColumns> = on_db!(db.reborrow(), |c| owners::table
        .filter(owners::lease_expires_at.gt(now))
        .filter(owners::id.ne(mine))
        .select(crate::lease::OWNER_COLUMNS)
        .load(c))
    .context("looking for peers whose process is gone")?;
    let here = crate::lease::HostIdentity::here();
    let mut gone = Vec::new();
    for columns in leased {
        let owner = crate::lease::OwnerRow::from_columns(columns)?;
        if crate::recover::verdict(&owner, now, here).is_some() {
            gone.push(owner.id.raw()?);
        }
    }
    let states = [State::Registered.as_str(), State::Running.as_str()];
    let left: Vec<(i64, i64)> = on_db!(db.reborrow(), |c| sessions::table
        .inner_join(owners::table)
        .filter(sessions::state.eq_any(states))
        .filter(sessions::released_at.is_null())
        .filter(
            owners::lease_expires_at
                .le(now)
                .or(sessions::owner.eq_any(&gone)),
        )
        .filter(sessions::owner.ne(mine))
        .order(sessions::id.asc())
        .select((sessions::id, sessions::owner))
        .load(c))
    .context("looking for sessions left by gone peers")?;
    let mut report = PeerRelease::default();
    let at = to_millis(at);
    for (raw, left_by) in left {
        let id = session_id(raw)?;
        let moved = write_tx!(db.reborrow(), |c| {
            let mut db = Db::from(c);
            bound_lock_waits(db.reborrow())?;
            let Some(r) = row(db.reborrow(), raw)? else {
                return Ok(None);
            };
            // Adopted, released or ended since it was read.
            let still = r.owner == left_by
                && r.released_at.is_none()
                && matches!(r.state, State::Registered | State::Running);
            if !still {
                return Ok(None);
            }
            let outcome = match r.open_turn {
                Some(_) => Some(Outcome::Interrupted),
                None => r.outcome,
            };
            let won = on_db!(db.reborrow(), |c| diesel::update(
                sessions::table
                    .filter(sessions::id.eq(raw))
                    .filter(sessions::version.eq(r.version)),
            )
            .set((
                sessions::released_at.eq(Some(now)),
                sessions::state.eq(State::Registered.as_str()),
                sessions::open_turn.eq(None::<i64>),
                sessions::outcome.eq(outcome.map(Outcome::as_str)),
                sessions::version.eq(sessions::version + 1),
            ))
            .execute(c))
            .context("releasing a session left by an expired peer")?;
            if won == 0 {
                return Ok(None);
            }
            if let Some(no) = r.open_turn {
                interrupt(db.reborrow(), raw, no, at)?;
            }
            let cause = match gone.contains(&left_by) {
                true => format!("handoff: the process of owner {left_by} is gone"),
                false => format!("handoff: the lease of owner {left_by} expired"),
            };
            let step = Step {
                at,
                from: Some(r.state),
                to: State::Registered,
                cause: &cause,
            };
            record(db, raw, step)?;
            Ok::<_, StoreError>(Some(r.open_turn))
        })?;
        if let Some(open_turn) = moved {
            tracing::info!(session = %id, owner = left_by, "released a session left by an expired peer");
            report.released.push(id);
            if let Some(no) = open_turn {
                report.interrupted_turns.push((id, no));
            }
        }
    }
    Ok(report)
}

/// Finalize `idle_reap`, once, every session released at least `ttl` ago
/// (by the store's clock) that nobody adopted and nothing holds (G3: held,
/// it waits for its adopter; G2: the latch is a compare-and-set on a row
/// an adoption changes).
pub(crate) fn reap_released(mut db: Db<'_>, ttl: Duration) -> Result<Vec<SessionId>, StoreError> {
    let now = crate::lease::store_now(db.reborrow())?;
    let before = now.saturating_sub(duration_millis(ttl));
    let due: Vec<(i64, i64)> = on_db!(db.reborrow(), |c| sessions::table
        .filter(sessions::released_at.le(before))
        .filter(sessions::state.eq(State::Registered.as_str()))
        .filter(diesel::dsl::not(diesel::dsl::exists(
            released_holds::table.filter(released_holds::session.eq(sessions::id))
        )))
        .order(sessions::id.asc())
        .select((sessions::id, sessions::owner))
        .load(c))
    .context("looking for released sessions nobody adopted")?;
    let due = children_first(db.reborrow(), due)?;
    let mut reaped = Vec::new();
    let cause = settle_core::Cause::Finalized(EndReason::IdleReap).to_string();
    for (raw, owner) in due {
        let id = session_id(raw)?;
        let ending = Ending {
            reason: EndReason::IdleReap,
            outcome: None,
            at: now,
            owner,
            released: true,
            cause: &cause,
        };
        let spent = write_tx!(db.reborrow(), |c| {
            let mut db = Db::from(c);
            bound_lock_waits(db.reborrow())?;
            // Still released: an adoption clears `released_at` in the same
            // update that takes the row, so it is either adopted or reaped.
            let released = row(db.reborrow(), raw)?.is_some_and(|r| r.released_at.is_some());
            // And no child of it is live (G1): one held, adopted or not due
            // keeps its parent, which a later sweep reaps after it.
            match released && !has_live_child(db.reborrow(), raw)? {
                true => spend(db, id, &ending),
                false => Ok(None),
            }
        })?;
        if spent.is_some() {
            tracing::info!(session = %id, "finalized a released session nobody adopted");
            reaped.push(id);
        }
    }
    Ok(reaped)
}

/// `due` (session, owner) ordered children before their parents: deepest
/// first in the tree of sessions not finalized, so that a sweep reaps a
/// released tree whole, leaves first (G1).
fn children_first(mut db: Db<'_>, due: Vec<(i64, i64)>) -> Result<Vec<(i64, i64)>, StoreError> {
    if due.len() < 2 {
        return Ok(due);
    }
    let live: HashMap<i64, Option<i64>> = on_db!(db.reborrow(), |c| sessions::table
        .filter(sessions::state.ne(State::Finalized.as_str()))
        .select((sessions::id, sessions::parent))
        .load::<(i64, Option<i64>)>(c))
    .context("reading the tree of the released sessions")?
    .into_iter()
    .collect();
    // A session's depth among the sessions not finalized (bounded by
    // their number, should the rows ever hold a cycle).
    let depth = |mut id: i64| {
        let mut depth = 0usize;
        while let Some(&Some(parent)) = live.get(&id) {
            depth += 1;
            if depth > live.len() {
                break;
            }
            id = parent;
        }
        depth
    };
    let mut due: Vec<(usize, (i64, i64))> = due.into_iter().map(|d| (depth(d.0), d)).collect();
    due.sort_by(|a, b| b.0.cmp(&a.0).then(a.1 .0.cmp(&b.1 .0)));
    Ok(due.into_iter().map(|(_, d)| d).collect())
}

/// Whether session `raw` has a child that is not finalized.
fn has_live_child(mut db: Db<'_>, raw: i64) -> Result<bool, StoreError> {
    on_db!(db.reborrow(), |c| diesel::select(diesel::dsl::exists(
        sessions::table
            .filter(sessions::parent.eq(raw))
            .filter(sessions::state.ne(State::Finalized.as_str()))
    ))
    .get_result(c))
    .context("looking for a released session's live children")
}

/// Who may use session `raw` through a gateway (`None`: anyone the
/// gateway lets in without a principal).
fn principal_of(mut db: Db<'_>, raw: i64) -> Result<Option<String>, StoreError> {
    on_db!(db.reborrow(), |c| session_principals::table
        .find(raw)
        .select(session_principals::principal)
        .first(c)
        .optional())
    .context("reading a session's principal")
}

/// [`SessionStore::principal`](crate::SessionStore::principal).
pub(crate) fn principal(mut db: Db<'_>, id: SessionId) -> Result<Option<String>, StoreError> {
    principal_of(db.reborrow(), known_sid(id)?)
}

/// Record `principal` as who may use `id` through a gateway.
pub(crate) fn set_principal(
    db: Db<'_>,
    id: SessionId,
    principal: Option<&str>,
) -> Result<(), StoreError> {
    let raw = sid(id)?;
    write_tx!(db, |c| {
        diesel::delete(session_principals::table.find(raw)).execute(c)?;
        match principal {
            Some(principal) => diesel::insert_into(session_principals::table)
                .values((
                    session_principals::session.eq(raw),
                    session_principals::principal.eq(principal),
                ))
                .execute(c)
                .map(|_| ()),
            None => Ok(()),
        }
    })
    .context("recording a session's principal")
}
