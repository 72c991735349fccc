//! `sessions.list`: one page of the rows of `settle sessions --json` (SPEC
//! §7), spelled by the store's one definition of that shape, oldest first.
//!
//! A page never outgrows a frame: it has at most the `limit` asked for
//! (100 by default, at most 1,000) and stops early at a byte bound, half
//! of what a connection's queue holds, so that it passes beside the
//! notifications already queued. Its `next_cursor` names the place after
//! its last row (null on the last page), a keyset the store pages from,
//! so that sessions registered meanwhile neither shift nor repeat rows.
//!
//! The principal's sessions are asked of the store by id, in the query of
//! the page: another principal's sessions never take a place in it, so a
//! page is short only at the end of the listing or at the byte bound.

use serde_json::{json, Value};
use settle_store::{ListCursor, SessionFilter, SessionRow};

use crate::params;
use crate::protocol::MAX_RESULT_ENVELOPE_BYTES;

/// What a page's frame has besides its rows: the frame's envelope with the
/// longest id, the answer's keys, the cursor.
const ENVELOPE_BYTES: usize = MAX_RESULT_ENVELOPE_BYTES + 128;

/// The filter of a page of at most `limit` rows: one more is asked for,
/// to know whether a page follows.
pub(crate) fn filter(base: SessionFilter, limit: usize) -> SessionFilter {
    base.oldest_first().limit(limit.saturating_add(1))
}

/// The answer: the rows of `rows` (as the store gave them for
/// [`filter`]) that fit in `limit` and `budget` bytes, and the cursor of
/// the next page if there is more.
pub(crate) fn page(rows: &[SessionRow], limit: usize, budget: usize) -> Value {
    let budget = budget.saturating_sub(ENVELOPE_BYTES);
    let mut taken = Vec::with_capacity(rows.len().min(limit));
    let mut bytes = 0usize;
    let mut last: Option<ListCursor> = None;
    let mut cut = false;
    for row in rows {
        if taken.len() == limit {
            cut = true;
            break;
        }
        let json = row.to_json();
        let size = json.to_string().len() + 1;
        if bytes + size > budget {
            if taken.is_empty() {
                // One row alone past the bound (a name no client chose):
                // passed over, so that the listing goes on.
                tracing::warn!(session = %row.id, size, "left a session out of sessions.list: its row alone is larger than a page");
                last = Some(ListCursor::of(row));
            }
            cut = true;
            break;
        }
        bytes += size;
        last = Some(ListCursor::of(row));
        taken.push(json);
    }
    let next = last.filter(|_| cut).map(params::cursor);
    json!({ "sessions": taken, "next_cursor": next })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use settle_runtime::{SessionId, State};

    use super::*;

    fn row(id: u64, name: &str) -> SessionRow {
        SessionRow {
            id: SessionId(id),
            name: name.to_owned(),
            parent: None,
            state: State::Registered,
            outcome: None,
            end_reason: None,
            turns: 0,
            chunks: 0,
            created_at: UNIX_EPOCH + Duration::from_secs(id),
            finalized_at: None,
            resumed_from: None,
            owner: None,
        }
    }

    #[test]
    fn a_page_stops_at_its_limit_or_its_bytes_and_says_where_to_go_on() {
        let rows: Vec<SessionRow> = (1..=4).map(|i| row(i, "s")).collect();
        let all = page(&rows, 10, 1 << 20);
        assert_eq!(all["sessions"].as_array().unwrap().len(), 4);
        assert_eq!(all["next_cursor"], Value::Null);

        let two = page(&rows[..3], 2, 1 << 20);
        assert_eq!(two["sessions"].as_array().unwrap().len(), 2);
        assert_eq!(two["next_cursor"], "2000.2");

        let size = rows[0].to_json().to_string().len() + 1;
        let bounded = page(&rows, 10, ENVELOPE_BYTES + 2 * size + 1);
        assert_eq!(bounded["sessions"].as_array().unwrap().len(), 2);
        assert_eq!(bounded["next_cursor"], "2000.2");
        assert!(bounded.to_string().len() <= ENVELOPE_BYTES + 2 * size + 1);
    }
}
