//! Attaching a stream to a work's [`Scope`]: the stream ends when the scope
//! is cancelled, and a [`CloseHandle`] can close it from outside even while
//! the work that reads it is stuck.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, TryLockError};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::Stream;
use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::close::{close_best_effort, close_within, close_without_waiting, Close};
use crate::sync::{AtomicBool, AtomicWaker, Mutex, Ordering};
use crate::{CloseError, Guarded};

/// Why an attached stream ended before its provider ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The scope's cancellation token was cancelled.
    Cancelled,
    /// Its [`CloseHandle`] closed it.
    ForceClosed,
}

/// The cancellation scope of one work: its own cancellation token and the
/// handle that can close its stream from outside.
///
/// Create it before the stream exists: a stream attached to a scope that is
/// already cancelled (or closed) ends at its first poll, so a cancel that
/// lands before or while the stream is being opened still ends it.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    token: CancellationToken,
    handle: CloseHandle,
    /// How long a stream that ended on its own is waited for to close
    /// (`None`: [`ASYNC_CLOSE_BOUND`](crate::ASYNC_CLOSE_BOUND)).
    close_bound: Option<Duration>,
}

impl Scope {
    /// A scope of its own: only its own token cancels it.
    pub fn new() -> Self {
        Scope::default()
    }

    /// A scope under `parent`: cancelling `parent` cancels it too, and a
    /// child of a cancelled token is born cancelled.
    pub fn child_of(parent: &CancellationToken) -> Self {
        Scope {
            token: parent.child_token(),
            handle: CloseHandle::default(),
            close_bound: None,
        }
    }

    /// Waits for the close of a stream that ended on its own (its end, an
    /// error, an idle timeout) at most `bound`, the settle timeout of a
    /// runtime (G5): a close still running then goes on by itself
    /// ([`close_within`](crate::close_within)). A stream cut by a cancel or
    /// a force close is closed as before: its work is detached at the
    /// settle deadline by whoever cancelled it.
    pub fn with_close_bound(mut self, bound: Duration) -> Self {
        self.close_bound = Some(bound);
        self
    }

    /// How long a close of a stream that ended on its own is waited for
    /// (see [`with_close_bound`](Self::with_close_bound)).
    pub fn close_bound(&self) -> Duration {
        self.close_bound.unwrap_or(crate::ASYNC_CLOSE_BOUND)
    }

    /// The scope's token: cancelling it ends every stream attached here.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The handle that closes the streams attached here from outside.
    pub fn close_handle(&self) -> &CloseHandle {
        &self.handle
    }

    /// Attaches `stream` to this scope and guards it. The stream has not been
    /// polled yet, so it cannot produce before it is attached.
    ///
    /// If the handle has already closed the scope, `stream` is closed at
    /// once and the returned stream is empty.
    pub fn attach<S, T, E>(&self, stream: S) -> Guarded<Attached<S>, E>
    where
        S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
    {
        Guarded::new(
            self.handle
                .attach(stream, self.token.clone(), self.close_bound),
        )
    }
}

/// What [`CloseHandle::close`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceClosed {
    /// At least one attached stream was closed now.
    Closed,
    /// Nothing was open: the streams had already closed, or none was attached
    /// yet (a stream attached later is closed at once).
    NothingOpen,
    /// A stream was inside its own poll; it closes as soon as that poll
    /// returns.
    Requested,
}

/// Closes the streams of a [`Scope`] from outside, exactly once, without
/// waiting for the work that reads them. Cheap to clone.
#[derive(Clone, Default)]
pub struct CloseHandle {
    shared: Arc<HandleShared>,
}

#[derive(Default)]
struct HandleShared {
    state: std::sync::Mutex<HandleState>,
    // Woken by `close`, so a work still opening its stream can stop: a
    // `Notify` in the handle's own allocation (a cancellation token would
    // be one more allocation per work, and a lock on each clone and drop).
    closed: Notify,
}

#[derive(Default)]
struct HandleState {
    closed: bool,
    cut: Option<Cut>,
    slots: Vec<Arc<dyn ForceClose>>,
}

impl fmt::Debug for CloseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloseHandle")
            .field("closed", &self.is_closed())
            .finish()
    }
}

