//! [`Budget`]: what a session and its subtree may spend (turns, tokens,
//! wall time) before the core winds it down with end reason
//! `budget_exhausted`.

use std::fmt;
use std::time::{Duration, Instant};

/// Limits on what a session and every session under it may spend together.
///
/// Set with [`Event::SetBudget`](crate::Event::SetBudget) when the session
/// is registered; children registered under it count against it (they
/// inherit it), and may have tighter budgets of their own. What is spent:
///
/// - turns: each turn started in the subtree; the turn that would go past
///   the limit is refused with
///   [`Error::BudgetExhausted`](crate::Error::BudgetExhausted);
/// - tokens: what the usage reports of its turns say
///   ([`Event::Usage`](crate::Event::Usage)), past the limit;
/// - wall time: from the moment the budget is set.
///
/// Exceeding any limit cancels the subtree at once, descendants first (G1),
/// and finalizes every session of it with end reason `budget_exhausted`.
///
/// ```
/// use std::time::Duration;
/// use settle_core::Budget;
///
/// let budget = Budget::default().turns(20).tokens(200_000).wall_time(Duration::from_secs(600));
/// assert_eq!(budget.max_turns, Some(20));
/// assert!(!budget.is_unlimited());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Budget {
    /// The most turns the subtree may start.
    pub max_turns: Option<u32>,
    /// The most tokens its turns may spend, as their usage reports count them.
    pub max_tokens: Option<u64>,
    /// The longest the subtree may live, from the moment the budget is set.
    pub max_wall: Option<Duration>,
}

impl Budget {
    /// Sets the most turns.
    #[must_use]
    pub fn turns(mut self, max: u32) -> Self {
        self.max_turns = Some(max);
        self
    }

    /// Sets the most tokens.
    #[must_use]
    pub fn tokens(mut self, max: u64) -> Self {
        self.max_tokens = Some(max);
        self
    }

    /// Sets the longest wall time.
    #[must_use]
    pub fn wall_time(mut self, max: Duration) -> Self {
        self.max_wall = Some(max);
        self
    }

    /// Whether it limits nothing.
    pub fn is_unlimited(&self) -> bool {
        *self == Budget::default()
    }
}

/// Which limit of a [`Budget`] ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum BudgetLimit {
    /// The turns.
    Turns,
    /// The tokens.
    Tokens,
    /// The wall time.
    WallTime,
}

impl fmt::Display for BudgetLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BudgetLimit::Turns => "turns",
            BudgetLimit::Tokens => "tokens",
            BudgetLimit::WallTime => "wall time",
        })
    }
}

/// What a budgeted session's subtree has spent.
#[derive(Debug, Clone)]
pub(crate) struct Spent {
    pub limits: Budget,
    pub turns: u32,
    pub tokens: u64,
    /// When the wall time runs out.
    pub deadline: Option<Instant>,
    /// It ran out (once: the subtree is winding down).
    pub exhausted: bool,
}

impl Spent {
    pub fn new(limits: Budget, now: Instant) -> Self {
        Spent {
            limits,
            turns: 0,
            tokens: 0,
            deadline: limits.max_wall.and_then(|wall| now.checked_add(wall)),
            exhausted: false,
        }
    }

    /// Whether one more turn would go past the limit.
    pub fn turns_spent(&self) -> bool {
        self.limits.max_turns.is_some_and(|max| self.turns >= max)
    }

    /// Whether the tokens went past the limit.
    pub fn tokens_spent(&self) -> bool {
        self.limits.max_tokens.is_some_and(|max| self.tokens > max)
    }
}
