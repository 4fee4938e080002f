//! The workload: N custom resources over N/10 namespaces (ten per
//! namespace, `s0`…`s9`, each writing the Secret `out-<i>`), all ten of a
//! namespace reading the namespace's KMS folder with the namespace's own
//! identity; and the tracker that watches the resources and the managed
//! Secrets to tell when everything is Ready and when a changed value has
//! reached a Secret.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::cluster;
use crate::kms::{self, ENV, PROJECT};

/// Resources per namespace.
pub const PER_NAMESPACE: usize = 10;
/// The namespaces of newcomers (`fresh-NN`): one resource each, created
/// while the workload converges; not counted in it.
pub const NEWCOMER_PREFIX: &str = "fresh-";
/// The key whose changes are followed.
pub const KEY: &str = "K0";

/// The custom resource the operator watches.
#[derive(Clone, Debug)]
pub struct Crd {
    /// API group.
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural.
    pub plural: String,
    /// Condition type that must be `True`; empty: the Secret alone counts.
    pub ready_condition: String,
}

impl Crd {
    /// The API resource.
    pub fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&self.group, &self.version, &self.kind),
            &self.plural,
        )
    }

    /// The CRD's object name (`<plural>.<group>`).
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

/// How the resources sync.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SyncMode {
    /// `syncConfig.resyncInterval`; `None` leaves the operator's default.
    pub resync: Option<String>,
    /// `syncConfig.instantUpdates`.
    pub instant: bool,
}

/// The namespaces of a workload of `n` resources.
pub fn namespaces(n: usize) -> Vec<String> {
    (0..n.div_ceil(PER_NAMESPACE))
        .map(|i| format!("bench-{i:05}"))
        .collect()
}

/// The namespaces of `k` newcomers.
pub fn newcomer_namespaces(k: usize) -> Vec<String> {
    (0..k).map(|i| format!("{NEWCOMER_PREFIX}{i:02}")).collect()
}

/// The credentials Secret of namespace `ns` (its identity's).
fn credentials(ns: &str) -> anyhow::Result<Secret> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "kms-credentials"},
        "stringData": {"clientId": kms::client_id(ns), "clientSecret": kms::client_secret(ns)}
    }))?)
}

/// Create a newcomer: namespace `ns`, its credentials and one resource
/// `s0`; the moment the resource was created.
pub async fn create_newcomer(
    client: &Client,
    crd: &Crd,
    ns: &str,
    api: &str,
    sync: &SyncMode,
) -> anyhow::Result<Instant> {
    cluster::create_namespace(client, ns).await?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &credentials(ns)?)
        .await?;
    let name = resource_name(0);
    let obj: DynamicObject = serde_json::from_value(resource_body(crd, ns, &name, api, sync))?;
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &crd.resource())
        .create(&PostParams::default(), &obj)
        .await?;
    Ok(Instant::now())
}

/// Resource `i` of its namespace.
pub fn resource_name(i: usize) -> String {
    format!("s{i}")
}

/// The Secret resource `s<i>` writes.
pub fn secret_of(resource: &str) -> String {
    format!("out-{}", resource.trim_start_matches('s'))
}

/// The body of resource `name` in `ns`.
pub fn resource_body(
    crd: &Crd,
    ns: &str,
    name: &str,
    api: &str,
    sync: &SyncMode,
) -> serde_json::Value {
    let mut sync_config = json!({"instantUpdates": sync.instant});
    if let Some(r) = &sync.resync {
        sync_config["resyncInterval"] = json!(r);
    }
    json!({
        "apiVersion": format!("{}/{}", crd.group, crd.version),
        "kind": crd.kind,
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "hostAPI": api,
            "syncConfig": sync_config,
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "kms-credentials", "secretNamespace": ns},
                "secretsScope": {"projectSlug": PROJECT, "envSlug": ENV, "secretsPath": kms::folder(ns)}
            }},
            "managedKubeSecretReferences": [{
                "secretName": secret_of(name), "secretNamespace": ns, "creationPolicy": "Owner"
            }]
        }
    })
}

