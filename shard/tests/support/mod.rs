//! Shared set-up for the tests against a real API server: the control plane
//! (from `KUBECONFIG`, or one started under `target/shard-testenv` by
//! `tests/testenv/testenv`), clients, per-test namespaces, and monitors that
//! check ownership stays exclusive.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use shard::{Config, Coordinator};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The workspace root.
fn workspace() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.parent().unwrap_or(crate_dir).to_path_buf()
}

fn kubeconfig_path() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let root = workspace();
    let dir = root.join("target").join("shard-testenv");
    // A first start on a fresh directory has been seen to report a component
    // as exited while it was coming up; a second `up` resumes it.
    let mut failure = String::new();
    for _ in 0..2 {
        let out = Command::new(root.join("tests/testenv/testenv"))
            .arg("up")
            .arg(&dir)
            .output()
            .map_err(|e| format!("running tests/testenv/testenv: {e}"))?;
        if out.status.success() {
            return Ok(dir.join("kubeconfig"));
        }
        failure = String::from_utf8_lossy(&out.stderr).into_owned();
    }
    Err(format!("tests/testenv/testenv up failed: {failure}"))
}

fn setup() -> &'static Result<PathBuf, String> {
    static SETUP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SETUP.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
        kubeconfig_path()
    })
}

/// A client on the calling test's runtime.
pub async fn client() -> Client {
    Client::try_from(kube_config().await).expect("kube client")
}

