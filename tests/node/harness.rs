//! What the node scenarios share: the node's kubeconfig (`KUBECONFIG` of a
//! `tests/testenv/testenv up DIR --node`), kubectl and helm from the test
//! environment's cache, the dev KMS running as a pod, the chart installed
//! as users install it, and waits on conditions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kms_testkit::api;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, Config};
use serde_json::{Value, json};

/// The namespace of the chart's releases.
pub const RELEASE_NS: &str = "kms-system";
/// The namespace of the dev KMS.
pub const KMS_NS: &str = "kms-dev";
/// The dev KMS's admin token.
pub const ADMIN_TOKEN: &str = "node-admin-token";
/// The universal-auth identity seeded for the operator.
pub const CLIENT_ID: &str = "op-client";
/// Its secret.
pub const CLIENT_SECRET: &str = "op-secret";

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The node's kubeconfig: `KUBECONFIG`, which must name a testenv with a
/// node (the suite refuses to run elsewhere).
pub fn kubeconfig() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::var_os("KUBECONFIG")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .expect("the node suite needs KUBECONFIG of `tests/testenv/testenv up DIR --node`");
        let state = path.with_file_name("state.json");
        let text = std::fs::read_to_string(&state).unwrap_or_default();
        assert!(
            text.contains("\"node\": true"),
            "{} is not a testenv with a node (see docs/testing.md)",
            path.display()
        );
        path
    })
    .clone()
}

/// A client of the node's control plane.
pub async fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig()).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    // The scenarios assert on 429s (a refused eviction); the client's own
    // retries would turn one into minutes of waiting.
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

/// The release under test (`KMS_RELEASE_VERSION`, default the workspace
/// version) and the one before it (`KMS_RELEASE_PREVIOUS`, default the same
/// build labelled `<version>-rc.1`), both built by `scripts/release.sh` into
/// `KMS_RELEASE_DIR/<version>/` and pushed to the node's registry.
pub fn release_version() -> String {
    std::env::var("KMS_RELEASE_VERSION").unwrap_or_else(|_| env!("CARGO_PKG_VERSION").to_owned())
}

/// See [`release_version`].
pub fn previous_version() -> String {
    std::env::var("KMS_RELEASE_PREVIOUS").unwrap_or_else(|_| format!("{}-rc.1", release_version()))
}

