//! What the KmsSecret controller remembers of a resource's last sync, in
//! memory and in the persistent cache.

use std::time::{Duration, SystemTime};

/// What the operator remembers of an object's last sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncRecord {
    /// Spec generation synced.
    pub generation: i64,
    /// ETag of the last KMS answer.
    pub etag: Option<String>,
    /// When the KMS was last checked successfully.
    pub last_sync: SystemTime,
    /// When the next check is due.
    pub next_due: SystemTime,
    /// Secrets fetched at the last sync.
    pub synced_keys: i64,
    /// Keyed hash of each target's data (`Kind/ns/name`), when a persistent
    /// cache is configured: written to it, not kept in memory (a record
    /// read back from the cache is trusted only when they match).
    pub target_hashes: std::collections::BTreeMap<String, [u8; 32]>,
}

impl SyncRecord {
    /// The persistent cache's form.
    pub fn to_stored(&self) -> storage::SyncRecord {
        let ms = crate::kms::client::unix_ms;
        storage::SyncRecord {
            generation: self.generation,
            etag: self.etag.clone(),
            target_hashes: self.target_hashes.clone(),
            last_sync_unix_ms: ms(self.last_sync),
            next_due_unix_ms: ms(self.next_due),
            synced_keys: u32::try_from(self.synced_keys).unwrap_or(u32::MAX),
        }
    }

    /// From the persistent cache's form.
    pub fn from_stored(r: storage::SyncRecord) -> Self {
        let at = |ms: i64| {
            SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
        };
        Self {
            generation: r.generation,
            etag: r.etag,
            last_sync: at(r.last_sync_unix_ms),
            next_due: at(r.next_due_unix_ms),
            synced_keys: i64::from(r.synced_keys),
            target_hashes: r.target_hashes,
        }
    }
}
