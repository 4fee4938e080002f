//! References from a resource to other objects (credentials, CA bundles,
//! targets), the namespace rule that keeps a resource inside its own
//! namespace unless `--allow-cross-namespace-refs`, and the global
//! `kms-config` ConfigMap (read from `--global-config-namespace`, by default
//! `kms-operator-system` as the Go operators' documentation has users create
//! it). A resource's endpoint is chosen field by field — host and CA each
//! from the resource's spec, else `kms-config`, else the operator's defaults
//! (`--default-host-api`, `--default-ca-ref`), else the built-in host / the
//! system roots — and the choice names its sources for the status.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::Api;

use super::error::SyncError;
use super::stores::Scoped;
use crate::api::common::TlsConfig;
use crate::kms::flight::SingleFlight;
use crate::kms::{DEFAULT_HOST_API, Endpoint};

/// Name of the global configuration ConfigMap.
pub const GLOBAL_CONFIG_NAME: &str = "kms-config";
/// Default namespace of the global configuration ConfigMap, as the
/// Go operators' documentation names it.
pub const GLOBAL_CONFIG_NAMESPACE: &str = "kms-operator-system";

/// The namespace a reference points to: its own, or the resource's. Another
/// namespace than the resource's is refused unless allowed.
pub fn namespace_of(
    resource_ns: &str,
    requested: Option<&str>,
    field: &str,
    allow_cross: bool,
) -> Result<String, SyncError> {
    match requested.filter(|n| !n.is_empty()) {
        None => Ok(resource_ns.to_owned()),
        Some(ns) if ns == resource_ns || allow_cross => Ok(ns.to_owned()),
        Some(ns) => Err(SyncError::Reference {
            reason: "CrossNamespaceRefDenied",
            message: format!(
                "{field} points to namespace {ns}; references outside the resource's namespace {resource_ns} \
                 need the operator flag --allow-cross-namespace-refs"
            ),
        }),
    }
}

/// A Secret reference as the reference index keys it, `(namespace, name)`:
/// its namespace as written, or the resource's (`resource_ns`) when it has
/// none. Whether another namespace is allowed is checked when reconciling
/// ([`namespace_of`]).
pub fn written_ref(resource_ns: &str, requested: Option<&String>, name: &str) -> (String, String) {
    let ns = requested
        .filter(|n| !n.is_empty())
        .map_or(resource_ns, String::as_str);
    (ns.to_owned(), name.to_owned())
}

/// Read a Secret from the API; `None` when it does not exist.
async fn get_secret(client: &Client, ns: &str, name: &str) -> Result<Option<Secret>, SyncError> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| SyncError::kube(format!("reading Secret {ns}/{name}"), e))
}

type SecretKey = (String, String);

/// What a read of a Secret found.
type SecretRead = Result<Option<Arc<Secret>>, SyncError>;

/// Reads of referenced Secrets (credentials, CA bundles, push sources),
/// shared while the Secret is unchanged.
///
/// The operator does not cache the data of every Secret; it watches their
/// metadata, which says the current `resourceVersion` of each. A read answers
/// from the last copy read when that copy is the current version and asks the
/// API otherwise (a Secret outside the watched namespaces is always read from
/// the API). The ten resources of a namespace that share a credentials Secret
/// cost one GET between changes instead of one each. Copies are kept only of
/// Secrets that were read, without their managed fields, and dropped when the
/// Secret goes. Secrets the operator manages are left out of that watch
/// (each replica would otherwise see every write of every replica); a read
/// of one in this replica's shards is answered from the managed Secrets'
/// cache, which its watch keeps current, and one elsewhere from the API.
pub struct SecretReads {
    /// The managed Secrets of this replica's shards.
    managed: Option<Scoped<Secret>>,
    versions: std::sync::Mutex<Versions>,
    copies: std::sync::Mutex<HashMap<SecretKey, Arc<Secret>>>,
    /// Reads in flight, by Secret and the version the watch knew when they
    /// started: a caller that knows the same version joins one (the ten
    /// resources of a namespace starting together make one read).
    reads: SingleFlight<(String, String, String), SecretRead>,
    /// When this was created: every read in flight started after it.
    epoch: tokio::time::Instant,
}

