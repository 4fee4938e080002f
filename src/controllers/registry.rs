//! The registry of kinds: what the operator's wiring needs of each
//! controller, written once per kind. `operator::run` loops over one list
//! for routing, readiness, the global configuration, full passes after a
//! shard is gained, drains before one is given up, queue metrics, workers
//! and shutdown; a kind added to the list gets every one of them, and there
//! is no second place to forget it in.
//!
//! The three custom resources register through [`Resources`] (their cache,
//! queue and reconciler); reload registers its own [`Kind`] (workloads, not
//! resources of ours).

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::{Resource, ResourceExt};
use tokio::task::JoinHandle;

use super::context::Context;
use super::key::ObjectKey;
use super::queue::Queue;
use super::stores::Scoped;
use super::workers::{Reconciler, spawn_workers};
use crate::sharding::Ownership;

/// What a kind's watch starts with: the shared watches, the shard gate, the
/// kind's queue and the index of the Secrets its resources read.
pub struct Watching<'a> {
    /// The watches (by shard, or of the namespaces).
    pub watches: &'a super::stores::Watches,
    /// Which shards this replica owns.
    pub gate: Arc<dyn Ownership>,
    /// The kind's queue.
    pub queue: Arc<Queue<ObjectKey>>,
    /// Secret references, by resource.
    pub refs: Arc<super::refs::RefIndex>,
}

/// One of our custom resources, as the registry handles it.
pub trait Ours: Resource<DynamicType = ()> + HostApi + Forceable + Object {}

impl<T: Resource<DynamicType = ()> + HostApi + Forceable + Object> Ours for T {}

/// What every kind is registered with: the shared watches, the shard gate,
/// the index of the Secrets resources read, and the KMS client. Each kind
/// makes its own queue ([`Wiring::watching`]).
pub struct Wiring<'a> {
    /// The watches (by shard, or of the namespaces).
    pub watches: &'a super::stores::Watches,
    /// Which shards this replica owns.
    pub gate: Arc<dyn Ownership>,
    /// Secret references, by resource.
    pub refs: Arc<super::refs::RefIndex>,
    /// The KMS client.
    pub kms: Arc<crate::kms::Kms>,
}

impl<'a> Wiring<'a> {
    /// Register a custom resource's kind: a queue of its own, its watch
    /// (`watch` gives its controller and the futures that drive the watch)
    /// and the controller over its cache (`store`).
    pub fn register<T, R>(
        &self,
        watch: impl FnOnce(Watching<'a>) -> (R, Vec<BoxFuture<'static, ()>>),
        store: impl FnOnce(&R) -> Scoped<T>,
    ) -> Registered
    where
        T: Ours,
        R: Reconciler<ObjectKey>,
    {
        let queue = Arc::new(Queue::new());
        let watching = Watching {
            watches: self.watches,
            gate: self.gate.clone(),
            queue: queue.clone(),
            refs: self.refs.clone(),
        };
        let (controller, drivers) = watch(watching);
        let store = store(&controller);
        (Arc::new(Resources::new(store, queue, controller)), drivers)
    }
}

