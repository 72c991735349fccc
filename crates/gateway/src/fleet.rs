//! A gateway in a fleet of gateways on one PostgreSQL (SPEC §12): a session
//! another live process owns answers `elsewhere` with that process's URL;
//! `session.attach` of a released one adopts it here, with its history and
//! its principal; a shutdown hands the sessions off; and a sweep releases
//! the sessions of peers whose lease expired and reaps released ones nobody
//! adopted. The kernel and the store decide each of these; the gateway
//! only asks and answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use settle_runtime::{Adoption, RuntimeError, SessionHandle, SessionId};
use settle_store::{StoreError, Whereabouts};
use tokio::sync::watch;

use crate::auth::Principal;
use crate::protocol::RpcError;
use crate::shared::Shared;
use crate::table::Entry;

/// How a gateway takes part in a fleet ([`GatewayBuilder::fleet`](crate::GatewayBuilder::fleet)).
#[derive(Debug, Clone)]
pub struct Fleet {
    pub(crate) sweep_every: Duration,
    pub(crate) idle_ttl: Option<Duration>,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            sweep_every: Duration::from_secs(5),
            idle_ttl: Some(Duration::from_secs(30 * 60)),
        }
    }
}

impl Fleet {
    /// A fleet member that sweeps every 5 s and reaps released sessions
    /// nobody adopted for 30 min.
    pub fn new() -> Self {
        Fleet::default()
    }

    /// How often the fleet is swept: the sessions of peers whose lease
    /// expired are released, released sessions past the idle TTL reaped.
    #[must_use]
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every.max(Duration::from_millis(10));
        self
    }

    /// How long a released session may wait for an adopter before it is
    /// finalized `idle_reap` (`None`: never); the gateway's idle TTL.
    #[must_use]
    pub fn idle_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.idle_ttl = ttl.filter(|t| !t.is_zero());
        self
    }
}

impl Shared {
    /// Session `id`, which this process does not serve, as the fleet has
    /// it: owned by another live process (`elsewhere`, with its URL), or
    /// released (or left by a process whose lease expired), which an
    /// attach (`adopt`) adopts here and any other method is told
    /// `elsewhere` with no owner.
    ///
    /// Another principal's session is `not_found` here as on its own
    /// process: neither its owner's URL nor an adoption says it exists.
    pub(crate) async fn from_fleet(
        self: &Arc<Self>,
        id: SessionId,
        adopt: bool,
        caller: &Principal,
    ) -> Result<Arc<Entry>, RpcError> {
        let not_found = || RpcError::not_found(id.get());
        // One fleet lookup of a session at a time here: an attach racing
        // another's adoption of the same session on this process waits for
        // it and is served its entry, instead of finding the store's row
        // already ours before the kernel or the table has the session.
        // Lookups of different sessions go together.
        let _one = self.adopting.lock(id).await;
        // How many times the store was found to say this process owns the
        // session before its kernel had it: each time, one adoption here
        // (of another member of its tree) is waited for.
        let mut waited = 0;
        loop {
            if let Some(entry) = self.table.get(id) {
                return Ok(entry);
            }
            let ended = self.adopting.ended();
            let whereabouts = match self.kernel.locate(id).await {
                Ok(whereabouts) => whereabouts,
                Err(RuntimeError::Store(StoreError::UnknownSession(_))) => return Err(not_found()),
                Err(error) => return Err(RpcError::from_runtime(&error)),
            };
            if self.recorded_owner(id).await? != *caller {
                return Err(not_found());
            }
            let mine = self.kernel.owner();
            match whereabouts {
                // Adopted here with its tree by another attach, which has
                // not served it yet: served once that adoption ends.
                Whereabouts::Owned {
                    owner, live: true, ..
                } if owner == mine && waited < MAX_WAITS => {
                    waited += 1;
                    if !self.adopting.one_ends(ended).await {
                        return Err(not_found());
                    }
                }
                Whereabouts::Owned {
                    owner,
                    advertise: Some(url),
                    live: true,
                } if owner != mine => return Err(RpcError::elsewhere(id.get(), Some(url))),
                // A live program that serves no gateway owns it (one that
                // embeds the kernel): nobody here can reach it, and it was
                // not handed off, which `elsewhere` with no owner would
                // say (a client would retry its attach for as long as the
                // program ran). Said as any session live in another
                // process this gateway does not serve: `left_for_recovery`,
                // with its state.
                Whereabouts::Owned {
                    owner,
                    advertise: None,
                    live: true,
                } if owner != mine => match self.kernel.session(id).await {
                    Err(error) => return Err(RpcError::from_runtime(&error)),
                    // Finalized meanwhile: read from the store, as below.
                    Ok(handle) => return Ok(self.read_only(handle)),
                },
                Whereabouts::Released | Whereabouts::Owned { live: false, .. } if adopt => {
                    let adopting = self.adopting.begin();
                    let mut adoption = match self.kernel.adopt(id).await {
                        Ok(adoption) => adoption,
                        // Taken by an adoption of its tree here meanwhile:
                        // looked up again.
                        Err(RuntimeError::Store(StoreError::NotReleased { .. }))
                            if waited < MAX_WAITS =>
                        {
                            waited += 1;
                            drop(adopting);
                            continue;
                        }
                        Err(error) => return Err(RpcError::from_runtime(&error)),
                    };
                    // The rest of its tree came with it: served here from now on.
                    for other in std::mem::take(&mut adoption.with) {
                        self.serve_adopted(other).await;
                    }
                    return Ok(self.serve_adopted(adoption).await);
                }
                Whereabouts::Released | Whereabouts::Owned { live: false, .. } => {
                    return Err(RpcError::elsewhere(id.get(), None))
                }
                // Finalized meanwhile (by its owner, or a sweep): read from
                // the store, as any finalized session is.
                Whereabouts::Finalized => {
                    let handle = self
                        .kernel
                        .session(id)
                        .await
                        .map_err(|e| RpcError::from_runtime(&e))?;
                    return Ok(self.read_only(handle));
                }
                _ => return Err(not_found()),
            }
        }
    }

