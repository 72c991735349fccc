//! Which sessions `settle sessions` lists, and how: the store selects them
//! (newest first, only those created within `--since`, in `--state`, at
//! most `--limit`: a [`SessionFilter`]); here they are laid out flat or, with
//! `--tree`, each under its parent.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use settle_cli::listing::{self, Filter};
//!
//! let filter = Filter { since: Some(Duration::from_secs(3600)), limit: Some(20), ..Filter::default() };
//! let asked = filter.to_store(SystemTime::now());
//! assert_eq!(asked.limit, Some(20));
//! assert!(listing::tree(Vec::new()).is_empty());
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use settle_runtime::{SessionId, State};
use settle_store::{SessionFilter, SessionRow};

/// What `settle sessions` was asked to list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only sessions in this state.
    pub state: Option<State>,
    /// Only sessions created at most this long ago.
    pub since: Option<Duration>,
    /// At most this many sessions, the newest.
    pub limit: Option<usize>,
}

impl Filter {
    /// The store's filter for this ask at `now`: newest first, `since`
    /// counted back from `now` (an age reaching back before the clock's
    /// epoch keeps every session).
    pub fn to_store(&self, now: SystemTime) -> SessionFilter {
        let mut filter = SessionFilter::all().in_state_opt(self.state);
        if let Some(oldest) = self.since.and_then(|since| now.checked_sub(since)) {
            filter = filter.since(oldest);
        }
        if let Some(limit) = self.limit {
            filter = filter.limit(limit);
        }
        filter
    }
}

/// One listed session and how deep it sits in the listed tree (0 for a
/// session whose parent is not listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The session.
    pub row: SessionRow,
    /// Its depth under the listed sessions.
    pub depth: usize,
}

/// `rows` (newest first) as they are: every one at depth 0.
pub fn flat(rows: Vec<SessionRow>) -> Vec<Listed> {
    rows.into_iter()
        .map(|row| Listed { row, depth: 0 })
        .collect()
}

/// `rows` (newest first) arranged as a tree: each top session (one whose
/// parent is not among `rows`) in the order given, followed by its
/// descendants, depth first, children in the order they were created.
/// Sessions whose parents loop (a store edited by hand: no kernel writes
/// one) have no top: what is left is listed from its newest session on, so
/// that every row is listed once.
pub fn tree(rows: Vec<SessionRow>) -> Vec<Listed> {
    let ids: HashSet<SessionId> = rows.iter().map(|r| r.id).collect();
    let mut children: BTreeMap<SessionId, Vec<SessionRow>> = BTreeMap::new();
    let mut tops = Vec::new();
    for row in rows {
        match row.parent.filter(|p| ids.contains(p)) {
            Some(parent) => children.entry(parent).or_default().push(row),
            None => tops.push(row),
        }
    }
    for kids in children.values_mut() {
        kids.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    }
    let mut listed = Vec::with_capacity(ids.len());
    let mut seen: HashSet<SessionId> = HashSet::with_capacity(ids.len());
    for top in tops {
        walk(top, &mut children, &mut seen, &mut listed);
    }
    // What no top reached sits on a loop of parents, or under one: each
    // part is listed from its newest session not listed yet.
    let mut rest: Vec<(SystemTime, SessionId)> = children
        .values()
        .flatten()
        .map(|r| (r.created_at, r.id))
        .collect();
    rest.sort_unstable_by(|a, b| b.cmp(a));
    for (_, id) in rest {
        if seen.contains(&id) {
            continue;
        }
        let top = children.values_mut().find_map(|kids| {
            let at = kids.iter().position(|r| r.id == id)?;
            Some(kids.remove(at))
        });
        if let Some(top) = top {
            walk(top, &mut children, &mut seen, &mut listed);
        }
    }
    listed
}

/// Lists `top` and its descendants depth first, each once.
fn walk(
    top: SessionRow,
    children: &mut BTreeMap<SessionId, Vec<SessionRow>>,
    seen: &mut HashSet<SessionId>,
    listed: &mut Vec<Listed>,
) {
    let mut stack = vec![(top, 0)];
    while let Some((row, depth)) = stack.pop() {
        if !seen.insert(row.id) {
            continue;
        }
        if let Some(kids) = children.remove(&row.id) {
            stack.extend(kids.into_iter().rev().map(|k| (k, depth + 1)));
        }
        listed.push(Listed { row, depth });
    }
}

