//! Criterion benches of the core (filled in below).
fn main() {}
