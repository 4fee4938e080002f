//! The controllers and what they share.
//!
//! Each controller is a per-shard [`queue::Queue`] of object keys fed by watch
//! events, drained by a pool of workers. A worker takes a key only if this
//! replica owns its shard ([`crate::sharding::Ownership`]), runs the
//! controller's reconcile (fetch → plan → apply → status) under the shard's
//! cancellation token, and requeues the key: at its due time on success, with
//! capped exponential backoff and jitter on failure (forever).
//!
//! - [`kms_secret`], [`kms_push_secret`], [`kms_dynamic_secret`],
//!   [`reload`]: the four controllers;
//! - [`registry`]: the kinds as the operator wires them (one list);
//! - [`auth`]: the authentication methods as the controllers resolve them;
//! - [`instant`]: instant updates (the KMS's change events);
//! - [`target`]: managed objects, ownership, adoption, versions (pure);
//! - [`apply`]: writes with resourceVersion preconditions;
//! - [`refs`]: references, the namespace rule, the global config;
//! - [`conditions`], [`error`]: status conditions and reconcile errors;
//! - [`queue`], [`stores`]: the work queues and the watched caches.

pub mod apply;
pub mod auth;
pub mod conditions;
pub mod error;
pub mod instant;
pub mod kms_dynamic_secret;
pub mod kms_push_secret;
pub mod kms_secret;
pub mod queue;
pub mod refs;
pub mod registry;
pub mod reload;
pub mod stores;
pub mod target;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::runtime::events::Recorder;
use tokio_util::sync::CancellationToken;

use self::error::SyncError;
use self::kms_secret::plan::Renderer;
use self::queue::Queue;
use self::refs::GlobalConfig;
use self::stores::Scoped;
use crate::api::kms_secret::KmsSecret;
use crate::kms::Kms;
use crate::metrics::Metrics;
use crate::sharding::Ownership;

/// A namespaced object's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// A key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Which resources read which Secrets (credentials, CA bundles, push
/// sources), by owner id (`<Kind>/<namespace>/<name>`), so that a change of
/// such a Secret sends exactly its readers round.
#[derive(Default)]
pub struct RefIndex {
    inner: Mutex<RefIndexInner>,
}

#[derive(Default)]
struct RefIndexInner {
    by_secret: HashMap<(String, String), HashSet<String>>,
    by_owner: HashMap<String, Vec<(String, String)>>,
}

impl RefIndex {
    /// Record the Secrets (`(namespace, name)`) an owner reads.
    pub fn set(&self, owner: &str, refs: Vec<(String, String)>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::remove_locked(&mut inner, owner);
        for r in &refs {
            inner
                .by_secret
                .entry(r.clone())
                .or_default()
                .insert(owner.to_owned());
        }
        inner.by_owner.insert(owner.to_owned(), refs);
    }

    fn remove_locked(inner: &mut RefIndexInner, owner: &str) {
        for r in inner.by_owner.remove(owner).unwrap_or_default() {
            if let Some(set) = inner.by_secret.get_mut(&r) {
                set.remove(owner);
                if set.is_empty() {
                    inner.by_secret.remove(&r);
                }
            }
        }
    }

    /// Forget an owner.
    pub fn remove(&self, owner: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::remove_locked(&mut inner, owner);
    }

    /// Owners that read a Secret.
    pub fn dependents(&self, ns: &str, name: &str) -> Vec<String> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .by_secret
            .get(&(ns.to_owned(), name.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reconcile again at this time.
    RequeueAt(SystemTime),
    /// Nothing more until something changes.
    Done,
}

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

/// What the operator remembers of an object's last sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncRecord {
    /// Spec generation synced.
    pub generation: i64,
    /// ETag of the last KMS answer.
    pub etag: Option<String>,
    /// When the KMS was last checked successfully.
    pub last_sync: SystemTime,
    /// When the next check is due.
    pub next_due: SystemTime,
    /// Secrets fetched at the last sync.
    pub synced_keys: i64,
    /// Keyed hash of each target's data (`Kind/ns/name`), when a persistent
    /// cache is configured.
    pub target_hashes: std::collections::BTreeMap<String, [u8; 32]>,
}

impl SyncRecord {
    fn to_stored(&self) -> storage::SyncRecord {
        let ms = crate::kms::client::unix_ms;
        storage::SyncRecord {
            generation: self.generation,
            etag: self.etag.clone(),
            target_hashes: self.target_hashes.clone(),
            last_sync_unix_ms: ms(self.last_sync),
            next_due_unix_ms: ms(self.next_due),
            synced_keys: u32::try_from(self.synced_keys).unwrap_or(u32::MAX),
        }
    }

