//! The store calls a kernel makes as it starts (registering its process,
//! recovering, reserving ids), each tried again while the store fails in a
//! way that may heal, within the store timeout from its first try: a
//! database locked by another process for a few seconds, or a server
//! restarting, delays a start instead of failing it. Each call is safe to
//! make twice: a second owner row would hold no session and its lease
//! would lapse, a recovery is idempotent, a block of ids lost is a gap.

use std::future::Future;
use std::time::Duration;

use settle_store::StoreError;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::error::RuntimeError;

/// Makes `call` until it succeeds, fails in a way that will not heal, or
/// `bound` from the first try is spent: then the store's last word, or a
/// [`RuntimeError::StoreTimeout`] naming `what` when it did not answer.
pub(crate) async fn at_start<T, F, Fut>(
    bound: Duration,
    what: &'static str,
    mut call: F,
) -> Result<T, RuntimeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + bound;
    let mut backoff = Backoff::new();
    loop {
        let error = match tokio::time::timeout_at(deadline, call()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) if error.may_heal() => error,
            Ok(Err(error)) => return Err(error.into()),
            Err(_) => {
                return Err(RuntimeError::StoreTimeout {
                    what,
                    after: bound,
                    writing: true,
                })
            }
        };
        let at = Instant::now() + backoff.next_wait();
        if at >= deadline {
            return Err(error.into());
        }
        tracing::warn!(%error, "{what}: the store failed; trying again");
        tokio::time::sleep_until(at).await;
    }
}