    /// A finalized session's entry, which this process reads from the
    /// store and does not add to its table.
    fn read_only(&self, handle: SessionHandle) -> Arc<Entry> {
        Arc::new(Entry::new(handle, self.table.held().clone()))
    }

    /// Serves `adoption` here: its principal's, with its conversation.
    async fn serve_adopted(self: &Arc<Self>, adoption: Adoption) -> Arc<Entry> {
        let id = adoption.session.id();
        let holds = adoption.holds;
        let held = usize::from(holds.pending_input) + usize::from(holds.delegation);
        self.owners.adopted(
            crate::principals::principal_of(adoption.principal.as_deref()),
            id,
            held,
        );
        tracing::info!(session = %id, turns = adoption.turns, "adopted a session");
        // Its clients' transport was on the process that handed it off,
        // and went with it: here it is an orphan from now (SPEC §10), its
        // grace running until a client attaches it (the one that asked for
        // it does at once), as after a client's disconnect. Told to the
        // core as what happened: a transport attached, and gone.
        if adoption.session.attach_transport(false).await.is_ok() {
            let _ = adoption.session.detach_transport().await;
        }
        let entry = self.adopt(adoption.session);
        entry.conversation.lock().await.replace(adoption.history);
        entry
    }
}

/// Sweeps the fleet every `fleet.sweep_every` until the shutdown begins.
pub(crate) async fn sweep(shared: Arc<Shared>, fleet: Fleet) {
    let mut every = tokio::time::interval(fleet.sweep_every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.kernel.shutdown_begun() => return,
            _ = every.tick() => {}
        }
        match shared.kernel.sweep_fleet(fleet.idle_ttl).await {
            Ok(swept) => {
                if !swept.released.is_empty() || !swept.reaped.is_empty() {
                    tracing::info!(
                        released = swept.released.len(),
                        interrupted = swept.interrupted_turns.len(),
                        reaped = swept.reaped.len(),
                        "swept the fleet"
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "the fleet could not be swept"),
        }
    }
}

/// The principal a session's recorded name stands for.
/// How many times one lookup waits for another adoption here before it
/// answers with what the store says.
const MAX_WAITS: u32 = 3;

/// The fleet lookups in flight on this process: one lock per session, held
/// while the session is looked up in the store and, if so, adopted; gone
/// when nobody waits for it. And the adoptions in flight, with how many
/// ended: one attach adopts a whole tree, so a lookup of another member of
/// it can find the store saying this process owns it before the kernel
/// and the table have it, and waits for that adoption to end.
#[derive(Debug)]
pub(crate) struct Adopting {
    locks: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    in_flight: AtomicUsize,
    ended: watch::Sender<u64>,
}

impl Default for Adopting {
    fn default() -> Self {
        Adopting {
            locks: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            ended: watch::channel(0).0,
        }
    }
}

impl Adopting {
    /// Waits until nobody else looks `id` up here; held until dropped.
    async fn lock(&self, id: SessionId) -> AdoptingGuard<'_> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_default()
            .clone();
        let guard = lock.clone().lock_owned().await;
        AdoptingGuard {
            adopting: self,
            id,
            lock,
            _guard: guard,
        }
    }

    /// An adoption here begins; it ends when the returned guard drops.
    fn begin(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self)
    }

    /// What [`one_ends`](Self::one_ends) counts from: the adoptions that
    /// ended by now.
    fn ended(&self) -> watch::Receiver<u64> {
        self.ended.subscribe()
    }

    /// Waits until an adoption here ends after `since` was taken: at once
    /// if one did meanwhile; `false` when none is in flight (nothing here
    /// will serve the session).
    async fn one_ends(&self, mut since: watch::Receiver<u64>) -> bool {
        if since.has_changed().unwrap_or(false) {
            return true;
        }
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return false;
        }
        since.changed().await.is_ok()
    }
}

/// One adoption in flight; its drop counts it ended, after its sessions are
/// served.
struct InFlight<'a>(&'a Adopting);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.send_modify(|ended| *ended += 1);
    }
}

/// One lookup's turn; forgets the session's lock when nobody else holds it.
struct AdoptingGuard<'a> {
    adopting: &'a Adopting,
    id: SessionId,
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for AdoptingGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self
            .adopting
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Ours, this guard's and the map's: nobody waits for it.
        if Arc::strong_count(&self.lock) <= 3 {
            locks.remove(&self.id);
        }
    }
}
