//! What committing memory at finalize holds on the heap for a long reply.
//! Alone in its test binary: it counts the process's heap through the
//! global allocator, which other tests' work would add to.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A global allocator is an `unsafe impl`: the only unsafe code of this test.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use settle_store::{
    Applied, EndReason, FinalizeRequest, Finalized, LifecycleWrite, NewSession, Outcome, OwnerInfo,
    SessionStore, Store,
};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

async fn apply(store: &dyn SessionStore, write: LifecycleWrite) -> Applied {
    store.apply(vec![write]).await.remove(0).unwrap()
}

/// Found from outside: a session whose one turn streamed a long reply in
/// small chunks (50 MB, as a model's tokens come) peaked at 4–5× the
/// reply's size on the heap when it was finalized: the memory commit
/// loaded every chunk's row (a `String` of a few bytes and its tuple, each
/// far larger than its text) before joining them. The reply is joined as
/// its rows are read: the commit holds about the reply, not its rows.
#[test]
fn g7_committing_a_long_reply_holds_about_the_reply_not_its_rows() {
    const CHUNKS: usize = 200_000;
    const CHUNK: &str = "tok "; // 4 bytes, as a model's token is
    let reply = CHUNKS * CHUNK.len();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peak.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Store::open(path.to_str().unwrap()).unwrap();
        let owner = store
            .register_owner(OwnerInfo::this_process(), Duration::from_secs(3600))
            .await
            .unwrap();
        let Applied::Registered(id) = apply(
            &store,
            LifecycleWrite::Register(NewSession::new("long", owner)),
        )
        .await
        else {
            panic!("not registered")
        };
        let at = SystemTime::now();
        let start = LifecycleWrite::StartTurn {
            session: id,
            no: 1,
            input: None,
            at,
        };
        assert!(matches!(apply(&store, start).await, Applied::Done));
        for piece in 0..CHUNKS / 1_000 {
            let receipts: Vec<_> = (0..1_000)
                .map(|_| store.append_chunk(id, 1, CHUNK.into()))
                .collect();
            for receipt in receipts {
                receipt
                    .await
                    .unwrap_or_else(|e| panic!("piece {piece}: {e}"));
            }
        }
        let end = LifecycleWrite::EndTurn {
            session: id,
            no: 1,
            outcome: Outcome::Completed,
            error: None,
            at,
        };
        assert!(matches!(apply(&store, end).await, Applied::Done));

        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let plan = FinalizeRequest::new(EndReason::Completed).commit_memory(true);
        let finalize = LifecycleWrite::Finalize { session: id, plan };
        let Applied::Finalized(Finalized::Won(report)) = apply(&store, finalize).await else {
            panic!("not finalized")
        };
        let peak = PEAK.load(Ordering::Relaxed) - before;
        assert_eq!(report.memories, 1);
        let memories = store.memories(id).await.unwrap();
        assert_eq!(memories[0].content.len(), reply);
        // The joined reply, its doubling growth and the insert's copy of it
        // (SQLite binds the text by copy): about 3× at most; the rows alone
        // (a 24-byte `String` and a 16-byte allocation for 4 bytes of text,
        // in a 32-byte tuple) peaked at 16×, the reply joined 2×.
        assert!(
            peak <= 4 * reply,
            "the commit of a {reply}-byte reply peaked at {peak} bytes on the heap ({:.1}×)",
            peak as f64 / reply as f64
        );
    });
}
