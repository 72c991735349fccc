//! The store's threads end with it. Alone in its test binary: it counts the
//! process's threads, which other tests' stores would add to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use settle_store::Store;

/// The threads of this process whose names start with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|comm| comm.starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// A store dropped takes its threads with it: a program that opens a store
/// per job (a test suite, a Python kernel per task) does not grow a pool of
/// threads per store it ever opened.
#[test]
fn a_dropped_store_leaves_no_thread_behind() {
    let dir = tempfile::tempdir().unwrap();
    // A read pool's threads: r2d2's own, or the store's.
    let pool_threads = || threads_named("r2d2-worker-") + threads_named("settle-pool-");
    let before = pool_threads();
    for i in 0..4 {
        let path = dir.path().join(format!("s{i}.db"));
        let store = Store::open(path.to_str().unwrap()).unwrap();
        drop(store);
    }
    let mut left = pool_threads();
    for _ in 0..100 {
        if left <= before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        left = pool_threads();
    }
    assert!(
        left <= before,
        "{} pool threads left by 4 dropped stores",
        left - before
    );
}
