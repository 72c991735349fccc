//! The accept loop: each connection served by hyper's HTTP/1 server in a
//! task of the gateway's, so that none can hold the gateway.
//!
//! axum's `serve` waits at shutdown for every connection to end by itself,
//! so a client that sent half a request head and then nothing kept the
//! process alive for good. Here, each connection:
//!
//! - is a TCP connection with Nagle's algorithm off (each frame sent at
//!   once);
//! - takes a place among the gateway's connections when accepted, or is
//!   closed at once when there is none (reading a request from it would
//!   cost what the limit protects);
//! - has the header timeout to finish its TLS handshake and each request
//!   head, a byte at a time or not (a kept-alive connection waiting for its
//!   next request too): past it, it is dropped;
//! - once the gateway stops accepting, is asked to close after the request
//!   it serves, and is dropped past a short grace whatever it is doing.
//!
//! An upgraded connection leaves this loop (hyper hands its socket to the
//! WebSocket task) with its place: see [`connection`](crate::connection).

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

use crate::refusals::{refused, Refusal};
use crate::shared::Shared;
use crate::slots::Slot;

/// The address of a connection's client, as log lines name it.
#[derive(Debug, Clone)]
pub(crate) struct Peer(pub Arc<str>);

/// Turns Nagle's algorithm off on a TCP connection (`TCP_NODELAY`): a
/// turn's chunks are small frames written one after another, and with it
/// on each waits for the peer's acknowledgement of the one before, which
/// a client may delay by tens of milliseconds. Another kind of
/// connection (a listener of one's own) is its owner's to set up.
fn sends_at_once(io: &mut dyn Any) {
    if let Some(tcp) = io.downcast_mut::<tokio::net::TcpStream>() {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "could not turn Nagle's algorithm off on a connection");
        }
    }
}

/// Accepts connections from `listener` until `stop`, serving `router` on
/// each in a task of `tracker`'s.
pub(crate) async fn accept<L>(
    mut listener: L,
    router: Router,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tracker: TaskTracker,
    grace: Duration,
) where
    L: Listener,
    L::Addr: Debug,
{
    loop {
        let (mut io, peer) = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        sends_at_once(&mut io);
        let Some(slot) = shared.slots.any() else {
            refused!(
                shared.refusals,
                Refusal::AtCapacity,
                ?peer,
                limit = shared.limits.max_connections,
                "refused a connection: the gateway has its maximum of connections open"
            );
            drop(io);
            continue;
        };
        let served = Served {
            router: router.clone(),
            shared: shared.clone(),
            slot,
            stop: stop.clone(),
            grace,
        };
        tracker.spawn(served.connection(io, peer));
    }
}

/// What one connection's task needs.
struct Served {
    router: Router,
    shared: Arc<Shared>,
    slot: Slot,
    stop: CancellationToken,
    grace: Duration,
}

impl Served {
    async fn connection<I, A>(self, io: I, peer: A)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        A: Debug,
    {
        let Some(tls) = self.shared.tls.clone() else {
            return self.http(io, peer).await;
        };
        let timeout = self.shared.limits.header_timeout;
        let handshake = tokio::select! {
            biased;
            () = self.stop.cancelled() => return,
            handshake = tokio::time::timeout(timeout, tls.accept(io)) => handshake,
        };
        match handshake {
            Ok(Ok(io)) => self.http(io, peer).await,
            Ok(Err(error)) => refused!(
                self.shared.refusals,
                Refusal::Handshake,
                ?peer,
                %error,
                "dropped a connection: its TLS handshake failed"
            ),
            Err(_) => refused!(
                self.shared.refusals,
                Refusal::Handshake,
                ?peer,
                ?timeout,
                "dropped a connection: no TLS handshake within the header timeout"
            ),
        }
    }

    async fn http<I, A>(self, io: I, peer: A)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        A: Debug,
    {
        let Served {
            router,
            shared,
            slot,
            stop,
            grace,
        } = self;
        // Each request carries the connection's place, for the upgrade to
        // take along, and its client's address, for the log lines of a
        // refused upgrade.
        let client = Peer(Arc::from(format!("{peer:?}")));
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(slot.clone());
            request.extensions_mut().insert(client.clone());
            let mut router = router.clone();
            async move { router.call(request.map(Body::new)).await }
        });
        let timeout = shared.limits.header_timeout;
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(timeout);
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        let mut connection = std::pin::pin!(connection);
        let served = tokio::select! {
            served = connection.as_mut() => served,
            () = stop.cancelled() => {
                connection.as_mut().graceful_shutdown();
                match tokio::time::timeout(grace, connection.as_mut()).await {
                    Ok(served) => served,
                    Err(_) => {
                        tracing::warn!(?peer, "dropped a connection still in a request at shutdown");
                        return;
                    }
                }
            }
        };
        match served {
            Err(error) if error.is_timeout() => refused!(
                shared.refusals,
                Refusal::HeaderTimeout,
                ?peer,
                ?timeout,
                "dropped a connection: no complete request header within the header timeout"
            ),
            Err(error) => tracing::debug!(?peer, %error, "a connection failed"),
            Ok(()) => {}
        }
    }
}
