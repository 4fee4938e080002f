//! Watched caches: a store per watched namespace (or one for the whole
//! cluster; for kinds split by shard, one per owned shard selected by
//! label, or, for the resources, one for the whole cluster that keeps the
//! owned shards' objects: `KeptWatch`), queried as one, with a callback
//! on every watch event so controllers can turn events into queue
//! entries. Objects are stored without their managed fields and
//! `kubectl`'s last-applied copy, as JSON decoded on read
//! ([`super::packed`]).
//!
//! Two things no single object may break:
//!
//! - **Decoding.** An object this version's types cannot decode (a field
//!   value a later schema removed, say) would fail the whole list, so the
//!   kind's watch would never sync and the replica would never start. Each
//!   object is decoded on its own: one that fails is skipped and reported
//!   once per version ([`Undecodable`]: a Warning Event on it, one log line
//!   naming it without its body, the `kms_operator_undecodable_objects`
//!   gauge); every other object and kind goes on.
//! - **Readiness.** Whether a store has its initial list is a flag the
//!   watch sets ([`Ready`]); asking it never touches the start-up task's
//!   wait (kube's `wait_until_ready` keeps one waker only, so a readiness
//!   probe that polled it could steal the start-up task's wake-up).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::core::NamespaceResourceScope as NamespaceScope;
use kube::core::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType};

use super::events::Recorder;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::packed::{Head, Packed};
use crate::metrics::Metrics;

/// Whether a watch has delivered its initial list. Cheap to clone; any
/// number of tasks may wait on it or ask it.
#[derive(Clone)]
pub struct Ready(watch::Receiver<bool>);

impl Ready {
    /// A flag not set yet, and the sender that sets it.
    pub fn new() -> (watch::Sender<bool>, Ready) {
        let (tx, rx) = watch::channel(false);
        (tx, Ready(rx))
    }

    /// Whether the initial list has been delivered.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Wait for the initial list (returns at once when it was delivered).
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        // An error means the watch is gone for good (shutdown).
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// A kind whose objects a watch can decode, cache and hand between tasks.
pub trait Object: Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static {}

impl<K: Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static> Object for K {}

/// A namespaced kind that can be watched into a [`Scoped`] cache (its
/// `DynamicType` is what typed kinds have: `()`).
pub trait Namespaced:
    Resource<Scope = NamespaceScope, DynamicType: Default + Hash + Eq + Clone + Send + Sync> + Object
{
}

impl<K> Namespaced for K where
    K: Resource<Scope = NamespaceScope, DynamicType: Default + Hash + Eq + Clone + Send + Sync>
        + Object
{
}

/// One watch's store: of a namespace (or the whole cluster), and of one
/// shard when the watch is split by shard.
struct Part<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    shard: Option<u32>,
    /// The label and value a shard's watch selects by.
    selects: Option<(&'static str, String)>,
    /// A watch of every namespace that keeps those of some shards: their
    /// shards (for counting by shard).
    split: Option<ShardOf>,
    namespace: Option<String>,
    store: Packed<K>,
    ready: Ready,
    /// The task that drives a shard's watch (stopped when the shard goes).
    task: Option<tokio::task::AbortHandle>,
}

/// Stores of one kind over the watched namespaces, queried as one. A kind
/// watched by shard (see [`ShardScopes`]) gains a store when a shard is
/// gained and loses it when the shard goes; the others are fixed.
pub struct Scoped<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    parts: Arc<RwLock<Vec<Part<K>>>>,
    /// The watched namespaces (empty: all of them).
    namespaces: Arc<[String]>,
}

impl<K: Resource + Clone + 'static> Clone for Scoped<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn clone(&self) -> Self {
        Self {
            parts: self.parts.clone(),
            namespaces: self.namespaces.clone(),
        }
    }
}

