//! The dev KMS as a child process (`kms-operator dev-server`): the seed of
//! a benchmark workload, its admin API (request counters, secret changes;
//! admin calls are neither counted nor faulted) and the client calls of the
//! `devserver` scenario (login, list).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

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

/// The dev server of a benchmark session, with the benchmark's admin token.
pub struct DevServer(kms_testkit::devserver::DevServer);

impl std::ops::Deref for DevServer {
    type Target = kms_testkit::devserver::DevServer;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for DevServer {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl DevServer {
    /// Start `bin dev-server` with `seed` (YAML), its data and log in `dir`.
    pub fn start(bin: &Path, dir: &Path, seed: &str) -> anyhow::Result<Self> {
        kms_testkit::devserver::DevServer::start(bin, dir, seed, ADMIN_TOKEN, &[]).map(Self)
    }

    /// The request counters, grouped.
    pub async fn counts(&self) -> anyhow::Result<KmsCounts> {
        let v = self.admin(reqwest::Method::GET, "stats", None).await?;
        Ok(KmsCounts::from_stats(&v))
    }

    /// Set a secret of the workload's project (admin: not counted).
    pub async fn put_secret(&self, path: &str, key: &str, value: &str) -> anyhow::Result<()> {
        self.0.put_secret(PROJECT, ENV, path, key, value).await
    }

    /// A universal-auth login: the access token.
    pub async fn login(&self, client_id: &str, client_secret: &str) -> anyhow::Result<String> {
        kms_testkit::api::login(self.http(), &self.api(), client_id, client_secret).await
    }

    /// `GET /api/v3/secrets/raw` of `path`; the number of secrets answered.
    pub async fn list(&self, token: &str, path: &str) -> anyhow::Result<usize> {
        let resp = self
            .http()
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
