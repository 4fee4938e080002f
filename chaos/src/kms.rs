//! The dev KMS as a child process (`kms-operator dev-server`), its admin
//! API (stats, faults, leases, secrets — neither counted nor faulted), and
//! the few API reads the runner makes itself, which it counts so that the
//! budget checker can subtract them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::history::{KmsLease, Ms};

/// The admin token of the run's dev server.
pub const ADMIN_TOKEN: &str = "chaos-admin";
/// The operator identity's client id.
pub const CLIENT_ID: &str = "chaos-client";
/// Its client secret.
pub const CLIENT_SECRET: &str = "chaos-secret";
/// The project.
pub const PROJECT: &str = "chaos";
/// The environment.
pub const ENV: &str = "dev";

/// An active lease with its credentials.
#[derive(Clone, Debug)]
pub struct AdminLease {
    /// Id, creation and expiry.
    pub lease: KmsLease,
    /// The credentials handed out.
    pub data: BTreeMap<String, String>,
}

/// The dev server of a run, with the requests the runner made to its API.
pub struct DevServer {
    server: kms_testkit::devserver::DevServer,
    own: Arc<AtomicU64>,
    token: tokio::sync::Mutex<Option<String>>,
}

impl std::ops::Deref for DevServer {
    type Target = kms_testkit::devserver::DevServer;
    fn deref(&self) -> &Self::Target {
        &self.server
    }
}

impl std::ops::DerefMut for DevServer {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.server
    }
}

fn parse_time(v: &Value) -> Option<Ms> {
    v.as_str()?
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

impl DevServer {
    /// Start `bin dev-server` with `seed` (YAML), its data and log in `dir`;
    /// leases may be as short as a second.
    /// It listens on `ip` (the loopback address, or the node's address when
    /// the replicas are pods).
    pub fn start(ip: &str, bin: &Path, dir: &Path, seed: &str) -> anyhow::Result<Self> {
        let server = kms_testkit::devserver::DevServer::start_on(
            ip,
            bin,
            dir,
            seed,
            ADMIN_TOKEN,
            &["--min-lease-ttl", "1s"],
        )?;
        Ok(Self {
            server,
            own: Arc::new(AtomicU64::new(0)),
            token: tokio::sync::Mutex::new(None),
        })
    }

    /// API requests the runner made itself.
    pub fn own_requests(&self) -> u64 {
        self.own.load(Ordering::SeqCst)
    }

    /// Requests the server counted so far (every route and outcome).
    pub async fn requests_total(&self) -> anyhow::Result<u64> {
        let v = self.admin(reqwest::Method::GET, "stats", None).await?;
        let mut n = 0;
        if let Some(routes) = v["requests"].as_object() {
            for by_status in routes.values() {
                if let Some(m) = by_status.as_object() {
                    n += m.values().filter_map(Value::as_u64).sum::<u64>();
                }
            }
        }
        Ok(n)
    }

    /// Active leases.
    pub async fn leases(&self) -> anyhow::Result<Vec<AdminLease>> {
        self.leases_where(false).await
    }

    /// Every lease ever created, with its state.
    pub async fn all_leases(&self) -> anyhow::Result<Vec<AdminLease>> {
        self.leases_where(true).await
    }

    async fn leases_where(&self, all: bool) -> anyhow::Result<Vec<AdminLease>> {
        let items = self.server.leases(all).await?;
        Ok(items
            .iter()
            .filter_map(|l| {
                Some(AdminLease {
                    lease: KmsLease {
                        id: l["id"].as_str()?.to_owned(),
                        created: parse_time(&l["createdAt"]).unwrap_or(0),
                        expires: parse_time(&l["expireAt"]).unwrap_or(0),
                        state: l["state"].as_str().unwrap_or("active").to_owned(),
                    },
                    data: l["data"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            })
            .collect())
    }

    /// Create or update a secret of the run's project (admin: not counted,
    /// not faulted).
    pub async fn put_secret(&self, path: &str, key: &str, value: &str) -> anyhow::Result<()> {
        self.server.put_secret(PROJECT, ENV, path, key, value).await
    }

    async fn token(&self) -> anyhow::Result<String> {
        let mut t = self.token.lock().await;
        if let Some(t) = t.as_ref() {
            return Ok(t.clone());
        }
        let resp = self
            .http()
            .post(format!("{}/v1/auth/universal-auth/login", self.api()))
            .json(&json!({"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}))
            .send()
            .await;
        self.own.fetch_add(1, Ordering::SeqCst);
        let v: Value = resp?.json().await?;
        let token = v["accessToken"].as_str().context("no token")?.to_owned();
        *t = Some(token.clone());
        Ok(token)
    }

    /// Every secret under `path` (recursively): folder → key → value.
    /// Counted as the runner's own requests.
    pub async fn list_tree(
        &self,
        path: &str,
    ) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
        let token = self.token().await?;
        let resp = self
            .http()
            .get(format!("{}/v3/secrets/raw", self.api()))
            .bearer_auth(token)
            .query(&[
                ("workspaceSlug", PROJECT),
                ("environment", ENV),
                ("secretPath", path),
                ("recursive", "true"),
            ])
            .send()
            .await;
        self.own.fetch_add(1, Ordering::SeqCst);
        let resp = resp?;
        if !resp.status().is_success() {
            bail!("listing {path}: {}", resp.status());
        }
        let v: Value = resp.json().await?;
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for s in v["secrets"].as_array().into_iter().flatten() {
            let (Some(p), Some(k), Some(val)) = (
                s["secretPath"].as_str(),
                s["secretKey"].as_str(),
                s["secretValue"].as_str(),
            ) else {
                continue;
            };
            out.entry(p.trim_end_matches('/').to_owned())
                .or_default()
                .insert(k.to_owned(), val.to_owned());
        }
        Ok(out)
    }
}
