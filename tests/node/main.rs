//! The product as users run it, on a real node: the Helm chart's
//! StatefulSet of operator pods (the release image `scripts/release.sh`
//! pushed to the node's registry, pulled by containerd),
//! the chart's probes, RBAC and PodDisruptionBudget, rolling upgrades,
//! pod deletions and container kills, the garbage collector, persistent
//! volumes, and auto-reload of real Deployments and StatefulSets. The dev
//! KMS runs as a pod too, reached by its Service name.
//!
//! Needs `KUBECONFIG` of `tests/testenv/testenv up DIR --node`, the
//! releases `KMS_RELEASE_VERSION` and `KMS_RELEASE_PREVIOUS` built into
//! `KMS_RELEASE_DIR` and pushed to the node's registry
//! (`scripts/release.sh VERSION --out DIR/VERSION --push REGISTRY`), and
//! the dev KMS image `localhost/kms-operator:dev` imported
//! (`scripts/image.sh --tag dev --import DIR`); see docs/testing.md. The scenarios share the node and run in order
//! (`--test-threads=1`): `s0_…` (the image against the Dockerfile) and
//! `s1_…` to `s14_…`; each prints how long it took.
//! Any one can run alone: it installs what it needs.

mod gradual;
mod harness;
mod image;
mod prometheus;
mod release;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::*;
use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Event, PersistentVolume, Pod, Secret};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, PostParams};
use kube::core::DynamicObject;
use prometheus::Prometheus;
use serde_json::json;

/// The release of the default install.
const RELEASE: &str = "kms";

/// The default install (chart defaults, our image, the in-cluster KMS),
/// installed when it is not running; the dev KMS deployed too.
async fn default_install(client: &kube::Client) -> Kms {
    let kms = Kms::deploy(client, &seed(&[("A", "1"), ("B", "x")])).await;
    // An earlier scenario that stopped half-way may have left fewer
    // replicas (s9 and s13 scale the StatefulSet).
    let _ = run(
        "kubectl",
        &[
            "-n",
            RELEASE_NS,
            "scale",
            &format!("statefulset/{}-controller-manager", fullname(RELEASE)),
            "--replicas=3",
        ],
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let ours = sts.iter().any(|s| {
        s.spec.template.spec.as_ref().is_some_and(|p| {
            p.containers
                .iter()
                .any(|c| c.image.as_deref() == Some(operator_image(&release_version()).as_str()))
        })
    });
    // Installed with the defaults: a scenario that stopped half-way may have
    // left the release with values of its own (s10's `replicaCount=0`,
    // which the helm test of s13 would then read).
    let defaults = run(
        "helm",
        &["get", "values", RELEASE, "-n", RELEASE_NS, "-o", "json"],
    )
    .ok()
    .and_then(|v| serde_json::from_str::<serde_json::Value>(&v).ok())
    .is_some_and(|v| {
        let keys = |v: &serde_json::Value| -> BTreeSet<String> {
            v.as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        let set = |k: &[&str]| -> BTreeSet<String> { k.iter().map(|s| (*s).to_owned()).collect() };
        keys(&v) == set(&["controllerManager", "hostAPI"])
            && keys(&v["controllerManager"]) == set(&["manager"])
            && keys(&v["controllerManager"]["manager"]) == set(&["image"])
    });
    let ours = ours && defaults;
    if !ours {
        // The scoped release of scenario 8 shares the chart's fixed names.
        uninstall("kms-scoped");
        uninstall(RELEASE);
        install(RELEASE, &release_version(), &[]);
    }
    wait_ready_pods(client, RELEASE, 3, Duration::from_secs(180)).await;
    kms
}

/// 1. `helm install` with the chart's defaults (but the image and the KMS
/// address): three pods Ready through the chart's probes within 120 s,
/// sixteen shard Leases held 6/5/5, no ERROR in the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_install_three_replicas_ready_with_shards_split() {
    let started = Instant::now();
    let client = client().await;
    let _kms = Kms::deploy(&client, &seed(&[("A", "1"), ("B", "x")])).await;
    uninstall(RELEASE);
    uninstall("kms-scoped");
    let installed = install(RELEASE, &release_version(), &[]);
    let ready = wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(120)).await;
    println!(
        "installed and Ready in {:.1} s (+{:.1} s)",
        installed.as_secs_f64(),
        ready.as_secs_f64()
    );
    assert!(
        installed + ready < Duration::from_secs(120),
        "pods Ready after {:?}",
        installed + ready
    );
    let holders = wait_for(Duration::from_secs(60), || async {
        let h = shard_holders(&client, RELEASE).await;
        (h.len() == 16 && spread(&h) == [6, 5, 5]).then_some(h)
    })
    .await;
    let Some(holders) = holders else {
        panic!(
            "shards not held 6/5/5: {:?}",
            spread(&shard_holders(&client, RELEASE).await)
        );
    };
    let pod_names: BTreeSet<String> = pods(&client, RELEASE)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(
        holders.values().all(|h| pod_names.contains(h)),
        "{holders:?} vs {pod_names:?}"
    );
    for pod in &pod_names {
        let errors = errors(&logs(pod));
        assert!(errors.is_empty(), "{pod} logged errors: {errors:#?}");
    }
    report("s1 install (criterion 1)", started.elapsed());
}

/// 2. KmsSecrets in several namespaces sync from inside the pods: in-cluster
/// configuration, the ServiceAccount's token, the chart's RBAC, the KMS by
/// Service name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_resources_sync_from_the_pods() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    kms.set_secret("A", "from-the-pods").await;
    for ns in ["node-a", "node-b", "node-c"] {
        tenant(&client, ns).await;
        let _ = kms_secrets(&client, ns)
            .delete("app", &DeleteParams::default())
            .await;
        wait_for(Duration::from_secs(30), || async {
            kms_secrets(&client, ns)
                .get_opt("app")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
        kms_secret(&client, ns, "app", "app-out", "Owner", "5s").await;
    }
    for ns in ["node-a", "node-b", "node-c"] {
        let took = wait_value(
            &client,
            ns,
            "app-out",
            "A",
            "from-the-pods",
            Duration::from_secs(60),
        )
        .await;
        println!("{ns}: synced after {:.1} s", took.as_secs_f64());
    }
    report("s2 sync (criterion 2)", started.elapsed());
}

/// 3. Readiness is honest: a replica is Ready only once its workers run,
/// and it becomes Ready although its initial lists are slow (thousands of
/// objects in its caches) and probes hit it from its first second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_readiness_waits_for_the_workers_through_slow_lists() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    // Many objects the operator lists at start: 3,000 managed ConfigMaps of
    // 24 KiB (72 MiB in its caches), so each replica's initial lists take
    // seconds while the kubelet probes it every second.
    let ns = "node-bulk";
    namespace(&client, ns).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let have = cms
        .list(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .remaining_item_count
        .unwrap_or(0);
    let big = cms
        .get_opt("bulk-0")
        .await
        .unwrap()
        .and_then(|c| c.data)
        .is_some_and(|d| d.get("filler").is_some_and(|f| f.len() >= 24 * 1024));
    if have < 2500 || !big {
        let items: Vec<serde_json::Value> = (0..3000)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("bulk-{i}"), "namespace": ns, "labels": {"secrets.hanzo.ai/managed": "true"}},
                    "data": {"filler": "x".repeat(24 * 1024)}})
            })
            .collect();
        apply(
            &serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
                .unwrap(),
        );
    }
    // Probes from the first second, every second; besides the kubelet's,
    // the test's own every 20 ms from the host (the lists take about half
    // a second here: one kubelet probe per second may fall before the
    // server listens and the next after the workers started).
    let roll_started = k8s_openapi::jiff::Timestamp::now();
    let prober = probe_new_pods(client.clone(), roll_started);
    let roll = roll_started.to_string();
    tokio::task::spawn_blocking(move || {
        install(
            RELEASE,
            &release_version(),
            &[
                "controllerManager.manager.readinessProbe.initialDelaySeconds=0",
                "controllerManager.manager.readinessProbe.periodSeconds=1",
                "controllerManager.manager.readinessProbe.failureThreshold=1",
                // A new roll even when the values are those of a previous run.
                &format!("controllerManager.podAnnotations.roll={roll}"),
            ],
        )
    })
    .await
    .unwrap();
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(180)).await;
    STOP_PROBES.store(true, std::sync::atomic::Ordering::Relaxed);
    let probed = prober.await.unwrap();
    // Every pod: started after the upgrade, probed and refused while it
    // listed, Ready only after its workers started.
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut refused_during_lists = 0;
    for pod in pods(&client, RELEASE).await {
        let name = pod.metadata.name.clone().unwrap();
        let started_at = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .unwrap()
            .0;
        assert!(
            started_at >= roll_started,
            "{name} was not restarted by the upgrade"
        );
        // A 503 is a probe answered while the lists were still running
        // (before the server listened, probes are refused by the kernel).
        refused_during_lists += events
            .iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(&name)
                    && e.reason.as_deref() == Some("Unhealthy")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("Readiness probe failed") && m.contains("503"))
                    && e.last_timestamp
                        .as_ref()
                        .is_some_and(|t| t.0 >= roll_started)
            })
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>();
        let ready_at = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_transition_time.clone())
            .unwrap()
            .0;
        let log = logs(&name);
        let workers_at = log
            .lines()
            .filter(|l| l.contains("workers started; ready"))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                v["timestamp"]
                    .as_str()?
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .ok()
            })
            .next_back()
            .unwrap_or_else(|| panic!("{name}: no 'workers started' in its log"));
        // Conditions are kept in whole seconds.
        assert!(
            workers_at.as_second() <= ready_at.as_second(),
            "{name}: Ready at {ready_at}, workers started at {workers_at}"
        );
        // The host's own probes: 503 until the workers started, then 200.
        let own = probed
            .get(&name)
            .unwrap_or_else(|| panic!("{name} was never probed by the test"));
        let first_ok = own
            .first_ok
            .unwrap_or_else(|| panic!("{name}: /readyz never answered 200 to the test"));
        assert!(
            first_ok >= workers_at,
            "{name}: /readyz answered 200 at {first_ok}, before its workers started at {workers_at}"
        );
        println!(
            "{name}: 503 × {} from the test, first 200 {} ms after the workers started",
            own.refused,
            first_ok.as_millisecond() - workers_at.as_millisecond()
        );
        refused_during_lists += own.refused;
    }
    assert!(
        refused_during_lists > 0,
        "no readiness probe was answered 503 while a replica listed: the lists were not slow"
    );
    println!("readiness probes answered 503 during the lists: {refused_during_lists}");
    // And they work: a change reaches its Secret. The resource resyncs
    // every minute and may have just synced at start, so it is asked to
    // sync now (`force-sync`) rather than waited for.
    tenant(&client, "node-a").await;
    kms_secret(&client, "node-a", "app", "app-out", "Owner", "1m").await;
    kms.set_secret("A", "after-slow-start").await;
    let _ = kms_secrets(&client, "node-a")
        .patch(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"secrets.hanzo.ai/force-sync": "after-slow-start"}}}),
            ),
        )
        .await;
    wait_value(
        &client,
        "node-a",
        "app-out",
        "A",
        "after-slow-start",
        Duration::from_secs(60),
    )
    .await;
    // The bulk goes (one delete-collection call): later scenarios start
    // replicas with light lists again.
    cms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    report("s3 readiness (criterion 3)", started.elapsed());
}

