//! The shard label on the objects a replica watches by label: the Secrets
//! and ConfigMaps the operator manages (a resource belongs to its
//! namespace's shard and carries no label: see `controllers::stores`).
//! Managed objects get it when they are written; those written by a
//! version before the label, or under another shard count, get it here.
//!
//! Every replica watches the metadata of managed objects whose label is
//! missing or stale: none in a steady state. The replica that holds an
//! object's shard labels it (a merge patch, field manager
//! [`FIELD_MANAGER`]) before the shard's watches start, so that their first
//! list finds every target.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{ObjectMeta, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use crate::controllers::registry::OwnerId;
use crate::controllers::stores::{Namespaced, Ready, SHARD_LABEL, ShardLabels};
use crate::controllers::target::{MANAGED_LABEL, OWNER_ANNOTATION};
use crate::sharding::Ownership;

/// The field manager of the shard label on managed objects that lacked it.
pub const FIELD_MANAGER: &str = "kms-operator-shard-label";

/// How many label patches one replica sends at once.
const CONCURRENCY: usize = 8;

/// How often labels that could not be written are tried again.
const RETRY_EVERY: Duration = Duration::from_secs(15);

/// The kinds that carry the label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Labelled {
    Secret,
    ConfigMap,
}

impl Labelled {
    const ALL: [Labelled; 2] = [Labelled::Secret, Labelled::ConfigMap];
}

/// An object whose label is missing or stale (ordered by namespace, then
/// name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Unlabelled {
    namespace: String,
    name: String,
    kind: Labelled,
}

/// Unlabelled objects by shard, and the shards whose objects are labelled
/// as they appear.
#[derive(Default)]
struct State {
    pending: BTreeMap<u32, HashSet<Unlabelled>>,
    active: BTreeSet<u32>,
    /// Patches being sent (one per object at a time).
    in_flight: HashSet<Unlabelled>,
}

/// Labels the objects of the shards this replica holds.
pub struct Labeler {
    client: Client,
    labels: ShardLabels,
    gate: Arc<dyn Ownership>,
    state: Mutex<State>,
    /// The first lists of the watches of unlabelled objects.
    ready: Mutex<Vec<Ready>>,
    /// Held while a shard's pending objects are labelled: one shard after
    /// another.
    labelling: tokio::sync::Mutex<()>,
}

