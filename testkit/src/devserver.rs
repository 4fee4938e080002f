//! The dev KMS (`kms-operator dev-server`) as a child process on a free
//! port (of the loopback address unless told otherwise), and its admin API (`/admin/...`: stats, faults, leases,
//! secrets), whose calls the server neither counts nor faults.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// How long the server may take to listen (a seed of 10,000 folders takes a
/// while).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long it may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running dev server.
pub struct DevServer {
    child: Option<Child>,
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
        let mut child = Command::new(bin)
            .args(["dev-server", "--addr", &format!("{ip}:0")])
            .args(extra_args)
            .arg("--admin-token")
            .arg(admin_token)
            .arg("--seed")
            .arg(&seed_path)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the dev server")?;
        let stdout = child.stdout.take().context("stdout")?;
        let stderr = child.stderr.take().context("stderr")?;
        let mut log = std::fs::File::create(dir.join("dev-server.log"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Both pipes are read to the end so the server never blocks on one.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.split("listening on ").nth(1)
                    && let Some(t) = tx.take()
                {
                    let _ = t.send(url.trim().trim_end_matches('/').to_owned());
                }
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
            }
        });
        let Ok(url) = rx.recv_timeout(START_TIMEOUT) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the dev server did not start (see {})",
                dir.join("dev-server.log").display()
            );
        };
        Ok(Self {
            child: Some(child),
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
        self.child.as_ref().map(Child::id)
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

    /// Stop the server: SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::signal(c.id(), "TERM");
            let polls = STOP_TIMEOUT.as_millis() / 100;
            for _ in 0..polls {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
