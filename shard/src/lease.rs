//! The Lease objects this crate writes, built as plain values (no I/O): what
//! a create, an acquisition, a renewal and a release look like.
//!
//! Every write but a create is a compare-and-swap: it starts from the Lease as
//! read, keeping its `metadata.resourceVersion`, so the API server rejects it
//! with 409 Conflict if the Lease changed in between. The times written
//! (`acquireTime`, `renewTime`) are for people reading the Lease; no replica
//! judges expiry by them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use crate::config::{
    ANNOTATION_DEMAND, ANNOTATION_HASH_VERSION, ANNOTATION_SHARDS, Config, LABEL_GROUP, LABEL_ROLE,
    ROLE_MEMBER, ROLE_SHARD,
};
use crate::ring::HASH_VERSION;

/// The holder of a Lease, `None` when absent or empty.
pub fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// The Lease's `leaseDurationSeconds` when positive.
pub fn duration(lease: &Lease) -> Option<Duration> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|d| u64::try_from(d).ok())
        .filter(|&d| d > 0)
        .map(Duration::from_secs)
}

/// A decimal annotation of the Lease, `None` when absent or unreadable.
pub fn annotation_u32(lease: &Lease, key: &str) -> Option<u32> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(key)?
        .trim()
        .parse()
        .ok()
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// Put our labels and annotations on `meta`, keeping anything else.
fn stamp(meta: &mut ObjectMeta, config: &Config, role: &str) {
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LABEL_GROUP.to_owned(), config.prefix.clone());
    labels.insert(LABEL_ROLE.to_owned(), role.to_owned());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(ANNOTATION_SHARDS.to_owned(), config.shards.to_string());
    annotations.insert(ANNOTATION_HASH_VERSION.to_owned(), HASH_VERSION.to_string());
}

fn fresh(name: String, config: &Config, role: &str, now: Timestamp) -> Lease {
    let mut metadata = ObjectMeta {
        name: Some(name),
        namespace: Some(config.namespace.clone()),
        ..ObjectMeta::default()
    };
    stamp(&mut metadata, config, role);
    Lease {
        metadata,
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            lease_duration_seconds: Some(seconds(config.lease_duration)),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// A new shard Lease held by us (for a create).
pub fn new_shard(config: &Config, shard: u32, now: Timestamp) -> Lease {
    fresh(config.shard_lease_name(shard), config, ROLE_SHARD, now)
}

/// A new member Lease for us (for a create).
pub fn new_member(config: &Config, now: Timestamp) -> Lease {
    fresh(config.member_lease_name(), config, ROLE_MEMBER, now)
}

/// `read` taken over by us: holder, times, duration and transitions set.
pub fn acquired(read: &Lease, config: &Config, role: &str, now: Timestamp) -> Lease {
    let mut lease = read.clone();
    stamp(&mut lease.metadata, config, role);
    let previous = holder(read).map(str::to_owned);
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if previous.as_deref() != Some(config.identity.as_str()) {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        spec.acquire_time = Some(MicroTime(now));
    }
    spec.holder_identity = Some(config.identity.clone());
    spec.lease_duration_seconds = Some(seconds(config.lease_duration));
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// `read` (held by us) renewed.
pub fn renewed(read: &Lease, config: &Config, role: &str, now: Timestamp) -> Lease {
    acquired(read, config, role, now)
}

/// Record `demand` on a member Lease.
pub fn set_demand(lease: &mut Lease, demand: u32) {
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_DEMAND.to_owned(), demand.to_string());
}

/// `read` (held by us) released: the holder cleared.
pub fn cleared(read: &Lease, now: Timestamp) -> Lease {
    let mut lease = read.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(now));
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new("ns", "kms", "kms-0")
    }

    #[test]
    fn new_shard_lease_is_labelled_and_held() {
        let l = new_shard(&config(), 7, Timestamp::UNIX_EPOCH);
        assert_eq!(l.metadata.name.as_deref(), Some("kms-shard-07"));
        assert_eq!(l.metadata.namespace.as_deref(), Some("ns"));
        let labels = l.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some("kms"));
        assert_eq!(labels.get(LABEL_ROLE).map(String::as_str), Some(ROLE_SHARD));
        assert_eq!(holder(&l), Some("kms-0"));
        assert_eq!(duration(&l), Some(Duration::from_secs(10)));
        assert_eq!(annotation_u32(&l, ANNOTATION_SHARDS), Some(16));
        assert_eq!(
            annotation_u32(&l, ANNOTATION_HASH_VERSION),
            Some(HASH_VERSION)
        );
        assert!(l.metadata.resource_version.is_none());
    }

    #[test]
    fn acquire_keeps_the_resource_version_and_counts_transitions() {
        let mut read = new_shard(&config(), 1, Timestamp::UNIX_EPOCH);
        read.metadata.resource_version = Some("42".into());
        read.metadata.labels = None;
        if let Some(spec) = read.spec.as_mut() {
            spec.holder_identity = Some("kms-1".into());
            spec.lease_transitions = Some(3);
            spec.strategy = Some("OldestEmulationVersion".into());
        }
        let c = config();
        let l = acquired(&read, &c, ROLE_SHARD, Timestamp::UNIX_EPOCH);
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(holder(&l), Some("kms-0"));
        let spec = l.spec.clone().unwrap_or_default();
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
        assert!(
            l.metadata
                .labels
                .as_ref()
                .is_some_and(|m| m.contains_key(LABEL_GROUP))
        );
        // Renewing our own Lease is not a transition.
        let r = renewed(&l, &c, ROLE_SHARD, Timestamp::UNIX_EPOCH);
        assert_eq!(r.spec.and_then(|s| s.lease_transitions), Some(4));
    }

    #[test]
    fn release_clears_the_holder_only() {
        let mut read = new_shard(&config(), 1, Timestamp::UNIX_EPOCH);
        read.metadata.resource_version = Some("9".into());
        let l = cleared(&read, Timestamp::UNIX_EPOCH);
        assert_eq!(holder(&l), None);
        assert_eq!(l.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(duration(&l), Some(Duration::from_secs(10)));
    }

    #[test]
    fn readers_tolerate_odd_values() {
        let mut l = new_member(&config(), Timestamp::UNIX_EPOCH);
        if let Some(spec) = l.spec.as_mut() {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(-5);
        }
        if let Some(a) = l.metadata.annotations.as_mut() {
            a.insert(ANNOTATION_SHARDS.into(), "sixteen".into());
        }
        assert_eq!(holder(&l), None);
        assert_eq!(duration(&l), None);
        assert_eq!(annotation_u32(&l, ANNOTATION_SHARDS), None);
        assert_eq!(holder(&Lease::default()), None);
    }
}