    fn from_stored(r: storage::SyncRecord) -> Self {
        let at = |ms: i64| {
            SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
        };
        Self {
            generation: r.generation,
            etag: r.etag,
            last_sync: at(r.last_sync_unix_ms),
            next_due: at(r.next_due_unix_ms),
            synced_keys: i64::from(r.synced_keys),
            target_hashes: r.target_hashes,
        }
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

/// Everything a reconcile needs.
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
    /// Watched KmsSecrets.
    pub kms_secrets: Scoped<KmsSecret>,
    /// Watched managed Secrets (label `secrets.hanzo.ai/managed=true`).
    pub secrets: Scoped<Secret>,
    /// Watched managed ConfigMaps.
    pub config_maps: Scoped<ConfigMap>,
    /// The KmsSecret queue.
    pub kms_secret_queue: Arc<Queue<ObjectKey>>,
    /// Which workloads (that opted in to auto-reload) use which objects.
    pub consumers: Arc<reload::ConsumerIndex>,
    /// The persistent cache, if configured.
    pub cache: Option<storage::Store>,
    /// Instant-update streams of the KmsSecrets that ask for them.
    pub instant: instant::InstantUpdates,
    /// Reads of referenced Secrets (credentials, CA bundles, push sources),
    /// shared while unchanged.
    pub referenced: Arc<refs::SecretReads>,
    /// Steps that must finish even when their reconcile is dropped (a lease
    /// created and then recorded or revoked); shutdown waits for them.
    pub critical: tokio_util::task::TaskTracker,
    global: Arc<RwLock<GlobalConfig>>,
    records: Mutex<HashMap<String, SyncRecord>>,
    unseen_status: Mutex<UnseenStatus>,
}

/// The parts of a [`Context`] built before the watches start.
pub struct ContextParts {
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
    /// Global config, updated by its watch.
    pub global: Arc<RwLock<GlobalConfig>>,
    /// The KmsSecret queue.
    pub kms_secret_queue: Arc<Queue<ObjectKey>>,
    /// Which workloads use which objects.
    pub consumers: Arc<reload::ConsumerIndex>,
    /// Reads of referenced Secrets, kept current by the metadata watch.
    pub referenced: Arc<refs::SecretReads>,
    /// The persistent cache, if configured.
    pub cache: Option<storage::Store>,
}

impl Context {
    /// Assemble a context from its parts and the watched caches.
    pub fn new(
        parts: ContextParts,
        kms_secrets: Scoped<KmsSecret>,
        secrets: Scoped<Secret>,
        config_maps: Scoped<ConfigMap>,
    ) -> Self {
        let instant = instant::InstantUpdates::new(
            parts.kms.clone(),
            parts.kms_secret_queue.clone(),
            parts.gate.clone(),
        );
        Self {
            instant,
            critical: tokio_util::task::TaskTracker::new(),
            client: parts.client,
            kms: parts.kms,
            metrics: parts.metrics,
            gate: parts.gate,
            settings: parts.settings,
            recorder: parts.recorder,
            renderer: parts.renderer,
            kms_secrets,
            secrets,
            config_maps,
            kms_secret_queue: parts.kms_secret_queue,
            consumers: parts.consumers,
            referenced: parts.referenced,
            cache: parts.cache,
            global: parts.global,
            records: Mutex::new(HashMap::new()),
            unseen_status: Mutex::new(UnseenStatus::default()),
        }
    }

    /// The current global configuration.
    pub fn global_config(&self) -> GlobalConfig {
        self.global
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The sync record of an object UID.
    pub fn record(&self, uid: &str) -> Option<SyncRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// Store the sync record of an object UID (in memory, and in the
    /// persistent cache when there is one).
    pub fn set_record(&self, uid: &str, shard: u32, record: SyncRecord) {
        if let Some(cache) = &self.cache
            && let Err(e) = cache.put_sync(uid, &record.to_stored())
        {
            self.metrics
                .cache_errors
                .with_label_values(&[&shard.to_string()])
                .inc();
            tracing::warn!(error = %e, "could not write a cache record");
        }
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), record);
    }

