//! `GET /ws`: what a request must pass before its upgrade, in this order,
//! each refusal an HTTP status and one log line:
//!
//! 1. its `Origin`, if it has one, is allowed (else 403);
//! 2. its bearer token names a principal, when the gateway has tokens
//!    (else 401, with `WWW-Authenticate: Bearer`);
//! 3. it is a WebSocket upgrade (else axum's 4xx);
//! 4. its principal has a connection place left (else 429).

use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::header::WWW_AUTHENTICATE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::accept::Peer;
use crate::auth;
use crate::connection;
use crate::refusals::{refused, Refusal};
use crate::shared::Shared;
use crate::slots::Slot;

/// The read buffer of a connection: small, since requests are; a larger
/// request is read in several pieces.
const READ_BUFFER: usize = 2 * 1024;

/// How much a connection's WebSocket layer gathers before writing.
const WRITE_BUFFER: usize = 8 * 1024;

/// The most a connection's WebSocket layer keeps unwritten for a client
/// that does not read, over the largest frame it sends: room for what it
/// gathers before writing and the pong it owes. The layer answers a ping by
/// itself, without the connection's bounded queue, and left unbounded it
/// kept every pong for a client that pings and never reads (25 MB for
/// 200,000 pings); at this bound a pong that does not fit replaces the one
/// waiting, and a frame of the gateway's own waits, as it does on a full
/// socket, until the queue's bound disconnects the client.
const WRITE_SLACK: usize = 2 * WRITE_BUFFER;

/// A refusal: its status and its body, a sentence that starts with its kind.
fn refused(status: StatusCode, kind: &str, message: &str) -> Response {
    (status, format!("{kind}: {message}\n")).into_response()
}

pub(crate) async fn upgrade(
    State(shared): State<Arc<Shared>>,
    slot: Option<Extension<Slot>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // Who was refused, for an operator to trace or block.
    let peer = peer.map(|Extension(Peer(p))| p);
    let peer = peer.as_deref().unwrap_or("unknown");
    if let Some(origin) = shared.origins.refused(&headers) {
        refused!(
            shared.refusals,
            Refusal::Origin,
            %peer,
            %origin,
            "refused an upgrade: its origin is not allowed"
        );
        return refused(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this origin is not allowed (see --allow-origin)",
        );
    }
    let principal = match auth::authenticate(shared.tokens.as_ref(), &headers) {
        Ok(principal) => principal,
        Err(why) => {
            refused!(
                shared.refusals,
                Refusal::Unauthenticated,
                %peer,
                reason = why.message(),
                "refused an upgrade: not authenticated"
            );
            let mut response = refused(StatusCode::UNAUTHORIZED, "unauthorized", why.message());
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    };
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let own = match shared.slots.of(&principal) {
        Ok(own) => own,
        Err(limit) => {
            refused!(
                shared.refusals,
                Refusal::PrincipalAtCapacity,
                %peer,
                %principal,
                limit,
                "refused an upgrade: the principal has its maximum of connections open"
            );
            return refused(
                StatusCode::TOO_MANY_REQUESTS,
                "over_capacity",
                &format!("{principal} has its {limit} connections open already"),
            );
        }
    };
    let max = shared.limits.max_message_bytes;
    let tracker = shared.connections.tracker.clone();
    let places = (slot.map(|Extension(slot)| slot), own);
    upgrade
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(max.saturating_add(WRITE_SLACK))
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| {
            tracker.track_future(async move {
                // Held until the connection ends.
                let _places = places;
                connection::serve(socket, shared, principal).await;
            })
        })
}
