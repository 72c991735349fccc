//! `settle-python`: the `settle` Python package, bindings of
//! [`settle_runtime`] for asyncio programs (SPEC §11).
//!
//! A Python program keeps its own model client, tools and loop, and puts
//! them under the kernel: it registers sessions in a tree, runs turns over
//! its own async iterators (the `openai` package's stream, an async
//! generator) and spawns its coroutines under a session's lifecycle, with
//! every guarantee of the runtime kept. A turn gives back its reply put
//! together (`turn.tool_calls()`, `turn.reply()`, `reply.rs`), and a
//! finalized session's conversation continues in a new one
//! (`kernel.resume()`, `resume.rs`).
//!
//! ```python
//! import settle
//!
//! async def main():
//!     async with await settle.Kernel.open("settle.db") as kernel:
//!         kernel.install_signal_handlers()
//!         root = await kernel.register("root")
//!         recon = await root.child("recon")
//!         async with await recon.turn(lambda: model_stream(), input="look around") as turn:
//!             async for chunk in turn:
//!                 print(chunk.text or "", end="")
//!         print(turn.outcome)
//!         await root.finish()      # recon is finalized first (G1)
//! ```
//!
//! The package is built by maturin (`pip install ./crates/python`); this
//! crate is its native module, `settle._settle`, and `python/settle` its
//! Python half.
//!
//! # The bridge, and why it is not pyo3-async-runtimes
//!
//! The runtime runs on its own threads (a tokio runtime made once per
//! process, `process.rs`); the GIL is never held while the kernel or the
//! store is waited on. Every kernel call returns an `asyncio.Future` made on
//! the caller's loop. What the kernel has for a loop (a call's result, a
//! pump or a task to start or cancel) is posted to that loop's mailbox and
//! run by the loop's own thread, in batches: only the first post to an idle
//! mailbox wakes the loop (one `call_soon_threadsafe`, made by the one
//! deliverer thread that takes the GIL on the kernel's behalf), and a drain
//! that finds more schedules itself again from the loop. The other way,
//! what the loop's pumps report (a stream closed) is handed to the kernel
//! once per iteration of the loop, not once per pump (`awaitable.rs`,
//! `deliver.rs`). A subtree torn down at once costs its loop a handful of
//! wakes, not one per session. A turn's read whose chunk is already
//! persisted and waiting makes no round trip at all (`ready.rs`).
//!
//! It is granian's approach, a future of our own whose `cancel()` reaches
//! Rust, rather than pyo3-async-runtimes' `future_into_py`, for what that
//! crate's tracker records: a tokio task keeps running when its asyncio
//! future is garbage-collected (pyo3-async-runtimes issue 64), which here
//! would leave a turn streaming and spending after its awaitable was
//! dropped; and a cancel that lands while the loop closes raises
//! `RuntimeError: Event loop is closed` from the completion (its issue 90),
//! which a kernel finishing turns at interpreter exit would hit. Here the
//! Rust side holds only a weak reference to the future, the future holds a
//! done callback whose drop cancels the Rust side, and a completion for a
//! closed loop is dropped. A cancel either drops the Rust future or, for a
//! call that must finish to be safe (a turn's start), lets it finish and
//! drops what it made (which cancels it).
//!
//! # What runs where
//!
//! - A turn's source is opened and iterated by a pump task on the caller's
//!   loop (`provider.rs`, `settle/_bridge.py`), which the kernel cancels to
//!   close it; the pump's `finally` closes the stream once (G4).
//! - A spawned coroutine runs as an asyncio task on the caller's loop
//!   (`task.rs`); the kernel cancels it with `Task.cancel()` there, detaches
//!   it at the settle deadline (G5), and its later writes raise
//!   `SessionClosed` (G10). A coroutine closed under its task (its
//!   `close()` called as it waits) is noticed by its loop, which looks
//!   twice a second while settle tasks run there: the task ends `failed`.
//! - A loop's end cancels the pumps and coroutines still pending on it and
//!   waits for them (bounded by the settle timeout), each stream closed on
//!   it, before it closes any async generator or closes: the package wraps
//!   the loop's `shutdown_asyncgens` and `close` while work runs there
//!   (`_OnLoop` in `settle/_bridge.py`), so a loop closed by hand without
//!   `shutdown_asyncgens()` gets the same. A loop that cannot be wrapped
//!   (its type's instances have no `__dict__`) and is closed without it
//!   leaves their pumps and coroutines pending for good; the deliverer
//!   finds such a loop closed within about a second and ends what it left
//!   as cancelled, so the sessions go idle (`stranded.rs`).
//! - A forked child that touches its parent's objects gets `settle.Error`
//!   (`process.rs`); interpreter exit shuts every kernel down, each within
//!   its own bound (drain + settle timeout + flush budget), and says on
//!   stderr how many sessions a stalled store left for `settle recover`
//!   (`kernel.rs`, registered with `atexit` by the package).

mod args;
mod awaitable;
mod budget;
mod chunk;
mod convert;
mod deliver;
mod errors;
mod handover;
mod kernel;
mod let_go;
mod log_lines;
mod other_sqlite;
mod process;
mod provider;
mod reads;
mod ready;
mod registered;
mod reply;
mod resume;
mod secrets;
mod session;
mod signals;
mod split_surrogates;
mod stranded;
mod task;
mod task_end;
mod ties;
mod turn;
mod unclaimed;

use pyo3::prelude::*;

/// The allocator of the Rust side (as the `settle` binary's): a teardown
/// frees on the kernel's threads blocks made on others, which glibc's
/// malloc pays for. Python's objects keep Python's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The native module, `settle._settle`.
#[pymodule]
fn _settle(module: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(module)?;
    module.add("DEFAULT_IDLE_TIMEOUT", kernel::DEFAULT_IDLE_SECONDS)?;
    // A benchmark of a debug build measures the wrong thing: the scripts in
    // `bench/` refuse one (the workspace's test harness installs one).
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    module.add("BUILD_PROFILE", profile)?;
    module.add_class::<kernel::PyKernel>()?;
    module.add_class::<session::PySession>()?;
    module.add_class::<turn::PyTurn>()?;
    module.add_class::<resume::PyResumed>()?;
    module.add_class::<task::PyTask>()?;
    module.add_class::<chunk::PyChunk>()?;
    module.add_class::<budget::PyBudget>()?;
    module.add_function(wrap_pyfunction!(kernel::shutdown_all, module)?)?;
    // Private: set, not added to `__all__`.
    module.setattr(
        "_next_log_line",
        wrap_pyfunction!(log_lines::_next_log_line, module)?,
    )?;
    log_lines::install();
    Ok(())
}