    /// The persisted sync record of an object UID (counted as a cache hit,
    /// miss or error).
    pub fn cached_record(&self, uid: &str, shard: u32) -> Option<SyncRecord> {
        let cache = self.cache.as_ref()?;
        let s = shard.to_string();
        match cache.get_sync(uid) {
            storage::Lookup::Hit(r) => {
                self.metrics.cache_hits.with_label_values(&[&s]).inc();
                Some(SyncRecord::from_stored(r))
            }
            storage::Lookup::Miss => {
                self.metrics.cache_misses.with_label_values(&[&s]).inc();
                None
            }
            storage::Lookup::Error(reason) => {
                self.metrics.cache_errors.with_label_values(&[&s]).inc();
                tracing::warn!(%reason, "unreadable cache record dropped");
                None
            }
        }
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

    /// Whether the cached copy of `id` (at `cached_version`) predates a
    /// status this replica wrote: reconciling from it would write the older
    /// status back (dropping conditions, announcing `Ready` again).
    pub fn status_unseen(&self, id: &str, cached_version: Option<&str>) -> bool {
        self.unseen_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unseen(id, cached_version, std::time::Instant::now())
    }

    /// Forget what is known of a deleted object.
    pub fn forget(&self, key: &ObjectKey) {
        self.instant.unregister(key);
        self.unseen_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&kms_secret::owner_id(&key.namespace, &key.name));
        self.kms_secret_queue.reset_backoff(key);
        let live: HashSet<String> = self
            .kms_secrets
            .all()
            .iter()
            .filter_map(|o| o.metadata.uid.clone())
            .collect();
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live.contains(uid));
        if let Some(cache) = &self.cache
            && let Err(e) =
                cache.retain(|kind, uid| kind != storage::RecordKind::Sync || live.contains(uid))
        {
            tracing::warn!(error = %e, "could not prune the cache");
        }
    }
}

/// One controller's reconcile, as the worker pool calls it.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// Reconcile `key` of `shard`; stop early when `cancel` fires.
    fn reconcile<'a>(
        &'a self,
        ctx: &'a Context,
        key: &'a K,
        shard: u32,
        cancel: &'a CancellationToken,
    ) -> futures::future::BoxFuture<'a, Result<Action, SyncError>>;

    /// When `key` is tried again after an error that only a change can fix
    /// (its spec, a reference, a target, a refusal of the KMS): its resync
    /// interval. `None`: the longest backoff (`Settings::max_backoff`).
    fn retry_interval(&self, _ctx: &Context, _key: &K) -> Option<Duration> {
        None
    }
}