/// Stops [`probe_new_pods`].
static STOP_PROBES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the test's own probes of one pod's `/readyz` saw.
#[derive(Debug, Default)]
struct Probed {
    /// Answers 503.
    refused: i32,
    /// When it first answered 200.
    first_ok: Option<k8s_openapi::jiff::Timestamp>,
}

/// Probe `/readyz` of every operator pod started since `since`, from the
/// host every 20 ms (as the kubelet does, but faster), until it answers 200
/// or [`STOP_PROBES`] is set; by pod name.
fn probe_new_pods(
    client: kube::Client,
    since: k8s_openapi::jiff::Timestamp,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, Probed>> {
    use std::sync::atomic::Ordering::Relaxed;
    STOP_PROBES.store(false, Relaxed);
    tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let mut probes = tokio::task::JoinSet::new();
        let mut seen = BTreeSet::new();
        // How soon a new pod is probed: a sampling period, not a wait.
        let mut every = kms_testkit::wait::every(Duration::from_millis(50));
        while !STOP_PROBES.load(Relaxed) {
            for pod in pods(&client, RELEASE).await {
                let (Some(name), Some(status)) = (pod.metadata.name, pod.status) else {
                    continue;
                };
                let (Some(ip), Some(start)) = (status.pod_ip, status.start_time) else {
                    continue;
                };
                if start.0 < since || !seen.insert(name.clone()) {
                    continue;
                }
                let http = http.clone();
                probes.spawn(async move {
                    let url = format!("http://{ip}:8081/readyz");
                    let mut probed = Probed::default();
                    let mut every = kms_testkit::wait::every(Duration::from_millis(20));
                    while !STOP_PROBES.load(Relaxed) {
                        match http.get(&url).send().await.map(|r| r.status().as_u16()) {
                            Ok(200) => {
                                probed.first_ok = Some(k8s_openapi::jiff::Timestamp::now());
                                break;
                            }
                            Ok(503) => probed.refused += 1,
                            // Not listening yet, or another answer: the
                            // assertions judge.
                            _ => {}
                        }
                        // The probe period: the answers are counted, not awaited.
                        every.tick().await;
                    }
                    (name, probed)
                });
            }
            every.tick().await;
        }
        probes.join_all().await.into_iter().collect()
    })
}

/// Watch managed Secrets' data in `namespaces` until stopped: any Secret
/// that loses its data or disappears is reported.
fn watch_nothing_emptied(
    client: kube::Client,
    namespaces: Vec<String>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut violations = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
        let mut every = kms_testkit::wait::every(Duration::from_millis(300));
        while Instant::now() < deadline {
            for ns in &namespaces {
                let api: Api<Secret> = Api::namespaced(client.clone(), ns);
                if let Ok(list) = api
                    .list(&ListParams::default().labels("secrets.hanzo.ai/managed=true"))
                    .await
                {
                    let now: BTreeSet<(String, String)> = list
                        .items
                        .iter()
                        .map(|s| (ns.clone(), s.metadata.name.clone().unwrap_or_default()))
                        .collect();
                    for gone in seen.iter().filter(|k| &k.0 == ns && !now.contains(*k)) {
                        violations.push(format!("{}/{} deleted", gone.0, gone.1));
                    }
                    for s in &list.items {
                        if s.data.as_ref().is_none_or(|d| d.is_empty()) {
                            violations.push(format!(
                                "{ns}/{} emptied",
                                s.metadata.name.clone().unwrap_or_default()
                            ));
                        }
                    }
                    seen.retain(|k| &k.0 != ns);
                    seen.extend(now);
                }
            }
            if violations.len() > 20 || client_stop() {
                break;
            }
            // A watch over the whole scenario: its sampling period.
            every.tick().await;
        }
        violations
    })
}

static STOP_WATCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn client_stop() -> bool {
    STOP_WATCH.load(std::sync::atomic::Ordering::Relaxed)
}

