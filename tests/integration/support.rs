//! Processes the integration tests run: the dev KMS and operator replicas,
//! each a child process of the `kms-operator` binary run by `kms_testkit`
//! (`devserver`, `replica`), plus helpers to talk to them (the dev server's
//! API and admin API, the operator's log).

use std::path::PathBuf;
use std::time::Duration;

use kms_testkit::replica::{Launch, Lines, Replica};
use serde_json::{Value, json};

pub use kms_testkit::replica::wait_child as exited;

/// The operator binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kms-operator"))
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory of its own: created exclusively under a random
    /// name, so two tests starting in the same instant never share one (a
    /// name made of the process and the time did not guarantee that).
    pub fn new(prefix: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("kms-it-{prefix}-"))
            .tempdir()
            .expect("temp dir");
        Self(dir.keep())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The admin token of every test dev server.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The universal-auth client id seeded for the operator.
pub const CLIENT_ID: &str = "op-client";
/// Its client secret.
pub const CLIENT_SECRET: &str = "op-secret";

/// A dev KMS child process (testkit's, with the tests' admin token) in a
/// scratch directory; its admin calls panic when they fail.
pub struct DevServer {
    server: kms_testkit::devserver::DevServer,
    _dir: TempDir,
}

impl std::ops::Deref for DevServer {
    type Target = kms_testkit::devserver::DevServer;
    fn deref(&self) -> &Self::Target {
        &self.server
    }
}

impl DevServer {
    /// Start a dev server with `seed` (YAML) on a free port.
    pub async fn start(seed: &str) -> Self {
        Self::start_with(seed, &[]).await
    }