/// A session met twice on the way down from a top: its parents loop back
/// to it (a store edited by hand: no kernel writes one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParentsLoop {
    /// The session met again.
    pub session: SessionId,
    /// The parent it was met under the second time.
    pub parent: SessionId,
}

/// Every descendant of `top` among `rows`, each found under its parent
/// (children in the order of `rows`); a [`ParentsLoop`] when a session is
/// met twice, with what was found before it.
fn walk_down(rows: &[SessionRow], top: SessionId) -> (Vec<SessionId>, Option<ParentsLoop>) {
    let mut children: HashMap<SessionId, Vec<SessionId>> = HashMap::new();
    for row in rows {
        if let Some(parent) = row.parent {
            children.entry(parent).or_default().push(row.id);
        }
    }
    let mut found = Vec::new();
    let mut seen = HashSet::from([top]);
    let mut frontier = vec![top];
    while let Some(parent) = frontier.pop() {
        for &child in children.get(&parent).into_iter().flatten() {
            if !seen.insert(child) {
                return (
                    found,
                    Some(ParentsLoop {
                        session: child,
                        parent,
                    }),
                );
            }
            found.push(child);
            frontier.push(child);
        }
    }
    (found, None)
}

/// Every descendant of `top` among `rows` (`settle show --trace`); refused
/// when the parents loop.
///
/// # Errors
/// [`ParentsLoop`] when a session is met twice.
pub fn descendants(rows: &[SessionRow], top: SessionId) -> Result<Vec<SessionId>, ParentsLoop> {
    match walk_down(rows, top) {
        (found, None) => Ok(found),
        (_, Some(looped)) => Err(looped),
    }
}

/// The rows of `rows` in the tree under `root` (`root` included), in the
/// order given: what one `settle run` registered, whose agents all descend
/// from its root. A loop of parents ends the walk.
pub fn subtree(rows: Vec<SessionRow>, root: SessionId) -> Vec<SessionRow> {
    let (found, _) = walk_down(&rows, root);
    let mut under: HashSet<SessionId> = found.into_iter().collect();
    under.insert(root);
    rows.into_iter().filter(|r| under.contains(&r.id)).collect()
}

/// How many levels a name in a tree is indented (two spaces each) before
/// its depth is written as a number instead.
pub const INDENT_LEVELS: usize = 16;

/// `name` as a tree lists it `depth` levels down: indented two spaces a
/// level, and past [`INDENT_LEVELS`] levels, indented that far and led by
/// its depth (`[depth 40] name`). A table is as wide as its widest name, so
/// an indentation that grew without end would make a chain of thousands of
/// sessions print every line thousands of spaces wide.
pub fn indented(name: &str, depth: usize) -> String {
    let pad = "  ".repeat(depth.min(INDENT_LEVELS));
    if depth > INDENT_LEVELS {
        format!("{pad}[depth {depth}] {name}")
    } else {
        format!("{pad}{name}")
    }
}

