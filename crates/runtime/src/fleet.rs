//! The kernel's side of a fleet of processes on one database (SPEC §12):
//! a shutdown that hands its sessions off, adopting a session another
//! process released, where a session is, and the fleet's sweep (the
//! sessions of peers whose lease expired released, released sessions
//! nobody adopted reaped). The core decides what is handed off and whether
//! an adoption is admitted; the store's conditional updates decide who
//! wins a race.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use settle_core::{Holds, SessionId};
use settle_store::{Adopted, OwnerId, PeerRelease, SessionStore, StoreError, Whereabouts};
use settle_stream::{Message, ToolCall};
use tokio::sync::oneshot;

use crate::command::Command;
use crate::error::RuntimeError;
use crate::kernel::Kernel;
use crate::report::ShutdownReport;
use crate::session::SessionHandle;

/// A session this process adopted, with what it needs to go on.
#[derive(Debug)]
#[non_exhaustive]
pub struct Adoption {
    /// The session, now this process's.
    pub session: SessionHandle,
    /// Its conversation so far, oldest first: what its next turn sends
    /// before the new prompt.
    pub history: Vec<Message>,
    /// The tool calls of its last reply, which no tool has answered yet:
    /// run them and send their results with the next turn, as after
    /// [`Kernel::resume`](crate::Kernel::resume).
    pub pending_tool_calls: Vec<ToolCall>,
    /// Who may use it through a gateway, as recorded where it was created.
    pub principal: Option<String>,
    /// Turns it ran elsewhere (its next turn is `turns + 1`).
    pub turns: u32,
    /// The holds it had, kept here (SPEC §5: no automatic path takes it
    /// until they are released through [`SessionHandle::release`]): those
    /// it was released with, or the last its crashed owner recorded.
    pub holds: Holds,
    /// The rest of its tree, adopted with it (parents before children): a
    /// tree moves whole, so that closing a parent here winds its children
    /// down here first (G1). Empty in each of them.
    pub with: Vec<Adoption>,
}

/// What one sweep of the fleet did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetSweep {
    /// Sessions of peers whose lease expired, released for adoption.
    pub released: Vec<SessionId>,
    /// Their turns left open, marked `interrupted` (G8).
    pub interrupted_turns: Vec<(SessionId, u32)>,
    /// Released sessions nobody adopted within the idle TTL, finalized
    /// `idle_reap`.
    pub reaped: Vec<SessionId>,
}

impl Kernel {
    /// Starts a shutdown that hands the sessions off (SPEC §12) instead of
    /// finalizing them, and returns at once: as
    /// [`begin_shutdown`](Self::begin_shutdown), but each idle session is
    /// released in the store for another process to adopt; a running turn
    /// keeps the drain, and one still running at its end is cancelled and
    /// settled first. Only for a store shared by a fleet (PostgreSQL).
    pub fn begin_handoff(&self, drain: Duration) {
        let _ = self.send(Command::Handoff { drain, reply: None });
    }

    /// Hands the sessions off as [`begin_handoff`](Self::begin_handoff)
    /// does and waits for the end: the report names what was released
    /// ([`ShutdownReport::released`]).
    pub async fn handoff(&self, drain: Duration) -> ShutdownReport {
        let (tx, rx) = oneshot::channel();
        let answered = match self.send(Command::Handoff {
            drain,
            reply: Some(tx),
        }) {
            Ok(()) => rx.await.ok(),
            Err(_) => None,
        };
        self.finished().await;
        answered.unwrap_or_default()
    }

