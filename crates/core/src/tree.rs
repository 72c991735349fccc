//! Walks of the agent tree without recursion, so trees of any depth work.

use crate::sessions::Sessions;
use crate::{SessionId, State};

/// The not-finalized descendants of `root` (excluding `root`), every session
/// listed after all of its own descendants: cancel and finalize in this order
/// and children always go before parents (G1).
pub(crate) fn open_descendants_bottom_up(sessions: &Sessions, root: SessionId) -> Vec<SessionId> {
    let start = sessions
        .get(&root)
        .map(|s| s.children.clone())
        .unwrap_or_default();
    bottom_up(sessions, start)
}

/// Every not-finalized session of the forest, each after all its descendants.
pub(crate) fn open_sessions_bottom_up(sessions: &Sessions) -> Vec<SessionId> {
    let mut roots: Vec<SessionId> = sessions
        .iter()
        .filter(|(_, s)| s.parent.is_none_or(|p| !sessions.contains_key(&p)))
        .map(|(id, _)| id)
        .collect();
    // Deterministic order for reproducible effect sequences.
    roots.sort_unstable_by(|a, b| b.cmp(a));
    bottom_up(sessions, roots)
}

/// A pre-order walk from `stack` that skips finalized subtrees (a finalized
/// session has only finalized descendants, G1), reversed: every session then
/// comes after all of its descendants.
fn bottom_up(sessions: &Sessions, mut stack: Vec<SessionId>) -> Vec<SessionId> {
    let mut order = Vec::new();
    while let Some(id) = stack.pop() {
        let Some(s) = sessions.get(&id) else { continue };
        if s.state == State::Finalized {
            continue;
        }
        order.push(id);
        stack.extend(s.children.iter().copied());
    }
    order.reverse();
    order
}
