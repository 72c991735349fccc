//! What `sessions`, `show` and `run` print: the stable JSON shapes of the
//! specification (§7) and their plain-text tables.

use std::time::SystemTime;

use serde::Serialize;
use settle_store::{
    ChunkKind, ChunkRow, OwnerGone, OwnerRow, RecoveryCandidate, RecoveryReport, SessionDetail,
    SessionId, SessionRow, TimelineRow, TurnRow,
};

use crate::escape::{self, one_line};
use crate::listing::{self, Listed};
use crate::table::{Align, Column, Table};
use crate::transcript::{self, InputMessage, TurnFailure};

/// `at` as RFC 3339 UTC, to the millisecond, as the store's rows spell it
/// ([`settle_store::rfc3339`]: a time it cannot spell is written as what it
/// is, not a panic).
pub fn rfc3339(at: SystemTime) -> String {
    settle_store::rfc3339(at)
}

/// One session as `settle sessions --json` prints it: the store's one
/// definition of that shape (the gateway's `sessions.list` uses it too).
pub type SessionJson = serde_json::Value;

#[derive(Debug, Serialize)]
struct TurnJson<'a> {
    no: u32,
    outcome: Option<&'static str>,
    started_at: String,
    ended_at: Option<String>,
    /// The messages sent (null for a turn stored before inputs were kept).
    input: Option<Vec<InputMessage>>,
    /// The reply: the text chunks joined.
    text: String,
    /// Why it failed (null when it did not, or no reason was stored).
    error: Option<TurnFailure>,
    chunks: Vec<ChunkJson<'a>>,
}

/// One chunk in `show --json`: a text chunk is its text, a plain string, so
/// that a turn of text alone is an array of strings as it always was; a
/// structured chunk (reasoning, a tool call, usage, other data) is an object
/// `{kind, data}` (and `text`, when it carries some) in its place, so that
/// the array keeps every chunk in order, its index the chunk's `seq`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ChunkJson<'a> {
    /// A piece of the reply text.
    Text(&'a str),
    /// A structured chunk.
    Structured {
        /// `reasoning`, `tool_call`, `usage` or `data`.
        kind: &'static str,
        /// Its payload, as the provider sent it.
        data: Option<&'a serde_json::Value>,
        /// Text it carries beside its data, if any.
        #[serde(skip_serializing_if = "str::is_empty")]
        text: &'a str,
    },
}

impl<'a> From<&'a ChunkRow> for ChunkJson<'a> {
    fn from(chunk: &'a ChunkRow) -> Self {
        match chunk.kind {
            ChunkKind::Text => ChunkJson::Text(&chunk.text),
            kind => ChunkJson::Structured {
                kind: kind.as_str(),
                data: chunk.data.as_ref(),
                text: &chunk.text,
            },
        }
    }
}

