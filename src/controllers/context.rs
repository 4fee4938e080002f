//! What every reconcile of every kind shares: the clients, metrics, the
//! ownership gate, settings, the caches of managed objects, the persistent
//! cache, and the status writes the watch may not show yet. A kind's own
//! state lives in its controller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
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

/// How long a resource waits for the watch to show the status this replica
/// wrote before it is reconciled from the older copy anyway.
const UNSEEN_STATUS_WAIT: Duration = Duration::from_secs(10);

/// How soon a resource whose cached copy predates its last status write is
/// looked at again.
pub const UNSEEN_STATUS_RETRY: Duration = Duration::from_millis(200);

/// Status writes of this replica that its watch cache may not show yet: by
/// resource, the resourceVersion the status was computed from and when.
#[derive(Default)]
pub struct UnseenStatus(HashMap<String, (String, std::time::Instant)>);

impl UnseenStatus {
    /// The status of `id` was written from the object at `resource_version`.
    pub fn written(&mut self, id: &str, resource_version: Option<String>, now: std::time::Instant) {
        match resource_version {
            Some(rv) => {
                self.0.insert(id.to_owned(), (rv, now));
            }
            None => {
                self.0.remove(id);
            }
        }
    }

    /// Whether a cached copy at `cached_version` is the object the last
    /// write started from (so the cache has not seen the write). A watch
    /// that has not delivered the write within [`UNSEEN_STATUS_WAIT`] no
    /// longer holds the resource up. Answers `false` once only: a newer copy
    /// ends the wait for good.
    pub fn unseen(
        &mut self,
        id: &str,
        cached_version: Option<&str>,
        now: std::time::Instant,
    ) -> bool {
        match self.0.get(id) {
            Some((rv, at))
                if Some(rv.as_str()) == cached_version
                    && now.duration_since(*at) < UNSEEN_STATUS_WAIT =>
            {
                true
            }
            Some(_) => {
                self.0.remove(id);
                false
            }
            None => false,
        }
    }

    /// Forget `id` (deleted).
    pub fn forget(&mut self, id: &str) {
        self.0.remove(id);
    }
}

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
    /// Status writes of this replica its watch may not show yet.
    pub unseen_status: Mutex<UnseenStatus>,
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

    /// This replica wrote the status of `id`, computed from the object at
    /// `resource_version`: until the watch cache shows a newer object, the
    /// cached status is older than the one in the API.
    pub fn status_written(&self, id: &str, resource_version: Option<String>) {
        self.unseen_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .written(id, resource_version, std::time::Instant::now());
    }

    /// Forget the status writes of `id` (deleted).
    pub fn status_forget(&self, id: &str) {
        self.unseen_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(id);
    }

    /// Whether the cached copy of `id` (at `cached_version`) predates a
    /// status this replica wrote: reconciling from it would write the older
    /// status back (dropping conditions, announcing `Ready` again).
    pub fn status_unseen(&self, id: &str, cached_version: Option<&str>) -> bool {
        self.unseen_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unseen(id, cached_version, std::time::Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_status_write_holds_the_older_cached_copy_back_until_a_newer_one_arrives() {
        let mut u = UnseenStatus::default();
        let t0 = Instant::now();
        assert!(!u.unseen("KmsSecret/a/x", Some("5"), t0));
        u.written("KmsSecret/a/x", Some("5".into()), t0);
        // The cache still holds the object the write started from.
        assert!(u.unseen("KmsSecret/a/x", Some("5"), t0 + Duration::from_millis(300)));
        assert!(!u.unseen("KmsSecret/b/x", Some("5"), t0));
        // The write (or anything newer) arrived: no more waiting, even if a
        // copy at the old version showed up again.
        assert!(!u.unseen("KmsSecret/a/x", Some("6"), t0 + Duration::from_secs(1)));
        assert!(!u.unseen("KmsSecret/a/x", Some("5"), t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_watch_that_never_delivers_holds_nothing_up_for_long() {
        let mut u = UnseenStatus::default();
        let t0 = Instant::now();
        u.written("KmsSecret/a/x", Some("5".into()), t0);
        assert!(!u.unseen("KmsSecret/a/x", Some("5"), t0 + UNSEEN_STATUS_WAIT));
        u.written("KmsSecret/a/x", Some("7".into()), t0);
        u.forget("KmsSecret/a/x");
        assert!(!u.unseen("KmsSecret/a/x", Some("7"), t0));
    }
}