/// How long ago `at` was, in the largest whole unit: `12s ago`, `5m ago`,
/// `3h ago`, `4d ago` (a time ahead of `now` reads `0s ago`).
pub fn age(at: SystemTime, now: SystemTime) -> String {
    let secs = now.duration_since(at).unwrap_or_default().as_secs();
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..172_800 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::from_secs(1_800_000_000);

    fn row(id: u64, parent: Option<u64>, created: u64, state: State) -> SessionRow {
        SessionRow {
            id: SessionId(id),
            name: format!("s{id}"),
            parent: parent.map(SessionId),
            state,
            outcome: None,
            end_reason: None,
            turns: 0,
            chunks: 0,
            created_at: SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(created),
            finalized_at: None,
            resumed_from: None,
            owner: None,
        }
    }

    fn now(at: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(at)
    }

    /// Two trees, newest first, as the store lists them.
    fn sample() -> Vec<SessionRow> {
        vec![
            row(6, Some(5), 110, State::Running),
            row(5, None, 100, State::Registered),
            row(4, Some(1), 30, State::Running),
            row(3, Some(2), 20, State::Running),
            row(2, Some(1), 10, State::Finalized),
            row(1, None, 0, State::Finalized),
        ]
    }

    #[test]
    fn the_ask_goes_to_the_store_newest_first() {
        let asked = Filter {
            state: Some(State::Running),
            since: Some(Duration::from_secs(175)),
            limit: Some(2),
        }
        .to_store(now(200));
        assert_eq!(asked.state, Some(State::Running));
        assert_eq!(asked.created_since, Some(now(25)));
        assert_eq!(asked.limit, Some(2));
        assert_eq!(asked.order, settle_store::ListOrder::NewestFirst);
        assert_eq!(Filter::default().to_store(now(200)), SessionFilter::all());
        let flat = flat(sample());
        assert!(flat.iter().all(|l| l.depth == 0) && flat.len() == 6);
        // An age longer than the clock goes back keeps everything.
        let forever = Filter {
            since: Some(Duration::MAX),
            ..Filter::default()
        };
        assert_eq!(forever.to_store(now(0)).created_since, None);
    }

    #[test]
    fn a_tree_puts_children_under_their_parent_in_creation_order() {
        let listed = tree(sample());
        let shape: Vec<(u64, usize)> = listed.iter().map(|l| (l.row.id.get(), l.depth)).collect();
        assert_eq!(shape, [(5, 0), (6, 1), (1, 0), (2, 1), (3, 2), (4, 1)]);
    }

    #[test]
    fn a_session_whose_parent_is_not_listed_is_a_top() {
        // The newest three.
        let mut limited = sample();
        limited.truncate(3);
        let listed = tree(limited);
        let shape: Vec<(u64, usize)> = listed.iter().map(|l| (l.row.id.get(), l.depth)).collect();
        assert_eq!(shape, [(5, 0), (6, 1), (4, 0)]);
    }

    #[test]
    fn sessions_whose_parents_loop_are_each_listed_once() {
        // 7 -> 8 -> 9 -> 7, and 10 under 8; 5 and 6 as in the sample.
        let mut rows = vec![
            row(10, Some(8), 140, State::Running),
            row(9, Some(8), 130, State::Running),
            row(8, Some(7), 120, State::Running),
            row(7, Some(9), 115, State::Running),
        ];
        rows.extend(sample());
        let listed = tree(rows);
        let shape: Vec<(u64, usize)> = listed.iter().map(|l| (l.row.id.get(), l.depth)).collect();
        assert_eq!(
            shape,
            [
                (5, 0),
                (6, 1),
                (1, 0),
                (2, 1),
                (3, 2),
                (4, 1),
                (10, 0),
                (9, 0),
                (7, 1),
                (8, 2),
            ]
        );
    }

    #[test]
    fn a_name_deep_in_a_tree_is_indented_at_most_so_far_and_told_its_depth() {
        assert_eq!(indented("a", 0), "a");
        assert_eq!(indented("a", 2), "    a");
        assert_eq!(
            indented("a", INDENT_LEVELS),
            format!("{}a", " ".repeat(2 * INDENT_LEVELS))
        );
        let deep = indented("a", 10_000);
        assert_eq!(
            deep,
            format!("{}[depth 10000] a", " ".repeat(2 * INDENT_LEVELS))
        );
    }

    #[test]
    fn a_subtree_is_its_root_and_every_descendant_in_the_order_given() {
        let ids = |rows: Vec<SessionRow>| -> Vec<u64> { rows.iter().map(|r| r.id.get()).collect() };
        assert_eq!(ids(subtree(sample(), SessionId(1))), [4, 3, 2, 1]);
        assert_eq!(ids(subtree(sample(), SessionId(2))), [3, 2]);
        assert_eq!(ids(subtree(sample(), SessionId(6))), [6]);
        assert!(subtree(sample(), SessionId(99)).is_empty());
        // A loop of parents ends the walk.
        let looped = vec![
            row(8, Some(7), 1, State::Running),
            row(7, Some(8), 0, State::Running),
        ];
        assert_eq!(ids(subtree(looped, SessionId(7))), [8, 7]);
    }

    #[test]
    fn ages_in_the_largest_whole_unit() {
        assert_eq!(age(now(0), now(59)), "59s ago");
        assert_eq!(age(now(0), now(60)), "1m ago");
        assert_eq!(age(now(0), now(3 * 3600 + 5)), "3h ago");
        assert_eq!(age(now(0), now(50 * 3600)), "2d ago");
        assert_eq!(age(now(10), now(0)), "0s ago");
    }
}
