//! `settle show ID --trace FILE`: a session and its subtree as a Chrome
//! trace (the trace-event JSON format that Perfetto and `chrome://tracing`
//! open), so that a teardown becomes a picture.
//!
//! One process (`pid`, the session asked for) holds one track (`tid`, the
//! session's id) per session of the subtree, named by its path from the top
//! (`root#1/recon#3/ports#4`) and sorted depth first, so that children sit
//! under their parent. On each track:
//!
//! - the session's states, from its timeline, as complete events (`ph: "X"`,
//!   category `state`): `registered`, `running`, `cancelling`, `settled`;
//!   `finalized` is an instant (`ph: "i"`) named after the end reason;
//! - its turns as complete events (category `turn`) nested inside the state
//!   spans they cross: a turn that was cancelled shows as `turn 2` inside
//!   `running`, then again inside `cancelling`;
//! - its chunks (category `chunk`) and cancels (category `cancel`) as
//!   instants. The store keeps no time per chunk, so a turn's chunks are
//!   spread evenly over it, in order (their `args.at` says `spread`).
//!
//! Times (`ts`, `dur`) are microseconds from the first registration of the
//! subtree; `otherData.started_at` gives that moment.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::{json, Value};
use settle_runtime::State;
use settle_store::{SessionDetail, SessionId, TurnRow};

use crate::output::rfc3339;

/// The sessions of one subtree, each with its depth-first path.
#[derive(Debug, Clone)]
pub struct Subtree {
    /// The session asked for.
    pub top: SessionId,
    /// Every session of the subtree, depth first (the top first), with its
    /// name path from the top.
    pub sessions: Vec<(SessionDetail, String)>,
}

/// Orders `details` (the session `top` and its descendants, in any order)
/// depth first, children by id, and names each by its path from `top`.
/// Sessions that do not descend from `top` are left out.
pub fn subtree(top: SessionId, details: Vec<SessionDetail>) -> Subtree {
    let mut by_parent: BTreeMap<Option<SessionId>, Vec<SessionDetail>> = BTreeMap::new();
    let mut root = None;
    for detail in details {
        if detail.session.id == top {
            root = Some(detail);
        } else {
            by_parent
                .entry(detail.session.parent)
                .or_default()
                .push(detail);
        }
    }
    for kids in by_parent.values_mut() {
        kids.sort_by_key(|d| d.session.id);
    }
    let mut sessions = Vec::new();
    let mut stack: Vec<(SessionDetail, Path)> = root
        .map(|d| {
            let path = Path::top(&d);
            (d, path)
        })
        .into_iter()
        .collect();
    while let Some((detail, path)) = stack.pop() {
        if let Some(kids) = by_parent.remove(&Some(detail.session.id)) {
            for kid in kids.into_iter().rev() {
                let kid_path = path.down(&kid);
                stack.push((kid, kid_path));
            }
        }
        sessions.push((detail, path.to_string()));
    }
    Subtree { top, sessions }
}

/// How many names below the top a track's path keeps: deeper, the names
/// between are left out and counted (`root#1/…998 more…/a#1000/…`), so
/// that a chain thousands deep does not name each of its tracks by
/// thousands of names (the trace would grow with the square of the depth).
const PATH_NAMES: usize = 8;

/// A session's path from the top of the subtree: the top's name, then at
/// most [`PATH_NAMES`] of the last names down to it.
#[derive(Debug, Clone)]
struct Path {
    top: String,
    /// The last names down to the session, at most [`PATH_NAMES`].
    last: Vec<String>,
    /// How many names down from the top, the session's own included.
    depth: usize,
}

impl Path {
    fn top(detail: &SessionDetail) -> Self {
        Path {
            top: format!("{}#{}", detail.session.name, detail.session.id),
            last: Vec::new(),
            depth: 0,
        }
    }

