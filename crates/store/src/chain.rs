//! The chains of lifecycle batches a caller hands the writer one behind
//! another ([`SessionStore::apply_chained`](crate::SessionStore::apply_chained)):
//! once one fails in a way that may heal, those chained behind it are
//! refused with its failure, until a batch that is not chained starts the
//! chain again. One chain per writer (an owner; kernels sharing a store
//! each keep their own). Kept by the writer thread, which applies batches
//! one at a time in the order they were handed, so the order of the checks
//! is the order of the batches.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::StoreError;
use crate::lease::OwnerId;

/// The failure that broke each writer's chain, for the chains broken.
#[derive(Default)]
pub(crate) struct Chain {
    broken: Mutex<HashMap<Option<OwnerId>, StoreError>>,
}

impl Chain {
    /// Runs `apply` (one batch's transaction, as `writer`) unless
    /// `chained` and that writer's chain is broken, in which case that
    /// failure is its answer. A batch that is not chained starts its
    /// writer's chain again; one whose transaction failed in a way that
    /// may heal breaks it.
    pub(crate) fn run<T>(
        &self,
        writer: Option<OwnerId>,
        chained: bool,
        apply: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // Only the writer thread takes it, one batch at a time: a poisoned
        // lock (a panic in an earlier batch) still holds a usable value.
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        match chained {
            true => {
                if let Some(failure) = broken.get(&writer) {
                    return Err(failure.clone());
                }
            }
            false => {
                broken.remove(&writer);
            }
        }
        let result = apply();
        if let Err(failure) = &result {
            if failure.may_heal() {
                broken.insert(writer, failure.clone());
            }
        }
        result
    }
}
