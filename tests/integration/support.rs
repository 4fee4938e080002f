//! Processes the integration tests run: the dev KMS and operator replicas,
//! each a child process of the `kms-operator` binary, plus helpers to talk to
//! them (the dev server's API and admin API, the operator's log).

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// The operator binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kms-operator"))
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory.
    pub fn new(prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("kms-it-{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Collects a child's output lines.
#[derive(Clone, Default)]
pub struct Output(Arc<Mutex<Vec<String>>>);

impl Output {
    fn capture(
        &self,
        stream: impl Read + Send + 'static,
        first_line: Option<std::sync::mpsc::Sender<String>>,
    ) {
        let lines = self.0.clone();
        std::thread::spawn(move || {
            let mut first_line = first_line;
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Some(tx) = &first_line
                    && line.contains("listening on")
                {
                    let _ = tx.send(line.clone());
                    first_line = None;
                }
                lines.lock().unwrap().push(line);
            }
        });
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

/// The admin token of every test dev server.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The universal-auth client id seeded for the operator.
pub const CLIENT_ID: &str = "op-client";
/// Its client secret.
pub const CLIENT_SECRET: &str = "op-secret";

/// A dev KMS child process.
pub struct DevServer {
    child: Child,
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    http: reqwest::Client,
    _dir: TempDir,
}

impl DevServer {
    /// Start a dev server with `seed` (YAML) on a free port.
    pub async fn start(seed: &str) -> Self {
        Self::start_with(seed, &[]).await
    }

    /// Start a dev server with `seed` and extra flags.
    pub async fn start_with(seed: &str, extra: &[&str]) -> Self {
        let dir = TempDir::new("kms");
        let seed_path = dir.0.join("seed.yaml");
        std::fs::write(&seed_path, seed).unwrap();
        let mut child = Command::new(binary())
            .args([
                "dev-server",
                "--addr",
                "127.0.0.1:0",
                "--admin-token",
                ADMIN_TOKEN,
            ])
            .arg("--seed")
            .arg(&seed_path)
            .arg("--data-dir")
            .arg(dir.0.join("data"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dev server");
        let output = Output::default();
        let (tx, rx) = std::sync::mpsc::channel();
        output.capture(child.stdout.take().unwrap(), Some(tx));
        output.capture(child.stderr.take().unwrap(), None);
        let line = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30)))
            .await
            .unwrap()
            .unwrap_or_else(|_| panic!("dev server did not start:\n{}", output.text()));
        let url = line
            .split("listening on ")
            .nth(1)
            .map(|s| {
                s.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_owned()
            })
            .expect("address in the listening line");
        Self {
            child,
            url,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// The KMS API base (`<url>/api`).
    pub fn api(&self) -> String {
        format!("{}/api", self.url)
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

    /// Request counters: route → status → count.
    pub async fn stats(&self) -> Value {
        self.admin(reqwest::Method::GET, "stats", None).await["requests"].clone()
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
        let path = if all { "leases?all=true" } else { "leases" };
        match self.admin(reqwest::Method::GET, path, None).await {
            Value::Array(v) => v,
            other => panic!("unexpected leases answer {other}"),
        }
    }

    /// Reset the counters.
    pub async fn reset_stats(&self) {
        self.admin(reqwest::Method::DELETE, "stats", None).await;
    }

    /// Set faults for a scope.
    pub async fn fault(&self, body: Value) {
        self.admin(reqwest::Method::POST, "faults", Some(body))
            .await;
    }

    /// Clear all faults.
    pub async fn clear_faults(&self) {
        self.admin(reqwest::Method::DELETE, "faults", None).await;
    }

    async fn token(&self) -> String {
        kms_testkit::api::login(&self.http, &self.api(), CLIENT_ID, CLIENT_SECRET)
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
        kms_testkit::api::set_secret(&self.http, &self.api(), &token, folder, key, value)
            .await
            .unwrap();
    }

    /// Delete a secret through the API.
    pub async fn delete_secret(&self, project: &str, env: &str, path: &str, key: &str) {
        let token = self.token().await;
        let resp = self
            .http
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

impl Drop for DevServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a replica may take to be ready (its caches' first lists on a
/// loaded machine).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The addresses an operator's JSON log says it serves on (health,
/// metrics).
pub fn served_addresses(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("serving"))
        })
        .filter_map(|v| v["fields"]["addr"].as_str().map(str::to_owned))
        .collect()
}

/// An operator replica child process.
pub struct Operator {
    child: Option<Child>,
    /// Captured logs (stdout and stderr).
    pub output: Output,
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
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let ready = crate::harness::wait_for(READY_TIMEOUT, || {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "the operator exited ({status}) before it was ready:\n{}",
                    self.output.text()
                );
            }
            let (http, addresses) = (http.clone(), served_addresses(&self.output.text()));
            async move {
                for addr in addresses {
                    if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await
                        && r.status().is_success()
                    {
                        return Some(());
                    }
                }
                None
            }
        })
        .await;
        if ready.is_none() {
            panic!(
                "the operator was not ready within {READY_TIMEOUT:?}:\n{}",
                self.output.text()
            );
        }
    }

    /// The addresses it serves on (health, metrics), from its log.
    pub fn served(&self) -> Vec<String> {
        served_addresses(&self.output.text())
    }

    /// Start the process and return at once, ready or not (a start that
    /// fails, what happens before readiness, replicas started together).
    pub fn spawn(
        pod_namespace: &str,
        namespaces: &[&str],
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Self {
        let mut command = Command::new(binary());
        // The test's environment wins (a KUBECONFIG of its own, say).
        command
            .env("KUBECONFIG", crate::harness::kubeconfig())
            .env("RUST_LOG", "info,kms_operator=debug");
        for (name, value) in env {
            match value {
                Some(v) => command.env(name, v),
                None => command.env_remove(name),
            };
        }
        let mut child = command
            .args([
                "--log-format",
                "json",
                "run",
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .arg(format!("--pod-namespace={pod_namespace}"))
            .arg(format!("--namespaces={}", namespaces.join(",")))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start operator");
        let output = Output::default();
        output.capture(child.stdout.take().unwrap(), None);
        output.capture(child.stderr.take().unwrap(), None);
        Self {
            child: Some(child),
            output,
        }
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Send a signal (`TERM`, `KILL`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(pid.to_string())
                .status();
        }
    }

    /// Stop with SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            if exited(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Wait up to `timeout` for `child` to exit, polling every 20 ms (from
/// synchronous code, as a `Drop` or a test without a runtime): its exit
/// status, `None` when it still runs.
pub fn exited(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let started = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if started.elapsed() < timeout => {}
            _ => return None,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
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
