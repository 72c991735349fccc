//! [`Gateway`]: the server, over a [`Kernel`] and a provider.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::Listener;
use axum::Router;
use settle_runtime::{Kernel, ShutdownReport};
use settle_stream::Provider;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accept;
use crate::auth::Tokens;
use crate::connection;
use crate::connections::Connections;
use crate::conversation::HeldHistory;
use crate::error::GatewayError;
use crate::fleet::Fleet;
use crate::limits::Limits;
use crate::origin::Origins;
use crate::ownership::Owners;
use crate::shared::Shared;
use crate::slots::Slots;
use crate::table::Table;
use crate::tls::Tls;
use crate::upgrade::upgrade;

/// How long connections get to take their closing frame once everything
/// is finalized, before they are cut.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Builds a [`Gateway`].
pub struct GatewayBuilder {
    kernel: Kernel,
    provider: Arc<dyn Provider>,
    drain: Duration,
    limits: Limits,
    tokens: Option<Tokens>,
    origins: Origins,
    tls: Option<Tls>,
    fleet: Option<Fleet>,
}

impl Debug for GatewayBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayBuilder")
            .field("drain", &self.drain)
            .field("limits", &self.limits)
            .field("tokens", &self.tokens)
            .field("origins", &self.origins)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl GatewayBuilder {
    /// How long running turns may finish once shutdown begins (G9): what
    /// [`Gateway::shutdown`] asks of the kernel, and the `drain_ms` of the
    /// `server.shutdown` notification. Default 5 s.
    #[must_use]
    pub fn drain_timeout(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// How many frames may wait to be sent to one connection before it is
    /// taken for too slow and disconnected. Default 1024.
    #[must_use]
    pub fn queue_frames(mut self, frames: usize) -> Self {
        self.limits.queue_frames = frames.max(1);
        self
    }

    /// How many bytes may wait to be sent to one connection before it is
    /// taken for too slow and disconnected. Default 1 MiB.
    #[must_use]
    pub fn queue_bytes(mut self, bytes: usize) -> Self {
        self.limits.queue_bytes = bytes;
        self
    }

    /// The largest message a client may send; a larger one ends its
    /// connection. Default 1 MiB.
    #[must_use]
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_message_bytes = bytes;
        self
    }

    /// How often each connection is pinged; one silent for two intervals is
    /// closed (code 1011, and so detached). `None` sends no pings. Default
    /// 30 s.
    #[must_use]
    pub fn keepalive(mut self, every: Option<Duration>) -> Self {
        self.limits.keepalive = every.filter(|d| !d.is_zero());
        self
    }

    /// Requires a bearer token of `tokens` on every upgrade (HTTP 401
    /// without one); each session then belongs to the principal that
    /// created it, and is `not_found` to every other. Without tokens the
    /// gateway serves one anonymous principal.
    #[must_use]
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Allows upgrades whose `Origin` is `origin` (`https://app.example.com`);
    /// one with another `Origin` is refused (HTTP 403), one with none (not
    /// a browser) is let through. Repeatable. Default: no origin allowed.
    #[must_use]
    pub fn allow_origin(mut self, origin: &str) -> Self {
        self.origins.allow(origin);
        self
    }

    /// Serves `wss://` (and `https://`) with `tls`, instead of plain text.
    #[must_use]
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long a client has for its TLS handshake and for each whole
    /// request head (a kept-alive HTTP connection, for its next one);
    /// past it, the connection is dropped. Default 10 s.
    #[must_use]
    pub fn header_timeout(mut self, timeout: Duration) -> Self {
        self.limits.header_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a WebSocket connection attached to no session may send no
    /// request before it is closed (code 1000); a finalized session no
    /// longer counts, and the time runs from its end. `None` never closes
    /// one. Default 5 min.
    #[must_use]
    pub fn connection_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.limits.connection_idle = timeout.filter(|d| !d.is_zero());
        self
    }

    /// How many connections may be open at once, upgraded or not; past it
    /// a new one is closed at once. Default 4096.
    #[must_use]
    pub fn max_connections(mut self, max: usize) -> Self {
        self.limits.max_connections = max.max(1);
        self
    }

    /// How many WebSocket connections each principal of the tokens may
    /// have open at once; past it an upgrade is refused (HTTP 429).
    /// Default 256.
    #[must_use]
    pub fn max_connections_per_principal(mut self, max: usize) -> Self {
        self.limits.max_connections_per_principal = max.max(1);
        self
    }

    /// How many live sessions each principal may have; past it
    /// `session.create` is refused `over_capacity`. `None` (the default):
    /// no bound but the kernel's cap.
    #[must_use]
    pub fn max_sessions_per_principal(mut self, max: Option<usize>) -> Self {
        self.limits.max_sessions_per_principal = max;
        self
    }

    /// How many requests per second each connection may send, in bursts
    /// of up to a second's worth; one more is answered `rate_limited`, or
    /// dropped unanswered if it is a notification.
    /// `None`: unlimited. Default 100.
    #[must_use]
    pub fn requests_per_second(mut self, rate: Option<u32>) -> Self {
        self.limits.requests_per_second = rate.filter(|r| *r > 0);
        self
    }

    /// How many holds each principal may have placed at once; one more
    /// `session.hold` is refused `over_capacity`. `None` (the default): no
    /// bound.
    #[must_use]
    pub fn max_holds_per_principal(mut self, max: Option<usize>) -> Self {
        self.limits.max_holds_per_principal = max;
        self
    }

    /// How many bytes of conversation (the prompts and replies sent again
    /// with each turn) all sessions may keep in memory at once; a
    /// `turn.start` whose prompt would take them past it is refused
    /// `over_capacity`, writing nothing. `None`: no bound. Default 1 GiB.
    #[must_use]
    pub fn max_history_memory(mut self, max: Option<usize>) -> Self {
        self.limits.max_history_memory = max;
        self
    }

    /// Makes the gateway one of a fleet of gateways on one PostgreSQL
    /// (SPEC §12): a method on a session another live process owns answers
    /// `elsewhere` with its URL, `session.attach` of a released session
    /// adopts it, the fleet is swept as `fleet` says, and a shutdown hands
    /// the sessions off instead of finalizing them (`server.shutdown` says
    /// `handoff: true`). The kernel's store must be shared by the fleet;
    /// where clients reach this process is the kernel's
    /// [`advertise`](settle_runtime::KernelBuilder::advertise).
    #[must_use]
    pub fn fleet(mut self, fleet: Fleet) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// The gateway.
    pub fn build(self) -> Gateway {
        let slots = Slots::new(
            self.limits.max_connections,
            self.limits.max_connections_per_principal,
        );
        Gateway {
            shared: Arc::new(Shared {
                kernel: self.kernel,
                provider: self.provider,
                table: Table::new(HeldHistory::new(self.limits.max_history_memory)),
                connections: Connections::default(),
                tasks: TaskTracker::new(),
                limits: self.limits,
                drain: self.drain,
                tokens: self.tokens,
                origins: self.origins,
                tls: self.tls,
                owners: Owners::default(),
                slots,
                fleet: self.fleet,
                adopting: crate::fleet::Adopting::default(),
                refusals: crate::refusals::Refusals::default(),
            }),
        }
    }
}

