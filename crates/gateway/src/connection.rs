//! One WebSocket connection: a transport for every session it attaches to.
//!
//! Its task carries out requests one at a time and answers them in order;
//! while one is carried out (it may wait on the store) the socket is still
//! read, so that pings are answered and pongs heard, and the requests read
//! meanwhile wait their turn (see [`ReadAhead`]). A writer task sends what
//! its [`Outbox`] queues. When the connection ends, however
//! it ends (the client closed it or vanished, its queue overflowed, the
//! gateway closed it), it detaches all its transports at once; what happens
//! to the sessions then (the orphan reap after the grace, the
//! transport-closed reclaim) is the kernel's decision.
//!
//! A keepalive ping goes out every interval; a client that has sent nothing
//! (not even the pong its WebSocket library answers with) for two intervals
//! while its socket was read is taken for gone: a half-open connection
//! detaches like a closed one. A
//! connection attached to no session (a finalized session leaves it) that
//! sends no request for the connection idle timeout is closed; either way
//! the client is told why in a closing frame, if it still reads. One that
//! sends requests faster than its rate is answered `rate_limited` for the
//! excess, and its notifications over the rate are dropped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use settle_runtime::{RuntimeError, SessionId};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::auth::Principal;
use crate::closing::Closing;
use crate::connections::Connections;
use crate::methods::{self, Caller};
use crate::outbox::{self, Frame, Inbox, Outbox};
use crate::protocol::{self, code, ErrorKind, RpcError};
use crate::rate::Bucket;
use crate::read_ahead::ReadAhead;
use crate::shared::Shared;
use crate::table::ConnId;

/// How many queued frames the writer sends before it flushes.
const WRITE_BATCH: usize = 64;

/// How long a connection the gateway ends waits for its closing frame to be
/// sent before its socket is cut anyway.
const CLOSING_BOUND: Duration = Duration::from_secs(1);

