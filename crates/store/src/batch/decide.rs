//! Step 2 of a batch: decide, in memory and in batch order, what each write
//! does, by the lifecycle's rules.

use std::time::SystemTime;

use settle_core::{Cause, Outcome, SessionId, State, TurnError};

use super::{
    Applied, Decided, HashMap, LifecycleWrite, Registration, Sim, TimelineEntry, TurnEnd,
    TurnStart, Whose,
};
use crate::error::StoreError;
use crate::latch::{FinalizeReport, FinalizeRequest, Finalized, TimelineStep};
use crate::lease::OwnerId;
use crate::rules::{allowed, TurnSeen};
use crate::session::NewSession;
use crate::time::{json_text, sid, to_millis};

pub(super) fn decide<'b>(
    batch: &'b [LifecycleWrite],
    skip: &[bool],
    sessions: &mut HashMap<i64, Sim>,
    owners: &HashMap<i64, bool>,
    turns: &mut HashMap<(i64, u32), TurnSeen>,
    writer: Option<(OwnerId, i64)>,
) -> Result<Decided<'b>, StoreError> {
    let mut d = Decided {
        results: Vec::with_capacity(batch.len()),
        ..Decided::default()
    };
    for (item, write) in batch.iter().enumerate() {
        // Answered already, by the set-wise latch.
        if skip.get(item) == Some(&true) {
            d.results.push(None);
            continue;
        }
        let result = match write {
            LifecycleWrite::Register(new) => register(&mut d, item, new, sessions, owners),
            LifecycleWrite::Transition {
                session,
                from,
                to,
                cause,
                at,
            } => Some(if allowed(*from, *to) {
                lookup(sessions, owners, writer, *session).and_then(|(raw, sim)| {
                    let step = TimelineStep {
                        from: *from,
                        to: *to,
                        cause: *cause,
                        at: *at,
                    };
                    transition(&mut d, *session, raw, sim, &step).map(|()| Applied::Done)
                })
            } else {
                Err(StoreError::InvalidTransition {
                    session: *session,
                    from: *from,
                    to: *to,
                })
            }),
            LifecycleWrite::StartTurn {
                session,
                no,
                input,
                at,
            } => Some(
                lookup(sessions, owners, writer, *session).and_then(|(raw, sim)| {
                    let seen = seen(turns, sim, raw, *no);
                    sim.live.start_turn(*session, *no, seen)?;
                    sim.changed = true;
                    turns.insert((raw, *no), TurnSeen::Open);
                    d.turn_starts.push(TurnStart {
                        session: raw,
                        no: i64::from(*no),
                        at: to_millis(*at),
                        input: input.as_ref().map(|i| json_text(&i.messages)),
                        input_from: input.as_ref().and_then(|i| i.continues).map(i64::from),
                    });
                    Ok(Applied::Done)
                }),
            ),
            LifecycleWrite::EndTurn {
                session,
                no,
                outcome,
                error,
                at,
            } => Some(
                lookup(sessions, owners, writer, *session).and_then(|(raw, sim)| {
                    let end = (*no, *outcome, error.as_ref(), *at);
                    end_turn(&mut d, turns, *session, raw, sim, end).map(|()| Applied::Done)
                }),
            ),
            LifecycleWrite::Finalize { session, plan } => {
                let at = to_millis(plan.at);
                Some(
                    lookup(sessions, owners, writer, *session).map(|(raw, sim)| {
                        if sim.live.state == State::Finalized {
                            return Applied::Finalized(Finalized::AlreadyFinalized);
                        }
                        // What it carries first, each as its own write would be.
                        let (refused, ended) = carried(&mut d, turns, *session, raw, sim, plan);
                        let Some(spent) = sim.live.spend(plan.reason, plan.outcome, at) else {
                            return Applied::Finalized(Finalized::AlreadyFinalized);
                        };
                        sim.changed = true;
                        // Its turn's end, said by the row alone, is not written
                        // on its own (it was the last turn end pushed).
                        let said = plan.turn_end.as_ref().is_some_and(|end| {
                            super::ends_with_its_session(end, plan, sim.live.outcome)
                        });
                        if ended && said {
                            d.turn_ends.pop();
                        }
                        if let Some(no) = spent.interrupted {
                            // Close the turn still open, so its work can write no more.
                            turns.insert((raw, no), TurnSeen::Ended);
                            d.turn_ends.push(TurnEnd {
                                session: raw,
                                no: i64::from(no),
                                at,
                                outcome: Outcome::Interrupted.as_str(),
                                error_kind: None,
                                error_message: None,
                            });
                        }
                        let cause = d.cause(Cause::Finalized(plan.reason));
                        d.timeline.push(TimelineEntry {
                            whose: Whose::Existing(raw),
                            at,
                            from: Some(spent.from),
                            to: State::Finalized,
                            cause,
                        });
                        d.finalized.push((item, *session, plan.commit_memory, at));
                        Applied::Finalized(Finalized::Won(FinalizeReport {
                            interrupted_turn: spent.interrupted,
                            refused,
                            ..FinalizeReport::default()
                        }))
                    }),
                )
            }
        };
        d.results.push(result);
    }
    Ok(d)
}

