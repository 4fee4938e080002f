//! Shared set-up: the control plane, the CRDs, and per-test namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubeconfig_path() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let dir = repo().join("target").join("testenv");
    let out = Command::new(repo().join("tests/testenv/testenv"))
        .arg("up")
        .arg(&dir)
        .output()
        .map_err(|e| format!("running tests/testenv/testenv: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "tests/testenv/testenv up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir.join("kubeconfig"))
}

/// Load the kubeconfig, apply `crds/` and wait until every CRD is established.
/// Runs once per test binary, on a runtime of its own so that no test's
/// runtime owns shared connections.
fn setup() -> &'static Result<PathBuf, String> {
    static SETUP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SETUP.get_or_init(|| {
        std::thread::spawn(|| {
            let path = kubeconfig_path()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let client = client_for(&path).await?;
                apply_crds(&client).await?;
                Ok::<_, String>(())
            })?;
            Ok(path)
        })
        .join()
        .unwrap_or_else(|_| Err("set-up panicked".to_owned()))
    })
}

pub(crate) async fn client_for(path: &Path) -> Result<Client, String> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for the test's own runtime.
pub async fn client() -> Client {
    install_crypto();
    let path = match setup() {
        Ok(p) => p.clone(),
        Err(e) => panic!("control plane not available: {e}"),
    };
    client_for(&path).await.expect("kube client")
}

/// The kubeconfig path the tests use (for child processes).
pub fn kubeconfig() -> PathBuf {
    match setup() {
        Ok(p) => p.clone(),
        Err(e) => panic!("control plane not available: {e}"),
    }
}

async fn apply_crds(client: &Client) -> Result<(), String> {
    install_crypto();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(repo().join("crds"))
        .map_err(|e| e.to_string())?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("kms-operator-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("applying {name}: {e}"))?;
        names.push(name);
    }
    kms_testkit::testenv::wait_established(client, &names, Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Poll `check` every 100 ms until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    kms_testkit::wait::until(Duration::from_millis(100), timeout, check).await
}

/// Check that `check` holds throughout `window` (polled every 100 ms and
/// once more at the end), failing at the first poll that breaks it; the
/// error says when ("3.2 s into the 10.0 s window").
pub async fn holds_for<F, Fut>(window: Duration, check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    kms_testkit::wait::throughout(Duration::from_millis(100), window, check).await
}

/// A namespace for one test, deleted when the test ends (best effort: without
/// a controller manager the namespace stays `Terminating`, which is harmless).
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
}

impl TestNamespace {
    /// Create a fresh namespace whose name starts with `prefix`.
    pub async fn new(client: &Client, prefix: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{prefix}-{}-{n}-{:x}",
            std::process::id() % 10_000,
            nanos % 0xffff
        );
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kms-operator-tests": "true"}}
        }))
        .expect("namespace");
        api.create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        Self { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // The test's runtime may be shutting down: delete from a thread with a
        // runtime of its own.
        let name = self.name.clone();
        let path = kubeconfig();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let client = client_for(&path).await.ok()?;
                let api: Api<Namespace> = Api::all(client);
                api.delete(&name, &DeleteParams::background()).await.ok()
            })
        })
        .join();
    }
}

/// `holds_for` checks the whole window and stops at the first poll that
/// breaks it (no cluster needed).
#[tokio::test]
async fn holds_for_fails_at_the_first_broken_poll_and_passes_a_whole_window() {
    let started = tokio::time::Instant::now();
    let broken = holds_for(Duration::from_secs(5), || async {
        started.elapsed() < Duration::from_millis(500)
    })
    .await;
    let when = broken.expect_err("a condition that stops holding passed");
    assert!(
        when.starts_with("0.") && when.ends_with("into the 5.0 s window"),
        "{when}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    let started = tokio::time::Instant::now();
    let mut polls = 0;
    let held = holds_for(Duration::from_millis(500), || {
        polls += 1;
        async { true }
    })
    .await;
    assert_eq!(held, Ok(()));
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(polls >= 5, "{polls} polls in 500 ms");
}

/// `(reason, note)` of the Events in `ns` about the object named `name`.
pub async fn events_of(client: &Client, ns: &str, name: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::events::v1::Event;
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Wait up to `timeout` for an Event in `ns` about `name` with `reason`;
/// its note (panics when none comes).
pub async fn wait_event(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> String {
    let found = wait_for(timeout, || async {
        events_of(client, ns, name)
            .await
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, note)| note)
    })
    .await;
    found.unwrap_or_else(|| panic!("no {reason} Event about {ns}/{name}"))
}
