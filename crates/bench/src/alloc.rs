//! A global allocator that forwards to mimalloc (the allocator the `settle`
//! binary ships with, so that the bench measures what users run; the system
//! allocator without the `mimalloc` feature) and, only while switched on,
//! adds up the bytes live, for the memory rows (heap bytes per idle session).
//!
//! Off, it costs one relaxed load per call, so the timed benches (whose
//! baselines allocate less than ours) are not skewed by the counting.
// A global allocator is an `unsafe impl`; this is the only unsafe code of the crate.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};

#[cfg(feature = "mimalloc")]
use mimalloc::MiMalloc as Inner;
#[cfg(not(feature = "mimalloc"))]
use std::alloc::System as Inner;

/// The allocator the run uses, as the report names it.
pub const NAME: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system allocator"
};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// The allocator of this binary.
pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

fn add(bytes: usize) {
    if ON.load(Ordering::Relaxed) {
        LIVE.fetch_add(bytes as isize, Ordering::Relaxed);
    }
}

fn sub(bytes: usize) {
    if ON.load(Ordering::Relaxed) {
        LIVE.fetch_sub(bytes as isize, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the inner allocator with the caller's arguments
// unchanged and returns what the inner allocator returned; the counters never affect the
// memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { Inner.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let p = unsafe { Inner.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; the caller upholds `dealloc`'s contract.
        unsafe { Inner.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        let p = unsafe { Inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size);
            sub(layout.size());
        }
        p
    }
}

/// Counts the net heap bytes allocated while `f` runs (allocations minus
/// frees, from any thread); run it while no other thread allocates.
pub fn net_bytes<T>(f: impl FnOnce() -> T) -> (T, isize) {
    LIVE.store(0, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    let value = f();
    ON.store(false, Ordering::SeqCst);
    (value, LIVE.load(Ordering::SeqCst))
}

/// The net heap bytes counted so far by the [`net_bytes`] call running now
/// (zero outside one). Reading it does not allocate.
pub fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}