/// 4. A pod deleted (graceful: the StatefulSet recreates it) and a container
/// killed with SIGKILL (the kubelet restarts it): shards move and come
/// back, a KMS change made meanwhile reaches its Secret, nothing is emptied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_pod_deletion_and_container_kill_lose_nothing() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    // Instant updates: a change reaches its Secret within seconds through
    // the owner's event stream, or through the full sync of a replica that
    // takes a shard over; not by waiting for a resync.
    for ns in ["node-a", "node-b", "node-c"] {
        tenant(&client, ns).await;
        kms_secret(&client, ns, "kills", "kills-out", "Owner", "instant").await;
    }
    kms.set_secret("A", "before-kills").await;
    for ns in ["node-a", "node-b", "node-c"] {
        wait_value(
            &client,
            ns,
            "kills-out",
            "A",
            "before-kills",
            Duration::from_secs(45),
        )
        .await;
    }
    let before = wait_for(Duration::from_secs(60), || async {
        let h = shard_holders(&client, RELEASE).await;
        (h.len() == 16 && spread(&h) == [6, 5, 5]).then_some(h)
    })
    .await
    .expect("shards not settled");
    STOP_WATCH.store(false, std::sync::atomic::Ordering::Relaxed);
    let watcher = watch_nothing_emptied(
        client.clone(),
        vec!["node-a".into(), "node-b".into(), "node-c".into()],
    );
    let pod_names: Vec<String> = pods(&client, RELEASE)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();

    // Graceful deletion of one pod: its shards move to the others while it
    // is away, and come back to it (same name) when it returns.
    let victim = pod_names[1].clone();
    let owned_before: BTreeSet<String> = before
        .iter()
        .filter(|(_, h)| **h == victim)
        .map(|(s, _)| s.clone())
        .collect();
    Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let moved = wait_for(Duration::from_secs(60), || async {
        let h = shard_holders(&client, RELEASE).await;
        owned_before
            .iter()
            .all(|s| h.get(s).is_some_and(|o| *o != victim))
            .then_some(())
    })
    .await;
    assert!(moved.is_some(), "the deleted pod's shards did not move");
    kms.set_secret("A", "during-deletion").await;
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(120)).await;
    for ns in ["node-a", "node-b", "node-c"] {
        wait_value(
            &client,
            ns,
            "kills-out",
            "A",
            "during-deletion",
            Duration::from_secs(45),
        )
        .await;
    }

    // SIGKILL of another pod's operator process: the kubelet restarts the
    // container, the others take its shards once its Leases expire.
    let killed = pod_names[2].clone();
    let restarts = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum::<i32>())
    };
    let pod_api = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let before_kill = restarts(&pod_api.get(&killed).await.unwrap());
    let pid = kms_testkit::node::operator_process(RELEASE_NS, &killed)
        .unwrap_or_else(|| panic!("no operator process of {killed} on this host"));
    let kill = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    kms.set_secret("A", "after-kill").await;
    wait_for(Duration::from_secs(90), || async {
        let p = pod_api.get(&killed).await.ok()?;
        (restarts(&p) > before_kill && ready(&p)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{killed} was not restarted by the kubelet"));
    for ns in ["node-a", "node-b", "node-c"] {
        wait_value(
            &client,
            ns,
            "kills-out",
            "A",
            "after-kill",
            Duration::from_secs(45),
        )
        .await;
    }
    // Sticky: once everyone is back, every shard is with its owner of before.
    let back = wait_for(Duration::from_secs(90), || async {
        let h = shard_holders(&client, RELEASE).await;
        (h == before).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "shards did not return: {:?}",
        shard_holders(&client, RELEASE).await
    );
    STOP_WATCH.store(true, std::sync::atomic::Ordering::Relaxed);
    let violations = watcher.await.unwrap();
    assert!(violations.is_empty(), "{violations:#?}");
    report("s4 pod kills (criterion 4)", started.elapsed());
}

/// 7. Auto-reload on a real Deployment and StatefulSet: exactly one new
/// ReplicaSet / revision per real change of a Secret they use, none for a
/// resync that changed nothing or for an unrelated Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_auto_reload_rolls_real_workloads_once_per_change() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    let ns = "node-reload";
    tenant(&client, ns).await;
    kms.set_secret("A", "reload-1").await;
    // A resync every 5 s: unchanged resyncs happen while we watch.
    kms_secret(&client, ns, "app", "app-out", "Owner", "5s").await;
    wait_value(
        &client,
        ns,
        "app-out",
        "A",
        "reload-1",
        Duration::from_secs(60),
    )
    .await;
    let workload = |kind: &str| {
        let extra = if kind == "StatefulSet" {
            "serviceName: web\n  "
        } else {
            ""
        };
        format!(
            r#"apiVersion: apps/v1
kind: {kind}
metadata:
  name: web-{lower}
  namespace: {ns}
  annotations: {{secrets.hanzo.ai/auto-reload: "true"}}
spec:
  {extra}replicas: 1
  selector: {{matchLabels: {{app: web-{lower}}}}}
  template:
    metadata: {{labels: {{app: web-{lower}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: pause
        image: localhost/pause:3.10
        imagePullPolicy: Never
        env: [{{name: A, valueFrom: {{secretKeyRef: {{name: app-out, key: A}}}}}}]
"#,
            lower = kind.to_lowercase()
        )
    };
    // Fresh workloads (their revision numbers start at 1).
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let _ = deployments
        .delete("web-deployment", &DeleteParams::foreground())
        .await;
    let _ = statefulsets
        .delete("web-statefulset", &DeleteParams::foreground())
        .await;
    wait_for(Duration::from_secs(60), || async {
        (deployments.get_opt("web-deployment").await.ok()?.is_none()
            && statefulsets
                .get_opt("web-statefulset")
                .await
                .ok()?
                .is_none())
        .then_some(())
    })
    .await
    .expect("the old workloads did not go");
    apply(&workload("Deployment"));
    apply(&workload("StatefulSet"));
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let rev_api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    // The newest revision of each: a new ReplicaSet (or StatefulSet
    // revision) per rollout, whatever the history limits keep.
    let counts = || async {
        let rs = rs_api
            .list(&ListParams::default().labels("app=web-deployment"))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter_map(|r| {
                        r.metadata
                            .annotations
                            .as_ref()?
                            .get("deployment.kubernetes.io/revision")?
                            .parse::<i64>()
                            .ok()
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        let revs = rev_api
            .list(&ListParams::default().labels("app=web-statefulset"))
            .await
            .map(|l| l.items.iter().filter_map(|r| r.revision).max().unwrap_or(0))
            .unwrap_or(0);
        (rs, revs)
    };
    // Settled: the operator stamps each workload once when it first sees it
    // (that roll is the first change of the template), then nothing moves
    // for 8 s.
    let settled = wait_for(Duration::from_secs(90), || async {
        let c1 = counts().await;
        if c1.0 < 1 || c1.1 < 1 {
            return None;
        }
        let held = holds_for(Duration::from_secs(8), || async { counts().await == c1 }).await;
        held.ok().map(|()| c1)
    })
    .await
    .expect("the workloads did not settle");
    // An unrelated Secret changes, and the resource resyncs (every 5 s)
    // without a change: no rollout.
    let plain: Secret = serde_json::from_value(
        json!({"metadata": {"name": "unrelated"}, "stringData": {"x": "1"}}),
    )
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let _ = secrets.create(&PostParams::default(), &plain).await;
    let _ = secrets
        .patch(
            "unrelated",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"stringData": {"x": "2"}})),
        )
        .await;
    let held = holds_for(Duration::from_secs(12), || async {
        counts().await == settled
    })
    .await;
    if let Err(when) = held {
        panic!(
            "a rollout without a change, {when}: {settled:?} → {:?}",
            counts().await
        );
    }
    // A real change: exactly one new ReplicaSet and one new revision.
    kms.set_secret("A", "reload-2").await;
    wait_value(
        &client,
        ns,
        "app-out",
        "A",
        "reload-2",
        Duration::from_secs(60),
    )
    .await;
    let rolled = wait_for(Duration::from_secs(60), || async {
        let c = counts().await;
        (c == (settled.0 + 1, settled.1 + 1)).then_some(c)
    })
    .await;
    let Some(rolled) = rolled else {
        panic!(
            "not exactly one rollout each: {settled:?} → {:?}",
            counts().await
        );
    };
    let held = holds_for(Duration::from_secs(12), || async {
        counts().await == rolled
    })
    .await;
    if let Err(when) = held {
        panic!(
            "more rollouts than changes, {when}: {rolled:?} → {:?}",
            counts().await
        );
    }
    // The new pods have the new value.
    let deploy: Deployment = Api::namespaced(client.clone(), ns)
        .get("web-deployment")
        .await
        .unwrap();
    let stamp = deploy
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get("secrets.hanzo.ai/managed-secret.app-out").cloned());
    assert!(stamp.is_some(), "no reload stamp on the pod template");
    report("s5 auto-reload (criterion 7)", started.elapsed());
}

/// 8. `creationPolicy: Owner`: deleting the KmsSecret makes the garbage
/// collector delete its Secret; `Orphan` keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_garbage_collection_follows_the_creation_policy() {
    let started = Instant::now();
    let client = client().await;
    let _kms = default_install(&client).await;
    let ns = "node-gc";
    tenant(&client, ns).await;
    for name in ["owned", "orphan"] {
        let _ = kms_secrets(&client, ns)
            .delete(name, &DeleteParams::default())
            .await;
        let _ = Api::<Secret>::namespaced(client.clone(), ns)
            .delete(&format!("{name}-out"), &DeleteParams::default())
            .await;
    }
    wait_for(Duration::from_secs(30), || async {
        let l = kms_secrets(&client, ns)
            .list(&ListParams::default())
            .await
            .ok()?;
        l.items.is_empty().then_some(())
    })
    .await;
    for (name, policy) in [("owned", "Owner"), ("orphan", "Orphan")] {
        kms_secret(&client, ns, name, &format!("{name}-out"), policy, "1m").await;
    }
    for name in ["owned-out", "orphan-out"] {
        wait_for(Duration::from_secs(60), || async {
            secret_data(&client, ns, name).await
        })
        .await
        .unwrap_or_else(|| panic!("{name} not written"));
    }
    for name in ["owned", "orphan"] {
        kms_secrets(&client, ns)
            .delete(name, &DeleteParams::background())
            .await
            .unwrap();
    }
    let collected = wait_for(Duration::from_secs(60), || async {
        secret_data(&client, ns, "owned-out")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        collected.is_some(),
        "the Owner target was not garbage-collected"
    );
    let held = holds_for(Duration::from_secs(3), || async {
        secret_data(&client, ns, "orphan-out").await.is_some()
    })
    .await;
    if let Err(when) = held {
        panic!("the Orphan target was deleted, {when}");
    }
    report("s6 garbage collection (criterion 8)", started.elapsed());
}

/// 6. `helm upgrade` to a new image tag rolls the replicas one by one with
/// no change missed; with one replica down a second eviction is refused by
/// the PodDisruptionBudget; `helm uninstall` keeps the CRDs, the resources
/// and the managed Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_upgrade_rolls_one_by_one_the_pdb_holds_uninstall_keeps() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    // From the previous release: the roll below is a real upgrade.
    install(RELEASE, &previous_version(), &[]);
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(180)).await;
    // Instant updates: every change reaches the Secret within seconds, so
    // a change lost during the roll would show as a missing value, not be
    // hidden by a later resync.
    for ns in ["node-a", "node-b"] {
        tenant(&client, ns).await;
        kms_secret(&client, ns, "roll", "roll-out", "Owner", "instant").await;
    }
    // One change a second until the roll is over (the writer returns the
    // last value it wrote); the lowest number of Ready pods seen meanwhile
    // is recorded.
    let rolled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let url = kms.url.clone();
        let rolled = rolled.clone();
        tokio::spawn(async move {
            let kms = Kms::at(&url);
            let mut i = 0;
            let mut every = kms_testkit::wait::every(Duration::from_secs(1));
            loop {
                let value = format!("roll-{i}");
                kms.set_secret("A", &value).await;
                if rolled.load(std::sync::atomic::Ordering::Relaxed) {
                    return (i + 1, value);
                }
                i += 1;
                // The writer's pace (one change a second), not a wait.
                every.tick().await;
            }
        })
    };
    // A dip counts when two samples in a row see it: in the one run of
    // about ten that saw a single sample of 1, the kubelet's log had a new
    // pod flip not-Ready and back to Ready within 1.5 ms while the
    // StatefulSet had moved on; that is the kubelet's, not the roll's. The
    // lowest single sample is printed.
    let min_ready = {
        let client = client.clone();
        let rolled = rolled.clone();
        tokio::spawn(async move {
            let (mut min, mut lowest, mut prev) = (usize::MAX, usize::MAX, usize::MAX);
            let mut every = kms_testkit::wait::every(Duration::from_millis(250));
            while !rolled.load(std::sync::atomic::Ordering::Relaxed) {
                let ps = pods(&client, RELEASE).await;
                let now = ps
                    .iter()
                    .filter(|p| ready(p) && p.metadata.deletion_timestamp.is_none())
                    .count();
                lowest = lowest.min(now);
                min = min.min(now.max(prev));
                prev = now;
                // The sampling period of the lowest Ready count.
                every.tick().await;
            }
            println!("lowest Ready count in one sample: {lowest}; held for two samples: {min}");
            min
        })
    };
    // `helm upgrade --wait` blocks for the whole roll: off the runtime's
    // threads, so the writer and the Ready sampler run throughout.
    tokio::task::spawn_blocking(|| install(RELEASE, &release_version(), &[]))
        .await
        .unwrap();
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(180)).await;
    println!(
        "rolled to {} after {:.1} s",
        release_version(),
        started.elapsed().as_secs_f64()
    );
    for p in pods(&client, RELEASE).await {
        let image = p
            .spec
            .as_ref()
            .map(|s| s.containers[0].image.clone().unwrap_or_default());
        assert_eq!(
            image.as_deref(),
            Some(operator_image(&release_version()).as_str()),
            "{:?}",
            p.metadata.name
        );
    }
    rolled.store(true, std::sync::atomic::Ordering::Relaxed);
    let (changes, last) = writer.await.unwrap();
    let written = started.elapsed();
    for ns in ["node-a", "node-b"] {
        wait_value(&client, ns, "roll-out", "A", &last, Duration::from_secs(30)).await;
    }
    println!(
        "{changes} changes during the roll; the last written after {:.1} s, in its Secrets {:.1} s later",
        written.as_secs_f64(),
        (started.elapsed() - written).as_secs_f64()
    );
    let min = min_ready.await.unwrap();
    assert!(
        min >= 2,
        "{min} Ready pods for two samples in a row during the roll (one at a time keeps two)"
    );

    // The PodDisruptionBudget: one replica down (evicted; the node is
    // cordoned, so it stays Pending), a second eviction refused.
    let pod_api = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let names: Vec<String> = pods(&client, RELEASE)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let node = ok(
        "kubectl",
        &["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"],
    );
    ok("kubectl", &["cordon", &node]);
    pod_api
        .evict(&names[0], &EvictParams::default())
        .await
        .expect("the first eviction");
    let pdbs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        RELEASE_NS,
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("policy", "v1", "PodDisruptionBudget"),
            "poddisruptionbudgets",
        ),
    );
    wait_for(Duration::from_secs(30), || async {
        let l = pdbs.list(&ListParams::default()).await.ok()?;
        l.items
            .iter()
            .any(|p| p.data["status"]["disruptionsAllowed"] == 0)
            .then_some(())
    })
    .await
    .expect("the PodDisruptionBudget never counted the evicted pod");
    let refused = pod_api.evict(&names[1], &EvictParams::default()).await;
    ok("kubectl", &["uncordon", &node]);
    match refused {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("the second eviction was not refused: {other:?}"),
    }
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(120)).await;

    println!(
        "eviction refused, pods back after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Uninstall keeps CRDs, resources and Secrets.
    uninstall(RELEASE);
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
            ),
            "customresourcedefinitions",
        ),
    );
    for crd in [
        "kmssecrets.secrets.hanzo.ai",
        "kmspushsecrets.secrets.hanzo.ai",
        "kmsdynamicsecrets.secrets.hanzo.ai",
    ] {
        assert!(
            crds.get_opt(crd).await.unwrap().is_some(),
            "{crd} was deleted"
        );
    }
    for ns in ["node-a", "node-b"] {
        assert!(
            kms_secrets(&client, ns)
                .get_opt("roll")
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(
            secret_data(&client, ns, "roll-out")
                .await
                .and_then(|d| d.get("A").cloned())
                .as_deref(),
            Some(last.as_str())
        );
    }
    report(
        "s7 upgrade, PDB, uninstall (criterion 6)",
        started.elapsed(),
    );
}

