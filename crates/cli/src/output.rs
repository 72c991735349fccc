//! What `sessions`, `show` and `run` print: the stable JSON shapes of the
//! specification (§7) and their plain-text tables.

use std::time::SystemTime;

use serde::Serialize;
use settle_store::{SessionDetail, SessionRow, TimelineRow, TurnRow};

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// One session as `settle sessions --json` prints it.
#[derive(Debug, Serialize)]
pub struct SessionJson {
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

#[derive(Debug, Serialize)]
struct TurnJson<'a> {
    no: u32,
    outcome: Option<&'static str>,
    started_at: String,
    ended_at: Option<String>,
    chunks: Vec<&'a str>,
}

impl<'a> From<&'a TurnRow> for TurnJson<'a> {
    fn from(turn: &'a TurnRow) -> Self {
        TurnJson {
            no: turn.no,
            outcome: turn.outcome.map(|o| o.as_str()),
            started_at: rfc3339(turn.started_at),
            ended_at: turn.ended_at.map(rfc3339),
            chunks: turn.chunks.iter().map(|c| c.text.as_str()).collect(),
        }
    }
}

#[derive(Debug, Serialize)]
struct TimelineJson<'a> {
    at: String,
    from: Option<&'static str>,
    to: &'static str,
    cause: &'a str,
}

impl<'a> From<&'a TimelineRow> for TimelineJson<'a> {
    fn from(row: &'a TimelineRow) -> Self {
        TimelineJson {
            at: rfc3339(row.at),
            from: row.from.map(|s| s.as_str()),
            to: row.to.as_str(),
            cause: &row.cause,
        }
    }
}

#[derive(Debug, Serialize)]
struct ShowJson<'a> {
    session: SessionJson,
    turns: Vec<TurnJson<'a>>,
    timeline: Vec<TimelineJson<'a>>,
}

#[derive(Debug, Serialize)]
struct RunJson {
    exit: i32,
    sessions: Vec<SessionJson>,
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Serializing plain structs of strings and numbers cannot fail.
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// `settle sessions --json`.
pub fn sessions_json(rows: &[SessionRow]) -> String {
    to_json(&rows.iter().map(SessionJson::from).collect::<Vec<_>>())
}

/// `settle run --json`.
pub fn run_json(exit: i32, rows: &[SessionRow]) -> String {
    to_json(&RunJson {
        exit,
        sessions: rows.iter().map(SessionJson::from).collect(),
    })
}

/// `settle show ID --json`.
pub fn show_json(detail: &SessionDetail) -> String {
    to_json(&ShowJson {
        session: SessionJson::from(&detail.session),
        turns: detail.turns.iter().map(TurnJson::from).collect(),
        timeline: detail.timeline.iter().map(TimelineJson::from).collect(),
    })
}

/// The table of `settle sessions` and of the summary of `settle run`.
pub fn sessions_table(rows: &[SessionRow]) -> String {
    let mut out = format!(
        "{:>5}  {:<20} {:>6}  {:<10} {:<13} {:<17} {:>5} {:>6}\n",
        "ID", "NAME", "PARENT", "STATE", "OUTCOME", "END REASON", "TURNS", "CHUNKS"
    );
    for row in rows {
        out.push_str(&format!(
            "{:>5}  {:<20} {:>6}  {:<10} {:<13} {:<17} {:>5} {:>6}\n",
            row.id,
            row.name,
            row.parent.map_or("-".to_owned(), |p| p.to_string()),
            row.state.as_str(),
            row.outcome.map_or("-", |o| o.as_str()),
            row.end_reason.map_or("-", |r| r.as_str()),
            row.turns,
            row.chunks,
        ));
    }
    out
}

/// `settle show ID`: the transcript by turn, then the timeline.
pub fn show_text(detail: &SessionDetail) -> String {
    let s = &detail.session;
    let mut out = format!(
        "session {} \"{}\"{}\n  state {}   outcome {}   end reason {}\n  created {}   finalized {}\n",
        s.id,
        s.name,
        s.parent.map_or(String::new(), |p| format!(" (child of {p})")),
        s.state.as_str(),
        s.outcome.map_or("-", |o| o.as_str()),
        s.end_reason.map_or("-", |r| r.as_str()),
        rfc3339(s.created_at),
        s.finalized_at.map_or("-".to_owned(), rfc3339),
    );
    if let Some(errors) = &detail.finalize_errors {
        out.push_str(&format!("  finalize steps that failed: {errors}\n"));
    }
    out.push_str("\ntranscript\n");
    if detail.turns.is_empty() {
        out.push_str("  (no turns)\n");
    }
    for turn in &detail.turns {
        out.push_str(&format!(
            "  turn {} [{}]\n",
            turn.no,
            turn.outcome.map_or("open", |o| o.as_str())
        ));
        for chunk in &turn.chunks {
            out.push_str(&format!("    {}\n", chunk.text));
        }
    }
    out.push_str("\ntimeline\n");
    let start = detail.timeline.first().map(|t| t.at);
    for row in &detail.timeline {
        let offset = start
            .and_then(|s| row.at.duration_since(s).ok())
            .map_or(String::new(), |d| format!("+{:>8.3}s", d.as_secs_f64()));
        out.push_str(&format!(
            "  {}  {offset}  {:>10} -> {:<10}  {}\n",
            rfc3339(row.at),
            row.from.map_or("-", |f| f.as_str()),
            row.to.as_str(),
            row.cause
        ));
    }
    out
}
