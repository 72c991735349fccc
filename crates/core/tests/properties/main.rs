//! The guarantees of SPEC §3 as properties of random input sequences, split
//! the way firezone's `tunnel/src/tests/` is:
//!
//! - [`reference`]: a reference model written from SPEC §2–5 and the
//!   contract docs (plain structs, linear scans, a fixpoint) that predicts
//!   every answer, every order, every deadline and every session view;
//! - [`sut`]: the real [`settle_core::Core`], driven as a driver drives it on
//!   a shared fake clock (`Tick { millis }` wakes it only when it is due);
//! - [`strategies`]: the generators, every input included, with time, late
//!   reports from old works, finalized and forgotten sessions;
//! - [`assertions`]: one function per guarantee, checked after every step.
//!
//! `SETTLE_PROPTEST_CASES` sets the number of cases (default 1,000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod assertions;
mod reference;
mod strategies;
mod sut;

use proptest::test_runner::Config;
use proptest_state_machine::prop_state_machine;

use sut::CoreUnderTest;

fn cases() -> u32 {
    std::env::var("SETTLE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: cases(),
        // The model is replayed at every shrink step; keep failures readable.
        max_shrink_iters: 4096,
        failure_persistence: None,
        .. Config::default()
    })]

    #[test]
    fn the_core_keeps_every_guarantee_on_random_input_sequences(sequential 1..80 => CoreUnderTest);
}
