//! Progress of `settle run`: on a terminal, the agent tree redrawn in place;
//! otherwise one timestamped line per lifecycle event (chunks included, so a
//! log shows exactly what was persisted).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use settle_runtime::{LifecycleEvent, Outcome, SessionId, State};
use tokio::sync::broadcast::{self, error::RecvError};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Redraw the tree in place (stdout is a terminal).
    Live,
    /// Timestamped lines.
    Plain,
    /// Nothing (`--json`: only the summary is printed).
    Quiet,
}

#[derive(Debug, Clone)]
struct Row {
    name: String,
    parent: Option<SessionId>,
    state: State,
    turns: u32,
    chunks: u32,
    outcome: Option<Outcome>,
    end: Option<String>,
}

/// Consumes lifecycle events until `stop` fires, then shows what is left.
pub async fn show(
    mut events: broadcast::Receiver<LifecycleEvent>,
    mode: Mode,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut stopping = false;
    let mut rows: BTreeMap<SessionId, Row> = BTreeMap::new();
    let mut drawn = 0usize;
    let mut last_draw = Instant::now() - Duration::from_secs(1);
    loop {
        let received = if stopping {
            match events.try_recv() {
                Ok(event) => Ok(event),
                Err(broadcast::error::TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                Err(_) => break,
            }
        } else {
            tokio::select! {
                received = events.recv() => received,
                _ = &mut stop => {
                    stopping = true;
                    continue;
                }
            }
        };
        let event = match received {
            Ok(event) => event,
            Err(RecvError::Lagged(missed)) => {
                if mode == Mode::Plain {
                    outln!(
                        "{}  ... {missed} events not shown (display fell behind)",
                        stamp()
                    );
                }
                continue;
            }
            Err(RecvError::Closed) => break,
        };
        apply(&mut rows, &event);
        match mode {
            Mode::Quiet => {}
            Mode::Plain => {
                if let Some(line) = line(&rows, &event) {
                    outln!("{}  {line}", stamp());
                }
            }
            Mode::Live => {
                if last_draw.elapsed() >= Duration::from_millis(50) {
                    drawn = draw(&rows, drawn);
                    last_draw = Instant::now();
                }
            }
        }
    }
    if mode == Mode::Live {
        draw(&rows, drawn);
    }
}

fn stamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

fn apply(rows: &mut BTreeMap<SessionId, Row>, event: &LifecycleEvent) {
    match event {
        LifecycleEvent::Registered {
            session,
            name,
            parent,
            ..
        } => {
            rows.insert(
                *session,
                Row {
                    name: name.clone(),
                    parent: *parent,
                    state: State::Registered,
                    turns: 0,
                    chunks: 0,
                    outcome: None,
                    end: None,
                },
            );
        }
        LifecycleEvent::Transition { session, to, .. } => {
            if let Some(row) = rows.get_mut(session) {
                row.state = *to;
                if *to == State::Running {
                    row.turns += 1;
                }
            }
        }
        LifecycleEvent::Chunk { session, .. } => {
            if let Some(row) = rows.get_mut(session) {
                row.chunks += 1;
            }
        }
        LifecycleEvent::TurnEnded {
            session, outcome, ..
        } => {
            if let Some(row) = rows.get_mut(session) {
                row.outcome = Some(*outcome);
            }
        }
        LifecycleEvent::Finalized {
            session, reason, ..
        } => {
            if let Some(row) = rows.get_mut(session) {
                row.state = State::Finalized;
                row.end = Some(reason.to_string());
            }
        }
        _ => {}
    }
}

fn who(rows: &BTreeMap<SessionId, Row>, session: SessionId) -> String {
    match rows.get(&session) {
        Some(row) => format!("{}#{session}", row.name),
        None => format!("#{session}"),
    }
}

fn line(rows: &BTreeMap<SessionId, Row>, event: &LifecycleEvent) -> Option<String> {
    Some(match event {
        LifecycleEvent::Registered {
            session, parent, ..
        } => match parent {
            Some(parent) => format!(
                "{:<24} registered under {}",
                who(rows, *session),
                who(rows, *parent)
            ),
            None => format!("{:<24} registered (root)", who(rows, *session)),
        },
        LifecycleEvent::Transition {
            session,
            from: Some(from),
            to,
            cause,
            ..
        } => format!("{:<24} {from} -> {to} ({cause})", who(rows, *session)),
        LifecycleEvent::Transition { from: None, .. } => return None,
        LifecycleEvent::Chunk {
            session,
            turn,
            seq,
            text,
        } => format!(
            "{:<24} persisted turn {turn} chunk {seq}: {text:?}",
            who(rows, *session)
        ),
        LifecycleEvent::TurnEnded {
            session,
            turn,
            outcome,
            error,
        } => match error {
            Some(error) => format!(
                "{:<24} turn {turn} ended: {outcome}: {error}",
                who(rows, *session)
            ),
            None => format!("{:<24} turn {turn} ended: {outcome}", who(rows, *session)),
        },
        LifecycleEvent::Detached { session, turn } => format!(
            "{:<24} turn {turn} ignored cancellation: detached, write access revoked",
            who(rows, *session)
        ),
        LifecycleEvent::Finalized {
            session,
            reason,
            memory_committed,
        } => format!(
            "{:<24} finalized: {reason}{}",
            who(rows, *session),
            if *memory_committed {
                ", memory committed"
            } else {
                ""
            }
        ),
        LifecycleEvent::LeaseLost { message } => format!("LEASE LOST: {message}"),
        LifecycleEvent::StoreFailed { session, message } => match session {
            Some(session) => format!("{:<24} STORE ERROR: {message}", who(rows, *session)),
            None => format!("STORE ERROR: {message}"),
        },
        _ => return None,
    })
}

/// Draws the tree, moving the cursor up over the previous drawing first.
/// Returns how many lines it drew.
fn draw(rows: &BTreeMap<SessionId, Row>, previous: usize) -> usize {
    let mut out = String::new();
    if previous > 0 {
        out.push_str(&format!("\x1b[{previous}A"));
    }
    let mut lines = 0;
    out.push_str(&format!(
        "\x1b[2K{:<32} {:<11} {:>5} {:>6}  {:<13} {}\n",
        "SESSION", "STATE", "TURNS", "CHUNKS", "OUTCOME", "END"
    ));
    lines += 1;
    let mut stack: Vec<(SessionId, usize)> = rows
        .iter()
        .filter(|(_, r)| r.parent.is_none_or(|p| !rows.contains_key(&p)))
        .map(|(id, _)| (*id, 0))
        .collect();
    stack.reverse();
    while let Some((id, depth)) = stack.pop() {
        let Some(row) = rows.get(&id) else { continue };
        let label = format!("{}{}#{id}", "  ".repeat(depth), row.name);
        out.push_str(&format!(
            "\x1b[2K{label:<32} {:<11} {:>5} {:>6}  {:<13} {}\n",
            row.state.as_str(),
            row.turns,
            row.chunks,
            row.outcome.map_or("-", Outcome::as_str),
            row.end.as_deref().unwrap_or("-"),
        ));
        lines += 1;
        let mut kids: Vec<SessionId> = rows
            .iter()
            .filter(|(_, r)| r.parent == Some(id))
            .map(|(k, _)| *k)
            .collect();
        kids.reverse();
        stack.extend(kids.into_iter().map(|k| (k, depth + 1)));
    }
    let mut stdout = io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
    lines
}
