//! The chain of lifecycle batches a caller hands the writer one behind
//! another ([`SessionStore::apply_chained`](crate::SessionStore::apply_chained)):
//! once one fails in a way that may heal, those chained behind it are
//! refused with its failure, until a batch that is not chained starts the
//! chain again. Kept by the writer thread, which applies batches one at a
//! time in the order they were handed, so the order of the checks is the
//! order of the batches.

use std::sync::Mutex;

use crate::error::StoreError;

/// The failure that broke the chain, if any.
#[derive(Default)]
pub(crate) struct Chain {
    broken: Mutex<Option<StoreError>>,
}

impl Chain {
    /// Runs `apply` (one batch's transaction) unless `chained` and the
    /// chain is broken, in which case that failure is its answer. A batch
    /// that is not chained starts the chain again; one whose transaction
    /// failed in a way that may heal breaks it.
    pub(crate) fn run<T>(
        &self,
        chained: bool,
        apply: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // Only the writer thread takes it, one batch at a time: a poisoned
        // lock (a panic in an earlier batch) still holds a usable value.
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        match (chained, broken.as_ref()) {
            (true, Some(failure)) => return Err(failure.clone()),
            (false, Some(_)) => *broken = None,
            _ => {}
        }
        let result = apply();
        if let Err(failure) = &result {
            if failure.may_heal() {
                *broken = Some(failure.clone());
            }
        }
        result
    }
}
