//! The release as users consume it (`scripts/release.sh`, pushed to the
//! node's registry on loopback): what the release directory holds, the
//! chart installed from the OCI registry and from a classic chart
//! repository with the kubelet pulling the image, the image pinned by
//! digest, the CRDs applied by hand; and an upgrade from the previous
//! release and a rollback, with a thousand resources synced and a value
//! changing every second, that lose nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::Value;

use crate::harness::*;

/// The release's directory holds what a user downloads, and it checks.
fn check_release_files(version: &str) {
    let dir = release_dir(version);
    let sums = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&dir)
        .output()
        .expect("sha256sum");
    assert!(
        sums.status.success(),
        "SHA256SUMS of {}: {}",
        dir.display(),
        String::from_utf8_lossy(&sums.stdout)
    );
    let listed = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    for file in [
        format!("secrets-operator-{version}.tgz"),
        "index.yaml".to_owned(),
        "crds.yaml".to_owned(),
        format!("kms-operator-{version}-linux-amd64.tar.gz"),
        format!("kms-operator-{version}-image.oci.tar"),
        "sbom.cdx.json".to_owned(),
        "kms-operator.krew.yaml".to_owned(),
        "RELEASE_NOTES.md".to_owned(),
    ] {
        assert!(
            listed.contains(&format!("  {file}\n")),
            "{file} is not in SHA256SUMS"
        );
    }
    // The SBOM: every crate with version and licence; the dev KMS is not
    // in the image's binary.
    let sbom: Value =
        serde_json::from_slice(&std::fs::read(dir.join("sbom.cdx.json")).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    let components = sbom["components"].as_array().expect("components");
    for name in ["kube", "minijinja", "sled", "tokio", "rustls"] {
        let c = components
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not in the SBOM"));
        assert!(c["version"].as_str().is_some_and(|v| !v.is_empty()), "{c}");
        assert!(c["licenses"][0]["expression"].is_string(), "{c}");
    }
    assert!(
        components.iter().all(|c| c["name"] != "kms-devserver"),
        "the dev KMS is in the image's SBOM"
    );
    assert!(
        components.iter().all(|c| c["licenses"].is_array()),
        "a crate without a licence in the SBOM"
    );
    // The CRDs, the chart index, the krew manifest, the notes.
    let crds = std::fs::read_to_string(dir.join("crds.yaml")).unwrap();
    assert_eq!(crds.matches("kind: CustomResourceDefinition").count(), 4);
    let index = std::fs::read_to_string(dir.join("index.yaml")).unwrap();
    assert!(index.contains(&format!("version: {version}")), "{index}");
    let cli = format!("kms-operator-{version}-linux-amd64.tar.gz");
    let cli_sha = Command::new("sha256sum")
        .arg(dir.join(&cli))
        .output()
        .unwrap();
    let cli_sha = String::from_utf8_lossy(&cli_sha.stdout);
    let krew = std::fs::read_to_string(dir.join("kms-operator.krew.yaml")).unwrap();
    assert!(
        krew.contains(&format!(
            "sha256: {}",
            cli_sha.split_whitespace().next().unwrap()
        )),
        "{krew}"
    );
    assert!(krew.contains("bin: kubectl-kms"), "{krew}");
    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(dir.join(&cli))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for f in ["./kms-operator", "./kubectl-kms", "./LICENSE"] {
        assert!(
            listing.lines().any(|l| l == f),
            "{f} is not in {cli}: {listing}"
        );
    }
    let notes = std::fs::read_to_string(dir.join("RELEASE_NOTES.md")).unwrap();
    assert!(
        notes.contains(&release_digest(version)),
        "the notes do not give the digest"
    );
}

/// The pushed image's signature (`cosign`, `KMS_COSIGN`) verifies with
/// the release's key (`KMS_RELEASE_DIR/cosign.pub`), and not with another.
fn verify_signature(digest: &str) {
    let cosign = std::env::var("KMS_COSIGN")
        .expect("KMS_COSIGN: the cosign binary scripts/test.sh signed the release with");
    let image = format!("{}/kms-operator@{digest}", registry());
    let verify = |key: &Path| {
        Command::new(&cosign)
            .args([
                "verify",
                "--insecure-ignore-tlog=true",
                "--allow-http-registry",
                "--key",
            ])
            .arg(key)
            .arg(&image)
            .output()
            .expect("cosign")
    };
    let ours = verify(&release_dir("").join("cosign.pub"));
    assert!(
        ours.status.success(),
        "cosign verify {image}: {}",
        String::from_utf8_lossy(&ours.stderr)
    );
    let other = std::env::temp_dir().join(format!("kms-node-cosign-{}", std::process::id()));
    std::fs::create_dir_all(&other).unwrap();
    let made = Command::new(&cosign)
        .args(["generate-key-pair", "--output-key-prefix", "other"])
        .env("COSIGN_PASSWORD", "")
        .current_dir(&other)
        .output()
        .unwrap();
    assert!(made.status.success());
    assert!(
        !verify(&other.join("other.pub")).status.success(),
        "the signature verifies with a key that did not make it"
    );
    let _ = std::fs::remove_dir_all(&other);
}