impl<K> Scoped<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    pub(super) fn empty(namespaces: &[String]) -> Self {
        Self {
            parts: Arc::new(RwLock::new(Vec::new())),
            namespaces: namespaces.to_vec().into(),
        }
    }

    fn parts(&self) -> std::sync::RwLockReadGuard<'_, Vec<Part<K>>> {
        self.parts.read().unwrap_or_else(|e| e.into_inner())
    }

    fn parts_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Part<K>>> {
        let guard = self.parts.write().unwrap_or_else(|e| e.into_inner());
        super::packed::note_change();
        guard
    }

    /// The cached object, if it exists and this replica watches it (its
    /// namespace is watched and, for a kind watched by shard, its shard is
    /// this replica's).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let key = super::packed::key(namespace, name);
        self.parts()
            .iter()
            .filter(|p| p.namespace.is_none() || p.namespace.as_deref() == namespace)
            .find_map(|p| p.store.get_key(&key))
    }

    /// The cached object as [`Scoped::get`] finds it, its JSON decoded as
    /// the view `T` (the few fields wanted, not a whole `K`).
    pub fn view<T: serde::de::DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<T> {
        let key = super::packed::key(namespace, name);
        self.parts()
            .iter()
            .filter(|p| p.namespace.is_none() || p.namespace.as_deref() == namespace)
            .find_map(|p| p.store.view_key(&key))
    }

    /// The cached object's `resourceVersion` as a number (see
    /// [`super::packed::version_of`]), nothing decoded: equal numbers
    /// mean the same copy.
    pub fn version(&self, namespace: Option<&str>, name: &str) -> Option<u64> {
        let key = super::packed::key(namespace, name);
        self.parts()
            .iter()
            .filter(|p| p.namespace.is_none() || p.namespace.as_deref() == namespace)
            .find_map(|p| p.store.version_key(&key))
    }

    /// Whether `namespace` is watched (by this replica or another).
    pub fn covers(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Every cached object (once: an object a watch by another label key
    /// also has, because this replica owns both of its shards, is left out
    /// there).
    pub fn all(&self) -> Vec<Arc<K>> {
        self.decode_where(|_| true)
    }

    /// The cached objects whose [`Head`] passes `pick`, decoded (once, as
    /// in [`Scoped::all`]).
    fn decode_where(&self, mut pick: impl FnMut(Head<'_>) -> bool) -> Vec<Arc<K>> {
        self.each_part(|p, here| p.store.decode_where(|h| here(&h) && pick(h)))
    }

    /// What `each` gives for every part, given the test that lists an object
    /// in that part only (once, as in [`Scoped::all`]).
    fn each_part<T, I: IntoIterator<Item = T>>(
        &self,
        mut each: impl FnMut(&Part<K>, &dyn Fn(&Head<'_>) -> bool) -> I,
    ) -> Vec<T> {
        let parts = self.parts();
        let primary = primary_shards(&parts);
        parts
            .iter()
            .flat_map(|p| each(p, &|h| listed_here(p, &primary, h)))
            .collect()
    }

    /// `f` of every cached object whose [`Head`] passes `pick`, decoded as
    /// the view `T` one at a time (once per object, as in [`Scoped::all`]).
    pub fn view_where<T: serde::de::DeserializeOwned, R>(
        &self,
        mut pick: impl FnMut(Head<'_>) -> bool,
        mut f: impl FnMut(Head<'_>, T) -> R,
    ) -> Vec<R> {
        self.each_part(|p, here| p.store.view_where(|h| here(&h) && pick(h), &mut f))
    }

    /// The cached objects a managed object's owner annotation names
    /// (`Kind/namespace/name`), decoded.
    pub fn owned_by(&self, owner: &str) -> Vec<Arc<K>> {
        self.each_part(|p, here| p.store.owned_by(owner, |h| here(&h)))
    }

    /// The uids of the cached objects (nothing decoded).
    pub fn uids(&self) -> HashSet<String> {
        self.heads(|h| h.uid.map(str::to_owned))
            .into_iter()
            .collect()
    }

    /// `f` of every cached object's [`Head`] that gives something, nothing
    /// decoded (once per object, as in [`Scoped::all`]).
    pub fn heads<T>(&self, mut f: impl FnMut(Head<'_>) -> Option<T>) -> Vec<T> {
        self.each_part(|p, here| p.store.heads(|h| here(&h).then(|| f(h)).flatten()))
    }

    /// How many objects are cached, per shard (`None`: a watch not split by
    /// shard).
    pub fn counts(&self) -> BTreeMap<Option<u32>, usize> {
        let mut out = BTreeMap::new();
        for p in self.parts().iter() {
            match &p.split {
                Some(of) => {
                    for shard in p.store.heads(|h| Some(of(h.namespace.unwrap_or_default()))) {
                        *out.entry(Some(shard)).or_default() += 1;
                    }
                }
                None => *out.entry(p.shard).or_default() += p.store.len(),
            }
        }
        out
    }

    /// Wait until every store there is now has its initial list.
    pub async fn wait_ready(&self) {
        let readies: Vec<Ready> = self.parts().iter().map(|p| p.ready.clone()).collect();
        for ready in readies {
            ready.wait().await;
        }
    }

    /// Whether every store there is now has its initial list.
    pub fn is_ready(&self) -> bool {
        self.parts().iter().all(|p| p.ready.is_ready())
    }

    /// No store at all (unit tests).
    #[cfg(test)]
    pub fn unwatched() -> Self {
        Self::empty(&[])
    }
}

/// The shard label values of the shards watched by [`SHARD_LABEL`].
fn primary_shards<K: Resource + Clone>(parts: &[Part<K>]) -> HashSet<&str>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    parts
        .iter()
        .filter_map(|p| p.selects.as_ref())
        .filter(|(key, _)| *key == SHARD_LABEL)
        .map(|(_, value)| value.as_str())
        .collect()
}

/// Whether an object of part `p` is listed from there: an object a watch
/// by another label key has is listed by its [`SHARD_LABEL`] watch when
/// this replica runs that one too.
fn listed_here<K: Resource + Clone>(p: &Part<K>, primary: &HashSet<&str>, h: &Head<'_>) -> bool
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    match &p.selects {
        Some((key, _)) if *key != SHARD_LABEL => h.shard.is_none_or(|v| !primary.contains(v)),
        _ => true,
    }
}

/// The annotation `kubectl apply` (client side) keeps the last applied object
/// in: a second copy of the spec that no controller reads.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drop what no controller reads before an object enters a store: its
/// managed fields (often larger than the object itself) and `kubectl`'s copy
/// of the last applied object. At 10,000 resources the stores are most of a
/// replica's memory.
fn slim<K: Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// An object as the API server sent it: decoded, or not decodable by this
/// version's types (then only its metadata, and why).
#[derive(Clone, Debug)]
enum Lenient<K> {
    Decoded(K),
    Undecodable {
        meta: Box<ObjectMeta>,
        error: String,
        /// Its `kind` as the API server sent it (the spelling the cluster
        /// serves, for the Event on it; see `api::served`).
        served_kind: Option<String>,
    },
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        let text = super::managed_fields::without_managed_fields(raw.get());
        match serde_json::from_str::<K>(&text) {
            Ok(k) => Ok(Lenient::Decoded(k)),
            Err(e) => {
                #[derive(Deserialize)]
                struct MetaOnly {
                    #[serde(default)]
                    metadata: ObjectMeta,
                    #[serde(default)]
                    kind: Option<String>,
                }
                let (meta, served_kind) = serde_json::from_str::<MetaOnly>(raw.get())
                    .map(|m| (m.metadata, m.kind))
                    .unwrap_or_default();
                Ok(Lenient::Undecodable {
                    meta: Box::new(meta),
                    error: describe_decode_error(&e),
                    served_kind,
                })
            }
        }
    }
}

// Only decoded from watches; never sent.
impl<K: Serialize> Serialize for Lenient<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Lenient::Decoded(k) => k.serialize(s),
            Lenient::Undecodable { meta, .. } => meta.serialize(s),
        }
    }
}

impl<K: Resource> Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta(),
            Lenient::Undecodable { meta, .. } => meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta_mut(),
            Lenient::Undecodable { meta, .. } => meta,
        }
    }
}

/// What a decoding error says, without the values it may quote: serde's
/// "invalid type: string \"…\", expected u32" names the offending value,
/// which may be anything a user wrote. Variant and field names are kept.
fn describe_decode_error(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let message = message
        .split(" at line ")
        .next()
        .unwrap_or_default()
        .to_owned();
    for prefix in ["invalid type: ", "invalid value: ", "invalid length "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let expected = rest.rsplit(", expected ").next().unwrap_or_default();
            return format!(
                "{}, expected {expected}",
                prefix.trim_end_matches([':', ' '])
            );
        }
    }
    message
}