/// Serves one upgraded connection, speaking for `principal`, until it ends.
pub(crate) async fn serve(socket: WebSocket, shared: Arc<Shared>, principal: Principal) {
    let (outbox, inbox) = outbox::channel(shared.limits.queue());
    let (sink, mut stream) = socket.split();
    let mut writer = tokio::spawn(write(sink, inbox));
    let conn = shared.connections.join(&outbox);
    tracing::debug!(conn = conn.0, %principal, "connected");
    let mut attached = HashSet::new();
    let keepalive = shared.limits.keepalive;
    let mut ticks = keepalive.map(|every| {
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks
    });
    let mut heard = Instant::now();
    let idle_after = shared.limits.connection_idle;
    // What the idle timeout counts from: the last request, or the end of
    // the last session the connection was attached to, whichever is later.
    let mut idle_since = Instant::now();
    // Re-armed only when it fires early (a request came meanwhile, or a
    // session is attached), never per request.
    let idle = tokio::time::sleep(idle_after.unwrap_or_default());
    let mut idle = std::pin::pin!(idle);
    let mut bucket = shared
        .limits
        .requests_per_second
        .map(|rate| Bucket::new(rate, Instant::now()));
    // Whether the last request was refused: one log line per run of them.
    let mut limited = false;
    // Whether a closing frame saying why the gateway ends it was queued.
    let mut closing_sent = false;
    // What was read while a request was carried out, to be carried out next.
    let mut ahead = ReadAhead::new(shared.limits.read_ahead());
    'serve: loop {
        let frame = tokio::select! {
            biased;
            () = outbox.is_cut() => break,
            // The gateway closes: after the answer to the last request.
            () = outbox.asked_to_close() => {
                closing_sent = outbox.push(Frame::Close(Closing::going_away()));
                break;
            }
            () = tick(&mut ticks) => {
                if let Some(closing) = beat(keepalive, &mut heard, ahead.reads(), &outbox) {
                    tracing::warn!(conn = conn.0, %principal, "closed a connection: no word from the client for two keepalive intervals");
                    closing_sent = outbox.push(Frame::Close(closing));
                    break;
                }
                continue;
            }
            () = idle.as_mut(), if idle_after.is_some() => {
                let after = idle_after.unwrap_or_default();
                if attached.is_empty() && idle_since.elapsed() >= after {
                    tracing::warn!(conn = conn.0, %principal, ?after, "closed a connection: attached to no session and no request for the connection idle timeout");
                    closing_sent = outbox.push(Frame::Close(Closing::idle(after)));
                    break;
                }
                let from = if attached.is_empty() { idle_since } else { Instant::now() };
                idle.as_mut().reset(from + after);
                continue;
            }
            ended = outbox.finalized_since() => {
                let was_attached = !attached.is_empty();
                for id in ended {
                    attached.remove(&id);
                }
                // A finalized session keeps nobody attached: from its end,
                // a connection left with none is idle (the timer, armed
                // while it was attached, fires by then and re-arms).
                if was_attached && attached.is_empty() {
                    idle_since = Instant::now();
                }
                continue;
            }
            // What was read while the last request was carried out comes
            // first, in the order it was read.
            () = std::future::ready(()), if ahead.has_kept() => ahead.take().unwrap_or(None),
            frame = stream.next(), if ahead.reads() => {
                heard = Instant::now();
                frame
            }
        };
        match frame {
            Some(Ok(Message::Text(text))) => {
                let now = Instant::now();
                idle_since = now;
                if let Some(bucket) = bucket.as_mut() {
                    if !bucket.take(now) {
                        if !limited {
                            tracing::warn!(conn = conn.0, %principal, "refused requests: over the connection's rate");
                        }
                        limited = true;
                        refuse_rate(&outbox, text.as_str(), bucket, conn);
                        continue;
                    }
                }
                limited = false;
                let mut caller = Caller {
                    conn,
                    principal: &principal,
                    outbox: &outbox,
                    attached: &mut attached,
                };
                let request = handle(&shared, &mut caller, text.as_str());
                let mut request = std::pin::pin!(request);
                loop {
                    tokio::select! {
                        biased;
                        // A request in flight (a read the store does not
                        // answer) does not keep a connection past its cut:
                        // at the closing bound of a shutdown it ends like
                        // any other (G9), its request dropped unanswered.
                        () = outbox.is_cut() => break 'serve,
                        () = request.as_mut() => break,
                        // The keepalive goes on while the request waits: a
                        // client that answers its pings is not taken for
                        // gone, one that does not is (its request dropped
                        // unanswered, as at a cut).
                        () = tick(&mut ticks) => {
                            if let Some(closing) = beat(keepalive, &mut heard, ahead.reads(), &outbox) {
                                tracing::warn!(conn = conn.0, %principal, "closed a connection: no word from the client for two keepalive intervals");
                                closing_sent = outbox.push(Frame::Close(closing));
                                break 'serve;
                            }
                        }
                        // Read meanwhile: the WebSocket layer answers a
                        // ping as it reads it, and any frame is a word
                        // from the client; a request waits its turn.
                        read = stream.next(), if ahead.reads() => {
                            heard = Instant::now();
                            ahead.keep(read);
                        }
                    }
                }
            }
            Some(Ok(Message::Binary(_))) => {
                let error = RpcError::new(
                    code::INVALID_REQUEST,
                    ErrorKind::BadRequest,
                    "binary frames are not read: send each request as one text frame",
                );
                outbox.text(protocol::error(&serde_json::Value::Null, &error));
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Err(error)) => {
                let limit = shared.limits.max_message_bytes;
                if let Some(closing) = Closing::for_unreadable(error, limit) {
                    tracing::warn!(conn = conn.0, %principal, code = closing.code(), why = closing.reason(), "closed a connection: its message could not be read");
                    closing_sent = outbox.push(Frame::Close(closing));
                }
                break;
            }
            // A closing frame is answered with one (RFC 6455 §5.5.1): the
            // WebSocket layer has queued the answer (the code echoed, 1002
            // for one a client may not send), and the writer's close writes
            // it out before the connection goes.
            Some(Ok(Message::Close(_))) => {
                closing_sent = outbox.push(Frame::Close(Closing::answer()));
                break;
            }
            None => break,
        }
    }
    shared.connections.leave(conn);
    // A dropped connection detaches all its transports at once.
    for id in attached {
        detach(&shared, conn, id).await;
    }
    // A closing frame owed is sent, within a bound, before the socket goes.
    let written = closing_sent
        && tokio::time::timeout(CLOSING_BOUND, &mut writer)
            .await
            .is_ok();
    outbox.cut();
    if !written {
        let _ = writer.await;
    }
    tracing::debug!(conn = conn.0, "disconnected");
}

