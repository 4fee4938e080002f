//! Watched caches: a reflector store per watched namespace (or one for the
//! whole cluster), queried as one, with a callback on every watch event so
//! controllers can turn events into queue entries. Objects are stored without
//! their managed fields and `kubectl`'s last-applied copy.

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
            watcher::watcher(api, config.clone())
                .default_backoff()
                .modify(slim::<K>),
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

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
}
