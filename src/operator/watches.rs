//! The watches that route work to the registered kinds: managed Secrets and
//! ConfigMaps (their owners, and the workloads that use them after a data
//! change), workloads that opted in to auto-reload, the metadata of the
//! Secrets resources read, and the global configuration ConfigMap. Each
//! returns its cache (if any) and the futures that drive it; nothing runs
//! until the caller spawns them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};

use crate::controllers::queue::Queue;
use crate::controllers::refs::RefIndex;
use crate::controllers::refs::{GLOBAL_CONFIG_NAME, GlobalConfig, SecretReads};
use crate::controllers::registry::Registry;
use crate::controllers::reload::rollouts::{ArgoRollouts, CRD_NAME, Rollout};
use crate::controllers::reload::runtime::Workloads;
use crate::controllers::reload::{
    Consumed, ConsumerIndex, Source, WorkloadKey, WorkloadKind, consumed,
};
use crate::controllers::stores::{
    NAMESPACE_SHARD_LABEL, Namespaced, SHARD_LABEL, Scoped, Undecodable, Watches,
};
use crate::controllers::target::{MANAGED_LABEL, OWNER_ANNOTATION, TargetKind, VERSION_ANNOTATION};
use crate::controllers::written::OwnWrites;
use crate::sharding::Ownership;

/// Where the watches send work.
#[derive(Clone)]
pub struct Routes {
    /// The registered kinds (owner ids are routed through it).
    pub registry: Registry,
    /// The ownership gate (a key's shard).
    pub gate: Arc<dyn Ownership>,
    /// The reload queue.
    pub reload_queue: Arc<Queue<WorkloadKey>>,
    /// Which workloads use which objects.
    pub consumers: Arc<ConsumerIndex>,
    /// Delay between a data change and the rollouts it causes.
    pub debounce: Duration,
    /// The targets this replica wrote: the watch event of its own write
    /// does not send the owner round again.
    pub own_writes: Arc<OwnWrites>,
}

impl Routes {
    /// Queue the owner an object's annotations name (see
    /// [`Routes::owner_for`]).
    fn owner_of(&self, annotations: &BTreeMap<String, String>, listed: bool) {
        if let Some(owner) = annotations.get(OWNER_ANNOTATION) {
            self.owner_for(owner, listed);
        }
    }

    /// Queue a resource that owns or reads an object: added as due for a
    /// change, in line for an object a first list showed.
    fn owner_for(&self, owner: &str, listed: bool) {
        if listed {
            self.registry.owner_in_line(owner, self.gate.as_ref());
        } else {
            self.registry.owner(owner, self.gate.as_ref());
        }
    }
}

/// Managed Secrets and ConfigMaps (label `secrets.hanzo.ai/managed=true`):
/// any change or deletion sends their owner round, and the resources that
/// read a managed Secret (`index`: the metadata watch of referenced Secrets
/// leaves managed ones out); a new version (a data change) sends the
/// workloads that use them round after the debounce.
pub fn managed_objects(
    watches: &Watches,
    routes: &Routes,
    index: Arc<RefIndex>,
) -> (
    Scoped<Secret>,
    Scoped<ConfigMap>,
    Vec<BoxFuture<'static, ()>>,
) {
    let (secrets, mut drivers) =
        watch_managed::<Secret>(watches, routes, Source::Secret, Some(index));
    let (config_maps, d) = watch_managed::<ConfigMap>(watches, routes, Source::ConfigMap, None);
    drivers.extend(d);
    (secrets, config_maps, drivers)
}

