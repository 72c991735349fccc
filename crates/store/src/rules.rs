//! The lifecycle rules a write must pass, on a session row held in memory:
//! the one place that says which transition, turn start, turn end or finalize
//! a session admits and, when it does not, which refusal names why.
//!
//! [`MemoryStore`](crate::MemoryStore) keeps its rows this way, and a batch
//! ([`SessionStore::apply`](crate::SessionStore::apply)) reads its sessions'
//! rows into memory, runs its writes through these rules in order, and then
//! writes the outcome back with one conditional UPDATE per row, so both
//! implementations decide every lifecycle write here; the shared test suite
//! holds them to the same answers.

use settle_core::{EndReason, Outcome, SessionId, State};

use crate::error::StoreError;

/// Whether a transition write may move a session from `from` to `to`: a
/// move of the lifecycle's one table ([`State::can_move_to`]), but for the
/// moves to `finalized`, which only the finalize latch makes.
pub(crate) fn allowed(from: State, to: State) -> bool {
    to != State::Finalized && from.can_move_to(to)
}

/// The mutable columns of a session row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    pub(crate) state: State,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) end_reason: Option<EndReason>,
    pub(crate) open_turn: Option<u32>,
    pub(crate) closing: Option<EndReason>,
    pub(crate) finalized_at: Option<i64>,
}

impl Live {
    /// A session just registered.
    pub(crate) fn registered() -> Self {
        Live {
            state: State::Registered,
            outcome: None,
            end_reason: None,
            open_turn: None,
            closing: None,
            finalized_at: None,
        }
    }
}

/// What is known of one turn of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnSeen {
    /// No such turn.
    Missing,
    /// Started and not ended.
    Open,
    /// Ended.
    Ended,
}

/// What spending the latch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    /// The state it left.
    pub(crate) from: State,
    /// The turn that was still open and is now `interrupted`.
    pub(crate) interrupted: Option<u32>,
}

impl Live {
    /// Move from `from` to `to`, only if the session is in `from` now.
    pub(crate) fn transition(
        &mut self,
        id: SessionId,
        from: State,
        to: State,
    ) -> Result<(), StoreError> {
        if !allowed(from, to) {
            return Err(StoreError::InvalidTransition {
                session: id,
                from,
                to,
            });
        }
        if self.state != from {
            return Err(if self.state == State::Finalized {
                StoreError::SessionClosed(id)
            } else {
                StoreError::StateMismatch {
                    session: id,
                    expected: from,
                    found: self.state,
                }
            });
        }
        self.state = to;
        Ok(())
    }

    /// Open turn `no`: only while registered or running, not closing, with no
    /// other turn open, and a number not used before.
    pub(crate) fn start_turn(
        &mut self,
        id: SessionId,
        no: u32,
        seen: TurnSeen,
    ) -> Result<(), StoreError> {
        if self.state == State::Finalized {
            return Err(StoreError::SessionClosed(id));
        }
        if let Some(reason) = self.closing {
            return Err(StoreError::SessionClosing {
                session: id,
                reason,
            });
        }
        if let Some(open) = self.open_turn {
            return Err(StoreError::TurnInFlight { session: id, open });
        }
        if !self.state.is_active() {
            return Err(StoreError::NotAcceptingTurns {
                session: id,
                state: self.state,
            });
        }
        if seen != TurnSeen::Missing {
            return Err(StoreError::TurnExists {
                session: id,
                turn: no,
            });
        }
        self.open_turn = Some(no);
        Ok(())
    }

    /// End turn `no`, which must be open, of a session not finalized, with
    /// `outcome`.
    pub(crate) fn end_turn(
        &mut self,
        id: SessionId,
        no: u32,
        outcome: Outcome,
        seen: TurnSeen,
    ) -> Result<(), StoreError> {
        if seen != TurnSeen::Open || self.state == State::Finalized {
            return Err(turn_refusal(self, id, no, seen));
        }
        if self.open_turn == Some(no) {
            self.open_turn = None;
            self.outcome = Some(outcome);
        }
        Ok(())
    }

    /// Spend the finalize latch: `None` when it was already spent. The
    /// session's outcome becomes `outcome`, else `interrupted` if a turn was
    /// still open, else stays its last turn's.
    pub(crate) fn spend(
        &mut self,
        reason: EndReason,
        outcome: Option<Outcome>,
        at: i64,
    ) -> Option<Spent> {
        if self.state == State::Finalized {
            return None;
        }
        let spent = Spent {
            from: self.state,
            interrupted: self.open_turn,
        };
        self.outcome = outcome.or(if self.open_turn.is_some() {
            Some(Outcome::Interrupted)
        } else {
            self.outcome
        });
        self.state = State::Finalized;
        self.end_reason = Some(reason);
        self.finalized_at = Some(at);
        self.open_turn = None;
        Some(spent)
    }
}

/// Why a write to turn `no` of a session in `live` is refused.
pub(crate) fn turn_refusal(live: &Live, id: SessionId, no: u32, seen: TurnSeen) -> StoreError {
    if live.state == State::Finalized {
        return StoreError::SessionClosed(id);
    }
    match seen {
        TurnSeen::Missing => StoreError::UnknownTurn {
            session: id,
            turn: no,
        },
        TurnSeen::Open | TurnSeen::Ended => StoreError::TurnClosed {
            session: id,
            turn: no,
        },
    }
}
