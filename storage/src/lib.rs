//! The persistent local cache of kms-operator.
//!
//! Each replica remembers what it last synced so that a restart costs the KMS
//! nothing: per object the spec generation, the KMS ETag, a keyed hash of each
//! target's rendered data (never the values), the last sync and next due
//! times; per dynamic lease its id, version and expiry; per machine identity
//! its access token — only when an [`EncryptionKey`] is configured, and then
//! encrypted with AES-256-GCM.
//!
//! The cache is an optimisation, never the source of truth, so it fails soft:
//! a record that cannot be read is a [`Lookup::Error`] (a miss that the
//! caller counts) and is deleted; a database that cannot be read is moved
//! aside and recreated by [`Store::open`], which reports it in
//! [`OpenReport`]. Only a database held by another process is an error
//! ([`StorageError::Locked`]), after which the caller runs without a cache.
//!
//! The crate knows nothing about Kubernetes: keys are object UIDs and values
//! are plain structs. No type of the embedded engine (sled) or of the
//! encoding (bincode) appears in the API, so either can be replaced without
//! touching the operator.
//!
//! ```no_run
//! use storage::{Lookup, Options, Store, SyncRecord};
//! # fn main() -> Result<(), storage::StorageError> {
//! let (store, report) = Store::open("/var/cache/kms-operator".as_ref(), Options::default())?;
//! if let Some(reason) = &report.recovered {
//!     eprintln!("cache was unusable and has been rebuilt: {reason}");
//! }
//! let hasher = store.data_hasher();
//! let data = std::collections::BTreeMap::from([("password".to_string(), b"...".to_vec())]);
//! let mut record = SyncRecord { generation: 3, ..SyncRecord::default() };
//! record.target_hashes.insert("Secret/ns/app".into(), hasher.hash_map(&data));
//! store.put_sync("0b6c…-uid", &record)?;
//! assert!(matches!(store.get_sync("0b6c…-uid"), Lookup::Hit(_)));
//! # Ok(()) }
//! ```

mod codec;
mod crypto;
mod error;
mod records;
mod store;
#[cfg(test)]
mod tests;

pub use crypto::{DataHasher, EncryptionKey};
pub use error::StorageError;
pub use records::{AccessToken, LeaseRecord, Lookup, RecordKind, SyncRecord, TokenRecord};
pub use store::{DEFAULT_CACHE_BYTES, DEFAULT_MAX_BYTES, OpenReport, Options, Store};
