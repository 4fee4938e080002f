//! Shard ownership for kms-operator replicas.
//!
//! This crate maps namespaces to a fixed number of shards with a consistent-hash
//! ring, and decides which live replica owns which shard through
//! `coordination.k8s.io` Leases (member Leases and one Lease per shard, taken and
//! renewed only by compare-and-swap). It knows nothing about secrets or the KMS;
//! the operator asks it one question before every write: "do I own this shard
//! right now?".
//!
//! The API lands with the sharding issue; until then the operator runs with a
//! single shard that it always owns.
