//! Metrics, the HTTPS metrics endpoint with token auth, and the `status`
//! command, on a real API server with operator processes.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{self, TestNamespace, wait_for};
use crate::support::{DevServer, Operator, binary, create_credentials, seed};

/// Scrape `/metrics` over plain HTTP from whichever address serves it.
pub(crate) async fn scrape(op: &Operator) -> Option<String> {
    let http = reqwest::Client::new();
    for addr in op.served() {
        if let Ok(r) = http.get(format!("http://{addr}/metrics")).send().await
            && r.status().is_success()
        {
            return r.text().await.ok();
        }
    }
    None
}

/// Sum of the samples of `name` whose labels contain every `filter` pair.
pub(crate) fn sum(text: &str, name: &str, filter: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| {
            filter
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn series(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

fn kms_secret(name: &str, host: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
        "metadata": {"name": name},
        "spec": {
            "hostAPI": host,
            "syncConfig": {"resyncInterval": "1h"},
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "creds"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": format!("{name}-out")}]
        }
    }))
    .unwrap()
}

fn crs(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsSecret"),
        "kmssecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

#[tokio::test]
async fn two_replicas_expose_consistent_metrics_and_status() {
    let client = harness::client().await;
    let home = TestNamespace::new(&client, "obs-home").await;
    let work = TestNamespace::new(&client, "obs-work").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &work.name, "creds").await;
    let fast = [
        "--lease-duration",
        "3",
        "--renew-deadline",
        "2",
        "--retry-period",
        "1",
    ];
    let mut ops: Vec<Operator> = ["m-0", "m-1"]
        .iter()
        .map(|n| {
            let mut args = vec!["--pod-name", n];
            args.extend_from_slice(&fast);
            Operator::spawn(&home.name, &[&work.name], &args, &[])
        })
        .collect();
    for op in &mut ops {
        op.ready().await;
    }

    // Exactly S shards owned across the replicas (gauges refresh every 5 s).
    let owned = wait_for(Duration::from_secs(30), || async {
        let mut total = 0.0;
        for op in &ops {
            total += sum(&scrape(op).await?, "kms_operator_shard_owned", &[]);
        }
        (total == 16.0).then_some(())
    })
    .await;
    assert!(
        owned.is_some(),
        "the replicas do not own exactly 16 shards between them"
    );

    // Activity moves the reconcile counters; KMS counters match the KMS.
    kms.reset_stats().await;
    for i in 0..6 {
        crs(&client, &work.name)
            .create(
                &PostParams::default(),
                &kms_secret(&format!("cr{i}"), &kms.api()),
            )
            .await
            .unwrap();
    }
    let synced = wait_for(Duration::from_secs(30), || async {
        let list = Api::<Secret>::namespaced(client.clone(), &work.name)
            .list(&Default::default())
            .await
            .ok()?;
        (list
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-out"))
            })
            .count()
            == 6)
            .then_some(())
    })
    .await;
    assert!(synced.is_some(), "resources did not sync");
    // A target is written before its resource's status, and the reconcile
    // is counted after both: wait for the counters to catch up.
    let counted = wait_for(Duration::from_secs(15), || async {
        let mut reconciles = 0.0;
        let mut lists = 0.0;
        let mut logins = 0.0;
        for op in &ops {
            let text = scrape(op).await?;
            reconciles += sum(
                &text,
                "controller_runtime_reconcile_total",
                &[("controller", "kmssecret"), ("result", "success")],
            );
            lists += sum(
                &text,
                "kms_operator_kms_requests_total",
                &[("endpoint", "GET /api/v3/secrets/raw")],
            );
            logins += sum(&text, "kms_operator_kms_logins_total", &[]);
        }
        (reconciles >= 6.0).then_some((lists, logins))
    })
    .await;
    let (lists, logins) = counted.expect("reconcile counters did not reach 6");
    assert_eq!(
        lists as u64,
        kms.count("GET /api/v3/secrets/raw", None).await,
        "list requests: operator vs KMS"
    );
    assert_eq!(
        logins as u64,
        kms.count("POST /api/v1/auth/universal-auth/login", None)
            .await,
        "logins: operator vs KMS"
    );

    // The readiness gauge counts the six Ready KmsSecrets, each on the
    // replica that owns it (refreshed every 5 s), by their namespace.
    let ready = wait_for(Duration::from_secs(20), || async {
        let mut total = 0.0;
        for op in &ops {
            total += sum(
                &scrape(op).await?,
                "kms_operator_resource_ready",
                &[
                    ("kind", "KmsSecret"),
                    ("resource_namespace", work.name.as_str()),
                    ("status", "True"),
                    ("reason", "Synced"),
                ],
            );
        }
        (total == 6.0).then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "kms_operator_resource_ready does not count 6 Ready KmsSecrets"
    );

    // Every metric the chart's alerts and dashboard query is served.
    // Both replicas: a family with labels known only at use (the KMS
    // request counter's status code) has samples only where it was used.
    let mut text = String::new();
    for op in &ops {
        text.push_str(&scrape(op).await.expect("metrics"));
        text.push('\n');
    }
    // Families (`# TYPE`) and sample names, which for histograms carry the
    // `_bucket`/`_sum`/`_count` suffixes.
    let served_names: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split_whitespace().next(),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .collect();
    let chart = harness::repo().join("helm/secrets-operator");
    let queried = [
        chart.join("templates/prometheusrule.yaml"),
        chart.join("files/dashboard.json"),
    ]
    .iter()
    .map(|p| std::fs::read_to_string(p).unwrap())
    .collect::<Vec<_>>()
    .join("\n");
    let name =
        regex::Regex::new(r"\b((?:kms_operator|controller_runtime|process)_[a-z_]+)").unwrap();
    let mut checked = 0;
    for m in name.captures_iter(&queried) {
        let metric = &m[1];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| metric.strip_suffix(s))
            .unwrap_or(metric);
        assert!(
            served_names.contains(metric) || served_names.contains(base),
            "the chart queries {metric}, which /metrics does not serve"
        );
        checked += 1;
    }
    assert!(
        checked >= 10,
        "only {checked} metric references found in the chart"
    );

    // The status command: every shard with its owner, the objects, nothing
    // not ready.
    let status = |output: &'static str| {
        let ns = home.name.clone();
        async move {
            let out = tokio::process::Command::new(binary())
                .env("KUBECONFIG", harness::kubeconfig())
                .args(["status", "-A", "--pod-namespace", &ns, "--output", output])
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "status failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let report: serde_json::Value =
        serde_json::from_str(&status("json").await).expect("status --output json");
    let shards = report["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 16);
    assert!(
        shards
            .iter()
            .all(|s| s["holder"] == "m-0" || s["holder"] == "m-1"),
        "{report}"
    );
    assert_eq!(report["members"], json!(["m-0", "m-1"]));
    let table = status("table").await;
    assert!(
        table.contains("SHARD") && table.contains("m-0") && table.contains("m-1"),
        "{table}"
    );
    // Objects are counted somewhere (the status of each resource names its shard).
    let counted: u64 = shards.iter().filter_map(|s| s["objects"].as_u64()).sum();
    assert!(counted >= 6, "{report}");

    for op in &mut ops {
        op.stop();
    }
}

#[tokio::test]
async fn series_do_not_grow_with_the_number_of_resources() {
    let client = harness::client().await;
    let home = TestNamespace::new(&client, "obs-card").await;
    let mut namespaces = Vec::new();
    for _ in 0..100 {
        namespaces.push(TestNamespace::new(&client, "obs-card-ns").await);
    }
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    for ns in &namespaces {
        create_credentials(&client, &ns.name, "creds").await;
    }
    let watched: Vec<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    let op = Operator::start(&home.name, &watched, &[]).await;
    // Warm up: one resource per namespace, so that every kind of series has
    // appeared, the readiness counts of each namespace included (their
    // count grows with namespaces, bounded as docs/metrics.md says, not
    // with resources).
    for ns in &namespaces {
        crs(&client, &ns.name)
            .create(&PostParams::default(), &kms_secret("warm", &kms.api()))
            .await
            .unwrap();
    }
    let ready_in_every_namespace = |t: &str| {
        sum(
            t,
            "kms_operator_resource_ready",
            &[("kind", "KmsSecret"), ("status", "True")],
        )
    };
    let warm = wait_for(Duration::from_secs(60), || async {
        let t = scrape(&op).await?;
        (ready_in_every_namespace(&t) >= 100.0).then_some(t)
    })
    .await
    .expect("warm-up");
    let before = series(&warm);
    for ns in &namespaces {
        for i in 0..4 {
            crs(&client, &ns.name)
                .create(
                    &PostParams::default(),
                    &kms_secret(&format!("cr{i}"), &kms.api()),
                )
                .await
                .unwrap();
        }
    }
    let after = wait_for(Duration::from_secs(120), || async {
        let t = scrape(&op).await?;
        (sum(
            &t,
            "kms_operator_managed_objects",
            &[("controller", "kmssecret")],
        ) >= 500.0
            && ready_in_every_namespace(&t) >= 500.0)
            .then_some(t)
    })
    .await
    .expect("500 resources not counted");
    assert_eq!(
        series(&after),
        before,
        "series grew with the number of resources"
    );
    assert!(
        !after.contains("cr3"),
        "a resource's name appears in a label"
    );
    for line in after.lines().filter(|l| l.contains(&namespaces[0].name)) {
        assert!(
            line.starts_with("kms_operator_resource_ready{"),
            "a namespace appears in a label of another family: {line}"
        );
    }
}

#[tokio::test]
async fn https_metrics_require_a_token_allowed_to_get_metrics() {
    let client = harness::client().await;
    let home = TestNamespace::new(&client, "obs-tls").await;
    let op = Operator::start(&home.name, &[&home.name], &["--metrics-tls"]).await;
    let https = wait_for(Duration::from_secs(20), || async {
        op.output
            .text()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| {
                v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("HTTPS"))
            })
            .and_then(|v| v["fields"]["addr"].as_str().map(str::to_owned))
    })
    .await
    .expect("no HTTPS metrics address in the log");

    // A ServiceAccount allowed to get /metrics, and one that is not.
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), &home.name);
    for name in ["scraper", "nobody"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        sas.create(&PostParams::default(), &sa).await.unwrap();
    }
    let role_name = format!("{}-metrics-reader", home.name);
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": home.name}]
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = |name: &'static str| {
        let sas = sas.clone();
        async move {
            let tr: TokenRequest = serde_json::from_value(
                json!({"spec": {"audiences": [], "expirationSeconds": 600}}),
            )
            .unwrap();
            let out = sas
                .create_token_request(name, &PostParams::default(), &tr)
                .await
                .expect("token request");
            out.status.expect("token").token.expect("token")
        }
    };
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let url = format!("https://{https}/metrics");
    let code = |t: Option<String>| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let mut req = http.get(&url);
            if let Some(t) = t {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.expect("HTTPS request");
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap_or_default())
        }
    };
    let (allowed, body) = code(Some(token("scraper").await)).await;
    assert_eq!(allowed, 200, "{body}");
    assert!(body.contains("kms_operator_shard_owned"));
    assert_eq!(code(None).await.0, 401);
    assert_eq!(code(Some(token("nobody").await)).await.0, 403);
    // A token the API server does not know is not authenticated: 401.
    assert_eq!(code(Some("not-a-token".to_owned())).await.0, 401);
    // Plain HTTP is not served on that port.
    let plain = reqwest::get(format!("http://{https}/metrics")).await;
    assert!(
        !plain.is_ok_and(|r| r.status().is_success()),
        "metrics were served over plain HTTP"
    );

    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(&role_name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(client.clone())
        .delete(&role_name, &DeleteParams::default())
        .await;
}

