//! The ownership gate between the watches and the work queues: which shard a
//! namespace belongs to, and whether this replica owns that shard right now.
//!
//! Controllers ask [`Ownership::owns`] before taking an object from the
//! queue and again right before every write; each owned shard has a
//! cancellation token that fires when the shard is lost, so in-flight work on
//! it stops. The implementation is the `shard` crate's Lease coordinator,
//! narrowed with caches by shard to the shards whose caches are complete
//! (`operator::shards::CachedGate`); tests of pure logic implement the
//! trait themselves.

use std::collections::{BTreeMap, BTreeSet};

use tokio_util::sync::CancellationToken;

/// The gate.
pub trait Ownership: Send + Sync + 'static {
    /// Number of shards.
    fn shard_count(&self) -> u32;
    /// The shard of a namespace (cluster-scoped objects use the empty name).
    fn shard_of(&self, namespace: &str) -> u32;
    /// Whether this replica may work on `shard` now.
    fn owns(&self, shard: u32) -> bool;
    /// Whether this replica holds `shard`, even if its last renewal is late
    /// (then it may not work on it until the renewal lands, but its work is
    /// kept, not dropped).
    fn holds(&self, shard: u32) -> bool;
    /// A token cancelled when `shard` is lost (already cancelled if not
    /// owned).
    fn cancellation(&self, shard: u32) -> CancellationToken;
    /// Live replicas sharing the work.
    fn members(&self) -> u32;
    /// This replica's name among the members.
    fn identity(&self) -> &str;
    /// Publish the work this replica has waiting (its weight in the shared
    /// budgets).
    fn publish_demand(&self, demand: u32);
    /// The demand every live member published.
    fn demands(&self) -> BTreeMap<String, u32>;
    /// The members that have a member Lease, live or lapsed (one that left
    /// gracefully has none).
    fn member_leases(&self) -> BTreeSet<String>;
}

/// The Lease-based gate of the `shard` crate.
impl Ownership for shard::Coordinator {
    fn shard_count(&self) -> u32 {
        shard::Coordinator::shard_count(self)
    }
    fn shard_of(&self, namespace: &str) -> u32 {
        shard::Coordinator::shard_of(self, namespace)
    }
    fn owns(&self, shard: u32) -> bool {
        shard::Coordinator::owns(self, shard)
    }
    fn holds(&self, shard: u32) -> bool {
        shard::Coordinator::holds(self, shard)
    }
    fn cancellation(&self, shard: u32) -> CancellationToken {
        shard::Coordinator::cancellation(self, shard)
    }
    fn members(&self) -> u32 {
        shard::Coordinator::members(self)
    }
    fn identity(&self) -> &str {
        &self.config().identity
    }
    fn publish_demand(&self, demand: u32) {
        self.set_demand(demand);
    }
    fn demands(&self) -> BTreeMap<String, u32> {
        shard::Coordinator::demands(self)
    }
    fn member_leases(&self) -> BTreeSet<String> {
        shard::Coordinator::member_leases(self)
    }
}
