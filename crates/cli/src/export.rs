//! `settle export ID`: one session as Markdown that a person reads, or as
//! JSON Lines that a script replays.
//!
//! The JSON Lines are, in order: one `session` line (the fields of
//! `settle sessions --json`), then the session's events as they happened:
//! `transition` (`at`, `from`, `to`, `cause`), `turn_input` (`turn`, `at`,
//! `messages`: null for a turn stored before inputs were kept), `chunk`
//! (`turn`, `seq`, `kind`, `text`, and `data` for a structured chunk:
//! reasoning, a tool call, usage), `turn_end` (`turn`, `at`, `outcome`,
//! `error`: null unless the turn failed with a stored reason). Every line
//! names its `session`.
//!
//! ```
//! use settle_cli::export::Format;
//!
//! assert_eq!("md".parse::<Format>(), Ok(Format::Markdown));
//! assert!("pdf".parse::<Format>().is_err());
//! ```

use std::fmt::Write as _;
use std::str::FromStr;
use std::time::SystemTime;

use serde::Serialize;
use settle_store::{ChunkRow, SessionDetail, State, TimelineRow, TurnRow};

use crate::escape;
use crate::output::{rfc3339, SessionJson};
use crate::transcript::{self, InputMessage, TurnFailure};

/// What `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Markdown (`md`).
    Markdown,
    /// JSON Lines (`jsonl`).
    JsonLines,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "md" | "markdown" => Ok(Format::Markdown),
            "jsonl" => Ok(Format::JsonLines),
            other => Err(format!(
                "`{other}` is not an export format: use md or jsonl"
            )),
        }
    }
}

/// `detail` in `format`.
pub fn render(detail: &SessionDetail, format: Format) -> String {
    match format {
        Format::Markdown => markdown(detail),
        Format::JsonLines => json_lines(detail),
    }
}

/// The session as Markdown: a heading and its facts, each turn's input, its
/// reply as flowing text (its reasoning as a quote before it, its tool calls
/// and usage after it), its outcome and error, and the timeline.
pub fn markdown(detail: &SessionDetail) -> String {
    let s = &detail.session;
    let mut out = String::new();
    let _ = writeln!(out, "# Session {}: {}\n", s.id, inline(&s.name));
    let facts = [
        (
            "parent",
            s.parent.map_or("none".to_owned(), |p| p.to_string()),
        ),
        ("state", s.state.as_str().to_owned()),
        ("outcome", s.outcome.map_or("-", |o| o.as_str()).to_owned()),
        (
            "end reason",
            s.end_reason.map_or("-", |r| r.as_str()).to_owned(),
        ),
        ("created", rfc3339(s.created_at)),
        ("finalized", s.finalized_at.map_or("-".to_owned(), rfc3339)),
    ];
    for (name, value) in facts {
        let _ = writeln!(out, "- **{name}:** {value}");
    }
    if let Some(from) = s.resumed_from {
        let _ = writeln!(out, "- **resumed from:** session {from}");
    }
    if let Some(errors) = &detail.finalize_errors {
        let _ = writeln!(out, "- **finalize steps that failed:** {}", inline(errors));
    }
    let mut previous: Option<(Vec<InputMessage>, String)> = None;
    for (turn, input) in detail.turns.iter().zip(transcript::inputs(&detail.turns)) {
        let _ = writeln!(
            out,
            "\n## Turn {}\n\n_Started {}, {}._",
            turn.no,
            rfc3339(turn.started_at),
            turn.ended_at.map_or("still open".to_owned(), |end| format!(
                "ended {}",
                rfc3339(end)
            ))
        );
        let reply = transcript::reply(turn);
        if let Some(input) = input {
            let before = previous.as_ref().map(|(i, r)| (i.as_slice(), r.as_str()));
            for message in transcript::new_messages(before, &input) {
                let _ = writeln!(
                    out,
                    "\n**{}:**\n\n{}",
                    inline(&message.speaker()),
                    message.shown().trim_end()
                );
            }
            previous = Some((input, reply.text.clone()));
        }
        if !reply.reasoning.is_empty() {
            let _ = writeln!(out, "\n**reasoning:**\n\n{}", quoted(&reply.reasoning));
        }
        if !reply.text.is_empty() {
            let _ = writeln!(out, "\n**reply:**\n\n{}", reply.text.trim_end());
        } else if reply.is_empty() {
            let _ = writeln!(out, "\n**reply:** _(nothing)_");
        }
        for call in &reply.tool_calls {
            let id = if call.id.is_empty() {
                String::new()
            } else {
                format!(" ({})", inline(&call.id))
            };
            let _ = writeln!(
                out,
                "\n**tool call** `{}`{id}:\n\n```json\n{}\n```",
                inline(&call.name),
                call.arguments_line()
            );
        }
        for usage in &reply.usage {
            let _ = writeln!(out, "\n**usage:** {}", transcript::usage_line(usage));
        }
        for data in &reply.data {
            let _ = writeln!(out, "\n**data:** `{data}`");
        }
        let _ = writeln!(
            out,
            "\n**Outcome:** {}",
            turn.outcome.map_or("open", |o| o.as_str())
        );
        if let Some(error) = transcript::error(turn) {
            let _ = writeln!(
                out,
                "\n**Error** (`{}`): {}",
                error.kind,
                inline(&error.message)
            );
        }
    }
    let _ = writeln!(
        out,
        "\n## Timeline\n\n| at | from | to | cause |\n|---|---|---|---|"
    );
    for row in &detail.timeline {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            rfc3339(row.at),
            row.from.map_or("-", |f| f.as_str()),
            row.to.as_str(),
            cell(&row.cause)
        );
    }
    // What the model wrote keeps its lines, nothing else: no control
    // sequence reaches the terminal or the reader's viewer.
    escape::lines(&out).into_owned()
}