impl Labeler {
    /// A labeler with nothing watched yet.
    pub fn new(client: Client, labels: ShardLabels, gate: Arc<dyn Ownership>) -> Arc<Self> {
        Arc::new(Self {
            client,
            labels,
            gate,
            state: Mutex::new(State::default()),
            ready: Mutex::new(Vec::new()),
            labelling: tokio::sync::Mutex::new(()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watches of unlabelled objects in `namespaces` (all when empty)
    /// and the retry loop; nothing runs until they are spawned.
    pub fn drivers(self: &Arc<Self>, namespaces: &[String]) -> Vec<BoxFuture<'static, ()>> {
        let scopes: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().cloned().map(Some).collect()
        };
        let mut drivers = Vec::new();
        for kind in Labelled::ALL {
            for scope in &scopes {
                drivers.push(self.clone().watch(kind, scope.clone()));
            }
        }
        let this = self.clone();
        drivers.push(Box::pin(async move {
            let mut tick = tokio::time::interval(RETRY_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                let active: Vec<u32> = this.state().active.iter().copied().collect();
                for shard in active {
                    this.label_pending(shard).await;
                }
            }
        }));
        drivers
    }

    fn watch(self: Arc<Self>, kind: Labelled, namespace: Option<String>) -> BoxFuture<'static, ()> {
        let selector = format!("{MANAGED_LABEL}=true,{}", self.labels.stale_selector());
        let config = watcher::Config::default().labels(&selector);
        let (mark_ready, ready) = Ready::new();
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ready);
        let client = self.client.clone();
        let ns = namespace.as_deref();
        let events = match kind {
            Labelled::Secret => metadata_events::<Secret>(&client, ns, config),
            Labelled::ConfigMap => metadata_events::<ConfigMap>(&client, ns, config),
        };
        Box::pin(async move {
            let mut events = events;
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Init) => self.forget(kind, namespace.as_deref()),
                    Ok(Event::InitDone) => {
                        mark_ready.send_replace(true);
                    }
                    Ok(Event::Apply(meta) | Event::InitApply(meta)) => self.seen(kind, &meta),
                    Ok(Event::Delete(meta)) => self.gone(kind, &meta),
                    Err(e) => tracing::warn!(
                        ?kind,
                        error = %e,
                        "watch of objects without a shard label failed; retrying"
                    ),
                }
            }
        })
    }

    /// The shard a managed object belongs to: its owner's (none when it
    /// names no owner).
    fn shard_of(&self, meta: &ObjectMeta) -> Option<u32> {
        let owner = meta.annotations.as_ref()?.get(OWNER_ANNOTATION)?;
        Some(self.labels.shard_of(OwnerId::parse(owner)?.namespace))
    }

    fn seen(self: &Arc<Self>, kind: Labelled, meta: &ObjectMeta) {
        let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
            return;
        };
        let Some(shard) = self.shard_of(meta) else {
            return;
        };
        let item = Unlabelled {
            kind,
            namespace,
            name,
        };
        let active = {
            let mut state = self.state();
            state.pending.entry(shard).or_default().insert(item.clone());
            state.active.contains(&shard)
        };
        if active {
            let this = self.clone();
            tokio::spawn(async move { this.label_one(shard, item).await });
        }
    }

    fn gone(&self, kind: Labelled, meta: &ObjectMeta) {
        let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
            return;
        };
        let item = Unlabelled {
            kind,
            namespace,
            name,
        };
        for items in self.state().pending.values_mut() {
            items.remove(&item);
        }
    }

    /// A re-list of `kind` (in `namespace`, or everywhere) starts: what it
    /// does not list again is labelled or gone.
    fn forget(&self, kind: Labelled, namespace: Option<&str>) {
        for items in self.state().pending.values_mut() {
            items.retain(|i| i.kind != kind || namespace.is_some_and(|ns| i.namespace != ns));
        }
    }

    /// `shard` was gained: label the objects it manages that lack the label
    /// (after the first lists of unlabelled objects), so that its first
    /// list finds every target, and from now on each object as it appears.
    pub async fn gained(self: &Arc<Self>, shard: u32) {
        let readies: Vec<Ready> = self.ready.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for ready in readies {
            ready.wait().await;
        }
        self.state().active.insert(shard);
        self.label_pending(shard).await;
    }

    /// `shard` is no longer held.
    pub fn lost(&self, shard: u32) {
        self.state().active.remove(&shard);
    }

    /// Label every pending object of `shard`.
    async fn label_pending(self: &Arc<Self>, shard: u32) {
        let _turn = self.labelling.lock().await;
        let mut items: Vec<Unlabelled> = self
            .state()
            .pending
            .get(&shard)
            .map(|i| i.iter().cloned().collect())
            .unwrap_or_default();
        items.sort();
        if items.is_empty() {
            return;
        }
        let n = items.len();
        stream::iter(items)
            .for_each_concurrent(CONCURRENCY, |item| self.label_one(shard, item))
            .await;
        tracing::info!(shard, objects = n, "labelled objects of a gained shard");
    }

    async fn label_one(&self, shard: u32, item: Unlabelled) {
        if !self.gate.holds(shard) || !self.state().in_flight.insert(item.clone()) {
            return;
        }
        self.patch(shard, &item).await;
        self.state().in_flight.remove(&item);
    }

    async fn patch(&self, shard: u32, item: &Unlabelled) {
        let value = self.labels.value(shard);
        let patch = Patch::Merge(json!({"metadata": {"labels": {SHARD_LABEL: value}}}));
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let (ns, name) = (item.namespace.as_str(), item.name.as_str());
        let client = self.client.clone();
        let result = match item.kind {
            Labelled::Secret => patch_label::<Secret>(client, ns, name, &params, &patch).await,
            Labelled::ConfigMap => {
                patch_label::<ConfigMap>(client, ns, name, &params, &patch).await
            }
        };
        let done = match result {
            Ok(()) => true,
            Err(kube::Error::Api(e)) if e.code == 404 => true,
            Err(e) => {
                tracing::warn!(
                    kind = ?item.kind,
                    namespace = ns,
                    name,
                    error = %e,
                    "could not write the shard label; trying again later"
                );
                false
            }
        };
        if done && let Some(items) = self.state().pending.get_mut(&shard) {
            items.remove(item);
        }
    }
}

fn metadata_events<K>(
    client: &Client,
    namespace: Option<&str>,
    config: watcher::Config,
) -> futures::stream::BoxStream<'static, watcher::Result<Event<ObjectMeta>>>
where
    K: Namespaced,
    K::DynamicType: Default,
{
    let api: Api<PartialObjectMeta<K>> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    watcher::watcher(api, config)
        .default_backoff()
        .map(|item| {
            item.map(|event| match event {
                Event::Init => Event::Init,
                Event::InitDone => Event::InitDone,
                Event::InitApply(o) => Event::InitApply(meta_of(o)),
                Event::Apply(o) => Event::Apply(meta_of(o)),
                Event::Delete(o) => Event::Delete(meta_of(o)),
            })
        })
        .boxed()
}

fn meta_of<K>(o: PartialObjectMeta<K>) -> ObjectMeta {
    o.metadata
}

async fn patch_label<K>(
    client: Client,
    namespace: &str,
    name: &str,
    params: &PatchParams,
    patch: &Patch<serde_json::Value>,
) -> Result<(), kube::Error>
where
    K: Namespaced,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client, namespace)
        .patch_metadata(name, params, patch)
        .await
        .map(|_| ())
}