/// The digest every operator pod of `release` runs (the kubelet's
/// `imageID`), all alike.
async fn pulled_digests(client: &kube::Client, release: &str) -> BTreeSet<String> {
    pods(client, release)
        .await
        .iter()
        .filter_map(|p| {
            let id = p.status.as_ref()?.container_statuses.as_ref()?[0]
                .image_id
                .clone();
            id.rsplit_once('@').map(|(_, d)| d.to_owned())
        })
        .collect()
}

/// Serve the files of `dir` over HTTP on loopback (a classic chart
/// repository as `helm repo add` reads it); the address.
async fn serve_dir(dir: &Path) -> (String, tokio::task::JoinHandle<()>) {
    let dir = Arc::new(dir.to_path_buf());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let dir = dir.clone();
        async move {
            use axum::response::IntoResponse;
            let name = uri.path().trim_start_matches('/');
            if name.contains("..") || name.contains('/') {
                return axum::http::StatusCode::NOT_FOUND.into_response();
            }
            match std::fs::read(dir.join(name)) {
                Ok(bytes) => bytes.into_response(),
                Err(_) => axum::http::StatusCode::NOT_FOUND.into_response(),
            }
        }
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

/// A KmsSecret made now syncs through the installed release.
async fn syncs(client: &kube::Client, kms: &Kms, ns: &str, name: &str) {
    tenant(client, ns).await;
    let value = format!("{name}-{}", std::process::id());
    kms.set_secret("R", &value).await;
    kms_secret(client, ns, name, &format!("{name}-out"), "Owner", "1h").await;
    wait_value(
        client,
        ns,
        &format!("{name}-out"),
        "R",
        &value,
        Duration::from_secs(90),
    )
    .await;
}

/// 11. The release as users get it: its files check; `helm install` from
/// the OCI registry (the kubelet pulls the image from the registry: the
/// digest it runs is the release's); from a classic chart repository with
/// the image pinned by digest; the CRDs applied with `kubectl apply` and
/// the chart with `installCRDs=false`. Each time three pods are Ready and
/// a KmsSecret syncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_the_release_installs_as_users_install_it() {
    let started = Instant::now();
    let client = client().await;
    let version = release_version();
    let digest = release_digest(&version);
    check_release_files(&version);
    // Reproducible: a second release of the same commit has the same image.
    let again = release_dir(&format!("{version}-again"));
    if again.exists() {
        assert_eq!(
            release_digest(&format!("{version}-again")),
            digest,
            "two releases of the same commit have different image digests"
        );
    } else {
        panic!(
            "{} is missing: scripts/test.sh builds the release twice to compare",
            again.display()
        );
    }
    verify_signature(&digest);
    let kms = Kms::deploy_fresh(&client, &seed(&[("A", "1"), ("B", "x")])).await;
    uninstall("kms-scoped");
    uninstall(RELEASE_OCI);

    // From the OCI registry.
    let oci = format!("oci://{}/charts/secrets-operator", registry());
    install_chart(RELEASE_OCI, &oci, &version, &[]);
    wait_ready_pods(&client, RELEASE_OCI, 3, Duration::from_secs(180)).await;
    assert_eq!(
        pulled_digests(&client, RELEASE_OCI).await,
        BTreeSet::from([digest.clone()]),
        "the node runs another image than the release's"
    );
    syncs(&client, &kms, "node-release", "from-oci").await;
    println!(
        "installed from {oci} and synced after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    uninstall(RELEASE_OCI);

    // From a classic chart repository, the image pinned by digest.
    let (url, _server) = serve_dir(&release_dir(&version)).await;
    ok(
        "helm",
        &["repo", "add", "kms-release", &url, "--force-update"],
    );
    ok("helm", &["repo", "update", "kms-release"]);
    let pin = format!("controllerManager.manager.image.digest={digest}");
    install_chart(
        RELEASE_OCI,
        "kms-release/secrets-operator",
        &version,
        &[&pin],
    );
    wait_ready_pods(&client, RELEASE_OCI, 3, Duration::from_secs(180)).await;
    for p in pods(&client, RELEASE_OCI).await {
        let image = p.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap_or_default();
        assert!(image.ends_with(&format!("@{digest}")), "{image}");
    }
    syncs(&client, &kms, "node-release", "from-repo").await;
    uninstall(RELEASE_OCI);

    // The CRDs managed by hand: `kubectl apply -f crds.yaml`, then the
    // chart without them.
    let crds = release_dir(&version).join("crds.yaml");
    ok(
        "kubectl",
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().unwrap(),
        ],
    );
    install_chart(RELEASE_OCI, &oci, &version, &["installCRDs=false"]);
    wait_ready_pods(&client, RELEASE_OCI, 3, Duration::from_secs(180)).await;
    syncs(&client, &kms, "node-release", "crds-by-hand").await;
    uninstall(RELEASE_OCI);
    delete_namespaces(&client, &["node-release".to_owned()]).await;
    report("s11 the release as users install it", started.elapsed());
}