// A panic while holding one of these locks leaves the data consistent
// (every critical section is a take or a flag), so poison is ignored.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock_slot<S>(slot: &Slot<S>) -> impl std::ops::DerefMut<Target = Option<S>> + '_ {
    slot.stream.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CloseHandle {
    /// Closes every stream attached through this handle, now and in the
    /// future. Never blocks: a sync close runs here, an async-only close is
    /// handed to the tokio runtime, and a stream that is inside its own poll
    /// is closed by that poll when it returns.
    pub fn close(&self) -> ForceClosed {
        let slots = {
            let mut state = lock(&self.shared.state);
            state.closed = true;
            std::mem::take(&mut state.slots)
        };
        let mut result = ForceClosed::NothingOpen;
        for slot in slots {
            match slot.force_close() {
                ForceClosed::NothingOpen => {}
                ForceClosed::Requested => result = ForceClosed::Requested,
                ForceClosed::Closed if result == ForceClosed::NothingOpen => {
                    result = ForceClosed::Closed;
                }
                ForceClosed::Closed => {}
            }
        }
        self.shared.closed.notify_waiters();
        result
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).closed
    }

    /// Resolves once [`close`](Self::close) has been called: a work that is
    /// still opening its stream stops waiting for it.
    pub async fn closed(&self) {
        let mut notified = std::pin::pin!(self.shared.closed.notified());
        // Registered before the flag is read: a `close` after the read
        // wakes it, one before it is seen by the read.
        notified.as_mut().enable();
        if self.is_closed() {
            return;
        }
        notified.await;
    }

    /// Why the first stream attached through this handle that ended early
    /// did so; `None` while none has been cut short.
    pub fn cut(&self) -> Option<Cut> {
        lock(&self.shared.state).cut
    }

    fn record_cut(&self, cut: Cut) {
        lock(&self.shared.state).cut.get_or_insert(cut);
    }

    fn attach<S>(
        &self,
        stream: S,
        token: CancellationToken,
        close_bound: Option<Duration>,
    ) -> Attached<S>
    where
        S: Close + 'static,
    {
        let slot = Arc::new(Slot {
            stream: Mutex::new(Some(stream)),
            waker: AtomicWaker::new(),
            close_requested: AtomicBool::new(false),
        });
        let closed = {
            let mut state = lock(&self.shared.state);
            if !state.closed {
                state.slots.push(slot.clone());
            }
            state.closed
        };
        if closed {
            slot.force_close();
        }
        Attached {
            cancelled: Box::pin(token.clone().cancelled_owned()),
            token,
            slot,
            handle: self.clone(),
            cut: None,
            close_bound,
        }
    }
}

/// Where an attached stream lives, shared by its reader and its handle.
///
/// The protocol (model-checked with loom): the handle raises
/// `close_requested`, takes the stream if the lock is free and closes it,
/// then wakes the reader. The reader polls under the lock; when it has to
/// wait it registers its waker and only then re-reads the flag, so a close
/// that lands at any moment either is seen or wakes it.
struct Slot<S> {
    stream: Mutex<Option<S>>,
    waker: AtomicWaker,
    close_requested: AtomicBool,
}

trait ForceClose: Send + Sync {
    fn force_close(&self) -> ForceClosed;
}

impl<S: Close + 'static> ForceClose for Slot<S> {
    fn force_close(&self) -> ForceClosed {
        self.close_requested.store(true, Ordering::SeqCst);
        // Never block the caller: a reader inside its poll holds the lock and
        // closes the stream itself when that poll returns.
        let taken = match self.stream.try_lock() {
            Ok(mut stream) => Some(stream.take()),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner().take()),
            Err(TryLockError::WouldBlock) => None,
        };
        let result = match taken {
            Some(Some(stream)) => {
                close_without_waiting(stream);
                ForceClosed::Closed
            }
            Some(None) => ForceClosed::NothingOpen,
            None => ForceClosed::Requested,
        };
        self.waker.wake();
        result
    }
}

/// A stream attached to a [`Scope`]; see [`Scope::attach`].
///
/// It ends (yields `None`) when the scope is cancelled or its handle closes
/// it; [`cut`](Self::cut) says which. The stream lives behind a lock shared
/// with the handle, taken once per poll.
pub struct Attached<S> {
    token: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    slot: Arc<Slot<S>>,
    handle: CloseHandle,
    cut: Option<Cut>,
    /// See [`Scope::with_close_bound`].
    close_bound: Option<Duration>,
}

impl<S> fmt::Debug for Attached<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attached")
            .field("cancelled", &self.token.is_cancelled())
            .field("cut", &self.cut)
            .finish_non_exhaustive()
    }
}

impl<S> Attached<S> {
    /// Why the stream ended early, if it did.
    pub fn cut(&self) -> Option<Cut> {
        self.cut
    }

