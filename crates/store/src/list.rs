//! Listing sessions as `settle sessions` does: newest first (or oldest
//! first), filtered by state and registration time, up to a limit; and the
//! most recent session, for `settle chat --last`.

use std::time::SystemTime;

use diesel::prelude::*;
use settle_core::{SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::read::{session_row, SessionColumns, SessionRow, SESSION_COLUMNS};
use crate::schema::{chunks, sessions, turns};
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

    /// Whether `row` passes the state and time filters (not the limit).
    pub(crate) fn admits(&self, state: State, created_at: SystemTime) -> bool {
        self.state.is_none_or(|s| s == state) && self.created_since.is_none_or(|t| created_at >= t)
    }
}

/// The sessions `filter` selects, with their turn and chunk counts.
pub(crate) fn list_sessions(
    db: Db<'_>,
    filter: &SessionFilter,
) -> Result<Vec<SessionRow>, StoreError> {
    let since = filter.created_since.map(to_millis);
    // A limit beyond what the database can count means no limit.
    let limit = filter.limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let rows: Vec<(SessionColumns, Option<i64>, Option<i64>)> = on_db!(db, |c| {
        // Counted per session by correlated subqueries on the tables' primary
        // keys, so a limit also limits the counting.
        let turn_count = turns::table
            .filter(turns::session.eq(sessions::id))
            .count()
            .single_value();
        let chunk_count = chunks::table
            .filter(chunks::session.eq(sessions::id))
            .count()
            .single_value();
        let mut q = sessions::table
            .select((SESSION_COLUMNS, turn_count, chunk_count))
            .into_boxed();
        if let Some(state) = filter.state {
            q = q.filter(sessions::state.eq(state.as_str()));
        }
        if let Some(since) = since {
            q = q.filter(sessions::created_at.ge(since));
        }
        // By registration time: ids come in blocks per process, so with two
        // processes at work id order is not the order of creation.
        q = match filter.order {
            ListOrder::NewestFirst => q.order((sessions::created_at.desc(), sessions::id.desc())),
            ListOrder::OldestFirst => q.order((sessions::created_at.asc(), sessions::id.asc())),
        };
        if let Some(limit) = limit {
            q = q.limit(limit);
        }
        q.load(c)
    })
    .context("listing sessions")?;
    rows.into_iter()
        .map(|(cols, turns, chunks)| {
            session_row(
                cols,
                turns.unwrap_or(0).unsigned_abs(),
                chunks.unwrap_or(0).unsigned_abs(),
            )
        })
        .collect()
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
    Ok(id.map(session_id))
}
