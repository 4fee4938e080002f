//! The dev KMS (`kms-operator dev-server`) as a child process on a free
//! port (of the loopback address unless told otherwise), run by
//! [`crate::replica`], and its admin API (`/admin/...`: stats, faults,
//! leases, secrets), whose calls the server neither counts nor faults.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::bail;
use serde_json::{Value, json};

use crate::replica::{Launch, Replica};

/// How long the server may take to listen (a seed of 10,000 folders takes a
/// while).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long it may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running dev server.
pub struct DevServer {
    process: Option<Replica>,
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    http: reqwest::Client,
    admin_token: String,
}

impl DevServer {
    /// Start `bin dev-server` with `seed` (YAML) and `extra_args`; its seed,
    /// data and log (`dev-server.log`) live in `dir`.
    pub fn start(
        bin: &Path,
        dir: &Path,
        seed: &str,
        admin_token: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_on("127.0.0.1", bin, dir, seed, admin_token, extra_args)
    }

    /// [`DevServer::start`] on a free port of `ip` (e.g. a node's address,
    /// for pods to reach it).
    pub fn start_on(
        ip: &str,
        bin: &Path,
        dir: &Path,
        seed: &str,
        admin_token: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let seed_path = dir.join("seed.yaml");
        std::fs::write(&seed_path, seed)?;
        let log = dir.join("dev-server.log");
        // The first "listening on URL" line says where it listens.
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(Some(tx));
        // An error that stops it names its cause in a few lines: no
        // backtrace of the error (a panic's still follows RUST_BACKTRACE).
        let mut process = Launch::new(bin)
            .env("RUST_LIB_BACKTRACE", "0")
            .args(["dev-server", "--addr", &format!("{ip}:0")])
            .args(extra_args)
            .arg("--admin-token")
            .arg(admin_token)
            .arg("--seed")
            .arg(&seed_path)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .log_file(&log)
            .on_line(move |line| {
                if let Some(url) = line.split("listening on ").nth(1)
                    && let Some(tx) = tx.lock().unwrap_or_else(|e| e.into_inner()).take()
                {
                    let url = url.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send(url.trim_end_matches('/').to_owned());
                }
            })
            .spawn()?;
        let Ok(url) = rx.recv_timeout(START_TIMEOUT) else {
            process.kill();
            bail!(
                "the dev server did not start (log {}):\n{}",
                log.display(),
                process.log()
            );
        };
        Ok(Self {
            process: Some(process),
            url,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            admin_token: admin_token.to_owned(),
        })
    }

    /// The API base the resources name (`<url>/api`).
    pub fn api(&self) -> String {
        format!("{}/api", self.url)
    }

    /// PID of the server process, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref()?.pid()
    }

    /// An HTTP client for calls to the API.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// An admin call: `method /admin/<path>` with an optional JSON body; the
    /// JSON answer (`null` when there is none).
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}/admin/{path}", self.url))
            .bearer_auth(&self.admin_token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("admin {path}: {status}: {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Create or update a secret through the admin API.
    pub async fn put_secret(
        &self,
        project: &str,
        environment: &str,
        path: &str,
        key: &str,
        value: &str,
    ) -> anyhow::Result<()> {
        self.admin(
            reqwest::Method::PUT,
            "secrets",
            Some(json!({"project": project, "environment": environment, "path": path, "key": key, "value": value})),
        )
        .await
        .map(drop)
    }

    /// Request counters: route → status → count.
    pub async fn stats(&self) -> anyhow::Result<Value> {
        Ok(self.admin(reqwest::Method::GET, "stats", None).await?["requests"].clone())
    }

    /// Reset the request counters.
    pub async fn reset_stats(&self) -> anyhow::Result<()> {
        self.admin(reqwest::Method::DELETE, "stats", None)
            .await
            .map(drop)
    }

    /// Put a fault in force (see the dev server's admin API).
    pub async fn fault(&self, body: Value) -> anyhow::Result<()> {
        self.admin(reqwest::Method::POST, "faults", Some(body))
            .await
            .map(drop)
    }

    /// Clear every fault.
    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        self.admin(reqwest::Method::DELETE, "faults", None)
            .await
            .map(drop)
    }

    /// Active leases (`[{id, dynamicSecret, createdAt, expireAt, state,
    /// data, …}]`); with `all`, also expired and revoked ones.
    pub async fn leases(&self, all: bool) -> anyhow::Result<Vec<Value>> {
        let path = if all { "leases?all=true" } else { "leases" };
        match self.admin(reqwest::Method::GET, path, None).await? {
            Value::Array(v) => Ok(v),
            other => bail!("unexpected leases answer {other}"),
        }
    }

    /// Stop the server: SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop(STOP_TIMEOUT);
        }
    }
}