fn watch_managed<K>(
    watches: &Watches,
    routes: &Routes,
    source: Source,
    readers: Option<Arc<RefIndex>>,
) -> (Scoped<K>, Vec<BoxFuture<'static, ()>>)
where
    K: Namespaced,
{
    let routes = routes.clone();
    let kind = match source {
        Source::Secret => TargetKind::Secret,
        Source::ConfigMap => TargetKind::ConfigMap,
    };
    let versions: Mutex<HashMap<(String, String), String>> = Mutex::new(HashMap::new());
    let config = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    // Split by shard: the objects its shards' resources manage, and those
    // in its shards' namespaces managed from elsewhere (their workloads
    // are rolled from here).
    let keys = [SHARD_LABEL, NAMESPACE_SHARD_LABEL];
    watches.watch_by::<K, _>(&config, &keys, move |event| {
        // A first list (after a start, a hand-over or a lost watch) shows
        // every managed object, changed or not: their owners go in line.
        let (o, deleted, listed) = match event {
            Event::Apply(o) => (o, false, false),
            Event::InitApply(o) => (o, false, true),
            Event::Delete(o) => (o, true, false),
            Event::Init | Event::InitDone => return,
        };
        let (ns, name) = (o.namespace().unwrap_or_default(), o.name_any());
        let own = if deleted {
            routes.own_writes.forget(kind, &ns, &name);
            false
        } else {
            let version = o.resource_version().unwrap_or_default();
            routes.own_writes.delivered(kind, &ns, &name, &version)
        };
        if !own {
            routes.owner_of(o.annotations(), listed);
        }
        for reader in readers.iter().flat_map(|i| i.dependents(&ns, &name)) {
            routes.owner_for(&reader, listed);
        }
        let changed = {
            let mut versions = versions.lock().unwrap_or_else(|e| e.into_inner());
            let id = (ns.clone(), name.clone());
            match (deleted, o.annotations().get(VERSION_ANNOTATION)) {
                (true, _) => {
                    versions.remove(&id);
                    false
                }
                (false, Some(v)) => versions.insert(id, v.clone()).is_none_or(|old| old != *v),
                (false, None) => false,
            }
        };
        if changed {
            for w in routes.consumers.consumers(&ns, source, &name) {
                let shard = routes.gate.shard_of(&w.namespace);
                routes.reload_queue.add_after(w, shard, routes.debounce);
            }
        }
    })
}

/// A workload kind's pod template.
trait Workload {
    const KIND: WorkloadKind;
    fn template(&self) -> &PodTemplateSpec;
}

impl Workload for Deployment {
    const KIND: WorkloadKind = WorkloadKind::Deployment;
    fn template(&self) -> &PodTemplateSpec {
        &self.spec.template
    }
}

impl Workload for StatefulSet {
    const KIND: WorkloadKind = WorkloadKind::StatefulSet;
    fn template(&self) -> &PodTemplateSpec {
        &self.spec.template
    }
}

impl Workload for DaemonSet {
    const KIND: WorkloadKind = WorkloadKind::DaemonSet;
    fn template(&self) -> &PodTemplateSpec {
        &self.spec.template
    }
}

/// Workloads that opted in to auto-reload: what they use is indexed; a new
/// workload, or a change of what it uses, sends it round (to record the
/// versions it starts with) and the owners of the objects it uses (or used)
/// round (to recount their workloads). With `argo_rollouts`, Rollouts too,
/// while their CRD is served ([`argo_rollouts`]).
pub fn workloads(
    watches: &Watches,
    routes: &Routes,
    (secrets, config_maps): (&Scoped<Secret>, &Scoped<ConfigMap>),
    argo_rollouts: bool,
) -> (Workloads, Vec<BoxFuture<'static, ()>>) {
    let indexer = Indexer {
        routes: routes.clone(),
        secrets: secrets.clone(),
        config_maps: config_maps.clone(),
    };
    let rollouts = Arc::new(ArgoRollouts::default());
    let mut drivers = Vec::new();
    let (deployments, d) = watch_workloads::<Deployment>(watches, &indexer, Some(&rollouts));
    // For the Rollouts that reference a Deployment (the watch's events read
    // it only once set).
    rollouts.set_deployments(deployments.clone());
    drivers.extend(d);
    let (stateful_sets, d) = watch_workloads::<StatefulSet>(watches, &indexer, None);
    drivers.extend(d);
    let (daemon_sets, d) = watch_workloads::<DaemonSet>(watches, &indexer, None);
    drivers.extend(d);
    if argo_rollouts {
        drivers.push(argo_rollouts_driver(
            watches.clone(),
            indexer,
            rollouts.clone(),
        ));
    }
    (
        Workloads {
            deployments,
            stateful_sets,
            daemon_sets,
            rollouts,
        },
        drivers,
    )
}

/// Keeps the consumer index in step with the workloads.
#[derive(Clone)]
struct Indexer {
    routes: Routes,
    secrets: Scoped<Secret>,
    config_maps: Scoped<ConfigMap>,
}

impl Indexer {
    /// Record what a workload uses (empty: not opted in, or gone). A change
    /// sends it round, when it uses something, and the owners of the
    /// objects it uses or used.
    fn set(&self, key: WorkloadKey, uses: BTreeSet<Consumed>) {
        let routes = &self.routes;
        let before = routes.consumers.uses(&key);
        if !routes.consumers.set(&key, uses.clone()) {
            return;
        }
        let ns = key.namespace.clone();
        if !uses.is_empty() {
            routes.reload_queue.add(key, routes.gate.shard_of(&ns));
        }
        for (source, name) in before.union(&uses) {
            let annotations = match source {
                Source::Secret => self
                    .secrets
                    .get(Some(&ns), name)
                    .map(|o| o.annotations().clone()),
                Source::ConfigMap => self
                    .config_maps
                    .get(Some(&ns), name)
                    .map(|o| o.annotations().clone()),
            };
            if let Some(a) = &annotations {
                routes.owner_of(a, false);
            }
        }
    }

    /// A gradual workload changed (its rollout progressed, or failed): the
    /// other gradual workloads that use the same objects look at their
    /// turn again.
    fn wake_peers(&self, key: &WorkloadKey, annotations: &BTreeMap<String, String>) {
        use crate::controllers::reload::gradual::{Strategy, strategy};
        let routes = &self.routes;
        let ns = key.namespace.as_str();
        for (source, name) in routes.consumers.uses(key) {
            let object = match source {
                Source::Secret => self
                    .secrets
                    .get(Some(ns), &name)
                    .map(|o| o.annotations().clone()),
                Source::ConfigMap => self
                    .config_maps
                    .get(Some(ns), &name)
                    .map(|o| o.annotations().clone()),
            };
            let Some(object) = object else { continue };
            if strategy(annotations, &object) != Ok(Strategy::Gradual) {
                continue;
            }
            for w in routes.consumers.consumers(ns, source, &name) {
                if w != *key {
                    routes.reload_queue.add(w, routes.gate.shard_of(ns));
                }
            }
        }
    }

    /// Re-read the Rollouts that take their template from a Deployment.
    fn rollouts_of(&self, rollouts: &ArgoRollouts, ns: &str, deployment: &str) {
        for name in rollouts.referencing(ns, deployment) {
            let uses = rollouts
                .get(ns, &name)
                .map(|r| rollout_uses(&r, rollouts))
                .unwrap_or_default();
            self.set(
                WorkloadKey {
                    kind: WorkloadKind::Rollout,
                    namespace: ns.to_owned(),
                    name,
                },
                uses,
            );
        }
    }
}

fn watch_workloads<K>(
    watches: &Watches,
    indexer: &Indexer,
    rollouts: Option<&Arc<ArgoRollouts>>,
) -> (Scoped<K>, Vec<BoxFuture<'static, ()>>)
where
    K: Workload + Namespaced,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let indexer = indexer.clone();
    let rollouts = rollouts.cloned();
    watches.watch::<K, _>(&watcher::Config::default(), move |event| {
        let (o, deleted) = match event {
            Event::Apply(o) | Event::InitApply(o) => (o, false),
            Event::Delete(o) => (o, true),
            Event::Init | Event::InitDone => return,
        };
        let ns = o.namespace().unwrap_or_default();
        let uses = match (deleted, o.template().spec.as_ref()) {
            (false, Some(spec)) if crate::controllers::reload::opted_in(o.annotations()) => {
                consumed(spec)
            }
            _ => Default::default(),
        };
        let key = WorkloadKey {
            kind: K::KIND,
            namespace: ns.clone(),
            name: o.name_any(),
        };
        let wake = !uses.is_empty();
        indexer.set(key.clone(), uses);
        if wake {
            indexer.wake_peers(&key, o.annotations());
        }
        if let Some(rollouts) = &rollouts {
            indexer.rollouts_of(rollouts, &ns, &o.name_any());
        }
    })
}

/// What a Rollout uses: its own pod template's references, or those of the
/// Deployment its `workloadRef` names. Nothing when it did not opt in.
fn rollout_uses(r: &Rollout, rollouts: &ArgoRollouts) -> BTreeSet<Consumed> {
    if !crate::controllers::reload::opted_in(r.annotations()) {
        return BTreeSet::new();
    }
    if let Some(spec) = r.spec.template.as_ref().and_then(|t| t.spec.as_ref()) {
        return consumed(spec);
    }
    let ns = r.namespace().unwrap_or_default();
    r.referenced_deployment()
        .and_then(|d| rollouts.deployments()?.get(Some(&ns), d))
        .and_then(|d| d.spec.template.spec.as_ref().map(consumed))
        .unwrap_or_default()
}

/// Follows the CRD `rollouts.argoproj.io` (its metadata, by name): while it
/// exists, Rollouts are watched and indexed like the other workloads; when
/// it goes, the watch stops and its Rollouts are forgotten. A CRD that
/// exists but is not established yet fails the first list, which the watch
/// retries.
fn argo_rollouts_driver(
    watches: Watches,
    indexer: Indexer,
    state: Arc<ArgoRollouts>,
) -> BoxFuture<'static, ()> {
    use futures::StreamExt;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::runtime::WatchStreamExt;
    let client = watches.client().clone();
    let (stop_indexer, state_running) = (indexer.clone(), state.clone());
    let start = move || {
        let (indexer, rollouts) = (indexer.clone(), state.clone());
        let (store, drivers) =
            watches.watch::<Rollout, _>(&watcher::Config::default(), move |event| {
                let (r, deleted) = match event {
                    Event::Apply(o) | Event::InitApply(o) => (o, false),
                    Event::Delete(o) => (o, true),
                    Event::Init | Event::InitDone => return,
                };
                let (ns, name) = (r.namespace().unwrap_or_default(), r.name_any());
                let reference = r.referenced_deployment().filter(|_| !deleted);
                rollouts.set_reference(&ns, &name, reference);
                let uses = if deleted {
                    BTreeSet::new()
                } else {
                    rollout_uses(r, &rollouts)
                };
                let key = WorkloadKey {
                    kind: WorkloadKind::Rollout,
                    namespace: ns,
                    name,
                };
                let wake = !uses.is_empty();
                indexer.set(key.clone(), uses);
                if wake {
                    indexer.wake_peers(&key, r.annotations());
                }
            });
        let tasks = drivers
            .into_iter()
            .map(|d| tokio::spawn(d).abort_handle())
            .collect();
        state.started(store, tasks);
        tracing::info!(
            crd = CRD_NAME,
            "Argo Rollouts are served: watching Rollouts"
        );
    };
    let stop = |indexer: &Indexer, state: &ArgoRollouts| {
        for r in state.stop() {
            let key = WorkloadKey {
                kind: WorkloadKind::Rollout,
                namespace: r.namespace().unwrap_or_default(),
                name: r.name_any(),
            };
            indexer.set(key, BTreeSet::new());
        }
        tracing::info!(
            crd = CRD_NAME,
            "Argo Rollouts are no longer served: stopped watching Rollouts"
        );
    };
    Box::pin(async move {
        let api: kube::Api<PartialObjectMeta<CustomResourceDefinition>> =
            kube::Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={CRD_NAME}"));
        let stream = watcher::watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        while let Some(event) = stream.next().await {
            let present = match event {
                Ok(Event::Apply(_)) => true,
                Ok(Event::InitApply(_)) => {
                    listed = true;
                    true
                }
                Ok(Event::Delete(_)) => false,
                Ok(Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(Event::InitDone) if listed => continue,
                Ok(Event::InitDone) => false,
                Err(e) => {
                    tracing::warn!(error = %e, crd = CRD_NAME, "watch of the Argo Rollouts CRD failed; retrying");
                    continue;
                }
            };
            match (present, state_running.running()) {
                (true, false) => start(),
                (false, true) => stop(&stop_indexer, &state_running),
                _ => {}
            }
        }
    })
}

/// The metadata of every Secret in the watched namespaces that the operator
/// does not manage: the current version of each keeps the shared reads of
/// referenced Secrets (credentials, CA bundles, push sources) honest, and a
/// change sends the resources that read it round (through `index`).
/// Managed Secrets are left out: their own watch, by shard, does both
/// ([`managed_objects`]), and every replica seeing every write of every
/// other replica would cost each of them the whole cluster's traffic.
pub fn referenced_secrets(
    client: &Client,
    namespaces: &[String],
    routes: &Routes,
    index: Arc<RefIndex>,
    referenced: Arc<SecretReads>,
) -> Vec<BoxFuture<'static, ()>> {
    let scopes: Vec<(Option<String>, kube::Api<PartialObjectMeta<Secret>>)> =
        if namespaces.is_empty() {
            vec![(None, kube::Api::all(client.clone()))]
        } else {
            namespaces
                .iter()
                .map(|ns| (Some(ns.clone()), kube::Api::namespaced(client.clone(), ns)))
                .collect()
        };
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();
    for (scope, api) in scopes {
        let (routes, index, referenced) = (routes.clone(), index.clone(), referenced.clone());
        drivers.push(Box::pin(async move {
            use futures::StreamExt;
            use kube::runtime::WatchStreamExt;
            let unmanaged = watcher::Config::default().labels(&format!("{MANAGED_LABEL}!=true"));
            let stream = watcher::watcher(api, unmanaged).default_backoff();
            let mut stream = std::pin::pin!(stream);
            let scope = scope.as_deref();
            while let Some(event) = stream.next().await {
                let (o, deleted): (PartialObjectMeta<Secret>, bool) = match event {
                    Ok(Event::Apply(o)) => (o, false),
                    Ok(Event::Delete(o)) => (o, true),
                    Ok(Event::Init) => {
                        referenced.relist_started(scope);
                        continue;
                    }
                    Ok(Event::InitApply(o)) => {
                        // Changed while the watch was down: as a change.
                        let changed = referenced.relisted(
                            scope,
                            o.metadata.namespace.as_deref().unwrap_or_default(),
                            o.metadata.name.as_deref().unwrap_or_default(),
                            o.metadata.resource_version.as_deref(),
                        );
                        if !changed {
                            continue;
                        }
                        (o, false)
                    }
                    Ok(Event::InitDone) => {
                        referenced.relist_done(scope);
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "watch of Secret metadata failed; retrying");
                        continue;
                    }
                };
                let ns = o.metadata.namespace.clone().unwrap_or_default();
                let name = o.metadata.name.clone().unwrap_or_default();
                // The version first, so the resources queued below read the
                // new data.
                if deleted {
                    referenced.gone(&ns, &name);
                } else {
                    referenced.seen(&ns, &name, o.metadata.resource_version.as_deref());
                }
                for owner in index.dependents(&ns, &name) {
                    routes.registry.owner(&owner, routes.gate.as_ref());
                }
            }
        }));
    }
    drivers
}

