//! The controllers and what they share.
//!
//! Each controller is a per-shard [`queue::Queue`] of object keys fed by watch
//! events, drained by a pool of workers. A worker takes a key only if this
//! replica owns its shard ([`crate::sharding::Ownership`]), runs the
//! controller's reconcile (fetch → plan → apply → status) under the shard's
//! cancellation token, and requeues the key: at its due time on success;
//! after a transient error with capped exponential backoff and jitter;
//! after any other error when the resource or what it references changes,
//! else at its resync interval ([`workers`]).
//!
//! - [`kms_secret`], [`kms_push_secret`], [`kms_dynamic_secret`],
//!   [`reload`]: the four controllers;
//! - [`registry`]: the kinds as the operator wires them (one list);
//! - [`context`]: what every reconcile shares; [`workers`]: the worker pool
//!   and the error policy; [`key`]: object keys; [`written`]: the statuses
//!   a controller wrote that its watch may not show yet;
//! - [`auth`]: the authentication methods as the controllers resolve them;
//!   [`cloud_identities`]: where the operator's cloud identity may be used;
//! - [`instant`]: instant updates (the KMS's change events);
//!   [`force_sync`]: the annotation that asks for a sync now;
//! - [`target`]: managed objects, ownership, adoption, versions (pure);
//! - [`apply`]: writes with resourceVersion preconditions;
//! - [`refs`]: references, the namespace rule, the global config;
//! - [`conditions`], [`error`]: status conditions and reconcile errors;
//! - [`queue`], [`stores`]: the work queues and the watched caches;
//! - [`render`]: templates rendered off the runtime, with a deadline.

pub mod apply;
pub mod auth;
pub mod cloud_identities;
pub mod conditions;
pub mod context;
pub mod error;
pub mod events;
pub mod force_sync;
pub mod instant;
pub mod key;
pub mod kms_dynamic_secret;
pub mod kms_push_secret;
pub mod kms_secret;
pub mod managed_fields;
pub mod packed;
pub mod queue;
pub mod readiness;
pub mod refs;
pub mod registry;
pub mod reload;
pub mod render;
pub mod stores;
pub mod target;
pub mod workers;
pub mod written;
