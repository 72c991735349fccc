//! What `sessions`, `show` and `run` print: the stable JSON shapes of the
//! specification (§7) and their plain-text tables.

use std::time::SystemTime;

use serde::Serialize;
use settle_store::{
    OwnerGone, RecoveryReport, SessionDetail, SessionId, SessionRow, TimelineRow, TurnRow,
};

use crate::listing::{self, Listed};
use crate::table::{Align, Column, Table};
use crate::transcript::{self, InputMessage, TurnFailure};

/// `at` as RFC 3339 UTC, to the millisecond.
pub fn rfc3339(at: SystemTime) -> String {
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
    /// The messages sent (left out where the store does not keep them).
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<Vec<InputMessage>>,
    /// The reply: the chunks joined.
    text: String,
    /// Why it failed (left out where the store does not keep it).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<TurnFailure>,
    chunks: Vec<&'a str>,
}

impl<'a> From<&'a TurnRow> for TurnJson<'a> {
    fn from(turn: &'a TurnRow) -> Self {
        TurnJson {
            no: turn.no,
            outcome: turn.outcome.map(|o| o.as_str()),
            started_at: rfc3339(turn.started_at),
            ended_at: turn.ended_at.map(rfc3339),
            input: transcript::input(turn),
            text: transcript::text(turn),
            error: transcript::error(turn),
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
pub fn sessions_json(listed: &[Listed]) -> String {
    to_json(
        &listed
            .iter()
            .map(|l| SessionJson::from(&l.row))
            .collect::<Vec<_>>(),
    )
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

/// One session that `settle recover` finalized.
#[derive(Debug, Serialize)]
struct RecoveredJson {
    id: u64,
    name: Option<String>,
    parent: Option<u64>,
    /// The turn that was open and is now `interrupted`.
    interrupted_turn: Option<u32>,
}

#[derive(Debug, Serialize)]
struct OwnerGoneJson {
    owner: u64,
    why: &'static str,
}

#[derive(Debug, Serialize)]
struct RecoverJson {
    recovered: Vec<RecoveredJson>,
    owners_gone: Vec<OwnerGoneJson>,
    finalized_elsewhere: Vec<u64>,
}

fn owner_gone(why: OwnerGone) -> &'static str {
    match why {
        OwnerGone::LeaseExpired => "lease_expired",
        OwnerGone::ProcessGone => "process_gone",
    }
}

/// `settle recover --json`: each recovered session (children before
/// parents) with the turn it interrupted, the owners found gone and why, and
/// the sessions another process finalized meanwhile. `rows` gives the names.
pub fn recover_json(report: &RecoveryReport, rows: &[SessionRow]) -> String {
    let row = |id: SessionId| rows.iter().find(|r| r.id == id);
    to_json(&RecoverJson {
        recovered: report
            .recovered
            .iter()
            .map(|&id| RecoveredJson {
                id: id.get(),
                name: row(id).map(|r| r.name.clone()),
                parent: row(id).and_then(|r| r.parent).map(|p| p.get()),
                interrupted_turn: report
                    .interrupted_turns
                    .iter()
                    .find(|(s, _)| *s == id)
                    .map(|(_, turn)| *turn),
            })
            .collect(),
        owners_gone: report
            .owners_gone
            .iter()
            .map(|(owner, why)| OwnerGoneJson {
                owner: owner.0,
                why: owner_gone(*why),
            })
            .collect(),
        finalized_elsewhere: report.finalized_elsewhere.iter().map(|s| s.get()).collect(),
    })
}

/// `settle recover`: `recovered N sessions (M interrupted turns)`.
pub fn recover_line(report: &RecoveryReport) -> String {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let (sessions, turns) = (report.recovered.len(), report.interrupted_turns.len());
    format!(
        "recovered {sessions} session{} ({turns} interrupted turn{})",
        plural(sessions),
        plural(turns)
    )
}

/// The table of `settle sessions` and of the summary of `settle run`: one
/// line per session (names indented by depth), fitted to `width` when given
/// (a terminal's), with ages counted from `now`.
pub fn sessions_table(listed: &[Listed], now: SystemTime, width: Option<usize>) -> String {
    // In a tree the indentation already says who the parent is.
    let tree = listed.iter().any(|l| l.depth > 0);
    let mut table = Table::new(vec![
        Column::new("ID", Align::Right),
        Column::new("NAME", Align::Left).shorten_to(12),
        Column::new("PARENT", Align::Right).drop_order(if tree { 0 } else { 3 }),
        Column::new("STATE", Align::Left),
        Column::new("OUTCOME", Align::Left).drop_order(5),
        Column::new("END REASON", Align::Left).drop_order(4),
        Column::new("TURNS", Align::Right).drop_order(1),
        Column::new("CHUNKS", Align::Right).drop_order(2),
        Column::new("CREATED", Align::Left).drop_order(6),
    ]);
    for Listed { row, depth } in listed {
        table.push(vec![
            row.id.to_string(),
            format!("{}{}", "  ".repeat(*depth), row.name),
            row.parent.map_or("-".to_owned(), |p| p.to_string()),
            row.state.as_str().to_owned(),
            row.outcome.map_or("-", |o| o.as_str()).to_owned(),
            row.end_reason.map_or("-", |r| r.as_str()).to_owned(),
            row.turns.to_string(),
            row.chunks.to_string(),
            listing::age(row.created_at, now),
        ]);
    }
    let mut out = table.render(width).join("\n");
    out.push('\n');
    out
}

/// `settle show ID`: the session, each turn as its input, its reply as
/// flowing text, its outcome and error; then the timeline.
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
    if detail.turns.is_empty() {
        out.push_str("\nno turns\n");
    }
    let mut previous: Option<(Vec<InputMessage>, String)> = None;
    for turn in &detail.turns {
        let took = turn
            .ended_at
            .and_then(|end| end.duration_since(turn.started_at).ok())
            .map_or("still open".to_owned(), |d| {
                format!("took {:.3} s", d.as_secs_f64())
            });
        out.push_str(&format!(
            "\nturn {}   started {}, {took}\n",
            turn.no,
            rfc3339(turn.started_at)
        ));
        let text = transcript::text(turn);
        if let Some(input) = transcript::input(turn) {
            let before = previous.as_ref().map(|(i, r)| (i.as_slice(), r.as_str()));
            for message in transcript::new_messages(before, &input) {
                out.push_str(&format!("  {}:\n", message.role));
                out.push_str(&indented(&message.content, "    "));
            }
            previous = Some((input, text.clone()));
        }
        out.push_str("  reply:\n");
        if text.is_empty() {
            out.push_str("    (nothing)\n");
        } else {
            out.push_str(&indented(&text, "    "));
        }
        out.push_str(&format!(
            "  outcome: {}\n",
            turn.outcome.map_or("(open)", |o| o.as_str())
        ));
        if let Some(error) = transcript::error(turn) {
            out.push_str(&format!("  error: {} ({})\n", error.message, error.kind));
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

/// `text` with `prefix` before each of its lines, ending in a newline.
fn indented(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    for line in text.trim_end_matches('\n').split('\n') {
        out.push_str(prefix);
        out.push_str(line.trim_end_matches('\r'));
        out.push('\n');
    }
    out
}
