//! What a coordinator reports: the event stream and the snapshot view, for
//! metrics, logs, status conditions and the `status` command.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Why this replica stopped owning a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// The shard is assigned to another live member; it is being handed over.
    Rebalanced,
    /// This replica is stopping; the shard is being handed over.
    Shutdown,
    /// Another replica holds the Lease, or the Lease was deleted.
    TakenOver,
    /// No renewal succeeded within the renew deadline.
    RenewDeadline,
    /// The coordinator was aborted.
    Aborted,
}

impl LossReason {
    /// A short lowercase name (for metric labels and logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rebalanced => "rebalanced",
            Self::Shutdown => "shutdown",
            Self::TakenOver => "taken-over",
            Self::RenewDeadline => "renew-deadline",
            Self::Aborted => "aborted",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A live member whose shard count or hash version differs from ours (or is
/// not recorded). While any exists, this replica acquires no shard and gives
/// none away for rebalancing; it keeps renewing what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mismatch {
    /// The member's identity.
    pub member: String,
    /// Its shard count (`None`: not recorded or unreadable).
    pub shards: Option<u32>,
    /// Its hash version (`None`: not recorded or unreadable).
    pub hash_version: Option<u32>,
    /// Our shard count.
    pub our_shards: u32,
    /// Our hash version.
    pub our_hash_version: u32,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: Option<u32>| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
        write!(
            f,
            "member {} runs with {} shards and hash version {}, this replica with {} shards and \
             hash version {}: not acquiring shards until the configurations agree",
            self.member,
            show(self.shards),
            show(self.hash_version),
            self.our_shards,
            self.our_hash_version
        )
    }
}

/// Something that happened to this replica's shards or to the member set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// This replica acquired the shard's Lease and may work on it.
    Gained(u32),
    /// This replica stopped owning the shard (its cancellation token fired).
    Lost {
        /// The shard.
        shard: u32,
        /// Why.
        reason: LossReason,
    },
    /// A hand-over finished: the shard's Lease was cleared for the next owner.
    Released(u32),
    /// Renewing a Lease failed (`shard: None` is the member Lease).
    RenewFailed {
        /// The shard, or `None` for the member Lease.
        shard: Option<u32>,
        /// The error.
        error: String,
    },
    /// A live member runs with a different configuration; acquisition stopped.
    ConfigMismatch(Mismatch),
    /// No mismatched member is live any more; acquisition resumed.
    ConfigAgreed,
    /// The set of live members changed (sorted identities, ourselves included
    /// while running).
    MembersChanged(Vec<String>),
}

/// What this replica last observed about one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStatus {
    /// The holder recorded in the shard's Lease (`None`: free or no Lease).
    pub holder: Option<String>,
    /// The member the assignment gives the shard to.
    pub assigned: Option<String>,
    /// Time since this replica saw the Lease change (`None`: no Lease seen).
    pub unchanged_for: Option<Duration>,
}

/// A snapshot of a coordinator's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// This replica's identity.
    pub identity: String,
    /// Our shard count.
    pub shards: u32,
    /// Our hash version.
    pub hash_version: u32,
    /// Shards this replica owns right now.
    pub owned: Vec<u32>,
    /// Live members (sorted), ourselves included while running.
    pub members: Vec<String>,
    /// Every shard as last observed.
    pub status: BTreeMap<u32, ShardStatus>,
    /// Live members with a different configuration.
    pub mismatches: Vec<Mismatch>,
    /// Whether the initial list of Leases has been received.
    pub synced: bool,
    /// Whether a graceful stop is in progress (or done).
    pub stopping: bool,
}
