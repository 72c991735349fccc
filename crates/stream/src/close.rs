//! Closing a provider stream: the [`Close`] trait and the one best-effort
//! closer every path goes through (G4).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;

use crate::CloseError;

/// A provider stream that can be closed, releasing what it holds (an HTTP
/// connection, a subprocess, a gRPC call).
///
/// [`close_now`](Close::close_now) is required because it is what runs at
/// drop; a stream that can only close asynchronously returns
/// [`CloseError::AsyncOnly`] there and overrides [`close`](Close::close).
/// Closing twice must be harmless, but the wrappers of this crate never do it.
///
/// A stream that does not override `close` should say so with
/// [`close_waits`](Close::close_waits) returning `false`: the closers of this
/// crate then close it in place, without building a future for each layer
/// of wrappers around it.
#[async_trait]
pub trait Close: Send {
    /// Close, waiting for the provider to acknowledge where that takes time.
    async fn close(&mut self) -> Result<(), CloseError> {
        self.close_now()
    }

    /// Close without waiting, from synchronous code such as `drop`.
    fn close_now(&mut self) -> Result<(), CloseError>;

    /// Whether [`close`](Close::close) has anything to wait for now. `false`
    /// promises that it would do no more than [`close_now`](Close::close_now)
    /// (as the default `close` does), so a closer calls that instead. The
    /// default, `true`, is right for any stream that overrides `close`.
    fn close_waits(&self) -> bool {
        true
    }
}

#[async_trait]
impl<C: Close + ?Sized> Close for Box<C> {
    async fn close(&mut self) -> Result<(), CloseError> {
        (**self).close().await
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        (**self).close_now()
    }

    fn close_waits(&self) -> bool {
        (**self).close_waits()
    }
}

/// How long [`close_best_effort`] waits for a stream's async close before
/// giving up on it. A provider whose close never returns (a server that
/// never acknowledges, a subprocess that never exits) would otherwise keep
/// its stream, and the task closing it, for good. Past this bound the close
/// is dropped where it stands and logged; it is not tried again (G4: one
/// close), and the stream's owner drops the stream as after any close,
/// which releases what it holds (a connection is dropped, not shut down
/// politely). A close that acknowledges takes milliseconds.
pub const ASYNC_CLOSE_BOUND: Duration = Duration::from_secs(10);

/// Close `stream` and never fail: the async close (the sync one in place
/// when the stream says it has nothing to wait for), given up if it has not
/// returned within [`ASYNC_CLOSE_BOUND`], and what went wrong logged. A
/// close that fails or panics is the stream's one close all the same: it is
/// not tried again another way (G4; the stream's owner drops it after, which
/// releases what it holds).
///
/// This is the only closer the wrappers use, so every path logs the same way.
pub async fn close_best_effort<C: Close + ?Sized>(stream: &mut C) {
    if !stream.close_waits() {
        close_now_logged(stream);
        return;
    }
    let close = AssertUnwindSafe(stream.close()).catch_unwind();
    // The bound needs tokio's timer; a close polled elsewhere is awaited.
    let closed = match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::time::timeout(ASYNC_CLOSE_BOUND, close).await,
        Err(_) => Ok(close.await),
    };
    let error = match closed {
        Ok(Ok(Ok(()))) => return,
        Ok(Ok(Err(CloseError::AsyncOnly))) => {
            "it reported that only an async close works".to_owned()
        }
        Ok(Ok(Err(e))) => e.to_string(),
        Ok(Err(_)) => "its close panicked".to_owned(),
        Err(_) => {
            tracing::warn!(
                bound = ?ASYNC_CLOSE_BOUND,
                "async close of a provider stream did not return within its bound; \
                 it is given up and the stream dropped"
            );
            return;
        }
    };
    tracing::warn!(%error, "async close of a provider stream failed; the stream is dropped");
}

/// Close `stream` as [`close_best_effort`] does, but wait for it at most
/// `bound`: a close still running then goes on by itself on the runtime
/// (the stream is closed once, whenever its close returns, within
/// [`ASYNC_CLOSE_BOUND`]) and the caller goes on. What a work that ended on
/// its own (an idle timeout, an error, its end) waits for its stream's
/// close: at most the settle timeout (G5), as a cancelled work does before
/// it is detached. Without a runtime, or with a bound past
/// [`ASYNC_CLOSE_BOUND`], it is [`close_best_effort`].
pub async fn close_within<C: Close + 'static>(mut stream: C, bound: Duration) {
    if !stream.close_waits() {
        close_now_logged(&mut stream);
        return;
    }
    if bound >= ASYNC_CLOSE_BOUND || tokio::runtime::Handle::try_current().is_err() {
        close_best_effort(&mut stream).await;
        return;
    }
    let mut closing: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
        Box::pin(async move { close_best_effort(&mut stream).await });
    if tokio::time::timeout(bound, &mut closing).await.is_err() {
        tracing::debug!(
            ?bound,
            "a stream's close outlasted the settle timeout; it goes on by itself"
        );
        tokio::spawn(closing);
    }
}

/// Close `stream` from synchronous code (typically a `drop`) without blocking.
///
/// The sync close runs in place. A stream that can only close asynchronously
/// is moved onto the current tokio runtime, where [`close_best_effort`]
/// finishes it; without a runtime it is dropped and that is logged.
pub fn close_without_waiting<C: Close + 'static>(mut stream: C) {
    match catch_unwind(AssertUnwindSafe(|| stream.close_now())) {
        Ok(Ok(())) => {}
        Ok(Err(CloseError::AsyncOnly)) => match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { close_best_effort(&mut stream).await });
            }
            Err(_) => tracing::warn!(
                "a provider stream that closes only asynchronously was dropped outside a tokio \
                 runtime; it is dropped without its close"
            ),
        },
        Ok(Err(e)) => tracing::warn!(error = %e, "closing a provider stream failed"),
        Err(_) => tracing::warn!("closing a provider stream panicked"),
    }
}

/// Close `stream` in place and never fail: its sync close, logged if it
/// errs or panics.
pub(crate) fn close_now_logged<C: Close + ?Sized>(stream: &mut C) {
    match catch_unwind(AssertUnwindSafe(|| stream.close_now())) {
        Ok(Ok(())) => {}
        Ok(Err(CloseError::AsyncOnly)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "sync close of a provider stream failed"),
        Err(_) => tracing::warn!("sync close of a provider stream panicked"),
    }
}