    /// The path of `kid`, a child of the session at this path.
    fn down(&self, kid: &SessionDetail) -> Self {
        let mut last = Vec::with_capacity(PATH_NAMES);
        let keep = self.last.len().min(PATH_NAMES - 1);
        last.extend_from_slice(&self.last[self.last.len() - keep..]);
        last.push(format!("{}#{}", kid.session.name, kid.session.id));
        Path {
            top: self.top.clone(),
            last,
            depth: self.depth + 1,
        }
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.top)?;
        let left_out = self.depth - self.last.len();
        if left_out > 0 {
            write!(f, "/…{left_out} more…")?;
        }
        for name in &self.last {
            write!(f, "/{name}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Serialize)]
struct Trace {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<Value>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "otherData")]
    other_data: Value,
}

/// Microseconds from `origin` to `at` (0 for a time before it).
fn micros(origin: SystemTime, at: SystemTime) -> u64 {
    let d = at.duration_since(origin).unwrap_or_default();
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A span of one state of a session, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
}

/// The trace of `tree` as JSON text; `now` ends what is still open.
pub fn render(tree: &Subtree, now: SystemTime) -> String {
    let origin = tree
        .sessions
        .iter()
        .flat_map(|(d, _)| d.timeline.first().map(|t| t.at))
        .chain(tree.sessions.iter().map(|(d, _)| d.session.created_at))
        .min()
        .unwrap_or(now);
    let pid = tree.top.get();
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
        "args": { "name": format!("settle session {pid}") },
    })];
    for (index, (detail, path)) in tree.sessions.iter().enumerate() {
        let tid = detail.session.id.get();
        events.push(json!({
            "name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
            "args": { "name": path },
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
            "args": { "sort_index": index },
        }));
        session_events(detail, origin, micros(origin, now), pid, &mut events);
    }
    let trace = Trace {
        trace_events: events,
        display_time_unit: "ms",
        other_data: json!({
            "session": pid,
            "started_at": rfc3339(origin),
            "sessions": tree.sessions.len(),
        }),
    };
    // No control character raw (C1 ones included), as every JSON output.
    crate::escape::json(&trace, false).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

fn session_events(
    detail: &SessionDetail,
    origin: SystemTime,
    now: u64,
    pid: u64,
    out: &mut Vec<Value>,
) {
    let tid = detail.session.id.get();
    let at = |t: SystemTime| micros(origin, t);
    // The states, each until the next transition (the last until now).
    let mut spans: Vec<Span> = Vec::new();
    for (i, row) in detail.timeline.iter().enumerate() {
        let start = at(row.at);
        if row.to == State::Finalized {
            let reason = detail
                .session
                .end_reason
                .map_or("finalized", |r| r.as_str());
            out.push(json!({
                "name": format!("finalized: {reason}"), "cat": "state", "ph": "i", "s": "t",
                "ts": start, "pid": pid, "tid": tid, "args": { "cause": row.cause },
            }));
            continue;
        }
        let end = detail
            .timeline
            .get(i + 1)
            .map_or(now, |next| at(next.at))
            .max(start);
        spans.push(Span { start, end });
        out.push(json!({
            "name": row.to.as_str(), "cat": "state", "ph": "X",
            "ts": start, "dur": end - start, "pid": pid, "tid": tid,
            "args": { "cause": row.cause },
        }));
        if row.to == State::Cancelling {
            out.push(json!({
                "name": "cancel", "cat": "cancel", "ph": "i", "s": "t",
                "ts": start, "pid": pid, "tid": tid, "args": { "cause": row.cause },
            }));
        }
    }
    for turn in &detail.turns {
        turn_events(
            turn,
            &spans,
            at(turn.started_at),
            turn.ended_at.map_or(now, at),
            pid,
            tid,
            out,
        );
    }
}

fn turn_events(
    turn: &TurnRow,
    spans: &[Span],
    start: u64,
    end: u64,
    pid: u64,
    tid: u64,
    out: &mut Vec<Value>,
) {
    let end = end.max(start);
    let name = format!("turn {}", turn.no);
    let args = json!({
        "turn": turn.no,
        "outcome": turn.outcome.map_or("open", |o| o.as_str()),
        "chunks": turn.chunks.len(),
    });
    // One piece inside each state span the turn crosses, so that it nests.
    let mut pieces: Vec<(u64, u64)> = spans
        .iter()
        .filter(|s| s.start < end && start < s.end)
        .map(|s| (start.max(s.start), end.min(s.end)))
        .collect();
    if pieces.is_empty() {
        // A turn of no length (or, in a timeline that does not cover it,
        // one that crosses no span): as it is.
        pieces.push((start, end));
    }
    for (from, to) in pieces {
        out.push(json!({
            "name": name, "cat": "turn", "ph": "X",
            "ts": from, "dur": to - from, "pid": pid, "tid": tid, "args": args,
        }));
    }
    let n = turn.chunks.len() as u64;
    for (seq, chunk) in turn.chunks.iter().enumerate() {
        let ts = start + (end - start) * (seq as u64 + 1) / (n + 1);
        out.push(json!({
            "name": "chunk", "cat": "chunk", "ph": "i", "s": "t",
            "ts": ts, "pid": pid, "tid": tid,
            "args": {
                "turn": turn.no, "seq": seq, "kind": chunk.kind.as_str(),
                "text": chunk.text, "data": chunk.data, "at": "spread",
            },
        }));
    }
}

#[cfg(test)]
mod tests {

    use settle_store::{EndReason, Outcome, SessionRow, TimelineRow};

    use super::*;
    use crate::test_support::{at, text_chunks};

