//! [`Gateway`]: the server, over a [`Kernel`] and a provider.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
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

use crate::connection;
use crate::connections::Connections;
use crate::error::GatewayError;
use crate::limits::Limits;
use crate::shared::Shared;
use crate::table::Table;

/// How long connections get to take their closing frame once everything
/// is finalized, before they are cut.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The read buffer of a connection: small, since requests are; a larger
/// request is read in several pieces.
const READ_BUFFER: usize = 2 * 1024;

/// How much a connection's WebSocket layer gathers before writing.
const WRITE_BUFFER: usize = 8 * 1024;

/// Builds a [`Gateway`].
pub struct GatewayBuilder {
    kernel: Kernel,
    provider: Arc<dyn Provider>,
    drain: Duration,
    limits: Limits,
}

impl Debug for GatewayBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayBuilder")
            .field("drain", &self.drain)
            .field("limits", &self.limits)
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
    /// dropped (and so detached). `None` sends no pings. Default 30 s.
    #[must_use]
    pub fn keepalive(mut self, every: Option<Duration>) -> Self {
        self.limits.keepalive = every.filter(|d| !d.is_zero());
        self
    }

    /// The gateway.
    pub fn build(self) -> Gateway {
        Gateway {
            shared: Arc::new(Shared {
                kernel: self.kernel,
                provider: self.provider,
                table: Table::default(),
                connections: Connections::default(),
                tasks: TaskTracker::new(),
                limits: self.limits,
                drain: self.drain,
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
    /// [`Listener`]) until the kernel has shut down, whoever began it
    /// ([`shutdown`](Self::shutdown), a signal, a lost lease): then it
    /// tells every connection `server.shutdown`, refuses new sessions and
    /// turns, lets the kernel drain and finalize, delivers every turn's and
    /// session's end, closes the connections, and returns the kernel's
    /// report.
    ///
    /// # Errors
    /// When the server fails.
    pub async fn serve<L>(&self, listener: L) -> Result<ShutdownReport, GatewayError>
    where
        L: Listener,
        L::Addr: Debug,
    {
        let stop_accepting = CancellationToken::new();
        let server = {
            let stop = stop_accepting.clone();
            axum::serve(listener, self.router())
                .with_graceful_shutdown(async move { stop.cancelled().await })
        };
        let shared = &self.shared;
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
            stop_accepting.cancel();
            connection::close_all(&shared.connections, CLOSE_GRACE).await;
            report
        };
        let (served, report) =
            tokio::join!(std::future::IntoFuture::into_future(server), wind_down);
        served.map_err(GatewayError::Serve)?;
        Ok(report)
    }

    /// Begins the graceful shutdown (G9) with the gateway's drain timeout;
    /// [`serve`](Self::serve) returns once it is done.
    pub fn shutdown(&self) {
        self.shared.kernel.begin_shutdown(self.shared.drain);
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

async fn upgrade(State(shared): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    let max = shared.limits.max_message_bytes;
    let tracker = shared.connections.tracker.clone();
    upgrade
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| tracker.track_future(connection::serve(socket, shared)))
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.kernel.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else {
        (StatusCode::OK, "ok\n").into_response()
    }
}
