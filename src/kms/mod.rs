//! The KMS client: how the operator talks to a KMS that speaks the
//! Infisical HTTP API.
//!
//! - [`endpoint`]: base URLs (`/api` appended), the host allow list, one
//!   HTTP client per trust configuration (system roots plus a private CA);
//! - [`cloud`]: the proofs of the cloud login methods (AWS, Azure, GCP),
//!   from the pod's ambient credentials or a key file;
//! - [`method`]: the login methods, each named once (label, strategy,
//!   route);
//! - [`auth`]: identities, their keys and tokens (one login per identity,
//!   renewed before expiry, a new login at max TTL, lazy);
//! - [`limiter`]: the request budget per host and 429 pauses;
//! - [`memory`]: the bytes of answers a replica holds at once;
//! - [`share`]: this replica's part of a budget shared by demand;
//! - [`flight`]: identical requests in flight shared;
//! - [`client`]: the requests themselves, with bounded retries and metrics;
//! - [`folders`]: whether a scope's environment and folder exist;
//! - [`model`]: wire types, with secret values redacted in `Debug`.

pub mod auth;
pub mod client;
pub mod cloud;
pub mod endpoint;
mod error;
pub mod events;
pub mod flight;
pub mod folders;
#[cfg(test)]
mod fuzz;
pub mod leases;
pub mod limiter;
pub mod memory;
pub mod model;
pub mod push;
pub mod share;

pub use auth::{Credentials, Identity, IdentityKey};
pub use client::{Fetch, Fetched, Kms, KmsConfig, LIMITED_KEPT, ProjectRef, Scope};
pub use endpoint::{DEFAULT_HOST_API, Endpoint};
pub use error::KmsError;
pub use model::{SecretItem, SecretMap};
