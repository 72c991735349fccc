//! Withdrawing the chunks of a turn that its writer gave up on.
//!
//! An append that the store did not answer within the caller's bound (a
//! database locked by another process, a server restarting) may still be
//! committed once the store gets to it: the writer was already waiting on
//! the lock with it. Its turn has failed meanwhile and its reader was never
//! given the chunk, so a late commit would leave the store holding one chunk
//! more than the reader was told (G7: what is kept is what was told). A
//! withdrawal is queued on the writer behind that append, so it runs once
//! the append has, and removes what it wrote: the turn's chunks from the
//! given place on. None of them was acknowledged; the chunks before that
//! place are untouched. A finalized session's chunks are never touched (a
//! session recovered by another process keeps its transcript).

use diesel::prelude::*;
use settle_core::{SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::schema::{chunks, sessions};
use crate::time::sid;

/// Removes the chunks of turn `turn` of `id` numbered `from` and later,
/// unless the session is finalized. How many were removed.
pub(crate) fn withdraw(
    db: Db<'_>,
    id: SessionId,
    turn: u32,
    from: u32,
) -> Result<usize, StoreError> {
    let raw = sid(id)?;
    let open = sessions::table
        .filter(sessions::id.eq(raw))
        .filter(sessions::state.ne(State::Finalized.as_str()));
    let given_up = chunks::table
        .filter(chunks::session.eq(raw))
        .filter(chunks::turn_no.eq(i64::from(turn)))
        .filter(chunks::seq.ge(i64::from(from)))
        .filter(diesel::dsl::exists(open));
    on_db!(db, |c| diesel::delete(given_up).execute(c)).context("withdrawing chunks given up on")
}
