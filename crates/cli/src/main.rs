//! The `settle` binary (placeholder until its issue lands).
fn main() {}
