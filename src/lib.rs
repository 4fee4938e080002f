//! kms-operator: keeps Kubernetes Secrets in step with a KMS that speaks the
//! Infisical HTTP API (Hanzo KMS).
//!
//! ```text
//!            watches (CRs, managed Secrets, kms-config, credentials)
//!                                   │
//!                       shard filter (namespace → shard)
//!                                   │
//!             per-shard work queues ─► reconcile: fetch → plan → apply → status
//!                                   │                 │
//!                         KMS client (kms/)    Kubernetes API (server-side apply)
//! ```
//!
//! Modules:
//! - [`api`]: the custom resource types and the CRDs generated from them;
//! - [`cli`]: the command line;
//! - [`operator`]: `kms-operator run`, the wiring of everything below;
//! - [`controllers`]: the controllers (KmsSecret, push, dynamic, reload),
//!   their queues, caches and the registry of kinds;
//! - [`kms`]: the KMS client (auth methods, fetches, budget, events);
//! - [`sharding`]: the ownership gate between watches and queues;
//! - [`status`]: `kms-operator status`;
//! - [`check`]: `kms-operator check`, the chart's `helm test`;
//! - [`sync_now`]: `kms-operator sync`;
//! - [`server`]: health, readiness and metrics endpoints;
//! - [`metrics`]: the Prometheus metrics;
//! - [`telemetry`]: logging set-up.
//!
//! The crates `shard` (namespace→shard ring and Lease ownership) and `storage`
//! (the persistent cache) sit beside this one and never import it.

pub mod api;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod controllers;
pub mod kms;
pub mod metrics;
pub mod operator;
pub mod server;
pub mod sharding;
pub mod status;
pub mod sync_now;
pub mod telemetry;
