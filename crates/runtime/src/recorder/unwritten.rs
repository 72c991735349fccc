//! [`Unwritten`]: why a bounded store call gave no answer, and how each
//! waiter is told.

use std::sync::Arc;
use std::time::Duration;

use settle_store::StoreError;

use crate::error::RuntimeError;

/// Why a bounded store call gave no answer.
#[derive(Debug, Clone)]
pub(crate) enum Unwritten {
    Failed(Arc<StoreError>),
    TimedOut(Duration),
}

impl Unwritten {
    pub fn from_store(error: StoreError) -> Self {
        Unwritten::Failed(Arc::new(error))
    }

    pub fn into_error(self, what: &'static str) -> RuntimeError {
        match self {
            Unwritten::Failed(error) => match Arc::try_unwrap(error) {
                Ok(error) => RuntimeError::from_store(what, error),
                Err(shared) => RuntimeError::Registration(shared),
            },
            Unwritten::TimedOut(after) => RuntimeError::StoreTimeout {
                what,
                after,
                writing: true,
            },
        }
    }

    /// The store's error, with its real cause, as a work waiting for its
    /// turn's row sees it.
    pub fn store_error(&self) -> StoreError {
        match self {
            Unwritten::Failed(error) => error.as_ref().clone(),
            Unwritten::TimedOut(after) => StoreError::TimedOut { after: *after },
        }
    }

    pub fn lease_lost(&self) -> bool {
        matches!(self, Unwritten::Failed(e) if matches!(e.as_ref(), StoreError::LeaseLost(_)))
    }
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unwritten::Failed(error) => error.fmt(f),
            Unwritten::TimedOut(after) => StoreError::TimedOut { after: *after }.fmt(f),
        }
    }
}
