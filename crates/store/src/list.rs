//! Listing sessions as `settle sessions` does: newest first (or oldest
//! first), filtered by state and registration time, up to a limit; and the
//! most recent session, for `settle chat --last`.

use std::sync::Arc;
use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::read::{session_row, SessionColumns, SessionRow, SESSION_COLUMNS};
use crate::schema::{chunks, owners, session_principals, sessions, turns};
use crate::time::{session_id, to_millis};

/// Which sessions [`list_sessions`](crate::SessionStore::list_sessions)
/// returns, and in which order. The default is every session, newest first.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use settle_store::{SessionFilter, State};
///
/// let hour_ago = SystemTime::now() - Duration::from_secs(3600);
/// let filter = SessionFilter::all()
///     .in_state(State::Finalized)
///     .since(hour_ago)
///     .limit(20);
/// assert_eq!(filter.limit, Some(20));
/// ```
///
/// A page of a long listing starts [`after`](Self::after) the last row of
/// the page before (a keyset, so that sessions registered meanwhile neither
/// shift nor repeat rows), and [`only`](Self::only) narrows the listing to
/// a set of sessions (one principal's) in the same query, so that a page
/// is as long as the limit whenever enough sessions pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionFilter {
    /// Only sessions in this state.
    pub state: Option<State>,
    /// Only sessions registered at or after this time.
    pub created_since: Option<SystemTime>,
    /// At most this many sessions (the first ones in `order`).
    pub limit: Option<usize>,
    /// Newest or oldest first.
    pub order: ListOrder,
    /// Only the sessions after this place in `order`.
    pub after: Option<ListCursor>,
    /// Only these sessions (`None`: every session).
    pub ids: Option<Arc<[SessionId]>>,
    /// Only the sessions of this principal, as
    /// [`set_principal`](crate::SessionStore::set_principal) recorded it
    /// (`Some(None)`: those with none recorded; `None`: any). A store that
    /// records no principals has none of a named one.
    pub principal: Option<Option<String>>,
}

/// A place in a listing: the registration time and id of its last row. The
/// next page is what comes after it in the listing's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListCursor {
    /// When the row's session was registered.
    pub created_at: SystemTime,
    /// Its id.
    pub id: SessionId,
}

impl ListCursor {
    /// The place of `row`.
    pub fn of(row: &SessionRow) -> Self {
        ListCursor {
            created_at: row.created_at,
            id: row.id,
        }
    }

    /// The place as milliseconds since the epoch (as the stores keep
    /// registration times) and the id, for ordering.
    fn key(self) -> (i64, u64) {
        (to_millis(self.created_at), self.id.get())
    }
}

/// The order of a listing. Sessions are ordered by registration, so a parent
/// always comes before its children when oldest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// The most recently registered first.
    #[default]
    NewestFirst,
    /// In the order they were registered.
    OldestFirst,
}

impl SessionFilter {
    /// Every session, newest first.
    pub fn all() -> Self {
        SessionFilter::default()
    }

    /// Only sessions in `state`.
    pub fn in_state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    /// Only sessions in `state`, if given.
    pub fn in_state_opt(mut self, state: Option<State>) -> Self {
        self.state = state;
        self
    }

    /// Only sessions registered at or after `since`.
    pub fn since(mut self, since: SystemTime) -> Self {
        self.created_since = Some(since);
        self
    }

    /// At most `n` sessions.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// In registration order instead of newest first.
    pub fn oldest_first(mut self) -> Self {
        self.order = ListOrder::OldestFirst;
        self
    }

    /// Only the sessions after `cursor` in the listing's order: the page
    /// after the one whose last row it names.
    pub fn after(mut self, cursor: ListCursor) -> Self {
        self.after = Some(cursor);
        self
    }

    /// Only the sessions among `ids`.
    pub fn only(mut self, ids: impl Into<Arc<[SessionId]>>) -> Self {
        self.ids = Some(ids.into());
        self
    }

    /// Only the sessions recorded with `principal` (`None`: with none): a
    /// gateway's listing of one principal's sessions across a fleet.
    pub fn of_principal(mut self, principal: Option<String>) -> Self {
        self.principal = Some(principal);
        self
    }

    /// Whether the session `id` passes the state, time and place filters
    /// (not the ids, which a caller looks up in a set of its own, nor the
    /// limit).
    pub(crate) fn admits(&self, id: SessionId, state: State, created_at: SystemTime) -> bool {
        self.state.is_none_or(|s| s == state)
            && self.created_since.is_none_or(|t| created_at >= t)
            && self.after.is_none_or(|after| {
                let key = (to_millis(created_at), id.get());
                match self.order {
                    ListOrder::NewestFirst => key < after.key(),
                    ListOrder::OldestFirst => key > after.key(),
                }
            })
    }

    /// Sorts `rows` in the listing's order and keeps the first `limit`.
    fn order_and_cut(&self, rows: &mut Vec<SessionRow>) {
        rows.sort_by_key(|r| ListCursor::of(r).key());
        if self.order == ListOrder::NewestFirst {
            rows.reverse();
        }
        if let Some(limit) = self.limit {
            rows.truncate(limit);
        }
    }
}

