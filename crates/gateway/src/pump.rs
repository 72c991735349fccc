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
use settle_runtime::{Chunk, Outcome, SessionId, Turn};
use settle_stream::{Message, Role};
use tokio::sync::OwnedMutexGuard;

use crate::conversation::Conversation;
use crate::excerpt::{bounded, MAX_MESSAGE_CHARS};
use crate::parts::{self, Payload};
use crate::protocol::notification;
use crate::table::Entry;

/// How many bytes of chunks the pump shapes and queues between two yields
/// to the runtime.
const YIELD_BYTES: usize = 64 * 1024;

/// A turn the runtime started, to be run by [`pump`].
pub(crate) struct Started {
    pub entry: Arc<Entry>,
    pub turn: Turn,
    pub conversation: OwnedMutexGuard<Conversation>,
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
fn ended_frame(id: SessionId, turn: u32, outcome: Outcome, error: Value) -> Utf8Bytes {
    notification(
        "turn.ended",
        json!({ "id": id.get(), "turn": turn, "outcome": outcome.as_str(), "error": error }),
    )
    .into()
}

/// Runs `turn` to its end. The turn goes on whoever watches: it is read to
/// its end even with no connection attached (dropping it would cancel it).
/// `conversation` is held until the end is delivered, and gets the reply
/// unless the turn failed (the prompt stays, as in `settle chat`). A chunk
/// larger than `part_bytes` goes in parts. A turn past the kernel's limits
/// of a turn (`max_turn_chunks`, `max_turn_bytes`) ends `failed` with a
/// `too_large` error at the chunk past them, which the kernel neither
/// stores nor yields: what clients were sent is what the store has.
pub(crate) async fn pump(
    entry: Arc<Entry>,
    mut turn: Turn,
    mut conversation: OwnedMutexGuard<Conversation>,
    part_bytes: usize,
) {
    let id = entry.handle.id();
    let no = turn.work().no;
    let mut reply = String::new();
    // The chunks yielded are a prefix of the stored ones, in order: the
    // count so far is the store's `seq` of the next.
    let mut seq = 0u32;
    let mut unyielded = 0usize;
    while let Some(chunk) = turn.next().await {
        // The payload as stored: a text chunk's text, another's JSON text.
        let size = chunk.payload().len();
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
        // Chunks the turn has ready come without a wait, and the runtime's
        // own budget lets a task run a hundred of them before it yields: of
        // large chunks, seconds of work on a slow machine, while the
        // connections' writers this pump just woke wait on the same worker
        // (their queues fill, and a reading client is cut) and so does a
        // shutdown. So the pump yields once it has shaped a frame's worth.
        unyielded = unyielded.saturating_add(size);
        if unyielded >= YIELD_BYTES {
            unyielded = 0;
            tokio::task::yield_now().await;
        }
    }
    let (outcome, error) = turn.end().await;
    let error = match error {
        // A provider's message may quote a whole response body: bounded,
        // so that the turn's end fits in a frame.
        Some(e) => json!({
            "kind": e.kind.as_str(),
            "message": bounded(&e.message, MAX_MESSAGE_CHARS),
        }),
        None => {
            if !reply.is_empty() {
                conversation.push(Message::new(Role::Assistant, reply));
            }
            Value::Null
        }
    };
    entry.notify(&ended_frame(id, no, outcome, error));
    // Released only now: a session's end is announced after its turn's.
    drop(conversation);
}
