//! `count = N` on an `[[agent]]` entry: the entry stands for N agents, alike
//! but for their names, so that a file of a few lines can describe a tree of
//! a hundred thousand agents (one `[[agent]]` each would pass the file size
//! limit at about twenty thousand).
//!
//! The agents of an entry named `worker` with `count = 3` are `worker-1`,
//! `worker-2` and `worker-3`, in that order, each with the entry's `parent`,
//! `spawn_after_ms` and turns. The base name itself names no agent: a
//! `parent` must name one of them.

/// The name of agent `i` (from 1) of the counted entry `base`.
pub(crate) fn copy_name(base: &str, i: usize) -> String {
    format!("{base}-{i}")
}

/// The length in characters of the longest name `count` gives agents of
/// `base` (its last one's).
pub(crate) fn longest_name_chars(base: &str, count: usize) -> usize {
    base.chars().count() + 1 + count.to_string().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_numbered_from_one_after_a_dash() {
        assert_eq!(copy_name("worker", 1), "worker-1");
        assert_eq!(copy_name("worker", 100_000), "worker-100000");
        assert_eq!(longest_name_chars("worker", 100_000), "worker-100000".len());
        assert_eq!(longest_name_chars("é", 9), 3);
    }
}