/// Delete namespaces and wait until they are gone: the resources in them
/// must not reach the scenarios that come next (an operator installed
/// meanwhile would sync them).
async fn delete_namespaces(client: &kube::Client, names: &[String]) {
    let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    wait_for(Duration::from_secs(300), || async {
        for name in names {
            if api.get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap_or_else(|| panic!("the namespaces {names:?} were not deleted"));
}

/// The release name of the release scenarios (the chart's fixed names are
/// shared, so one release at a time).
const RELEASE_OCI: &str = "kms";

/// Namespaces and KmsSecrets per namespace of the upgrade scenario.
const UPGRADE_NAMESPACES: usize = 20;
const UPGRADE_PER_NAMESPACE: usize = 50;

/// What the upgrade scenario watches while a roll runs: every managed
/// Secret keeps its data, every shard Lease stays held, the auto-reloaded
/// workload is not rolled.
struct Watch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Observed>,
}

#[derive(Debug, Default)]
struct Observed {
    /// Secrets seen empty or with a wrong value (namespace/name: value).
    wrong: BTreeMap<String, String>,
    /// The longest a shard Lease was seen expired or without a holder.
    longest_uncovered: Duration,
    /// Samples taken.
    samples: usize,
}

impl Watch {
    fn start(client: kube::Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = Observed::default();
            let mut uncovered_since: BTreeMap<String, Instant> = BTreeMap::new();
            let leases = Api::<Lease>::namespaced(client.clone(), RELEASE_NS);
            let mut every = kms_testkit::wait::every(Duration::from_millis(500));
            while !flag.load(Ordering::Relaxed) {
                for i in 0..UPGRADE_NAMESPACES {
                    let ns = format!("node-up-{i}");
                    let secrets =
                        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
                    let Ok(list) = secrets
                        .list(&ListParams::default().labels("secrets.hanzo.ai/managed=true"))
                        .await
                    else {
                        continue;
                    };
                    for s in list.items {
                        let a = s
                            .data
                            .as_ref()
                            .and_then(|d| d.get("A"))
                            .map(|v| String::from_utf8_lossy(&v.0).into_owned());
                        if a.as_deref() != Some("1") {
                            seen.wrong.insert(
                                format!("{ns}/{}", s.metadata.name.unwrap_or_default()),
                                a.unwrap_or_else(|| "(none)".into()),
                            );
                        }
                    }
                }
                let now = k8s_openapi::jiff::Timestamp::now();
                let mut shards = 0;
                for l in leases
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    let Some(name) = l.metadata.name.clone().filter(|n| n.contains("-shard-"))
                    else {
                        continue;
                    };
                    shards += 1;
                    let spec = l.spec.unwrap_or_default();
                    let valid = spec
                        .holder_identity
                        .as_deref()
                        .is_some_and(|h| !h.is_empty())
                        && spec.renew_time.as_ref().is_some_and(|t| {
                            let secs = spec.lease_duration_seconds.unwrap_or(10);
                            t.0.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                                secs.into(),
                            ))
                            .is_ok_and(|end| end > now)
                        });
                    if valid {
                        if let Some(since) = uncovered_since.remove(&name) {
                            seen.longest_uncovered = seen.longest_uncovered.max(since.elapsed());
                        }
                    } else {
                        uncovered_since.entry(name).or_insert_with(Instant::now);
                    }
                }
                assert!(shards > 0 || seen.samples == 0, "no shard Lease");
                for since in uncovered_since.values() {
                    seen.longest_uncovered = seen.longest_uncovered.max(since.elapsed());
                }
                seen.samples += 1;
                // The sampling period of the checks.
                every.tick().await;
            }
            seen
        });
        Self { stop, task }
    }

    async fn finish(self) -> Observed {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Whether every shard Lease is held by a pod of the release, each pod
/// holding its share (16 shards over 3 pods: 5 or 6).
async fn balanced(client: &kube::Client) -> bool {
    let names: BTreeSet<String> = pods(client, RELEASE_OCI)
        .await
        .into_iter()
        .filter(ready)
        .filter_map(|p| p.metadata.name)
        .collect();
    let leases = Api::<Lease>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    for l in leases.iter().filter(|l| {
        l.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.contains("-shard-"))
    }) {
        let holder = l
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        if !names.contains(&holder) {
            return false;
        }
        *held.entry(holder).or_default() += 1;
    }
    names.len() == 3 && held.len() == 3 && held.values().all(|n| (5..=6).contains(n))
}