/// A fresh namespace for one test (left behind: nothing in it matters once
/// the test ends).
pub async fn namespace(client: &Client, prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "{prefix}-{}-{n}-{:x}",
        std::process::id() % 10_000,
        nanos % 0xffff
    );
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(
                "shard-tests".to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// Short durations for tests: Lease 3 s, renew deadline 2 s, retry 1 s.
pub fn config(namespace: &str, identity: &str, shards: u32) -> Config {
    Config {
        shards,
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(5),
        ..Config::new(namespace, "kms-test", identity)
    }
}

/// Poll `check` every 20 ms until it holds or `limit` passes.
pub async fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Who owns each shard, by `owns()`.
pub fn owners(coordinators: &[Coordinator], shards: u32) -> BTreeMap<u32, Vec<String>> {
    (0..shards)
        .map(|s| {
            let who = coordinators
                .iter()
                .filter(|c| c.owns(s))
                .map(|c| c.config().identity.clone())
                .collect();
            (s, who)
        })
        .collect()
}

/// Shards owned by one coordinator.
pub fn owned(c: &Coordinator) -> Vec<u32> {
    (0..c.shard_count()).filter(|&s| c.owns(s)).collect()
}

/// Every shard owned by exactly one coordinator, each owning ⌊S/R⌋ or ⌈S/R⌉.
pub fn balanced(coordinators: &[Coordinator], shards: u32) -> bool {
    let r = coordinators.len() as u32;
    let exclusive = owners(coordinators, shards).values().all(|w| w.len() == 1);
    exclusive
        && coordinators.iter().all(|c| {
            let n = owned(c).len() as u32;
            n >= shards / r && n <= shards.div_ceil(r)
        })
}

/// One observed change of a shard Lease.
#[derive(Debug, Clone)]
pub struct Change {
    pub at: Instant,
    pub name: String,
    pub resource_version: String,
    pub holder: Option<String>,
}

/// Watches a test: samples `owns()` of every coordinator in the list (which
/// the test may change) and records every shard Lease change.
pub struct Monitor {
    pub coordinators: Arc<Mutex<Vec<Coordinator>>>,
    stop: CancellationToken,
    sampler: JoinHandle<Vec<String>>,
    history: JoinHandle<Vec<Change>>,
}

impl Monitor {
    pub fn start(client: &Client, namespace: &str, shards: u32) -> Self {
        let coordinators: Arc<Mutex<Vec<Coordinator>>> = Arc::default();
        let stop = CancellationToken::new();

        let list = coordinators.clone();
        let halt = stop.clone();
        let sampler = tokio::spawn(async move {
            let mut violations = Vec::new();
            while !halt.is_cancelled() {
                let cs: Vec<Coordinator> = list.lock().map(|l| l.clone()).unwrap_or_default();
                for s in 0..shards {
                    // Read forwards, then backwards: the first reader's two
                    // reads bracket the others'.
                    let first: Vec<bool> = cs.iter().map(|c| c.owns(s)).collect();
                    let second: Vec<bool> = cs.iter().rev().map(|c| c.owns(s)).collect();
                    let n = cs.len();
                    for i in 0..n {
                        if !(first[i] && second[n - 1 - i]) {
                            continue;
                        }
                        for j in i + 1..n {
                            if first[j] || second[n - 1 - j] {
                                violations.push(format!(
                                    "shard {s} owned by {} and {} at once",
                                    cs[i].config().identity,
                                    cs[j].config().identity
                                ));
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            violations
        });

        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let halt = stop.clone();
        let history = tokio::spawn(async move {
            let mut changes: Vec<Change> = Vec::new();
            let stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = halt.cancelled() => break,
                    item = stream.next() => match item {
                        Some(Ok(lease)) => {
                            let name = lease.metadata.name.clone().unwrap_or_default();
                            if !name.contains("-shard-") {
                                continue;
                            }
                            let resource_version =
                                lease.metadata.resource_version.clone().unwrap_or_default();
                            let holder = shard::lease::holder(&lease).map(str::to_owned);
                            if changes.iter().any(|c| c.name == name && c.resource_version == resource_version) {
                                continue;
                            }
                            changes.push(Change { at: Instant::now(), name, resource_version, holder });
                        }
                        Some(Err(_)) => {}
                        None => break,
                    }
                }
            }
            changes
        });

        Self {
            coordinators,
            stop,
            sampler,
            history,
        }
    }

    pub fn add(&self, c: &Coordinator) {
        if let Ok(mut l) = self.coordinators.lock() {
            l.push(c.clone());
        }
    }

    pub fn list(&self) -> Vec<Coordinator> {
        self.coordinators
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Stop monitoring and assert: no shard was owned twice at once, and a
    /// Lease only went straight from one holder to another after it had been
    /// left unchanged for (about) the Lease duration.
    pub async fn finish(self, lease_duration: Duration) -> Vec<Change> {
        self.stop.cancel();
        let violations = self.sampler.await.expect("sampler");
        let changes = self.history.await.expect("history");
        assert!(
            violations.is_empty(),
            "ownership not exclusive: {violations:#?}"
        );
        let mut last: BTreeMap<&str, &Change> = BTreeMap::new();
        for c in &changes {
            if let Some(prev) = last.get(c.name.as_str())
                && let (Some(a), Some(b)) = (&prev.holder, &c.holder)
                && a != b
            {
                let quiet = c.at.duration_since(prev.at);
                assert!(
                    quiet + Duration::from_millis(500) >= lease_duration,
                    "{}: {a} -> {b} after only {quiet:?} without a change",
                    c.name
                );
            }
            last.insert(c.name.as_str(), c);
        }
        changes
    }
}

/// A TCP relay to the API server that can be paused, so that one
/// coordinator's requests hang as if its process were stopped (SIGSTOP)
/// while the others carry on, or slowed, so that every request reaches the
/// API server late (its answers and watch events are not held).
pub struct StallProxy {
    paused: tokio::sync::watch::Sender<bool>,
    delay: tokio::sync::watch::Sender<Duration>,
    port: u16,
    task: JoinHandle<()>,
}

impl StallProxy {
    /// Start relaying to the control plane's API server.
    pub async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = kube_config().await.cluster_url;
        let upstream = format!(
            "{}:{}",
            upstream.host().unwrap_or("127.0.0.1"),
            upstream.port_u16().unwrap_or(443)
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (paused, watch_paused) = tokio::sync::watch::channel(false);
        let (delay, watch_delay) = tokio::sync::watch::channel(Duration::ZERO);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                for (upward, mut from, mut to) in [(true, ri, wo), (false, ro, wi)] {
                    let mut gate = watch_paused.clone();
                    let delay = watch_delay.clone();
                    // A delay line: each chunk leaves `delay` after it came,
                    // in order, so a slowed request is late by the delay
                    // and not by the delay times its chunks.
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
                    tokio::spawn(async move {
                        while let Some((came, chunk)) = rx.recv().await {
                            if upward {
                                let wait = *delay.borrow();
                                tokio::time::sleep_until(came + wait).await;
                            }
                            if gate.wait_for(|p| !*p).await.is_err() {
                                break;
                            }
                            if to.write_all(&chunk).await.is_err() {
                                break;
                            }
                        }
                    });
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Self {
            paused,
            delay,
            port,
            task,
        }
    }

    /// Hold (or resume) all traffic.
    pub fn pause(&self, on: bool) {
        self.paused.send_replace(on);
    }

    /// Make every request reach the API server `by` late (zero: on time).
    pub fn slow(&self, by: Duration) {
        self.delay.send_replace(by);
    }

    /// A client that talks through the relay.
    pub async fn client(&self) -> Client {
        let mut config = kube_config().await;
        config.cluster_url = format!("https://127.0.0.1:{}", self.port)
            .parse()
            .expect("proxy url");
        Client::try_from(config).expect("kube client")
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn kube_config() -> kube::Config {
    let path = match setup() {
        Ok(p) => p.clone(),
        Err(e) => panic!("control plane not available: {e}"),
    };
    let kubeconfig = Kubeconfig::read_from(&path).expect("read kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config")
}
