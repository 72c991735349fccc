//! The core row's workload (`crates/core/benches/support/workload.rs`, its
//! ops unchanged since they were written for the contract of WorkIds) run
//! through whichever `settle-core` this harness is built against, so that
//! today's core and an older one are measured on the same op sequence:
//! `core_then_and_now.sh` builds it twice and compares. Built with the
//! `old_contract` feature, the ops are fed as the contract before WorkIds
//! spelled them (`TurnEnded`/`WorkExited` by session).
//!
//! Prints, per round, how many inputs were applied and how many refused.

use settle_core::{CancelMode, Core, Event, Outcome, Policy, SessionId};
use std::hint::black_box; use std::time::Instant;
#[global_allocator] static A: mimalloc::MiMalloc = mimalloc::MiMalloc;
// The generator of crates/core/benches/support/workload.rs goes here (the
// script copies it in), then:

#[cfg(feature = "old_contract")]
fn event(op: Op) -> Option<Event> {
    let session = SessionId;
    Some(match op {
        Op::Register(id) => register(session(id)),
        Op::Start(id) => Event::StartTurn { session: session(id) },
        Op::End(id, _) => Event::TurnEnded { session: session(id), outcome: Outcome::Completed },
        Op::Finish(id) => Event::AgentFinished { session: session(id) },
        Op::Cancel(id) => Event::Cancel { session: session(id), mode: CancelMode::Immediate },
        Op::Exited(id, _) => Event::WorkExited { session: session(id) },
        Op::Forget(_) => return None,
    })
}
/// A root registration as the core of either side spells it (cores before
/// scopes, and the old contract's, with the `unscoped` feature).
#[cfg(not(any(feature = "unscoped", feature = "old_contract")))]
fn register(session: SessionId) -> Event {
    Event::Register { session, parent: None, scope: settle_core::Scope::SHARED }
}
#[cfg(any(feature = "unscoped", feature = "old_contract"))]
fn register(session: SessionId) -> Event { Event::Register { session, parent: None } }
#[cfg(feature = "old_contract")]
fn policy() -> Policy { Policy { lru_cap: None, ..Policy::default() } }
#[cfg(not(feature = "old_contract"))]
fn event(op: Op) -> Option<Event> {
    use settle_core::WorkId;
    let session = SessionId;
    Some(match op {
        Op::Register(id) => register(session(id)),
        Op::Start(id) => Event::StartTurn { session: session(id) },
        Op::End(id, no) => Event::WorkEnded { work: WorkId::turn(session(id), no), outcome: Outcome::Completed },
        Op::Finish(id) => Event::AgentFinished { session: session(id) },
        Op::Cancel(id) => Event::Cancel { session: session(id), mode: CancelMode::Immediate },
        Op::Exited(id, no) => Event::WorkExited { work: WorkId::turn(session(id), no) },
        Op::Forget(_) => return None,
    })
}
#[cfg(not(feature = "old_contract"))]
fn policy() -> Policy { Policy::default().lru_cap(None) }

#[inline(never)]
fn round(ops: &[Op], now: Instant) -> (usize, usize) {
    let mut core = Core::new(policy());
    let (mut applied, mut other) = (0, 0);
    for op in ops {
        match (event(*op), *op) {
            (Some(e), _) => match black_box(core.handle(now, e)) { Ok(_) => applied += 1, Err(_) => other += 1 },
            (None, Op::Forget(id)) => { black_box(core.forget(SessionId(id))); }
            _ => {}
        }
        while let Some(effect) = core.poll_effect() { black_box(effect); }
    }
    drop(black_box(core));
    (applied, other)
}

fn main() {
    let ops = workload(0x005e_771e, 1024, 200_000);
    let now = Instant::now();
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(11);
    for _ in 0..rounds { let r = round(&ops, now); eprintln!("{r:?}"); }
}
