//! What every reconcile of every kind shares: the clients, metrics, the
//! ownership gate, settings, the caches of managed objects and the
//! persistent cache. A kind's own state lives in its controller.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::runtime::events::{Event, EventType};

use super::events::Recorder;

use super::refs::{GlobalConfig, SecretReads};
use super::reload::ConsumerIndex;
use super::stores::{Namespaced, Scoped};
use super::target::Renderer;
use crate::kms::Kms;
use crate::metrics::Metrics;
use crate::sharding::Ownership;

/// Settings of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Allow references into other namespaces.
    pub allow_cross_namespace_refs: bool,
    /// Namespace of the operator (Leases).
    pub pod_namespace: String,
    /// Namespace of the global configuration ConfigMap `kms-config`.
    pub global_config_namespace: String,
    /// The operator's defaults below `kms-config`.
    pub defaults: super::refs::Defaults,
    /// Watched namespaces; empty = the whole cluster.
    pub namespaces: Vec<String>,
    /// Concurrent reconciles per controller.
    pub workers: usize,
    /// Longest backoff after failures.
    pub max_backoff: Duration,
    /// How long cleanup on deletion is retried before giving up.
    pub cleanup_timeout: Duration,
    /// Where the operator's own cloud identity may be used.
    pub cloud_identities: Arc<super::cloud_identities::CloudIdentities>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            allow_cross_namespace_refs: false,
            pod_namespace: "kms-operator-system".to_owned(),
            global_config_namespace: super::refs::GLOBAL_CONFIG_NAMESPACE.to_owned(),
            defaults: super::refs::Defaults::default(),
            namespaces: Vec::new(),
            workers: 32,
            max_backoff: Duration::from_secs(300),
            cleanup_timeout: Duration::from_secs(3600),
            cloud_identities: Arc::default(),
        }
    }
}

/// What every reconcile needs, built once by the operator's wiring.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// KMS client.
    pub kms: Arc<Kms>,
    /// Metrics.
    pub metrics: Metrics,
    /// The ownership gate.
    pub gate: Arc<dyn Ownership>,
    /// Settings.
    pub settings: Settings,
    /// Event recorder.
    pub recorder: Recorder,
    /// Template renderer.
    pub renderer: Arc<Renderer>,
    /// The threads renders run on, and their deadline.
    pub renders: Arc<super::render::RenderPool>,
    /// Watched managed Secrets (label `secrets.hanzo.ai/managed=true`).
    pub secrets: Scoped<Secret>,
    /// Watched managed ConfigMaps.
    pub config_maps: Scoped<ConfigMap>,
    /// Which workloads (that opted in to auto-reload) use which objects.
    pub consumers: Arc<ConsumerIndex>,
    /// The persistent cache, if configured.
    pub cache: Option<storage::Store>,
    /// Reads of referenced Secrets (credentials, CA bundles, push sources),
    /// shared while unchanged.
    pub referenced: Arc<SecretReads>,
    /// Steps that must finish even when their reconcile is dropped (a lease
    /// created and then recorded or revoked); shutdown waits for them.
    pub critical: tokio_util::task::TaskTracker,
    /// Cancelled when the operator stops and the reconciles in flight have
    /// had their grace: those still running are dropped, as on a lost
    /// shard (the next holder does them).
    pub stop: tokio_util::sync::CancellationToken,
    /// The global configuration (`kms-config`), updated by its watch.
    pub global: Arc<RwLock<GlobalConfig>>,
    /// How many times the global configuration changed: a resource that
    /// resolved its endpoint at an older count resolves it again.
    pub global_epoch: Arc<std::sync::atomic::AtomicU64>,
    /// The kind spellings the cluster serves (what every write carries).
    pub served: crate::api::served::ServedKinds,
    /// The multiple of `--workers` each controller reconciles at once
    /// (`workers::worker_scale`: this replica's part of the replicas'
    /// work), set every second with the KMS budget's shares.
    pub worker_scale: tokio::sync::watch::Sender<f64>,
    /// The targets this replica wrote whose watch events have not come
    /// back yet (shared with the watch of managed objects).
    pub own_writes: Arc<super::written::OwnWrites>,
}