/// Metrics are served on loopback by default; a non-loopback address in
/// plain HTTP is refused at start unless `--metrics-insecure` says so.
#[tokio::test]
async fn plain_metrics_stay_on_loopback_unless_asked_otherwise() {
    let out = std::process::Command::new(crate::support::binary())
        .env("KUBECONFIG", harness::kubeconfig())
        .args([
            "run",
            "--metrics-addr",
            "0.0.0.0:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run the operator");
    assert!(
        !out.status.success(),
        "started with plain metrics on 0.0.0.0"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--metrics-tls") && stderr.contains("--metrics-insecure"),
        "{stderr}"
    );
    let out = std::process::Command::new(crate::support::binary())
        .args(["run", "--metrics-tls", "--metrics-insecure"])
        .output()
        .expect("run the operator");
    assert!(!out.status.success(), "both flags were accepted");

    // With the flag it starts and serves on every interface.
    let client = harness::client().await;
    let home = TestNamespace::new(&client, "obs-insecure").await;
    let mut child = std::process::Command::new(crate::support::binary())
        .env("KUBECONFIG", harness::kubeconfig())
        .args([
            "--log-format",
            "json",
            "run",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .args(["--metrics-addr", "0.0.0.0:0", "--metrics-insecure"])
        .arg(format!("--pod-namespace={}", home.name))
        .arg(format!("--namespaces={}", home.name))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the operator");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(a) = v["fields"]["addr"]
                .as_str()
                .filter(|a| a.starts_with("0.0.0.0:"))
            {
                let _ = tx.send(a.to_owned());
            }
        }
    });
    let addr = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap();
    let scraped = match addr {
        Ok(addr) => {
            let port = addr.rsplit(':').next().unwrap_or_default().to_owned();
            match reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
                Ok(r) => r.text().await.ok(),
                Err(_) => None,
            }
        }
        Err(_) => None,
    };
    let _ = child.kill();
    let _ = child.wait();
    let body = scraped.expect("no metrics served on 0.0.0.0");
    assert!(body.contains("kms_operator_shard_owned"));
}