    /// Start a dev server with `seed` and extra flags.
    pub async fn start_with(seed: &str, extra: &[&str]) -> Self {
        let dir = TempDir::new("kms");
        let (path, seed) = (dir.0.clone(), seed.to_owned());
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let server = tokio::task::spawn_blocking(move || {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            kms_testkit::devserver::DevServer::start(&binary(), &path, &seed, ADMIN_TOKEN, &extra)
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}"));
        Self { server, _dir: dir }
    }

    /// Request counters: route → status → count.
    pub async fn stats(&self) -> Value {
        self.server.stats().await.expect("admin stats")
    }

    /// Count of requests to `route` with `status` (any status when `None`).
    pub async fn count(&self, route: &str, status: Option<&str>) -> u64 {
        let stats = self.stats().await;
        let Some(by_status) = stats.get(route).and_then(Value::as_object) else {
            return 0;
        };
        by_status
            .iter()
            .filter(|(s, _)| status.is_none_or(|want| want == s.as_str()))
            .map(|(_, n)| n.as_u64().unwrap_or(0))
            .sum()
    }

    /// Active leases: `[{id, dynamicSecret, expireAt, …}]` (with `all`, also
    /// expired and revoked ones).
    pub async fn leases(&self, all: bool) -> Vec<Value> {
        self.server.leases(all).await.expect("admin leases")
    }

    /// Reset the counters.
    pub async fn reset_stats(&self) {
        self.server.reset_stats().await.expect("admin reset stats");
    }

    /// Set faults for a scope.
    pub async fn fault(&self, body: Value) {
        self.server.fault(body).await.expect("admin fault");
    }

    /// Clear all faults.
    pub async fn clear_faults(&self) {
        self.server
            .clear_faults()
            .await
            .expect("admin clear faults");
    }

    async fn token(&self) -> String {
        kms_testkit::api::login(self.http(), &self.api(), CLIENT_ID, CLIENT_SECRET)
            .await
            .expect("login")
    }

    /// Create or update a secret through the API (counted in the stats).
    pub async fn set_secret(&self, project: &str, env: &str, path: &str, key: &str, value: &str) {
        let token = self.token().await;
        let folder = kms_testkit::api::Folder {
            project,
            environment: env,
            path,
        };
        kms_testkit::api::set_secret(self.http(), &self.api(), &token, folder, key, value)
            .await
            .unwrap();
    }

    /// The secrets of a folder as the API lists them (counted in the
    /// stats): each secret's JSON object.
    pub async fn list_secrets(&self, project: &str, env: &str, path: &str) -> Vec<Value> {
        let token = self.token().await;
        let folder = kms_testkit::api::Folder {
            project,
            environment: env,
            path,
        };
        kms_testkit::api::list_secrets(self.http(), &self.api(), &token, folder)
            .await
            .unwrap()
    }

    /// The secrets of a folder as the API lists them: key → value.
    pub async fn values(
        &self,
        project: &str,
        env: &str,
        path: &str,
    ) -> std::collections::BTreeMap<String, String> {
        self.list_secrets(project, env, path)
            .await
            .iter()
            .map(|s| {
                (
                    s["secretKey"].as_str().unwrap_or_default().to_owned(),
                    s["secretValue"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Delete a secret through the API.
    pub async fn delete_secret(&self, project: &str, env: &str, path: &str, key: &str) {
        let token = self.token().await;
        let resp = self
            .http()
            .delete(format!("{}/v3/secrets/raw/{key}", self.api()))
            .bearer_auth(&token)
            .json(&json!({"projectSlug": project, "environment": env, "secretPath": path}))
            .send()
            .await
            .unwrap();
        assert!(
            resp.status().is_success(),
            "delete {key}: {}",
            resp.status()
        );
    }
}

/// How long a replica may take to be ready (its caches' first lists on a
/// loaded machine).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a replica may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// An operator replica child process (killed on drop).
pub struct Operator {
    process: Replica,
    /// Captured logs (stdout and stderr).
    pub output: Lines,
}

/// Lines of a failed test's operator log shown with its failure.
const LOG_TAIL: usize = 80;

impl Drop for Operator {
    /// A test that fails shows the end of its operator's log (what the
    /// operator decided is often the only way to tell why, and a CI run
    /// keeps nothing else).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let text = self.output.text();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
        eprintln!("--- the operator's last {} log lines ---", tail.len());
        for line in tail {
            let cut = line.char_indices().nth(600).map_or(line.len(), |(i, _)| i);
            eprintln!("{}", &line[..cut]);
        }
    }
}

impl Operator {
    /// Start `kms-operator run` watching `namespaces`, with extra flags, and
    /// wait until it is ready ([`Operator::ready`]).
    pub async fn start(pod_namespace: &str, namespaces: &[&str], extra: &[&str]) -> Self {
        Self::start_with_env(pod_namespace, namespaces, extra, &[]).await
    }

    /// Like [`Operator::start`], with environment variables set (`Some`) or
    /// removed (`None`) for the child process.
    pub async fn start_with_env(
        pod_namespace: &str,
        namespaces: &[&str],
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Self {
        let mut op = Self::spawn(pod_namespace, namespaces, extra, env);
        op.ready().await;
        op
    }

    /// Wait until its `/readyz` answers 200 (caches listed, workers
    /// running); panics, with its log, when it exits first or is not ready
    /// within a minute.
    pub async fn ready(&mut self) {
        if let Err(e) = self.process.wait_ready(READY_TIMEOUT).await {
            panic!("{e}");
        }
    }

    /// The addresses it serves on (health, metrics), from its log.
    pub fn served(&self) -> Vec<String> {
        self.process.served()
    }

    /// Start the process and return at once, ready or not (a start that
    /// fails, what happens before readiness, replicas started together).
    pub fn spawn(
        pod_namespace: &str,
        namespaces: &[&str],
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Self {
        Self::spawn_via(&[], pod_namespace, namespaces, extra, env)
    }

    /// Like [`Operator::spawn`], run through the command `via` (its
    /// program and arguments, the binary appended: `["taskset", "-c",
    /// "0"]` runs it on one CPU, as a pod limited to one core sees it).
    pub fn spawn_via(
        via: &[&str],
        pod_namespace: &str,
        namespaces: &[&str],
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Self {
        let launch = match via.split_first() {
            Some((program, args)) => Launch::new(program).args(args).arg(binary()),
            None => Launch::new(binary()),
        };
        let mut launch = launch
            .env("KUBECONFIG", crate::harness::kubeconfig())
            .env("RUST_LOG", "info,kms_operator=debug")
            // Each test's kms-config lives in its own namespace (the pod
            // namespace), not in the shared kms-operator-system; a test that
            // wants the operator's default removes this.
            .env("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE", pod_namespace);
        // The test's environment wins (a KUBECONFIG of its own, say).
        for (name, value) in env {
            launch = match value {
                Some(v) => launch.env(name, v),
                None => launch.env_remove(name),
            };
        }
        let output = Lines::default();
        let process = launch
            .args(["--log-format", "json", "run"])
            .listen_any()
            .arg(format!("--pod-namespace={pod_namespace}"))
            .arg(format!("--namespaces={}", namespaces.join(",")))
            .args(extra)
            .capture(&output)
            .spawn()
            .expect("start operator");
        Self { process, output }
    }

    /// The process id (`None` once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Send a signal (`TERM`, `KILL`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        self.process.signal(name);
    }

    /// Stop with SIGTERM and wait (SIGKILL after 10 s).
    pub fn stop(&mut self) {
        self.process.stop(STOP_TIMEOUT);
    }

    /// SIGTERM, then wait up to `timeout` before killing it: how long it
    /// took to exit, `None` if it had to be killed.
    pub fn stop_within(&mut self, timeout: Duration) -> Option<Duration> {
        self.process.stop(timeout)
    }
}

/// Create the universal-auth credentials Secret `name` in `ns` (the
/// operator identity of [`seed`]).
pub async fn create_credentials(client: &kube::Client, ns: &str, name: &str) {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "stringData": {"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}
    }))
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .expect("credentials Secret");
}

/// A seed with project `demo` (env `dev`) holding `secrets` at `/`, and the
/// operator identity.
pub fn seed(secrets: &[(&str, &str)]) -> String {
    let mut s = String::from(
        "projects:\n  - slug: demo\n    name: Demo\n    environments: [dev, prod]\n    secrets:\n      dev:\n        /:\n",
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
