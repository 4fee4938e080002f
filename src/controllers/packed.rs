//! The store behind every watch: each object kept as the JSON the watch
//! delivered it in (already without its managed fields and `kubectl`'s
//! last-applied copy), decoded again when it is read.
//!
//! Decoded, a cached object costs several times its JSON: `k8s-openapi`
//! keeps labels, annotations and data in `BTreeMap`s whose first node is
//! about 0.5 KiB even for two entries, and every string is an allocation
//! of its own. At 10,000 resources the watch caches are most of a
//! replica's memory (`docs/performance.md`, "Cached objects as JSON").
//! A read costs a decode (microseconds for a KmsSecret or a Secret);
//! a reconcile reads its resource and its targets once each.
//!
//! The scans that run over every object of a kind (a full pass, the prune
//! of a resource's targets, forgetting deleted resources) read a few
//! fields kept decoded apart ([`Head`]: namespace, name, uid, and the values
//! of one label and one annotation named when the store is made: the shard
//! label and the owner annotation) and decode only what they pick. The
//! objects are also indexed by owner annotation, so a resource finds its
//! own targets ([`Packed::owned_by`]) without a scan of every object: a
//! scan per reconcile was quadratic in the objects a replica holds.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::Resource;
use kube::runtime::watcher::Event;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The fields of a cached object that scans read without decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head<'a> {
    /// Namespace (`None` for a cluster-scoped object).
    pub namespace: Option<&'a str>,
    /// Name.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: Option<&'a str>,
    /// The value of the store's label (the shard label).
    pub shard: Option<&'a str>,
    /// The value of the store's annotation (a managed object's owner).
    pub owner: Option<&'a str>,
}

/// One cached object.
struct Entry {
    json: Box<[u8]>,
    /// Its `resourceVersion` as a number (0 when it is not one).
    version: u64,
    uid: Option<Box<str>>,
    shard: Option<Box<str>>,
    owner: Option<Box<str>>,
    /// The list that last delivered it ([`Inner::epoch`]): a re-list
    /// drops what it did not deliver.
    listed: u32,
}

/// A `resourceVersion` as a number, 0 when it is none. The API server
/// documents versions as opaque; those of one kind are etcd revisions in
/// practice, and are compared here only to tell which of two copies of an
/// object is newer when a list and a watch both deliver it (0 on either
/// side: the later delivery wins).
pub(crate) fn version_of(rv: Option<&str>) -> u64 {
    rv.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Whether a copy at `incoming` is older than one at `held`.
pub(crate) fn older(incoming: u64, held: u64) -> bool {
    incoming != 0 && held != 0 && incoming < held
}

/// `namespace/name`, or `/name` for a cluster-scoped object (neither part
/// may contain a `/`).
pub(crate) fn key(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or_default())
}

fn head<'a>(key: &'a str, e: &'a Entry) -> Head<'a> {
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    Head {
        namespace: Some(namespace).filter(|n| !n.is_empty()),
        name,
        uid: e.uid.as_deref(),
        shard: e.shard.as_deref(),
        owner: e.owner.as_deref(),
    }
}

/// Changes to any store of this process (every write access counts, and a
/// store added or removed): what a periodic scan of the stores compares to
/// skip the scan when nothing changed since the last.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// The count of changes to the stores of this process so far (see
/// [`CHANGES`]); equal counts mean no store changed in between.
pub fn changes() -> u64 {
    CHANGES.load(Ordering::Acquire)
}

/// Count one change to the stores (a store added or removed).
pub(crate) fn note_change() {
    CHANGES.fetch_add(1, Ordering::AcqRel);
}

/// Cached objects by [`key`], indexed by owner annotation.
#[derive(Default)]
struct Objects {
    map: HashMap<Box<str>, Entry>,
    /// The keys of the objects with an owner annotation, by its value.
    by_owner: HashMap<Box<str>, HashSet<Box<str>>>,
}

impl Objects {
    fn get(&self, key: &str) -> Option<&Entry> {
        self.map.get(key)
    }

