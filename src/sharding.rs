//! The ownership gate between the watches and the work queues: which shard a
//! namespace belongs to, and whether this replica owns that shard right now.
//!
//! Controllers ask [`Ownership::owns`] before taking an object from the
//! queue and again right before every write; each owned shard has a
//! cancellation token that fires when the shard is lost, so in-flight work on
//! it stops. [`SingleShard`] is the gate of a replica that runs alone (one
//! shard, always owned); the Lease-based implementation lives in the `shard`
//! crate.

use tokio::sync::watch;
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
    /// The owned shards; the receiver changes whenever ownership changes.
    fn subscribe(&self) -> watch::Receiver<Vec<u32>>;
    /// Live replicas sharing the work (for the KMS budget).
    fn members(&self) -> u32;
}

/// One shard, always owned: a single replica.
pub struct SingleShard {
    token: CancellationToken,
    owned: watch::Sender<Vec<u32>>,
}

impl Default for SingleShard {
    fn default() -> Self {
        Self {
            token: CancellationToken::new(),
            owned: watch::channel(vec![0]).0,
        }
    }
}

impl Ownership for SingleShard {
    fn shard_count(&self) -> u32 {
        1
    }
    fn shard_of(&self, _namespace: &str) -> u32 {
        0
    }
    fn owns(&self, shard: u32) -> bool {
        shard == 0
    }
    fn holds(&self, shard: u32) -> bool {
        shard == 0
    }
    fn cancellation(&self, shard: u32) -> CancellationToken {
        if shard == 0 {
            self.token.child_token()
        } else {
            let t = CancellationToken::new();
            t.cancel();
            t
        }
    }
    fn subscribe(&self) -> watch::Receiver<Vec<u32>> {
        self.owned.subscribe()
    }
    fn members(&self) -> u32 {
        1
    }
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
    fn subscribe(&self) -> watch::Receiver<Vec<u32>> {
        shard::Coordinator::subscribe(self)
    }
    fn members(&self) -> u32 {
        shard::Coordinator::members(self)
    }
}
