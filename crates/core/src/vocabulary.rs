//! The words of SPEC §1–4 as types: states, outcomes, end reasons, cancel
//! modes, and the kinds of turn errors and chunks.
//!
//! Each has a stable lowercase spelling ([`as_str`](State::as_str), `Display`,
//! `FromStr`) used in database rows, JSON and the timeline.

use std::fmt;
use std::str::FromStr;

/// A word that is not one of a vocabulary's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{word}` is not a known {kind}; expected one of: {}", expected.trim_end())]
pub struct UnknownWord {
    /// What was given.
    pub word: String,
    /// Which vocabulary it was read as.
    pub kind: &'static str,
    /// The accepted spellings, comma-separated.
    pub expected: &'static str,
}

macro_rules! vocabulary {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(
            feature = "serde",
            derive(serde::Serialize, serde::Deserialize),
            serde(rename_all = "snake_case")
        )]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable lowercase spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownWord;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownWord {
                        word: s.to_owned(),
                        kind: $kind,
                        expected: concat!($($text, " "),+),
                    }),
                }
            }
        }
    };
}

vocabulary! {
    /// The lifecycle state of a session (SPEC §2). A state never moves backwards,
    /// except `running → registered` when a turn ends and the session stays open.
    State, "state" {
        /// Open, no work in flight.
        Registered => "registered",
        /// A work is in flight: a turn's, or a spawned task's.
        Running => "running",
        /// Cancelled; waiting for its work and its descendants to settle.
        Cancelling => "cancelling",
        /// Its work has ended (or was detached); waiting to be finalized.
        Settled => "settled",
        /// The one-shot end has run. Terminal.
        Finalized => "finalized",
    }
}

impl State {
    /// Whether a turn's work may still be writing: `running` or `cancelling`.
    pub const fn is_live(self) -> bool {
        matches!(self, State::Running | State::Cancelling)
    }

    /// Whether the session is active: `registered` or `running`, open and
    /// not winding down. Only an active session starts work, takes children
    /// and can be cancelled.
    pub const fn is_active(self) -> bool {
        matches!(self, State::Registered | State::Running)
    }

    /// Whether the session is still open: neither settled nor finalized.
    pub const fn is_open(self) -> bool {
        matches!(self, State::Registered | State::Running | State::Cancelling)
    }

    /// The one transition table of SPEC §2: whether a session may move from
    /// `self` to `to`. The core asserts it on every transition, and the store
    /// and the tests ask it too.
    ///
    /// | from | to |
    /// |---|---|
    /// | registered | running, cancelling, settled, finalized (a reclaim) |
    /// | running | registered (the turn ended), cancelling, settled |
    /// | cancelling | settled |
    /// | settled | finalized |
    /// | finalized | — |
    pub const fn can_move_to(self, to: State) -> bool {
        matches!(
            (self, to),
            (
                State::Registered,
                State::Running | State::Cancelling | State::Settled | State::Finalized
            ) | (
                State::Running,
                State::Registered | State::Cancelling | State::Settled
            ) | (State::Cancelling, State::Settled)
                | (State::Settled, State::Finalized)
        )
    }

    /// Position in the forward order `registered < running < cancelling <
    /// settled < finalized`, used to check that states never move backwards.
    pub const fn rank(self) -> u8 {
        match self {
            State::Registered => 0,
            State::Running => 1,
            State::Cancelling => 2,
            State::Settled => 3,
            State::Finalized => 4,
        }
    }
}

vocabulary! {
    /// How a turn, or the work of a session, ended.
    Outcome, "outcome" {
        /// The provider stream ended normally.
        Completed => "completed",
        /// The provider reported an error.
        Failed => "failed",
        /// The work stopped because it was cancelled (by itself or by a request).
        Cancelled => "cancelled",
        /// No event arrived within the idle timeout.
        IdleTimeout => "idle_timeout",
        /// The work ignored cancellation past the settle deadline and was abandoned.
        Detached => "detached",
        /// The process died mid-turn; found later by recovery.
        Interrupted => "interrupted",
    }
}

impl Outcome {
    /// Whether a transcript ending in a turn with this outcome is whole, so
    /// memory may be committed from it (G7).
    pub const fn is_complete(self) -> bool {
        matches!(self, Outcome::Completed)
    }

    /// Whether the turn was cut short from outside (cancel, detach, crash).
    pub const fn is_interrupted(self) -> bool {
        matches!(
            self,
            Outcome::Cancelled | Outcome::Detached | Outcome::Interrupted
        )
    }
}

vocabulary! {
    /// Why a session was finalized (SPEC §4).
    EndReason, "end reason" {
        /// The agent finished and its last turn completed.
        Completed => "completed",
        /// The agent finished and its last turn failed or timed out.
        Failed => "failed",
        /// An ancestor finished while this session was still open.
        ParentFinished => "parent_finished",
        /// The session (or an ancestor) was cancelled.
        Cancelled => "cancelled",
        /// A user closed it explicitly.
        UserClose => "user_close",
        /// Idle for longer than the idle TTL.
        IdleReap => "idle_reap",
        /// Least recently active when the live-session cap was exceeded.
        LruEvict => "lru_evict",
        /// Its transport was gone for longer than the orphan grace.
        OrphanReap => "orphan_reap",
        /// Its close-on-disconnect transport dropped.
        TransportClosed => "transport_closed",
        /// The process shut down.
        Shutdown => "shutdown",
        /// Found live after its owning process crashed.
        Recovered => "recovered",
        /// It (or an ancestor) spent its budget of turns, tokens or wall
        /// time ([`Budget`](crate::Budget)).
        BudgetExhausted => "budget_exhausted",
    }
}