/// `kms_operator_shard_owned` follows ownership as it changes, not on the
/// 5 s refresh of the counts: a replica's gauges read what its Leases say
/// within a second of every change, gained or given away.
#[tokio::test]
async fn the_ownership_gauge_follows_each_hand_over_at_once() {
    let client = harness::client().await;
    let home = TestNamespace::new(&client, "obs-own").await;
    let work = TestNamespace::new(&client, "obs-own-ns").await;
    let fast = [
        "--lease-duration",
        "3",
        "--renew-deadline",
        "2",
        "--retry-period",
        "1",
    ];
    let spawn = |pod: &str| {
        let mut args = vec!["--pod-name", pod];
        args.extend_from_slice(&fast);
        Operator::spawn(&home.name, &[&work.name], &args, &[])
    };
    // Each shard's gauge in `op` against the Leases' holder `pod`.
    let agrees = |op: &Operator, pod: &'static str| {
        let (client, home) = (client.clone(), home.name.clone());
        let op_served = op.served();
        async move {
            let held = crate::sharding::holders(&client, &home).await;
            let http = reqwest::Client::new();
            let mut text = None;
            for addr in op_served {
                if let Ok(r) = http.get(format!("http://{addr}/metrics")).send().await {
                    text = r.text().await.ok();
                    break;
                }
            }
            let text = text?;
            let mine = held.values().filter(|h| h.as_deref() == Some(pod)).count();
            let gauges: Vec<(u32, f64)> = (0..16)
                .map(|s| {
                    let shard = s.to_string();
                    (
                        s,
                        sum(&text, "kms_operator_shard_owned", &[("shard", &shard)]),
                    )
                })
                .collect();
            let right = gauges.iter().all(|(s, v)| {
                let holds = held.get(s).cloned().flatten().as_deref() == Some(pod);
                (*v == 1.0) == holds
            });
            (held.len() == 16 && right).then_some(mine)
        }
    };

    let mut first = spawn("own-0");
    first.ready().await;
    let all = wait_for(Duration::from_secs(30), || async {
        let held = crate::sharding::holders(&client, &home.name).await;
        (held.len() == 16 && held.values().all(|h| h.as_deref() == Some("own-0"))).then_some(())
    })
    .await;
    assert!(all.is_some(), "own-0 does not hold the 16 shards");
    let gained = wait_for(Duration::from_secs(1), || agrees(&first, "own-0")).await;
    assert_eq!(
        gained,
        Some(16),
        "own-0's gauges do not read the 16 shards it holds within 1 s"
    );

    // A second replica: own-0 gives half away; each give-away reads 0 on
    // own-0 within a second, the gains 1 on own-1.
    let mut second = spawn("own-1");
    second.ready().await;
    let split = wait_for(Duration::from_secs(30), || async {
        let held = crate::sharding::holders(&client, &home.name).await;
        let theirs = held
            .values()
            .filter(|h| h.as_deref() == Some("own-1"))
            .count();
        (theirs == 8).then_some(())
    })
    .await;
    assert!(split.is_some(), "the shards were not split 8/8");
    let lost = wait_for(Duration::from_secs(1), || agrees(&first, "own-0")).await;
    assert_eq!(lost, Some(8), "own-0's gauges after the hand-over");
    let won = wait_for(Duration::from_secs(1), || agrees(&second, "own-1")).await;
    assert_eq!(won, Some(8), "own-1's gauges after the hand-over");
}