impl Default for SecretReads {
    fn default() -> Self {
        Self {
            managed: None,
            versions: Default::default(),
            copies: Default::default(),
            reads: SingleFlight::default(),
            epoch: tokio::time::Instant::now(),
        }
    }
}

/// Current resource versions by Secret, and those of the re-lists in
/// progress (one watch per watched namespace, or one for all: `None`).
#[derive(Default)]
struct Versions {
    current: HashMap<SecretKey, String>,
    relists: HashMap<Option<String>, HashMap<SecretKey, String>>,
}

impl SecretReads {
    /// Reads that answer managed Secrets from `managed`.
    pub fn new(managed: Scoped<Secret>) -> Self {
        Self {
            managed: Some(managed),
            ..Self::default()
        }
    }

    /// Read `ns/name`; `None` when it does not exist.
    pub async fn get(
        &self,
        client: &Client,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, SyncError> {
        if let Some(managed) = self.managed.as_ref().and_then(|m| m.get(Some(ns), name)) {
            return Ok(Some(managed));
        }
        if let Some(copy) = self.current_copy(ns, name) {
            return Ok(Some(copy));
        }
        let read = || async {
            let read = get_secret(client, ns, name).await?.map(|mut s| {
                s.metadata.managed_fields = None;
                Arc::new(s)
            });
            self.remember(ns, name, read.as_ref());
            Ok(read)
        };
        let known = lock(&self.versions)
            .current
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned();
        match known {
            // Unknown to the watch: nothing says an earlier read is recent
            // enough.
            None => read().await,
            Some(version) => {
                let key = (ns.to_owned(), name.to_owned(), version);
                self.reads.run(key, self.epoch, read).await.value
            }
        }
    }

    /// The copy of `ns/name` read last, if it is the version the watch says
    /// is current.
    fn current_copy(&self, ns: &str, name: &str) -> Option<Arc<Secret>> {
        let key = (ns.to_owned(), name.to_owned());
        let current = lock(&self.versions).current.get(&key).cloned()?;
        lock(&self.copies)
            .get(&key)
            .filter(|c| c.metadata.resource_version.as_ref() == Some(&current))
            .cloned()
    }

    /// Keep what a read of `ns/name` returned, while the watch can say when it
    /// changes (its namespace is watched and it has been seen).
    fn remember(&self, ns: &str, name: &str, read: Option<&Arc<Secret>>) {
        let key = (ns.to_owned(), name.to_owned());
        let watched = lock(&self.versions).current.contains_key(&key);
        let mut copies = lock(&self.copies);
        match read {
            Some(s) if watched => {
                copies.insert(key, s.clone());
            }
            _ => {
                copies.remove(&key);
            }
        }
    }

    /// The metadata watch saw `ns/name` at `resource_version` (created or
    /// changed).
    pub fn seen(&self, ns: &str, name: &str, resource_version: Option<&str>) {
        let key = (ns.to_owned(), name.to_owned());
        let mut versions = lock(&self.versions);
        match resource_version {
            Some(rv) => {
                versions.current.insert(key, rv.to_owned());
            }
            None => {
                versions.current.remove(&key);
                lock(&self.copies).remove(&key);
            }
        }
    }

    /// The metadata watch saw `ns/name` deleted.
    pub fn gone(&self, ns: &str, name: &str) {
        let key = (ns.to_owned(), name.to_owned());
        lock(&self.versions).current.remove(&key);
        lock(&self.copies).remove(&key);
    }

    /// A re-list of `namespace` (every namespace when `None`) begins.
    pub fn relist_started(&self, namespace: Option<&str>) {
        lock(&self.versions)
            .relists
            .insert(namespace.map(str::to_owned), HashMap::new());
    }

    /// One Secret of the re-list of `namespace`. Whether it differs from the
    /// version known before (new or changed while the watch was down).
    pub fn relisted(
        &self,
        namespace: Option<&str>,
        ns: &str,
        name: &str,
        resource_version: Option<&str>,
    ) -> bool {
        let key = (ns.to_owned(), name.to_owned());
        let mut versions = lock(&self.versions);
        let changed = versions.current.get(&key).map(String::as_str) != resource_version;
        if let (Some(relist), Some(rv)) = (
            versions.relists.get_mut(&namespace.map(str::to_owned)),
            resource_version,
        ) {
            relist.insert(key, rv.to_owned());
        }
        changed
    }

    /// The re-list of `namespace` (every namespace when `None`) is complete:
    /// what it did not list is gone.
    pub fn relist_done(&self, namespace: Option<&str>) {
        let mut versions = lock(&self.versions);
        let Some(listed) = versions.relists.remove(&namespace.map(str::to_owned)) else {
            return;
        };
        versions
            .current
            .retain(|(ns, _), _| namespace.is_some_and(|n| n != ns));
        versions.current.extend(listed);
        let current = &versions.current;
        lock(&self.copies).retain(|k, _| current.contains_key(k));
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read the string value of `key` in a Secret's data.
pub fn secret_string(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The parsed `kms-config` ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GlobalConfig {
    /// `namespace/name` of the ConfigMap it was read from; `None` when there
    /// is none (not created yet, or deleted).
    pub origin: Option<String>,
    /// `hostAPI`.
    pub host_api: Option<String>,
    /// `tls.caRef.*`: namespace, name, key.
    pub ca_ref: Option<(String, String, String)>,
    /// Why its `tls.caRef` could not be used, if it could not.
    pub error: Option<String>,
    /// Set until the ConfigMap could be read once (its watch has not
    /// listed it yet, e.g. for lack of access): what falls back to it
    /// waits rather than use a default the ConfigMap may override.
    pub unavailable: Option<String>,
}

impl GlobalConfig {
    /// Not read yet: the ConfigMap `namespace/kms-config`.
    pub fn pending(namespace: &str) -> Self {
        Self {
            unavailable: Some(format!(
                "the global configuration ConfigMap {namespace}/{GLOBAL_CONFIG_NAME} could not be read yet \
                 (see the operator's log; in namespace-scoped installs the operator needs get, list and watch on it)"
            )),
            ..Self::default()
        }
    }

    fn check_available(&self) -> Result<(), SyncError> {
        match &self.unavailable {
            Some(why) => Err(SyncError::Reference {
                reason: "GlobalConfigUnavailable",
                message: why.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Parse the ConfigMap's data.
    pub fn from_config_map(cm: &ConfigMap) -> Self {
        let origin = format!(
            "{}/{}",
            cm.metadata.namespace.as_deref().unwrap_or_default(),
            cm.metadata.name.as_deref().unwrap_or(GLOBAL_CONFIG_NAME)
        );
        let empty = BTreeMap::new();
        let data = cm.data.as_ref().unwrap_or(&empty);
        let get = |k: &str| {
            data.get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let host_api = get("hostAPI");
        let parts = (
            get("tls.caRef.secretNamespace"),
            get("tls.caRef.secretName"),
            get("tls.caRef.key"),
        );
        let (ca_ref, error) = match parts {
            (None, None, None) => (None, None),
            (Some(ns), Some(name), Some(key)) => (Some((ns, name, key)), None),
            _ => (
                None,
                Some(format!(
                    "ConfigMap {origin}: tls.caRef.secretName, tls.caRef.secretNamespace and tls.caRef.key must be set together"
                )),
            ),
        };
        Self {
            origin: Some(origin),
            host_api,
            ca_ref,
            error,
            unavailable: None,
        }
    }

    /// How a field taken from this ConfigMap is named in a status.
    fn source(&self) -> Source {
        Source::GlobalConfig(
            self.origin
                .clone()
                .unwrap_or_else(|| GLOBAL_CONFIG_NAME.to_owned()),
        )
    }
}

/// The operator's own defaults, below `kms-config` (`--default-host-api`,
/// `--default-ca-ref`; the chart's `hostAPI` and `tls.caRef`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// The default `hostAPI`; the built-in default when `None`.
    pub host_api: Option<String>,
    /// The default CA: namespace, name, key.
    pub ca_ref: Option<(String, String, String)>,
}

/// Where a field of the endpoint (host or CA) came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The resource's own spec.
    Spec,
    /// The global ConfigMap (`namespace/name`).
    GlobalConfig(String),
    /// The operator's flag (`--default-host-api`, `--default-ca-ref`).
    OperatorDefault(&'static str),
    /// The built-in default host.
    BuiltIn,
    /// Nothing (CA: the system roots only).
    Unset,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Spec => f.write_str("spec"),
            Source::GlobalConfig(origin) => write!(f, "kms-config ({origin})"),
            Source::OperatorDefault(flag) => write!(f, "operator default ({flag})"),
            Source::BuiltIn => f.write_str("built-in default"),
            Source::Unset => f.write_str("none"),
        }
    }
}

/// The host and the CA a resource uses, each with its source. Pure: what
/// [`resolve_endpoint`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The host URL as configured.
    pub host: String,
    /// Where the host came from.
    pub host_source: Source,
    /// The CA Secret: namespace, name, key.
    pub ca: Option<(String, String, String)>,
    /// Where the CA came from.
    pub ca_source: Source,
}

impl Choice {
    /// The status message naming the sources (no secret values: a URL's
    /// user info is redacted).
    pub fn describe(&self) -> String {
        let host = crate::kms::endpoint::redact_userinfo(&self.host);
        let ca = match &self.ca {
            Some((ns, name, key)) => {
                format!("CA Secret {ns}/{name} key {key} from {}", self.ca_source)
            }
            None => "CA: system roots".to_owned(),
        };
        format!("hostAPI {host} from {}; {ca}", self.host_source)
    }
}

/// The trusted host of the cloud methods: the host a resource without
/// its own `hostAPI` would use (`kms-config`, else `--default-host-api`,
/// else the built-in default).
pub fn default_host<'a>(global: &'a GlobalConfig, defaults: &'a Defaults) -> &'a str {
    global
        .host_api
        .as_deref()
        .or(defaults.host_api.as_deref())
        .unwrap_or(DEFAULT_HOST_API)
}

/// Choose a resource's host and CA, each field on its own: the resource's
/// `hostAPI` / `tls.caRef`, else the global config's, else the operator's
/// defaults (else the built-in host, or no CA). A CA reference of the
/// resource is subject to the namespace rule.
pub fn choose_endpoint(
    resource_ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    global: &GlobalConfig,
    defaults: &Defaults,
    allow_cross: bool,
) -> Result<Choice, SyncError> {
    let own_host = host_api.map(str::trim).filter(|h| !h.is_empty());
    if own_host.is_none() {
        global.check_available()?;
    }
    let (host, host_source) = match (own_host, &global.host_api, &defaults.host_api) {
        (Some(h), _, _) => (h.to_owned(), Source::Spec),
        (None, Some(h), _) => (h.clone(), global.source()),
        (None, None, Some(h)) => (h.clone(), Source::OperatorDefault("--default-host-api")),
        (None, None, None) => (DEFAULT_HOST_API.to_owned(), Source::BuiltIn),
    };
    let own_ca = tls
        .and_then(|t| t.ca_ref.as_ref())
        .filter(|r| !r.secret_name.trim().is_empty());
    let (ca, ca_source) = match own_ca {
        Some(r) => {
            let ns = namespace_of(
                resource_ns,
                r.secret_namespace.as_deref(),
                "tls.caRef",
                allow_cross,
            )?;
            (
                Some((ns, r.secret_name.clone(), r.key.clone())),
                Source::Spec,
            )
        }
        None => {
            global.check_available()?;
            if let Some(e) = &global.error {
                return Err(SyncError::Spec(e.clone()));
            }
            match (&global.ca_ref, &defaults.ca_ref) {
                (Some(r), _) => (Some(r.clone()), global.source()),
                (None, Some(r)) => (Some(r.clone()), Source::OperatorDefault("--default-ca-ref")),
                (None, None) => (None, Source::Unset),
            }
        }
    };
    Ok(Choice {
        host,
        host_source,
        ca,
        ca_source,
    })
}

/// Parse `--default-ca-ref`: `<namespace>/<name>/<key>`.
pub fn parse_ca_ref(s: &str) -> Result<(String, String, String), String> {
    let parts: Vec<&str> = s.trim().split('/').map(str::trim).collect();
    match parts.as_slice() {
        [ns, name, key] if !ns.is_empty() && !name.is_empty() && !key.is_empty() => {
            Ok(((*ns).to_owned(), (*name).to_owned(), (*key).to_owned()))
        }
        _ => Err(format!(
            "invalid CA reference {s:?}: expected <namespace>/<secret name>/<key>"
        )),
    }
}

/// The endpoint of a [`Choice`]: its host, and its CA read from the Secret
/// it names.
pub async fn resolve_endpoint(
    client: &Client,
    reads: &SecretReads,
    choice: &Choice,
) -> Result<Endpoint, SyncError> {
    let ca_pem = match &choice.ca {
        None => None,
        Some((ns, name, key)) => {
            let from = &choice.ca_source;
            let secret =
                reads
                    .get(client, ns, name)
                    .await?
                    .ok_or_else(|| SyncError::Reference {
                        reason: "CANotFound",
                        message: format!("CA Secret {ns}/{name} (tls.caRef from {from}) not found"),
                    })?;
            let pem = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone())
                .ok_or_else(|| SyncError::Reference {
                    reason: "CANotFound",
                    message: format!(
                        "CA Secret {ns}/{name} (tls.caRef from {from}) has no key {key}"
                    ),
                })?;
            Some(pem)
        }
    };
    Endpoint::new(&choice.host, ca_pem).map_err(SyncError::Kms)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The endpoint of a resource in `app` that names its own host and no CA.
    fn own_host(global: &GlobalConfig, defaults: &Defaults) -> Result<Choice, SyncError> {
        choose_endpoint(
            "app",
            Some("https://own.example"),
            None,
            global,
            defaults,
            false,
        )
    }

    fn secret(ns: &str, name: &str, rv: &str) -> Arc<Secret> {
        let mut s = Secret::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.metadata.resource_version = Some(rv.into());
        Arc::new(s)
    }

    #[test]
    fn a_read_is_shared_only_while_it_is_the_current_version() {
        let reads = SecretReads::default();
        // Not seen by the watch (not watched, or not yet): never kept.
        reads.remember("a", "creds", Some(&secret("a", "creds", "5")));
        assert!(reads.current_copy("a", "creds").is_none());

        reads.seen("a", "creds", Some("5"));
        reads.remember("a", "creds", Some(&secret("a", "creds", "5")));
        let copy = reads.current_copy("a", "creds").expect("shared");
        assert_eq!(copy.metadata.resource_version.as_deref(), Some("5"));

        // Changed: the copy is stale until read again.
        reads.seen("a", "creds", Some("6"));
        assert!(reads.current_copy("a", "creds").is_none());
        // A read that lags behind the watch is not trusted either.
        reads.remember("a", "creds", Some(&secret("a", "creds", "5")));
        assert!(reads.current_copy("a", "creds").is_none());
        reads.remember("a", "creds", Some(&secret("a", "creds", "6")));
        assert!(reads.current_copy("a", "creds").is_some());

        // Deleted: gone, and a read that found nothing drops the copy.
        reads.gone("a", "creds");
        assert!(reads.current_copy("a", "creds").is_none());
        reads.seen("a", "creds", Some("7"));
        reads.remember("a", "creds", None);
        assert!(reads.current_copy("a", "creds").is_none());
    }

    /// A client whose API server answers every request with Secret `a/creds`
    /// at version 5 after 50 ms, and the number of requests it got.
    fn counting_client() -> (Client, Arc<std::sync::atomic::AtomicUsize>) {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = calls.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let body = serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "creds", "namespace": "a", "resourceVersion": "5"}
                }))
                .unwrap();
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    body,
                )))
            }
        });
        (Client::new(service, "default"), calls)
    }

    #[tokio::test]
    async fn readers_that_know_the_same_version_share_one_request() {
        let (client, calls) = counting_client();
        let reads = SecretReads::default();
        // Unknown to the watch: every reader asks.
        let (a, b) = tokio::join!(
            reads.get(&client, "a", "creds"),
            reads.get(&client, "a", "creds")
        );
        assert!(a.unwrap().is_some() && b.unwrap().is_some());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Known at version 5: ten readers at once make one request, and the
        // copy then answers without any.
        reads.seen("a", "creds", Some("5"));
        let all =
            futures::future::join_all((0..10).map(|_| reads.get(&client, "a", "creds"))).await;
        assert!(all.into_iter().all(|r| r.unwrap().is_some()));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
        reads.get(&client, "a", "creds").await.unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[test]
    fn a_relist_forgets_what_it_did_not_list_in_its_own_scope_only() {
        let reads = SecretReads::default();
        for (ns, name, rv) in [("a", "x", "1"), ("a", "y", "2"), ("b", "z", "3")] {
            reads.seen(ns, name, Some(rv));
            reads.remember(ns, name, Some(&secret(ns, name, rv)));
        }
        reads.relist_started(Some("a"));
        // Unchanged, changed while the watch was down; y is gone.
        assert!(!reads.relisted(Some("a"), "a", "x", Some("1")));
        assert!(reads.relisted(Some("a"), "a", "w", Some("9")));
        // Until the re-list is complete, the old versions stand.
        assert!(reads.current_copy("a", "y").is_some());
        reads.relist_done(Some("a"));
        assert!(reads.current_copy("a", "x").is_some());
        assert!(reads.current_copy("a", "y").is_none());
        assert!(lock(&reads.copies).get(&("a".into(), "y".into())).is_none());
        // Another namespace's watch is untouched.
        assert!(reads.current_copy("b", "z").is_some());

        // A cluster-wide re-list replaces everything.
        reads.relist_started(None);
        assert!(reads.relisted(None, "c", "q", Some("4")));
        reads.relist_done(None);
        assert!(reads.current_copy("a", "x").is_none());
        assert!(reads.current_copy("b", "z").is_none());
        assert!(lock(&reads.copies).is_empty());
    }

    #[test]
    fn cross_namespace_references_need_the_flag() {
        assert_eq!(namespace_of("a", None, "f", false).unwrap(), "a");
        assert_eq!(namespace_of("a", Some(""), "f", false).unwrap(), "a");
        assert_eq!(namespace_of("a", Some("a"), "f", false).unwrap(), "a");
        let err = namespace_of("a", Some("b"), "credentialsRef", false).unwrap_err();
        assert!(
            err.to_string()
                .contains("credentialsRef points to namespace b"),
            "{err}"
        );
        assert_eq!(namespace_of("a", Some("b"), "f", true).unwrap(), "b");
    }

    fn config_map(ns: &str, data: serde_json::Value) -> GlobalConfig {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kms-config", "namespace": ns},
            "data": data
        }))
        .unwrap();
        GlobalConfig::from_config_map(&cm)
    }

    fn tls(v: serde_json::Value) -> TlsConfig {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn host_and_ca_fall_back_each_on_its_own() {
        let global = config_map(
            "kms-operator-system",
            serde_json::json!({
                "hostAPI": "https://global.example/api",
                "tls.caRef.secretName": "global-ca",
                "tls.caRef.secretNamespace": "certs",
                "tls.caRef.key": "ca.crt"
            }),
        );
        let from_global = Source::GlobalConfig("kms-operator-system/kms-config".to_owned());
        let none = Defaults::default();
        // Nothing of its own: both from kms-config.
        let c = choose_endpoint("app", None, None, &global, &none, false).unwrap();
        assert_eq!(c.host, "https://global.example/api");
        assert_eq!(c.host_source, from_global);
        assert_eq!(
            c.ca,
            Some(("certs".into(), "global-ca".into(), "ca.crt".into()))
        );
        assert_eq!(c.ca_source, from_global);
        // Its own host, no CA: the global CA still applies (as in the Go operators).
        let c = own_host(&global, &none).unwrap();
        assert_eq!(
            (c.host.as_str(), &c.host_source),
            ("https://own.example", &Source::Spec)
        );
        assert_eq!(c.ca_source, from_global);
        // Its own CA, no host: the global host, its own CA (in its namespace).
        let own_ca = tls(serde_json::json!({"caRef": {"secretName": "mine", "key": "ca.pem"}}));
        let c = choose_endpoint("app", None, Some(&own_ca), &global, &none, false).unwrap();
        assert_eq!(c.host_source, from_global);
        assert_eq!(c.ca, Some(("app".into(), "mine".into(), "ca.pem".into())));
        assert_eq!(c.ca_source, Source::Spec);
        assert_eq!(
            c.describe(),
            "hostAPI https://global.example/api from kms-config (kms-operator-system/kms-config); \
             CA Secret app/mine key ca.pem from spec"
        );
    }

    #[test]
    fn below_kms_config_come_the_operator_defaults_then_the_built_in_host() {
        let defaults = Defaults {
            host_api: Some("https://chart.example/api".into()),
            ca_ref: Some(("ops".into(), "ca".into(), "ca.crt".into())),
        };
        let absent = GlobalConfig::default();
        let c = choose_endpoint("app", None, None, &absent, &defaults, false).unwrap();
        assert_eq!(c.host, "https://chart.example/api");
        assert_eq!(c.host_source, Source::OperatorDefault("--default-host-api"));
        assert_eq!(c.ca_source, Source::OperatorDefault("--default-ca-ref"));
        assert_eq!(
            default_host(&absent, &defaults),
            "https://chart.example/api"
        );
        // kms-config wins field by field: its host, the default CA.
        let global = config_map("cfg", serde_json::json!({"hostAPI": "https://cm.example"}));
        let c = choose_endpoint("app", None, None, &global, &defaults, false).unwrap();
        assert_eq!(c.host_source, Source::GlobalConfig("cfg/kms-config".into()));
        assert_eq!(c.ca_source, Source::OperatorDefault("--default-ca-ref"));
        assert_eq!(default_host(&global, &defaults), "https://cm.example");
        // Nothing anywhere.
        let c = choose_endpoint("app", None, None, &absent, &Defaults::default(), false).unwrap();
        assert_eq!(
            (c.host.as_str(), c.host_source),
            (DEFAULT_HOST_API, Source::BuiltIn)
        );
        assert_eq!((c.ca, c.ca_source), (None, Source::Unset));
        assert_eq!(
            default_host(&absent, &Defaults::default()),
            DEFAULT_HOST_API
        );
    }

    #[test]
    fn a_broken_global_ca_fails_only_resources_that_use_it() {
        let global = config_map(
            "kms-operator-system",
            serde_json::json!({"hostAPI": "https://g.example", "tls.caRef.secretName": "ca"}),
        );
        let none = Defaults::default();
        let err = own_host(&global, &none).unwrap_err();
        assert!(
            err.to_string()
                .contains("ConfigMap kms-operator-system/kms-config: tls.caRef"),
            "{err}"
        );
        let own_ca = tls(serde_json::json!({"caRef": {"secretName": "mine", "key": "ca.crt"}}));
        assert!(choose_endpoint("app", None, Some(&own_ca), &global, &none, false).is_ok());
        // A CA of its own in another namespace needs the flag.
        let other = tls(
            serde_json::json!({"caRef": {"secretName": "c", "secretNamespace": "x", "key": "k"}}),
        );
        assert!(choose_endpoint("app", None, Some(&other), &global, &none, false).is_err());
    }

    #[test]
    fn an_unread_global_config_holds_back_only_what_falls_back_to_it() {
        let pending = GlobalConfig::pending("kms-operator-system");
        let none = Defaults::default();
        let err = choose_endpoint("app", None, None, &pending, &none, false).unwrap_err();
        assert!(
            err.to_string()
                .contains("kms-operator-system/kms-config could not be read yet"),
            "{err}"
        );
        // Its own host, but the CA would come from kms-config.
        assert!(choose_endpoint("app", Some("https://own"), None, &pending, &none, false).is_err());
        let own_ca = tls(serde_json::json!({"caRef": {"secretName": "mine", "key": "ca.crt"}}));
        let c = choose_endpoint(
            "app",
            Some("https://own"),
            Some(&own_ca),
            &pending,
            &none,
            false,
        )
        .unwrap();
        assert_eq!((c.host_source, c.ca_source), (Source::Spec, Source::Spec));
    }

    #[test]
    fn user_info_in_a_host_never_reaches_the_status() {
        let c = choose_endpoint(
            "app",
            Some("https://user:pa55@kms.example/api"),
            None,
            &GlobalConfig::default(),
            &Defaults::default(),
            false,
        )
        .unwrap();
        assert!(!c.describe().contains("pa55"), "{}", c.describe());
    }

    #[test]
    fn ca_references_of_the_flag_parse() {
        assert_eq!(
            parse_ca_ref("certs/kms-ca/ca.crt").unwrap(),
            ("certs".into(), "kms-ca".into(), "ca.crt".into())
        );
        for bad in ["", "a/b", "a//c", "a/b/c/d"] {
            assert!(parse_ca_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn global_config_parsing() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kms-config"},
            "data": {"hostAPI": "https://kms.example.com/api", "tls.caRef.secretName": "ca"}
        }))
        .unwrap();
        let g = GlobalConfig::from_config_map(&cm);
        assert_eq!(g.host_api.as_deref(), Some("https://kms.example.com/api"));
        assert!(g.error.unwrap().contains("must be set together"));
    }
}