/// Answers a request over the connection's rate `rate_limited`, without
/// carrying it out. A notification over the rate is dropped unanswered: a
/// notification is never answered, and an error to a null id would reach
/// a client that matches answers by id as an answer to nothing.
fn refuse_rate(outbox: &Outbox, text: &str, bucket: &Bucket, conn: ConnId) {
    let id = match protocol::parse(text) {
        Ok(protocol::Incoming { id: Some(id), .. }) => id,
        Ok(protocol::Incoming {
            id: None, method, ..
        }) => {
            tracing::debug!(conn = conn.0, %method, "dropped a notification over the connection's rate");
            return;
        }
        // Unreadable, yet its id may have been read: the answer goes to it.
        Err((answer_to, _)) => answer_to,
    };
    let retry = bucket.retry_after();
    let error = RpcError::new(
        code::RATE_LIMITED,
        ErrorKind::RateLimited,
        format!(
            "too many requests on this connection; send it again in {} ms",
            retry.as_millis().max(1)
        ),
    );
    outbox.text(protocol::error(&id, &error));
}

async fn detach(shared: &Shared, conn: ConnId, id: SessionId) {
    if let Some(entry) = shared.table.get(id) {
        entry.unwatch(conn);
        match entry.handle.detach_transport().await {
            // The kernel is done with every session: nothing to detach from.
            Ok(_) | Err(RuntimeError::Stopped) => {}
            Err(error) => tracing::warn!(session = %id, %error, "could not detach a transport"),
        }
    }
}

/// What the keepalive does at a tick: pings the client, or, when nothing
/// was heard from it for two intervals, gives the closing frame that says
/// so (told why, if it still reads; a half-open socket is cut at the
/// closing bound like any other). While its socket is not `reading` (its
/// read-ahead is full, or it ended) the client cannot be heard: its silence
/// is not its own, and counts from when reading goes on.
fn beat(
    keepalive: Option<Duration>,
    heard: &mut Instant,
    reading: bool,
    outbox: &Outbox,
) -> Option<Closing> {
    let every = keepalive?;
    if !reading {
        *heard = Instant::now();
        return None;
    }
    if heard.elapsed() > every.saturating_mul(2) {
        return Some(Closing::silent(every));
    }
    outbox.push(Frame::Ping);
    None
}

