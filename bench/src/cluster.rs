//! The control plane of a benchmark session: a fresh `tests/testenv`
//! control plane (kube-apiserver + etcd) per session so that every scenario
//! starts from an empty cluster, the CRDs, namespaces, the API server's
//! request counter and the shard Leases.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::stats;

/// A control plane started by the benchmark.
#[derive(Debug)]
pub struct ControlPlane {
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    dir: PathBuf,
    script: PathBuf,
}

impl ControlPlane {
    /// Stop whatever runs in `dir`, wipe it and start a new control plane
    /// there.
    pub fn fresh(repo: &Path, dir: &Path) -> anyhow::Result<Self> {
        let script = repo.join("tests/testenv/testenv");
        let _ = Command::new(&script).arg("down").arg(dir).output();
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let mut last = String::new();
        // `up` can lose a race for a free port; another try settles it.
        for _ in 0..3 {
            let out = Command::new(&script)
                .arg("up")
                .arg(dir)
                .output()
                .context("running tests/testenv/testenv up")?;
            if out.status.success() {
                let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                return Ok(Self {
                    kubeconfig: PathBuf::from(path),
                    dir: dir.to_path_buf(),
                    script,
                });
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_secs(1));
        }
        bail!("tests/testenv/testenv up failed: {last}")
    }

    /// Path of the cached kubectl.
    pub fn kubectl(&self) -> anyhow::Result<PathBuf> {
        let out = Command::new(&self.script)
            .args(["path", "kubectl"])
            .output()
            .context("running tests/testenv/testenv path kubectl")?;
        if !out.status.success() {
            bail!("no kubectl: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        ))
    }

    /// Stop it (its directory is removed too).
    pub fn stop(&self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .arg(&self.dir)
            .output();
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
    let kc = Kubeconfig::read_from(kubeconfig).context("reading the kubeconfig")?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(60));
    Ok(Client::try_from(config)?)
}

/// Apply the CRDs in `crd_dir` (server-side) and wait until `<plural>.<group>`
/// is established.
pub async fn apply_crds(
    cp: &ControlPlane,
    crd_dir: &Path,
    client: &Client,
    crd_name: &str,
) -> anyhow::Result<()> {
    let out = Command::new(cp.kubectl()?)
        .env("KUBECONFIG", &cp.kubeconfig)
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(crd_dir)
        .output()
        .context("kubectl apply the CRDs")?;
    if !out.status.success() {
        bail!(
            "applying {} failed: {}",
            crd_dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(crd) = api.get_opt(crd_name).await?
            && crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the CRD {crd_name} was not established within a minute");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Create namespace `name` (fine if it exists).
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The API server's request counter: the sum of `apiserver_request_total`
/// and its sums by verb.
pub async fn apiserver_requests(client: &Client) -> anyhow::Result<(f64, BTreeMap<String, f64>)> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("reading the API server's /metrics")?;
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
