//! End-to-end tests of the runtime, each named after the guarantee it checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod budgets;
mod common;
mod contract;
mod conventions;
mod conversation;
mod embedding;
mod faults;
mod g12_handoff;
mod g1_settle_before_close;
mod g2_g10_handles_and_hooks;
mod g3_sweepers;
mod g4_g5_attach_and_settle;
mod g9_shutdown;
mod locked_file;
mod loopback;
mod seams;
mod tools;
