//! Watched caches: a reflector store per watched namespace (or one for the
//! whole cluster), queried as one, with a callback on every watch event so
//! controllers can turn events into queue entries.

use std::fmt::Debug;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

/// Stores of one kind over the watched namespaces.
pub struct Scoped<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    /// `(namespace, store)`; a `None` namespace covers the whole cluster.
    stores: Vec<(Option<String>, Store<K>)>,
}

impl<K: Resource + Clone + 'static> Clone for Scoped<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
        }
    }
}

impl<K> Scoped<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    fn store_for(&self, namespace: Option<&str>) -> Option<&Store<K>> {
        self.stores
            .iter()
            .find(|(ns, _)| ns.is_none() || ns.as_deref() == namespace)
            .map(|(_, s)| s)
    }

    /// The cached object, if it exists and its namespace is watched.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut key = ObjectRef::<K>::new(name);
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        self.store_for(namespace)?.get(&key)
    }

    /// Whether `namespace` is watched.
    pub fn covers(&self, namespace: &str) -> bool {
        self.store_for(Some(namespace)).is_some()
    }

    /// Every cached object.
    pub fn all(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|(_, s)| s.state()).collect()
    }

    /// Wait until every store has its initial list.
    pub async fn wait_ready(&self) {
        for (_, s) in &self.stores {
            let _ = s.wait_until_ready().await;
        }
    }

    /// Whether every store has its initial list.
    pub fn is_ready(&self) -> bool {
        // A store that has seen its initial list answers immediately.
        self.stores
            .iter()
            .all(|(_, s)| s.wait_until_ready().now_or_never().is_some())
    }
}

/// Start watching `K` in `namespaces` (all of them when empty) with the given
/// watcher settings. Returns the stores and the futures that drive the
/// watches; `on_event` sees every event after the store has applied it.
pub fn watch<K, F>(
    client: &Client,
    namespaces: &[String],
    config: &watcher::Config,
    on_event: F,
) -> (Scoped<K>, Vec<BoxFuture<'static, ()>>)
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
    F: Fn(&Event<K>) + Send + Sync + 'static,
{
    let on_event = Arc::new(on_event);
    let apis: Vec<(Option<String>, Api<K>)> = if namespaces.is_empty() {
        vec![(None, Api::all(client.clone()))]
    } else {
        namespaces
            .iter()
            .map(|ns| (Some(ns.clone()), Api::namespaced(client.clone(), ns)))
            .collect()
    };
    let mut stores = Vec::new();
    let mut drivers = Vec::new();
    for (ns, api) in apis {
        let (reader, writer) = reflector::store();
        stores.push((ns.clone(), reader));
        let on_event = on_event.clone();
        let stream = reflector::reflector(
            writer,
            watcher::watcher(api, config.clone()).default_backoff(),
        );
        let kind = std::any::type_name::<K>();
        drivers.push(
            async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(event) => on_event(&event),
                        Err(e) => tracing::warn!(kind, namespace = ns.as_deref().unwrap_or("*"), error = %e, "watch failed; retrying"),
                    }
                }
            }
            .boxed(),
        );
    }
    (Scoped { stores }, drivers)
}