/// Drain `queue` with `ctx.settings.workers` workers until the queue closes.
pub async fn run_workers<K, R>(
    ctx: Arc<Context>,
    queue: Arc<Queue<K>>,
    controller: &'static str,
    reconciler: Arc<R>,
) where
    K: Clone + Eq + std::hash::Hash + Ord + std::fmt::Display + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let mut tasks = Vec::new();
    for _ in 0..ctx.settings.workers.max(1) {
        let (ctx, queue, reconciler) = (ctx.clone(), queue.clone(), reconciler.clone());
        tasks.push(tokio::spawn(async move {
            while let Some((key, shard)) = queue
                .next(|s| ctx.gate.owns(s), |s| ctx.gate.holds(s))
                .await
            {
                let cancel = ctx.gate.cancellation(shard);
                let started = tokio::time::Instant::now();
                let result = tokio::select! {
                    r = reconciler.reconcile(&ctx, &key, shard, &cancel) => r,
                    () = cancel.cancelled() => Err(SyncError::NotOwner),
                };
                let elapsed = started.elapsed();
                match result {
                    Ok(Action::RequeueAt(at)) => {
                        queue.reset_backoff(&key);
                        let delay = at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
                        queue.add_after(key.clone(), shard, delay);
                        ctx.metrics.reconcile(controller, shard, "success", elapsed);
                    }
                    Ok(Action::Done) => {
                        queue.reset_backoff(&key);
                        ctx.metrics.reconcile(controller, shard, "success", elapsed);
                    }
                    Err(SyncError::NotOwner) => {
                        // A shard that is still held (its renewal was only
                        // late) keeps its work; a lost one drops it (the next
                        // owner does a full pass).
                        if ctx.gate.holds(shard) {
                            queue.add_after(key.clone(), shard, queue::PARK);
                        } else {
                            tracing::debug!(%key, shard, "shard lost during reconcile; dropped");
                        }
                        ctx.metrics.reconcile(controller, shard, "requeue", elapsed);
                    }
                    Err(e) => {
                        let delay = retry_delay(&queue, &key, &e, ctx.settings.max_backoff, || {
                            reconciler.retry_interval(&ctx, &key)
                        });
                        let result = if matches!(e, SyncError::Kube { code: Some(409), .. }) { "requeue" } else { "error" };
                        let waits = if e.is_transient() { "backoff" } else { "a change or the resync interval" };
                        tracing::warn!(controller, %key, reason = e.reason(), error = %e, retry_in = ?delay, waits, "reconcile failed");
                        queue.add_after(key.clone(), shard, delay);
                        ctx.metrics.reconcile(controller, shard, result, elapsed);
                    }
                }
                queue.done(&key);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// When a failed reconcile of `key` is tried again. A transient error (the
/// KMS or the API unavailable, rate-limited, a conflict) backs off: 1 s
/// doubling to the maximum, at least what the KMS asked for. Any other error
/// (the spec, a reference, a target, the KMS refusing) cannot be fixed by
/// retrying soon: the watches queue the resource when it or what it
/// references changes, and otherwise it is tried at its resync interval (a
/// permission granted in the KMS changes nothing in the cluster).
fn retry_delay<K>(
    queue: &Queue<K>,
    key: &K,
    e: &SyncError,
    max_backoff: Duration,
    resync_interval: impl FnOnce() -> Option<Duration>,
) -> Duration
where
    K: Clone + Eq + std::hash::Hash + Ord,
{
    if e.is_transient() {
        let delay = queue.failed(key, max_backoff);
        return match e.retry_after() {
            Some(ra) => delay.max(ra + Duration::from_millis(fastrand::u64(0..1500))),
            None => delay,
        };
    }
    queue.reset_backoff(key);
    resync_interval()
        .unwrap_or(max_backoff)
        .mul_f64(0.9 + 0.2 * fastrand::f64())
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
    fn transient_errors_back_off_and_the_others_wait_for_the_resync_interval() {
        let q: Queue<String> = Queue::new();
        let key = "ns/app".to_owned();
        let max = Duration::from_secs(300);
        let unavailable = SyncError::Kube {
            context: "list".into(),
            message: "etcd unavailable".into(),
            code: Some(503),
        };
        let within = |d: Duration, base: u64| {
            d >= Duration::from_millis(base * 800) && d <= Duration::from_millis(base * 1200)
        };
        // 1 s, 2 s, 4 s, … (±20 %), whatever the resync interval.
        for base in [1, 2, 4, 8] {
            let d = retry_delay(&q, &key, &unavailable, max, || {
                Some(Duration::from_secs(60))
            });
            assert!(within(d, base), "{d:?} is not about {base} s");
        }
        // A spec error waits for a change, or the resync interval; and the
        // backoff starts over.
        let invalid = SyncError::Spec("secretsPath: not a path".into());
        let d = retry_delay(&q, &key, &invalid, max, || Some(Duration::from_secs(60)));
        assert!(
            d >= Duration::from_secs(54) && d <= Duration::from_secs(66),
            "{d:?}"
        );
        let d = retry_delay(&q, &key, &unavailable, max, || None);
        assert!(within(d, 1), "{d:?}: the backoff did not start over");
        // Without a resync interval: the longest backoff.
        let d = retry_delay(&q, &key, &invalid, max, || None);
        assert!(d >= Duration::from_secs(270), "{d:?}");
        // The KMS's Retry-After is honoured for transient errors.
        let limited = SyncError::Kms(crate::kms::KmsError::rate_limited(
            "GET /api/v3/secrets/raw",
            Duration::from_secs(30),
        ));
        let d = retry_delay(&q, &key, &limited, max, || None);
        assert!(d >= Duration::from_secs(30), "{d:?}");
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
