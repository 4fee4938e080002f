//! The control plane: a local one started with `tests/testenv/testenv` (or
//! one given by `--kubeconfig`), restarts of its components, the CRDs, and
//! namespaces.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kms_testkit::testenv::{self, Testenv};
use kube::{Api, Client};

/// The control plane of a run.
#[derive(Debug)]
pub struct ControlPlane {
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    /// The testenv directory, when its components can be restarted.
    pub testenv_dir: Option<PathBuf>,
    /// Whether this run started it (and stops it at the end).
    pub started_here: bool,
    testenv: Testenv,
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
        let testenv = Testenv::new(repo);
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
                testenv,
            });
        }
        Ok(Self {
            kubeconfig: testenv.up(own_dir)?,
            testenv_dir: Some(own_dir.to_path_buf()),
            started_here: true,
            testenv,
        })
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
        self.testenv.restart(dir, component)?;
        Ok(started.elapsed())
    }

    /// Path of the cached kubectl.
    pub fn kubectl(&self) -> anyhow::Result<PathBuf> {
        self.testenv.kubectl()
    }

    /// Stop the control plane if this run started it.
    pub fn stop(&self) {
        if self.started_here
            && let Some(dir) = &self.testenv_dir
        {
            self.testenv.down(dir);
        }
    }
}

/// A client for `kubeconfig`.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<Client> {
    testenv::client(kubeconfig, Duration::from_secs(30)).await
}

/// The CRDs of `crds/`.
const CRDS: [&str; 4] = [
    "kmssecrets.secrets.hanzo.ai",
    "kmspushsecrets.secrets.hanzo.ai",
    "kmsdynamicsecrets.secrets.hanzo.ai",
    "clustergenerators.secrets.hanzo.ai",
];

/// Apply `crds/` (server-side) and wait until every CRD is established.
pub async fn apply_crds(cp: &ControlPlane, repo: &Path, client: &Client) -> anyhow::Result<()> {
    testenv::apply_crds(
        &cp.kubectl()?,
        &cp.kubeconfig,
        &repo.join("crds"),
        client,
        &CRDS,
    )
    .await
}

/// Create namespace `name` (fine if it exists).
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    testenv::create_namespace(client, name, &[("app.kubernetes.io/part-of", "kms-chaos")]).await
}

/// Delete namespace `name`, ignoring failures (a control plane without a
/// controller manager keeps it `Terminating`, which is harmless).
pub async fn delete_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &Default::default())
        .await;
}
