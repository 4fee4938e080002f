//! The Leases as this replica last observed them, each with the instant (on
//! our monotonic clock) at which we first saw its current resourceVersion.
//! Fed by the watch, by reads after a conflict, and by the responses to our
//! own writes; turned into the [`crate::decide`] inputs.
//!
//! Updates are ordered by resourceVersion where the server's versions are
//! comparable (decimal integers, as Kubernetes guarantees since 1.35), so a
//! late watch event never rolls a Lease back behind the response to one of
//! our writes. Versions that do not compare are taken as they come.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use crate::config::{ANNOTATION_DEMAND, ANNOTATION_HASH_VERSION, ANNOTATION_SHARDS, Config};
use crate::decide::{Member, Observed};
use crate::lease::{annotation_u32, duration, holder};

/// Compare two resourceVersions as Kubernetes defines it: positive decimal
/// integers without leading zeros, compared by value. `None` when either is
/// not such a number.
pub fn compare_resource_versions(a: &str, b: &str) -> Option<Ordering> {
    let valid =
        |v: &str| !v.is_empty() && !v.starts_with('0') && v.bytes().all(|c| c.is_ascii_digit());
    (valid(a) && valid(b)).then(|| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// One observed Lease.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The Lease as last read.
    pub lease: Lease,
    /// When we first saw its current resourceVersion.
    pub changed_at: Instant,
    /// When the entry was last written (by any source).
    pub touched_at: Instant,
}

/// The observed Leases, by name.
#[derive(Debug, Clone, Default)]
pub struct Store {
    entries: BTreeMap<String, Entry>,
}

fn rv(lease: &Lease) -> &str {
    lease.metadata.resource_version.as_deref().unwrap_or("")
}

impl Store {
    /// Record a Lease read at `now`. Returns whether it is news (a
    /// resourceVersion we had not seen, and not older than the one we have).
    pub fn apply(&mut self, lease: Lease, now: Instant) -> bool {
        let Some(name) = lease.metadata.name.clone() else {
            return false;
        };
        if let Some(entry) = self.entries.get_mut(&name) {
            let (old, new) = (rv(&entry.lease), rv(&lease));
            let news = match compare_resource_versions(new, old) {
                Some(Ordering::Greater) => true,
                Some(_) => false,
                None => new != old,
            };
            if news {
                entry.lease = lease;
                entry.changed_at = now;
            }
            entry.touched_at = now;
            return news;
        }
        self.entries.insert(
            name,
            Entry {
                lease,
                changed_at: now,
                touched_at: now,
            },
        );
        true
    }

    /// A deletion seen by the watch (the object carries its last version).
    /// Ignored when we already hold a newer version of the name.
    pub fn delete(&mut self, lease: &Lease) -> bool {
        let Some(name) = lease.metadata.name.as_deref() else {
            return false;
        };
        let newer = self.entries.get(name).is_some_and(|entry| {
            compare_resource_versions(rv(&entry.lease), rv(lease)) == Some(Ordering::Greater)
        });
        !newer && self.entries.remove(name).is_some()
    }

    /// Forget a name outright (a read answered 404).
    pub fn forget(&mut self, name: &str) -> bool {
        self.entries.remove(name).is_some()
    }

    /// After a full relist that started at `since`: drop the entries that were
    /// not listed and not written since.
    pub fn retain_listed(&mut self, listed: &BTreeSet<String>, since: Instant) {
        self.entries
            .retain(|name, entry| listed.contains(name) || entry.touched_at >= since);
    }

    /// The entry for `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// All entries by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// The shard Leases of `config` as [`Observed`] values, by shard.
    pub fn shard_leases(&self, config: &Config) -> BTreeMap<u32, Observed> {
        self.entries
            .iter()
            .filter_map(|(name, entry)| {
                let shard = config.shard_of_lease(name)?;
                Some((shard, observe(entry, config.lease_duration)))
            })
            .collect()
    }

    /// The member Leases of `config` as [`Member`] values.
    pub fn members(&self, config: &Config) -> Vec<Member> {
        let prefix = format!("{}-member-", config.prefix);
        self.entries
            .iter()
            .filter(|(name, _)| config.is_member_lease(name))
            .filter_map(|(name, entry)| {
                Some(Member {
                    identity: name.strip_prefix(&prefix)?.to_owned(),
                    lease: observe(entry, config.lease_duration),
                    shards: annotation_u32(&entry.lease, ANNOTATION_SHARDS),
                    hash_version: annotation_u32(&entry.lease, ANNOTATION_HASH_VERSION),
                    demand: annotation_u32(&entry.lease, ANNOTATION_DEMAND),
                })
            })
            .collect()
    }
}

/// An entry as the decision function sees it: holder, when it changed on our
/// clock, and its duration (ours when the Lease has none). The holder's
/// `renewTime` plays no part.
pub fn observe(entry: &Entry, default_duration: Duration) -> Observed {
    Observed {
        holder: holder(&entry.lease).map(str::to_owned),
        changed_at: entry.changed_at,
        duration: duration(&entry.lease).unwrap_or(default_duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    fn config() -> Config {
        Config::new("ns", "kms", "kms-0")
    }

    fn lease(name: &str, rv: &str, holder: Option<&str>) -> Lease {
        let mut l = crate::lease::new_shard(&config(), 0, Timestamp::UNIX_EPOCH);
        l.metadata.name = Some(name.to_owned());
        l.metadata.resource_version = Some(rv.to_owned());
        if let Some(spec) = l.spec.as_mut() {
            spec.holder_identity = holder.map(str::to_owned);
        }
        l
    }

    #[test]
    fn resource_versions_compare_as_integers() {
        assert_eq!(compare_resource_versions("9", "10"), Some(Ordering::Less));
        assert_eq!(
            compare_resource_versions("100", "99"),
            Some(Ordering::Greater)
        );
        assert_eq!(compare_resource_versions("42", "42"), Some(Ordering::Equal));
        assert_eq!(compare_resource_versions("0", "1"), None);
        assert_eq!(compare_resource_versions("01", "1"), None);
        assert_eq!(compare_resource_versions("abc", "1"), None);
        assert_eq!(compare_resource_versions("", "1"), None);
    }

    #[test]
    fn stale_updates_do_not_roll_back() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut store = Store::default();
        assert!(store.apply(lease("kms-shard-00", "10", Some("kms-0")), t0));
        // A late watch event of an older version is ignored.
        assert!(!store.apply(lease("kms-shard-00", "9", Some("kms-1")), t1));
        // The same version again is not a change: the clock keeps running.
        assert!(!store.apply(lease("kms-shard-00", "10", Some("kms-0")), t1));
        let e = store.get("kms-shard-00").expect("entry");
        assert_eq!(e.changed_at, t0);
        assert_eq!(holder(&e.lease), Some("kms-0"));
        // A newer one restarts it.
        assert!(store.apply(lease("kms-shard-00", "11", Some("kms-0")), t1));
        assert_eq!(store.get("kms-shard-00").map(|e| e.changed_at), Some(t1));
        // A stale delete is ignored; a current one removes.
        assert!(!store.delete(&lease("kms-shard-00", "10", None)));
        assert!(store.delete(&lease("kms-shard-00", "11", None)));
        assert!(store.get("kms-shard-00").is_none());
    }

    #[test]
    fn incomparable_versions_are_taken_as_they_come() {
        let t0 = Instant::now();
        let mut store = Store::default();
        store.apply(lease("kms-shard-00", "b", None), t0);
        assert!(store.apply(lease("kms-shard-00", "a", Some("x")), t0));
        assert!(!store.apply(lease("kms-shard-00", "a", Some("x")), t0));
    }

    #[test]
    fn renew_time_skew_does_not_matter() {
        // The holder's renewTime is an hour in the past or in the future: the
        // Lease is judged only by when we saw it change.
        let t0 = Instant::now();
        for offset in [-3600, 3600] {
            let mut l = lease("kms-shard-00", "5", Some("kms-1"));
            let when = Timestamp::now()
                .checked_add(SignedDuration::from_secs(offset))
                .unwrap_or(Timestamp::UNIX_EPOCH);
            if let Some(spec) = l.spec.as_mut() {
                spec.renew_time = Some(MicroTime(when));
            }
            let mut store = Store::default();
            store.apply(l, t0);
            let leases = store.shard_leases(&config());
            let observed = leases.get(&0).expect("shard 0");
            assert!(!observed.is_expired(t0 + Duration::from_secs(9)));
            assert!(observed.is_expired(t0 + Duration::from_secs(10)));
        }
    }

    #[test]
    fn relist_drops_unlisted_entries_not_written_since() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut store = Store::default();
        store.apply(lease("kms-shard-00", "1", None), t0);
        store.apply(lease("kms-shard-01", "1", None), t0);
        store.apply(lease("kms-shard-02", "1", None), t1);
        let listed = BTreeSet::from(["kms-shard-01".to_owned()]);
        store.retain_listed(&listed, t1);
        assert!(store.get("kms-shard-00").is_none());
        assert!(store.get("kms-shard-01").is_some());
        assert!(
            store.get("kms-shard-02").is_some(),
            "written after the list began"
        );
    }

    #[test]
    fn members_and_shards_are_read_from_names() {
        let t0 = Instant::now();
        let c = config();
        let mut store = Store::default();
        let mut m =
            crate::lease::new_member(&Config::new("ns", "kms", "kms-1"), Timestamp::UNIX_EPOCH);
        m.metadata.resource_version = Some("3".into());
        crate::lease::set_demand(&mut m, 120);
        store.apply(m, t0);
        store.apply(lease("kms-shard-03", "4", Some("kms-1")), t0);
        store.apply(lease("kms-shard-99", "4", Some("kms-1")), t0);
        store.apply(lease("other-shard-01", "4", Some("kms-1")), t0);
        let members = store.members(&c);
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].identity, "kms-1");
        assert_eq!(members[0].shards, Some(16));
        assert_eq!(members[0].hash_version, Some(crate::HASH_VERSION));
        assert_eq!(members[0].demand, Some(120));
        let shards = store.shard_leases(&c);
        assert_eq!(shards.keys().copied().collect::<Vec<_>>(), vec![3]);
    }
}