/// The pod template's restart stamp of the auto-reloaded Deployment.
async fn reload_stamp(client: &kube::Client) -> Option<String> {
    let d = Api::<Deployment>::namespaced(client.clone(), "node-up-0")
        .get("consumer")
        .await
        .ok()?;
    Some(
        d.spec
            .template
            .metadata?
            .annotations
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.contains("restartedAt") || k.contains("secrets.hanzo.ai"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// Roll `release` to `version` (`helm upgrade`) or back (`helm rollback`)
/// while the checks run; what they saw and the KMS requests it cost.
async fn roll(
    client: &kube::Client,
    kms: &Kms,
    step: &str,
    run_it: impl FnOnce() + Send + 'static,
) -> (Observed, (u64, u64), Duration) {
    // The operator's logins: all of them less the writer's, which logs in
    // for each change it makes.
    let requests = || async {
        let writes = kms.count("PATCH /api/v3/secrets/raw/:secretName").await
            + kms.count("POST /api/v3/secrets/raw/:secretName").await;
        (
            kms.count("POST /api/v1/auth/universal-auth/login")
                .await
                .saturating_sub(writes),
            kms.count("GET /api/v3/secrets/raw").await,
        )
    };
    let before = requests().await;
    let watch = Watch::start(client.clone());
    let t0 = Instant::now();
    tokio::task::spawn_blocking(run_it).await.unwrap();
    wait_ready_pods(client, RELEASE_OCI, 3, Duration::from_secs(180)).await;
    // The replicas settle: every shard held by a pod of the release, each
    // pod its share.
    wait_for(Duration::from_secs(60), || async {
        balanced(client).await.then_some(())
    })
    .await
    .expect("the shards did not settle on the new pods");
    let took = t0.elapsed();
    let seen = watch.finish().await;
    let after = requests().await;
    let cost = (after.0 - before.0, after.1 - before.1);
    println!(
        "{step}: {:.1} s, {} samples, longest shard uncovered {:?}, {} logins by the operator and {} fetches",
        took.as_secs_f64(),
        seen.samples,
        seen.longest_uncovered,
        cost.0,
        cost.1
    );
    (seen, cost, took)
}

/// 12. An upgrade from the previous release (installed from the registry)
/// to this one and a rollback, with 1,000 KmsSecrets synced and a value
/// changing every second: no managed Secret is ever empty or wrong, no
/// shard is uncovered longer than the Lease duration and a second, the
/// auto-reloaded workload does not roll, and the roll costs the KMS no
/// more than what was due (the default emptyDir cache: the resources'
/// due times come from their statuses, so nothing is fetched that was
/// not due; the logins of restarted pods are printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_upgrade_and_rollback_lose_nothing() {
    let started = Instant::now();
    let client = client().await;
    let (previous, version) = (previous_version(), release_version());
    let kms = Kms::deploy_fresh(&client, &seed(&[("A", "1"), ("B", "x")])).await;
    uninstall("kms-scoped");
    uninstall(RELEASE_OCI);
    let oci = format!("oci://{}/charts/secrets-operator", registry());
    install_chart(RELEASE_OCI, &oci, &previous, &[]);
    wait_ready_pods(&client, RELEASE_OCI, 3, Duration::from_secs(180)).await;
    assert_eq!(
        pulled_digests(&client, RELEASE_OCI).await,
        BTreeSet::from([release_digest(&previous)])
    );

    // 1,000 KmsSecrets (an hour's resync) and one listening for changes.
    for i in 0..UPGRADE_NAMESPACES {
        let ns = format!("node-up-{i}");
        tenant(&client, &ns).await;
        for j in 0..UPGRADE_PER_NAMESPACE {
            kms_secret(
                &client,
                &ns,
                &format!("s-{j}"),
                &format!("s-{j}-out"),
                "Owner",
                "1h",
            )
            .await;
        }
    }
    kms_secret(&client, "node-up-0", "live", "live-out", "Owner", "instant").await;
    let t0 = Instant::now();
    let synced = wait_for(Duration::from_secs(300), || async {
        let mut n = 0;
        for i in 0..UPGRADE_NAMESPACES {
            let list = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
                client.clone(),
                &format!("node-up-{i}"),
            )
            .list(&ListParams::default().labels("secrets.hanzo.ai/managed=true"))
            .await
            .ok()?;
            n += list.items.len();
        }
        (n > UPGRADE_NAMESPACES * UPGRADE_PER_NAMESPACE).then_some(n)
    })
    .await
    .expect("the 1,000 KmsSecrets did not sync");
    println!(
        "{synced} Secrets synced in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // A workload that reloads on a change of the Secret it reads.
    apply(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: consumer
  namespace: node-up-0
  annotations: {secrets.hanzo.ai/auto-reload: "true"}
spec:
  replicas: 1
  selector: {matchLabels: {app: consumer}}
  template:
    metadata: {labels: {app: consumer}}
    spec:
      containers:
      - name: pause
        image: localhost/pause:3.10
        imagePullPolicy: Never
        envFrom: [{secretRef: {name: s-0-out}}]
"#,
    );
    ok(
        "kubectl",
        &[
            "-n",
            "node-up-0",
            "rollout",
            "status",
            "deployment/consumer",
            "--timeout=120s",
        ],
    );
    let stamp = reload_stamp(&client).await;

    // A change a second to the listening resource, throughout.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (url, writing) = (kms.url.clone(), writing.clone());
        tokio::spawn(async move {
            let kms = Kms::at(&url);
            let mut i = 0;
            let mut every = kms_testkit::wait::every(Duration::from_secs(1));
            while writing.load(Ordering::Relaxed) {
                kms.set_secret("L", &format!("live-{i}")).await;
                i += 1;
                // The writer's pace (one change a second), not a wait.
                every.tick().await;
            }
            format!("live-{}", i - 1)
        })
    };

    let up = {
        let (oci, version) = (oci.clone(), version.clone());
        move || {
            install_chart(RELEASE_OCI, &oci, &version, &[]);
        }
    };
    let (upgraded, up_cost, up_took) = roll(
        &client,
        &kms,
        &format!("upgrade {previous} → {version}"),
        up,
    )
    .await;
    assert_eq!(
        pulled_digests(&client, RELEASE_OCI).await,
        BTreeSet::from([release_digest(&version)])
    );
    let back = || {
        ok(
            "helm",
            &[
                "rollback",
                RELEASE_OCI,
                "-n",
                RELEASE_NS,
                "--wait",
                "--timeout",
                "180s",
            ],
        );
    };
    let (rolled_back, back_cost, back_took) =
        roll(&client, &kms, &format!("rollback → {previous}"), back).await;
    assert_eq!(
        pulled_digests(&client, RELEASE_OCI).await,
        BTreeSet::from([release_digest(&previous)])
    );
    writing.store(false, Ordering::Relaxed);
    let last = writer.await.unwrap();
    wait_value(
        &client,
        "node-up-0",
        "live-out",
        "L",
        &last,
        Duration::from_secs(30),
    )
    .await;

    for (step, seen, cost, took) in [
        ("upgrade", &upgraded, up_cost, up_took),
        ("rollback", &rolled_back, back_cost, back_took),
    ] {
        assert!(
            seen.wrong.is_empty(),
            "{step}: Secrets seen empty or wrong: {:?}",
            seen.wrong
        );
        assert!(
            seen.longest_uncovered <= Duration::from_secs(11),
            "{step}: a shard was uncovered for {:?} (Lease 10 s + 1 s)",
            seen.longest_uncovered
        );
        // Nothing was due (an hour's resync): only the listening resource's
        // changes (one a second) are fetched, not the thousand others.
        let changes = took.as_secs() + 30;
        assert!(
            cost.1 <= 2 * changes,
            "{step}: {} fetches in {took:?} with nothing due but one change a second",
            cost.1
        );
        // A restarted pod (no persistent cache here) logs in once it has
        // something to fetch; nothing else does.
        assert!(cost.0 <= 10, "{step}: {} logins by the operator", cost.0);
    }
    assert_eq!(
        reload_stamp(&client).await,
        stamp,
        "the upgrade rolled the auto-reloaded workload"
    );
    uninstall(RELEASE_OCI);
    let names: Vec<String> = (0..UPGRADE_NAMESPACES)
        .map(|i| format!("node-up-{i}"))
        .collect();
    delete_namespaces(&client, &names).await;
    report("s12 upgrade and rollback lose nothing", started.elapsed());
}
