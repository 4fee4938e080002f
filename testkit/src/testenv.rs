//! The local control plane of `tests/testenv` (kube-apiserver + etcd, driven
//! by its `testenv` script), clients for it, and the objects every run
//! creates first: CRDs and namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The `tests/testenv/testenv` script of a checkout.
#[derive(Clone, Debug)]
pub struct Testenv {
    script: PathBuf,
}

impl Testenv {
    /// The script of the checkout at `repo`.
    pub fn new(repo: &Path) -> Self {
        Self {
            script: repo.join("tests/testenv/testenv"),
        }
    }

    fn run(&self, args: &[&std::ffi::OsStr]) -> anyhow::Result<std::process::Output> {
        Command::new(&self.script)
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.script.display()))
    }

    /// Start a control plane in `dir`; its kubeconfig. `up` can lose a race
    /// for a free port, so it is tried three times.
    pub fn up(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let mut last = String::new();
        for _ in 0..3 {
            let out = self.run(&["up".as_ref(), dir.as_os_str()])?;
            if out.status.success() {
                let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                return Ok(PathBuf::from(path));
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_secs(1));
        }
        bail!("tests/testenv/testenv up failed: {last}")
    }

    /// Stop the control plane of `dir` (nothing running is fine).
    pub fn down(&self, dir: &Path) {
        let _ = self.run(&["down".as_ref(), dir.as_os_str()]);
    }

    /// Restart `component` (`apiserver` or `etcd`) of the control plane of
    /// `dir`, keeping its data and ports; returns when the API server
    /// answers again.
    pub fn restart(&self, dir: &Path, component: &str) -> anyhow::Result<()> {
        let out = self.run(&["restart".as_ref(), dir.as_os_str(), component.as_ref()])?;
        if !out.status.success() {
            bail!(
                "restart {component} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Path of the cached kubectl.
    pub fn kubectl(&self) -> anyhow::Result<PathBuf> {
        self.tool("kubectl")
    }

    /// Path of a cached tool (`kubectl`, `helm`).
    pub fn tool(&self, name: &str) -> anyhow::Result<PathBuf> {
        let out = self.run(&["path".as_ref(), name.as_ref()])?;
        if !out.status.success() {
            bail!("no {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        ))
    }
}

/// A client for `kubeconfig` whose calls give up after `read_timeout`.
pub async fn client(kubeconfig: &Path, read_timeout: Duration) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig).context("reading the kubeconfig")?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(read_timeout);
    Ok(Client::try_from(config)?)
}

/// Apply the CRDs in `crd_dir` with `kubectl` (server-side) and wait until
/// each CRD of `names` (`<plural>.<group>`) is established.
pub async fn apply_crds(
    kubectl: &Path,
    kubeconfig: &Path,
    crd_dir: &Path,
    client: &Client,
    names: &[&str],
) -> anyhow::Result<()> {
    let out = Command::new(kubectl)
        .env("KUBECONFIG", kubeconfig)
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
    wait_established(client, names, Duration::from_secs(60)).await
}

/// Wait until each CRD of `names` is Established (the API server serves
/// its kind), at most `timeout` in all.
pub async fn wait_established<S: AsRef<str>>(
    client: &Client,
    names: &[S],
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    for name in names {
        let name = name.as_ref();
        loop {
            if let Some(crd) = api.get_opt(name).await?
                && crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the CRD {name} was not established within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Create namespace `name` with `labels` (fine if it exists).
pub async fn create_namespace(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).into()))
        .collect();
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels}
    }))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
