//! One page of one turn's transcript: what a reader that pages through a
//! long session (the gateway's `session.read`) asks for, read without the
//! rest of the session. A session of thousands of turns costs a page what
//! the page holds, not what the session holds.

use diesel::prelude::*;
use settle_core::SessionId;

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::read::{
    chunk_row, turn_row, ChunkColumns, EndedWith, SessionDetail, TurnColumns, TurnRow,
    CHUNK_COLUMNS, TURN_COLUMNS,
};
use crate::schema::{chunks, sessions, turns};
use crate::time::sid;

/// One turn of a session with some of its chunks
/// ([`SessionStore::turn_page`](crate::SessionStore::turn_page)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnPage {
    /// How many turns the session has.
    pub turns: usize,
    /// The turn asked for, with its chunks from the `seq` asked for, in
    /// order, at most as many as asked for; `None` when the session has no
    /// such turn (or, asked for its last, no turn at all).
    pub turn: Option<TurnRow>,
    /// Whether the turn has chunks after the last one given.
    pub more: bool,
}

impl TurnPage {
    /// The same page cut from a whole session's `detail`: turn `turn` (its
    /// last when `None`), its chunks from `from_seq`, at most `max_chunks`.
    pub fn of(detail: &SessionDetail, turn: Option<u32>, from_seq: u32, max_chunks: usize) -> Self {
        let found = match turn {
            None => detail.turns.last(),
            Some(no) => detail.turns.iter().find(|t| t.no == no),
        };
        let mut more = false;
        let turn = found.map(|t| {
            let mut chunks = t.chunks.iter().filter(|c| c.seq >= from_seq);
            let page: Vec<_> = chunks.by_ref().take(max_chunks).cloned().collect();
            more = chunks.next().is_some();
            TurnRow {
                chunks: page,
                ..t.clone()
            }
        });
        TurnPage {
            turns: detail.turns.len(),
            turn,
            more,
        }
    }
}

/// Turn `turn` of `id` (its last when `None`) with at most `max_chunks` of
/// its chunks from `from_seq`, in one read transaction.
pub(crate) fn turn_page(
    db: Db<'_>,
    id: SessionId,
    turn: Option<u32>,
    from_seq: u32,
    max_chunks: usize,
) -> Result<TurnPage, StoreError> {
    let raw = sid(id)?;
    // One more than asked says whether there are more.
    let limit = i64::try_from(max_chunks.saturating_add(1)).unwrap_or(i64::MAX);
    let (known, count, row, chunk_rows) = read_tx!(db, |c| {
        // How it ended, for a turn that ended with it (`EndedWith`).
        let known: Option<(String, Option<String>, Option<i64>)> = sessions::table
            .find(raw)
            .select((sessions::state, sessions::outcome, sessions::finalized_at))
            .first(c)
            .optional()
            .context("reading a session")?;
        let Some(known) = known else {
            return Err(StoreError::UnknownSession(id));
        };
        let count: i64 = turns::table
            .filter(turns::session.eq(raw))
            .count()
            .get_result(c)
            .context("counting turns")?;
        let asked = turns::table.filter(turns::session.eq(raw));
        let row: Option<TurnColumns> = match turn {
            None => asked
                .order(turns::no.desc())
                .select(TURN_COLUMNS)
                .first(c)
                .optional(),
            Some(no) => asked
                .filter(turns::no.eq(i64::from(no)))
                .select(TURN_COLUMNS)
                .first(c)
                .optional(),
        }
        .context("reading a turn")?;
        let chunk_rows: Vec<ChunkColumns> = match &row {
            None => Vec::new(),
            Some(cols) => chunks::table
                .filter(chunks::session.eq(raw))
                .filter(chunks::turn_no.eq(cols.0))
                .filter(chunks::seq.ge(i64::from(from_seq)))
                .order(chunks::seq.asc())
                .limit(limit)
                .select(CHUNK_COLUMNS)
                .load(c)
                .context("reading a turn's chunks")?,
        };
        Ok::<_, StoreError>((known, count, row, chunk_rows))
    })?;
    let ended_with = EndedWith::columns(known)?;
    let more = chunk_rows.len() > max_chunks;
    let chunks = chunk_rows
        .into_iter()
        .take(max_chunks)
        .map(chunk_row)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TurnPage {
        turns: usize::try_from(count).unwrap_or(usize::MAX),
        turn: row
            .map(|cols| turn_row(cols, chunks, ended_with))
            .transpose()?,
        more,
    })
}