/// A kind's registration: what the registry holds, and the futures that
/// drive its watches.
pub type Registered = (Arc<dyn Kind>, Vec<BoxFuture<'static, ()>>);

/// One kind of work, as the operator wires it.
pub trait Kind: Send + Sync + 'static {
    /// The controller's name: metric label and log field.
    fn controller(&self) -> &'static str;
    /// The `kind` its owner ids name (`KmsSecret/<ns>/<name>`), for a kind
    /// that owns managed objects or reads Secrets.
    fn resource_kind(&self) -> Option<&str> {
        None
    }
    /// Queue the resource `namespace/name`: something it uses changed
    /// (added as due), or was listed by a watch's first list (`in_line`:
    /// nothing is known to have changed, and the resource's own first list
    /// or full pass puts it in line anyway).
    fn enqueue(&self, _namespace: &str, _name: &str, _gate: &dyn Ownership, _in_line: bool) {}
    /// Wait until its caches hold their initial lists.
    fn wait_ready(&self) -> BoxFuture<'_, ()>;
    /// Queue every resource that uses the global configuration (it changed).
    fn global_config_changed(&self, _gate: &dyn Ownership) {}
    /// Queue everything of `shard` (just gained).
    fn full_pass(&self, shard: u32, gate: &dyn Ownership);
    /// The namespace of each of its resources, for the per-shard gauges of
    /// managed objects; `None` for a kind that is not counted.
    fn resource_namespaces(&self) -> Option<Vec<String>> {
        None
    }
    /// `shard` is being given up: drop what is kept for it beyond the
    /// queue.
    fn shard_lost(&self, _shard: u32) {}
    /// Its work queue.
    fn queue(&self) -> &dyn WorkQueue;
    /// Whether its reconciles spend the KMS budget (its waiting work counts
    /// in the demand this replica publishes).
    fn spends_kms_budget(&self) -> bool {
        true
    }
    /// Start its workers; the task ends once the queue is closed and the
    /// reconciles in flight are done.
    fn start(self: Arc<Self>, ctx: Arc<Context>) -> JoinHandle<()>;
    /// The `Ready` condition of each of its resources in a namespace that
    /// `owned` accepts (`kms_operator_resource_ready`); none for a kind
    /// without resources of its own.
    fn ready_rows(&self, _owned: &dyn Fn(&str) -> bool) -> Vec<super::readiness::Row> {
        Vec::new()
    }
    /// Its kind and how many of its objects are cached, by shard (`None`:
    /// a watch not split by shard), for `kms_operator_cached_objects`.
    fn cached(&self) -> Option<(&'static str, std::collections::BTreeMap<Option<u32>, usize>)> {
        None
    }
    /// Publish its own gauges (every 5 s, with the queue's).
    fn report(&self, _ctx: &Context) {}
}

/// What the wiring does with a queue, whatever its key.
pub trait WorkQueue: Send + Sync {
    /// Drop the queued work of `shard`; how many keys were dropped.
    fn drop_shard(&self, shard: u32) -> usize;
    /// Keys of `shard` being reconciled now.
    fn in_progress_for(&self, shard: u32) -> usize;
    /// Wait until no key of `shard` is being reconciled.
    fn idle_for(&self, shard: u32) -> futures::future::BoxFuture<'_, ()>;
    /// Take no more work.
    fn close(&self);
    /// Depth and oldest wait per shard.
    fn stats(&self) -> HashMap<u32, (usize, Duration)>;
    /// New work of the shards `owned` accepts, waiting or being processed
    /// (see [`Queue::demand`]).
    fn demand(&self, owned: &dyn Fn(u32) -> bool) -> usize;
}

impl<K: Clone + Eq + Hash + Ord + Send + Sync> WorkQueue for Queue<K> {
    fn drop_shard(&self, shard: u32) -> usize {
        Queue::drop_shard(self, shard)
    }
    fn in_progress_for(&self, shard: u32) -> usize {
        Queue::in_progress_for(self, shard)
    }
    fn idle_for(&self, shard: u32) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(Queue::idle_for(self, shard))
    }
    fn close(&self) {
        Queue::close(self);
    }
    fn stats(&self) -> HashMap<u32, (usize, Duration)> {
        Queue::stats(self)
    }
    fn demand(&self, owned: &dyn Fn(u32) -> bool) -> usize {
        Queue::demand(self, owned)
    }
}

use super::stores::Object;
use crate::api::kinds::Forceable;
pub use crate::api::kinds::HostApi;

/// A custom resource's controller: its cache, queue and reconciler.
pub struct Resources<T, R>
where
    T: Resource + Clone + 'static,
    T::DynamicType: Hash + Eq + Clone,
{
    controller: &'static str,
    kind: &'static str,
    store: Scoped<T>,
    queue: Arc<Queue<ObjectKey>>,
    reconciler: Arc<R>,
}

