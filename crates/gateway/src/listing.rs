//! `sessions.list`: the rows of `settle sessions --json` (SPEC §7), the same
//! fields with the same spellings.

use std::time::SystemTime;

use serde::Serialize;
use settle_store::SessionRow;

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// One session as `settle sessions --json` prints it.
#[derive(Debug, Serialize)]
pub(crate) struct SessionJson {
    id: u64,
    name: String,
    parent: Option<u64>,
    state: &'static str,
    outcome: Option<&'static str>,
    end_reason: Option<&'static str>,
    turns: u64,
    chunks: u64,
    created_at: String,
    finalized_at: Option<String>,
}

impl From<&SessionRow> for SessionJson {
    fn from(row: &SessionRow) -> Self {
        SessionJson {
            id: row.id.get(),
            name: row.name.clone(),
            parent: row.parent.map(|p| p.get()),
            state: row.state.as_str(),
            outcome: row.outcome.map(|o| o.as_str()),
            end_reason: row.end_reason.map(|r| r.as_str()),
            turns: row.turns,
            chunks: row.chunks,
            created_at: rfc3339(row.created_at),
            finalized_at: row.finalized_at.map(rfc3339),
        }
    }
}

/// The rows as a JSON array.
pub(crate) fn rows(rows: &[SessionRow]) -> serde_json::Value {
    serde_json::to_value(rows.iter().map(SessionJson::from).collect::<Vec<_>>())
        .unwrap_or_else(|_| serde_json::Value::Array(Vec::new()))
}
