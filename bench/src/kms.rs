//! The dev KMS as a child process (`kms-operator dev-server`): the seed of
//! a benchmark workload, its admin API (request counters, secret changes;
//! admin calls are neither counted nor faulted) and the client calls of the
//! `devserver` scenario (login, list).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::stats::KmsCounts;

/// The admin token of the benchmark's dev server.
pub const ADMIN_TOKEN: &str = "bench-admin";
/// The project every workload reads.
pub const PROJECT: &str = "bench";
/// Its environment.
pub const ENV: &str = "dev";

/// Client id of the identity of `ns`.
pub fn client_id(ns: &str) -> String {
    format!("c-{ns}")
}

/// Client secret of the identity of `ns`.
pub fn client_secret(ns: &str) -> String {
    format!("s-{ns}")
}

/// The KMS folder of namespace `ns`.
pub fn folder(ns: &str) -> String {
    format!("/apps/{ns}")
}

/// The seed: one folder per namespace with `keys` keys (`K0`…), one
/// universal-auth identity per namespace, long-lived tokens (so that a warm
/// restart can reuse them).
pub fn seed(namespaces: &[String], keys: usize) -> String {
    let mut y = format!(
        "projects:\n  - slug: {PROJECT}\n    environments: [{ENV}]\n    secrets:\n      {ENV}:\n"
    );
    for ns in namespaces {
        let _ = writeln!(y, "        {}:", folder(ns));
        for k in 0..keys {
            let _ = writeln!(y, "          K{k}: \"{}\"", initial_value(ns, k));
        }
    }
    y.push_str("identities:\n");
    for ns in namespaces {
        let _ = writeln!(
            y,
            "  - name: id-{ns}\n    universalAuth: {{clientId: {}, clientSecret: {}, accessTokenTTL: 86400, accessTokenMaxTTL: 604800}}\n    projects: [{PROJECT}]",
            client_id(ns),
            client_secret(ns)
        );
    }
    y
}

/// The seeded value of key `k` of namespace `ns` (32 characters).
pub fn initial_value(ns: &str, k: usize) -> String {
    format!("{:0>32}", format!("v0-{ns}-{k}"))
}

/// A running dev server.
pub struct DevServer {
    child: Option<Child>,
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    http: reqwest::Client,
}

impl DevServer {
    /// Start `bin dev-server` with `seed` (YAML), its data and log in `dir`.
    pub fn start(bin: &Path, dir: &Path, seed: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let seed_path = dir.join("seed.yaml");
        std::fs::write(&seed_path, seed)?;
        let log = std::fs::File::create(dir.join("dev-server.log"))?;
        let mut child = Command::new(bin)
            .args(["dev-server", "--addr", "127.0.0.1:0"])
            .arg("--admin-token")
            .arg(ADMIN_TOKEN)
            .arg("--seed")
            .arg(&seed_path)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting the dev server")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            // Read to the end so the server never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.split("listening on ").nth(1)
                    && let Some(t) = tx.take()
                {
                    let _ = t.send(url.trim().trim_end_matches('/').to_owned());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the dev server did not start (see {})", dir.display());
            }
        };
        Ok(Self {
            child: Some(child),
            url,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }

    /// The API base the resources name (`<url>/api`).
    pub fn api(&self) -> String {
        format!("{}/api", self.url)
    }

    /// PID of the server process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}/admin/{path}", self.url))
            .bearer_auth(ADMIN_TOKEN);
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

    /// The request counters, grouped.
    pub async fn counts(&self) -> anyhow::Result<KmsCounts> {
        let v = self.admin(reqwest::Method::GET, "stats", None).await?;
        Ok(KmsCounts::from_stats(&v))
    }

    /// Reset the request counters.
    pub async fn reset_counts(&self) -> anyhow::Result<()> {
        self.admin(reqwest::Method::DELETE, "stats", None)
            .await
            .map(drop)
    }

    /// Set a secret (admin: not counted).
    pub async fn put_secret(&self, path: &str, key: &str, value: &str) -> anyhow::Result<()> {
        self.admin(
            reqwest::Method::PUT,
            "secrets",
            Some(json!({"project": PROJECT, "environment": ENV, "path": path, "key": key, "value": value})),
        )
        .await
        .map(drop)
    }

    /// A universal-auth login: the access token.
    pub async fn login(&self, client_id: &str, client_secret: &str) -> anyhow::Result<String> {
        let v: Value = self
            .http
            .post(format!("{}/v1/auth/universal-auth/login", self.api()))
            .json(&json!({"clientId": client_id, "clientSecret": client_secret}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(v["accessToken"].as_str().context("no token")?.to_owned())
    }

    /// `GET /api/v3/secrets/raw` of `path`; the number of secrets answered.
    pub async fn list(&self, token: &str, path: &str) -> anyhow::Result<usize> {
        let resp = self
            .http
            .get(format!("{}/v3/secrets/raw", self.api()))
            .bearer_auth(token)
            .query(&[
                ("workspaceSlug", PROJECT),
                ("environment", ENV),
                ("secretPath", path),
            ])
            .send()
            .await?
            .error_for_status()?;
        let v: Value = resp.json().await?;
        Ok(v["secrets"].as_array().map_or(0, Vec::len))
    }

    /// Stop the server (SIGTERM, then kill after 10 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::replicas::signal(c.id(), "TERM");
            for _ in 0..100 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_has_a_folder_and_an_identity_per_namespace() {
        let ns = vec!["bench-00000".to_owned(), "bench-00001".to_owned()];
        let y = seed(&ns, 2);
        assert!(y.contains("        /apps/bench-00001:\n          K0: \""));
        assert!(y.contains("clientId: c-bench-00000, clientSecret: s-bench-00000"));
        assert_eq!(y.matches("  - name: id-").count(), 2);
        assert_eq!(initial_value("a", 1).len(), 32);
    }
}