    /// Adopts `session`, released by another process (or left by one whose
    /// lease expired, its open turn then `interrupted`, G8), with the rest
    /// of its tree (every live session from its topmost live ancestor
    /// down): one transaction of conditional updates in the store, then
    /// the core takes the tree on whole (or none of it), each with its
    /// turn count; each one's conversation comes with it.
    ///
    /// # Errors
    /// [`StoreError::Elsewhere`] (as [`RuntimeError::Store`]) when another
    /// live process owns it (or some of its tree) or won the race, with
    /// that process's URL; [`RuntimeError::SessionClosed`] once it is
    /// finalized; what the core answers an adoption (a shutdown began, no
    /// room under the cap for the whole tree), after which the whole tree
    /// is released again.
    pub async fn adopt(&self, session: SessionId) -> Result<Adoption, RuntimeError> {
        if self.is_shutting_down() {
            return Err(settle_core::Error::ShuttingDown.into());
        }
        let owner = self.owner();
        let mut adopted = self
            .adopt_in_store(session)
            .await
            .map_err(|error| match error {
                RuntimeError::Store(StoreError::SessionClosed(_)) => {
                    RuntimeError::SessionClosed(session)
                }
                other => other,
            })?;
        // Parents before children: the asked-for one right after its parent.
        let mut tree = std::mem::take(&mut adopted.with);
        let at = adopted
            .parent
            .and_then(|p| tree.iter().position(|m| m.session == p))
            .map_or(0, |p| p + 1);
        tree.insert(at, adopted);
        let members: Vec<(SessionId, Holds, Option<String>, u32)> = tree
            .iter()
            .map(|m| (m.session, m.holds, m.principal.clone(), m.turns))
            .collect();
        let tree = tree
            .into_iter()
            .map(|m| {
                let scope = self.scope_of(m.principal.as_deref());
                (m, scope)
            })
            .collect();
        // The core takes the tree on whole or not at all (G1: a child left
        // released could be adopted elsewhere under a parent this process
        // owns); refused (a shutdown began, no room under the cap for all
        // of it: an adoption evicts nothing), every member is released
        // again, for a process with room to take it whole.
        let taken = match self.ask(|reply| Command::Adopt { tree, reply }).await {
            Ok(taken) => taken,
            Err(refused) => {
                let again = members.iter().map(|m| (m.0, m.1)).collect();
                release_again(self.store(), owner, again, self.store_timeout()).await;
                return Err(refused);
            }
        };
        let mut asked = None;
        let mut with = Vec::with_capacity(taken.len().saturating_sub(1));
        for (shared, (_, holds, principal, turns)) in taken.into_iter().zip(members) {
            let id = shared.id;
            let detail = self
                .read_store(
                    "reading an adopted session",
                    self.store().session_detail(id),
                )
                .await?;
            let (history, pending_tool_calls) = crate::resume::conversation(&detail);
            let adoption = Adoption {
                session: SessionHandle::new(shared, self.clone()),
                history,
                pending_tool_calls,
                principal,
                turns,
                holds,
                with: Vec::new(),
            };
            match id == session {
                true => asked = Some(adoption),
                false => with.push(adoption),
            }
        }
        let mut asked = asked.ok_or(RuntimeError::SessionClosed(session))?;
        asked.with = with;
        Ok(asked)
    }

    /// Where `session` is in the fleet: this process's or another's (and
    /// where clients reach it), released, or finalized.
    ///
    /// # Errors
    /// When the store cannot be read within the store timeout.
    pub async fn locate(&self, session: SessionId) -> Result<Whereabouts, RuntimeError> {
        self.read_store("locating a session", self.store().locate(session))
            .await
    }

    /// Who may use `session` through a gateway, as
    /// [`set_principal`](Self::set_principal) recorded it.
    ///
    /// # Errors
    /// When the store fails or does not answer within the store timeout.
    pub async fn principal(&self, session: SessionId) -> Result<Option<String>, RuntimeError> {
        self.read_store("reading a principal", self.store().principal(session))
            .await
    }

    /// Records who may use `session` through a gateway, for every process
    /// of the fleet.
    ///
    /// # Errors
    /// When the store cannot write it within the store timeout.
    pub async fn set_principal(
        &self,
        session: SessionId,
        principal: Option<String>,
    ) -> Result<(), RuntimeError> {
        self.store_call(
            "recording a principal",
            self.store().set_principal(session, principal),
        )
        .await
    }

