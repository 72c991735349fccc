//! [`Slots`]: how many connections a gateway holds open, in all and per
//! principal. A connection takes its place when it is accepted (in all)
//! and when it upgrades (its principal's), and keeps both until it ends:
//! the places travel from the HTTP connection to the WebSocket one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Principal;

/// A connection's place; given back when the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Slot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// The places for connections.
#[derive(Debug)]
pub(crate) struct Slots {
    total: Arc<Semaphore>,
    per_principal: usize,
    principals: Mutex<HashMap<Principal, Arc<Semaphore>>>,
}

impl Slots {
    /// `total` connections in all, `per_principal` for each named principal
    /// (the anonymous principal, who is everyone, is bounded by the total).
    pub fn new(total: usize, per_principal: usize) -> Self {
        Slots {
            total: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
            per_principal: per_principal.min(Semaphore::MAX_PERMITS),
            principals: Mutex::default(),
        }
    }

    /// A place among all connections, if one is free.
    pub fn any(&self) -> Option<Slot> {
        let permit = self.total.clone().try_acquire_owned().ok()?;
        Some(Slot(Arc::new(permit)))
    }

    /// A place among `principal`'s connections, if one is free; always one
    /// for the anonymous principal.
    pub fn of(&self, principal: &Principal) -> Result<Option<Slot>, usize> {
        if principal.is_anonymous() {
            return Ok(None);
        }
        let semaphore = self
            .principals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(principal.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_principal)))
            .clone();
        match semaphore.try_acquire_owned() {
            Ok(permit) => Ok(Some(Slot(Arc::new(permit)))),
            Err(_) => Err(self.per_principal),
        }
    }
}
