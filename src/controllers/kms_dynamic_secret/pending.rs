//! The write-ahead record of a lease created but not yet recorded in its
//! resource's status.
//!
//! A new lease is written to the status before its credentials are used,
//! and revoked when that write fails. A process that dies between the
//! creation and the status write used to leave the lease to its TTL. With a
//! cache (`--cache-dir`), the lease is remembered there first (flushed to
//! disk) and forgotten once the status holds it or it is revoked; the next
//! reconcile of the resource — on this replica after a restart, since shards
//! go back to the replica that held them — finds a remembered lease the
//! status does not name and revokes it.

use k8s_openapi::jiff::Timestamp;
use storage::{LeaseRecord, Lookup, Store};

use crate::api::kms_dynamic_secret::KmsDynamicSecretStatus;
use crate::kms::leases::Lease;

/// The pending lease of one resource (by UID), in the cache if there is one.
pub struct Pending<'a> {
    cache: Option<&'a Store>,
    uid: &'a str,
}

/// What to do about a remembered lease (see [`settle`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Settle {
    /// Nothing is remembered.
    Nothing,
    /// The status holds it, or it has expired: forget it.
    Forget,
    /// Nobody recorded it and it is still alive: revoke it, then forget it.
    Revoke(String),
}

impl<'a> Pending<'a> {
    /// The pending lease of the resource `uid`.
    pub fn new(cache: Option<&'a Store>, uid: &'a str) -> Self {
        Self { cache, uid }
    }

    /// Remember `lease` before the status write, on disk when this returns.
    /// A cache that fails is logged: the lease is then protected only by
    /// the revocation on a failed write, as without a cache.
    pub fn remember(&self, lease: &Lease) {
        let Some(cache) = self.cache else { return };
        let record = LeaseRecord {
            lease_id: lease.id.clone(),
            version: lease.version,
            expires_at_unix_ms: lease.expire_at.as_millisecond(),
        };
        if let Err(e) = cache
            .put_lease(self.uid, &record)
            .and_then(|()| cache.flush())
        {
            tracing::warn!(lease = %lease.id, error = %e, "could not remember a new lease in the cache");
        }
    }

    /// Forget the remembered lease.
    pub fn forget(&self) {
        let Some(cache) = self.cache else { return };
        if let Err(e) = cache.remove_lease(self.uid) {
            tracing::warn!(error = %e, "could not remove a lease record from the cache");
        }
    }

    /// The remembered lease; an unreadable record is a miss.
    pub fn get(&self) -> Option<LeaseRecord> {
        match self.cache?.get_lease(self.uid) {
            Lookup::Hit(r) => Some(r),
            Lookup::Miss => None,
            Lookup::Error(e) => {
                tracing::warn!(error = %e, "unreadable lease record; ignored");
                None
            }
        }
    }
}

/// What to do about `remembered` given the resource's `status` (pure).
pub fn settle(
    remembered: Option<&LeaseRecord>,
    status: &KmsDynamicSecretStatus,
    now: Timestamp,
) -> Settle {
    let Some(r) = remembered else {
        return Settle::Nothing;
    };
    let recorded = status.lease.iter().any(|l| l.id == r.lease_id)
        || status.retired_leases.iter().any(|l| l.id == r.lease_id);
    if recorded || r.expires_at_unix_ms <= now.as_millisecond() {
        Settle::Forget
    } else {
        Settle::Revoke(r.lease_id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::kms_dynamic_secret::{LeaseStatus, RetiredLease};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn record(id: &str, expires_ms: i64) -> LeaseRecord {
        LeaseRecord {
            lease_id: id.to_owned(),
            version: 1,
            expires_at_unix_ms: expires_ms,
        }
    }

    #[test]
    fn an_unrecorded_live_lease_is_revoked_and_a_recorded_or_expired_one_forgotten() {
        let now = Timestamp::from_millisecond(1_000_000).unwrap();
        let mut status = KmsDynamicSecretStatus::default();
        assert_eq!(settle(None, &status, now), Settle::Nothing);
        let live = record("new", 2_000_000);
        assert_eq!(
            settle(Some(&live), &status, now),
            Settle::Revoke("new".to_owned())
        );
        assert_eq!(
            settle(Some(&record("new", 1_000_000)), &status, now),
            Settle::Forget
        );
        status.lease = Some(LeaseStatus {
            id: "new".to_owned(),
            version: 1,
            creation_timestamp: Time(now),
            expires_at: Time(now),
            ttl: None,
        });
        assert_eq!(settle(Some(&live), &status, now), Settle::Forget);
        status.lease = None;
        status.retired_leases.push(RetiredLease {
            id: "new".to_owned(),
            revoke_after: Time(now),
        });
        assert_eq!(settle(Some(&live), &status, now), Settle::Forget);
    }

    #[test]
    fn remembered_until_forgotten_and_nothing_without_a_cache() {
        let dir = std::env::temp_dir().join(format!("pending-{}", std::process::id()));
        let (store, _) = Store::open(&dir, storage::Options::default()).unwrap();
        let lease = Lease {
            id: "l-1".to_owned(),
            version: 2,
            expire_at: Timestamp::from_millisecond(5_000).unwrap(),
        };
        let pending = Pending::new(Some(&store), "uid-1");
        assert_eq!(pending.get(), None);
        pending.remember(&lease);
        let remembered = LeaseRecord {
            version: 2,
            ..record("l-1", 5_000)
        };
        assert_eq!(pending.get(), Some(remembered));
        pending.forget();
        assert_eq!(pending.get(), None);
        let none = Pending::new(None, "uid-1");
        none.remember(&lease);
        assert_eq!(none.get(), None);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }
}
