//! The scale rows (SPEC §9): a million idle sessions in one process.
//!
//! Memory: heap bytes per idle registered session in the core holding all of
//! them (the figure the target bounds), and, in the note, what the whole
//! runtime holds per session once the same number is registered through a
//! [`Kernel`] on a real SQLite store (core, driver records, shared session
//! state), counted by the global allocator, and the growth of the process's
//! resident set.
//!
//! Teardown: those sessions, all children of one root (a flat tree) and
//! idle (registered, no turn), on the real store (WAL); timed from the root's
//! `cancel(Immediate)` until its `finalized()` answered, which by G1 is after
//! every child's finalize is committed; the database file is read back after
//! (every row finalized), so a round that skipped any of it is an error.
//! Against the asyncio peer at the same size, flat ([`crate::peer`]); the
//! peer's tasks are mid-stream, ours idle: the peer has no idle shape.
//!
//! All of ours runs in a process of its own ([`process`]), so the counts
//! see only its sessions and the teardown starts from a fresh heap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use futures_util::future::try_join_all;
use settle_runtime::{CancelMode, Kernel};
use settle_store::Store;

use crate::{alloc, child, Result};

/// Registrations in flight at once while the tree is built.
const WAVE: usize = 10_000;

/// What the scale process measured.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Heap bytes per idle session in the core alone.
    pub core_bytes: f64,
    /// Heap bytes per idle session in a whole runtime.
    pub runtime_bytes: f64,
    /// Resident-set growth per session while the runtime registered them.
    pub rss_bytes: f64,
    /// The timed teardown.
    pub teardown: Duration,
}

/// The resident set of this process, in bytes, where the system tells it.
fn resident_bytes() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0)
}

/// The scale process: `n` idle sessions, counted and torn down.
pub fn process(n: usize) -> Result<Figures> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("scale.db");
    let path_str = path.to_str().ok_or("the temporary path is not UTF-8")?;
    let store = Store::open(path_str)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (kernel, root) = rt.block_on(async {
        let kernel = Kernel::builder(Arc::new(store))
            .idle_timeout(None)
            .idle_ttl(None)
            .lru_cap(None)
            .start()
            .await?;
        let root = kernel.register("root", None).await?;
        Ok::<_, crate::Error>((kernel, root))
    })?;
    let rss_before = resident_bytes();
    let root_id = root.id();
    let (registered, bytes) = alloc::net_bytes(|| {
        rt.block_on(async {
            let mut made = 1;
            while made < n {
                let to = n.min(made + WAVE);
                let wave = (made..to).map(|i| kernel.register(format!("agent-{i}"), Some(root_id)));
                // The handles go: the runtime keeps what a session needs.
                made += try_join_all(wave).await?.len();
            }
            Ok::<_, crate::Error>(made)
        })
    });
    let registered = registered?;
    let rss_after = resident_bytes();
    let rss_bytes = match (rss_before, rss_after) {
        (Some(before), Some(after)) => (after - before) / n as f64,
        _ => f64::NAN,
    };
    let teardown = rt.block_on(async {
        tokio::time::sleep(crate::teardown::SETTLE_PAUSE).await;
        let start = Instant::now();
        let _ = root.cancel(CancelMode::Immediate).await?;
        root.finalized().await?;
        let took = start.elapsed();
        let report = kernel.shutdown(Duration::ZERO).await;
        if report.store_failures > 0 {
            return Err(format!("{} store writes failed", report.store_failures).into());
        }
        Ok::<_, crate::Error>(took)
    })?;
    check(&path, registered)?;
    drop(kernel);
    drop(rt);
    // Last, so that the runtime's resident-set growth above starts from a
    // fresh heap rather than reusing what this count freed.
    let core_bytes = crate::core_bench::bytes_per_idle_session(n as u64)?;
    Ok(Figures {
        core_bytes,
        runtime_bytes: bytes as f64 / n.saturating_sub(1).max(1) as f64,
        rss_bytes,
        teardown,
    })
}

mod db {
    diesel::table! {
        sessions (id) {
            id -> BigInt,
            state -> Text,
        }
    }
}

/// Every one of the `n` session rows is finalized.
fn check(path: &std::path::Path, n: usize) -> Result<()> {
    let mut conn = crate::durable::read_back(path)?;
    let finalized: i64 = db::sessions::table
        .filter(db::sessions::state.eq("finalized"))
        .count()
        .get_result(&mut conn)?;
    if finalized != n as i64 {
        return Err(
            format!("scale: {finalized} of {n} sessions finalized after the teardown").into(),
        );
    }
    Ok(())
}

/// Runs [`process`] in a process of its own.
pub fn figures(n: usize) -> Result<Figures> {
    let n_arg = n.to_string();
    let words = child::figures(&["--scale-child", &n_arg], "scale")?;
    let parsed: Vec<f64> = words.iter().filter_map(|w| w.parse().ok()).collect();
    let [core_bytes, runtime_bytes, rss_bytes, teardown_ms] = parsed[..] else {
        return Err(format!("the scale process printed {words:?}").into());
    };
    Ok(Figures {
        core_bytes,
        runtime_bytes,
        rss_bytes,
        teardown: Duration::from_secs_f64(teardown_ms.max(0.0) / 1e3),
    })
}

/// The line [`figures`] reads back.
pub fn line(f: &Figures) -> String {
    format!(
        "{} {} {} {}",
        f.core_bytes,
        f.runtime_bytes,
        f.rss_bytes,
        f.teardown.as_secs_f64() * 1e3
    )
}