impl<T, R> Resources<T, R>
where
    T: Resource + Clone + 'static,
    T::DynamicType: Default + Hash + Eq + Clone,
{
    /// Register the controller of `T` (its line in
    /// [`KINDS`](crate::api::kinds::KINDS)) over the
    /// cache `store`, fed into `queue`.
    ///
    /// # Panics
    ///
    /// When `T` has no line in the table (a unit test there checks every
    /// kind).
    pub fn new(store: Scoped<T>, queue: Arc<Queue<ObjectKey>>, reconciler: R) -> Self {
        let dynamic_type = T::DynamicType::default();
        let kind = T::kind(&dynamic_type);
        let info = crate::api::kinds::info(&kind)
            .unwrap_or_else(|| panic!("{kind} has no line in api::kinds::KINDS"));
        Self {
            controller: info.controller,
            kind: info.kind,
            store,
            queue,
            reconciler: Arc::new(reconciler),
        }
    }

    fn add(&self, o: &T, gate: &dyn Ownership) {
        let key = ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any());
        let shard = gate.shard_of(&key.namespace);
        self.queue.add(key, shard);
    }
}

impl<T: Ours, R: Reconciler<ObjectKey>> Kind for Resources<T, R> {
    fn controller(&self) -> &'static str {
        self.controller
    }

    fn resource_kind(&self) -> Option<&str> {
        Some(self.kind)
    }

    fn enqueue(&self, namespace: &str, name: &str, gate: &dyn Ownership, in_line: bool) {
        let (key, shard) = (ObjectKey::new(namespace, name), gate.shard_of(namespace));
        if in_line {
            self.queue.add_in_line(key, shard);
        } else {
            self.queue.add(key, shard);
        }
    }

    fn wait_ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.store.wait_ready())
    }

    fn global_config_changed(&self, gate: &dyn Ownership) {
        for o in self.store.all() {
            if o.uses_global_config() {
                self.add(&o, gate);
            }
        }
    }

    fn full_pass(&self, shard: u32, gate: &dyn Ownership) {
        // In namespace order: the resources of a namespace usually share an
        // identity and a folder, and reconciled together they share one
        // login and one fetch (answers serve for a couple of seconds).
        let mut of_shard: Vec<ObjectKey> = self.store.heads(|h| {
            let ns = h.namespace.unwrap_or_default();
            (gate.shard_of(ns) == shard).then(|| ObjectKey::new(ns, h.name))
        });
        of_shard.sort();
        // In line: a resource in step spends the budget as a resync does,
        // behind every change (after a restart all are overdue at once).
        for key in of_shard {
            self.queue.add_in_line(key, shard);
        }
    }

    fn resource_namespaces(&self) -> Option<Vec<String>> {
        Some(
            self.store
                .heads(|h| Some(h.namespace.unwrap_or_default().to_owned())),
        )
    }

    fn shard_lost(&self, shard: u32) {
        self.reconciler.shard_lost(shard);
    }

    fn queue(&self) -> &dyn WorkQueue {
        self.queue.as_ref()
    }

    fn start(self: Arc<Self>, ctx: Arc<Context>) -> JoinHandle<()> {
        spawn_workers(ctx, &self.queue, self.controller, &self.reconciler)
    }

    fn ready_rows(&self, owned: &dyn Fn(&str) -> bool) -> Vec<super::readiness::Row> {
        // Every 5 s over every resource: only the conditions are decoded,
        // one resource at a time (decoding them all whole held the whole
        // cache decoded at once, and the memory it took stayed with the
        // process).
        self.store.view_where(
            |h| owned(h.namespace.unwrap_or_default()),
            |h, view: super::readiness::ReadyView| {
                super::readiness::Row::of_view(
                    self.kind,
                    h.namespace.unwrap_or_default(),
                    h.name,
                    &view,
                )
            },
        )
    }

    fn cached(&self) -> Option<(&'static str, std::collections::BTreeMap<Option<u32>, usize>)> {
        Some((self.kind, self.store.counts()))
    }

    fn report(&self, ctx: &Context) {
        self.reconciler.report(ctx);
    }
}