    fn session(id: u64, parent: Option<u64>, name: &str) -> SessionDetail {
        use State::*;
        let step = |ms, from, to| TimelineRow {
            at: at(ms),
            from,
            to,
            cause: format!("to {to}"),
        };
        SessionDetail {
            session: SessionRow {
                id: SessionId(id),
                name: name.to_owned(),
                parent: parent.map(SessionId),
                state: Finalized,
                outcome: Some(Outcome::Cancelled),
                end_reason: Some(EndReason::Cancelled),
                turns: 1,
                chunks: 2,
                created_at: at(0),
                finalized_at: Some(at(40)),
                resumed_from: None,
                owner: None,
            },
            turns: vec![TurnRow {
                no: 1,
                outcome: Some(Outcome::Cancelled),
                started_at: at(10),
                ended_at: Some(at(35)),
                input: None,
                error: None,
                chunks: text_chunks(&["a", "b"]),
            }],
            timeline: vec![
                step(0, None, Registered),
                step(10, Some(Registered), Running),
                step(20, Some(Running), Cancelling),
                step(30, Some(Cancelling), Settled),
                step(40, Some(Settled), Finalized),
            ],
            finalize_errors: None,
        }
    }

    fn events(tree: &Subtree) -> Vec<Value> {
        let trace: Value = serde_json::from_str(&render(tree, at(50))).unwrap();
        trace["traceEvents"].as_array().unwrap().clone()
    }

    fn spans(events: &[Value], cat: &str) -> Vec<(u64, u64)> {
        events
            .iter()
            .filter(|e| e["cat"] == cat && e["ph"] == "X")
            .map(|e| {
                let ts = e["ts"].as_u64().unwrap();
                (ts, ts + e["dur"].as_u64().unwrap())
            })
            .collect()
    }

    #[test]
    fn no_control_character_is_written_raw_c1_included() {
        let tree = subtree(SessionId(1), vec![session(1, None, "a\u{9b}31m\u{1b}b")]);
        let text = render(&tree, at(50));
        assert!(
            !text.contains('\u{9b}') && !text.contains('\u{1b}'),
            "{text}"
        );
        assert!(text.contains("\\u009b31m\\u001bb"), "{text}");
        let back: Value = serde_json::from_str(&text).unwrap();
        assert!(back.to_string().contains("a\u{9b}31m"));
    }

    #[test]
    fn a_turn_is_cut_at_each_state_it_crosses() {
        let tree = subtree(SessionId(1), vec![session(1, None, "solo")]);
        let events = events(&tree);
        assert_eq!(
            spans(&events, "state"),
            [
                (0, 10_000),
                (10_000, 20_000),
                (20_000, 30_000),
                (30_000, 40_000)
            ]
        );
        assert_eq!(
            spans(&events, "turn"),
            [(10_000, 20_000), (20_000, 30_000), (30_000, 35_000)]
        );
        let instants: Vec<(&str, u64)> = events
            .iter()
            .filter(|e| e["ph"] == "i")
            .map(|e| (e["name"].as_str().unwrap(), e["ts"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            instants,
            [
                ("cancel", 20_000),
                ("finalized: cancelled", 40_000),
                ("chunk", 18_333),
                ("chunk", 26_666),
            ]
        );
    }

    #[test]
    fn tracks_are_named_by_path_and_ordered_depth_first() {
        let tree = subtree(
            SessionId(2),
            vec![
                session(5, Some(2), "late"),
                session(1, None, "outside"),
                session(3, Some(2), "early"),
                session(2, Some(1), "top"),
                session(4, Some(3), "deep"),
            ],
        );
        let paths: Vec<&str> = tree.sessions.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "top#2",
                "top#2/early#3",
                "top#2/early#3/deep#4",
                "top#2/late#5"
            ]
        );
    }

    #[test]
    fn a_deep_track_is_named_by_its_top_and_last_names_with_the_rest_counted() {
        // A chain of 21: session i + 1 a child of session i.
        let chain: Vec<SessionDetail> = (1..=21u64)
            .map(|i| session(i, (i > 1).then(|| i - 1), "s"))
            .collect();
        let tree = subtree(SessionId(1), chain);
        let paths: Vec<&str> = tree.sessions.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(paths.len(), 21);
        assert_eq!(paths[8], "s#1/s#2/s#3/s#4/s#5/s#6/s#7/s#8/s#9");
        assert_eq!(paths[9], "s#1/…1 more…/s#3/s#4/s#5/s#6/s#7/s#8/s#9/s#10");
        assert_eq!(
            paths[20],
            "s#1/…12 more…/s#14/s#15/s#16/s#17/s#18/s#19/s#20/s#21"
        );
    }
}