/// Moves the session (`id`, database id `raw`) as `step` says, on its
/// timeline too: what a transition write does.
fn transition(
    d: &mut Decided<'_>,
    id: SessionId,
    raw: i64,
    sim: &mut Sim,
    step: &TimelineStep,
) -> Result<(), StoreError> {
    sim.live.transition(id, step.from, step.to)?;
    sim.changed = true;
    let cause = d.cause(step.cause);
    d.timeline.push(TimelineEntry {
        whose: Whose::Existing(raw),
        at: to_millis(step.at),
        from: Some(step.from),
        to: step.to,
        cause,
    });
    Ok(())
}

/// A turn's end as a write gives it: its number, outcome, error and time.
type Ending<'b> = (u32, Outcome, Option<&'b TurnError>, SystemTime);

/// Ends a turn of the session (`id`, database id `raw`): what a turn's end
/// write does.
fn end_turn<'b>(
    d: &mut Decided<'b>,
    turns: &mut HashMap<(i64, u32), TurnSeen>,
    id: SessionId,
    raw: i64,
    sim: &mut Sim,
    (no, outcome, error, at): Ending<'b>,
) -> Result<(), StoreError> {
    let seen = seen(turns, sim, raw, no);
    sim.live.end_turn(id, no, outcome, seen)?;
    sim.changed = true;
    turns.insert((raw, no), TurnSeen::Ended);
    d.turn_ends.push(TurnEnd {
        session: raw,
        no: i64::from(no),
        at: to_millis(at),
        outcome: outcome.as_str(),
        error_kind: error.map(|e| e.kind.as_str()),
        error_message: error.map(|e| e.message.as_str()),
    });
    Ok(())
}

/// The transitions and the turn's end a finalize carries, applied in order
/// before its latch as their own writes would be; returns what the
/// lifecycle refused, and whether the turn's end was applied (it is then
/// the last of `d.turn_ends`).
fn carried<'b>(
    d: &mut Decided<'b>,
    turns: &mut HashMap<(i64, u32), TurnSeen>,
    id: SessionId,
    raw: i64,
    sim: &mut Sim,
    plan: &'b FinalizeRequest,
) -> (Vec<StoreError>, bool) {
    let mut refused = Vec::new();
    let mut ended = false;
    for step in plan.steps() {
        let moved = match allowed(step.from, step.to) {
            true => transition(d, id, raw, sim, step),
            false => Err(StoreError::InvalidTransition {
                session: id,
                from: step.from,
                to: step.to,
            }),
        };
        refused.extend(moved.err());
    }
    if let Some(end) = &plan.turn_end {
        let end = (end.no, end.outcome, end.error.as_ref(), end.at);
        match end_turn(d, turns, id, raw, sim, end) {
            Ok(()) => ended = true,
            Err(error) => refused.push(error),
        }
    }
    (refused, ended)
}