    fn end<T>(&mut self, cut: Cut) -> Poll<Option<T>> {
        self.cut = Some(cut);
        self.handle.record_cut(cut);
        Poll::Ready(None)
    }
}

impl<S> Stream for Attached<S>
where
    S: Stream + Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.cut.is_some() {
            return Poll::Ready(None);
        }
        // Cancellation wins over a ready item, so nothing is produced after a
        // cancel, including one that landed while the stream was attached.
        if this.token.is_cancelled() {
            return this.end(Cut::Cancelled);
        }
        let polled = {
            let mut stream = lock_slot(&this.slot);
            match stream.as_mut() {
                // The handle asked while a poll held the lock; the Guarded
                // around us closes the stream when it sees the end.
                Some(_) if this.slot.close_requested.load(Ordering::SeqCst) => None,
                Some(stream) => Some(Pin::new(stream).poll_next(cx)),
                None => None,
            }
        };
        match polled {
            None => this.end(Cut::ForceClosed),
            Some(Poll::Pending) => {
                crate::sync::register(&this.slot.waker, cx.waker());
                if this.slot.close_requested.load(Ordering::SeqCst) {
                    return this.end(Cut::ForceClosed);
                }
                if this.cancelled.poll_unpin(cx).is_ready() {
                    return this.end(Cut::Cancelled);
                }
                Poll::Pending
            }
            Some(ready) => ready,
        }
    }
}

#[async_trait]
impl<S> Close for Attached<S>
where
    S: Close + 'static,
{
    async fn close(&mut self) -> Result<(), CloseError> {
        let stream = lock_slot(&self.slot).take();
        match (stream, self.close_bound) {
            // Ended on its own: bounded as a settle is (G5).
            (Some(stream), Some(bound)) if self.cut.is_none() => {
                close_within(stream, bound).await;
            }
            (Some(mut stream), _) => close_best_effort(&mut stream).await,
            (None, _) => {}
        }
        Ok(())
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        let stream = lock_slot(&self.slot).take();
        if let Some(stream) = stream {
            close_without_waiting(stream);
        }
        Ok(())
    }

    /// A stream the handle already took has nothing left to wait for.
    fn close_waits(&self) -> bool {
        lock_slot(&self.slot)
            .as_ref()
            .is_some_and(Close::close_waits)
    }
}

/// Model-checks the force-close protocol of [`Slot`]. Run with
/// `RUSTFLAGS="--cfg settle_loom" cargo test -p settle-stream --lib --release loom`.
#[cfg(all(test, settle_loom))]
mod loom_tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicUsize;

    use futures_util::task::{waker, ArcWake};

    use super::*;

    struct Hung {
        closes: Arc<AtomicUsize>,
    }

    impl Stream for Hung {
        type Item = Result<(), ()>;

        fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Pending
        }
    }

    #[async_trait]
    impl Close for Hung {
        fn close_now(&mut self) -> Result<(), CloseError> {
            self.closes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    struct Woken(AtomicBool);

    impl ArcWake for Woken {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn loom_force_close_racing_a_poll_closes_once_and_never_loses_the_wakeup() {
        loom::model(|| {
            let closes = Arc::new(AtomicUsize::new(0));
            let handle = CloseHandle::default();
            let mut attached = handle.attach(
                Hung {
                    closes: closes.clone(),
                },
                CancellationToken::new(),
                None,
            );
            let woken = Arc::new(Woken(AtomicBool::new(false)));
            let waker = waker(woken.clone());
            let mut cx = Context::from_waker(&waker);

            let closer = handle.clone();
            let thread = loom::thread::spawn(move || closer.close());
            let first = Pin::new(&mut attached).poll_next(&mut cx);
            let forced = thread.join().unwrap();

            match first {
                Poll::Ready(None) => {}
                Poll::Pending => {
                    assert!(
                        woken.0.load(Ordering::SeqCst),
                        "the close did not wake the reader"
                    );
                    let second = Pin::new(&mut attached).poll_next(&mut cx);
                    assert!(matches!(second, Poll::Ready(None)));
                }
                Poll::Ready(Some(_)) => unreachable!("a hung stream yields nothing"),
            }
            assert_eq!(attached.cut(), Some(Cut::ForceClosed));
            // What the Guarded around it does once it has seen the end.
            attached.close_now().unwrap();
            assert_eq!(closes.load(std::sync::atomic::Ordering::SeqCst), 1);
            assert_ne!(forced, ForceClosed::NothingOpen);
        });
    }
}
