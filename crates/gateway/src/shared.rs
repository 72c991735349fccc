//! [`Shared`]: what every connection and task of a gateway shares (the
//! kernel, the provider, the table of sessions, the connections), and what
//! they do with it: find or adopt a session, watch its end, run a turn,
//! announce the shutdown.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use settle_runtime::{EndReason, Kernel, RuntimeError, SessionHandle, SessionId};
use settle_stream::Provider;
use tokio_util::task::TaskTracker;

use crate::auth::{Principal, Tokens};
use crate::connections::Connections;
use crate::fleet::Fleet;
use crate::limits::Limits;
use crate::origin::Origins;
use crate::ownership::Owners;
use crate::protocol::{notification, RpcError};
use crate::pump;
use crate::pump::Started;
use crate::slots::Slots;
use crate::table::{Entry, Table};
use crate::tls::Tls;

/// What every connection and task of a gateway shares.
pub(crate) struct Shared {
    pub kernel: Kernel,
    pub provider: Arc<dyn Provider>,
    pub table: Table,
    pub connections: Connections,
    /// The turns being delivered and the watchers of sessions' ends.
    pub tasks: TaskTracker,
    pub limits: Limits,
    pub drain: Duration,
    /// The bearer tokens required on upgrade; none: one anonymous principal.
    pub tokens: Option<Tokens>,
    pub origins: Origins,
    pub tls: Option<Tls>,
    /// Which principal owns which session.
    pub owners: Owners,
    /// The places for connections.
    pub slots: Slots,
    /// Its part in a fleet of gateways on one database (SPEC §12): then a
    /// shutdown hands the sessions off.
    pub fleet: Option<Fleet>,
    /// The sessions being adopted from the fleet, one lock each.
    pub adopting: crate::fleet::Adopting,
    /// The log lines of clients it does not serve, written in runs.
    pub refusals: crate::refusals::Refusals,
}

impl Shared {
    /// The entry of session `id`: one the gateway serves, a session of the
    /// kernel it adopts (the embedding program registered it), or a closed
    /// one (finalized), served for this call only: its handle answers every
    /// method as the core answers a finalized session.
    ///
    /// In a fleet, a session the kernel does not know is looked for in the
    /// fleet ([`from_fleet`](Self::from_fleet)): `adopt` (an attach) adopts
    /// a released one here.
    pub async fn entry(
        self: &Arc<Self>,
        id: SessionId,
        adopt: bool,
        caller: &Principal,
    ) -> Result<Arc<Entry>, RpcError> {
        if let Some(entry) = self.table.get(id) {
            return Ok(entry);
        }
        match self.kernel.session(id).await {
            Ok(handle) if handle.is_closed() => {
                Ok(Arc::new(Entry::new(handle, self.table.held().clone())))
            }
            Ok(handle) => Ok(self.adopt(handle)),
            // Not this process's: in a fleet, another's or released.
            Err(
                RuntimeError::Lifecycle(settle_core::Error::UnknownSession(_))
                | RuntimeError::LiveElsewhere { .. },
            ) if self.fleet.is_some() => self.from_fleet(id, adopt, caller).await,
            Err(error) => Err(RpcError::from_runtime(&error)),
        }
    }

    /// Serves `handle`'s session: its entry, and a watcher of its end that
    /// tells the attached connections and forgets it.
    pub fn adopt(self: &Arc<Self>, handle: SessionHandle) -> Arc<Entry> {
        let (entry, new) = self.table.adopt(handle);
        if new {
            let (shared, watched) = (self.clone(), entry.clone());
            self.tasks
                .spawn(async move { shared.watch_end(watched).await });
        }
        entry
    }

    async fn watch_end(&self, entry: Arc<Entry>) {
        // However this ends, its parent's notice waits for it no more.
        let _telling = entry.telling();
        // In a fleet, a session handed off is never finalized here: its
        // watch ends with the kernel (a finalize that came first wins).
        let in_fleet = self.fleet.is_some();
        let reason = tokio::select! {
            biased;
            reason = entry.handle.finalized() => reason,
            () = self.kernel.stopped(), if in_fleet => {
                self.table.remove(&entry);
                return;
            }
        };
        // A turn still being delivered announces its end first, and the
        // children the gateway serves announce theirs.
        let _delivered = entry.conversation.lock().await;
        entry.children_told().await;
        self.table.remove(&entry);
        self.owners.finished(entry.handle.id());
        if let Ok(reason) = reason {
            if self.kernel.is_shutting_down() {
                self.announce_shutdown();
            }
            let frame = finalized_notification(entry.handle.id(), reason);
            entry.finalized(reason, &frame.into());
        }
    }

    /// Runs a started turn to its end, delivering it.
    pub fn run(&self, started: Started) {
        let Started {
            entry,
            turn,
            conversation,
        } = started;
        let part_bytes = self.limits.part_bytes();
        self.tasks
            .spawn(pump::pump(entry, turn, conversation, part_bytes));
    }

    /// Tells every connection `server.shutdown`, with the drain it has,
    /// and, in a fleet, `handoff: true`: its sessions are handed off, to be
    /// attached on another process (SPEC §12). A shutdown the kernel began
    /// because it lost its lease (G8) has no drain and says so: `drain_ms`
    /// 0 and `reason: "lease_lost"` (the store's words stay in the log: a
    /// client is not told about the database).
    pub fn announce_shutdown(&self) {
        let lease_lost = self.kernel.lease_lost().is_some();
        let drain = if lease_lost {
            Duration::ZERO
        } else {
            self.drain
        };
        let drain_ms = u64::try_from(drain.as_millis()).unwrap_or(u64::MAX);
        let mut params = match self.fleet {
            Some(_) => json!({ "drain_ms": drain_ms, "handoff": true }),
            None => json!({ "drain_ms": drain_ms }),
        };
        if lease_lost {
            params["reason"] = json!("lease_lost");
        }
        self.connections
            .announce_shutdown(|| notification("server.shutdown", params.clone()).into());
    }
}

/// The `session.finalized` notification of session `id`, ended `reason`.
pub(crate) fn finalized_notification(id: SessionId, reason: EndReason) -> String {
    notification(
        "session.finalized",
        json!({ "id": id.get(), "end_reason": reason.as_str() }),
    )
}