/// 5. With persistent volumes (static hostPath PersistentVolumes on the
/// node), a pod restart makes no login and no fetch for resources not due;
/// installed namespace-scoped, so the scoped RBAC is exercised from a pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_persistent_cache_and_scoped_install_restart_for_free() {
    let started = Instant::now();
    let client = client().await;
    let kms = Kms::deploy_fresh(&client, &seed(&[("A", "1"), ("B", "x")])).await;
    uninstall(RELEASE);
    uninstall("kms-scoped");
    let ns = "node-scoped";
    tenant(&client, ns).await;
    // Three static PersistentVolumes on the node (the claims of an earlier
    // run go first: a bound volume is not deleted while its claim exists).
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), RELEASE_NS);
    let _ = pvcs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    wait_for(Duration::from_secs(60), || async {
        pvcs.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await
    .expect("old claims did not go");
    for i in 0..3 {
        let name = format!("kms-node-pv-{i}");
        let _ = pv_api.delete(&name, &DeleteParams::default()).await;
        wait_for(Duration::from_secs(60), || async {
            pv_api.get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("the old volume {name} did not go"));
        let dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::process::Command::new("chmod")
            .args(["0777", dir.to_str().unwrap()])
            .status()
            .unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": "kms-node-static", "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": dir, "type": "Directory"}}
        }))
        .unwrap();
        pv_api.create(&PostParams::default(), &pv).await.unwrap();
    }
    // The documented namespace of `kms-config`, which users create: a
    // scoped install grants read access there (it may exist already).
    let _ = run("kubectl", &["create", "namespace", "kms-operator-system"]);
    install(
        "kms-scoped",
        &release_version(),
        &[
            "scopedRBAC=true",
            &format!("scopedNamespaces={{{ns}}}"),
            "installCRDs=false",
            "cache.persistence.enabled=true",
            "cache.persistence.storageClass=kms-node-static",
        ],
    );
    wait_ready_pods(&client, "kms-scoped", 3, Duration::from_secs(180)).await;
    // The resources of an earlier run go first.
    let _ = kms_secrets(&client, ns)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    wait_for(Duration::from_secs(30), || async {
        kms_secrets(&client, ns)
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await
    .expect("the KmsSecrets of an earlier run did not go");
    for i in 0..4 {
        kms_secret(
            &client,
            ns,
            &format!("app-{i}"),
            &format!("app-{i}-out"),
            "Owner",
            "1h",
        )
        .await;
    }
    for i in 0..4 {
        wait_value(
            &client,
            ns,
            &format!("app-{i}-out"),
            "A",
            "1",
            Duration::from_secs(90),
        )
        .await;
    }
    // Settled: every resource Ready, and no KMS request for 5 s (every
    // status written; the graceful stops below flush the cache).
    let names: Vec<String> = (0..4).map(|i| format!("app-{i}")).collect();
    let (logins, fetches) = settle(&client, &kms, ns, &names).await;
    let requests = || async {
        (
            kms.count("POST /api/v1/auth/universal-auth/login").await,
            kms.count("GET /api/v3/secrets/raw").await,
        )
    };
    // Every pod restarts (one by one, graceful): each comes back to its own
    // claim and cache.
    let pod_api = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    for p in pods(&client, "kms-scoped").await {
        let name = p.metadata.name.clone().unwrap();
        pod_api
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        wait_for(Duration::from_secs(120), || async {
            let q = pod_api.get_opt(&name).await.ok()??;
            (q.metadata.uid != p.metadata.uid && ready(&q)).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{name} did not come back"));
    }
    let held = holds_for(Duration::from_secs(10), || async {
        requests().await == (logins, fetches)
    })
    .await;
    if let Err(when) = held {
        panic!(
            "logins or fetches after the restarts, {when}: {:?}, before {:?}",
            requests().await,
            (logins, fetches)
        );
    }
    resync_without_login(&client, &kms, ns, &names, (logins, fetches)).await;
    // The claims are bound to the static volumes.
    for p in pvcs.list(&ListParams::default()).await.unwrap().items {
        let phase = p.status.and_then(|s| s.phase);
        assert_eq!(phase.as_deref(), Some("Bound"));
    }
    // Scoped: it works in its namespace only.
    tenant(&client, "node-outside").await;
    let _ = kms_secrets(&client, "node-outside")
        .delete("app", &DeleteParams::default())
        .await;
    // A Secret left by an earlier run goes with its owner (the garbage
    // collector), before the window starts.
    wait_for(Duration::from_secs(60), || async {
        secret_data(&client, "node-outside", "app-out")
            .await
            .is_none()
            .then_some(())
    })
    .await
    .expect("the earlier app-out was not collected");
    kms_secret(&client, "node-outside", "app", "app-out", "Owner", "1h").await;
    let held = holds_for(Duration::from_secs(10), || async {
        secret_data(&client, "node-outside", "app-out")
            .await
            .is_none()
    })
    .await;
    if let Err(when) = held {
        panic!("a scoped install wrote outside its namespaces, {when}");
    }
    uninstall("kms-scoped");
    let _ = pvcs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    for i in 0..3 {
        let _ = pv_api
            .delete(&format!("kms-node-pv-{i}"), &DeleteParams::default())
            .await;
    }
    report(
        "s8 persistence, scoped install (criterion 5)",
        started.elapsed(),
    );
}

/// Wait until the KmsSecrets `names` of `ns` are Ready and the KMS has
/// seen no login and no fetch for 5 s (every status written, nothing due);
/// the two counts then.
async fn settle(client: &kube::Client, kms: &Kms, ns: &str, names: &[String]) -> (u64, u64) {
    let requests = || async {
        (
            kms.count("POST /api/v1/auth/universal-auth/login").await,
            kms.count("GET /api/v3/secrets/raw").await,
        )
    };
    let settled = wait_for(Duration::from_secs(60), || async {
        for name in names {
            let o = kms_secrets(client, ns).get_opt(name).await.ok()??;
            let ready = o.data["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if !ready {
                return None;
            }
        }
        let seen = requests().await;
        let held = holds_for(Duration::from_secs(5), || async {
            requests().await == seen
        })
        .await;
        held.ok().map(|()| seen)
    })
    .await;
    match settled {
        Some(counts) => counts,
        None => panic!("the resources did not settle: {:?}", requests().await),
    }
}

/// After restarts: a spec change makes each of `names` (KmsSecrets writing
/// `<name>-out`, made with [`kms_secret`]) sync again, and the restarted
/// processes fetch with the access tokens they read back from their cache,
/// so nobody logs in. (Without the cache they would: the due times alone
/// come from the statuses.) `before` are the (logins, fetches) counted
/// before the restarts.
async fn resync_without_login(
    client: &kube::Client,
    kms: &Kms,
    ns: &str,
    names: &[String],
    before: (u64, u64),
) {
    for name in names {
        kms_secret(client, ns, name, &format!("{name}-out"), "Owner", "59m").await;
    }
    wait_for(Duration::from_secs(60), || async {
        (kms.count("GET /api/v3/secrets/raw").await > before.1).then_some(())
    })
    .await
    .expect("no fetch after the spec change");
    let _ = settle(client, kms, ns, names).await;
    assert_eq!(
        kms.count("POST /api/v1/auth/universal-auth/login").await,
        before.0,
        "the restarted replicas logged in again: the access tokens were not read from the cache"
    );
}

/// An object of the cluster as JSON (`kubectl get -o json`).
fn get_json(kind: &str, ns: &str, name: &str) -> serde_json::Value {
    serde_json::from_str(&ok("kubectl", &["-n", ns, "get", kind, name, "-o", "json"]))
        .expect("kubectl get -o json")
}

/// Owned shards per pod as Prometheus sees them now.
async fn owned_per_pod(prom: &Prometheus, sel: &str) -> BTreeMap<String, f64> {
    prom.query(&format!("sum by (pod) (kms_operator_shard_owned{{{sel}}})"))
        .await
        .into_iter()
        .map(|s| (s.label("pod").to_owned(), s.last().unwrap_or(f64::NAN)))
        .collect()
}

/// Now, in unix seconds.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Scale the release's StatefulSet.
fn scale(replicas: u32) {
    ok(
        "kubectl",
        &[
            "-n",
            RELEASE_NS,
            "scale",
            &format!("statefulset/{}-controller-manager", fullname(RELEASE)),
            &format!("--replicas={replicas}"),
        ],
    );
}

/// 9. Observability, proven by a real Prometheus on the node: the chart's
/// ServiceMonitor (HTTPS, the token Secret the chart makes for its
/// metrics-reader ServiceAccount) scrapes the three pods; after a workload
/// with syncs, a failing resource, a KMS outage, a workload reload and a
/// graceful hand-over, every query of the chart's dashboard returns series
/// with the labels its legend uses; the hand-over shows in the "owned
/// shards per replica" and "hand-overs" panels; the alert
/// `KmsOperatorShardWithoutOwner` (its `for:` shortened through the
/// chart's values) fires while no replica runs and resolves when they are
/// back, `KmsOperatorKmsErrors` goes pending during the KMS outage, and
/// `KmsOperatorResourcesNotReady` fires for the KmsSecret without
/// credentials (and for no other). The panels' results are written to `target/node-prometheus/` (input of
/// `scripts/plots.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_prometheus_scrapes_the_pods_dashboard_and_alerts_answer() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    kms_testkit::monitoring::install_crds(&client).await;
    install(
        RELEASE,
        &release_version(),
        &[
            "telemetry.serviceMonitor.enabled=true",
            "telemetry.serviceMonitor.interval=2s",
            "telemetry.serviceMonitor.scrapeTimeout=2s",
            "telemetry.prometheusRule.enabled=true",
            "telemetry.prometheusRule.for.KmsOperatorShardWithoutOwner=10s",
            "telemetry.prometheusRule.for.KmsOperatorResourcesNotReady=10s",
            "telemetry.grafanaDashboard.enabled=true",
        ],
    );
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(120)).await;
    let full = fullname(RELEASE);

    let out_dir = repo().join("target/node-prometheus");
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).unwrap();

    let monitor = get_json(
        "servicemonitors.monitoring.coreos.com",
        RELEASE_NS,
        &format!("{full}-controller-manager-metrics-monitor"),
    );
    let rule = get_json(
        "prometheusrules.monitoring.coreos.com",
        RELEASE_NS,
        &format!("{full}-alerts"),
    );
    let scrape = prometheus::seconds(
        monitor["spec"]["endpoints"][0]["interval"]
            .as_str()
            .expect("the ServiceMonitor's interval"),
    );
    let targets_file = out_dir.join("targets.json");
    let _discovery =
        prometheus::Discovery::start(client.clone(), &monitor, targets_file.clone()).await;
    // Prometheus's identity is the chart's: the token Secret of its
    // metrics-reader ServiceAccount, read as the Prometheus Operator reads
    // it (no file).
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert!(
        endpoint.get("bearerTokenFile").is_none(),
        "the rendered ServiceMonitor reads a token file: {endpoint}"
    );
    assert_eq!(
        endpoint["authorization"]["credentials"]["name"],
        format!("{full}-metrics-reader-token").as_str(),
        "{endpoint}"
    );
    let jobs = prometheus::scrape_jobs(&client, &monitor, &targets_file, None).await;
    let prom = Prometheus::start(jobs, &prometheus::rule_file(&rule), "1s").await;

    // The three pods are scraped over HTTPS with the Secret's token.
    let up = wait_for(Duration::from_secs(60), || async {
        let targets = prom.targets().await;
        (targets.len() == 3 && targets.iter().all(|(_, h, _)| h == "up")).then_some(targets)
    })
    .await;
    let Some(targets) = up else {
        panic!(
            "three targets not up within 60 s: {:?}\n{}",
            prom.targets().await,
            prom.log()
        );
    };
    let metrics_service = format!("{full}-controller-manager-metrics-service");
    for (labels, _, _) in &targets {
        assert_eq!(labels["job"], metrics_service, "{labels:?}");
        assert_eq!(labels["namespace"], RELEASE_NS, "{labels:?}");
        assert!(labels["pod"].starts_with(&full), "{labels:?}");
    }
    println!("scraped: {} targets up", targets.len());
    let sel = format!("namespace=\"{RELEASE_NS}\", job=\"{metrics_service}\"");
    let workload_start = unix_now();

    // The workload: syncs in four namespaces, a resource that fails, a
    // workload reloaded on a change, a KMS outage.
    kms.set_secret("A", "prom-1").await;
    for t in ["node-prom-a", "node-prom-b", "node-prom-c", "node-prom-d"] {
        tenant(&client, t).await;
        kms_secret(&client, t, "app", "app-out", "Owner", "5s").await;
    }
    apply(
        r#"apiVersion: secrets.hanzo.ai/v1alpha1
kind: KmsSecret
metadata: {name: broken, namespace: node-prom-a}
spec:
  syncConfig: {resyncInterval: 5s}
  authentication:
    universalAuth:
      credentialsRef: {secretName: no-such-credentials}
      secretsScope: {projectSlug: demo, envSlug: dev, secretsPath: /}
  managedKubeSecretReferences: [{secretName: broken-out}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: node-prom-b
  annotations: {secrets.hanzo.ai/auto-reload: "true"}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: pause
        image: localhost/pause:3.10
        imagePullPolicy: Never
        env: [{name: A, valueFrom: {secretKeyRef: {name: app-out, key: A}}}]
"#,
    );
    for t in ["node-prom-a", "node-prom-b", "node-prom-c", "node-prom-d"] {
        wait_value(
            &client,
            t,
            "app-out",
            "A",
            "prom-1",
            Duration::from_secs(60),
        )
        .await;
    }
    ok(
        "kubectl",
        &[
            "-n",
            "node-prom-b",
            "rollout",
            "status",
            "deployment/web",
            "--timeout=120s",
        ],
    );
    // The KmsSecret without credentials: the not-Ready alert (its `for:`
    // shortened to 10 s) fires, naming its kind, namespace and reason; none
    // fires for the namespaces whose resources are Ready.
    let not_ready = wait_for(Duration::from_secs(90), || async {
        prom.alerts()
            .await
            .into_iter()
            .find(|(name, state, labels)| {
                name == "KmsOperatorResourcesNotReady"
                    && state == "firing"
                    && labels.get("resource_namespace").map(String::as_str) == Some("node-prom-a")
            })
    })
    .await;
    let Some((_, _, labels)) = not_ready else {
        panic!(
            "KmsOperatorResourcesNotReady did not fire within 90 s for the KmsSecret without credentials: {:?}",
            prom.alerts().await
        );
    };
    assert_eq!(labels["kind"], "KmsSecret", "{labels:?}");
    let wrong: Vec<_> = prom
        .alerts()
        .await
        .into_iter()
        .filter(|(name, state, labels)| {
            name == "KmsOperatorResourcesNotReady"
                && state == "firing"
                && ["node-prom-b", "node-prom-c", "node-prom-d"]
                    .contains(&labels.get("resource_namespace").map_or("", String::as_str))
        })
        .collect();
    assert!(wrong.is_empty(), "alerts for Ready resources: {wrong:?}");
    println!(
        "KmsOperatorResourcesNotReady: firing for {}/{} ({})",
        labels["kind"], labels["resource_namespace"], labels["reason"]
    );
    kms.set_secret("A", "prom-2").await;
    for t in ["node-prom-a", "node-prom-b", "node-prom-c", "node-prom-d"] {
        wait_value(
            &client,
            t,
            "app-out",
            "A",
            "prom-2",
            Duration::from_secs(60),
        )
        .await;
    }
    // The KMS down for a while: every resync fails.
    let outage_at = unix_now();
    kms.fault(serde_json::json!({"outage": true})).await;
    let pending = wait_for(Duration::from_secs(60), || async {
        let s = prom.alert_state("KmsOperatorKmsErrors").await;
        (s != "inactive").then_some(s)
    })
    .await;
    kms.clear_faults().await;
    let outage_end = unix_now();
    let pending = pending.expect("KmsOperatorKmsErrors did not go pending during a KMS outage");
    println!("KMS outage: KmsOperatorKmsErrors {pending}");

    // A graceful hand-over: the third replica leaves (scale to 2), its
    // shards go to the other two.
    let before = wait_for(Duration::from_secs(30), || async {
        let owned = owned_per_pod(&prom, &sel).await;
        (owned.len() == 3 && owned.values().sum::<f64>() == 16.0).then_some(owned)
    })
    .await
    .expect("owned shards per replica before the hand-over: 3 pods, 16 shards");
    let mut spread_before: Vec<u64> = before.values().map(|v| *v as u64).collect();
    spread_before.sort_unstable();
    assert_eq!(spread_before, [5, 5, 6], "before: {before:?}");
    // The configured KMS budget of the installation (the chart's
    // `kms.rateLimit`, passed to every replica).
    let sts = get_json(
        "statefulset",
        RELEASE_NS,
        &format!("{full}-controller-manager"),
    );
    let budget: f64 = sts["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "KMS_OPERATOR_KMS_RATE_LIMIT")
        .and_then(|e| e["value"].as_str()?.parse().ok())
        .expect("KMS_OPERATOR_KMS_RATE_LIMIT on the operator container");
    let handover_at = unix_now();
    scale(2);
    wait_ready_pods(&client, RELEASE, 2, Duration::from_secs(120)).await;
    let after = wait_for(Duration::from_secs(60), || async {
        let owned = owned_per_pod(&prom, &sel).await;
        (owned.len() == 2 && owned.values().all(|v| *v == 8.0)).then_some(owned)
    })
    .await;
    let Some(after) = after else {
        panic!(
            "owned shards per replica after the hand-over: not 8/8 within 60 s: {:?}",
            owned_per_pod(&prom, &sel).await
        )
    };
    let leaver = format!("{full}-controller-manager-2");
    assert!(!after.contains_key(&leaver), "after: {after:?}");
    println!("owned shards per replica: before {before:?}, after {after:?}");
    // The replica that left gave its part of the KMS budget back at once
    // (it deleted its member Lease): the two left share the whole of it.
    let shared = wait_for(Duration::from_secs(30), || async {
        let sum = prom
            .query(&format!("sum(kms_operator_kms_budget_rate{{{sel}}})"))
            .await
            .first()
            .and_then(prometheus::Series::last)?;
        ((sum - budget).abs() < 0.01).then_some(sum)
    })
    .await;
    assert!(
        shared.is_some(),
        "the two replicas left do not share the whole KMS budget ({budget}/s) within 30 s: {:?}",
        prom.query(&format!("kms_operator_kms_budget_rate{{{sel}}}"))
            .await
    );
    println!(
        "KMS budget {budget}/s: {:.2}/s used by the 2 replicas left after the hand-over",
        shared.unwrap_or_default()
    );
    // Two replicas for a few scrapes (the plots show the new split).
    tokio::time::sleep(Duration::from_secs(3 * scrape as u64)).await;

    // No replica at all: the alert fires (its `for:` is 10 s here), and
    // resolves when the replicas are back.
    let scaled_to_0 = unix_now();
    scale(0);
    let down_at = Instant::now();
    let fired = wait_for(Duration::from_secs(90), || async {
        (prom.alert_state("KmsOperatorShardWithoutOwner").await == "firing").then_some(())
    })
    .await;
    assert!(
        fired.is_some(),
        "KmsOperatorShardWithoutOwner did not fire within 90 s of scaling to 0: {:?}",
        prom.alerts().await
    );
    let fired_after = down_at.elapsed();
    let scaled_to_3 = unix_now();
    scale(3);
    let up_at = Instant::now();
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(180)).await;
    let resolved = wait_for(Duration::from_secs(90), || async {
        (prom.alert_state("KmsOperatorShardWithoutOwner").await == "inactive").then_some(())
    })
    .await;
    assert!(
        resolved.is_some(),
        "KmsOperatorShardWithoutOwner still active 90 s after the replicas were back: {:?}",
        prom.alerts().await
    );
    println!(
        "KmsOperatorShardWithoutOwner: firing {:.1} s after scaling to 0 (for: 10s), inactive {:.1} s after scaling back to 3",
        fired_after.as_secs_f64(),
        up_at.elapsed().as_secs_f64()
    );
    // Let a few scrapes of the new pods land before the dashboard is read.
    tokio::time::sleep(Duration::from_secs(6)).await;

    // The dashboard, as the chart ships it: its variables resolved by
    // their own queries, then every panel's queries over the scenario.
    let cm = get_json("configmap", RELEASE_NS, &format!("{full}-dashboard"));
    let dashboard: serde_json::Value =
        serde_json::from_str(cm["data"]["kms-operator.json"].as_str().expect("dashboard"))
            .expect("dashboard JSON");
    let end = unix_now();
    let step = scrape;
    let rate = prometheus::rate_interval(step, scrape);
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if var["type"] != "query" {
            continue;
        }
        let name = var["name"].as_str().unwrap().to_owned();
        let query = var["query"]["query"].as_str().unwrap();
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .expect("label_values(selector, label)");
        let (selector, label) = inner.rsplit_once(',').unwrap();
        let selector = prometheus::substitute(selector.trim(), &vars, &rate);
        let values = prom.label_values(&selector, label.trim()).await;
        assert!(
            !values.is_empty(),
            "variable {name}: {query} returned nothing"
        );
        println!("variable {name}: {} value(s), {values:?}", values.len());
        let value = if var["includeAll"] == true {
            if name == "shard" {
                assert_eq!(
                    values.len(),
                    16,
                    "the shard variable lists every shard: {values:?}"
                );
            }
            var["allValue"].as_str().unwrap_or(".*").to_owned()
        } else {
            values[0].clone()
        };
        vars.insert(name, value);
    }
    assert_eq!(vars["namespace"], RELEASE_NS);
    assert_eq!(vars["job"], metrics_service);

    // Panels whose queries must show activity (a non-zero value) after
    // this workload; the others must return series (they may be zero:
    // nothing was throttled, no dynamic lease, no queue left, no Lease
    // renewal failed, and no login was needed: the replicas reuse the
    // access token of the credentials, kept in their cache).
    let active = [
        "Shard owners",
        "Shards owned per replica",
        "Shard hand-overs",
        "Reconciles per shard",
        "Reconcile errors per shard",
        "Reconcile duration p95 per shard",
        "Managed objects per shard",
        "KMS requests by status",
        "KMS latency p95 by endpoint",
        "Workload reloads by kind",
        "Memory per replica",
        "CPU per replica",
        "Open file descriptors",
        "KMS budget and demand per replica",
        "Resources not Ready by kind, namespace and reason",
        "Resources by Ready status",
    ];
    let mut panels = 0;
    let mut with_data = 0;
    let mut table = Vec::new();
    let mut results = serde_json::Map::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        let title = panel["title"].as_str().unwrap();
        panels += 1;
        let mut series_total = 0;
        let mut max = f64::NEG_INFINITY;
        let mut out = Vec::new();
        for target in targets {
            let expr = prometheus::substitute(target["expr"].as_str().unwrap(), &vars, &rate);
            let legend = target["legendFormat"].as_str().unwrap_or("");
            let series = prom.query_range(&expr, workload_start, end, step).await;
            assert!(!series.is_empty(), "panel {title:?}: no series for {expr}");
            for s in &series {
                for label in prometheus::legend_labels(legend) {
                    assert!(
                        !s.label(&label).is_empty(),
                        "panel {title:?}: a series without the legend's label {label}: {:?}",
                        s.labels
                    );
                }
                if let Some(m) = s.max() {
                    max = max.max(m);
                }
            }
            series_total += series.len();
            out.push(serde_json::json!({
                "expr": expr,
                "legend": legend,
                "series": series.iter().map(|s| serde_json::json!({"labels": s.labels, "values": s.values})).collect::<Vec<_>>(),
            }));
        }
        if active.contains(&title) {
            assert!(max > 0.0, "panel {title:?} shows no activity (max {max})");
        }
        with_data += 1;
        table.push(format!("{title}: {series_total} series, max {max:.3}"));
        results.insert(title.to_owned(), serde_json::Value::Array(out));
    }
    println!("dashboard: {panels} panels, {with_data} with data");
    for line in &table {
        println!("  {line}");
    }

    // The hand-over in the panels: the shards of the replica that left
    // were gained by the others.
    let gained = prom
        .query_range(
            &format!(
                "sum by (shard) (increase(kms_operator_shard_handovers_total{{{sel}, direction=\"gained\"}}[{rate}]))"
            ),
            handover_at,
            end,
            step,
        )
        .await;
    let moved: Vec<&str> = gained
        .iter()
        .filter(|s| s.max().unwrap_or(0.0) > 0.0)
        .map(|s| s.label("shard"))
        .collect();
    assert!(
        moved.len() >= 5,
        "the hand-overs panel shows {} shard(s) gained after the third replica left: {moved:?}",
        moved.len()
    );
    std::fs::write(
        out_dir.join("panels.json"),
        serde_json::to_vec_pretty(&serde_json::json!({
            "start": workload_start,
            "end": end,
            "step": step,
            "events": {
                "KMS outage": [outage_at, outage_end],
                "scaled to 2 (hand-over)": [handover_at],
                "scaled to 0": [scaled_to_0],
                "scaled to 3": [scaled_to_3],
            },
            "panels": results,
        }))
        .unwrap(),
    )
    .unwrap();
    println!(
        "hand-overs panel: {} shard(s) gained after the third replica left",
        moved.len()
    );
    report(
        "s9 prometheus: scrape, dashboard, alerts",
        started.elapsed(),
    );
}