impl Context {
    /// A resource by namespace and name: from `store`, else — when its
    /// namespace's shard is not this replica's to cache — read from the API
    /// server (with caches by shard a replica holds only its own shards'
    /// resources).
    pub async fn resource<K>(
        &self,
        store: &Scoped<K>,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error>
    where
        K: Namespaced,
    {
        if let Some(found) = store.get(Some(namespace), name) {
            return Ok(Some(found));
        }
        if self.gate.owns(self.gate.shard_of(namespace)) {
            return Ok(None);
        }
        kube::Api::<K>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map(|o| o.map(Arc::new))
    }

    /// Publish an Event about `object` for `action`; a failure is logged,
    /// not returned (an Event is never worth failing a reconcile for).
    pub async fn publish(
        &self,
        object: &ObjectReference,
        action: &str,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(super::conditions::bounded(note)),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, object).await {
            tracing::warn!(error = %e, "could not publish an Event");
        }
    }

    /// The current global configuration.
    pub fn global_config(&self) -> GlobalConfig {
        self.global
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The current count of global configuration changes.
    pub fn global_epoch(&self) -> u64 {
        self.global_epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keyed hash of a target's data for the cache (zeros without a cache).
    pub fn data_hash(
        &self,
        data: &std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Option<[u8; 32]> {
        self.cache.as_ref().map(|c| c.data_hasher().hash_map(data))
    }
}

/// The ownership gate of [`Context::test`]: one shard, always owned.
#[cfg(test)]
pub(crate) struct OwnsAll;

#[cfg(test)]
impl Ownership for OwnsAll {
    fn shard_count(&self) -> u32 {
        1
    }
    fn shard_of(&self, _namespace: &str) -> u32 {
        0
    }
    fn owns(&self, _shard: u32) -> bool {
        true
    }
    fn holds(&self, _shard: u32) -> bool {
        true
    }
    fn cancellation(&self, _shard: u32) -> tokio_util::sync::CancellationToken {
        tokio_util::sync::CancellationToken::new()
    }
    fn members(&self) -> u32 {
        1
    }
    fn identity(&self) -> &str {
        "test"
    }
    fn publish_demand(&self, _demand: u32) {}
    fn demands(&self) -> std::collections::BTreeMap<String, u32> {
        std::collections::BTreeMap::new()
    }
    fn member_leases(&self) -> std::collections::BTreeSet<String> {
        std::collections::BTreeSet::new()
    }
}

#[cfg(test)]
impl Context {
    /// A context for unit tests (call it inside a Tokio runtime): a client
    /// of an API server that never answers (every request fails to
    /// connect), a KMS client with default settings, one shard owned by
    /// this replica, empty stores and no cache. Tests replace the fields
    /// they need.
    pub fn test() -> Context {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a valid URL"));
        let client = Client::try_from(config).expect("a client");
        let metrics = Metrics::new(1);
        let recorder = Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "kms-operator-test".into(),
                instance: None,
            },
        );
        Context {
            kms: Arc::new(Kms::new(crate::kms::KmsConfig::default(), metrics.clone())),
            client,
            metrics,
            gate: Arc::new(OwnsAll),
            settings: Settings::default(),
            recorder,
            renderer: super::target::engine_renderer(kms_template::Engine::default()),
            renders: Arc::new(super::render::RenderPool::for_tests()),
            secrets: Scoped::unwatched(),
            config_maps: Scoped::unwatched(),
            consumers: Arc::default(),
            cache: None,
            referenced: Arc::default(),
            critical: tokio_util::task::TaskTracker::new(),
            stop: tokio_util::sync::CancellationToken::new(),
            global: Arc::default(),
            global_epoch: Arc::default(),
            served: crate::api::served::ServedKinds::default(),
            worker_scale: tokio::sync::watch::Sender::new(1.0),
            own_writes: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_test_context_owns_its_one_shard_and_has_no_cache() {
        let ctx = Context::test();
        assert!(ctx.gate.owns(ctx.gate.shard_of("any")));
        assert_eq!(ctx.data_hash(&Default::default()), None);
        assert_eq!(ctx.global_config(), GlobalConfig::default());
        assert!(ctx.secrets.get(Some("default"), "missing").is_none());
    }
}