/// A watched object identified for reporting: kind, namespace, name.
type ObjectId = (String, Option<String>, String);

/// Where objects that cannot be decoded are reported: once per object and
/// version, as a Warning Event on the object, a log line naming it (never
/// its body) and the `kms_operator_undecodable_objects{kind}` gauge.
#[derive(Clone)]
pub struct Undecodable {
    inner: Arc<UndecodableInner>,
}

struct UndecodableInner {
    metrics: Metrics,
    recorder: Option<Recorder>,
    /// Objects skipped now, with the resourceVersion reported.
    skipped: Mutex<HashMap<ObjectId, Option<String>>>,
}

impl Undecodable {
    /// Report into `metrics`, and as Events through `recorder` when given.
    pub fn new(metrics: Metrics, recorder: Option<Recorder>) -> Self {
        Self {
            inner: Arc::new(UndecodableInner {
                metrics,
                recorder,
                skipped: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn skipped_now(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectId, Option<String>>> {
        self.inner.skipped.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gauge(&self, kind: &str, delta: i64) {
        self.inner
            .metrics
            .undecodable_objects
            .with_label_values(&[kind])
            .add(delta);
    }

    /// An object of `kind` (served as `served_kind`, when known) could not
    /// be decoded.
    fn skip(
        &self,
        kind: &str,
        served_kind: Option<&str>,
        api_version: &str,
        meta: &ObjectMeta,
        error: &str,
    ) {
        let id = (
            kind.to_owned(),
            meta.namespace.clone(),
            meta.name.clone().unwrap_or_default(),
        );
        let version = meta.resource_version.clone();
        {
            let mut skipped = self.skipped_now();
            match skipped.insert(id.clone(), version.clone()) {
                Some(old) if old == version => return,
                Some(_) => {}
                None => self.gauge(kind, 1),
            }
        }
        let at = match &id.1 {
            Some(ns) => format!("{ns}/{}", id.2),
            None => id.2.clone(),
        };
        tracing::warn!(
            kind,
            object = %at,
            resource_version = version.as_deref().unwrap_or_default(),
            error,
            "skipped an object this version of kms-operator cannot decode; every other object goes on"
        );
        let Some(recorder) = self.inner.recorder.clone() else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some(api_version.to_owned()),
            kind: Some(served_kind.unwrap_or(kind).to_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: version,
            ..ObjectReference::default()
        };
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: "UndecodableObject".to_owned(),
            note: Some(crate::controllers::conditions::bounded(&format!(
                "kms-operator {} cannot read this {kind} ({error}); it is skipped until it is \
                 corrected or the operator is upgraded",
                env!("CARGO_PKG_VERSION")
            ))),
            action: "Decode".to_owned(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "could not publish an UndecodableObject Event");
            }
        });
    }

    /// An object of `kind` decodes again, or is gone.
    fn clear(&self, kind: &str, namespace: Option<&str>, name: &str) {
        let id = (
            kind.to_owned(),
            namespace.map(str::to_owned),
            name.to_owned(),
        );
        if self.skipped_now().remove(&id).is_some() {
            self.gauge(kind, -1);
        }
    }

    /// A re-list of `kind` over `scope` is complete: skipped objects it did
    /// not list again are gone (or no longer this replica's to report).
    fn relisted(&self, kind: &str, scope: &Coverage, listed: &HashSet<ObjectId>) {
        let mut gone = 0;
        self.skipped_now().retain(|id, _| {
            let in_scope = id.0 == kind && scope.contains(id.1.as_deref());
            let keep = !in_scope || listed.contains(id);
            if !keep {
                gone += 1;
            }
            keep
        });
        if gone > 0 {
            self.gauge(kind, -gone);
        }
    }
}

/// The shard of a namespace.
pub type ShardOf = Arc<dyn Fn(&str) -> u32 + Send + Sync>;

/// Which namespaces a watch keeps the objects of.
type Keep = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What one watch covers: a namespace (or all), and of those the ones
/// `keep` picks (all when `None`).
#[derive(Clone)]
struct Coverage {
    namespace: Option<String>,
    keep: Option<Keep>,
}

impl Coverage {
    /// The namespaces of `shard` (in `namespace`, or all).
    fn shard(namespace: Option<String>, shard: u32, of: ShardOf) -> Self {
        Self {
            namespace,
            keep: Some(Arc::new(move |ns| of(ns) == shard)),
        }
    }

    fn contains(&self, namespace: Option<&str>) -> bool {
        (self.namespace.is_none() || self.namespace.as_deref() == namespace)
            && self
                .keep
                .as_ref()
                .is_none_or(|keep| keep(namespace.unwrap_or_default()))
    }
}

/// Turn watch events of leniently decoded objects into events of `K`:
/// undecodable objects are reported and left out; one that no longer
/// decodes leaves the store (a delete of the copy it holds), so no
/// controller acts on a spec it can no longer read.
fn decoded<K, S>(
    events: S,
    reader: Packed<K>,
    report: Undecodable,
    scope: Coverage,
) -> impl Stream<Item = watcher::Result<Event<K>>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
    S: Stream<Item = watcher::Result<Event<Lenient<K>>>>,
{
    let dt = K::DynamicType::default();
    let kind = K::kind(&dt).into_owned();
    let api_version = K::api_version(&dt).into_owned();
    let mut relisted: Option<HashSet<ObjectId>> = None;
    let stored = move |meta: &ObjectMeta| {
        reader
            .get(
                meta.namespace.as_deref(),
                meta.name.as_deref().unwrap_or_default(),
            )
            .map(|o| (*o).clone())
    };
    events.filter_map(move |item| {
        let out = match item {
            Err(e) => Some(Err(e)),
            Ok(Event::Init) => {
                relisted = Some(HashSet::new());
                Some(Ok(Event::Init))
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = relisted.take() {
                    report.relisted(&kind, &scope, &listed);
                }
                Some(Ok(Event::InitDone))
            }
            Ok(Event::Apply(Lenient::Decoded(k))) => {
                report.clear(&kind, k.meta().namespace.as_deref(), &name_of(k.meta()));
                Some(Ok(Event::Apply(k)))
            }
            Ok(Event::InitApply(Lenient::Decoded(k))) => {
                report.clear(&kind, k.meta().namespace.as_deref(), &name_of(k.meta()));
                Some(Ok(Event::InitApply(k)))
            }
            Ok(Event::Delete(Lenient::Decoded(k))) => {
                report.clear(&kind, k.meta().namespace.as_deref(), &name_of(k.meta()));
                Some(Ok(Event::Delete(k)))
            }
            Ok(Event::Apply(Lenient::Undecodable {
                meta,
                error,
                served_kind,
            })) => {
                report.skip(&kind, served_kind.as_deref(), &api_version, &meta, &error);
                stored(&meta).map(|old| Ok(Event::Delete(old)))
            }
            Ok(Event::InitApply(Lenient::Undecodable {
                meta,
                error,
                served_kind,
            })) => {
                report.skip(&kind, served_kind.as_deref(), &api_version, &meta, &error);
                if let Some(listed) = relisted.as_mut() {
                    listed.insert((kind.clone(), meta.namespace.clone(), name_of(&meta)));
                }
                None
            }
            Ok(Event::Delete(Lenient::Undecodable { meta, .. })) => {
                report.clear(&kind, meta.namespace.as_deref(), &name_of(&meta));
                stored(&meta).map(|old| Ok(Event::Delete(old)))
            }
        };
        futures::future::ready(out)
    })
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// A reflector over `api` whose objects are decoded one by one (see the
/// module docs) and stored as JSON ([`Packed`]): the store, its readiness,
/// and the stream that drives both.
fn lenient_reflector<K>(
    api: Api<Lenient<K>>,
    config: &watcher::Config,
    report: &Undecodable,
    scope: Coverage,
) -> (
    Packed<K>,
    Ready,
    watch::Sender<bool>,
    impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
)
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let store = Packed::new(SHARD_LABEL, OWNER_ANNOTATION);
    let (mark_ready, ready) = Ready::new();
    let stream = reflect(api, config, report, scope, false, store.clone());
    (store, ready, mark_ready, stream)
}

/// The events of a watch of `api` into `store`, each applied to the store
/// before the stream yields it; with `only_covered`, objects outside
/// `scope` are left out before they are decoded further (a watch of every
/// namespace that keeps some).
fn reflect<K>(
    api: Api<Lenient<K>>,
    config: &watcher::Config,
    report: &Undecodable,
    scope: Coverage,
    only_covered: bool,
    store: Packed<K>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let covered = scope.clone();
    let events = watcher::watcher(api, config.clone())
        .default_backoff()
        .filter(move |item| {
            let pass = match item {
                Ok(Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) if only_covered => {
                    covered.contains(o.meta().namespace.as_deref())
                }
                _ => true,
            };
            futures::future::ready(pass)
        })
        .modify(slim::<Lenient<K>>);
    decoded(events, store.clone(), report.clone(), scope).inspect(move |item| {
        if let Ok(event) = item {
            store.apply(event);
        }
    })
}

/// The label the operator puts on the resources it reconciles and on the
/// objects it writes: the shard they belong to, of how many (`5-of-16`). A
/// replica's watches of those kinds select by it, one watch per owned shard.
pub const SHARD_LABEL: &str = "secrets.hanzo.ai/shard";

/// The annotation on a managed object naming the resource that writes it
/// (`<kind>/<namespace>/<name>`). The caches keep its value next to each
/// object's JSON, so a resource finds its own targets without decoding
/// every managed object ([`Scoped::owned_by`]).
pub const OWNER_ANNOTATION: &str = "secrets.hanzo.ai/owner";

/// The label on a managed object in another namespace than its owner's:
/// the shard of its own namespace, where the workloads that use it are
/// rolled (auto-reload) from.
pub const NAMESPACE_SHARD_LABEL: &str = "secrets.hanzo.ai/namespace-shard";

/// The value of [`SHARD_LABEL`] for `shard` of `count` shards. A new hash
/// version (another namespace-to-shard mapping) would make every label
/// stale, so a version after the first is part of the value.
pub fn shard_label_value(shard: u32, count: u32) -> String {
    match shard::HASH_VERSION {
        1 => format!("{shard}-of-{count}"),
        v => format!("{shard}-of-{count}-h{v}"),
    }
}

/// Shard labels of one installation: the shard count and the namespace to
/// shard mapping.
#[derive(Clone)]
pub struct ShardLabels {
    count: u32,
    shard_of: ShardOf,
}

impl ShardLabels {
    /// Labels for `count` shards, `shard_of` mapping namespaces to them.
    pub fn new(count: u32, shard_of: ShardOf) -> Self {
        Self { count, shard_of }
    }

    /// The shard of a namespace.
    pub fn shard_of(&self, namespace: &str) -> u32 {
        (self.shard_of)(namespace)
    }

    /// The label value of `shard`.
    pub fn value(&self, shard: u32) -> String {
        shard_label_value(shard, self.count)
    }

    /// The label selector of `shard`'s objects by label `key`.
    pub fn selector(&self, key: &str, shard: u32) -> String {
        format!("{key}={}", self.value(shard))
    }

    /// The label selector of objects whose label is missing or stale (from
    /// another shard count): no label value of this installation.
    pub fn stale_selector(&self) -> String {
        let values: Vec<String> = (0..self.count).map(|s| self.value(s)).collect();
        format!("{SHARD_LABEL} notin ({})", values.join(","))
    }
}

/// A kind's watch split by shard: started when a shard is gained, stopped
/// when it goes.
trait ShardWatch: Send + Sync {
    /// Start watching `shard` (nothing when it is watched already); the
    /// readiness of its stores.
    fn start(&self, shard: u32) -> Vec<Ready>;
    /// Stop watching `shard` and drop its stores.
    fn stop(&self, shard: u32);
}

/// The watches split by shard: which shards are watched is decided by the
/// caller (the operator follows the coordinator), each kind registered
/// through [`Watches::by_shard`] follows. A shard is *wanted* from the
/// moment it is held, *started* when its watches run and *cached* once they
/// have listed it; only then is its work done.
pub struct ShardScopes {
    labels: ShardLabels,
    watches: Mutex<Vec<Arc<dyn ShardWatch>>>,
    /// Shards wanted; held while watches start or stop, so that a start
    /// and a stop of one shard never interleave.
    wanted: Mutex<HashSet<u32>>,
    cached: Vec<std::sync::atomic::AtomicBool>,
}

impl ShardScopes {
    /// No kind registered yet.
    pub fn new(labels: ShardLabels) -> Arc<Self> {
        let cached = (0..labels.count)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        Arc::new(Self {
            labels,
            watches: Mutex::new(Vec::new()),
            wanted: Mutex::new(HashSet::new()),
            cached,
        })
    }

    /// The labels the watches select by.
    pub fn labels(&self) -> &ShardLabels {
        &self.labels
    }

    fn registered(&self) -> Vec<Arc<dyn ShardWatch>> {
        self.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn wanted(&self) -> MutexGuard<'_, HashSet<u32>> {
        self.wanted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `shard` is held: it may be started.
    pub fn want(&self, shard: u32) {
        self.wanted().insert(shard);
    }

    /// Start watching `shard` in every registered kind, if it is still
    /// wanted: the readiness of its stores.
    pub fn start(&self, shard: u32) -> Vec<Ready> {
        let wanted = self.wanted();
        if !wanted.contains(&shard) {
            return Vec::new();
        }
        self.registered()
            .iter()
            .flat_map(|w| w.start(shard))
            .collect()
    }

    /// `shard`'s stores have their first lists: its work may run (if it is
    /// still wanted).
    pub fn mark_cached(&self, shard: u32) -> bool {
        let wanted = self.wanted();
        let yes = wanted.contains(&shard);
        if let Some(c) = self.cached.get(shard as usize) {
            c.store(yes, std::sync::atomic::Ordering::SeqCst);
        }
        yes
    }

    /// Whether `shard`'s stores are complete.
    pub fn is_cached(&self, shard: u32) -> bool {
        self.cached
            .get(shard as usize)
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Stop watching `shard` in every registered kind and drop its stores.
    pub fn stop(&self, shard: u32) {
        let mut wanted = self.wanted();
        wanted.remove(&shard);
        if let Some(c) = self.cached.get(shard as usize) {
            c.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        for w in self.registered() {
            w.stop(shard);
        }
    }
}

/// What sees a watch's events.
type OnEvent<K> = Arc<dyn Fn(&Event<K>) + Send + Sync>;

/// The watch of kind `K` split by shard.
struct ShardedWatch<K: Namespaced>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    watches: Watches,
    labels: ShardLabels,
    /// The label keys selected by: one watch each.
    keys: Vec<&'static str>,
    config: watcher::Config,
    on_event: OnEvent<K>,
    scoped: Scoped<K>,
}

impl<K> ShardWatch for ShardedWatch<K>
where
    K: Namespaced,
{
    fn start(&self, shard: u32) -> Vec<Ready> {
        let mut parts = self.scoped.parts_mut();
        let started: Vec<Ready> = parts
            .iter()
            .filter(|p| p.shard == Some(shard))
            .map(|p| p.ready.clone())
            .collect();
        if !started.is_empty() {
            return started;
        }
        let mut readies = Vec::new();
        // No label key: the shard's namespaces are watched whole.
        let keys: Vec<Option<&'static str>> = match self.keys.as_slice() {
            [] => vec![None],
            keys => keys.iter().copied().map(Some).collect(),
        };
        for key in keys {
            let mut config = self.config.clone();
            if let Some(key) = key {
                let by_shard = self.labels.selector(key, shard);
                config.label_selector = Some(match &config.label_selector {
                    Some(base) => format!("{base},{by_shard}"),
                    None => by_shard,
                });
            }
            for (namespace, api) in self.watches.apis::<K>(Some((shard, &self.labels))) {
                let scope = Coverage::shard(namespace.clone(), shard, self.labels.shard_of.clone());
                let (store, ready, mark_ready, stream) =
                    lenient_reflector(api, &config, &self.watches.report, scope);
                let on_event = self.on_event.clone();
                let task = tokio::spawn(drive(stream, mark_ready, namespace.clone(), move |e| {
                    on_event(e)
                }))
                .abort_handle();
                readies.push(ready.clone());
                parts.push(Part {
                    shard: Some(shard),
                    selects: key.map(|key| (key, self.labels.value(shard))),
                    split: None,
                    namespace,
                    store,
                    ready,
                    task: Some(task),
                });
            }
        }
        readies
    }

    fn stop(&self, shard: u32) {
        self.scoped.parts_mut().retain(|p| {
            let keep = p.shard != Some(shard);
            if !keep && let Some(task) = &p.task {
                task.abort();
            }
            keep
        });
        // What it skipped there is the new owner's to report.
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let scope = Coverage::shard(None, shard, self.labels.shard_of.clone());
        self.watches.report.relisted(&kind, &scope, &HashSet::new());
    }
}

/// The watch of a resource kind over every namespace, split by shard
/// without a label: one watch of the cluster whose store keeps the objects
/// of the shards started, the others left out as they arrive (before they
/// are decoded further). The first shard started starts the watch, and its
/// first list fills the store. A shard started later is loaded beside the
/// running watch: each namespace of it the watch has seen is listed on its
/// own (a few objects each), and merged into the store unless the watch
/// delivered a newer copy or the object's deletion meanwhile; only objects
/// new to the store reach `on_event`. So a hand-over costs what the gained
/// shards hold, not what the cluster holds. The last shard stopped stops
/// the watch.
struct KeptWatch<K: Namespaced>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    watches: Watches,
    shard_of: ShardOf,
    config: watcher::Config,
    on_event: OnEvent<K>,
    scoped: Scoped<K>,
    kept: Arc<Mutex<Kept>>,
}

/// The shards a `KeptWatch` keeps.
#[derive(Default)]
struct Kept {
    shards: HashSet<u32>,
    /// Each kept shard's readiness.
    readies: HashMap<u32, Ready>,
    /// Shards being loaded, with the objects the watch deleted meanwhile
    /// (key and version), which a list taken earlier must not bring back.
    loading: HashMap<u32, HashMap<String, u64>>,
    /// The tasks loading them.
    loaders: HashMap<u32, tokio::task::AbortHandle>,
    /// Every namespace the watch has delivered a resource of (kept or
    /// not): where a shard started later has resources to list.
    namespaces: HashSet<String>,
    /// Whether the watch runs.
    running: bool,
    /// Whether the running watch has delivered an object yet: a shard
    /// kept before that is in its first list.
    delivered: bool,
}

fn lock_kept(kept: &Mutex<Kept>) -> MutexGuard<'_, Kept> {
    kept.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many namespaces a shard's load lists at once.
const LOAD_CONCURRENCY: usize = 8;

impl<K> KeptWatch<K>
where
    K: Namespaced,
{
    /// Start the watch: the readiness of its first complete list.
    fn spawn(&self, parts: &mut Vec<Part<K>>) -> Ready {
        let store: Packed<K> = Packed::new(SHARD_LABEL, OWNER_ANNOTATION);
        let (mark_ready, ready) = Ready::new();
        let (kept, of) = (self.kept.clone(), self.shard_of.clone());
        let keep: Keep = Arc::new(move |ns| {
            let mut kept = lock_kept(&kept);
            kept.delivered = true;
            if !kept.namespaces.contains(ns) {
                kept.namespaces.insert(ns.to_owned());
            }
            kept.shards.contains(&of(ns))
        });
        let scope = Coverage {
            namespace: None,
            keep: Some(keep),
        };
        let stream = reflect(
            Api::all(self.watches.client.clone()),
            &self.config,
            &self.watches.report,
            scope,
            true,
            store.clone(),
        );
        let (kept, of, on_event) = (
            self.kept.clone(),
            self.shard_of.clone(),
            self.on_event.clone(),
        );
        let stream = stream.inspect(move |item| {
            // A deletion during a shard's load: the load must not bring the
            // object back from a list taken before it.
            if let Ok(Event::Delete(o)) = item {
                let meta = o.meta();
                let ns = meta.namespace.as_deref().unwrap_or_default();
                if let Some(deleted) = lock_kept(&kept).loading.get_mut(&of(ns)) {
                    deleted.insert(
                        super::packed::key(Some(ns), &name_of(meta)),
                        super::packed::version_of(meta.resource_version.as_deref()),
                    );
                }
            }
        });
        let task =
            tokio::spawn(drive(stream, mark_ready, None, move |e| on_event(e))).abort_handle();
        parts.push(Part {
            shard: None,
            selects: None,
            split: Some(self.shard_of.clone()),
            namespace: None,
            store,
            ready: ready.clone(),
            task: Some(task),
        });
        ready
    }

    /// Load `shard` beside the running watch (see the type's docs); `mark`
    /// is set once every namespace of it is listed.
    fn load(&self, shard: u32, store: Packed<K>, first: Ready, mark: watch::Sender<bool>) {
        let (client, kept, of) = (
            self.watches.client.clone(),
            self.kept.clone(),
            self.shard_of.clone(),
        );
        let (on_event, report) = (self.on_event.clone(), self.watches.report.clone());
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let api_version = K::api_version(&K::DynamicType::default()).into_owned();
        lock_kept(&self.kept).loading.insert(shard, HashMap::new());
        let task = tokio::spawn(async move {
            // The watch's first list tells which namespaces exist.
            first.wait().await;
            let mut namespaces: Vec<String> = lock_kept(&kept)
                .namespaces
                .iter()
                .filter(|ns| of(ns) == shard)
                .cloned()
                .collect();
            namespaces.sort();
            let began = tokio::time::Instant::now();
            let n = namespaces.len();
            futures::stream::iter(namespaces)
                .for_each_concurrent(LOAD_CONCURRENCY, |ns| {
                    let api: Api<Lenient<K>> = Api::namespaced(client.clone(), &ns);
                    let (kept, store, on_event, report) = (
                        kept.clone(),
                        store.clone(),
                        on_event.clone(),
                        report.clone(),
                    );
                    let (kind, api_version) = (kind.clone(), api_version.clone());
                    async move {
                        for mut o in list_all(&api, &kind, &ns).await {
                            slim(&mut o);
                            let k = match o {
                                Lenient::Decoded(k) => k,
                                Lenient::Undecodable {
                                    meta,
                                    error,
                                    served_kind,
                                } => {
                                    report.skip(
                                        &kind,
                                        served_kind.as_deref(),
                                        &api_version,
                                        &meta,
                                        &error,
                                    );
                                    continue;
                                }
                            };
                            report.clear(&kind, Some(&ns), &name_of(k.meta()));
                            // Under the lock: a shard stopped meanwhile
                            // (its objects dropped) takes nothing more.
                            let merged = {
                                let kept = lock_kept(&kept);
                                let Some(deleted) = kept.loading.get(&shard) else {
                                    return;
                                };
                                let key = super::packed::key(Some(&ns), &name_of(k.meta()));
                                store.merge_listed(&k, deleted.get(&key).copied())
                            };
                            if merged {
                                on_event(&Event::InitApply(k));
                            }
                        }
                    }
                })
                .await;
            {
                let mut kept = lock_kept(&kept);
                kept.loading.remove(&shard);
                kept.loaders.remove(&shard);
            }
            tracing::debug!(
                kind,
                shard,
                namespaces = n,
                seconds = began.elapsed().as_secs_f64(),
                "shard loaded beside the watch"
            );
            mark.send_replace(true);
        });
        let mut kept = lock_kept(&self.kept);
        // Not when it is done already (or the shard stopped).
        if kept.loading.contains_key(&shard) {
            kept.loaders.insert(shard, task.abort_handle());
        }
    }
}

/// Every object of `K` in `namespace`, a page at a time (retried with a
/// pause until the API server answers).
async fn list_all<K>(api: &Api<Lenient<K>>, kind: &str, namespace: &str) -> Vec<Lenient<K>>
where
    K: Namespaced,
{
    let mut out = Vec::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        match api.list(&params).await {
            Ok(page) => {
                out.extend(page.items);
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(next) => params = params.continue_token(&next),
                    None => return out,
                }
            }
            Err(e) => {
                tracing::warn!(kind, namespace, error = %e, "could not list a gained shard's namespace; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                out.clear();
                params = kube::api::ListParams::default().limit(500);
            }
        }
    }
}

impl<K> ShardWatch for KeptWatch<K>
where
    K: Namespaced,
{
    fn start(&self, shard: u32) -> Vec<Ready> {
        let mut parts = self.scoped.parts_mut();
        let mut kept = lock_kept(&self.kept);
        if let Some(ready) = kept.readies.get(&shard) {
            return vec![ready.clone()];
        }
        kept.shards.insert(shard);
        let running = std::mem::replace(&mut kept.running, true);
        let delivered = kept.delivered;
        if !running {
            kept.delivered = false;
        }
        drop(kept);
        let first = || {
            parts
                .iter()
                .find(|p| p.split.is_some())
                .map(|p| (p.store.clone(), p.ready.clone()))
                .expect("a running watch has its part")
        };
        let ready = match (running, delivered) {
            // The first list brings every shard kept before it delivers.
            (false, _) => self.spawn(&mut parts),
            (true, false) => first().1,
            (true, true) => {
                let (mark, ready) = Ready::new();
                let (store, first) = first();
                self.load(shard, store, first, mark);
                ready
            }
        };
        lock_kept(&self.kept).readies.insert(shard, ready.clone());
        vec![ready]
    }

    fn stop(&self, shard: u32) {
        let mut parts = self.scoped.parts_mut();
        let mut kept = lock_kept(&self.kept);
        if !kept.shards.remove(&shard) {
            return;
        }
        kept.readies.remove(&shard);
        kept.loading.remove(&shard);
        if let Some(task) = kept.loaders.remove(&shard) {
            task.abort();
        }
        if kept.shards.is_empty() {
            kept.running = false;
            parts.retain(|p| {
                if let Some(task) = &p.task {
                    task.abort();
                }
                false
            });
        } else {
            let of = &self.shard_of;
            for p in parts.iter() {
                p.store
                    .retain(|h| of(h.namespace.unwrap_or_default()) != shard);
            }
        }
        drop((kept, parts));
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let scope = Coverage::shard(None, shard, self.shard_of.clone());
        self.watches.report.relisted(&kind, &scope, &HashSet::new());
    }
}

/// What every watch of a replica shares: the client, the watched
/// namespaces (all when empty), where undecodable objects are reported and,
/// for watches split by shard, the shards' scopes.
#[derive(Clone)]
pub struct Watches {
    client: Client,
    namespaces: Vec<String>,
    report: Undecodable,
    by_shard: Option<Arc<ShardScopes>>,
}

impl Watches {
    /// Watches through `client` of `namespaces` (all when empty).
    pub fn new(client: Client, namespaces: Vec<String>, report: Undecodable) -> Self {
        Self {
            client,
            namespaces,
            report,
            by_shard: None,
        }
    }

    /// The same watches split by shard: a kind watched through them caches
    /// only the objects labelled with a shard `scopes` has started, one
    /// watch per shard (and watched namespace).
    pub fn by_shard(&self, scopes: Arc<ShardScopes>) -> Self {
        Self {
            by_shard: Some(scopes),
            ..self.clone()
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The watched namespaces (empty: all of them).
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// The APIs to watch `K` through: the whole cluster, or each watched
    /// namespace (of `shard` only, when given).
    fn apis<K: Namespaced>(
        &self,
        shard: Option<(u32, &ShardLabels)>,
    ) -> Vec<(Option<String>, Api<Lenient<K>>)>
    where
        K::DynamicType: Default,
    {
        if self.namespaces.is_empty() {
            return vec![(None, Api::all(self.client.clone()))];
        }
        self.namespaces
            .iter()
            .filter(|ns| shard.is_none_or(|(s, labels)| labels.shard_of(ns) == s))
            .map(|ns| (Some(ns.clone()), Api::namespaced(self.client.clone(), ns)))
            .collect()
    }

    /// Start watching the namespaced kind `K` with the given watcher
    /// settings. Returns the stores and the futures that drive the watches;
    /// `on_event` sees every event after the store has applied it. Split by
    /// shard ([`Watches::by_shard`]), nothing is watched until a shard is
    /// started, and the shards' watches drive themselves (no futures).
    pub fn watch<K, F>(
        &self,
        config: &watcher::Config,
        on_event: F,
    ) -> (Scoped<K>, Vec<BoxFuture<'static, ()>>)
    where
        K: Namespaced,
        F: Fn(&Event<K>) + Send + Sync + 'static,
    {
        self.watch_by(config, &[], on_event)
    }

    /// [`Watches::watch`], split by shard on each of the label `keys` (one
    /// watch per key: an object may belong to a shard by either). With no
    /// key, the objects belong to their namespace's shard: each watched
    /// namespace of a shard is watched whole, or, watching every namespace,
    /// one watch keeps the shards started (`KeptWatch`).
    pub fn watch_by<K, F>(
        &self,
        config: &watcher::Config,
        keys: &[&'static str],
        on_event: F,
    ) -> (Scoped<K>, Vec<BoxFuture<'static, ()>>)
    where
        K: Namespaced,
        F: Fn(&Event<K>) + Send + Sync + 'static,
    {
        let on_event = Arc::new(on_event);
        let scoped = Scoped::empty(&self.namespaces);
        if let Some(scopes) = &self.by_shard {
            let watch: Arc<dyn ShardWatch> = if keys.is_empty() && self.namespaces.is_empty() {
                Arc::new(KeptWatch {
                    watches: self.clone(),
                    shard_of: scopes.labels.shard_of.clone(),
                    config: config.clone(),
                    on_event,
                    scoped: scoped.clone(),
                    kept: Arc::default(),
                })
            } else {
                Arc::new(ShardedWatch {
                    watches: self.clone(),
                    labels: scopes.labels.clone(),
                    keys: keys.to_vec(),
                    config: config.clone(),
                    on_event,
                    scoped: scoped.clone(),
                })
            };
            scopes
                .watches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(watch);
            return (scoped, Vec::new());
        }
        let mut drivers = Vec::new();
        for (namespace, api) in self.apis::<K>(None) {
            let scope = Coverage {
                namespace: namespace.clone(),
                keep: None,
            };
            let (store, ready, mark_ready, stream) =
                lenient_reflector(api, config, &self.report, scope);
            let on_event = on_event.clone();
            drivers.push(drive(stream, mark_ready, namespace.clone(), move |e| {
                on_event(e)
            }));
            scoped.parts_mut().push(Part {
                shard: None,
                selects: None,
                split: None,
                namespace,
                store,
                ready,
                task: None,
            });
        }
        (scoped, drivers)
    }

    /// Start watching the cluster-scoped kind `K`: its store, readiness and
    /// the future that drives the watch; `on_event` sees every event after
    /// the store has applied it.
    pub fn watch_cluster<K, F>(
        &self,
        config: &watcher::Config,
        on_event: F,
    ) -> (Packed<K>, Ready, BoxFuture<'static, ()>)
    where
        K: Resource<Scope = kube::core::ClusterResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Serialize
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default + std::hash::Hash + Eq + Clone,
        F: FnMut(&Event<K>) + Send + 'static,
    {
        let api: Api<Lenient<K>> = Api::all(self.client.clone());
        let scope = Coverage {
            namespace: None,
            keep: None,
        };
        let (reader, ready, mark_ready, stream) =
            lenient_reflector(api, config, &self.report, scope);
        (reader, ready, drive(stream, mark_ready, None, on_event))
    }
}

/// Drive a reflector stream: mark the store ready at its first complete
/// list, hand every event to `on_event`, log watch failures (they are
/// retried with backoff).
fn drive<K, S, F>(
    stream: S,
    mark_ready: watch::Sender<bool>,
    namespace: Option<String>,
    mut on_event: F,
) -> BoxFuture<'static, ()>
where
    K: Resource + Send + 'static,
    K::DynamicType: Default,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    F: FnMut(&Event<K>) + Send + 'static,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if matches!(event, Event::InitDone) {
                        mark_ready.send_replace(true);
                    }
                    on_event(&event);
                }
                Err(e) => tracing::warn!(
                    kind,
                    namespace = namespace.as_deref().unwrap_or("*"),
                    error = %e,
                    "watch failed; retrying"
                ),
            }
        }
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn part(shard: u32, key: &'static str, objects: &[Secret]) -> Part<Secret> {
        let store = Packed::new(SHARD_LABEL, OWNER_ANNOTATION);
        for o in objects {
            store.apply(&Event::Apply(o.clone()));
        }
        let (_, ready) = Ready::new();
        Part {
            shard: Some(shard),
            selects: Some((key, shard_label_value(shard, 16))),
            split: None,
            namespace: None,
            store,
            ready,
            task: None,
        }
    }

    fn labelled(name: &str, labels: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A managed object in another namespace than its owner's is watched by
    /// two labels; a replica holding both shards lists it once.
    #[test]
    fn an_object_of_two_owned_shards_is_listed_once() {
        let both = labelled(
            "cross",
            &[(SHARD_LABEL, "1-of-16"), (NAMESPACE_SHARD_LABEL, "2-of-16")],
        );
        let plain = labelled("plain", &[(SHARD_LABEL, "1-of-16")]);
        let scoped = Scoped::<Secret>::empty(&[]);
        scoped
            .parts_mut()
            .push(part(1, SHARD_LABEL, &[both.clone(), plain]));
        scoped
            .parts_mut()
            .push(part(2, NAMESPACE_SHARD_LABEL, &[both]));
        let mut names: Vec<String> = scoped
            .all()
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["cross", "plain"]);
        assert_eq!(scoped.counts().get(&Some(2)), Some(&1));
        // Without the owner's shard, the namespace's watch lists it.
        scoped.parts_mut().remove(0);
        assert_eq!(scoped.all().len(), 1);
        assert!(scoped.get(Some("ns"), "cross").is_some());
        assert!(scoped.get(Some("ns"), "plain").is_none());
    }

    #[test]
    fn stale_labels_are_those_of_no_shard_of_this_count() {
        let labels = ShardLabels::new(3, Arc::new(|ns: &str| ns.len() as u32 % 3));
        assert_eq!(
            labels.stale_selector(),
            "secrets.hanzo.ai/shard notin (0-of-3,1-of-3,2-of-3)"
        );
        assert_eq!(labels.value(labels.shard_of("ab")), "2-of-3");
        assert_eq!(
            labels.selector(SHARD_LABEL, 1),
            "secrets.hanzo.ai/shard=1-of-3"
        );
    }

    #[test]
    fn slim_drops_managed_fields_and_the_last_applied_copy_only() {
        let mut s = Secret {
            metadata: ObjectMeta {
                name: Some("a".into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".into()),
                    ..Default::default()
                }]),
                annotations: Some(
                    [
                        (LAST_APPLIED.to_owned(), "{\"kind\":\"Secret\"}".to_owned()),
                        ("secrets.hanzo.ai/version".to_owned(), "v1".to_owned()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        slim(&mut s);
        assert_eq!(s.metadata.managed_fields, None);
        let annotations = s.metadata.annotations.unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["secrets.hanzo.ai/version"], "v1");
        assert_eq!(s.metadata.name.as_deref(), Some("a"));
    }

    /// A list with one object of a shape the types refuse decodes the
    /// others and keeps the bad one's name, and why, without its values.
    #[test]
    fn one_undecodable_object_does_not_fail_the_list() {
        #[derive(Deserialize)]
        struct List {
            items: Vec<Lenient<crate::api::kms_push_secret::KmsPushSecret>>,
        }
        let good = |name: &str| {
            serde_json::json!({
                "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsPushSecret",
                "metadata": {"name": name, "namespace": "a", "resourceVersion": "7"},
                "spec": {"destination": {"projectSlug": "p", "environmentSlug": "dev", "secretsPath": "/"},
                         "push": {"secret": {"secretName": "src"}},
                         "authentication": {"universalAuth": {"credentialsRef": {"secretName": "c"}}}}
            })
        };
        let mut bad = good("broken");
        bad["spec"]["updatePolicy"] = serde_json::json!("SomethingRemoved");
        let mut typed = good("typed");
        typed["spec"]["push"]["secret"] = serde_json::json!("hunter2");
        let list = serde_json::json!({"items": [good("one"), bad, typed, good("two")]});
        // As the client decodes it: from the response's bytes.
        let list: List = serde_json::from_str(&list.to_string()).expect("the list decodes");
        let names: Vec<(String, bool)> = list
            .items
            .iter()
            .map(|o| {
                (
                    o.meta().name.clone().unwrap(),
                    matches!(o, Lenient::Decoded(_)),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("one".into(), true),
                ("broken".into(), false),
                ("typed".into(), false),
                ("two".into(), true)
            ]
        );
        let Lenient::Undecodable {
            error,
            meta,
            served_kind,
        } = &list.items[1]
        else {
            unreachable!()
        };
        assert!(
            error.contains("unknown variant `SomethingRemoved`"),
            "{error}"
        );
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        // The kind as sent, for the Event on it (the served spelling).
        assert_eq!(served_kind.as_deref(), Some("KmsPushSecret"));
        let Lenient::Undecodable { error, .. } = &list.items[2] else {
            unreachable!()
        };
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.starts_with("invalid type, expected"), "{error}");
    }
}
