//! A session adopted from another process, alone or in its tree (SPEC §12).

use crate::{Holds, Outcome, Scope, SessionId};

/// A session another process released, as [`Event::Adopt`](crate::Event::Adopt)
/// carries it and each member of an [`Event::AdoptTree`](crate::Event::AdoptTree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adoptee {
    /// The session's identity (its row id).
    pub session: SessionId,
    /// Its parent, as the store has it: another member of the tree, a
    /// session this core has, or one that lives elsewhere or is gone.
    pub parent: Option<SessionId>,
    /// Turns it ran before (its next turn is `turns + 1`).
    pub turns: u32,
    /// How its last turn ended.
    pub last_outcome: Option<Outcome>,
    /// The holds it had when it was released (SPEC §5).
    pub holds: Holds,
    /// Whose it is, for the LRU cap.
    pub scope: Scope,
}