    /// One sweep of the fleet: the sessions of peers whose lease expired
    /// are released for adoption (their open turns `interrupted`, G8), and
    /// released sessions nobody adopted for `idle_ttl` are finalized
    /// `idle_reap`, once across the fleet (G2).
    ///
    /// # Errors
    /// When the store fails or does not answer within the store timeout.
    pub async fn sweep_fleet(
        &self,
        idle_ttl: Option<Duration>,
    ) -> Result<FleetSweep, RuntimeError> {
        let owner = self.owner();
        let PeerRelease {
            released,
            interrupted_turns,
            ..
        } = self
            .store_call(
                "releasing the sessions of expired peers",
                self.store().release_expired(owner, SystemTime::now()),
            )
            .await?;
        let reaped = match idle_ttl {
            Some(ttl) => {
                self.store_call("reaping released sessions", self.store().reap_released(ttl))
                    .await?
            }
            None => Vec::new(),
        };
        Ok(FleetSweep {
            released,
            interrupted_turns,
            reaped,
        })
    }

    /// The store's adoption of `session` and its tree, bounded by the store
    /// timeout. A write the store did not answer in time may still commit
    /// later (it is queued, or waits on a lock): then what it took is
    /// released again at once, so that the sessions are not left owned by
    /// this process while its kernel never took them on (unreachable
    /// everywhere for as long as it lives).
    async fn adopt_in_store(&self, session: SessionId) -> Result<Adopted, RuntimeError> {
        let (store, owner) = (self.store().clone(), self.owner());
        let after = self.store_timeout();
        // Tried again while the store fails in a way that may heal (the
        // first use of a pooled connection a database restart killed), as
        // every lifecycle write is, within the store timeout.
        let mut call = tokio::spawn(async move {
            let until = tokio::time::Instant::now() + after;
            let mut backoff = crate::backoff::Backoff::new();
            loop {
                match store.adopt(owner, session, SystemTime::now()).await {
                    Err(error) if error.may_heal() => {
                        let wait = backoff.next_wait();
                        if tokio::time::Instant::now() + wait >= until {
                            return Err(error);
                        }
                        tracing::warn!(%session, %error, "failed to adopt a session; trying again");
                        tokio::time::sleep(wait).await;
                    }
                    answered => return answered,
                }
            }
        });
        match tokio::time::timeout(after, &mut call).await {
            Ok(Ok(result)) => result.map_err(RuntimeError::Store),
            Ok(Err(_)) => Err(RuntimeError::Store(StoreError::Unavailable)),
            Err(_) => {
                let store = self.store().clone();
                tokio::spawn(async move {
                    let Ok(Ok(late)) = call.await else { return };
                    let ids = std::iter::once((late.session, late.holds))
                        .chain(late.with.iter().map(|m| (m.session, m.holds)))
                        .collect();
                    release_again(&store, owner, ids, after).await;
                });
                Err(RuntimeError::StoreTimeout {
                    what: "adopting a session",
                    after,
                    writing: true,
                })
            }
        }
    }
}

/// Releases again, with the holds they came with, sessions this process
/// adopted in the store but did not take on (the core refused them, or the
/// adoption came after the caller gave up), each within `after`; a failure
/// is logged.
async fn release_again(
    store: &Arc<dyn SessionStore>,
    owner: OwnerId,
    ids: Vec<(SessionId, Holds)>,
    after: Duration,
) {
    for (id, holds) in ids {
        let release = store.release(owner, id, holds, SystemTime::now());
        let error = match tokio::time::timeout(after, release).await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("the store did not answer within {after:?}"),
        };
        tracing::warn!(session = %id, %error, "an adoption not taken on could not be released again");
    }
}
