//! The answer table: what an input gets for a session that is finalized,
//! forgotten, closing, winding down or was never registered, coded once and
//! applied by [`Core::handle`](crate::Core::handle) before any input is
//! dispatched (the table on [`Event`]).
//!
//! Handlers run only for sessions the table let through, so none of them
//! checks again, and drivers and frontends map the answer to their replies
//! without deciding anything.

use crate::forgotten::Forgotten;
use crate::hash::SessionMap;
use crate::session::Session;
use crate::sessions::Sessions;
use crate::{Error, Event, Handled, SessionId, State, WorkKind};

/// What an input asks of the session it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asks {
    /// To end it, or to let go of it.
    End,
    /// To use it (a hold, a transport, a delegation).
    Use,
    /// To start work of this kind in it.
    Start(WorkKind),
    /// To take a child.
    Parent,
    /// A work's report.
    Report,
}

/// What the core knows of a session id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Found<'a> {
    /// Its record.
    Kept(&'a Session),
    /// It was finalized and its record forgotten.
    Forgotten,
    /// It was never registered here.
    Unknown,
    /// It was handed off to another process (SPEC §12).
    HandedOff,
}

/// The session an input names and what it asks of it; `None` for inputs
/// about no one session (a sweep, a shutdown) and for a registration.
/// A delegation names its delegating side here; its other side is asked
/// the same way by its handler.
pub(crate) fn subject(event: &Event) -> Option<(SessionId, Asks)> {
    let asked = match *event {
        Event::StartTurn { session } => (session, Asks::Start(WorkKind::Turn)),
        Event::StartTask { session } => (session, Asks::Start(WorkKind::Task)),
        Event::StreamAttached { work }
        | Event::StreamClosed { work }
        | Event::StartRefused { work }
        | Event::WorkEnded { work, .. }
        | Event::WorkExited { work }
        | Event::Usage { work, .. } => (work.session, Asks::Report),
        Event::Committed { session } => (session, Asks::Report),
        Event::CancelWork { work } => (work.session, Asks::End),
        Event::AgentFinished { session }
        | Event::Abandoned { session }
        | Event::Cancel { session, .. }
        | Event::CancelTurn { session }
        | Event::CancelDescendants { session }
        | Event::UserClose { session }
        | Event::Release { session, .. }
        | Event::TransportDetached { session }
        | Event::Withdraw { session } => (session, Asks::End),
        Event::Hold { session, .. }
        | Event::TransportAttached { session, .. }
        | Event::SetBudget { session, .. } => (session, Asks::Use),
        Event::Delegate { from, .. } => (from, Asks::Use),
        // A registration is refused first for its own id (taken) and for a
        // shutdown, then by this table for its parent (`Core::register`).
        Event::Register { .. }
        | Event::Sweep(_)
        | Event::BeginShutdown { .. }
        | Event::SkipDrain
        | Event::LeaseLost
        | Event::BeginHandoff { .. }
        | Event::Adopt(_)
        | Event::AdoptTree { .. } => return None,
    };
    Some(asked)
}

/// Whether the handler of `event` applies the table itself, on the one
/// lookup it makes ([`admit`]): the hottest inputs (a work starting, a
/// work's report, an agent finishing, a cancel), so they find their
/// session once.
pub(crate) fn admitted_by_handler(event: &Event) -> bool {
    matches!(
        event,
        Event::StartTurn { .. }
            | Event::StartTask { .. }
            | Event::WorkEnded { .. }
            | Event::WorkExited { .. }
            | Event::AgentFinished { .. }
            | Event::Cancel { .. }
            | Event::UserClose { .. }
    )
}

/// The table applied on a handler's own lookup of `id`: the session's
/// record to go on with, or the table's answer (the same as
/// [`answer`]'s).
pub(crate) fn admit<'a>(
    sessions: &'a mut Sessions,
    forgotten: &Forgotten,
    handed_off: &SessionMap<()>,
    id: SessionId,
    asks: Asks,
    shutting_down: bool,
) -> Result<&'a mut Session, Result<Handled, Error>> {
    match sessions.get_mut(&id) {
        Some(s) => match answer(id, asks, Found::Kept(s), shutting_down) {
            Some(answered) => Err(answered),
            None => Ok(s),
        },
        None => {
            let found = match forgotten.contains(id) {
                true => Found::Forgotten,
                false if handed_off.contains_key(&id) => Found::HandedOff,
                false => Found::Unknown,
            };
            Err(answer(id, asks, found, shutting_down).unwrap_or(Err(Error::UnknownSession(id))))
        }
    }
}

/// The answer for `id` when the table decides it, or `None` when the input
/// goes on to its handler. `shutting_down`: a shutdown has begun (a
/// registration is refused for it before its parent is asked about).
pub(crate) fn answer(
    id: SessionId,
    asks: Asks,
    found: Found<'_>,
    shutting_down: bool,
) -> Option<Result<Handled, Error>> {
    let s = match found {
        Found::Unknown => return Some(Err(Error::UnknownSession(id))),
        // Another process's now: only a report of a work of it (there is
        // none left, a handoff waits for them) is a harmless no-op.
        Found::HandedOff => {
            return Some(match asks {
                Asks::Report => Ok(Handled::NoOp),
                _ => Err(Error::HandedOff(id)),
            })
        }
        Found::Forgotten => return Some(finalized(id, asks)),
        Found::Kept(s) if s.state == State::Finalized => return Some(finalized(id, asks)),
        Found::Kept(s) => s,
    };
    match asks {
        Asks::End | Asks::Use | Asks::Report => None,
        Asks::Start(_) if shutting_down => Some(Err(Error::ShuttingDown)),
        Asks::Start(kind) => match s.intent {
            Some(intent) => Some(Err(Error::Closing {
                session: id,
                reason: intent.reason(s.last_outcome),
            })),
            None if !s.state.is_active() => Some(Err(Error::WrongState {
                session: id,
                state: s.state,
                action: match kind {
                    WorkKind::Turn => "start a turn",
                    WorkKind::Task => "start a task",
                },
            })),
            None => None,
        },
        Asks::Parent if !s.state.is_active() || s.intent.is_some() => {
            Some(Err(Error::ParentNotLive {
                parent: id,
                state: s.state,
                closing: s.intent.is_some(),
            }))
        }
        Asks::Parent => None,
    }
}

/// The one answer a finalized session gets, by what the input asks of it.
/// What the table answers `event` about a session that is finalized, with
/// no core to ask: the answer a finalized session's handle gives once its
/// driver has stopped, the same it gave before (G2, G10). `None` for an
/// input about no one session.
pub fn answer_finalized(event: &Event) -> Option<Result<Handled, Error>> {
    subject(event).map(|(id, asks)| finalized(id, asks))
}

/// What a registration under `parent` gets once `parent` is finalized
/// (the table's row for a parent): for a frontend that answers for a
/// kernel that has stopped, as the core answered before the stop.
pub fn answer_finalized_parent(parent: SessionId) -> Result<Handled, Error> {
    finalized(parent, Asks::Parent)
}

fn finalized(id: SessionId, asks: Asks) -> Result<Handled, Error> {
    match asks {
        // G2: a no-op that says so.
        Asks::End => Ok(Handled::AlreadyFinalized),
        // G10: closed handles fail loudly.
        Asks::Use | Asks::Start(_) | Asks::Parent => Err(Error::SessionClosed(id)),
        // The work is gone with its session.
        Asks::Report => Ok(Handled::NoOp),
    }
}
