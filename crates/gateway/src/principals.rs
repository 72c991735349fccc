//! Who created each session, as the store keeps it: written with its row
//! when a named principal creates one ([`Kernel::register_for`](settle_runtime::Kernel::register_for)), read when a principal asks for a session this
//! process does not know the owner of (created before a restart, or by
//! another process of the fleet). The process's [`Owners`](crate::ownership::Owners)
//! is a cache of it, so a principal's sessions answer it, and nobody else,
//! on every process and across restarts (SPEC §10, §12).

use settle_runtime::{RuntimeError, SessionId};
use settle_store::StoreError;

use crate::auth::Principal;
use crate::protocol::RpcError;
use crate::shared::Shared;

impl Shared {
    /// The principal the store recorded for session `id` (the anonymous
    /// one when none was, or the store keeps none).
    pub(crate) async fn recorded_owner(&self, id: SessionId) -> Result<Principal, RpcError> {
        match self.kernel.principal(id).await {
            Ok(name) => Ok(principal_of(name.as_deref())),
            // No principal kept, or no such session: nobody's recorded.
            Err(RuntimeError::Store(
                StoreError::Unsupported(_) | StoreError::UnknownSession(_),
            )) => Ok(Principal::ANONYMOUS),
            Err(error) => Err(RpcError::from_runtime(&error)),
        }
    }
}

/// The principal a recorded name stands for.
pub(crate) fn principal_of(name: Option<&str>) -> Principal {
    match name {
        Some(name) => Principal::named(name),
        None => Principal::ANONYMOUS,
    }
}