async fn tick(ticks: &mut Option<Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Answers one text frame.
async fn handle(shared: &Arc<Shared>, caller: &mut Caller<'_>, text: &str) {
    let incoming = match protocol::parse(text) {
        Ok(incoming) => incoming,
        Err((id, error)) => {
            caller.outbox.text(protocol::error(&id, &error));
            return;
        }
    };
    // Boxed: an idle connection's task does not carry the largest method's
    // state with it, only what a call needs while it runs.
    let answer = Box::pin(methods::call(
        shared,
        caller,
        &incoming.method,
        incoming.params,
    ))
    .await;
    match (incoming.id, answer) {
        (Some(id), Ok(answer)) => {
            caller.outbox.text(protocol::result(&id, answer.result));
            if let Some(then) = answer.then {
                caller.outbox.text(then);
            }
            if let Some(started) = answer.started {
                shared.run(started);
            }
        }
        (None, Ok(answer)) => {
            if let Some(then) = answer.then {
                caller.outbox.text(then);
            }
            if let Some(started) = answer.started {
                shared.run(started);
            }
        }
        (Some(id), Err(error)) => {
            caller.outbox.text(protocol::error(&id, &error));
        }
        (None, Err(error)) => {
            tracing::debug!(method = %incoming.method, %error.message, "a notification failed");
        }
    }
}

/// Sends what the outbox queues until the connection is cut or closed.
async fn write(mut sink: SplitSink<WebSocket, Message>, mut inbox: Inbox) {
    let cut = inbox.cut_token();
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    loop {
        let more = tokio::select! {
            biased;
            () = cut.cancelled() => return,
            more = inbox.next_batch(&mut batch, WRITE_BATCH) => more,
        };
        if more.is_none() {
            return;
        }
        let sent = send(&mut sink, &mut batch);
        let sent = tokio::select! {
            biased;
            () = cut.cancelled() => return,
            sent = sent => sent,
        };
        match sent {
            Sent::Open => {}
            Sent::Closed => return,
            Sent::Failed => {
                // The socket takes no more: the client went away, or it reads
                // nothing and its write buffer is full (of the pongs a ping
                // flood is owed). The connection ends with its writer.
                tracing::debug!("a connection's write failed: it ends");
                cut.cancel();
                return;
            }
        }
    }
}

/// What became of a batch.
enum Sent {
    /// Sent; the connection goes on.
    Open,
    /// A closing frame was sent.
    Closed,
    /// The socket failed.
    Failed,
}

/// Sends `batch`.
async fn send(sink: &mut SplitSink<WebSocket, Message>, batch: &mut Vec<Frame>) -> Sent {
    for frame in batch.drain(..) {
        let message = match frame {
            Frame::Text(text) => Message::Text(text),
            Frame::Parts(parts) => {
                // Flushed part by part: a socket's buffer takes one at a time.
                for part in parts.iter() {
                    if sink.send(Message::Text(part.clone())).await.is_err() {
                        return Sent::Failed;
                    }
                }
                continue;
            }
            Frame::Ping => Message::Ping(Default::default()),
            Frame::Close(closing) => {
                // After the client's closing frame the send is refused (the
                // handshake's answer is queued already): the flush writes it.
                let _ = sink.send(Message::Close(Some(closing.frame()))).await;
                let _ = sink.flush().await;
                return Sent::Closed;
            }
        };
        if sink.feed(message).await.is_err() {
            return Sent::Failed;
        }
    }
    match sink.flush().await {
        Ok(()) => Sent::Open,
        Err(_) => Sent::Failed,
    }
}

/// Waits at most `bound` for every connection to end, then cuts the rest
/// and waits for them at most `bound` more: a connection's task stuck
/// where it does not see its cut is left behind (dropped with the
/// runtime), not waited for, so the gateway's exit keeps its bound (G9).
pub(crate) async fn close_all(connections: &Connections, bound: Duration) {
    connections.close_all();
    connections.tracker.close();
    if tokio::time::timeout(bound, connections.tracker.wait())
        .await
        .is_err()
    {
        connections.cut_all();
        wait_at_most(&connections.tracker, bound, "connections").await;
    }
}

/// Waits at most `bound` for the tasks of `tracker` to end; the ones left
/// (stuck where they do not see their cut) are said in a warning and left
/// behind, dropped with the runtime, so that the gateway's exit keeps its
/// bound (G9).
pub(crate) async fn wait_at_most(
    tracker: &tokio_util::task::TaskTracker,
    bound: Duration,
    what: &str,
) {
    if tokio::time::timeout(bound, tracker.wait()).await.is_err() {
        tracing::warn!(
            left = tracker.len(),
            "{what} did not end when cut; the gateway stops without them"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// G9: a connection's task that never ends, cut or not, does not hold
    /// the close past twice its bound.
    #[tokio::test(start_paused = true)]
    async fn g9_a_connection_that_never_ends_does_not_hold_the_close_past_its_bound() {
        let connections = Connections::default();
        connections.tracker.spawn(std::future::pending::<()>());
        let bound = Duration::from_secs(1);
        let started = tokio::time::Instant::now();
        close_all(&connections, bound).await;
        assert_eq!(started.elapsed(), 2 * bound);
    }
}
