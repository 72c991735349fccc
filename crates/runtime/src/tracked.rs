//! [`Tracked`]: how much a kernel keeps track of, as the driver answers
//! [`Kernel::tracked`](crate::Kernel::tracked).

/// How much a kernel keeps track of: what a long-lived process must not
/// grow without bound. For tests and diagnostics.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracked {
    /// Sessions the core holds a record of (finalized ones are forgotten).
    pub core_sessions: usize,
    /// Sessions the driver holds an entry for.
    pub sessions: usize,
    /// Works in flight.
    pub works: usize,
}
