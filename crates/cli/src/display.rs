//! Progress of `settle run`: a log of one timestamped line per lifecycle
//! event (chunks included, so a log shows exactly what was persisted) on
//! stdout when stdout is a file or a pipe, and the live view of the agent
//! tree ([`crate::live`]) on whichever of stderr and stdout is a terminal.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use settle_runtime::{LifecycleEvent, Outcome, SessionId, State};
use tokio::sync::broadcast::{self, error::RecvError};

use crate::live::{LiveRow, LiveView, Target};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Print one timestamped line per event on stdout.
    pub log: bool,
    /// Draw the live view there.
    pub live: Option<Target>,
}

impl Mode {
    /// Nothing (`--json`: only the summary is printed).
    pub const QUIET: Mode = Mode {
        log: false,
        live: None,
    };

    /// What suits where stdout and stderr go: the log when stdout is not a
    /// terminal; the live view on stderr when it is a terminal, else on
    /// stdout when that is one.
    pub fn for_terminals(stdout_is_terminal: bool, stderr_is_terminal: bool) -> Mode {
        Mode {
            log: !stdout_is_terminal,
            live: if stderr_is_terminal {
                Some(Target::Stderr)
            } else if stdout_is_terminal {
                Some(Target::Stdout)
            } else {
                None
            },
        }
    }
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

/// How often the live view is laid out again while events arrive.
const FRAME_EVERY: Duration = Duration::from_millis(50);

/// Consumes lifecycle events until `stop` fires, then shows what is left.
/// The live view's last frame stays on the terminal when the log went
/// elsewhere, and is wiped when the summary follows on the same terminal.
pub async fn show(
    mut events: broadcast::Receiver<LifecycleEvent>,
    mode: Mode,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut stopping = false;
    let mut rows: BTreeMap<SessionId, Row> = BTreeMap::new();
    let view = mode.live.map(LiveView::new);
    let mut last_frame = Instant::now() - FRAME_EVERY;
    let mut stale = false;
    let mut tick = tokio::time::interval(FRAME_EVERY * 2);
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
                _ = tick.tick(), if view.is_some() => {
                    if let Some(view) = view.as_ref().filter(|_| stale) {
                        view.draw(&live_rows(&rows));
                        last_frame = Instant::now();
                        stale = false;
                    }
                    continue;
                }
                _ = &mut stop => {
                    stopping = true;
                    continue;
                }
            }
        };
        let event = match received {
            Ok(event) => event,
            Err(RecvError::Lagged(missed)) => {
                if mode.log {
                    outln!(
                        "{}  ... {missed} events not shown (display fell behind)",
                        stamp()
                    );
                }
                continue;
            }
            Err(RecvError::Closed) => break,
        };
        // A withdrawn session is named while its row is still there.
        let withdrawn = match &event {
            LifecycleEvent::Withdrawn { .. } if mode.log => line(&rows, &event),
            _ => None,
        };
        apply(&mut rows, &event);
        if mode.log {
            if let Some(line) = withdrawn.or_else(|| line(&rows, &event)) {
                // Names and messages are what others chose: shown, not obeyed.
                outln!("{}  {}", stamp(), crate::escape::one_line(&line));
            }
        }
        if let Some(view) = &view {
            stale = true;
            if last_frame.elapsed() >= FRAME_EVERY {
                view.draw(&live_rows(&rows));
                last_frame = Instant::now();
                stale = false;
            }
        }
    }
    if let Some(view) = view {
        view.draw(&live_rows(&rows));
        if mode.log {
            view.finish();
        } else {
            view.clear();
        }
    }
}

/// The rows in tree order: each root, then its descendants depth first,
/// children by id.
fn live_rows(rows: &BTreeMap<SessionId, Row>) -> Vec<LiveRow> {
    let mut out = Vec::with_capacity(rows.len());
    let mut stack: Vec<(SessionId, usize)> = rows
        .iter()
        .filter(|(_, r)| r.parent.is_none_or(|p| !rows.contains_key(&p)))
        .map(|(id, _)| (*id, 0))
        .rev()
        .collect();
    let mut children: BTreeMap<SessionId, Vec<SessionId>> = BTreeMap::new();
    for (id, row) in rows {
        if let Some(parent) = row.parent.filter(|p| rows.contains_key(p)) {
            children.entry(parent).or_default().push(*id);
        }
    }
    while let Some((id, depth)) = stack.pop() {
        let Some(row) = rows.get(&id) else { continue };
        out.push(LiveRow {
            id,
            name: row.name.clone(),
            depth,
            state: row.state,
            turns: row.turns,
            chunks: row.chunks,
            outcome: row.outcome,
            end: row.end.clone(),
        });
        if let Some(kids) = children.get(&id) {
            stack.extend(kids.iter().rev().map(|k| (*k, depth + 1)));
        }
    }
    out
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
        // It never came to be: no row of it is shown.
        LifecycleEvent::Withdrawn { session, .. } => {
            rows.remove(session);
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
        // A session's outcome is its last turn's; a task's end is not one.
        LifecycleEvent::WorkEnded {
            session,
            work,
            outcome,
            ..
        } if work.turn_no().is_some() => {
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

/// "turn 2" or "task 1": which work of its session.
fn work_name(work: settle_runtime::WorkId) -> String {
    match work.kind {
        settle_runtime::WorkKind::Turn => format!("turn {}", work.no),
        settle_runtime::WorkKind::Task => format!("task {}", work.no),
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
        LifecycleEvent::Withdrawn { session, error } => format!(
            "{:<24} registration withdrawn, the store did not take it: {error}",
            who(rows, *session)
        ),
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
            chunk,
        } => match chunk.as_text() {
            Some(text) => format!(
                "{:<24} persisted turn {turn} chunk {seq}: {text:?}",
                who(rows, *session)
            ),
            None => format!(
                "{:<24} persisted turn {turn} chunk {seq} ({}): {}",
                who(rows, *session),
                chunk.kind(),
                chunk.payload()
            ),
        },
        LifecycleEvent::WorkEnded {
            session,
            work,
            outcome,
            error,
        } => match error {
            Some(error) => format!(
                "{:<24} {} ended: {outcome}: {error}",
                who(rows, *session),
                work_name(*work)
            ),
            None => format!(
                "{:<24} {} ended: {outcome}",
                who(rows, *session),
                work_name(*work)
            ),
        },
        LifecycleEvent::Detached { session, work } => format!(
            "{:<24} {} ignored cancellation: detached, write access revoked",
            who(rows, *session),
            work_name(*work)
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
        LifecycleEvent::StoreRetrying { session, message } => match session {
            Some(session) => format!("{:<24} store retry: {message}", who(rows, *session)),
            None => format!("store retry: {message}"),
        },
        _ => return None,
    })
}
