//! `sessions.list`: the rows of `settle sessions --json` (SPEC §7), spelled
//! by the store's one definition of that shape.

use settle_store::SessionRow;

/// The rows as a JSON array.
pub(crate) fn rows(rows: &[SessionRow]) -> serde_json::Value {
    serde_json::Value::Array(rows.iter().map(SessionRow::to_json).collect())
}