/// The event handler of a custom resource's watch, the same for every kind:
/// a resource is queued when it is first listed, created or deleted, or when
/// its `fingerprint` (what makes it worth reconciling: generation,
/// annotations, deletion mark, …; never the status the operator writes)
/// changes, or when `observe` asks for it; in the lane of changes when
/// someone created, edited or deleted it while the watch ran, or a new
/// `force-sync` value asks for a sync now. `observe` sees every applied
/// or deleted resource first (`true` when deleted), to index what it reads.
pub fn queue_on_change<K, FP>(
    gate: Arc<dyn Ownership>,
    queue: Arc<Queue<ObjectKey>>,
    fingerprint: impl Fn(&K) -> FP + Send + Sync + 'static,
    observe: impl Fn(&K, &ObjectKey, bool) -> bool + Send + Sync + 'static,
) -> impl Fn(&kube::runtime::watcher::Event<K>) + Send + Sync + 'static
where
    K: super::force_sync::Forceable,
    FP: std::hash::Hash,
{
    use kube::runtime::watcher::Event;
    // A 64-bit digest of each fingerprint, not the fingerprint (a copy of
    // every resource's labels and annotations, kept for every cached
    // resource).
    let digest = move |o: &K| {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        fingerprint(o).hash(&mut h);
        h.finish()
    };
    let seen: Mutex<HashMap<String, u64>> = Mutex::new(HashMap::new());
    move |event| {
        let (o, initial, deleted) = match event {
            Event::Apply(o) => (o, false, false),
            Event::InitApply(o) => (o, true, false),
            Event::Delete(o) => (o, false, true),
            Event::Init | Event::InitDone => return,
        };
        let key = ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any());
        let uid = o.uid().unwrap_or_default();
        let asked = observe(o, &key, deleted);
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        // Someone created, edited or deleted the resource while the watch
        // ran (not the first list, not the operator's own status writes,
        // not a Secret it reads): someone waits for it.
        let edited = if deleted {
            seen.remove(&uid);
            true
        } else {
            let fp = digest(o);
            let changed = seen.get(&uid) != Some(&fp);
            seen.insert(uid, fp);
            if !changed && !initial && !asked {
                return;
            }
            changed && !initial
        };
        let shard = gate.shard_of(&key.namespace);
        // The first list of a shard not worked on yet (not owned, or its
        // caches still listing) is queued by the full pass once it is, in
        // namespace order.
        if initial && !asked && !gate.owns(shard) {
            return;
        }
        // A sync asked for by hand, and a resource someone just created,
        // edited or deleted, go ahead of the crowd: the lane of changes is
        // served before the resyncs and the full passes of gained shards,
        // so a new resource is not queued behind thousands of them.
        // The first list puts the rest in line, as the full pass does.
        if edited || (!deleted && super::force_sync::pending(o).is_some()) {
            queue.add_change(key, shard);
        } else if initial && !asked {
            queue.add_in_line(key, shard);
        } else {
            queue.add(key, shard);
        }
    }
}

/// The registered kinds, shared by the watches that route work to them.
/// Filled once, before any watch delivers an event.
#[derive(Clone, Default)]
pub struct Registry(Arc<OnceLock<Vec<Arc<dyn Kind>>>>);

impl Registry {
    /// Register the kinds (once; a second call is ignored).
    pub fn set(&self, kinds: Vec<Arc<dyn Kind>>) {
        let _ = self.0.set(kinds);
    }

    /// The registered kinds (none before [`Registry::set`]).
    pub fn kinds(&self) -> &[Arc<dyn Kind>] {
        self.0.get().map_or(&[], Vec::as_slice)
    }