async fn create_ignoring_conflict<F>(f: F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = Result<(), kube::Error>>,
{
    match f.await {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Create the namespaces, their credentials and `n` resources.
pub async fn create(
    client: &Client,
    crd: &Crd,
    n: usize,
    api: &str,
    sync: &SyncMode,
) -> anyhow::Result<()> {
    let ar = crd.resource();
    let nss = namespaces(n);
    futures::stream::iter(nss.iter().map(|ns| cluster::create_namespace(client, ns)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let mut jobs = Vec::new();
    for (idx, ns) in nss.iter().enumerate() {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let creds = credentials(ns)?;
        jobs.push(futures::future::Either::Left(async move {
            create_ignoring_conflict(async {
                secrets
                    .create(&PostParams::default(), &creds)
                    .await
                    .map(drop)
            })
            .await
        }));
        let here = (n - idx * PER_NAMESPACE).min(PER_NAMESPACE);
        for i in 0..here {
            let name = resource_name(i);
            let obj: DynamicObject =
                serde_json::from_value(resource_body(crd, ns, &name, api, sync))?;
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            jobs.push(futures::future::Either::Right(async move {
                create_ignoring_conflict(async {
                    api.create(&PostParams::default(), &obj).await.map(drop)
                })
                .await
            }));
        }
    }
    futures::stream::iter(jobs)
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

type Key = (String, String);

#[derive(Default)]
struct State {
    /// Resources whose ready condition is True (newcomers aside).
    ready: HashSet<Key>,
    /// When each newcomer was first seen ready.
    newcomers_ready: HashMap<Key, Instant>,
    /// Managed Secrets present (by namespace and Secret name).
    secrets: HashSet<Key>,
    /// Every value of `KEY` each Secret showed, with when it was first seen.
    seen: HashMap<Key, Vec<(String, Instant)>>,
    /// Whether the Secret watch has listed every Secret.
    secrets_listed: bool,
}

/// Watches the resources and the managed Secrets.
pub struct Tracker {
    state: Arc<Mutex<State>>,
    tasks: Vec<JoinHandle<()>>,
    crd: Crd,
    client: Client,
    secrets_watched: bool,
}

fn is_ready(obj: &DynamicObject, condition: &str) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == condition && c["status"] == "True")
        })
}

fn key_of(meta: &kube::core::ObjectMeta) -> Option<Key> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

impl Tracker {
    /// Start watching (every namespace).
    pub fn start(client: &Client, crd: &Crd) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let mut tasks = Vec::new();
        if !crd.ready_condition.is_empty() {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &crd.resource());
            let st = state.clone();
            let cond = crd.ready_condition.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = watcher(api, watcher::Config::default().any_semantic()).boxed();
                while let Some(ev) = s.next().await {
                    let Ok(ev) = ev else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
                    match ev {
                        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                            if let Some(k) = key_of(&o.metadata) {
                                let ready = is_ready(&o, &cond);
                                if k.0.starts_with(NEWCOMER_PREFIX) {
                                    if ready {
                                        st.newcomers_ready.entry(k).or_insert_with(Instant::now);
                                    }
                                } else if ready {
                                    st.ready.insert(k);
                                } else {
                                    st.ready.remove(&k);
                                }
                            }
                        }
                        watcher::Event::Delete(o) => {
                            if let Some(k) = key_of(&o.metadata) {
                                st.ready.remove(&k);
                            }
                        }
                        watcher::Event::Init | watcher::Event::InitDone => {}
                    }
                }
            }));
        }
        let mut tracker = Self {
            state,
            tasks,
            crd: crd.clone(),
            client: client.clone(),
            secrets_watched: false,
        };
        // Without a ready condition, the Secrets are what converges.
        if crd.ready_condition.is_empty() {
            tracker.watch_secrets();
        }
        tracker
    }

    /// Start watching the managed Secrets (every namespace), if not yet.
    /// A converge does not watch them while it is timed (they are written
    /// before their resource's status says Ready, and a watch of every
    /// Secret costs the API server as much as an operator's own watches);
    /// it lists them when every resource is ready ([`Tracker::wait_secrets_listed`]),
    /// and the scenarios after it watch them.
    pub fn watch_secrets(&mut self) {
        if self.secrets_watched {
            return;
        }
        self.secrets_watched = true;
        let api: Api<Secret> = Api::all(self.client.clone());
        let st = self.state.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut s = watcher(api, watcher::Config::default().any_semantic()).boxed();
            while let Some(ev) = s.next().await {
                let Ok(ev) = ev else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let now = Instant::now();
                let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
                match ev {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                        let Some(k) = key_of(&o.metadata) else {
                            continue;
                        };
                        if !k.1.starts_with("out-") {
                            continue;
                        }
                        let value = o
                            .data
                            .as_ref()
                            .and_then(|d| d.get(KEY))
                            .map(|v| String::from_utf8_lossy(&v.0).into_owned());
                        st.secrets.insert(k.clone());
                        if let Some(v) = value {
                            let seen = st.seen.entry(k).or_default();
                            if !seen.iter().any(|(x, _)| *x == v) {
                                seen.push((v, now));
                            }
                        }
                    }
                    watcher::Event::Delete(o) => {
                        if let Some(k) = key_of(&o.metadata) {
                            st.secrets.remove(&k);
                        }
                    }
                    watcher::Event::InitDone => st.secrets_listed = true,
                    watcher::Event::Init => {}
                }
            }
        }));
    }

    /// Wait until the Secret watch has listed every Secret (`false` after
    /// `timeout`).
    pub async fn wait_secrets_listed(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .secrets_listed
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Resources that are done: ready (when a condition is asked for) and
    /// with their Secret present (ready only, until the Secrets are
    /// watched).
    pub fn converged(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.crd.ready_condition.is_empty() {
            return st
                .secrets
                .iter()
                .filter(|(ns, _)| !ns.starts_with(NEWCOMER_PREFIX))
                .count();
        }
        if !self.secrets_watched {
            // Ready only; the Secrets are checked once listed.
            return st.ready.len();
        }
        st.ready
            .iter()
            .filter(|(ns, name)| st.secrets.contains(&(ns.clone(), secret_of(name))))
            .count()
    }

    /// When newcomer `name` in `ns` was first seen ready.
    pub fn newcomer_ready(&self, ns: &str, name: &str) -> Option<Instant> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.newcomers_ready
            .get(&(ns.to_owned(), name.to_owned()))
            .copied()
    }

    /// When Secret `name` in `ns` first showed `value` under `KEY`.
    pub fn first_seen(&self, ns: &str, name: &str, value: &str) -> Option<Instant> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.seen
            .get(&(ns.to_owned(), name.to_owned()))?
            .iter()
            .find(|(v, _)| v == value)
            .map(|(_, t)| *t)
    }

    /// Wait until `n` resources are done or `timeout` passes; the time it
    /// took from `since`, `None` on timeout.
    pub async fn wait_converged(
        &self,
        n: usize,
        since: Instant,
        timeout: Duration,
        mut progress: impl FnMut(usize),
    ) -> Option<Duration> {
        let mut last_report = Instant::now();
        loop {
            let done = self.converged();
            if done >= n {
                return Some(since.elapsed());
            }
            if since.elapsed() > timeout {
                return None;
            }
            if last_report.elapsed() > Duration::from_secs(10) {
                progress(done);
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Crd {
        Crd {
            group: "secrets.hanzo.ai".into(),
            version: "v1alpha1".into(),
            kind: "KmsSecret".into(),
            plural: "kmssecrets".into(),
            ready_condition: "Ready".into(),
        }
    }

    #[test]
    fn names_and_bodies() {
        assert_eq!(namespaces(1000).len(), 100);
        assert_eq!(namespaces(15).len(), 2);
        assert_eq!(namespaces(10)[0], "bench-00000");
        assert_eq!(secret_of("s7"), "out-7");
        let b = resource_body(
            &crd(),
            "bench-00001",
            "s3",
            "http://x/api",
            &SyncMode {
                resync: Some("10s".into()),
                instant: true,
            },
        );
        assert_eq!(b["apiVersion"], "secrets.hanzo.ai/v1alpha1");
        assert_eq!(b["spec"]["syncConfig"]["resyncInterval"], "10s");
        assert_eq!(b["spec"]["syncConfig"]["instantUpdates"], true);
        assert_eq!(
            b["spec"]["authentication"]["universalAuth"]["secretsScope"]["secretsPath"],
            "/apps/bench-00001"
        );
        assert_eq!(
            b["spec"]["managedKubeSecretReferences"][0]["secretName"],
            "out-3"
        );
        assert_eq!(crd().crd_name(), "kmssecrets.secrets.hanzo.ai");
    }
}
