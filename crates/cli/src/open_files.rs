//! The open-file limit `settle serve` runs under. Every client connection
//! is a descriptor, and so is each running turn's connection to the model;
//! the store, the log and the listener take a few more. Most Linux hosts
//! and systemd services start a process with a soft limit of 1,024, far
//! below the gateway's default `--max-connections` of 4,096: past it,
//! accepting fails, and so do the model's and the store's connections,
//! for every client at once.
//!
//! So the soft limit is raised to the hard one at start (what Go's
//! runtime does for every program), and `--max-connections` is lowered, with
//! one line saying so, to what still fits.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Descriptors kept for what is not a client's: the store's connections,
/// the listener, the log, the signal pipe.
const RESERVED: u64 = 64;

/// What the limit allows, once raised as far as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit now in force.
    pub limit: u64,
    /// Client connections that fit under it, each with a running turn's
    /// model connection.
    pub connections: u64,
}

/// Raises the soft open-file limit to the hard one and says what fits;
/// `None` when the limit cannot be read (nothing is changed then).
pub fn raise() -> Option<OpenFiles> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let limit = match soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        true => hard,
        false => soft,
    };
    Some(fitting(limit))
}

/// The connections that fit under `limit` descriptors.
fn fitting(limit: u64) -> OpenFiles {
    let connections = match limit {
        RLIM_INFINITY => u64::MAX,
        n => n.saturating_sub(RESERVED) / 2,
    };
    OpenFiles {
        limit,
        connections: connections.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_counts_two_descriptors_and_the_store_keeps_its_reserve() {
        assert_eq!(fitting(1024).connections, 480);
        assert_eq!(fitting(65_536).connections, 32_736);
        assert_eq!(fitting(RLIM_INFINITY).connections, u64::MAX);
        assert_eq!(fitting(10).connections, 1);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let Some(raised) = raise() else {
            return;
        };
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, hard);
        assert_eq!(raised.limit, soft);
    }
}
