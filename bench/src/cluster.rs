//! The control plane of a benchmark session: a fresh `tests/testenv`
//! control plane (kube-apiserver + etcd) per session so that every scenario
//! starts from an empty cluster, the CRDs, namespaces, the API server's
//! request counter and the shard Leases.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kms_testkit::testenv::{self, Testenv};
use kube::api::ListParams;
use kube::{Api, Client};

use crate::stats;

/// A control plane started by the benchmark.
#[derive(Debug)]
pub struct ControlPlane {
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    dir: PathBuf,
    testenv: Testenv,
}

impl ControlPlane {
    /// Stop whatever runs in `dir`, wipe it and start a new control plane
    /// there.
    pub fn fresh(repo: &Path, dir: &Path) -> anyhow::Result<Self> {
        let testenv = Testenv::new(repo);
        testenv.down(dir);
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        Ok(Self {
            kubeconfig: testenv.up(dir)?,
            dir: dir.to_path_buf(),
            testenv,
        })
    }

    /// Stop it (its directory is removed too).
    pub fn stop(&self) {
        self.testenv.down(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A client for `kubeconfig`.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<Client> {
    testenv::client(kubeconfig, Duration::from_secs(60)).await
}

/// Apply the CRDs in `crd_dir` (server-side) and wait until `crd_name`
/// (`<plural>.<group>`) is established.
pub async fn apply_crds(
    cp: &ControlPlane,
    crd_dir: &Path,
    client: &Client,
    crd_name: &str,
) -> anyhow::Result<()> {
    let kubectl = cp.testenv.kubectl()?;
    testenv::apply_crds(&kubectl, &cp.kubeconfig, crd_dir, client, &[crd_name]).await
}

/// Create namespace `name` (fine if it exists).
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    testenv::create_namespace(client, name, &[]).await
}

/// The API server's request counter (`apiserver_request_total`): the sum,
/// by verb, and by verb and resource. A busy API server (the end of a
/// converge on 2 shared cores) can miss a connection's deadline: the read
/// is tried three times.
pub async fn apiserver_requests(client: &Client) -> anyhow::Result<stats::ApiRequests> {
    let mut tries = 0;
    let text = loop {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        match client.request_text(req).await {
            Ok(text) => break text,
            Err(e) if tries < 2 => {
                tries += 1;
                eprintln!("reading the API server's /metrics: {e}; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e).context("reading the API server's /metrics"),
        }
    };
    Ok(stats::apiserver_requests(&text))
}

/// Holder of every shard Lease `<prefix>-shard-NN` in `namespace`, by shard
/// number (an empty holder when released).
pub async fn shard_holders(
    client: &Client,
    namespace: &str,
    prefix: &str,
) -> anyhow::Result<BTreeMap<u32, String>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let list = api.list(&ListParams::default()).await?;
    let head = format!("{prefix}-shard-");
    Ok(list
        .items
        .iter()
        .filter_map(|l| {
            let shard: u32 = l
                .metadata
                .name
                .as_deref()?
                .strip_prefix(&head)?
                .parse()
                .ok()?;
            let holder = l
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default();
            Some((shard, holder))
        })
        .collect())
}