/// What the batch knows of turn `no`: what it read or wrote, else the turn
/// the session had open when read, else nothing (it read every other turn the
/// batch names).
fn seen(turns: &HashMap<(i64, u32), TurnSeen>, sim: &Sim, raw: i64, no: u32) -> TurnSeen {
    match turns.get(&(raw, no)) {
        Some(seen) => *seen,
        None if sim.read_open == Some(no) => TurnSeen::Open,
        None => TurnSeen::Missing,
    }
}

/// The session `id` as the batch sees it, with its database id, for a write
/// of its owner: refused with `LeaseLost` once the owner's lease expired,
/// and with `HandedOff` once it was released, or, for a batch of a
/// `writer`, when another process owns it now (G8, G12: a former owner
/// never writes a session another process adopted).
fn lookup<'s>(
    sessions: &'s mut HashMap<i64, Sim>,
    owners: &HashMap<i64, bool>,
    writer: Option<(OwnerId, i64)>,
    id: SessionId,
) -> Result<(i64, &'s mut Sim), StoreError> {
    let raw = sid(id)?;
    let sim = sessions
        .get_mut(&raw)
        .ok_or(StoreError::UnknownSession(id))?;
    let (owner, mine) = match writer {
        Some((owner, raw_owner)) => (owner, raw_owner == sim.owner),
        None => (OwnerId(sim.owner.unsigned_abs()), true),
    };
    if sim.released || !mine {
        // A finalized session answers as one, whoever asks (G10).
        if sim.live.state != State::Finalized {
            return Err(StoreError::HandedOff { session: id, owner });
        }
    }
    if owners.get(&sim.owner) != Some(&true) {
        return Err(StoreError::LeaseLost(OwnerId(sim.owner.unsigned_abs())));
    }
    Ok((raw, sim))
}

/// Check a registration: the resumed session, then the parent, then the
/// owner, then that the id it asks for is free (no session has it, and no
/// registration before it in the batch asked for it). An id not given is
/// allocated when it is written.
fn register<'b>(
    d: &mut Decided<'b>,
    item: usize,
    new: &'b NewSession,
    sessions: &HashMap<i64, Sim>,
    owners: &HashMap<i64, bool>,
) -> Option<Result<Applied, StoreError>> {
    let known = |id: SessionId| sid(id).ok().and_then(|raw| sessions.get(&raw));
    if let Some(previous) = new.resumed_from {
        if known(previous).is_none() {
            return Some(Err(StoreError::UnknownSession(previous)));
        }
    }
    let tree = match new.parent {
        Some(parent) => match known(parent) {
            None => return Some(Err(StoreError::UnknownSession(parent))),
            Some(sim) if !sim.live.state.is_open() => {
                return Some(Err(StoreError::ParentClosed {
                    parent,
                    state: sim.live.state,
                }))
            }
            Some(sim) => Some(sim.tree),
        },
        None => None,
    };
    match new.owner.raw().ok().and_then(|owner| owners.get(&owner)) {
        Some(true) => {}
        Some(false) => return Some(Err(StoreError::LeaseLost(new.owner))),
        None => return Some(Err(StoreError::UnknownOwner(new.owner))),
    }
    if let Some(id) = new.id {
        if known(id).is_some() || !d.taken.insert(id) {
            return Some(Err(StoreError::DuplicateSession(id)));
        }
    }
    let n = d.registrations.len();
    d.registrations.push(Registration { item, new, tree });
    let cause = d.cause(Cause::Registered);
    d.timeline.push(TimelineEntry {
        whose: Whose::New(n),
        at: to_millis(new.created_at),
        from: None,
        to: State::Registered,
        cause,
    });
    // Answered once the id is known.
    None
}