/// The directory `scripts/release.sh` wrote `version` into.
pub fn release_dir(version: &str) -> PathBuf {
    let root = std::env::var_os("KMS_RELEASE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("dist"));
    root.join(version)
}

/// The digest of the image of a release (its OCI layout's one manifest).
pub fn release_digest(version: &str) -> String {
    let index: Value = serde_json::from_slice(
        &std::fs::read(release_dir(version).join("image/index.json"))
            .unwrap_or_else(|e| panic!("the release {version} (scripts/release.sh): {e}")),
    )
    .expect("index.json");
    index["manifests"][0]["digest"]
        .as_str()
        .expect("a digest")
        .to_owned()
}

/// The node's image registry (`127.0.0.1:PORT`, plain HTTP), where the
/// releases are pushed and containerd pulls from.
pub fn registry() -> String {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        let dir = kubeconfig().parent().unwrap().to_path_buf();
        let out = Command::new(repo().join("tests/testenv/testenv"))
            .arg("registry")
            .arg(&dir)
            .output()
            .expect("tests/testenv/testenv registry");
        assert!(
            out.status.success(),
            "no registry: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    })
    .clone()
}

/// The operator image of a release, as the node pulls it.
pub fn operator_image(version: &str) -> String {
    format!("{}/kms-operator:{version}", registry())
}

fn testenv_path(name: &str) -> PathBuf {
    let out = Command::new(repo().join("tests/testenv/testenv"))
        .args(["path", name])
        .output()
        .expect("tests/testenv/testenv path");
    assert!(
        out.status.success(),
        "testenv path {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn tool(name: &'static str) -> &'static Path {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    let cell = if name == "kubectl" { &KUBECTL } else { &HELM };
    cell.get_or_init(|| testenv_path(name))
}

/// Run kubectl or helm against the node; `Ok(stdout)` or `Err(stderr)`.
pub fn run(name: &'static str, args: &[&str]) -> Result<String, String> {
    let home = repo().join("target/node-helm-home");
    let out = Command::new(tool(name))
        .args(args)
        .env("KUBECONFIG", kubeconfig())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{name} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// [`run`] that must succeed.
pub fn ok(name: &'static str, args: &[&str]) -> String {
    run(name, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Poll `check` every 250 ms until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    kms_testkit::wait::until(Duration::from_millis(250), timeout, check).await
}

/// Check that `check` holds throughout `window` (polled every 250 ms and
/// once more at the end), failing at the first poll that breaks it; the
/// error says when ("3.2 s into the 10.0 s window").
pub async fn holds_for<F, Fut>(window: Duration, check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    kms_testkit::wait::throughout(Duration::from_millis(250), window, check).await
}

/// Create a namespace (if missing).
pub async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await.unwrap().is_none() {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        api.create(&PostParams::default(), &ns).await.unwrap();
    }
}

/// Apply a manifest (YAML or JSON) with kubectl, server-side.
pub fn apply(manifest: &str) {
    let dir = std::env::temp_dir().join(format!("kms-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A name of its own per call: two calls in the same instant never write
    // one file.
    static APPLIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = APPLIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("m-{n}.yaml"));
    std::fs::write(&path, manifest).unwrap();
    ok(
        "kubectl",
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            path.to_str().unwrap(),
        ],
    );
    let _ = std::fs::remove_file(path);
}

// ----- the dev KMS as a pod --------------------------------------------------

/// The dev KMS running in the cluster: its in-cluster URL and how the test
/// (on the node's host) reaches it.
pub struct Kms {
    /// `http://<service ClusterIP>` (the host reaches it through kube-proxy).
    pub url: String,
    http: reqwest::Client,
}

/// The seed: project `demo` (environment `dev`) with `secrets` at `/`, and
/// the operator's identity.
pub fn seed(secrets: &[(&str, &str)]) -> String {
    let mut s = String::from(
        "projects:\n  - slug: demo\n    environments: [dev]\n    secrets:\n      dev:\n        /:\n",
    );
    for (k, v) in secrets {
        s.push_str(&format!(
            "          {k}: {}\n",
            serde_json::to_string(v).unwrap()
        ));
    }
    s.push_str(&format!(
        "identities:\n  - name: operator\n    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}, accessTokenTTL: 3600, accessTokenMaxTTL: 86400}}\n    projects: [demo]\n"
    ));
    s
}

/// The in-cluster address of the dev KMS API, as the chart's `hostAPI`.
pub fn kms_host_api() -> String {
    format!("http://kms.{KMS_NS}.svc.cluster.local/api")
}

impl Kms {
    /// Deploy the dev KMS (the operator image's `dev-server`) with `seed`,
    /// keeping a running one with the same seed (and its state), and wait
    /// until it answers.
    pub async fn deploy(client: &Client, seed: &str) -> Kms {
        Self::deploy_with(client, seed, "").await
    }

    /// [`Kms::deploy`], always starting a new server (fresh state).
    pub async fn deploy_fresh(client: &Client, seed: &str) -> Kms {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Self::deploy_with(client, seed, &now.to_string()).await
    }

    async fn deploy_with(client: &Client, seed: &str, generation: &str) -> Kms {
        namespace(client, KMS_NS).await;
        let indented: String = seed.lines().map(|l| format!("    {l}\n")).collect();
        apply(&format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: kms-seed, namespace: {KMS_NS}}}
data:
  seed.yaml: |
{indented}---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: kms, namespace: {KMS_NS}}}
spec:
  replicas: 1
  strategy: {{type: Recreate}}
  selector: {{matchLabels: {{app: kms}}}}
  template:
    metadata:
      labels: {{app: kms}}
      annotations: {{seed: "{hash}", generation: "{generation}"}}
    spec:
      containers:
      - name: kms
        image: localhost/kms-operator:dev
        imagePullPolicy: Never
        args: [dev-server, --addr, "0.0.0.0:8080", --seed, /seed/seed.yaml, --admin-token, {ADMIN_TOKEN}, --min-lease-ttl, 1s]
        ports: [{{containerPort: 8080, name: http}}]
        readinessProbe: {{httpGet: {{path: /api/status, port: 8080}}, periodSeconds: 1}}
        volumeMounts: [{{name: seed, mountPath: /seed}}]
      volumes: [{{name: seed, configMap: {{name: kms-seed}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: kms, namespace: {KMS_NS}}}
spec:
  selector: {{app: kms}}
  ports: [{{port: 80, targetPort: 8080, name: http}}]
"#,
            hash = seed.len() ^ seed.bytes().map(usize::from).sum::<usize>()
        ));
        ok(
            "kubectl",
            &[
                "-n",
                KMS_NS,
                "rollout",
                "status",
                "deployment/kms",
                "--timeout=120s",
            ],
        );
        let svc: Service = Api::namespaced(client.clone(), KMS_NS)
            .get("kms")
            .await
            .unwrap();
        let ip = svc.spec.and_then(|s| s.cluster_ip).expect("ClusterIP");
        let kms = Kms {
            url: format!("http://{ip}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        wait_for(Duration::from_secs(60), || async {
            let r = kms
                .http
                .get(format!("{}/api/status", kms.url))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await
        .expect("the dev KMS does not answer through its Service");
        kms
    }

    /// A handle on a dev KMS already deployed at `url`.
    pub fn at(url: &str) -> Kms {
        Kms {
            url: url.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method, format!("{}/admin/{path}", self.url))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("admin request");
        assert!(
            resp.status().is_success(),
            "admin {path}: {}",
            resp.status()
        );
        resp.json().await.unwrap_or(Value::Null)
    }

    /// Requests to `route` (any status).
    pub async fn count(&self, route: &str) -> u64 {
        let stats = self.admin(reqwest::Method::GET, "stats", None).await;
        stats["requests"][route]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0)
    }

    /// Put a fault in force (the dev server's admin API, e.g.
    /// `{"outage": true}` for every route).
    pub async fn fault(&self, spec: Value) {
        self.admin(reqwest::Method::POST, "faults", Some(spec))
            .await;
    }

    /// Clear every fault.
    pub async fn clear_faults(&self) {
        self.admin(reqwest::Method::DELETE, "faults", None).await;
    }

    /// Set a secret of `demo`/`dev`/`/` through the API.
    pub async fn set_secret(&self, key: &str, value: &str) {
        let api = format!("{}/api", self.url);
        let token = api::login(&self.http, &api, CLIENT_ID, CLIENT_SECRET)
            .await
            .expect("login");
        api::set_secret(&self.http, &api, &token, DEMO, key, value)
            .await
            .expect("set secret");
    }
}

/// The folder the scenarios' KmsSecrets read.
const DEMO: api::Folder<'static> = api::Folder {
    project: "demo",
    environment: "dev",
    path: "/",
};

// ----- the chart ---------------------------------------------------------------

/// `helm install` (or upgrade) of the chart in this tree as release
/// `name` in [`RELEASE_NS`], with the operator image of release `version`
/// (pulled from the node's registry) and `extra` values (`--set` pairs);
/// waits until every pod is Ready (the chart's probes). Returns how long
/// the pods took to be Ready.
pub fn install(name: &str, version: &str, extra: &[&str]) -> Duration {
    let chart = repo().join("helm/secrets-operator");
    install_chart(name, chart.to_str().unwrap(), version, extra)
}

/// [`install`] of `chart` (a directory, `oci://…` or `repo/chart`, with
/// `--version` among `extra_args` when it needs one).
pub fn install_chart(name: &str, chart: &str, version: &str, extra: &[&str]) -> Duration {
    let started = Instant::now();
    let mut args: Vec<String> = vec![
        "upgrade".into(),
        "--install".into(),
        name.into(),
        chart.into(),
        "-n".into(),
        RELEASE_NS.into(),
        "--create-namespace".into(),
        "--wait".into(),
        "--timeout".into(),
        "180s".into(),
        "--set".into(),
        format!(
            "controllerManager.manager.image.repository={}/kms-operator",
            registry()
        ),
        "--set".into(),
        format!("controllerManager.manager.image.tag={version}"),
        "--set".into(),
        format!("hostAPI={}", kms_host_api()),
    ];
    if chart.starts_with("oci://") {
        args.extend(["--plain-http".into(), "--version".into(), version.into()]);
    } else if !chart.starts_with('/') {
        args.extend(["--version".into(), version.into()]);
    }
    for e in extra {
        args.push("--set".into());
        args.push((*e).to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok("helm", &args);
    started.elapsed()
}

/// Uninstall a release (no error when it is not installed).
pub fn uninstall(name: &str) {
    let _ = run(
        "helm",
        &[
            "uninstall",
            name,
            "-n",
            RELEASE_NS,
            "--wait",
            "--timeout",
            "120s",
        ],
    );
}

/// The operator pods of a release, by name (not its `helm test` Pod, which
/// stays after it ran).
pub async fn pods(client: &Client, release: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NS);
    let lp = ListParams::default().labels(&format!(
        "app.kubernetes.io/instance={release},control-plane=controller-manager"
    ));
    let mut pods = api.list(&lp).await.unwrap().items;
    pods.sort_by_key(|p| p.metadata.name.clone());
    pods
}

/// Whether a pod is Ready.
pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Wait until `n` pods of the release are Ready; how long it took.
pub async fn wait_ready_pods(
    client: &Client,
    release: &str,
    n: usize,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    wait_for(timeout, || async {
        let ps = pods(client, release).await;
        (ps.len() == n
            && ps.iter().all(ready)
            && ps.iter().all(|p| p.metadata.deletion_timestamp.is_none()))
        .then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{n} pods of {release} not Ready within {timeout:?}"));
    started.elapsed()
}

/// Holder of each shard Lease of a release (`<fullname>-shard-NN`).
pub async fn shard_holders(client: &Client, release: &str) -> BTreeMap<String, String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), RELEASE_NS);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|l| {
            let name = l.metadata.name.clone()?;
            name.strip_prefix(&format!("{}-shard-", fullname(release)))?;
            let holder = l
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty())?;
            Some((name, holder))
        })
        .collect()
}

