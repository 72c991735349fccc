use std::time::SystemTime;

use settle_core::{EndReason, Outcome, SessionId, State, TurnError, WorkId};

/// What happened in the runtime, for progress displays and logs.
///
/// Subscribe with [`Kernel::subscribe`](crate::Kernel::subscribe). A
/// subscriber that falls far behind misses events (it is told how many); the
/// durable record in the store is always complete.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(tag = "event", rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum LifecycleEvent {
    /// A session was registered.
    Registered {
        /// The new session.
        session: SessionId,
        /// Its name.
        name: String,
        /// Its parent.
        parent: Option<SessionId>,
        /// When.
        at: SystemTime,
    },
    /// A registration announced by [`Registered`](Self::Registered) was
    /// withdrawn: the store did not take the session's row within the store
    /// timeout, so its caller was refused, and the session never came to be
    /// (no row of it is left live, and no other event of it follows).
    Withdrawn {
        /// The session that was announced.
        session: SessionId,
        /// The store's cause, as the caller was told it.
        error: String,
    },
    /// A session changed state.
    Transition {
        /// The session.
        session: SessionId,
        /// From (`None` on registration).
        from: Option<State>,
        /// To.
        to: State,
        /// Why, in words.
        cause: String,
        /// When.
        at: SystemTime,
    },
    /// A chunk was persisted (acknowledged by the store, G7).
    Chunk {
        /// The session.
        session: SessionId,
        /// The turn, from 1.
        turn: u32,
        /// The chunk's position in the turn, from 0.
        seq: u32,
        /// The chunk: text, or a tool call, reasoning or usage as JSON.
        chunk: settle_stream::Chunk,
    },
    /// A work ended: a turn's, or a task's (its [`WorkId`] says which).
    WorkEnded {
        /// The session.
        session: SessionId,
        /// The work: the turn (or the task) and its number.
        work: WorkId,
        /// How.
        outcome: Outcome,
        /// Why, when it failed or timed out.
        error: Option<TurnError>,
    },
    /// A turn's provider failed before its first chunk and its stream is
    /// opened again (its [`RetryPolicy`](settle_stream::RetryPolicy)): the
    /// record of each retry on the turn.
    TurnRetried {
        /// The session.
        session: SessionId,
        /// The turn.
        work: WorkId,
        /// Which retry, from 1.
        attempt: u32,
        /// The wait before it.
        delay: std::time::Duration,
        /// Whether the fallback provider is tried.
        fallback: bool,
        /// Why the opening failed.
        error: TurnError,
    },
    /// A work ignored cancellation past its settle deadline and was detached.
    Detached {
        /// The session.
        session: SessionId,
        /// The work: the turn (or the task) and its number.
        work: WorkId,
    },
    /// A session's finalize plan ran.
    Finalized {
        /// The session.
        session: SessionId,
        /// Why it ended.
        reason: EndReason,
        /// Whether memory was committed.
        memory_committed: bool,
    },
    /// A session was handed off (SPEC §12): released in the store for another
    /// process to adopt (`released`), or, when the store failed, left to a
    /// live peer once this process's lease expires.
    HandedOff {
        /// The session.
        session: SessionId,
        /// Whether the release was committed.
        released: bool,
    },
    /// This process could not renew its lease on its sessions in time (G8):
    /// it starts nothing more, cancels its works and writes nothing more as
    /// their owner; another process recovers them.
    LeaseLost {
        /// What the renewal said.
        message: String,
    },
    /// A store write failed; the runtime carried on (G7 still holds for
    /// everything acknowledged).
    StoreFailed {
        /// The session, if the write was for one.
        session: Option<SessionId>,
        /// What failed.
        message: String,
    },
    /// A store write failed in a way that may heal (the database locked,
    /// full, unreachable or slow): it is tried again, and the session's
    /// later writes wait behind it, until the store takes it; a shutdown
    /// whose budget runs out first leaves the session for recovery (and a
    /// `StoreFailed` says so).
    StoreRetrying {
        /// The session the write is for.
        session: Option<SessionId>,
        /// What failed, and why.
        message: String,
    },
}

impl LifecycleEvent {
    /// The session the event is about, if it is about one.
    #[must_use]
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Self::Registered { session, .. }
            | Self::Withdrawn { session, .. }
            | Self::Transition { session, .. }
            | Self::Chunk { session, .. }
            | Self::WorkEnded { session, .. }
            | Self::TurnRetried { session, .. }
            | Self::Detached { session, .. }
            | Self::Finalized { session, .. }
            | Self::HandedOff { session, .. } => Some(*session),
            Self::StoreFailed { session, .. } | Self::StoreRetrying { session, .. } => *session,
            Self::LeaseLost { .. } => None,
        }
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_tagged_with_its_kind() {
        let event = LifecycleEvent::WorkEnded {
            session: SessionId(7),
            work: WorkId::turn(SessionId(7), 1),
            outcome: Outcome::Failed,
            error: Some(TurnError::new(
                settle_core::TurnErrorKind::HttpStatus,
                "HTTP 404 Not Found",
            )),
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["event"], "work_ended");
        assert_eq!(json["work"]["kind"], "turn");
        assert_eq!(json["outcome"], "failed");
        assert_eq!(json["error"]["kind"], "http_status");
        let back: LifecycleEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
}