impl<'a> TurnJson<'a> {
    /// `turn`, which was sent `input`.
    fn new(turn: &'a TurnRow, input: Option<Vec<InputMessage>>) -> Self {
        TurnJson {
            no: turn.no,
            outcome: turn.outcome.map(|o| o.as_str()),
            started_at: rfc3339(turn.started_at),
            ended_at: turn.ended_at.map(rfc3339),
            input,
            text: transcript::text(turn),
            error: transcript::error(turn),
            chunks: turn.chunks.iter().map(ChunkJson::from).collect(),
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
    escape::json(value, true).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// `settle sessions --json`.
pub fn sessions_json(listed: &[Listed]) -> String {
    to_json(&listed.iter().map(|l| l.row.to_json()).collect::<Vec<_>>())
}

/// `settle run --json`.
pub fn run_json(exit: i32, rows: &[SessionRow]) -> String {
    to_json(&RunJson {
        exit,
        sessions: rows.iter().map(SessionRow::to_json).collect(),
    })
}

/// `settle show ID --json`.
pub fn show_json(detail: &SessionDetail) -> String {
    to_json(&ShowJson {
        session: detail.session.to_json(),
        turns: detail
            .turns
            .iter()
            .zip(transcript::inputs(&detail.turns))
            .map(|(turn, input)| TurnJson::new(turn, input))
            .collect(),
        timeline: detail.timeline.iter().map(TimelineJson::from).collect(),
    })
}

/// The process that owned a session that recovery takes over.
#[derive(Debug, Serialize)]
struct OwnerJson {
    id: u64,
    host: String,
    pid: u32,
    /// Its machine identity (machine id or boot id), if it was recorded.
    machine: Option<String>,
    pid_namespace: Option<u64>,
    started_at: String,
    lease_expires_at: String,
}

impl From<&OwnerRow> for OwnerJson {
    fn from(owner: &OwnerRow) -> Self {
        OwnerJson {
            id: owner.id.0,
            host: owner.host.clone(),
            pid: owner.pid,
            machine: owner.identity.machine.clone(),
            pid_namespace: owner.identity.pid_namespace,
            started_at: rfc3339(owner.started_at),
            lease_expires_at: rfc3339(owner.lease_expires_at),
        }
    }
}

/// One session that `settle recover` finalized (or, with `--dry-run`, would).
#[derive(Debug, Serialize)]
struct RecoveredJson {
    id: u64,
    name: Option<String>,
    parent: Option<u64>,
    /// The state it was left in.
    state: Option<&'static str>,
    /// The turn that was open and is now (or would be) `interrupted`.
    interrupted_turn: Option<u32>,
    /// The process that owned it, as recovery found it.
    owner: Option<OwnerJson>,
    /// Why that owner counts as gone.
    why: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct OwnerGoneJson {
    owner: u64,
    why: &'static str,
}

#[derive(Debug, Serialize)]
struct RecoverJson {
    dry_run: bool,
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

/// One recovered (or recoverable) session: `found` is what recovery saw of
/// it before it wrote (absent for a session whose owner was found gone only
/// between the look and the recovery), `rows` give its parent.
fn recovered_json(
    id: SessionId,
    found: Option<&RecoveryCandidate>,
    interrupted_turn: Option<u32>,
    rows: &[SessionRow],
) -> RecoveredJson {
    let row = rows.iter().find(|r| r.id == id);
    RecoveredJson {
        id: id.get(),
        name: found
            .map(|c| c.name.clone())
            .or_else(|| row.map(|r| r.name.clone())),
        parent: row.and_then(|r| r.parent).map(|p| p.get()),
        state: found.map(|c| c.state.as_str()),
        interrupted_turn,
        owner: found.map(|c| OwnerJson::from(&c.owner)),
        why: found.map(|c| owner_gone(c.reason)),
    }
}

/// `settle recover --json`: each recovered session (children before
/// parents) with the state it was left in, the turn it interrupted, its
/// owner and lease and why that owner counts as gone; the owners found gone;
/// and the sessions another process finalized meanwhile. `found` is what
/// [`recovery_candidates`](settle_store::SessionStore::recovery_candidates)
/// said just before; `rows` give the parents.
pub fn recover_json(
    report: &RecoveryReport,
    found: &[RecoveryCandidate],
    rows: &[SessionRow],
) -> String {
    to_json(&RecoverJson {
        dry_run: false,
        recovered: report
            .recovered
            .iter()
            .map(|&id| {
                let turn = report
                    .interrupted_turns
                    .iter()
                    .find(|(s, _)| *s == id)
                    .map(|(_, turn)| *turn);
                recovered_json(id, found.iter().find(|c| c.session == id), turn, rows)
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

/// `settle recover --dry-run --json`: the shape of `recover --json`, with
/// `dry_run` true, listing what recovery would take over now.
pub fn recover_dry_run_json(found: &[RecoveryCandidate], rows: &[SessionRow]) -> String {
    let mut owners_gone: Vec<OwnerGoneJson> = Vec::new();
    for candidate in found {
        if !owners_gone.iter().any(|o| o.owner == candidate.owner.id.0) {
            owners_gone.push(OwnerGoneJson {
                owner: candidate.owner.id.0,
                why: owner_gone(candidate.reason),
            });
        }
    }
    to_json(&RecoverJson {
        dry_run: true,
        recovered: found
            .iter()
            .map(|c| recovered_json(c.session, Some(c), c.open_turn, rows))
            .collect(),
        owners_gone,
        finalized_elsewhere: Vec::new(),
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `settle recover`: `recovered N sessions (M interrupted turns)`.
pub fn recover_line(report: &RecoveryReport) -> String {
    let (sessions, turns) = (report.recovered.len(), report.interrupted_turns.len());
    format!(
        "recovered {sessions} session{} ({turns} interrupted turn{})",
        plural(sessions),
        plural(turns)
    )
}

/// `settle recover --dry-run`: a line saying how many sessions recovery
/// would take over, then one row per session with its owner (host, process
/// id, machine), when the owner's lease expires and why the owner counts as
/// gone; fitted to `width` when given.
pub fn recover_dry_run_text(found: &[RecoveryCandidate], width: Option<usize>) -> String {
    let turns = found.iter().filter(|c| c.open_turn.is_some()).count();
    let mut out = format!(
        "would recover {} session{} ({turns} interrupted turn{}); nothing was written\n",
        found.len(),
        plural(found.len()),
        plural(turns)
    );
    if found.is_empty() {
        return out;
    }
    let mut table = Table::new(vec![
        Column::new("ID", Align::Right),
        Column::new("NAME", Align::Left).shorten_to(12),
        Column::new("STATE", Align::Left),
        Column::new("TURN", Align::Right).drop_order(2),
        Column::new("HOST", Align::Left).shorten_to(8),
        Column::new("PID", Align::Right),
        Column::new("MACHINE", Align::Left)
            .shorten_to(8)
            .drop_order(1),
        Column::new("LEASE EXPIRES", Align::Left).drop_order(3),
        Column::new("WHY", Align::Left),
    ]);
    for c in found {
        table.push(vec![
            c.session.to_string(),
            c.name.clone(),
            c.state.as_str().to_owned(),
            c.open_turn.map_or("-".to_owned(), |t| t.to_string()),
            c.owner.host.clone(),
            c.owner.pid.to_string(),
            c.owner
                .identity
                .machine
                .clone()
                .unwrap_or_else(|| "-".to_owned()),
            rfc3339(c.owner.lease_expires_at),
            owner_gone(c.reason).to_owned(),
        ]);
    }
    out.push_str(&table.render(width).join("\n"));
    out.push('\n');
    out
}

/// The table of `settle sessions` and of the summary of `settle run`: one
/// line per session (names indented by depth), fitted to `width` when given
/// (a terminal's), with ages counted from `now`. A `FROM` column names the
/// session each one continues (`settle chat --resume`), when any listed
/// session was resumed; an `OWNER` column where clients reach the live
/// process that owns it (a fleet of `settle serve`, SPEC §12), when any has one.
pub fn sessions_table(listed: &[Listed], now: SystemTime, width: Option<usize>) -> String {
    // In a tree the indentation already says who the parent is.
    let tree = listed.iter().any(|l| l.depth > 0);
    let resumed = listed.iter().any(|l| l.row.resumed_from.is_some());
    let owned = listed.iter().any(|l| l.row.owner.is_some());
    let mut columns = vec![
        Column::new("ID", Align::Right),
        Column::new("NAME", Align::Left).shorten_to(12),
        Column::new("PARENT", Align::Right).drop_order(if tree { 0 } else { 3 }),
    ];
    if resumed {
        columns.push(Column::new("FROM", Align::Right).drop_order(3));
    }
    columns.extend([
        Column::new("STATE", Align::Left),
        Column::new("OUTCOME", Align::Left).drop_order(5),
        Column::new("END REASON", Align::Left).drop_order(4),
        Column::new("TURNS", Align::Right).drop_order(1),
        Column::new("CHUNKS", Align::Right).drop_order(2),
        Column::new("CREATED", Align::Left).drop_order(6),
    ]);
    if owned {
        columns.push(Column::new("OWNER", Align::Left).drop_order(7));
    }
    let mut table = Table::new(columns);
    let id_or_dash = |id: Option<SessionId>| id.map_or("-".to_owned(), |p| p.to_string());
    for Listed { row, depth } in listed {
        let mut cells = vec![
            row.id.to_string(),
            listing::indented(&row.name, *depth),
            id_or_dash(row.parent),
        ];
        if resumed {
            cells.push(id_or_dash(row.resumed_from));
        }
        cells.extend([
            row.state.as_str().to_owned(),
            row.outcome.map_or("-", |o| o.as_str()).to_owned(),
            row.end_reason.map_or("-", |r| r.as_str()).to_owned(),
            row.turns.to_string(),
            row.chunks.to_string(),
            listing::age(row.created_at, now),
        ]);
        if owned {
            cells.push(row.owner.clone().unwrap_or_else(|| "-".to_owned()));
        }
        table.push(cells);
    }
    let mut out = table.render(width).join("\n");
    out.push('\n');
    out
}

/// `settle show ID`: the session, each turn as its input, its reply as
/// flowing text (its reasoning before it, its tool calls and usage after
/// it, each shown as what it is), its outcome and error; then the timeline.
pub fn show_text(detail: &SessionDetail) -> String {
    let s = &detail.session;
    let mut links = Vec::new();
    if let Some(parent) = s.parent {
        links.push(format!("child of {parent}"));
    }
    if let Some(from) = s.resumed_from {
        links.push(format!("resumed from {from}"));
    }
    let mut out = format!(
        "session {} \"{}\"{}\n  state {}   outcome {}   end reason {}\n  created {}   finalized {}\n",
        s.id,
        one_line(&s.name),
        if links.is_empty() {
            String::new()
        } else {
            format!(" ({})", links.join(", "))
        },
        s.state.as_str(),
        s.outcome.map_or("-", |o| o.as_str()),
        s.end_reason.map_or("-", |r| r.as_str()),
        rfc3339(s.created_at),
        s.finalized_at.map_or("-".to_owned(), rfc3339),
    );
    if let Some(errors) = &detail.finalize_errors {
        out.push_str(&format!(
            "  finalize steps that failed: {}\n",
            one_line(errors)
        ));
    }
    if detail.turns.is_empty() {
        out.push_str("\nno turns\n");
    }
    let mut previous: Option<(Vec<InputMessage>, String)> = None;
    for (turn, input) in detail.turns.iter().zip(transcript::inputs(&detail.turns)) {
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
        let reply = transcript::reply(turn);
        if let Some(input) = input {
            let before = previous.as_ref().map(|(i, r)| (i.as_slice(), r.as_str()));
            for message in transcript::new_messages(before, &input) {
                out.push_str(&format!("  {}:\n", one_line(&message.speaker())));
                out.push_str(&indented(&message.shown(), "    "));
            }
            previous = Some((input, reply.text.clone()));
        }
        if !reply.reasoning.is_empty() {
            out.push_str("  reasoning:\n");
            out.push_str(&indented(&reply.reasoning, "    "));
        }
        if !reply.text.is_empty() {
            out.push_str("  reply:\n");
            out.push_str(&indented(&reply.text, "    "));
        } else if reply.is_empty() {
            out.push_str("  reply:\n    (nothing)\n");
        }
        for call in &reply.tool_calls {
            out.push_str(&format!(
                "  tool call: {}({}){}\n",
                one_line(&call.name),
                one_line(&call.arguments_line()),
                if call.id.is_empty() {
                    String::new()
                } else {
                    format!("   [{}]", one_line(&call.id))
                }
            ));
        }
        for usage in &reply.usage {
            out.push_str(&format!("  usage: {}\n", transcript::usage_line(usage)));
        }
        for data in &reply.data {
            out.push_str(&format!("  data: {}\n", one_line(&data.to_string())));
        }
        out.push_str(&format!(
            "  outcome: {}\n",
            turn.outcome.map_or("(open)", |o| o.as_str())
        ));
        if let Some(error) = transcript::error(turn) {
            out.push_str(&format!(
                "  error: {} ({})\n",
                one_line(&error.message),
                error.kind
            ));
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
            one_line(&row.cause)
        ));
    }
    // What the model wrote (replies, reasoning, inputs) keeps its lines,
    // nothing else: no control sequence reaches the terminal.
    escape::lines(&out).into_owned()
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

#[cfg(test)]
mod tests {

    use serde_json::{json, Value};
    use settle_store::{HostIdentity, OwnerId, State, TurnError, TurnErrorKind};

    use super::*;
    use crate::test_support::at;

    #[test]
    fn a_time_rfc_3339_cannot_spell_is_written_as_what_it_is_not_a_panic() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_millis(1)),
            "1970-01-01T00:00:00.001Z"
        );
        let far = UNIX_EPOCH + Duration::from_millis(i64::MAX as u64);
        assert_eq!(
            rfc3339(far),
            format!("(not a time: {} ms after 1970)", i64::MAX)
        );
        let before = UNIX_EPOCH - Duration::from_millis(5);
        assert_eq!(rfc3339(before), "(not a time: 5 ms before 1970)");
    }

    fn row(id: u64, resumed_from: Option<u64>) -> SessionRow {
        SessionRow {
            id: SessionId(id),
            name: "chat".to_owned(),
            parent: None,
            state: State::Finalized,
            outcome: None,
            end_reason: None,
            turns: 1,
            chunks: 4,
            created_at: at(0),
            finalized_at: Some(at(10)),
            resumed_from: resumed_from.map(SessionId),
            owner: None,
        }
    }

    fn chunk(seq: u32, kind: ChunkKind, text: &str, data: Option<Value>) -> ChunkRow {
        ChunkRow {
            seq,
            kind,
            text: text.to_owned(),
            data,
        }
    }

    /// A resumed chat whose one turn thought, answered, called a tool,
    /// reported usage, and then failed.
    fn detail() -> SessionDetail {
        SessionDetail {
            session: row(9, Some(4)),
            turns: vec![TurnRow {
                no: 1,
                outcome: Some(settle_store::Outcome::Failed),
                started_at: at(1),
                ended_at: Some(at(5)),
                input: Some(settle_store::TurnInput::whole(
                    json!([{"role": "user", "content": "weather?"}]),
                )),
                error: Some(TurnError::new(
                    TurnErrorKind::HttpStatus,
                    "HTTP 500 Internal Server Error from http://x/v1/chat/completions: busy",
                )),
                chunks: vec![
                    chunk(0, ChunkKind::Reasoning, "", Some(json!("hmm"))),
                    chunk(1, ChunkKind::Text, "Let me look.", None),
                    chunk(
                        2,
                        ChunkKind::ToolCall,
                        "",
                        Some(
                            json!({"index": 0, "id": "c1", "function": {"name": "weather", "arguments": "{}"}}),
                        ),
                    ),
                    chunk(3, ChunkKind::Usage, "", Some(json!({"total_tokens": 9}))),
                ],
            }],
            timeline: Vec::new(),
            finalize_errors: None,
        }
    }

    #[test]
    fn show_json_keeps_text_chunks_as_strings_and_structured_ones_as_objects() {
        let shown: Value = serde_json::from_str(&show_json(&detail())).unwrap();
        assert_eq!(shown["session"]["resumed_from"], 4);
        let turn = &shown["turns"][0];
        assert_eq!(turn["text"], "Let me look.");
        assert_eq!(
            turn["input"],
            json!([{"role": "user", "content": "weather?"}])
        );
        assert_eq!(turn["error"]["kind"], "http_status");
        assert_eq!(
            turn["chunks"],
            json!([
                {"kind": "reasoning", "data": "hmm"},
                "Let me look.",
                {"kind": "tool_call", "data": {"index": 0, "id": "c1", "function": {"name": "weather", "arguments": "{}"}}},
                {"kind": "usage", "data": {"total_tokens": 9}},
            ])
        );
    }

    #[test]
    fn show_json_keeps_a_tool_conversation_in_the_inputs() {
        let calls = json!([{"id": "c1", "type": "function",
                            "function": {"name": "weather", "arguments": "{}"}}]);
        let mut detail = detail();
        let mut second = detail.turns[0].clone();
        second.no = 2;
        second.outcome = Some(settle_store::Outcome::Completed);
        second.error = None;
        second.chunks = vec![chunk(0, ChunkKind::Text, "Sunny.", None)];
        second.input = Some(settle_store::TurnInput::whole(json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": calls},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ])));
        detail.turns.push(second);
        let shown: Value = serde_json::from_str(&show_json(&detail)).unwrap();
        let input = &shown["turns"][1]["input"];
        assert_eq!(input[1]["tool_calls"], calls);
        assert_eq!(input[2]["role"], "tool");
        assert_eq!(input[2]["tool_call_id"], "c1");
    }

    #[test]
    fn show_text_says_what_each_structured_chunk_is() {
        let text = show_text(&detail());
        assert!(
            text.starts_with("session 9 \"chat\" (resumed from 4)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  user:\n    weather?\n  reasoning:\n    hmm\n  reply:\n    Let me look.\n  \
                 tool call: weather({})   [c1]\n  usage: total_tokens=9\n  outcome: failed\n  \
                 error: HTTP 500 Internal Server Error from http://x/v1/chat/completions: busy (http_status)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_table_has_a_from_column_only_when_a_session_was_resumed() {
        let listed = |rows: Vec<SessionRow>| crate::listing::flat(rows);
        let plain = sessions_table(&listed(vec![row(1, None)]), at(0), None);
        assert!(!plain.contains("FROM"), "{plain}");
        let table = sessions_table(&listed(vec![row(2, Some(1)), row(1, None)]), at(0), None);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("ID  NAME  PARENT  FROM  STATE"),
            "{table}"
        );
        assert!(
            lines[1].starts_with(" 2  chat       -     1  finalized"),
            "{table}"
        );
        assert!(
            lines[2].starts_with(" 1  chat       -     -  finalized"),
            "{table}"
        );
    }

    fn candidate(session: u64, open_turn: Option<u32>) -> RecoveryCandidate {
        RecoveryCandidate {
            session: SessionId(session),
            name: format!("s{session}"),
            state: State::Running,
            open_turn,
            owner: OwnerRow {
                id: OwnerId(3),
                host: "box".to_owned(),
                identity: HostIdentity {
                    machine: Some("0123456789abcdef".to_owned()),
                    pid_namespace: Some(4026531836),
                },
                pid: 4242,
                started_at: at(0),
                lease_expires_at: at(30_000),
            },
            reason: OwnerGone::ProcessGone,
        }
    }

    #[test]
    fn a_dry_run_lists_owner_and_lease() {
        let found = [candidate(2, Some(1)), candidate(1, None)];
        let text = recover_dry_run_text(&found, None);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "would recover 2 sessions (1 interrupted turn); nothing was written"
        );
        assert!(lines[1].contains("HOST") && lines[1].contains("LEASE EXPIRES"));
        assert!(
            lines[2]
                .contains("box   4242  0123456789abcdef  2027-01-15T08:00:30.000Z  process_gone"),
            "{text}"
        );
        assert_eq!(
            recover_dry_run_text(&[], None),
            "would recover 0 sessions (0 interrupted turns); nothing was written\n"
        );

        let rows = [row(2, None), row(1, None)];
        let json: Value = serde_json::from_str(&recover_dry_run_json(&found, &rows)).unwrap();
        assert_eq!(json["dry_run"], true);
        let first = &json["recovered"][0];
        assert_eq!(first["id"], 2);
        assert_eq!(first["state"], "running");
        assert_eq!(first["interrupted_turn"], 1);
        assert_eq!(first["why"], "process_gone");
        assert_eq!(first["owner"]["host"], "box");
        assert_eq!(first["owner"]["pid"], 4242);
        assert_eq!(first["owner"]["machine"], "0123456789abcdef");
        assert_eq!(
            first["owner"]["lease_expires_at"],
            "2027-01-15T08:00:30.000Z"
        );
        assert_eq!(json["recovered"][1]["interrupted_turn"], Value::Null);
        assert_eq!(
            json["owners_gone"],
            json!([{"owner": 3, "why": "process_gone"}])
        );
    }

    #[test]
    fn a_recovery_says_whose_sessions_it_took() {
        let found = [candidate(2, Some(1))];
        let report = RecoveryReport {
            recovered: vec![SessionId(2), SessionId(5)],
            interrupted_turns: vec![(SessionId(2), 1)],
            owners_gone: vec![(OwnerId(3), OwnerGone::ProcessGone)],
            finalized_elsewhere: vec![SessionId(7)],
        };
        let json: Value =
            serde_json::from_str(&recover_json(&report, &found, &[row(5, None)])).unwrap();
        assert_eq!(json["dry_run"], false);
        assert_eq!(json["recovered"][0]["owner"]["pid"], 4242);
        assert_eq!(json["recovered"][0]["interrupted_turn"], 1);
        // Found gone only between the look and the recovery: no owner to tell.
        assert_eq!(json["recovered"][1]["name"], "chat");
        assert_eq!(json["recovered"][1]["owner"], Value::Null);
        assert_eq!(json["finalized_elsewhere"], json!([7]));
    }
    #[test]
    fn control_characters_of_a_name_an_error_and_a_reply_are_escaped_in_show_text() {
        let mut detail = detail();
        detail.session.name = "evil\u{1b}[31m\nname\u{0}".to_owned();
        if let Some(turn) = detail.turns.first_mut() {
            turn.error = Some(TurnError::new(
                TurnErrorKind::Provider,
                "bad\u{1b}]0;x\u{7}\nline",
            ));
            turn.outcome = Some(settle_store::Outcome::Failed);
            turn.chunks
                .push(chunk(9, ChunkKind::Text, "\u{1b}[2Jreply\r\n", None));
        }
        let printed = show_text(&detail);
        let raw: Vec<char> = printed
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(raw.is_empty(), "{raw:?} in {printed}");
        assert!(printed.contains("evil\\u{1b}[31m\\nname\\0"), "{printed}");
        assert!(printed.contains("bad\\u{1b}]0;x\\u{7}"), "{printed}");
    }
}
