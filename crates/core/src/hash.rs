//! The hasher of the session table.
//!
//! The table is looked up several times per input, and with std's SipHash the
//! hashing alone cost the core most of its throughput (SPEC §9). Session ids
//! are integers picked by the driver (usually the store's row ids), so a
//! folded multiply (the construction of foldhash) is enough; it is keyed per
//! table from std's random source so that a run of ids crafted against one
//! process does not collide in another.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use crate::SessionId;

/// The session table.
pub(crate) type SessionMap<V> = HashMap<SessionId, V, IdHashBuilder>;

/// Odd constants with well mixed bits (digits of pi).
const MULTIPLIER: u64 = 0x243f_6a88_85a3_08d3;
const FINISH: u64 = 0x1319_8a2e_0370_7345;

fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHashBuilder {
    seed: u64,
}

impl Default for IdHashBuilder {
    fn default() -> Self {
        IdHashBuilder {
            seed: RandomState::new().hash_one(0u64) | 1,
        }
    }
}

impl BuildHasher for IdHashBuilder {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher { state: self.seed }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHasher {
    state: u64,
}

impl Hasher for IdHasher {
    fn write_u64(&mut self, n: u64) {
        self.state = folded_multiply(self.state ^ n, MULTIPLIER);
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `SessionId` (one `u64`) is hashed here; this keeps any other
        // key correct, if slower.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn finish(&self) -> u64 {
        // One fold leaves the low bits, which pick the bucket, close to linear
        // in strided ids; a second one mixes them.
        folded_multiply(self.state, FINISH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_and_strided_ids_spread_over_the_low_bits() {
        // The table picks buckets from the low bits: ids that differ only in
        // their high bits (a stride of 2^k) must still land apart.
        let build = IdHashBuilder::default();
        for stride in [1u64, 1 << 10, 1 << 32] {
            let buckets: std::collections::HashSet<u64> = (0..1024u64)
                .map(|i| build.hash_one(SessionId(i * stride)) & 1023)
                .collect();
            assert!(
                buckets.len() > 600,
                "stride {stride}: {} buckets",
                buckets.len()
            );
        }
    }
}
