//! A turn in flight, from the runtime to the clients: each persisted chunk
//! becomes a `turn.chunk` to every attached connection, the end a
//! `turn.ended`, and the reply joins the session's conversation.
//!
//! This is the one place that reads a [`Turn`]'s chunks and shapes them for
//! the wire.

use std::sync::Arc;

use axum::extract::ws::Utf8Bytes;
use futures_util::StreamExt;
use serde_json::{json, Value};
use settle_runtime::{Chunk, Outcome, SessionId, Turn, TurnError};
use settle_stream::{Message, Role};
use tokio::sync::OwnedMutexGuard;

use crate::parts::{self, Payload};
use crate::protocol::notification;
use crate::table::Entry;

/// A turn the runtime started, to be run by [`pump`].
pub(crate) struct Started {
    pub entry: Arc<Entry>,
    pub turn: Turn,
    pub conversation: OwnedMutexGuard<Vec<Message>>,
}

/// The `turn.chunk` notifications of chunk `seq`: one, or its parts when
/// it would not fit in `budget` bytes.
fn chunk_frames(
    id: SessionId,
    turn: u32,
    seq: u32,
    chunk: &Chunk,
    budget: usize,
) -> Vec<Utf8Bytes> {
    let json;
    let payload = match chunk.as_text() {
        Some(text) => Payload::Text(text),
        // A tool call, reasoning or usage: its kind and its JSON, as persisted.
        None => {
            json = chunk.to_json();
            Payload::Data {
                kind: chunk.kind().as_str(),
                json: &json,
            }
        }
    };
    parts::params(id, turn, seq, payload, budget)
        .into_iter()
        .map(|params| notification("turn.chunk", params).into())
        .collect()
}

/// The `turn.ended` notification.
fn ended_frame(id: SessionId, turn: u32, outcome: Outcome, error: Option<&TurnError>) -> Utf8Bytes {
    let error = error.map_or(
        Value::Null,
        |e| json!({ "kind": e.kind.as_str(), "message": e.message }),
    );
    notification(
        "turn.ended",
        json!({ "id": id.get(), "turn": turn, "outcome": outcome.as_str(), "error": error }),
    )
    .into()
}

/// Runs `turn` to its end. The turn goes on whoever watches: it is read to
/// its end even with no connection attached (dropping it would cancel it).
/// `conversation` is held until the end is delivered, and gets the reply
/// unless the turn failed (the prompt stays, as in `settle chat`).
pub(crate) async fn pump(
    entry: Arc<Entry>,
    mut turn: Turn,
    mut conversation: OwnedMutexGuard<Vec<Message>>,
    part_bytes: usize,
) {
    let id = entry.handle.id();
    let no = turn.work().no;
    let mut reply = String::new();
    // The chunks yielded are a prefix of the stored ones, in order: the
    // count so far is the store's `seq` of the next.
    let mut seq = 0u32;
    while let Some(chunk) = turn.next().await {
        let mut frames = chunk_frames(id, no, seq, &chunk, part_bytes);
        seq = seq.saturating_add(1);
        match frames.len() {
            1 => {
                if let Some(frame) = frames.pop() {
                    entry.notify(&frame);
                }
            }
            _ => entry.notify_parts(&frames.into()),
        }
        if let Some(text) = chunk.as_text() {
            reply.push_str(text);
        }
    }
    let (outcome, error) = turn.end().await;
    if error.is_none() && !reply.is_empty() {
        conversation.push(Message::new(Role::Assistant, reply));
    }
    entry.notify(&ended_frame(id, no, outcome, error.as_ref()));
    // Released only now: a session's end is announced after its turn's.
    drop(conversation);
}