    fn insert(&mut self, key: Box<str>, entry: Entry) {
        if let Some(owner) = &entry.owner {
            self.by_owner
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
        }
        if let Some(old) = self.map.insert(key.clone(), entry) {
            self.unindex(&key, &old);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.map.remove(key) {
            self.unindex(key, &old);
        }
    }

    /// Drop `key` from the index under `old`'s owner, unless the entry now
    /// held under `key` has that owner too.
    fn unindex(&mut self, key: &str, old: &Entry) {
        let Some(owner) = &old.owner else {
            return;
        };
        if self.map.get(key).and_then(|e| e.owner.as_ref()) == Some(owner) {
            return;
        }
        forget_owned(&mut self.by_owner, owner, key);
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &Entry) -> bool) {
        let by_owner = &mut self.by_owner;
        self.map.retain(|k, e| {
            let kept = keep(k, e);
            if !kept && let Some(owner) = &e.owner {
                forget_owned(by_owner, owner, k);
            }
            kept
        });
    }

    fn iter(&self) -> impl Iterator<Item = (&Box<str>, &Entry)> {
        self.map.iter()
    }

    /// The entries whose owner annotation is `owner`.
    fn owned_by<'a>(&'a self, owner: &str) -> impl Iterator<Item = (&'a Box<str>, &'a Entry)> {
        self.by_owner
            .get(owner)
            .into_iter()
            .flatten()
            .filter_map(|k| self.map.get_key_value(k))
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Drop `key` from `owner`'s keys in the index (and `owner` with its last
/// key).
fn forget_owned(by_owner: &mut HashMap<Box<str>, HashSet<Box<str>>>, owner: &str, key: &str) {
    if let Some(keys) = by_owner.get_mut(owner) {
        keys.remove(key);
        if keys.is_empty() {
            by_owner.remove(owner);
        }
    }
}

#[derive(Default)]
struct Inner {
    objects: Objects,
    /// The count of lists started.
    epoch: u32,
    /// A list in progress (between `Init` and `InitDone`), by its epoch.
    /// Each object it delivers replaces the cached copy at once (unless
    /// that is newer), so the store never shows an older copy than the
    /// event just handed on; once complete, the objects it did not deliver
    /// (deleted meanwhile) are dropped. kube's reflector store instead
    /// keeps a second copy of everything and swaps it in at the end: until
    /// then readers would see older copies than the events they are told
    /// of, and a re-list would hold every object twice.
    listing: Option<u32>,
}

impl Inner {
    /// Take a listed copy unless the store holds the same or a newer one,
    /// and mark the entry as delivered by the list in progress, if any.
    /// Whether it was new or changed.
    fn take_listed(&mut self, key: Box<str>, e: Entry) -> bool {
        let fresh = match self.objects.get(&key) {
            None => true,
            Some(held) => held.json != e.json && !older(e.version, held.version),
        };
        if fresh {
            self.objects.insert(key.clone(), e);
        }
        if let (Some(epoch), Some(e)) = (self.listing, self.objects.map.get_mut(&key)) {
            e.listed = epoch;
        }
        fresh
    }
}

/// Objects of kind `K`, kept as JSON. Cheap to clone (one store).
pub struct Packed<K> {
    inner: Arc<RwLock<Inner>>,
    /// The label and the annotation whose values [`Head`] keeps.
    label: &'static str,
    annotation: &'static str,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            label: self.label,
            annotation: self.annotation,
            kind: PhantomData,
        }
    }
}