/// The global configuration ConfigMap (`kms-config` in
/// `--global-config-namespace`): kept in `global`, with the count of its
/// changes; a change sends every resource that uses it round. The watch
/// asks for that one name (which a Role limited to it allows); a namespace
/// that does not exist yet lists empty, and the ConfigMap is picked up when
/// it appears. Reading it never needs write access: the operator never
/// creates or changes it.
pub fn global_config(
    client: &Client,
    namespace: &str,
    undecodable: Undecodable,
    (global, epoch): (Arc<RwLock<GlobalConfig>>, Arc<std::sync::atomic::AtomicU64>),
    routes: &Routes,
) -> (Scoped<ConfigMap>, Vec<BoxFuture<'static, ()>>) {
    let routes = routes.clone();
    // Whether the list in progress had it (a re-list that does not list it
    // means it was deleted while the watch was down).
    let listed = std::sync::atomic::AtomicBool::new(false);
    Watches::new(client.clone(), vec![namespace.to_owned()], undecodable).watch::<ConfigMap, _>(
        &watcher::Config::default().fields(&format!("metadata.name={GLOBAL_CONFIG_NAME}")),
        move |event| {
            use std::sync::atomic::Ordering::SeqCst;
            let parsed = match event {
                Event::Apply(cm) => GlobalConfig::from_config_map(cm),
                Event::InitApply(cm) => {
                    listed.store(true, SeqCst);
                    GlobalConfig::from_config_map(cm)
                }
                Event::Delete(_) => GlobalConfig::default(),
                Event::Init => {
                    listed.store(false, SeqCst);
                    return;
                }
                Event::InitDone if listed.load(SeqCst) => return,
                // Listed, and absent: the defaults apply.
                Event::InitDone => GlobalConfig::default(),
            };
            let changed = {
                let mut g = global.write().unwrap_or_else(|e| e.into_inner());
                let changed = *g != parsed;
                *g = parsed.clone();
                changed
            };
            if changed {
                epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tracing::info!(
                    configmap = parsed.origin.as_deref().unwrap_or("(deleted)"),
                    host_api = parsed
                        .host_api
                        .as_deref()
                        .map(crate::kms::endpoint::redact_userinfo),
                    ca_ref = parsed.ca_ref.is_some(),
                    "global configuration {GLOBAL_CONFIG_NAME} changed"
                );
                for kind in routes.registry.kinds() {
                    kind.global_config_changed(routes.gate.as_ref());
                }
            }
        },
    )
}