    /// Queue the resource an owner id names (`<Kind>/<namespace>/<name>`):
    /// something it owns or reads changed.
    pub fn owner(&self, owner: &str, gate: &dyn Ownership) {
        self.route(owner, gate, false);
    }

    /// Queue the resource an owner id names in line with its shard: a
    /// watch's first list showed something it owns or reads, which may
    /// have changed while nobody watched, or not (after a restart, every
    /// managed Secret is listed). Its check is not urgent: the resource is
    /// a catch-up like the rest of its shard, and an owner queued as added
    /// would spend the burst the changes need.
    pub fn owner_in_line(&self, owner: &str, gate: &dyn Ownership) {
        self.route(owner, gate, true);
    }

    fn route(&self, owner: &str, gate: &dyn Ownership, in_line: bool) {
        let Some(owner) = OwnerId::parse(owner) else {
            return;
        };
        if let Some(k) = self
            .kinds()
            .iter()
            .find(|k| k.resource_kind() == Some(owner.kind))
        {
            k.enqueue(owner.namespace, owner.name, gate, in_line);
        }
    }

    /// Every kind's queue, closed: no more work is taken.
    pub fn close(&self) {
        for k in self.kinds() {
            k.queue().close();
        }
    }
}

/// An owner id (`<Kind>/<namespace>/<name>`) taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerId<'a> {
    /// The resource's kind.
    pub kind: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
}

impl<'a> OwnerId<'a> {
    /// Parse `<Kind>/<namespace>/<name>`; `None` for anything else.
    pub fn parse(id: &'a str) -> Option<Self> {
        let mut parts = id.splitn(3, '/');
        let (kind, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
        (!kind.is_empty() && !name.is_empty()).then_some(Self {
            kind,
            namespace,
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KmsSecret;
    use crate::controllers::queue::Mark;

    #[test]
    fn a_resource_follows_the_global_config_for_any_field_it_leaves_out() {
        let ks = |spec: serde_json::Value| -> KmsSecret {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
                "metadata": {"name": "a", "namespace": "ns"},
                "spec": spec
            }))
            .unwrap()
        };
        let base = serde_json::json!({
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "c"},
                "secretsScope": {"projectSlug": "p", "envSlug": "e", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": "out"}]
        });
        let with = |extra: serde_json::Value| {
            let mut spec = base.clone();
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            ks(spec)
        };
        let ca = serde_json::json!({"caRef": {"secretName": "ca", "key": "ca.crt"}});
        assert!(with(serde_json::json!({})).uses_global_config());
        // Its own host, but the CA may come from kms-config.
        assert!(with(serde_json::json!({"hostAPI": "https://own"})).uses_global_config());
        assert!(with(serde_json::json!({"tls": ca})).uses_global_config());
        assert!(
            !with(serde_json::json!({"hostAPI": "https://own", "tls": ca})).uses_global_config()
        );
    }

    /// What the watch of a kind queues, and in which lane: the first list
    /// joins the line; a resource someone creates, edits or deletes while
    /// the watch runs takes the lane of changes, ahead of every resync and
    /// full pass waiting; the operator's own status writes queue nothing.
    #[tokio::test]
    async fn a_resource_someone_creates_or_edits_goes_ahead_of_the_crowd() {
        use kube::runtime::watcher::Event;
        let queue = Arc::new(Queue::<ObjectKey>::new());
        let gate: Arc<dyn Ownership> = Arc::new(crate::controllers::context::OwnsAll);
        let handle = queue_on_change::<KmsSecret, _>(
            gate,
            queue.clone(),
            |o| o.metadata.generation,
            |_, _, _| false,
        );
        let ks = |name: &str, uid: &str, generation: i64, status: bool| -> KmsSecret {
            let mut v = serde_json::json!({
                "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
                "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": generation},
                "spec": {"managedKubeSecretReferences": [{"secretName": "out"}]}
            });
            if status {
                v["status"] = serde_json::json!({"observedGeneration": generation});
            }
            serde_json::from_value(v).unwrap()
        };
        // The first list: a thousand resources in line.
        for i in 0..1000 {
            handle(&Event::InitApply(ks(
                &format!("old-{i}"),
                &format!("u{i}"),
                1,
                false,
            )));
        }
        // The operator's status write of one: nothing more queued.
        handle(&Event::Apply(ks("old-0", "u0", 1, true)));
        // Created now, and an edit of one in line: both served first.
        handle(&Event::Apply(ks("new", "u-new", 1, false)));
        handle(&Event::Apply(ks("old-999", "u999", 2, false)));
        let next = || async {
            let (key, _, mark) = queue.next_entry(|_| true, |_| true).await.unwrap();
            queue.done(&key);
            (key.name.to_string(), mark)
        };
        assert_eq!(next().await, ("new".to_owned(), Mark::Change));
        assert_eq!(next().await, ("old-999".to_owned(), Mark::Change));
        // The first list's are in line (a resource in step among them
        // spends the KMS budget as a resync does).
        assert_eq!(next().await, ("old-0".to_owned(), Mark::InLine));
        let mut rest = 0;
        while !queue.is_empty() {
            let (name, mark) = next().await;
            assert_eq!(mark, Mark::InLine, "{name}");
            rest += 1;
        }
        assert_eq!(rest, 998, "the status write queued the resource again");
        // Deleted while the watch runs: first too.
        handle(&Event::InitApply(ks("old-1", "u1", 1, false)));
        handle(&Event::Delete(ks("old-2", "u2", 1, false)));
        assert_eq!(next().await, ("old-2".to_owned(), Mark::Change));
    }