/// 10. OpenShift's `restricted-v2`, as far as a plain node can show it: the
/// release namespace enforces the Pod Security Standard `restricted`, the
/// chart is installed with `openshift=true` (no fixed UID, GID or fsGroup),
/// and the pods get what that SCC assigns — a UID and fsGroup from the
/// namespace's range (1000680000) — patched in as its admission would.
/// The operator runs as that UID on a read-only root filesystem, syncs, and
/// its cache survives a restart of the container: no login and no fetch
/// for resources that are not due, and a spec change then syncs them with
/// the access tokens read back from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_openshift_arbitrary_uid_restricted_namespace_cache_works() {
    const UID: i64 = 1_000_680_000;
    let started = Instant::now();
    let client = client().await;
    let kms = Kms::deploy_fresh(&client, &seed(&[("A", "1"), ("B", "x")])).await;
    uninstall(RELEASE);
    uninstall("kms-scoped");
    // The label goes again however the scenario ends: the next scenarios
    // install into this namespace without the switch.
    struct Unrestrict;
    impl Drop for Unrestrict {
        fn drop(&mut self) {
            let _ = run(
                "kubectl",
                &[
                    "label",
                    "namespace",
                    RELEASE_NS,
                    "pod-security.kubernetes.io/enforce-",
                ],
            );
        }
    }
    let _unrestrict = Unrestrict;
    namespace(&client, RELEASE_NS).await;
    ok(
        "kubectl",
        &[
            "label",
            "namespace",
            RELEASE_NS,
            "pod-security.kubernetes.io/enforce=restricted",
            "--overwrite",
        ],
    );
    // No replica yet: the SCC assigns the IDs when a pod is admitted, so the
    // pods must be created with them (the key file of the cache is readable
    // by the fsGroup only; without one the container cannot start).
    install(
        RELEASE,
        &release_version(),
        &["openshift=true", "replicaCount=0"],
    );
    // What restricted-v2 adds to every pod of the namespace, and the replicas.
    ok(
        "kubectl",
        &[
            "-n",
            RELEASE_NS,
            "patch",
            "statefulset",
            &format!("{RELEASE}-secrets-operator-controller-manager"),
            "--type=json",
            "-p",
            &json!([
                {"op": "add", "path": "/spec/template/spec/securityContext/fsGroup", "value": UID},
                {"op": "add", "path": "/spec/template/spec/containers/0/securityContext/runAsUser", "value": UID},
                {"op": "replace", "path": "/spec/replicas", "value": 3},
            ])
            .to_string(),
        ],
    );
    ok(
        "kubectl",
        &[
            "-n",
            RELEASE_NS,
            "rollout",
            "status",
            "statefulset",
            &format!("{RELEASE}-secrets-operator-controller-manager"),
            "--timeout=240s",
        ],
    );
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(180)).await;
    // Every operator process runs as the assigned UID, with the fsGroup
    // among its groups, on a read-only root filesystem.
    let pod_names: Vec<String> = pods(&client, RELEASE)
        .await
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    for name in &pod_names {
        let pid = kms_testkit::node::operator_process(RELEASE_NS, name)
            .unwrap_or_else(|| panic!("no operator process of {name} on this host"));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(field("Uid:")[0], UID.to_string(), "{name}: {status}");
        assert!(
            field("Groups:").contains(&UID.to_string()),
            "{name}: the fsGroup is not among the groups: {:?}",
            field("Groups:")
        );
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).unwrap();
        let root = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("/"))
            .unwrap_or_else(|| panic!("{name}: no root mount"));
        assert!(
            root.split_whitespace()
                .nth(3)
                .is_some_and(|o| o.split(',').any(|f| f == "ro")),
            "{name}: the root filesystem is writable: {root}"
        );
    }
    // It syncs.
    let ns = "node-openshift";
    tenant(&client, ns).await;
    let _ = kms_secrets(&client, ns)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let names: Vec<String> = (0..3).map(|i| format!("os-{i}")).collect();
    for name in &names {
        kms_secret(&client, ns, name, &format!("{name}-out"), "Owner", "1h").await;
    }
    for name in &names {
        wait_value(
            &client,
            ns,
            &format!("{name}-out"),
            "A",
            "1",
            Duration::from_secs(90),
        )
        .await;
    }
    let counts = settle(&client, &kms, ns, &names).await;
    // Each container restarted (SIGTERM: a graceful stop that flushes the
    // cache; the kubelet starts it again in the same pod, with the same
    // emptyDir): the cache, written by the arbitrary UID, spares the KMS.
    let pod_api = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let restarts = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum::<i32>())
    };
    for name in &pod_names {
        let before = restarts(&pod_api.get(name).await.unwrap());
        let pid = kms_testkit::node::operator_process(RELEASE_NS, name).unwrap();
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        wait_for(Duration::from_secs(120), || async {
            let p = pod_api.get(name).await.ok()?;
            (restarts(&p) > before && ready(&p)).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{name} was not restarted by the kubelet"));
    }
    let requests = || async {
        (
            kms.count("POST /api/v1/auth/universal-auth/login").await,
            kms.count("GET /api/v3/secrets/raw").await,
        )
    };
    let held = holds_for(Duration::from_secs(10), || async {
        requests().await == counts
    })
    .await;
    if let Err(when) = held {
        panic!(
            "logins or fetches after the restarts, {when}: {:?}, before {:?}",
            requests().await,
            counts
        );
    }
    // The cache on disk belongs to the assigned UID (its directory, the
    // emptyDir, to the fsGroup; the files take the process's group, 0, as
    // on OpenShift).
    let mut files = 0;
    for name in &pod_names {
        let pid = kms_testkit::node::operator_process(RELEASE_NS, name).unwrap();
        let dir = format!("/proc/{pid}/root/var/cache/kms-operator");
        for entry in kms_testkit::files_below(std::path::Path::new(&dir)) {
            use std::os::unix::fs::MetadataExt;
            files += 1;
            assert_eq!(
                std::fs::metadata(&entry).unwrap().uid(),
                UID as u32,
                "{name}: {} is not the assigned UID's",
                entry.display()
            );
        }
    }
    assert!(files > 0, "no cache file in any pod");
    resync_without_login(&client, &kms, ns, &names, counts).await;
    uninstall(RELEASE);
    report(
        "s10 openshift: arbitrary UID, restricted namespace",
        started.elapsed(),
    );
}

/// `helm test` on the release, its output (status and the check Pod's
/// log), and whether it passed.
fn helm_test() -> Result<String, String> {
    run(
        "helm",
        &[
            "test",
            RELEASE,
            "-n",
            RELEASE_NS,
            "--logs",
            "--timeout",
            "120s",
        ],
    )
}

/// 13. `helm test`: the chart's check Pod (the operator image, restricted,
/// a read-only ServiceAccount) passes on a healthy install; fails when the
/// StatefulSet was scaled below `replicaCount` with kubectl, naming both
/// counts; passes again once scaled back; and, given a KmsSecret through
/// `tests.kmsSecret`, passes when it is Ready and fails with its condition
/// when it is not. The last installs also turn the chart's NetworkPolicy on:
/// accepted, and the operator keeps syncing with it applied (the node does
/// not enforce NetworkPolicy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_helm_test_passes_and_fails_when_it_should() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    let healthy = helm_test().unwrap_or_else(|e| panic!("helm test on a healthy install: {e}"));
    for line in [
        "ok    the CRDs of secrets.hanzo.ai/v1alpha1 are served",
        "replicas Ready",
        "ok    16 shards held and renewed",
        "checks passed",
    ] {
        assert!(healthy.contains(line), "{line:?} not in:\n{healthy}");
    }
    println!("healthy:\n{healthy}");

    // Scaled below the release with kubectl: the test fails and says so.
    scale(2);
    wait_ready_pods(&client, RELEASE, 2, Duration::from_secs(120)).await;
    let scaled = helm_test().expect_err("helm test passed with 2 of 3 replicas");
    assert!(
        scaled.contains("it runs 2 replicas where the release asks for 3"),
        "{scaled}"
    );
    println!(
        "scaled to 2: {}",
        scaled.lines().find(|l| l.starts_with("FAIL")).unwrap_or("")
    );
    scale(3);
    wait_ready_pods(&client, RELEASE, 3, Duration::from_secs(180)).await;
    let back = wait_for(Duration::from_secs(60), || async { helm_test().ok() }).await;
    assert!(
        back.is_some(),
        "helm test still fails once scaled back to 3"
    );

    // A KmsSecret given to the test: Ready passes, not Ready fails with its
    // condition.
    kms.set_secret("A", "tested").await;
    let ns = "node-helm-test";
    tenant(&client, ns).await;
    kms_secret(&client, ns, "app", "app-out", "Owner", "5s").await;
    apply(&format!(
        r#"apiVersion: secrets.hanzo.ai/v1alpha1
kind: KmsSecret
metadata: {{name: broken, namespace: {ns}}}
spec:
  authentication:
    universalAuth:
      credentialsRef: {{secretName: no-such-credentials}}
      secretsScope: {{projectSlug: demo, envSlug: dev, secretsPath: /}}
  managedKubeSecretReferences: [{{secretName: broken-out}}]
"#
    ));
    wait_value(
        &client,
        ns,
        "app-out",
        "A",
        "tested",
        Duration::from_secs(60),
    )
    .await;
    // The chart's NetworkPolicy on too (the dev KMS answers on port 80):
    // the API server accepts it and the operator keeps syncing with it in
    // place. The node's network plugin does not enforce NetworkPolicy, so
    // what it would block is not tested here.
    let given = |name: &str| {
        install(
            RELEASE,
            &release_version(),
            &[
                &format!("tests.kmsSecret.namespace={ns}"),
                &format!("tests.kmsSecret.name={name}"),
                "networkPolicy.enabled=true",
                "networkPolicy.egress.kms.ports[0].port=80",
            ],
        )
    };
    given("app");
    let policy = get_json(
        "networkpolicy",
        RELEASE_NS,
        &format!("{}-controller-manager", fullname(RELEASE)),
    );
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"]),
        "{policy}"
    );
    kms.set_secret("A", "behind-the-policy").await;
    wait_value(
        &client,
        ns,
        "app-out",
        "A",
        "behind-the-policy",
        Duration::from_secs(60),
    )
    .await;
    let ready = wait_for(Duration::from_secs(60), || async { helm_test().ok() }).await;
    let ready = ready.expect("helm test with a Ready KmsSecret");
    assert!(
        ready.contains(&format!("ok    KmsSecret {ns}/app is Ready")),
        "{ready}"
    );
    given("broken");
    let failed = helm_test().expect_err("helm test passed with a KmsSecret that is not Ready");
    assert!(
        failed.contains(&format!(
            "FAIL  KmsSecret {ns}/broken is Ready: Ready is False"
        )),
        "{failed}"
    );
    println!(
        "not Ready: {}",
        failed.lines().find(|l| l.starts_with("FAIL")).unwrap_or("")
    );
    install(RELEASE, &release_version(), &[]);
    // Nothing failing left behind for the scenarios after this one.
    let _ = run("kubectl", &["delete", "namespace", ns, "--wait=false"]);
    report("s13 helm test", started.elapsed());
}
