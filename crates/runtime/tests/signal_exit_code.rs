//! `shutdown_on_signals` as the README uses it keeps the exit code: the
//! first signal starts the shutdown and is remembered, so the program exits
//! 143 after SIGTERM (its own test binary: the handlers are process-wide).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use settle_runtime::signals::{self, ShutdownSignal};
use settle_runtime::Kernel;
use settle_store::MemoryStore;

#[tokio::test]
async fn the_first_signal_is_kept_for_the_exit_code() {
    let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
        .start()
        .await
        .unwrap();
    let first =
        tokio::spawn(signals::shutdown_on_signals(&kernel, Duration::from_secs(1)).unwrap());
    assert_eq!(signals::received(), None);
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, ShutdownSignal::Terminate);
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        kernel.shutdown(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    assert_eq!(report.store_failures, 0);
    assert_eq!(
        signals::received().map(ShutdownSignal::exit_code),
        Some(143)
    );
}
