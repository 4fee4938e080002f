//! The control plane: a local one started with `tests/testenv/testenv` (or
//! one given by `--kubeconfig`), restarts of its components, the CRDs, and
//! namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The control plane of a run.
#[derive(Debug)]
pub struct ControlPlane {
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    /// The testenv directory, when its components can be restarted.
    pub testenv_dir: Option<PathBuf>,
    /// Whether this run started it (and stops it at the end).
    pub started_here: bool,
    script: PathBuf,
}

impl ControlPlane {
    /// Reuse `kubeconfig` (restartable when it lives in a testenv directory,
    /// or when `testenv_dir` names one), or start a control plane in
    /// `own_dir`.
    pub fn start_or_reuse(
        repo: &Path,
        kubeconfig: Option<PathBuf>,
        testenv_dir: Option<PathBuf>,
        own_dir: &Path,
    ) -> anyhow::Result<Self> {
        let script = repo.join("tests/testenv/testenv");
        if let Some(kc) = kubeconfig {
            let dir = testenv_dir.or_else(|| {
                kc.parent()
                    .filter(|d| d.join("state.json").is_file())
                    .map(Path::to_path_buf)
            });
            return Ok(Self {
                kubeconfig: kc,
                testenv_dir: dir,
                started_here: false,
                script,
            });
        }
        // `up` can lose a race for a free port; one more try settles it.
        let mut last = String::new();
        for _ in 0..3 {
            let out = Command::new(&script)
                .arg("up")
                .arg(own_dir)
                .output()
                .context("running tests/testenv/testenv up")?;
            if out.status.success() {
                let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                return Ok(Self {
                    kubeconfig: PathBuf::from(path),
                    testenv_dir: Some(own_dir.to_path_buf()),
                    started_here: true,
                    script,
                });
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_secs(1));
        }
        bail!("tests/testenv/testenv up failed: {last}")
    }

    /// Whether kube-apiserver and etcd can be restarted.
    pub fn restartable(&self) -> bool {
        self.testenv_dir.is_some()
    }

    /// Restart `component` (`apiserver` or `etcd`); returns when the API
    /// server answers again.
    pub fn restart(&self, component: &str) -> anyhow::Result<Duration> {
        let dir = self
            .testenv_dir
            .as_ref()
            .context("the control plane cannot be restarted")?;
        let started = Instant::now();
        let out = Command::new(&self.script)
            .arg("restart")
            .arg(dir)
            .arg(component)
            .output()
            .context("running tests/testenv/testenv restart")?;
        if !out.status.success() {
            bail!(
                "restart {component} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(started.elapsed())
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

    /// Stop the control plane if this run started it.
    pub fn stop(&self) {
        if self.started_here
            && let Some(dir) = &self.testenv_dir
        {
            let _ = Command::new(&self.script).arg("down").arg(dir).output();
        }
    }
}

/// A client for `kubeconfig`.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig).context("reading the kubeconfig")?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    Ok(Client::try_from(config)?)
}

/// Apply `crds/` (server-side) and wait until every CRD is established.
pub async fn apply_crds(cp: &ControlPlane, repo: &Path, client: &Client) -> anyhow::Result<()> {
    let kubectl = cp.kubectl()?;
    let out = Command::new(kubectl)
        .env("KUBECONFIG", &cp.kubeconfig)
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(repo.join("crds"))
        .output()
        .context("kubectl apply -f crds/")?;
    if !out.status.success() {
        bail!(
            "kubectl apply -f crds/ failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = api.list(&Default::default()).await?;
        let ours: Vec<_> = list
            .items
            .iter()
            .filter(|c| c.spec.group == "secrets.hanzo.ai")
            .collect();
        let established = ours.iter().all(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|x| x.type_ == "Established" && x.status == "True")
                })
        });
        if ours.len() >= 3 && established {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the CRDs were not established within a minute");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Create namespace `name` (fine if it exists).
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "kms-chaos"}}
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

/// Delete namespace `name`, ignoring failures (a control plane without a
/// controller manager keeps it `Terminating`, which is harmless).
pub async fn delete_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &Default::default())
        .await;
}
