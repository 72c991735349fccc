use std::fmt;
use std::str::FromStr;

/// The identity of a session, unique within one store.
///
/// The core does not allocate identities: the caller (usually the store, which
/// owns the durable row) picks one and passes it to [`Event::Register`](crate::Event::Register).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct SessionId(pub u64);

impl SessionId {
    /// The raw number, as stored in a database row.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Forward the formatter so widths and alignment apply.
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for SessionId {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(SessionId)
    }
}

impl From<u64> for SessionId {
    fn from(raw: u64) -> Self {
        SessionId(raw)
    }
}

/// What kind of work a [`WorkId`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum WorkKind {
    /// The work of a turn: one model call, streaming from a provider. A
    /// session has at most one turn in flight.
    Turn,
    /// Any other work the session owns (a tool call, a subprocess, a plain
    /// task). It falls under the same cancel, settle and detach rules as a
    /// turn (G1, G5, G6), but has no provider stream and no transcript.
    Task,
}

/// The identity of one work: the turn `no` (or the task `no`) of `session`.
///
/// Every report a driver feeds about a work names it, so a late report from
/// an old work (one that was detached, or whose turn is long over) is a no-op
/// and never touches the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WorkId {
    /// The session that owns the work.
    pub session: SessionId,
    /// A turn or a task.
    pub kind: WorkKind,
    /// The turn number (or task number), from 1, per session and kind.
    pub no: u32,
}

impl WorkId {
    /// Turn `no` of `session`.
    pub const fn turn(session: SessionId, no: u32) -> Self {
        WorkId {
            session,
            kind: WorkKind::Turn,
            no,
        }
    }

    /// Task `no` of `session`.
    pub const fn task(session: SessionId, no: u32) -> Self {
        WorkId {
            session,
            kind: WorkKind::Task,
            no,
        }
    }

    /// The turn number, if this is a turn's work.
    pub const fn turn_no(self) -> Option<u32> {
        match self.kind {
            WorkKind::Turn => Some(self.no),
            WorkKind::Task => None,
        }
    }
}

impl fmt::Display for WorkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            WorkKind::Turn => "turn",
            WorkKind::Task => "task",
        };
        write!(f, "session {} {kind} {}", self.session, self.no)
    }
}
