//! A fast hasher for the core's maps keyed by worker and chunk ids.
//!
//! Ids are `u64` counters chosen by the executor, not by peers, so a hash-flooding attack is
//! not a concern and SipHash's cost buys nothing; a multiply by an odd constant (Fibonacci
//! hashing) spreads consecutive ids over the table.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by an id.
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A `HashSet` of ids. Like [`IdMap`], its order of iteration depends on its contents only,
/// never on a random seed: the coordinator's decisions that iterate one replay exactly in
/// the cluster simulation.
pub(crate) type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// Hashes one integer by multiplication; anything else falls back to FNV-style mixing.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