/// The chart's full name of a release (its resources' and Leases' prefix).
pub fn fullname(release: &str) -> String {
    if release.contains("secrets-operator") {
        release.to_owned()
    } else {
        format!("{release}-secrets-operator")
    }
}

/// How many shards each holder has, sorted descending.
pub fn spread(holders: &BTreeMap<String, String>) -> Vec<usize> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for h in holders.values() {
        *counts.entry(h.as_str()).or_default() += 1;
    }
    let mut v: Vec<usize> = counts.into_values().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// The log of every container of a pod, current and previous.
pub fn logs(pod: &str) -> String {
    let mut out = ok(
        "kubectl",
        &["-n", RELEASE_NS, "logs", pod, "--all-containers"],
    );
    if let Ok(previous) = run(
        "kubectl",
        &[
            "-n",
            RELEASE_NS,
            "logs",
            pod,
            "--all-containers",
            "--previous",
        ],
    ) {
        out.push_str(&previous);
    }
    out
}

/// The ERROR lines of a log (JSON lines).
pub fn errors(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("\"level\":\"ERROR\""))
        .map(str::to_owned)
        .collect()
}

// ----- resources -----------------------------------------------------------------

/// The KmsSecret API of a namespace.
pub fn kms_secrets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsSecret"),
        "kmssecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A namespace with the operator's credentials Secret.
