//! The `settle` binary (placeholder until its issue lands).

// Used by `settle run`, which is not written yet.
#[allow(dead_code, unused_imports)]
mod scenario;

fn main() {}
