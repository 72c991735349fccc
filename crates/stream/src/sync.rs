//! The primitives of the force-close protocol in `attach.rs`, swapped for
//! loom's in the tests built with `--cfg settle_loom`, so that protocol can
//! be model-checked.

#[cfg(all(test, settle_loom))]
pub(crate) use loom::future::AtomicWaker;
#[cfg(all(test, settle_loom))]
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(all(test, settle_loom))]
pub(crate) use loom::sync::Mutex;

#[cfg(not(all(test, settle_loom)))]
pub(crate) use futures_util::task::AtomicWaker;
#[cfg(not(all(test, settle_loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(all(test, settle_loom)))]
pub(crate) use std::sync::Mutex;

/// Registers a waker with either crate's `AtomicWaker`.
pub(crate) fn register(atomic: &AtomicWaker, waker: &std::task::Waker) {
    #[cfg(all(test, settle_loom))]
    atomic.register_by_ref(waker);
    #[cfg(not(all(test, settle_loom)))]
    atomic.register(waker);
}