    /// An owner routed from a watch's first list (a managed Secret listed
    /// after a restart) joins its shard's line; one routed for a change is
    /// added as due, and keeps that mark when a first list names it too.
    #[tokio::test]
    async fn an_owner_a_first_list_names_joins_the_line() {
        use crate::controllers::error::SyncError;
        use crate::controllers::workers::{Action, Job};
        struct Idle;
        impl Reconciler<ObjectKey> for Idle {
            async fn reconcile(&self, _job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
                Ok(Action::Done)
            }
        }
        let queue = Arc::new(Queue::<ObjectKey>::new());
        let kind = Resources::<KmsSecret, _>::new(Scoped::empty(&[]), queue.clone(), Idle);
        let registry = Registry::default();
        registry.set(vec![Arc::new(kind)]);
        let gate = crate::controllers::context::OwnsAll;
        registry.owner_in_line("KmsSecret/ns/listed", &gate);
        registry.owner("KmsSecret/ns/changed", &gate);
        registry.owner_in_line("KmsSecret/ns/changed", &gate);
        // Another kind's id, and a malformed one: nothing.
        registry.owner("Other/ns/x", &gate);
        registry.owner_in_line("KmsSecret/ns", &gate);
        let mut marks = Vec::new();
        while !queue.is_empty() {
            let (key, _, mark) = queue.next_entry(|_| true, |_| true).await.unwrap();
            queue.done(&key);
            marks.push((key.name.to_string(), mark));
        }
        marks.sort();
        assert_eq!(
            marks,
            [
                ("changed".to_owned(), Mark::Added),
                ("listed".to_owned(), Mark::InLine)
            ]
        );
    }

    #[test]
    fn owner_ids_are_taken_apart_or_refused() {
        assert_eq!(
            OwnerId::parse("KmsSecret/team-a/app"),
            Some(OwnerId {
                kind: "KmsSecret",
                namespace: "team-a",
                name: "app"
            })
        );
        assert_eq!(OwnerId::parse("KmsSecret/team-a"), None);
        assert_eq!(OwnerId::parse("/team-a/app"), None);
        assert_eq!(OwnerId::parse("KmsSecret/team-a/"), None);
        // A name never holds a slash; the rest of the id is the name as given.
        assert_eq!(OwnerId::parse("K/n/a/b").map(|o| o.name), Some("a/b"));
    }
}
