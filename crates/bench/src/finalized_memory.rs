//! The `memory after finalize` row: a runtime that has registered and
//! finalized many sessions must hold nothing for them (issue 12's target:
//! about zero bytes per finalized session).
//!
//! A [`Kernel`] over the [`NullStore`] (which holds nothing per session, so
//! what is counted is the runtime's) on a current-thread tokio runtime, so
//! every allocation is this thread's. Sessions go through in waves of
//! [`WAVE`], all of a wave in flight at once: register, run one turn of one
//! chunk to its end, finish. The first half of the waves is a warm-up (maps,
//! heaps, channels and buffers reach their working size). Over the second
//! half the heap bytes live are read after every wave, counted by the global
//! allocator; the figure is the median of the waves' growths divided by the
//! sessions of a wave: what stays per finalized session. A table that grows
//! to its next power of two once (a one-time step, in one wave) does not
//! move the median, while anything kept per session grows every wave; the
//! total growth of the half, one-time steps included, is reported beside it.
//! At most one wave is live at a time, so a map that grew for a wave and kept
//! its capacity is not counted against the sessions.

use std::sync::Arc;

use futures_util::future::try_join_all;
use settle_runtime::{Kernel, TurnRequest};
use settle_stream::{Provider, ScriptedProvider, TurnScript};

use crate::alloc;
use crate::null_store::NullStore;
use crate::Result;

/// Sessions per wave.
pub const WAVE: usize = 1_000;

/// Every call the row makes on the runtime: one wave of `WAVE` sessions,
/// each registered, run through one turn of one chunk, and finished (which
/// answers once it is finalized).
async fn wave(runtime: &Kernel, wave: usize) -> Result<()> {
    let provider: Arc<dyn Provider> = Arc::new(ScriptedProvider::new(
        (0..WAVE).map(|_| TurnScript::new(["a chunk"])),
    ));
    let sessions = (0..WAVE).map(|i| {
        let provider = provider.clone();
        async move {
            let session = runtime.register(format!("wave-{wave}-{i}"), None).await?;
            let mut turn = session
                .run_turn(provider, TurnRequest::prompt("go"))
                .await?;
            while turn.next_chunk().await.is_some() {}
            let _ = turn.outcome().await;
            session.finish().await?;
            Ok::<_, crate::Error>(())
        }
    });
    try_join_all(sessions).await?;
    Ok(())
}

/// What stayed after the counted half of the waves.
#[derive(Debug, Clone, Copy)]
pub struct Stayed {
    /// The median growth of one wave, per session of a wave.
    pub per_session: f64,
    /// The growth of the whole counted half, one-time steps included.
    pub total: isize,
    /// The sessions of the counted half.
    pub counted: usize,
}

/// What stays per finalized session after `n` sessions (rounded up to whole
/// waves, the warm-up half not counted) went through a runtime.
pub fn bytes_per_finalized_session(n: usize) -> Result<Stayed> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let waves = n.div_ceil(WAVE).max(2);
    // The first half of the waves is the warm-up: the core's tables and
    // deadline heaps keep a capacity sized for the live sessions plus the
    // entries they let pile up before a compaction, which takes a few dozen
    // waves to reach (measured: about 650 KB in all, mostly reached between
    // 10,000 and 50,000 sessions; a step of a few hundred KB may still come
    // later, once).
    let warm = waves / 2;
    let runtime = rt.block_on(async {
        let store = Arc::new(NullStore::expecting(usize::MAX));
        let runtime = Kernel::builder(store)
            .idle_timeout(None)
            .idle_ttl(None)
            .lru_cap(None)
            .start()
            .await?;
        for w in 0..warm {
            wave(&runtime, w).await?;
        }
        Ok::<_, crate::Error>(runtime)
    })?;
    // Reserved before counting: pushing a mark allocates nothing.
    let mut marks: Vec<isize> = Vec::with_capacity(waves - warm + 1);
    let (done, total) = alloc::net_bytes(|| {
        rt.block_on(async {
            marks.push(alloc::live());
            for w in warm..waves {
                wave(&runtime, w).await?;
                marks.push(alloc::live());
            }
            Ok::<_, crate::Error>(())
        })
    });
    done?;
    rt.block_on(runtime.shutdown(std::time::Duration::ZERO));
    let mut growths: Vec<isize> = marks.windows(2).map(|w| w[1] - w[0]).collect();
    growths.sort_unstable();
    let median = growths.get(growths.len() / 2).copied().unwrap_or_default();
    Ok(Stayed {
        per_session: median as f64 / WAVE as f64,
        total,
        counted: (waves - warm) * WAVE,
    })
}
