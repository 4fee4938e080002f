//! The namespace → shard mapping: a consistent-hash ring with virtual nodes
//! over a stable, documented hash of the namespace bytes.
//!
//! # Definition (hash version 1)
//!
//! * `hash64(bytes)` = the first 8 bytes of SHA-256(`bytes`), read as a
//!   big-endian `u64`. Anyone can reproduce it with `sha256sum`: the first 16
//!   hex digits of the digest are the value.
//! * The ring of S shards holds [`VNODES_PER_SHARD`] points per shard: point
//!   `v` of shard `s` sits at `hash64("shard-{s}-vnode-{v}")` (decimal numbers,
//!   no padding, ASCII). If two points ever coincide, the lower shard keeps it.
//! * A namespace sits at `hash64(namespace as UTF-8 bytes)`; its shard is the
//!   shard of the first point at or after that position, wrapping around to the
//!   lowest point. Cluster-scoped objects use the empty namespace.
//!
//! Because a shard's points do not depend on S, the ring of S shards is the
//! ring of S + 1 shards without shard S: growing S by one only moves
//! namespaces onto the new shard, shrinking it only moves the namespaces of the
//! removed shard.
//!
//! Any change to this definition must bump [`HASH_VERSION`]: replicas record
//! it in their member Lease and refuse to share work with a replica whose
//! version differs. The golden test (`tests/golden.rs`) pins the mapping.

/// Version of the namespace → shard mapping defined in this module.
pub const HASH_VERSION: u32 = 1;

/// Virtual nodes (ring points) per shard.
pub const VNODES_PER_SHARD: u32 = 1024;

/// The largest supported number of shards.
pub const MAX_SHARDS: u32 = 256;

/// The stable 64-bit hash used by the ring and the assignment: the first 8
/// bytes of SHA-256 of `bytes`, big-endian.
pub fn hash64(bytes: &[u8]) -> u64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// The ring position of virtual node `vnode` of `shard`.
pub fn vnode_point(shard: u32, vnode: u32) -> u64 {
    hash64(format!("shard-{shard}-vnode-{vnode}").as_bytes())
}

/// A consistent-hash ring of a fixed number of shards: the virtual-node
/// points sorted by position (a sorted vector rather than a map: it is built
/// once and only searched).
#[derive(Debug, Clone)]
pub struct Ring {
    shards: u32,
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// Build the ring of `shards` shards (`1..=MAX_SHARDS`); `None` when out of
    /// range.
    pub fn new(shards: u32) -> Option<Self> {
        if shards == 0 || shards > MAX_SHARDS {
            return None;
        }
        let mut points: Vec<(u64, u32)> = (0..shards)
            .flat_map(|shard| (0..VNODES_PER_SHARD).map(move |v| (vnode_point(shard, v), shard)))
            .collect();
        // Sorted by position, then shard: on a shared position the lower shard
        // comes first and keeps it.
        points.sort_unstable();
        points.dedup_by_key(|(position, _)| *position);
        Some(Self { shards, points })
    }

    /// Number of shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard of `namespace` (cluster-scoped objects: the empty string).
    pub fn shard_of(&self, namespace: &str) -> u32 {
        let position = hash64(namespace.as_bytes());
        let next = self.points.partition_point(|(p, _)| *p < position);
        self.points
            .get(next)
            .or_else(|| self.points.first())
            .map(|(_, shard)| *shard)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash64_is_truncated_sha256() {
        // Values from `printf '%s' NAME | sha256sum | cut -c1-16`.
        assert_eq!(hash64(b""), 0xe3b0c44298fc1c14);
        assert_eq!(hash64(b"default"), 0x37a8eec1ce19687d);
        assert_eq!(hash64(b"kube-system"), 0x88007f70666dbd81);
        assert_eq!(hash64(b"team-a"), 0x96c2886c51d1dfb4);
        assert_eq!(vnode_point(0, 0), 0xea5d7e488d855567);
    }

    #[test]
    fn shard_count_is_bounded() {
        assert!(Ring::new(0).is_none());
        assert!(Ring::new(MAX_SHARDS + 1).is_none());
        assert_eq!(Ring::new(1).map(|r| r.shard_of("anything")), Some(0));
        assert_eq!(Ring::new(MAX_SHARDS).map(|r| r.shards()), Some(MAX_SHARDS));
    }

    #[test]
    fn every_shard_has_its_points() {
        let ring = Ring::new(16).expect("ring");
        assert_eq!(ring.points.len(), (16 * VNODES_PER_SHARD) as usize);
    }
}
