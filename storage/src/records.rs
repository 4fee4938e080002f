//! The typed records kept in the cache, and the outcome of a lookup.
//!
//! Records hold versions, hashes and times — never a secret value. The one
//! exception is [`TokenRecord`], which is only ever written encrypted and whose
//! token is wrapped in [`AccessToken`] so that it cannot end up in a log line.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The three kinds of record, one tree each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKind {
    /// [`SyncRecord`]s, keyed by the UID of the custom resource.
    Sync,
    /// [`LeaseRecord`]s, keyed by the UID of the custom resource.
    Lease,
    /// [`TokenRecord`]s, keyed by a one-way hash of the identity key.
    Token,
}

impl RecordKind {
    /// Every kind, in a fixed order.
    pub const ALL: [RecordKind; 3] = [RecordKind::Sync, RecordKind::Lease, RecordKind::Token];

    /// A short lowercase name, suitable as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Sync => "sync",
            RecordKind::Lease => "lease",
            RecordKind::Token => "token",
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator last synced for one object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// `metadata.generation` of the custom resource that was synced.
    pub generation: i64,
    /// ETag the KMS returned with the secrets, for a conditional fetch.
    pub etag: Option<String>,
    /// Keyed hash of the rendered data per target (for example
    /// `"Secret/ns/name"`), made with [`Store::data_hasher`](crate::Store::data_hasher).
    pub target_hashes: BTreeMap<String, [u8; 32]>,
    /// When the last successful sync finished (Unix milliseconds).
    pub last_sync_unix_ms: i64,
    /// When the next sync is due (Unix milliseconds).
    pub next_due_unix_ms: i64,
    /// How many keys the last sync wrote.
    pub synced_keys: u32,
}

/// A dynamic-secret lease held for one custom resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The KMS lease id.
    pub lease_id: String,
    /// Version of the lease (renewals bump it).
    pub version: i64,
    /// When the lease expires (Unix milliseconds).
    pub expires_at_unix_ms: i64,
}

/// An access token of one machine identity. Stored only encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// The bearer token.
    pub access_token: AccessToken,
    /// When the token expires (Unix milliseconds).
    pub expires_at_unix_ms: i64,
    /// When the token can no longer be renewed (Unix milliseconds).
    pub max_expires_at_unix_ms: i64,
}

/// A secret string whose `Debug` and `Display` print `[redacted]`.
///
/// Its memory is overwritten with zeros on drop (best effort: copies made
/// by the caller through [`AccessToken::expose`] are the caller's).
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        AccessToken(token.into())
    }

    /// The token itself. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for AccessToken {
    fn from(token: String) -> Self {
        AccessToken(token)
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessToken([redacted])")
    }
}

impl fmt::Display for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Drop for AccessToken {
    fn drop(&mut self) {
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        wipe(&mut bytes);
    }
}

/// Overwrites a buffer with zeros in a way the optimiser keeps.
pub(crate) fn wipe(bytes: &mut [u8]) {
    bytes.fill(0);
    std::hint::black_box(bytes);
}

/// The outcome of a cache lookup.
///
/// A bad record is not a `Result::Err`: for the operator it is a miss that is
/// also counted as a cache error. The store has already removed the record
/// when it returns [`Lookup::Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Lookup<T> {
    /// The record was found and decoded.
    Hit(T),
    /// There is no record under this key.
    Miss,
    /// A record was there but could not be used (undecodable, other schema
    /// version, undecryptable, or the database failed to read); the reason
    /// names no secret.
    Error(String),
}

impl<T> Lookup<T> {
    /// The record on a hit, `None` on a miss or an error.
    pub fn hit(self) -> Option<T> {
        match self {
            Lookup::Hit(value) => Some(value),
            Lookup::Miss | Lookup::Error(_) => None,
        }
    }

    /// Whether this is a hit.
    pub fn is_hit(&self) -> bool {
        matches!(self, Lookup::Hit(_))
    }

    /// Whether this is a miss (no record).
    pub fn is_miss(&self) -> bool {
        matches!(self, Lookup::Miss)
    }

    /// Whether a record was there but unusable.
    pub fn is_error(&self) -> bool {
        matches!(self, Lookup::Error(_))
    }

    /// Applies `f` to the record of a hit.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Lookup<U> {
        match self {
            Lookup::Hit(value) => Lookup::Hit(f(value)),
            Lookup::Miss => Lookup::Miss,
            Lookup::Error(reason) => Lookup::Error(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_token_is_redacted() {
        let record = TokenRecord {
            access_token: AccessToken::new("tok-very-secret"),
            expires_at_unix_ms: 1,
            max_expires_at_unix_ms: 2,
        };
        let debug = format!("{record:?}");
        assert!(!debug.contains("tok-very-secret"), "{debug}");
        assert!(debug.contains("redacted"), "{debug}");
        assert_eq!(format!("{}", record.access_token), "[redacted]");
        assert_eq!(record.access_token.expose(), "tok-very-secret");
    }

    #[test]
    fn lookup_helpers() {
        assert_eq!(Lookup::Hit(3).map(|v| v * 2).hit(), Some(6));
        assert!(Lookup::<u8>::Miss.is_miss());
        assert!(Lookup::<u8>::Error("x".into()).is_error());
        assert_eq!(Lookup::<u8>::Error("x".into()).hit(), None);
        assert_eq!(RecordKind::Lease.to_string(), "lease");
    }
}
