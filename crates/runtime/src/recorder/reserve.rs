//! Session ids reserved for the driver beside the lifecycle writes, not
//! behind them: a reservation touches only the store's id counter, so
//! nothing decided before it has to be committed first. Made a barrier, it
//! would hold the registrations that already have their ids (and the
//! driver's, parked waiting for more) behind a commit and a store round
//! trip of its own, every block of a burst.

use settle_store::StoreError;

use super::unwritten::Unwritten;
use super::Recorder;
use crate::command::Ack;

impl Recorder {
    /// Reserves `count` session ids on a task of its own, bounded as every
    /// store call of the recorder is, and hands the driver the block (or
    /// the failure) when the store answers. The driver asks for one block
    /// at a time.
    pub(super) fn reserve_ids(&mut self, count: u32) {
        let store = self.store.clone();
        let call = self.bounded(async move { store.reserve_ids(count).await });
        let acks = self.acks.clone();
        let task = tokio::spawn(async move {
            let ack = match call.await {
                Ok(range) => Ack::Ids(range),
                Err(Unwritten::Failed(error)) => Ack::IdsFailed(
                    std::sync::Arc::try_unwrap(error).unwrap_or(StoreError::Unavailable),
                ),
                Err(Unwritten::TimedOut(_)) => Ack::IdsFailed(StoreError::Unavailable),
            };
            let _ = acks.send(ack);
        });
        if let Some(before) = self.reserving.replace(task) {
            // Not expected (one block at a time); the earlier one still
            // answers the driver, it is only not waited for at the end.
            drop(before);
        }
    }

    /// Waits for a reservation still in flight as the recorder ends (it is
    /// bounded), so that nothing of the kernel uses the store after it.
    pub(super) async fn reserved(&mut self) {
        if let Some(task) = self.reserving.take() {
            let _ = task.await;
        }
    }
}
