//! What every reconcile of every kind shares: the clients, metrics, the
//! ownership gate, settings, the caches of managed objects and the
//! persistent cache. A kind's own state lives in its controller.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder};

use super::refs::{GlobalConfig, SecretReads};
use super::reload::ConsumerIndex;
use super::stores::Scoped;
use super::target::Renderer;
use crate::kms::Kms;
use crate::metrics::Metrics;
use crate::sharding::Ownership;

/// Settings of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Allow references into other namespaces.
    pub allow_cross_namespace_refs: bool,
    /// Namespace of the operator (Leases, `kms-config`).
    pub pod_namespace: String,
    /// Watched namespaces; empty = the whole cluster.
    pub namespaces: Vec<String>,
    /// Concurrent reconciles per controller.
    pub workers: usize,
    /// Longest backoff after failures.
    pub max_backoff: Duration,
    /// How long cleanup on deletion is retried before giving up.
    pub cleanup_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            allow_cross_namespace_refs: false,
            pod_namespace: "kms-operator-system".to_owned(),
            namespaces: Vec::new(),
            workers: 8,
            max_backoff: Duration::from_secs(300),
            cleanup_timeout: Duration::from_secs(3600),
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
    pub renderer: Arc<dyn Renderer>,
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
    /// The global configuration (`kms-config`), updated by its watch.
    pub global: Arc<RwLock<GlobalConfig>>,
}

impl Context {
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

    /// Keyed hash of a target's data for the cache (zeros without a cache).
    pub fn data_hash(
        &self,
        data: &std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Option<[u8; 32]> {
        self.cache.as_ref().map(|c| c.data_hasher().hash_map(data))
    }
}
