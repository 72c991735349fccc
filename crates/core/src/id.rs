use std::fmt;
use std::str::FromStr;

/// The identity of a session, unique within one store.
///
/// The core does not allocate identities: the caller (usually the store, which
/// owns the durable row) picks one and passes it to [`Event::Register`](crate::Event::Register).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

impl SessionId {
    /// The raw number, as stored in a database row.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Forward the formatter so widths and alignment apply.
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for SessionId {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(SessionId)
    }
}

impl From<u64> for SessionId {
    fn from(raw: u64) -> Self {
        SessionId(raw)
    }
}