/// `text` as a Markdown quote, each of its lines after `> `.
fn quoted(text: &str) -> String {
    text.trim_end()
        .lines()
        .map(|line| format!("> {line}").trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` on one line (for a heading or a list item), its control
/// characters escaped.
fn inline(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    escape::one_line(&joined).into_owned()
}

/// `text` for a table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    inline(text).replace('|', "\\|")
}

/// One line of the JSON Lines export.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Line<'a> {
    Session(SessionJson),
    Transition {
        session: u64,
        at: String,
        from: Option<&'static str>,
        to: &'static str,
        cause: &'a str,
    },
    TurnInput {
        session: u64,
        turn: u32,
        at: String,
        messages: Option<Vec<InputMessage>>,
    },
    Chunk {
        session: u64,
        turn: u32,
        seq: usize,
        kind: &'static str,
        text: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a serde_json::Value>,
    },
    TurnEnd {
        session: u64,
        turn: u32,
        at: String,
        outcome: &'static str,
        error: Option<TurnFailure>,
    },
}

/// One event of a turn, with the time it is ordered by.
enum TurnEvent<'a> {
    Input(&'a TurnRow),
    Chunk(&'a TurnRow, usize, &'a ChunkRow),
    End(&'a TurnRow, SystemTime),
}

/// The session as JSON Lines: a `session` line, then its events in order.
pub fn json_lines(detail: &SessionDetail) -> String {
    let id = detail.session.id.get();
    let mut lines = vec![Line::Session(detail.session.to_json())];
    // What each turn was sent, rebuilt from what each added, by number.
    let mut inputs: std::collections::HashMap<u32, Option<Vec<InputMessage>>> = detail
        .turns
        .iter()
        .map(|t| t.no)
        .zip(transcript::inputs(&detail.turns))
        .collect();
    for event in in_order(&detail.timeline, &detail.turns) {
        lines.push(match event {
            Either::Transition(row) => Line::Transition {
                session: id,
                at: rfc3339(row.at),
                from: row.from.map(|f| f.as_str()),
                to: row.to.as_str(),
                cause: &row.cause,
            },
            Either::Turn(TurnEvent::Input(turn)) => Line::TurnInput {
                session: id,
                turn: turn.no,
                at: rfc3339(turn.started_at),
                messages: inputs.remove(&turn.no).flatten(),
            },
            Either::Turn(TurnEvent::Chunk(turn, seq, chunk)) => Line::Chunk {
                session: id,
                turn: turn.no,
                seq,
                kind: chunk.kind.as_str(),
                text: &chunk.text,
                data: chunk.data.as_ref(),
            },
            Either::Turn(TurnEvent::End(turn, at)) => Line::TurnEnd {
                session: id,
                turn: turn.no,
                at: rfc3339(at),
                outcome: turn.outcome.map_or("open", |o| o.as_str()),
                error: transcript::error(turn),
            },
        });
    }
    let mut out = String::new();
    for line in lines {
        // Plain strings and numbers: serializing cannot fail.
        if let Ok(json) = escape::json(&line, false) {
            out.push_str(&json);
            out.push('\n');
        }
    }
    out
}

enum Either<'a> {
    Transition(&'a TimelineRow),
    Turn(TurnEvent<'a>),
}

/// The timeline and the turns' events merged by time. A turn's own events
/// keep their order (input, chunks, end). At the same millisecond, a turn's
/// input and chunks come after the transitions (they follow the one into
/// `running`), and its end after the transitions into `running` or
/// `cancelling` but before the others (the end causes those). The store keeps no time per chunk: a chunk is placed at its
/// turn's start, so it stays between its turn's input and end.
fn in_order<'a>(timeline: &'a [TimelineRow], turns: &'a [TurnRow]) -> Vec<Either<'a>> {
    let mut turn_events: Vec<(SystemTime, TurnEvent<'a>)> = Vec::new();
    for turn in turns {
        turn_events.push((turn.started_at, TurnEvent::Input(turn)));
        for (seq, chunk) in turn.chunks.iter().enumerate() {
            turn_events.push((turn.started_at, TurnEvent::Chunk(turn, seq, chunk)));
        }
        if let Some(end) = turn.ended_at.filter(|_| turn.outcome.is_some()) {
            turn_events.push((end, TurnEvent::End(turn, end)));
        }
    }
    let mut merged = Vec::with_capacity(timeline.len() + turn_events.len());
    let mut transitions = timeline.iter().peekable();
    for (at, event) in turn_events {
        let end = matches!(event, TurnEvent::End(..));
        let before = |row: &&TimelineRow| {
            row.at < at
                || (row.at == at && (!end || matches!(row.to, State::Running | State::Cancelling)))
        };
        while let Some(row) = transitions.next_if(before) {
            merged.push(Either::Transition(row));
        }
        merged.push(Either::Turn(event));
    }
    merged.extend(transitions.map(Either::Transition));
    merged
}

#[cfg(test)]
mod tests {

    use serde_json::Value;
    use settle_store::{Outcome, SessionId, SessionRow};

    use super::*;
    use crate::test_support::{at, text_chunks};

    fn step(ms: u64, from: Option<State>, to: State, cause: &str) -> TimelineRow {
        TimelineRow {
            at: at(ms),
            from,
            to,
            cause: cause.to_owned(),
        }
    }

    fn detail() -> SessionDetail {
        use State::*;
        SessionDetail {
            session: SessionRow {
                id: SessionId(7),
                name: "chat | demo".to_owned(),
                parent: None,
                state: Finalized,
                outcome: Some(Outcome::Cancelled),
                end_reason: Some(settle_store::EndReason::UserClose),
                turns: 2,
                chunks: 3,
                created_at: at(0),
                finalized_at: Some(at(40)),
                resumed_from: None,
                owner: None,
            },
            turns: vec![
                TurnRow {
                    no: 1,
                    outcome: Some(Outcome::Completed),
                    started_at: at(10),
                    ended_at: Some(at(20)),
                    input: None,
                    error: None,
                    chunks: text_chunks(&["Hi", " there!"]),
                },
                TurnRow {
                    no: 2,
                    outcome: Some(Outcome::Cancelled),
                    started_at: at(20),
                    ended_at: Some(at(30)),
                    input: None,
                    error: None,
                    chunks: text_chunks(&["Well,\nthen"]),
                },
            ],
            timeline: vec![
                step(0, None, Registered, "registered"),
                step(10, Some(Registered), Running, "turn started"),
                step(20, Some(Running), Registered, "turn ended: completed"),
                step(20, Some(Registered), Running, "turn started"),
                step(30, Some(Running), Cancelling, "cancel | by the user"),
                step(30, Some(Cancelling), Settled, "work exited"),
                step(40, Some(Settled), Finalized, "finalized: user_close"),
            ],
            finalize_errors: None,
        }
    }

    #[test]
    fn json_lines_replay_the_session_in_order() {
        let text = json_lines(&detail());
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<String> = lines
            .iter()
            .map(|l| match l["event"].as_str().unwrap() {
                "transition" => format!("->{}", l["to"].as_str().unwrap()),
                "chunk" => format!("chunk{}.{}", l["turn"], l["seq"]),
                other => format!("{other}{}", l["turn"]),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "sessionnull",
                "->registered",
                "->running",
                "turn_input1",
                "chunk1.0",
                "chunk1.1",
                "turn_end1",
                "->registered",
                "->running",
                "turn_input2",
                "chunk2.0",
                "->cancelling",
                "turn_end2",
                "->settled",
                "->finalized",
            ]
        );
        assert!(lines.iter().all(|l| l["session"] == 7 || l["id"] == 7));
        assert_eq!(lines[5]["text"], " there!");
        assert_eq!(lines[12]["outcome"], "cancelled");
        // Where the store keeps no input or error, the fields are null.
        assert!(lines[3]["messages"].is_null());
        assert!(lines[12]["error"].is_null());
    }

    /// `detail()` with a first turn that reasoned, called a tool and
    /// reported usage, and a second that failed with a stored reason.
    fn structured() -> SessionDetail {
        use serde_json::json;
        let mut detail = detail();
        detail.session.resumed_from = Some(SessionId(3));
        let turn = &mut detail.turns[0];
        turn.input = Some(settle_store::TurnInput::whole(
            json!([{"role": "user", "content": "hi"}]),
        ));
        let structured = |seq, kind, data| settle_store::ChunkRow {
            seq,
            kind,
            text: String::new(),
            data: Some(data),
        };
        turn.chunks.insert(
            0,
            structured(0, settle_store::ChunkKind::Reasoning, json!("a greeting")),
        );
        turn.chunks.push(structured(
            3,
            settle_store::ChunkKind::ToolCall,
            json!({"index": 0, "id": "c1", "function": {"name": "wave", "arguments": "{\"hand\": \"left\"}"}}),
        ));
        turn.chunks.push(structured(
            4,
            settle_store::ChunkKind::Usage,
            json!({"total_tokens": 7}),
        ));
        detail.turns[1].outcome = Some(Outcome::Failed);
        detail.turns[1].error = Some(settle_store::TurnError::new(
            settle_store::TurnErrorKind::Connect,
            "cannot reach http://127.0.0.1:9/v1/chat/completions: connection refused (is the server running?)",
        ));
        detail
    }

    #[test]
    fn structured_chunks_and_errors_in_both_formats() {
        let md = markdown(&structured());
        assert!(md.contains("- **resumed from:** session 3\n"), "{md}");
        assert!(
            md.contains(
                "\n**user:**\n\nhi\n\n**reasoning:**\n\n> a greeting\n\n**reply:**\n\nHi there!\n\n\
                 **tool call** `wave` (c1):\n\n```json\n{\"hand\":\"left\"}\n```\n\n**usage:** total_tokens=7\n"
            ),
            "{md}"
        );
        assert!(
            md.contains("**Error** (`connect`): cannot reach http://127.0.0.1:9/v1/chat/completions: connection refused (is the server running?)"),
            "{md}"
        );

        let lines: Vec<Value> = json_lines(&structured())
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["resumed_from"], 3);
        let chunks: Vec<&Value> = lines.iter().filter(|l| l["event"] == "chunk").collect();
        assert_eq!(chunks[0]["kind"], "reasoning");
        assert_eq!(chunks[0]["data"], "a greeting");
        assert_eq!(chunks[1]["kind"], "text");
        assert!(chunks[1].get("data").is_none());
        assert_eq!(chunks[3]["kind"], "tool_call");
        assert_eq!(chunks[3]["data"]["function"]["name"], "wave");
        assert_eq!(chunks[4]["data"]["total_tokens"], 7);
        let input = lines.iter().find(|l| l["event"] == "turn_input").unwrap();
        assert_eq!(input["messages"][0]["content"], "hi");
        let failed = lines
            .iter()
            .find(|l| l["event"] == "turn_end" && l["turn"] == 2)
            .unwrap();
        assert_eq!(failed["outcome"], "failed");
        assert_eq!(failed["error"]["kind"], "connect");
    }

    /// `detail()` as a chat of two turns stores it: whole, then as added
    /// (`new_format`), or both whole as before additions were kept.
    fn chat(new_format: bool) -> SessionDetail {
        use serde_json::json;
        use settle_store::TurnInput;
        let mut detail = detail();
        let calls = json!([{"id": "c1", "function": {"name": "scan"}}]);
        let first =
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
        let added = json!([
            {"role": "user", "content": "scan it"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "22 open", "tool_call_id": "c1"},
        ]);
        let mut whole = first.as_array().unwrap().clone();
        whole.push(json!({"role": "assistant", "content": "Hi there!"}));
        whole.extend(added.as_array().unwrap().iter().cloned());
        detail.turns[0].input = Some(TurnInput::whole(first));
        detail.turns[1].input = Some(if new_format {
            TurnInput::added(3, added)
        } else {
            TurnInput::whole(Value::Array(whole))
        });
        detail
    }

    #[test]
    fn a_conversation_stored_as_additions_prints_as_one_stored_whole() {
        let (new, old) = (chat(true), chat(false));
        assert_eq!(json_lines(&new), json_lines(&old));
        assert_eq!(markdown(&new), markdown(&old));
        assert_eq!(
            crate::output::show_json(&new),
            crate::output::show_json(&old)
        );
        assert_eq!(
            crate::output::show_text(&new),
            crate::output::show_text(&old)
        );
        let lines: Vec<Value> = json_lines(&new)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let inputs: Vec<&Value> = lines
            .iter()
            .filter(|l| l["event"] == "turn_input")
            .map(|l| &l["messages"])
            .collect();
        // The second turn was sent everything, its tool round trip kept.
        let second = inputs[1].as_array().unwrap();
        assert_eq!(second.len(), 6);
        assert_eq!(second[2]["content"], "Hi there!");
        assert_eq!(second[4]["tool_calls"][0]["id"], "c1");
        assert_eq!(second[5]["tool_call_id"], "c1");
        assert!(second[0].get("tool_calls").is_none());
        // The Markdown shows each message once: the second turn's new ones.
        let md = markdown(&new);
        assert_eq!(md.matches("**user:**\n\nhi\n").count(), 1, "{md}");
        assert!(md.contains("**user:**\n\nscan it\n"), "{md}");
        assert!(md.contains("**tool:**\n\n22 open\n"), "{md}");
    }

    #[test]
    fn markdown_reads_as_a_transcript() {
        let md = markdown(&detail());
        assert!(md.starts_with("# Session 7: chat | demo\n"), "{md}");
        assert!(md.contains("\n**reply:**\n\nHi there!\n"), "{md}");
        assert!(md.contains("\n**reply:**\n\nWell,\nthen\n"), "{md}");
        assert!(md.contains("**Outcome:** cancelled"), "{md}");
        assert!(md.contains("| cancel \\| by the user |"), "{md}");
    }
    #[test]
    fn control_characters_of_a_name_an_error_and_a_reply_are_escaped_in_markdown() {
        let mut detail = detail();
        detail.session.name = "evil\u{1b}[31m\nname\u{0}".to_owned();
        if let Some(turn) = detail.turns.first_mut() {
            turn.error = Some(settle_store::TurnError::new(
                settle_store::TurnErrorKind::Provider,
                "bad\u{1b}]0;x\u{7}\nline",
            ));
            turn.outcome = Some(Outcome::Failed);
            turn.chunks = text_chunks(&["\u{1b}[2Jreply\r\n"]);
        }
        let printed = markdown(&detail);
        let raw: Vec<char> = printed
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(raw.is_empty(), "{raw:?} in {printed}");
        // Markdown puts a name on one line: its newline is a space.
        assert!(printed.contains("evil\\u{1b}[31m name\\0"), "{printed}");
        assert!(printed.contains("bad\\u{1b}]0;x\\u{7}"), "{printed}");
    }
}
