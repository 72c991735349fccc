//! What each session a kernel hands out keeps of it: the process that
//! opened the kernel (its fork guard), its turns' idle timeout, the
//! secrets its errors mask and its settle timeout. One value, cloned into every session, so a
//! setting added to the kernel reaches them all by one path.

use std::sync::Arc;
use std::time::Duration;

use crate::process::Owner;
use crate::secrets::Secrets;

/// The kernel's settings its sessions share.
#[derive(Clone)]
pub(crate) struct Ties {
    /// The process that opened the kernel: a forked child's calls are
    /// refused.
    pub owner: Owner,
    /// The idle timeout of a turn, unless the turn sets its own.
    pub idle: Option<Duration>,
    /// What its turns' errors mask.
    pub secrets: Arc<Secrets>,
    /// The kernel's settle timeout (G5): how long a turn's pump waits for
    /// its stream's close when its loop is closing.
    pub settle: Duration,
}
