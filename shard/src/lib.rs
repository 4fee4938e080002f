//! Shard ownership for kms-operator replicas.
//!
//! This crate maps namespaces to a fixed number of shards with a
//! consistent-hash ring, and decides which live replica owns which shard
//! through `coordination.k8s.io/v1` Leases: one member Lease per replica and
//! one Lease per shard, taken and renewed only by compare-and-swap on the
//! resourceVersion. It knows nothing about secrets or the KMS; the operator
//! asks it one question before every write: "do I own this shard right now?"
//!
//! * [`ring`]: the namespace → shard mapping (stable SHA-256-based hash,
//!   virtual nodes, [`HASH_VERSION`]).
//! * [`assign`](mod@assign): which live member should own which shard (pure, balanced,
//!   deterministic).
//! * [`decide`]: the Lease state machine as a pure function of the observed
//!   Leases and the current instant.
//! * [`Coordinator`]: the running part: watches and writes Leases, fences by
//!   the renew deadline, hands shards over in order, reports events and a
//!   [`View`].
//!
//! ```no_run
//! # async fn example(client: kube::Client) -> Result<(), shard::Error> {
//! let config = shard::Config::new("kms-operator-system", "kms-operator", "kms-operator-0");
//! let coordinator = shard::Coordinator::start(client, config)?;
//! coordinator.set_drain_hook(|shard| async move {
//!     // finish or cancel in-flight work of `shard`, flush its cache records
//!     let _ = shard;
//! });
//! let shard = coordinator.shard_of("team-a");
//! if coordinator.owns(shard) {
//!     // work, watching coordinator.cancellation(shard)
//! }
//! coordinator.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod assign;
pub mod config;
pub mod coordinator;
pub mod decide;
pub mod events;
pub mod lease;
pub mod ring;
pub mod store;

pub use assign::assign;
pub use config::{Config, ConfigError, member_lease_name, shard_lease_name};
pub use coordinator::{Coordinator, DrainFuture, Error};
pub use events::{Event, LossReason, Mismatch, ShardStatus, View};
pub use ring::{HASH_VERSION, MAX_SHARDS, Ring, hash64};