impl<K> Packed<K>
where
    K: Resource + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    /// An empty store whose [`Head`]s keep the values of `label` and
    /// `annotation`.
    pub fn new(label: &'static str, annotation: &'static str) -> Self {
        Self {
            inner: Arc::default(),
            label,
            annotation,
            kind: PhantomData,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        let guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        note_change();
        guard
    }

    fn pack(&self, o: &K) -> Option<(Box<str>, Entry)> {
        let meta = o.meta();
        let name = meta.name.as_deref()?;
        let json = match serde_json::to_vec(o) {
            Ok(json) => json.into_boxed_slice(),
            Err(e) => {
                // Our own types always encode; never expected. Only where
                // the error is: serde's message may quote a value.
                tracing::warn!(kind = %K::kind(&K::DynamicType::default()), line = e.line(), column = e.column(), "could not cache an object");
                return None;
            }
        };
        let label = |m: &Option<std::collections::BTreeMap<String, String>>, k: &str| {
            m.as_ref().and_then(|m| m.get(k)).map(|v| v.as_str().into())
        };
        Some((
            key(meta.namespace.as_deref(), name).into_boxed_str(),
            Entry {
                json,
                version: version_of(meta.resource_version.as_deref()),
                uid: meta.uid.as_deref().map(Into::into),
                shard: label(&meta.labels, self.label),
                owner: label(&meta.annotations, self.annotation),
                listed: 0,
            },
        ))
    }

    fn unpack(e: &Entry) -> Option<Arc<K>> {
        match serde_json::from_slice::<K>(&e.json) {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                // What was encoded from a `K` decodes as one; never expected.
                // Only where the error is: serde's message may quote a value.
                tracing::warn!(kind = %K::kind(&K::DynamicType::default()), line = e.line(), column = e.column(), "could not read a cached object");
                None
            }
        }
    }

    /// Apply a watch event: a (re-)list (`Init`, `InitApply`…,
    /// `InitDone`) leaves the store holding what it delivered, each object
    /// taken as it comes ([`Inner::listing`]); `Apply` and `Delete` change
    /// one object.
    pub fn apply(&self, event: &Event<K>) {
        match event {
            Event::Init => {
                let mut inner = self.write();
                inner.epoch = inner.epoch.wrapping_add(1);
                inner.listing = Some(inner.epoch);
            }
            Event::InitApply(o) => {
                if let Some((k, e)) = self.pack(o) {
                    self.write().take_listed(k, e);
                }
            }
            Event::InitDone => {
                let mut inner = self.write();
                if let Some(epoch) = inner.listing.take() {
                    inner.objects.retain(|_, e| e.listed == epoch);
                }
            }
            Event::Apply(o) => {
                if let Some((k, e)) = self.pack(o) {
                    let mut inner = self.write();
                    // A watch delivers in order; an older copy can only
                    // follow a newer one merged from a list.
                    if inner
                        .objects
                        .get(&k)
                        .is_some_and(|held| older(e.version, held.version))
                    {
                        return;
                    }
                    inner.objects.insert(k, e);
                }
            }
            Event::Delete(o) => {
                let meta = o.meta();
                if let Some(name) = meta.name.as_deref() {
                    self.write()
                        .objects
                        .remove(key(meta.namespace.as_deref(), name).as_str());
                }
            }
        }
    }

    /// Merge an object a list outside the watch found (a namespace listed
    /// on its own), unless the store holds a newer copy or the object was
    /// deleted at `deleted` or later (the watch's delete came first).
    /// Whether it was new or changed.
    pub fn merge_listed(&self, o: &K, deleted: Option<u64>) -> bool {
        let Some((k, e)) = self.pack(o) else {
            return false;
        };
        if deleted.is_some_and(|at| !older(at, e.version)) {
            return false;
        }
        // A re-list in progress keeps it too.
        self.write().take_listed(k, e)
    }

    /// Keep only the objects whose [`Head`] passes `keep` (a re-list in
    /// progress brings back only what it delivers after).
    pub fn retain(&self, mut keep: impl FnMut(Head<'_>) -> bool) {
        self.write().objects.retain(|k, e| keep(head(k, e)));
    }

    /// The object, decoded.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        self.get_key(&key(namespace, name))
    }

    /// The object under [`key`]`(namespace, name)`, decoded.
    pub(crate) fn get_key(&self, key: &str) -> Option<Arc<K>> {
        self.read().objects.get(key).and_then(Self::unpack)
    }

    /// The object under [`key`]`(namespace, name)`, its JSON decoded as
    /// the view `T` (the few fields wanted, not a whole `K`).
    pub(crate) fn view_key<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        let inner = self.read();
        serde_json::from_slice(&inner.objects.get(key)?.json).ok()
    }

    /// The `resourceVersion` (as [`version_of`] reads it) of the object
    /// under [`key`]`(namespace, name)`, nothing decoded.
    pub(crate) fn version_key(&self, key: &str) -> Option<u64> {
        self.read().objects.get(key).map(|e| e.version)
    }

    /// Whether the object is cached (nothing decoded).
    pub fn contains(&self, namespace: Option<&str>, name: &str) -> bool {
        self.read()
            .objects
            .get(key(namespace, name).as_str())
            .is_some()
    }

    /// The objects whose [`Head`] passes `pick`, decoded.
    pub fn decode_where(&self, mut pick: impl FnMut(Head<'_>) -> bool) -> Vec<Arc<K>> {
        self.read()
            .objects
            .iter()
            .filter(|(k, e)| pick(head(k, e)))
            .filter_map(|(_, e)| Self::unpack(e))
            .collect()
    }

    /// `f` of every object whose [`Head`] passes `pick`, its JSON decoded
    /// as `T` (a view of the few fields wanted, not a whole `K`), one
    /// object at a time: a scan of every object never holds them all
    /// decoded at once.
    pub fn view_where<T: DeserializeOwned, R>(
        &self,
        mut pick: impl FnMut(Head<'_>) -> bool,
        mut f: impl FnMut(Head<'_>, T) -> R,
    ) -> Vec<R> {
        self.read()
            .objects
            .iter()
            .filter(|(k, e)| pick(head(k, e)))
            .filter_map(|(k, e)| {
                let view = serde_json::from_slice::<T>(&e.json).ok()?;
                Some(f(head(k, e), view))
            })
            .collect()
    }

    /// The objects whose owner annotation is `owner` and whose [`Head`]
    /// passes `pick`, decoded (found by the index, not a scan).
    pub fn owned_by(&self, owner: &str, mut pick: impl FnMut(Head<'_>) -> bool) -> Vec<Arc<K>> {
        self.read()
            .objects
            .owned_by(owner)
            .filter(|(k, e)| pick(head(k, e)))
            .filter_map(|(_, e)| Self::unpack(e))
            .collect()
    }

    /// `f` of every object's [`Head`] that gives something (nothing
    /// decoded).
    pub fn heads<T>(&self, mut f: impl FnMut(Head<'_>) -> Option<T>) -> Vec<T> {
        self.read()
            .objects
            .iter()
            .filter_map(|(k, e)| f(head(k, e)))
            .collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::kms_secret::KmsSecret;
    use k8s_openapi::api::core::v1::Secret;
    use kube::core::ObjectMeta;

    const SHARD_LABEL: &str = "secrets.hanzo.ai/shard";
    const OWNER_ANNOTATION: &str = "secrets.hanzo.ai/owner";

    fn secret(ns: &str, name: &str, value: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": ns, "uid": format!("uid-{name}"),
                "labels": {SHARD_LABEL: "3-of-16", "app": "x"},
                "annotations": {OWNER_ANNOTATION: format!("KmsSecret/{ns}/owner")},
                "ownerReferences": [{"apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
                    "name": "owner", "uid": "u1", "controller": true, "blockOwnerDeletion": true}],
            },
            "type": "Opaque",
            "data": {"K": base64_of(value), "bin": "AP8="},
        }))
        .unwrap()
    }

    fn base64_of(s: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn every_change_to_a_store_is_counted() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        let events = [
            Event::Apply(secret("ns", "a", "v1")),
            Event::Delete(secret("ns", "a", "v1")),
            Event::Init,
            Event::InitApply(secret("ns", "b", "v1")),
            Event::InitDone,
        ];
        for event in &events {
            // Other tests' stores count too: the count only grows.
            let before = changes();
            store.apply(event);
            assert!(changes() > before, "{event:?} was not counted");
        }
        let before = changes();
        store.merge_listed(&secret("ns", "c", "v1"), None);
        assert!(changes() > before);
        let before = changes();
        store.retain(|_| true);
        assert!(changes() > before);
    }

    #[test]
    fn an_object_reads_back_as_it_was_cached() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        let s = secret("ns", "a", "v1");
        store.apply(&Event::Apply(s.clone()));
        assert_eq!(store.get(Some("ns"), "a").as_deref(), Some(&s));
        assert!(store.get(Some("other"), "a").is_none());
        assert!(store.get(None, "a").is_none());
        assert!(store.contains(Some("ns"), "a"));

        // A KmsSecret with spec and status as the API server sends it.
        let cr: KmsSecret = serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": "r", "namespace": "ns", "generation": 2},
            "spec": {
                "hostAPI": "https://kms.example/api",
                "syncConfig": {"resyncInterval": "90s", "instantUpdates": true},
                "authentication": {"universalAuth": {
                    "credentialsRef": {"secretName": "c", "secretNamespace": "ns"},
                    "secretsScope": {"projectSlug": "p", "envSlug": "dev", "secretsPath": "/"}}},
                "managedKubeSecretReferences": [{"secretName": "out", "secretNamespace": "ns",
                    "creationPolicy": "Owner", "template": {"includeAllSecrets": true,
                    "data": {"url": "{{ .DB_URL.Value }}"}}}],
            },
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Synced",
                "message": "Synced 5 secrets", "lastTransitionTime": "2026-12-05T05:43:20Z",
                "observedGeneration": 2}], "syncedKeys": 5},
        }))
        .unwrap();
        let crs = Packed::<KmsSecret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        crs.apply(&Event::Apply(cr.clone()));
        assert_eq!(
            serde_json::to_value(crs.get(Some("ns"), "r").unwrap().as_ref()).unwrap(),
            serde_json::to_value(&cr).unwrap()
        );
    }

    #[test]
    fn heads_are_read_without_decoding() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        store.apply(&Event::Apply(secret("ns", "a", "v")));
        store.apply(&Event::Apply(Secret {
            metadata: ObjectMeta {
                name: Some("bare".into()),
                namespace: Some("ns2".into()),
                ..Default::default()
            },
            ..Default::default()
        }));
        let mut heads = store.heads(|h| Some(format!("{h:?}")));
        heads.sort();
        assert_eq!(
            heads,
            [
                "Head { namespace: Some(\"ns\"), name: \"a\", uid: Some(\"uid-a\"), shard: Some(\"3-of-16\"), owner: Some(\"KmsSecret/ns/owner\") }",
                "Head { namespace: Some(\"ns2\"), name: \"bare\", uid: None, shard: None, owner: None }",
            ]
        );
        let owned = store.decode_where(|h| h.owner == Some("KmsSecret/ns/owner"));
        assert_eq!(owned.len(), 1);
        assert_eq!(owned[0].metadata.name.as_deref(), Some("a"));
    }

    #[test]
    fn events_change_the_store_as_a_reflector_would() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        store.apply(&Event::Apply(secret("ns", "a", "1")));
        store.apply(&Event::Apply(secret("ns", "b", "1")));
        // Updated in place.
        store.apply(&Event::Apply(secret("ns", "a", "2")));
        assert_eq!(store.len(), 2);
        assert_eq!(
            store.get(Some("ns"), "a").unwrap().data.as_ref().unwrap()["K"].0,
            b"2"
        );
        store.apply(&Event::Delete(secret("ns", "b", "1")));
        assert_eq!(store.len(), 1);
        // A re-list: each object it delivers is read at once; once
        // complete, what it did not deliver is gone.
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(secret("ns", "c", "1")));
        assert!(store.contains(Some("ns"), "a"));
        assert!(store.contains(Some("ns"), "c"));
        store.apply(&Event::InitDone);
        assert!(!store.contains(Some("ns"), "a"));
        assert!(store.contains(Some("ns"), "c"));
        // An empty re-list empties it.
        store.apply(&Event::Init);
        store.apply(&Event::InitDone);
        assert!(store.is_empty());
    }

    /// `retain` drops objects from the store and from a re-list in
    /// progress.
    #[test]
    fn retain_drops_objects_from_the_store_and_a_relist() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        store.apply(&Event::Apply(secret("ns", "a", "1")));
        store.apply(&Event::Apply(secret("ns", "b", "1")));
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(secret("ns", "a", "1")));
        store.apply(&Event::InitApply(secret("ns", "b", "2")));
        store.apply(&Event::InitApply(secret("other", "c", "1")));
        store.retain(|h| h.namespace != Some("other"));
        store.apply(&Event::InitDone);
        let mut names = store.heads(|h| Some(h.name.to_owned()));
        names.sort();
        assert_eq!(names, ["a", "b"]);
        store.retain(|h| h.name != "a");
        assert_eq!(store.heads(|h| Some(h.name.to_owned())), ["b"]);
    }

    fn at(mut s: Secret, rv: &str) -> Secret {
        s.metadata.resource_version = Some(rv.into());
        s
    }

    /// A list merged beside a watch: an object is taken unless the store
    /// holds a newer copy or the watch deleted it since; a watch event
    /// older than what a list brought is ignored; a re-list in progress
    /// gets the merged object too.
    #[test]
    fn a_list_merged_beside_the_watch_keeps_the_newest_copy() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        // New: taken.
        assert!(store.merge_listed(&at(secret("ns", "a", "1"), "10"), None));
        // The same again: nothing new.
        assert!(!store.merge_listed(&at(secret("ns", "a", "1"), "10"), None));
        // The watch delivered a newer copy first: the list's older one is
        // left out.
        store.apply(&Event::Apply(at(secret("ns", "b", "new"), "20")));
        assert!(!store.merge_listed(&at(secret("ns", "b", "old"), "15"), None));
        assert_eq!(
            store.get(Some("ns"), "b").unwrap().data.as_ref().unwrap()["K"].0,
            b"new"
        );
        // A newer listed copy replaces an older one.
        assert!(store.merge_listed(&at(secret("ns", "b", "newer"), "25"), None));
        // A watch event older than the merged copy is ignored.
        store.apply(&Event::Apply(at(secret("ns", "b", "late"), "21")));
        assert_eq!(
            store.get(Some("ns"), "b").unwrap().data.as_ref().unwrap()["K"].0,
            b"newer"
        );
        // Deleted by the watch at 30: a list from before does not bring it
        // back; one from after the object was created again does.
        assert!(!store.merge_listed(&at(secret("ns", "c", "1"), "28"), Some(30)));
        assert!(!store.contains(Some("ns"), "c"));
        assert!(store.merge_listed(&at(secret("ns", "c", "2"), "31"), Some(30)));
        // During a re-list, the merged object is in what replaces the store.
        store.apply(&Event::Init);
        assert!(store.merge_listed(&at(secret("ns", "d", "1"), "40"), None));
        store.apply(&Event::InitDone);
        assert!(store.contains(Some("ns"), "d"));
        assert_eq!(version_of(Some("x")), 0);
    }

    /// A re-list hands each object on as it delivers it: the store shows
    /// that copy at once (what reads the store when told of the event must
    /// not find an older one), keeps a newer copy it already holds, and
    /// drops what the list did not deliver only once it is complete.
    #[test]
    fn a_relist_shows_each_delivered_copy_at_once() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        let value = |name: &str| {
            store
                .get(Some("ns"), name)
                .map(|s| s.data.as_ref().unwrap()["K"].0.clone())
        };
        store.apply(&Event::Apply(at(secret("ns", "a", "old"), "10")));
        store.apply(&Event::Apply(at(secret("ns", "gone", "x"), "11")));
        assert!(store.merge_listed(&at(secret("ns", "b", "merged"), "30"), None));
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(at(secret("ns", "a", "new"), "20")));
        assert_eq!(value("a").as_deref(), Some(&b"new"[..]));
        // Not delivered yet: still there.
        assert_eq!(value("gone").as_deref(), Some(&b"x"[..]));
        // The store holds a newer copy than the list's: kept.
        store.apply(&Event::InitApply(at(secret("ns", "b", "listed"), "25")));
        assert_eq!(value("b").as_deref(), Some(&b"merged"[..]));
        store.apply(&Event::InitDone);
        assert_eq!(value("a").as_deref(), Some(&b"new"[..]));
        assert_eq!(value("b").as_deref(), Some(&b"merged"[..]));
        assert_eq!(value("gone"), None);
        assert_eq!(store.len(), 2);
        // A later re-list keeps only what it delivers again.
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(at(secret("ns", "b", "merged"), "30")));
        store.apply(&Event::InitDone);
        assert_eq!((value("a"), store.len()), (None, 1));
    }

    #[test]
    fn objects_are_found_by_owner_as_they_change() {
        let store = Packed::<Secret>::new(SHARD_LABEL, OWNER_ANNOTATION);
        let names = |owner: &str| {
            let mut v: Vec<String> = store
                .owned_by(owner, |_| true)
                .iter()
                .map(|s| s.metadata.name.clone().unwrap_or_default())
                .collect();
            v.sort();
            v
        };
        let owned = |ns: &str, name: &str, owner: &str| {
            let mut s = secret(ns, name, "v");
            s.metadata.annotations = Some([(OWNER_ANNOTATION.to_owned(), owner.to_owned())].into());
            s
        };
        store.apply(&Event::Apply(owned("ns", "a", "KmsSecret/ns/x")));
        store.apply(&Event::Apply(owned("ns", "b", "KmsSecret/ns/x")));
        store.apply(&Event::Apply(owned("ns", "c", "KmsSecret/ns/y")));
        assert_eq!(names("KmsSecret/ns/x"), ["a", "b"]);
        assert_eq!(names("KmsSecret/ns/y"), ["c"]);
        // The same object again, then under another owner, then none.
        store.apply(&Event::Apply(owned("ns", "a", "KmsSecret/ns/x")));
        assert_eq!(names("KmsSecret/ns/x"), ["a", "b"]);
        store.apply(&Event::Apply(owned("ns", "b", "KmsSecret/ns/y")));
        assert_eq!(names("KmsSecret/ns/x"), ["a"]);
        assert_eq!(names("KmsSecret/ns/y"), ["b", "c"]);
        let mut bare = secret("ns", "c", "v");
        bare.metadata.annotations = None;
        store.apply(&Event::Apply(bare));
        assert_eq!(names("KmsSecret/ns/y"), ["b"]);
        // `pick` filters what the index finds.
        assert!(
            store
                .owned_by("KmsSecret/ns/y", |h| h.name != "b")
                .is_empty()
        );
        // Deleted, retained away, relisted.
        store.apply(&Event::Delete(owned("ns", "a", "KmsSecret/ns/x")));
        assert!(names("KmsSecret/ns/x").is_empty());
        store.retain(|h| h.name != "b");
        assert!(names("KmsSecret/ns/y").is_empty());
        store.apply(&Event::Apply(owned("ns", "e", "KmsSecret/ns/x")));
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(owned("ns", "d", "KmsSecret/ns/x")));
        // A listed object is indexed at once; one the list has not
        // delivered (yet) stays until the list completes.
        assert_eq!(names("KmsSecret/ns/x"), ["d", "e"]);
        store.apply(&Event::InitDone);
        assert_eq!(names("KmsSecret/ns/x"), ["d"]);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_cluster_scoped_object_has_no_namespace() {
        let store =
            Packed::<k8s_openapi::api::core::v1::Namespace>::new(SHARD_LABEL, OWNER_ANNOTATION);
        store.apply(&Event::Apply(k8s_openapi::api::core::v1::Namespace {
            metadata: ObjectMeta {
                name: Some("team-a".into()),
                ..Default::default()
            },
            ..Default::default()
        }));
        assert!(store.get(None, "team-a").is_some());
        assert_eq!(
            store.heads(|h| Some(h.namespace.map(str::to_owned))),
            [None]
        );
    }
}