/// The session gateway: JSON-RPC 2.0 over WebSocket at `/ws`, and
/// `GET /healthz`, over a [`Kernel`] whose sessions it serves and a
/// provider its turns stream from. Cheap to clone.
///
/// It holds no lifecycle logic of its own: connections attach and detach
/// transports, holds are the kernel's holds, and every reclaim (orphan
/// reap, transport closed, idle reap, LRU eviction, the shutdown sweep) is
/// the kernel's decision under its policy, set on the
/// [`KernelBuilder`](settle_runtime::KernelBuilder).
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
}

impl Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("sessions", &self.shared.table.len())
            .field("connections", &self.shared.connections.len())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A builder over `kernel`, whose turns stream from `provider`.
    pub fn builder(kernel: Kernel, provider: Arc<dyn Provider>) -> GatewayBuilder {
        GatewayBuilder {
            kernel,
            provider,
            drain: Duration::from_secs(5),
            limits: Limits::default(),
            tokens: None,
            origins: Origins::default(),
            tls: None,
            fleet: None,
        }
    }

    /// The kernel it serves.
    pub fn kernel(&self) -> &Kernel {
        &self.shared.kernel
    }

    /// The routes, `/ws` and `/healthz`, to mount in an application of
    /// one's own; [`serve`](Self::serve) serves them alone.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/ws", get(upgrade))
            .route("/healthz", get(healthz))
            .with_state(self.shared.clone())
    }

    /// Serves on `listener` (a [`tokio::net::TcpListener`], or any
    /// [`Listener`]: a TCP connection is served with Nagle's algorithm off,
    /// so that each chunk's frame leaves at once; another kind of
    /// connection is served as it is set up) until the kernel has shut down, whoever began it
    /// ([`shutdown`](Self::shutdown), a signal, a lost lease): then it
    /// tells every connection `server.shutdown`, refuses new sessions and
    /// turns, lets the kernel drain and finalize, delivers every turn's and
    /// session's end, closes the connections, and returns the kernel's
    /// report.
    ///
    /// No connection outlives it: one that has not upgraded is dropped
    /// past a short grace, however far into its request it is, and so is
    /// a WebSocket connection that does not take its closing frame.
    ///
    /// # Errors
    /// None today; kept for a server that can fail.
    pub async fn serve<L>(&self, listener: L) -> Result<ShutdownReport, GatewayError>
    where
        L: Listener,
        L::Addr: Debug,
    {
        let stop_accepting = CancellationToken::new();
        let http = TaskTracker::new();
        let shared = &self.shared;
        let accepting = accept::accept(
            listener,
            self.router(),
            shared.clone(),
            stop_accepting.clone(),
            http.clone(),
            CLOSE_GRACE,
        );
        if let Some(fleet) = shared.fleet.clone() {
            tokio::spawn(crate::fleet::sweep(shared.clone(), fleet));
        }
        let wind_down = async {
            shared.kernel.shutdown_begun().await;
            shared.announce_shutdown();
            let report = shared.kernel.shutdown(shared.drain).await;
            shared.tasks.close();
            if tokio::time::timeout(CLOSE_GRACE, shared.tasks.wait())
                .await
                .is_err()
            {
                tracing::warn!("some turn or session end was not delivered in time");
            }
            // Every connection, upgraded or not, ends within the grace.
            stop_accepting.cancel();
            http.close();
            // Each bounded: a task stuck where it does not see its cut is
            // left behind (dropped with the runtime), not waited for (G9).
            tokio::join!(
                connection::close_all(&shared.connections, CLOSE_GRACE),
                connection::wait_at_most(&http, 2 * CLOSE_GRACE, "HTTP connections")
            );
            shared.refusals.say_unwritten();
            report
        };
        let ((), report) = tokio::join!(accepting, wind_down);
        Ok(report)
    }

    /// Begins the graceful shutdown (G9) with the gateway's drain timeout;
    /// [`serve`](Self::serve) returns once it is done. In a fleet it hands
    /// the sessions off (SPEC §12).
    pub fn shutdown(&self) {
        match self.shared.fleet {
            Some(_) => self.shared.kernel.begin_handoff(self.shared.drain),
            None => self.shared.kernel.begin_shutdown(self.shared.drain),
        }
    }

    /// How many connections are open now.
    pub fn connections(&self) -> usize {
        self.shared.connections.len()
    }

    /// How many sessions the gateway serves now (finalized ones are forgotten).
    pub fn sessions(&self) -> usize {
        self.shared.table.len()
    }
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.kernel.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else {
        (StatusCode::OK, "ok\n").into_response()
    }
}
