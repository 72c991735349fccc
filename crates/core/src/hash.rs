//! The hasher of the session table.
//!
//! The table is looked up several times per input, and with std's SipHash the
//! hashing alone cost the core most of its throughput (SPEC §9). Session ids
//! are integers picked by the driver, so foldhash's folded multiply is
//! enough; it is seeded per table, so ids crafted against one process do not
//! collide in another.

use std::collections::HashMap;

use crate::SessionId;

/// The session table.
pub(crate) type SessionMap<V> = HashMap<SessionId, V, foldhash::fast::RandomState>;
