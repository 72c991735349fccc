//! A program that installs the kernel's signal handlers, shuts the kernel
//! down, and then hangs: what a frontend stuck after its shutdown looks
//! like. A SIGINT or SIGTERM must still end it (the lifecycle test
//! `signals_get_their_default_action_once_the_kernel_stopped` runs it).

use std::sync::Arc;
use std::time::Duration;

use settle_runtime::{signals, Kernel};
use settle_store::MemoryStore;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
        .start()
        .await?;
    let _first = signals::shutdown_on_signals(&kernel, Duration::from_secs(1))?;
    let _ = kernel.register("idle", None).await?;
    kernel.shutdown(Duration::ZERO).await;
    println!("stopped");
    std::future::pending::<()>().await;
    Ok(())
}