impl EndReason {
    /// Whether this reason comes from an automatic reclaim path (SPEC §5),
    /// which must never take a running, cancelling or held session (G3).
    pub const fn is_reclaim(self) -> bool {
        matches!(
            self,
            EndReason::IdleReap
                | EndReason::LruEvict
                | EndReason::OrphanReap
                | EndReason::TransportClosed
                | EndReason::Shutdown
        )
    }
}

vocabulary! {
    /// How hard to ask work to stop.
    CancelMode, "cancel mode" {
        /// Finish the current turn, start no more: within the settle
        /// timeout, as every cancelled work (G5). A turn still streaming
        /// at the settle deadline is detached (outcome `detached`, its
        /// stored chunks kept); to let a long reply finish, await the turn
        /// before cancelling, or give the shutdown a drain (G9).
        Graceful => "graceful",
        /// Stop now: the provider stream is closed.
        Immediate => "immediate",
    }
}

vocabulary! {
    /// What kind of failure ended a turn `failed` (or `idle_timeout`): stored
    /// with the turn beside its message, so `settle show` and scripts can say why.
    TurnErrorKind, "turn error kind" {
        /// The provider answered with a non-success HTTP status.
        HttpStatus => "http_status",
        /// The provider could not be reached (refused, DNS, TLS, reset), or
        /// the connection broke during the reply (its message says which).
        Connect => "connect",
        /// A timeout ran out: headers, first event, idle, or a store bound.
        Timeout => "timeout",
        /// The provider sent something that is not a valid stream event.
        Protocol => "protocol",
        /// The provider reported an error of its own in the stream.
        Provider => "provider",
        /// The provider or the work panicked.
        Panic => "panic",
        /// The reply was cut short by the provider (e.g. `finish_reason:
        /// length`): the transcript is truncated, so memory is not committed (G7).
        Truncated => "truncated",
        /// The store refused or failed a write the turn needed.
        Store => "store",
        /// The turn streamed more chunks or bytes than a turn may (the
        /// caller's limit): it ended at the chunk past it, which was not
        /// stored.
        TooLarge => "too_large",
        /// A task's own code failed: it returned an error it reports as its
        /// outcome (`spawn_with_outcome`), or raised (Python).
        Task => "task",
    }
}

/// Why a turn failed: a kind to sort by and a message a person can act on
/// (for HTTP, the status line and a short excerpt of the body).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TurnError {
    /// What kind of failure.
    pub kind: TurnErrorKind,
    /// What happened, in words.
    pub message: String,
}

impl TurnError {
    /// A turn error of `kind` saying `message`.
    pub fn new(kind: TurnErrorKind, message: impl Into<String>) -> Self {
        TurnError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for TurnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TurnError {}

vocabulary! {
    /// What a chunk of a turn's output carries. Text is the common case; the
    /// others carry a JSON payload so a framework's structured transcript
    /// (tool calls, reasoning, usage) is persisted like text is (G7).
    ChunkKind, "chunk kind" {
        /// A piece of the model's reply text.
        Text => "text",
        /// A piece of the model's reasoning, when the provider exposes it.
        Reasoning => "reasoning",
        /// A tool call (or a piece of one): name and arguments as JSON.
        ToolCall => "tool_call",
        /// Token usage reported by the provider.
        Usage => "usage",
        /// Any other structured event the provider sent, as JSON.
        Data => "data",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_round_trips_through_its_spelling() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>(), Ok(*s));
        }
        for o in Outcome::ALL {
            assert_eq!(o.as_str().parse::<Outcome>(), Ok(*o));
        }
        for r in EndReason::ALL {
            assert_eq!(r.as_str().parse::<EndReason>(), Ok(*r));
        }
        for m in CancelMode::ALL {
            assert_eq!(m.as_str().parse::<CancelMode>(), Ok(*m));
        }
        for k in TurnErrorKind::ALL {
            assert_eq!(k.as_str().parse::<TurnErrorKind>(), Ok(*k));
        }
        for k in ChunkKind::ALL {
            assert_eq!(k.as_str().parse::<ChunkKind>(), Ok(*k));
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_spells_every_word_as_its_stable_spelling() {
        for o in Outcome::ALL {
            let json = serde_json::to_string(o).unwrap();
            assert_eq!(json, format!("\"{}\"", o.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&json).unwrap(), *o);
        }
        for r in EndReason::ALL {
            assert_eq!(serde_json::to_string(r).unwrap(), format!("\"{r}\""));
        }
        for k in TurnErrorKind::ALL {
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{k}\""));
        }
        for k in ChunkKind::ALL {
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{k}\""));
        }
        for s in State::ALL {
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
    }

    #[test]
    fn an_unknown_word_names_the_alternatives() {
        let err = "asleep".parse::<State>().unwrap_err();
        assert!(err.to_string().contains("registered"), "{err}");
        assert!(err.to_string().contains("asleep"), "{err}");
    }

    #[test]
    fn the_transition_table_only_moves_forward_but_for_a_turn_ending() {
        for from in State::ALL {
            for to in State::ALL {
                if from.can_move_to(*to) {
                    let back = to.rank() < from.rank();
                    assert!(
                        !back || (*from, *to) == (State::Running, State::Registered),
                        "{from} -> {to} moves backwards"
                    );
                }
            }
        }
        assert!(!State::Finalized.can_move_to(State::Registered));
        assert!(State::Registered.can_move_to(State::Finalized));
        assert!(!State::Cancelling.can_move_to(State::Finalized));
    }

    #[test]
    fn ranks_follow_the_lifecycle_order() {
        let ranks: Vec<u8> = State::ALL.iter().map(|s| s.rank()).collect();
        assert_eq!(ranks, vec![0, 1, 2, 3, 4]);
    }
}
