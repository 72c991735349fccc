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

use crate::excerpt::{bounded, MAX_MESSAGE_CHARS};
use crate::parts::{self, Payload};
use crate::protocol::{notification, ErrorKind};
use crate::table::Entry;

/// How many bytes of chunks the pump shapes and queues between two yields
/// to the runtime.
const YIELD_BYTES: usize = 64 * 1024;

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
fn ended_frame(id: SessionId, turn: u32, outcome: Outcome, error: Value) -> Utf8Bytes {
    notification(
        "turn.ended",
        json!({ "id": id.get(), "turn": turn, "outcome": outcome.as_str(), "error": error }),
    )
    .into()
}

/// The bounds a turn is delivered within.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The largest `turn.chunk`; a larger chunk goes in parts.
    pub part_bytes: usize,
    /// The most chunks a turn may stream before it is cancelled.
    pub max_chunks: usize,
    /// The most bytes of chunks a turn may stream before it is cancelled.
    pub max_bytes: usize,
}

/// Runs `turn` to its end. The turn goes on whoever watches: it is read to
/// its end even with no connection attached (dropping it would cancel it).
/// `conversation` is held until the end is delivered, and gets the reply
/// unless the turn failed (the prompt stays, as in `settle chat`). A turn
/// that streams more chunks or bytes than `bounds` allow is cancelled at
/// the chunk past them, which is not delivered; its `turn.ended` says
/// `too_large`, and its reply does not join the conversation.
pub(crate) async fn pump(
    entry: Arc<Entry>,
    mut turn: Turn,
    mut conversation: OwnedMutexGuard<Vec<Message>>,
    bounds: Bounds,
) {
    let id = entry.handle.id();
    let no = turn.work().no;
    let mut reply = String::new();
    // The chunks yielded are a prefix of the stored ones, in order: the
    // count so far is the store's `seq` of the next.
    let mut seq = 0u32;
    let mut bytes = 0usize;
    let mut over: Option<String> = None;
    let mut unyielded = 0usize;
    while let Some(chunk) = turn.next().await {
        if over.is_some() {
            continue; // Cancelled: read to its end, delivered no more.
        }
        // The payload as stored: a text chunk's text, another's JSON text.
        let size = chunk.payload().len();
        bytes = bytes.saturating_add(size);
        let count = usize::try_from(seq).unwrap_or(usize::MAX).saturating_add(1);
        if count > bounds.max_chunks || bytes > bounds.max_bytes {
            let why = format!(
                "turn {no} streamed more than a turn may ({} chunks or {} bytes); it was cancelled",
                bounds.max_chunks, bounds.max_bytes
            );
            tracing::warn!(session = %id, turn = no, "cancelled a turn: over the chunks or bytes a turn may stream");
            turn.cancel();
            over = Some(why);
            continue;
        }
        let mut frames = chunk_frames(id, no, seq, &chunk, bounds.part_bytes);
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
    let error = match (&over, error) {
        (Some(why), _) => json!({ "kind": ErrorKind::TooLarge.as_str(), "message": why }),
        // A provider's message may quote a whole response body: bounded,
        // so that the turn's end fits in a frame.
        (None, Some(e)) => json!({
            "kind": e.kind.as_str(),
            "message": bounded(&e.message, MAX_MESSAGE_CHARS),
        }),
        (None, None) => {
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