/// How many ids one query names at most: SQLite binds each one, and allows
/// 32,766 parameters. A longer set is queried in parts, merged in order.
const IDS_PER_QUERY: usize = 10_000;

/// The sessions `filter` selects, with their turn and chunk counts.
pub(crate) fn list_sessions(
    mut db: Db<'_>,
    filter: &SessionFilter,
) -> Result<Vec<SessionRow>, StoreError> {
    // An owner is shown while its lease is live, by the store's clock.
    let now = crate::lease::store_now(db.reborrow())?;
    let since = filter.created_since.map(to_millis);
    let after = filter.after.map(ListCursor::key);
    // A limit beyond what the database can count means no limit.
    let limit = filter.limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let parts: Vec<Option<Vec<i64>>> = match &filter.ids {
        None => vec![None],
        Some(ids) => ids
            .chunks(IDS_PER_QUERY)
            .map(|part| {
                // An id past i64 is in no database: it matches nothing.
                Some(
                    part.iter()
                        .filter_map(|id| i64::try_from(id.get()).ok())
                        .collect(),
                )
            })
            .collect(),
    };
    type Listed = (
        SessionColumns,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<String>,
    );
    let rows: Vec<Listed> = on_db!(db, |c| {
        let mut all = Vec::new();
        for part in &parts {
            // Counted per session by correlated subqueries on the tables'
            // primary keys, so a limit also limits the counting.
            let turn_count = turns::table
                .filter(turns::session.eq(sessions::id))
                .count()
                .single_value();
            let chunk_count = chunks::table
                .filter(chunks::session.eq(sessions::id))
                .count()
                .single_value();
            // Where the live owner said clients reach it (SPEC §12).
            let owner_url = owners::table
                .filter(owners::id.eq(sessions::owner))
                .filter(owners::lease_expires_at.gt(now))
                .select(owners::advertise)
                .single_value();
            let mut q = sessions::table
                .select((
                    SESSION_COLUMNS,
                    turn_count,
                    chunk_count,
                    sessions::released_at,
                    owner_url,
                ))
                .into_boxed();
            if let Some(state) = filter.state {
                q = q.filter(sessions::state.eq(state.as_str()));
            }
            if let Some(since) = since {
                q = q.filter(sessions::created_at.ge(since));
            }
            if let Some(ids) = part {
                q = q.filter(sessions::id.eq_any(ids.clone()));
            }
            let recorded = session_principals::table.select(session_principals::session);
            match &filter.principal {
                None => {}
                Some(Some(principal)) => {
                    q = q.filter(
                        sessions::id.eq_any(
                            session_principals::table
                                .filter(session_principals::principal.eq(principal.clone()))
                                .select(session_principals::session),
                        ),
                    );
                }
                Some(None) => q = q.filter(diesel::dsl::not(sessions::id.eq_any(recorded))),
            }
            // The keyset of the page: strictly after (created_at, id).
            if let Some((at, id)) = after {
                let id = i64::try_from(id).unwrap_or(i64::MAX);
                q = match filter.order {
                    ListOrder::NewestFirst => q.filter(
                        sessions::created_at
                            .lt(at)
                            .or(sessions::created_at.eq(at).and(sessions::id.lt(id))),
                    ),
                    ListOrder::OldestFirst => q.filter(
                        sessions::created_at
                            .gt(at)
                            .or(sessions::created_at.eq(at).and(sessions::id.gt(id))),
                    ),
                };
            }
            // By registration time: ids come in blocks per process, so with
            // two processes at work id order is not the order of creation.
            q = match filter.order {
                ListOrder::NewestFirst => {
                    q.order((sessions::created_at.desc(), sessions::id.desc()))
                }
                ListOrder::OldestFirst => q.order((sessions::created_at.asc(), sessions::id.asc())),
            };
            if let Some(limit) = limit {
                q = q.limit(limit);
            }
            all.extend(q.load::<Listed>(c)?);
        }
        Ok::<_, diesel::result::Error>(all)
    })
    .context("listing sessions")?;
    let mut rows = rows
        .into_iter()
        .map(|(cols, turns, chunks, released_at, owner)| {
            let mut row = session_row(
                cols,
                turns.unwrap_or(0).unsigned_abs(),
                chunks.unwrap_or(0).unsigned_abs(),
            )?;
            if released_at.is_none() && row.state != settle_core::State::Finalized {
                row.owner = owner;
            }
            Ok::<_, StoreError>(row)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if parts.len() > 1 {
        filter.order_and_cut(&mut rows);
    }
    Ok(rows)
}

/// The most recently registered session (in `state`, if given).
pub(crate) fn last_session(
    db: Db<'_>,
    state: Option<State>,
) -> Result<Option<SessionId>, StoreError> {
    let id: Option<i64> = on_db!(db, |c| {
        let mut q = sessions::table.select(sessions::id).into_boxed();
        if let Some(state) = state {
            q = q.filter(sessions::state.eq(state.as_str()));
        }
        q.order((sessions::created_at.desc(), sessions::id.desc()))
            .first(c)
            .optional()
    })
    .context("finding the most recent session")?;
    id.map(session_id).transpose()
}