pub async fn tenant(client: &Client, ns: &str) {
    namespace(client, ns).await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "kms-credentials", "namespace": ns},
        "stringData": {"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}
    }))
    .unwrap();
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    if api.get_opt("kms-credentials").await.unwrap().is_none() {
        api.create(&PostParams::default(), &secret).await.unwrap();
    }
}

/// A KmsSecret of `demo`/`dev`/`/` (the chart's hostAPI) writing `target`
/// with `policy`, resyncing every `interval`.
pub async fn kms_secret(
    client: &Client,
    ns: &str,
    name: &str,
    target: &str,
    policy: &str,
    interval: &str,
) {
    // `instant` subscribes to the KMS's change events instead of polling
    // (the default resync of that mode, an hour, is far beyond any wait of
    // the scenarios: a change arrives through its event or not at all).
    let sync_config = if interval == "instant" {
        json!({"instantUpdates": true})
    } else {
        json!({"resyncInterval": interval})
    };
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsSecret",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "syncConfig": sync_config,
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "kms-credentials"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": target, "creationPolicy": policy}]
        }
    }))
    .unwrap();
    kms_secrets(client, ns)
        .patch(
            name,
            &PatchParams::apply("node-suite").force(),
            &Patch::Apply(&obj),
        )
        .await
        .expect("apply KmsSecret");
}

/// A Secret's data as text.
pub async fn secret_data(
    client: &Client,
    ns: &str,
    name: &str,
) -> Option<BTreeMap<String, String>> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    Some(
        s.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect(),
    )
}

/// Wait until a Secret holds `key = value`.
pub async fn wait_value(
    client: &Client,
    ns: &str,
    name: &str,
    key: &str,
    value: &str,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    wait_for(timeout, || async {
        let d = secret_data(client, ns, name).await?;
        (d.get(key).map(String::as_str) == Some(value)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("Secret {ns}/{name} did not get {key}={value} within {timeout:?}"));
    started.elapsed()
}

/// Print a scenario's time.
pub fn report(scenario: &str, took: Duration) {
    println!("node scenario {scenario}: {:.1} s", took.as_secs_f64());
}
