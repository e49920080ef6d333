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

/// A `HashMap` keyed by chunk index ([`ChunkHasher`]): a table of a phase's chunks holds
/// chunk `c` in its bucket `c`, and is walked in chunk order.
pub(crate) type ChunkMap<V> = HashMap<u64, V, BuildHasherDefault<ChunkHasher>>;

/// An empty [`ChunkMap`] with room for `n` chunks. (Not a cleared one: `HashMap::clear` of a
/// map that removals emptied keeps their tombstones, and each insert then probes past them,
/// a table of a phase's partitions at a time.)
pub(crate) fn chunk_map<V>(n: usize) -> ChunkMap<V> {
    ChunkMap::with_capacity_and_hasher(n, BuildHasherDefault::default())
}

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

/// Hashes a chunk index to itself in its low bits, which place it in a table (`hashbrown`
/// places a hash `h` at bucket `h & mask`), and to a multiplicative mix in its top seven
/// bits (the tag `hashbrown` compares before a key). The chunks of a phase are indices
/// `0..len`: in a table of at least `len` buckets each has a bucket of its own, and the
/// table is walked in chunk order. A barrier walks the ledger's partitions, and looks up
/// their halos and exports, in memory order rather than at random (at thousands of worker
/// processes, most of a barrier's time was cache misses). Nothing relies on that order for
/// its result; a map of few chunks far apart has collisions like any other.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ChunkHasher(u64);

impl Hasher for ChunkHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        const TOP: u64 = !(u64::MAX >> 7);
        self.0 = n ^ (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) & TOP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of a phase's chunks, filled in any order, is walked in chunk order.
    #[test]
    fn a_map_of_chunks_is_walked_in_chunk_order() {
        let mut m: ChunkMap<u64> = ChunkMap::default();
        let n = 5_000u64;
        for c in (0..n).map(|i| (i * 7_919) % n) {
            m.insert(c, c * 2);
        }
        assert_eq!(m.len(), n as usize);
        assert!(m.iter().map(|(&c, _)| c).eq(0..n));
        assert!((0..n).all(|c| m[&c] == c * 2));
    }
}
