//! What an attack on the running operator found, each as a regression test
//! on the real API server: a readiness probe during start-up, an object the
//! operator cannot decode, a KMS that streams an endless body or pauses one
//! endpoint, a folder that does not exist, a released target taken without
//! opt-in, credentials written into `hostAPI`, conditions that lost track.
//! (The cloud identities' trusted hosts are tested with the cloud methods,
//! in `cloud_auth`.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, wait_for};
use crate::kms_secret::{
    apply_cr, condition, condition_json, data_of, expect, kms_secrets, wait_condition, wait_data,
};
use crate::kms_secret_extras::{cr, create_secret, scope};
use crate::observability::{scrape, sum};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator, TempDir, seed};

fn credentials() -> Value {
    json!({"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET})
}

fn universal() -> Value {
    json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}, "secretsScope": scope()}})
}

fn universal_at(project: &str, env: &str, path: &str) -> Value {
    json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"},
        "secretsScope": {"projectSlug": project, "envSlug": env, "secretsPath": path}}})
}

/// A condition of a KmsSecret: (status, observedGeneration), and the
/// resource's generation.
async fn condition_of(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<((String, i64), i64)> {
    let (c, generation) = condition_json(client, ns, name, type_).await?;
    Some((
        (
            c["status"].as_str()?.to_owned(),
            c["observedGeneration"].as_i64().unwrap_or(-1),
        ),
        generation,
    ))
}

/// Point a KmsSecret (universal auth) at another project, environment and
/// folder.
async fn rescope(client: &Client, ns: &str, name: &str, project: &str, env: &str, path: &str) {
    patch_kms_secret(
        client,
        ns,
        name,
        json!({"spec": {"authentication": universal_at(project, env, path)}}),
    )
    .await;
}

/// Wait (30 s at most) for `Ready=False` on a KmsSecret: (reason, message).
async fn not_ready(client: &Client, ns: &str, name: &str) -> (String, String) {
    let (_, reason, message) =
        wait_condition(client, ns, name, "Ready", "False", Duration::from_secs(30)).await;
    (reason, message)
}

async fn patch_kms_secret(client: &Client, ns: &str, name: &str, patch: Value) {
    kms_secrets(client, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("patch KmsSecret");
}

async fn secret(client: &Client, ns: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// The `events.k8s.io` Events of `name` in `ns`: (reason, note).
/// The JSON log lines of an operator whose message contains `needle`.
fn log_lines(op: &Operator, needle: &str) -> Vec<String> {
    op.output
        .text()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// Seconds in a `Duration` as its `Debug` shows it (`30s`, `1.5s`,
/// `250ms`, `12µs`); 0 for anything else.
fn retry_seconds(shown: &str) -> f64 {
    let (number, scale) = if let Some(n) = shown.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = shown.strip_suffix("µs") {
        (n, 1e-6)
    } else if let Some(n) = shown.strip_suffix("ns") {
        (n, 1e-9)
    } else {
        (shown.strip_suffix('s').unwrap_or_default(), 1.0)
    };
    number.parse::<f64>().map_or(0.0, |n| n * scale)
}

/// A namespace with the credentials Secret, a dev KMS with `secrets` and an
/// operator watching the namespace.
pub(crate) struct Fixture {
    pub(crate) client: Client,
    pub(crate) ns: TestNamespace,
    pub(crate) kms: DevServer,
    pub(crate) op: Operator,
}

pub(crate) async fn fixture(prefix: &str, secrets: &[(&str, &str)]) -> Fixture {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, prefix).await;
    let kms = DevServer::start(&seed(secrets)).await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    Fixture {
        client,
        ns,
        kms,
        op,
    }
}

// ----- readiness -------------------------------------------------------------

/// A TCP proxy to `target` that holds every answer back until `hold` has
/// passed since it started: lists (and everything else) are slow.
async fn slow_proxy(target: &str, hold: Duration) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let target = target.to_owned();
    let release = tokio::time::Instant::now() + hold;
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                let Ok(upstream) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut ur, mut uw) = upstream.into_split();
                let up = tokio::io::copy(&mut cr, &mut uw);
                let down = async {
                    tokio::time::sleep_until(release).await;
                    tokio::io::copy(&mut ur, &mut cw).await
                };
                let _ = tokio::join!(up, down);
            });
        }
    });
    (addr, task)
}

/// A replica whose initial lists are slow, probed on `/readyz` in a tight
/// loop from its first moment, becomes ready and syncs: a probe never takes
/// the start-up task's wake-up, and ready means the workers run.
#[tokio::test]
async fn a_readiness_probe_during_start_up_does_not_wedge_the_replica() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "sec-ready").await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret")])).await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    apply_cr(
        &client,
        &ns.name,
        cr("app", &kms.api(), "app-out", universal()),
    )
    .await;

    // The operator reaches the API server through a proxy that holds every
    // answer for 4 s.
    let kubeconfig = std::fs::read_to_string(harness::kubeconfig()).unwrap();
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("server in the kubeconfig")
        .to_owned();
    let (proxy, _proxy_task) = slow_proxy(&server, Duration::from_secs(4)).await;
    let dir = TempDir::new("slow-kubeconfig");
    let slow = dir.0.join("kubeconfig");
    std::fs::write(&slow, kubeconfig.replace(&server, &proxy)).unwrap();
    // Spawned, not awaited: what it answers before it is ready is the test.
    let op = Operator::spawn(
        &ns.name,
        &[&ns.name],
        &[],
        &[("KUBECONFIG", Some(slow.to_str().unwrap()))],
    );

    // Probe every millisecond from the first moment the health server
    // listens (its address comes from the log): the answers are what is
    // counted, so this loop is the measurement, not a wait.
    let http = reqwest::Client::new();
    let started = Instant::now();
    let (mut addr, mut not_ready, mut ready_at) = (None, 0, None);
    let mut every = kms_testkit::wait::every(Duration::from_millis(1));
    while started.elapsed() < Duration::from_secs(30) {
        if addr.is_none() {
            addr = op.served().into_iter().next();
            assert!(
                addr.is_some() || started.elapsed() < Duration::from_secs(20),
                "no health server:\n{}",
                op.output.text()
            );
        }
        if let Some(addr) = &addr {
            match http.get(format!("http://{addr}/readyz")).send().await {
                Ok(r) if r.status().is_success() => {
                    ready_at = Some(started.elapsed());
                    break;
                }
                Ok(_) => not_ready += 1,
                Err(_) => {}
            }
        }
        every.tick().await;
    }
    let ready_at = ready_at.unwrap_or_else(|| panic!("never ready:\n{}", op.output.text()));
    assert!(
        not_ready > 50,
        "only {not_ready} probes before ready: the lists were not slow"
    );
    // Ready means the workers run: the log says so (it is written before
    // the replica reports ready; reading it back may take a moment), and
    // the resource syncs.
    let started = wait_for(Duration::from_secs(5), || async {
        (!log_lines(&op, "workers started").is_empty()).then_some(())
    })
    .await;
    assert!(
        started.is_some(),
        "ready after {ready_at:?} without started workers"
    );
    wait_data(
        &client,
        &ns.name,
        "app-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
    println!("ready after {ready_at:?}, {not_ready} probes answered 503 before");
}

// ----- undecodable objects ----------------------------------------------------

fn push_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsPushSecret"),
        "kmspushsecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn push_cr(name: &str, host: &str, update_policy: &str) -> Value {
    json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsPushSecret",
        "metadata": {"name": name},
        "spec": {
            "hostAPI": host,
            "updatePolicy": update_policy,
            "destination": {"projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/pushed"},
            "authentication": {"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}}},
            "push": {"secret": {"secretName": "src"}}
        }
    })
}

/// Store a KmsPushSecret whose `updatePolicy` the operator's types do not
/// know, as a later schema that dropped a value would leave it: the CRD
/// accepts the value for a moment, then is restored.
async fn create_undecodable_push(client: &Client, ns: &str, name: &str, host: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = "kmspushsecrets.secrets.hanzo.ai";
    // Add or remove the value on the stored CRD (retried on a conflict).
    let set_value = |present: bool| {
        let crds = crds.clone();
        async move {
            let done = wait_for(Duration::from_secs(10), || async {
                let mut crd = crds.get(crd_name).await.expect("the CRD");
                let policy = crd.spec.versions[0]
                    .schema
                    .as_mut()
                    .and_then(|s| s.open_api_v3_schema.as_mut())
                    .and_then(|s| s.properties.as_mut())
                    .and_then(|p| p.get_mut("spec"))
                    .and_then(|s| s.properties.as_mut())
                    .and_then(|p| p.get_mut("updatePolicy"))
                    .expect("updatePolicy in the schema");
                let values = policy.enum_.get_or_insert_with(Vec::new);
                let value =
                    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON(
                        json!("RemovedLater"),
                    );
                values.retain(|v| *v != value);
                if present {
                    values.push(value);
                }
                crd.metadata.managed_fields = None;
                crds.replace(crd_name, &PostParams::default(), &crd)
                    .await
                    .ok()
            })
            .await;
            assert!(done.is_some(), "could not update the CRD");
        }
    };
    set_value(true).await;
    let obj: DynamicObject = serde_json::from_value(push_cr(name, host, "RemovedLater")).unwrap();
    let created = wait_for(Duration::from_secs(20), || {
        let (api, obj) = (push_api(client, ns), obj.clone());
        async move { api.create(&PostParams::default(), &obj).await.ok() }
    })
    .await;
    set_value(false).await;
    assert!(created.is_some(), "the CRD never accepted the value");
}

/// One object the operator cannot decode blocks nothing: a replica starting
/// with it in the cluster starts every controller, a running one keeps
/// watching the kind, and the object is reported once (Warning Event, one
/// log line naming it without its body, a gauge) until it is fixed.
#[tokio::test]
async fn an_undecodable_object_is_skipped_and_reported_once() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "sec-decode").await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret")])).await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    create_secret(&client, &ns.name, "src", json!({"PUSHED": "one"})).await;
    push_api(&client, &ns.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(push_cr("good", &kms.api(), "Replace")).unwrap(),
        )
        .await
        .unwrap();
    create_undecodable_push(&client, &ns.name, "broken", &kms.api()).await;
    apply_cr(
        &client,
        &ns.name,
        cr("sync", &kms.api(), "sync-out", universal()),
    )
    .await;

    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    // Every controller runs: the KmsSecret syncs, the good push pushes.
    wait_data(
        &client,
        &ns.name,
        "sync-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
    let pushed = |want: &'static str| {
        let kms = &kms;
        async move {
            wait_for(Duration::from_secs(30), || async {
                let stats = kms
                    .count("POST /api/v3/secrets/batch/raw", Some("200"))
                    .await
                    + kms
                        .count("PATCH /api/v3/secrets/batch/raw", Some("200"))
                        .await
                    + kms
                        .count("POST /api/v3/secrets/raw/:secretName", Some("200"))
                        .await
                    + kms
                        .count("PATCH /api/v3/secrets/raw/:secretName", Some("200"))
                        .await;
                (stats > 0).then_some(())?;
                let list = reqwest::Client::new();
                let login: Value = list
                    .post(format!("{}/v1/auth/universal-auth/login", kms.api()))
                    .json(&credentials())
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let body: Value = list
                    .get(format!("{}/v3/secrets/raw", kms.api()))
                    .query(&[
                        ("workspaceSlug", "demo"),
                        ("environment", "dev"),
                        ("secretPath", "/pushed"),
                    ])
                    .bearer_auth(login["accessToken"].as_str()?)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                body["secrets"]
                    .as_array()?
                    .iter()
                    .any(|s| s["secretKey"] == "PUSHED" && s["secretValue"] == want)
                    .then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("PUSHED={want} never reached the KMS"));
        }
    };
    pushed("one").await;

    // Reported: an Event on it, one log line naming it without its body, a
    // gauge.
    let event = wait_for(Duration::from_secs(20), || async {
        harness::events_of(&client, &ns.name, "broken")
            .await
            .into_iter()
            .find(|(reason, _)| reason == "UndecodableObject")
    })
    .await
    .expect("no UndecodableObject Event");
    assert!(event.1.contains("RemovedLater"), "{}", event.1);
    let lines = log_lines(&op, "cannot decode");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains(&format!("{}/broken", ns.name)),
        "{}",
        lines[0]
    );
    assert!(
        !lines[0].contains("kms-credentials"),
        "the body is in the log: {}",
        lines[0]
    );
    let gauge = |n: f64| {
        let op = &op;
        async move {
            wait_for(Duration::from_secs(20), || async {
                let text = scrape(op).await?;
                (sum(
                    &text,
                    "kms_operator_undecodable_objects",
                    &[("kind", "KmsPushSecret")],
                ) == n)
                    .then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("the gauge never showed {n}"));
        }
    };
    gauge(1.0).await;

    // A running replica keeps the kind's watch through a second one.
    create_undecodable_push(&client, &ns.name, "broken-too", &kms.api()).await;
    gauge(2.0).await;
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .patch(
            "src",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"PUSHED": "two"}})),
        )
        .await
        .unwrap();
    pushed("two").await;
    assert_eq!(log_lines(&op, "cannot decode").len(), 2);

    // Fixed, it is worked on like any other (it gets its finalizer).
    push_api(&client, &ns.name)
        .patch(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updatePolicy": "None"}})),
        )
        .await
        .unwrap();
    gauge(1.0).await;
    wait_for(Duration::from_secs(30), || async {
        let o = push_api(&client, &ns.name).get("broken").await.ok()?;
        o.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "pushsecret.secrets.hanzo.ai/finalizer")
            .then_some(())
    })
    .await
    .expect("the fixed resource was not reconciled");
}

// ----- a KMS that streams without end, or pauses -----------------------------

/// A loopback KMS stand-in: universal-auth logins succeed; `list` answers
/// every secret list. Requests are counted.
pub(crate) struct StandIn {
    url: String,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    pub(crate) async fn start(
        list: impl Fn() -> axum::response::Response + Send + Sync + 'static,
        login_too: bool,
    ) -> Self {
        use axum::response::IntoResponse;
        let list = Arc::new(list);
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let (list, counter) = (list.clone(), counter.clone());
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                if login_too && req.uri().path().ends_with("/universal-auth/login") {
                    return axum::Json(json!({"accessToken": "t", "expiresIn": 3600,
                        "accessTokenMaxTTL": 86400, "tokenType": "Bearer"}))
                    .into_response();
                }
                list()
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url,
            requests,
            task,
        }
    }

    pub(crate) fn api(&self) -> String {
        format!("{}/api", self.url)
    }

    fn count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Peak resident memory of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A KMS answer without Content-Length that streams far past the 32 MiB cap
/// is cut off at the cap: the replica's memory stays bounded, the condition
/// says why, and the target keeps its data.
#[tokio::test]
async fn a_chunked_answer_beyond_the_cap_is_cut_off() {
    use axum::response::IntoResponse;
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "sec-chunked").await;
    // 400 MiB in 1 MiB chunks, generated as they are sent.
    let hostile = StandIn::start(
        || {
            let chunks = futures::stream::iter(0..400).map(|i| {
                let mut chunk = vec![b' '; 1 << 20];
                if i == 0 {
                    chunk[..12].copy_from_slice(b"{\"secrets\":[");
                }
                Ok::<_, std::convert::Infallible>(bytes::Bytes::from(chunk))
            });
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                axum::body::Body::from_stream(chunks),
            )
                .into_response()
        },
        true,
    )
    .await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        cr("big", &hostile.api(), "big-out", universal()),
    )
    .await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "big",
        "Ready",
        "False",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(reason, "KMSBadResponse", "{message}");
    assert!(message.contains("larger than 33554432 bytes"), "{message}");
    assert!(secret(&client, &ns.name, "big-out").await.is_none());
    let peak = peak_rss(op.pid().unwrap());
    println!("peak RSS with a 400 MiB chunked answer: {} MiB", peak >> 20);
    assert!(
        peak < 250 << 20,
        "peak RSS {} MiB: the body was not cut off at the cap",
        peak >> 20
    );
}

/// A `429 Retry-After: 120` from one KMS endpoint pauses that endpoint only
/// and holds no worker: with every worker's worth of resources on the paused
/// endpoint, a resource on another endpoint of the same host syncs and
/// follows a label change at once; the paused ones say until when they wait.
#[tokio::test]
async fn a_paused_endpoint_delays_no_other() {
    use axum::response::IntoResponse;
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "sec-pause").await;
    let paused = StandIn::start(
        || {
            (
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                [(axum::http::header::RETRY_AFTER, "120")],
                axum::Json(json!({"statusCode": 429, "error": "RateLimitExceeded",
                    "message": "Rate limit exceeded. Please try again in 120 seconds"})),
            )
                .into_response()
        },
        false,
    )
    .await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret")])).await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    for i in 0..10 {
        apply_cr(
            &client,
            &ns.name,
            cr(
                &format!("paused-{i}"),
                &paused.api(),
                &format!("paused-{i}-out"),
                universal(),
            ),
        )
        .await;
    }
    wait_for(Duration::from_secs(30), || async {
        (paused.count() > 0).then_some(())
    })
    .await
    .expect("the paused endpoint was never asked");
    // Every paused resource has been tried (and is not Ready).
    let tried = wait_for(Duration::from_secs(30), || async {
        for i in 0..10 {
            let (status, _, _) =
                condition(&client, &ns.name, &format!("paused-{i}"), "Ready").await?;
            if status != "False" {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert!(tried.is_some(), "not every paused resource was tried");

    let t0 = Instant::now();
    apply_cr(
        &client,
        &ns.name,
        cr("fine", &kms.api(), "fine-out", universal()),
    )
    .await;
    wait_data(
        &client,
        &ns.name,
        "fine-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(15),
    )
    .await;
    let synced_after = t0.elapsed();
    patch_kms_secret(
        &client,
        &ns.name,
        "fine",
        json!({"metadata": {"labels": {"tier": "gold"}}}),
    )
    .await;
    let t1 = Instant::now();
    wait_for(Duration::from_secs(15), || async {
        let s = secret(&client, &ns.name, "fine-out").await?;
        (s.metadata.labels?.get("tier").map(String::as_str) == Some("gold")).then_some(())
    })
    .await
    .expect("the label change did not reach the Secret");
    println!(
        "another endpoint: synced after {synced_after:?}, label after {:?}",
        t1.elapsed()
    );

    // The paused ones wait, say until when, and do not hammer the endpoint.
    let (reason, message) = not_ready(&client, &ns.name, "paused-0").await;
    assert_eq!(reason, "KMSRateLimited", "{message}");
    assert!(message.contains("waits for its Retry-After"), "{message}");
    let asked = paused.count();
    assert!(asked <= 12, "the paused endpoint was asked {asked} times");
}

// ----- folders that do not exist ----------------------------------------------

fn folder_seed() -> String {
    format!(
        r#"projects:
  - slug: demo
    environments: [dev]
    secrets:
      dev:
        /:
          A: "1"
        /empty: {{}}
  - slug: other
    environments: [dev]
    secrets: {{dev: {{/: {{B: "2"}}}}}}
identities:
  - name: operator
    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}
    projects: [demo]
"#
    )
}

/// A folder or environment that does not exist never empties a Secret, on a
/// server that answers 404 as on one that lists it as empty (then the
/// folders API decides); a folder that exists and is empty syncs as empty;
/// when the check itself fails, the data stays and the condition says why.
/// Conditions keep track: a login that worked stays reported at the current
/// generation; a refusal names the project, environment and folder.
#[tokio::test]
async fn a_missing_folder_never_empties_a_secret() {
    let client = harness::client().await;
    for not_found in [false, true] {
        let ns = TestNamespace::new(&client, "sec-folder").await;
        let flags: &[&str] = if not_found {
            &["--missing-folders-not-found"]
        } else {
            &[]
        };
        let kms = DevServer::start_with(&folder_seed(), flags).await;
        create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
        let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
        let mode = if not_found { "404" } else { "200-empty" };
        let have = expect(&[("A", "1")]);

        // Synced, then pointed at a folder that does not exist.
        apply_cr(
            &client,
            &ns.name,
            cr("typo", &kms.api(), "typo-out", universal()),
        )
        .await;
        apply_cr(
            &client,
            &ns.name,
            cr("emptied", &kms.api(), "emptied-out", universal()),
        )
        .await;
        for name in ["typo-out", "emptied-out"] {
            wait_data(&client, &ns.name, name, &have, Duration::from_secs(30)).await;
        }
        rescope(&client, &ns.name, "typo", "demo", "dev", "/typo").await;
        let (reason, message) = not_ready(&client, &ns.name, "typo").await;
        assert_eq!(reason, "FolderNotFound", "{mode}: {message}");
        assert!(
            message.contains("environment dev") && message.contains("/typo"),
            "{mode}: {message}"
        );
        // A login that worked before the failure is reported, at the
        // resource's current generation.
        let ((status, observed), generation) =
            condition_of(&client, &ns.name, "typo", "secrets.hanzo.ai/LoadedKMSToken")
                .await
                .expect("LoadedKMSToken");
        assert_eq!((status.as_str(), observed), ("True", generation), "{mode}");

        // A folder that exists and is empty empties the Secret.
        rescope(&client, &ns.name, "emptied", "demo", "dev", "/empty").await;
        wait_data(
            &client,
            &ns.name,
            "emptied-out",
            &BTreeMap::new(),
            Duration::from_secs(30),
        )
        .await;
        wait_condition(
            &client,
            &ns.name,
            "emptied",
            "Ready",
            "True",
            Duration::from_secs(30),
        )
        .await;

        // A missing environment, and a new resource on a missing folder: no
        // empty target is created.
        apply_cr(
            &client,
            &ns.name,
            cr(
                "no-env",
                &kms.api(),
                "no-env-out",
                universal_at("demo", "nope", "/"),
            ),
        )
        .await;
        apply_cr(
            &client,
            &ns.name,
            cr(
                "fresh",
                &kms.api(),
                "fresh-out",
                universal_at("demo", "dev", "/missing/deep"),
            ),
        )
        .await;
        // A 404 is resolved to the part that is missing, as an empty list
        // is.
        let (reason, message) = not_ready(&client, &ns.name, "no-env").await;
        assert_eq!(reason, "EnvironmentNotFound", "{mode}: {message}");
        assert!(message.contains("nope"), "{mode}: {message}");
        let (reason, message) = not_ready(&client, &ns.name, "fresh").await;
        assert_eq!(reason, "FolderNotFound", "{mode}: {message}");
        assert!(message.contains("/missing/deep"), "{mode}: {message}");
        for name in ["no-env-out", "fresh-out"] {
            assert!(
                secret(&client, &ns.name, name).await.is_none(),
                "{mode}: {name} was created"
            );
        }
        assert_eq!(
            data_of(&secret(&client, &ns.name, "typo-out").await.unwrap()),
            have,
            "{mode}: the data was lost"
        );

        // A refusal names the project, environment and folder.
        apply_cr(
            &client,
            &ns.name,
            cr(
                "stranger",
                &kms.api(),
                "stranger-out",
                universal_at("other", "dev", "/"),
            ),
        )
        .await;
        let (reason, message) = not_ready(&client, &ns.name, "stranger").await;
        assert_eq!(reason, "KMSAccessDenied", "{mode}: {message}");
        assert!(
            message.contains("project other, environment dev, folder /"),
            "{mode}: {message}"
        );

        if !not_found {
            // The check itself fails (the folders API refuses): the data
            // stays and the condition says why.
            kms.fault(json!({"route": "GET /api/v1/folders", "errorRate": 1.0, "status": 403}))
                .await;
            rescope(&client, &ns.name, "emptied", "demo", "dev", "/").await;
            wait_data(
                &client,
                &ns.name,
                "emptied-out",
                &have,
                Duration::from_secs(30),
            )
            .await;
            rescope(&client, &ns.name, "emptied", "demo", "dev", "/gone").await;
            let (reason, message) = not_ready(&client, &ns.name, "emptied").await;
            assert_eq!(reason, "FolderCheckFailed", "{message}");
            assert!(message.contains("403"), "{message}");
            assert_eq!(
                data_of(&secret(&client, &ns.name, "emptied-out").await.unwrap()),
                have
            );
        }
    }
}

/// After a template error, the login that worked is still reported, at the
/// generation the error is for.
#[tokio::test]
async fn conditions_keep_the_login_through_a_template_error() {
    let Fixture {
        client,
        ns,
        kms,
        op: _op,
    } = fixture("sec-cond", &[("DB_PASSWORD", "s3cret")]).await;
    let mut value = cr("tpl", &kms.api(), "tpl-out", universal());
    value["spec"]["managedKubeSecretReferences"][0]["template"] =
        json!({"includeAllSecrets": false, "data": {"x": "{{ MISSING.Value }}"}});
    apply_cr(&client, &ns.name, value).await;
    for round in 0..2 {
        let (reason, message) = not_ready(&client, &ns.name, "tpl").await;
        assert_eq!(reason, "TemplateError", "{message}");
        let found = wait_for(Duration::from_secs(20), || async {
            let ((status, observed), generation) =
                condition_of(&client, &ns.name, "tpl", "secrets.hanzo.ai/LoadedKMSToken").await?;
            (status == "True" && observed == generation).then_some(())
        })
        .await;
        assert!(
            found.is_some(),
            "round {round}: LoadedKMSToken missing or at an old generation"
        );
        // A new generation, still failing.
        patch_kms_secret(
            &client,
            &ns.name,
            "tpl",
            json!({"spec": {"managedKubeSecretReferences": [{"secretName": "tpl-out", "creationPolicy": "Owner",
                "template": {"includeAllSecrets": false, "data": {"x": "{{ ALSO_MISSING.Value }}"}}}]}}),
        )
        .await;
    }
}

// ----- released targets, credentials in URLs, keys ------------------------------

/// A target removed from a resource's list is released with none of the
/// operator's markers left, so another resource may take it only with the
/// documented opt-in.
#[tokio::test]
async fn a_released_target_is_taken_only_with_the_opt_in() {
    let Fixture {
        client,
        ns,
        kms,
        op,
    } = fixture("sec-release", &[("A", "1")]).await;
    let mut first = cr("first", &kms.api(), "kept", universal());
    first["spec"]["managedKubeSecretReferences"] = json!([
        {"secretName": "kept", "creationPolicy": "Orphan"},
        {"secretName": "other", "creationPolicy": "Orphan"}
    ]);
    apply_cr(&client, &ns.name, first).await;
    let have = expect(&[("A", "1")]);
    wait_data(&client, &ns.name, "kept", &have, Duration::from_secs(30)).await;
    patch_kms_secret(
        &client,
        &ns.name,
        "first",
        json!({"spec": {"managedKubeSecretReferences": [{"secretName": "other", "creationPolicy": "Orphan"}]}}),
    )
    .await;
    let released = wait_for(Duration::from_secs(30), || async {
        let s = secret(&client, &ns.name, "kept").await?;
        let labels = s.metadata.labels.clone().unwrap_or_default();
        let annotations = s.metadata.annotations.clone().unwrap_or_default();
        let marked = labels
            .keys()
            .chain(annotations.keys())
            .any(|k| k.starts_with("secrets.hanzo.ai/") || k == "app.kubernetes.io/managed-by");
        (!marked).then_some(s)
    })
    .await
    .expect("the released Secret kept markers of the operator");
    assert_eq!(
        data_of(&released),
        have,
        "the data of a released Secret changed"
    );

    // Another resource may not take it without the opt-in.
    let mut second = cr("second", &kms.api(), "kept", universal());
    second["spec"]["managedKubeSecretReferences"] = json!([{"secretName": "kept", "creationPolicy": "Orphan",
        "template": {"includeAllSecrets": false, "data": {"B": "{{ A.Value }}-second"}}}]);
    apply_cr(&client, &ns.name, second).await;
    let (reason, message) = not_ready(&client, &ns.name, "second").await;
    assert_eq!(reason, "TargetNotManaged", "{message}");
    assert_eq!(
        data_of(&secret(&client, &ns.name, "kept").await.unwrap()),
        have
    );
    // With it, it may, at once: not at the resource's next retry, which
    // the refusal put more than 8 s away (it waits for a change or its
    // resync interval; the log says when it retries).
    let key = format!("{}/second", ns.name);
    let far = wait_for(Duration::from_secs(30), || async {
        log_lines(&op, "reconcile failed")
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["fields"]["key"] == key.as_str())
            .filter_map(|l| l["fields"]["retry_in"].as_str().map(retry_seconds))
            .next_back()
            .filter(|s| *s >= 8.0)
    })
    .await;
    assert!(
        far.is_some(),
        "the refusal's retry is not logged more than 8 s away:\n{}",
        log_lines(&op, "reconcile failed").join("\n")
    );
    let marked = Instant::now();
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"secrets.hanzo.ai/adopt": "true"}}})),
        )
        .await
        .unwrap();
    wait_data(
        &client,
        &ns.name,
        "kept",
        &expect(&[("B", "1-second")]),
        Duration::from_secs(30),
    )
    .await;
    let took = marked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "adopted {took:?} after the marker"
    );
}

/// Credentials written into `hostAPI` are never shown: not in the
/// condition, the Event or the log.
#[tokio::test]
async fn credentials_in_the_host_url_are_never_shown() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "sec-userinfo").await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        cr(
            "leaky",
            "http://admin:hunter2@127.0.0.1:9/api",
            "leaky-out",
            universal(),
        ),
    )
    .await;
    let (reason, message) = not_ready(&client, &ns.name, "leaky").await;
    assert_eq!(reason, "InvalidHost", "{message}");
    assert!(message.contains("http://***@127.0.0.1:9/api"), "{message}");
    let events = wait_for(Duration::from_secs(20), || async {
        let e = harness::events_of(&client, &ns.name, "leaky").await;
        (!e.is_empty()).then_some(e)
    })
    .await
    .expect("no Event");
    let everything = format!(
        "{message}\n{events:?}\n{}\n{:?}",
        op.output.text(),
        kms_secrets(&client, &ns.name)
            .get("leaky")
            .await
            .unwrap()
            .data["status"]
    );
    assert!(!everything.contains("hunter2"), "the password was shown");
}

/// A KMS key that cannot be a Secret key fails the sync with a reason of its
/// own, naming the key; a target name that is not a valid object name is
/// refused before any write, naming the field.
#[tokio::test]
async fn bad_keys_and_target_names_are_named() {
    let Fixture {
        client,
        ns,
        kms,
        op: _op,
    } = fixture("sec-names", &[("GOOD", "1"), ("bad key!", "2")]).await;
    apply_cr(
        &client,
        &ns.name,
        cr("keys", &kms.api(), "keys-out", universal()),
    )
    .await;
    let mut bad_name = cr("names", &kms.api(), "Not_A_Name", universal());
    bad_name["spec"]["managedKubeSecretReferences"][0]["template"] =
        json!({"includeAllSecrets": false, "data": {"GOOD": "{{ GOOD.Value }}"}});
    apply_cr(&client, &ns.name, bad_name).await;
    let (reason, message) = not_ready(&client, &ns.name, "keys").await;
    assert_eq!(reason, "InvalidSecretKey", "{message}");
    assert!(message.contains("\"bad key!\""), "{message}");
    let (reason, message) = not_ready(&client, &ns.name, "names").await;
    assert_eq!(reason, "InvalidSpec", "{message}");
    assert!(
        message.starts_with("managedKubeSecretReferences[0].secretName: \"Not_A_Name\""),
        "{message}"
    );
    assert!(secret(&client, &ns.name, "keys-out").await.is_none());
}

/// Each new cause is readable in `kubectl describe`: after `/` →
/// `/does-not-exist` → `/` → `/empty/nope`, the Events about the resource
/// name both missing folders, each in an Event of its own (one reason about
/// one object used to be one series that kept the first note).
#[tokio::test]
async fn a_new_cause_of_the_same_reason_is_a_new_event() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "sec-events").await;
    let kms = DevServer::start_with(&folder_seed(), &["--missing-folders-not-found"]).await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        cr("moving", &kms.api(), "moving-out", universal()),
    )
    .await;
    let have = expect(&[("A", "1")]);
    wait_data(
        &client,
        &ns.name,
        "moving-out",
        &have,
        Duration::from_secs(30),
    )
    .await;
    let folder_events = || async {
        harness::events_of(&client, &ns.name, "moving")
            .await
            .into_iter()
            .filter(|(reason, _)| reason == "FolderNotFound")
            .map(|(_, note)| note)
            .collect::<Vec<_>>()
    };
    rescope(
        &client,
        &ns.name,
        "moving",
        "demo",
        "dev",
        "/does-not-exist",
    )
    .await;
    let (reason, _) = not_ready(&client, &ns.name, "moving").await;
    assert_eq!(reason, "FolderNotFound");
    rescope(&client, &ns.name, "moving", "demo", "dev", "/").await;
    wait_condition(
        &client,
        &ns.name,
        "moving",
        "Ready",
        "True",
        Duration::from_secs(30),
    )
    .await;
    rescope(&client, &ns.name, "moving", "demo", "dev", "/empty/nope").await;
    let both = wait_for(Duration::from_secs(30), || async {
        let notes = folder_events().await;
        (notes.iter().any(|n| n.contains("/does-not-exist"))
            && notes.iter().any(|n| n.contains("/empty/nope")))
        .then_some(notes)
    })
    .await;
    let Some(notes) = both else {
        let all = harness::events_of(&client, &ns.name, "moving").await;
        panic!("the second missing folder is not in the Events: {all:#?}");
    };
    assert_eq!(notes.len(), 2, "{notes:#?}");
    // The secret kept its data throughout.
    wait_data(
        &client,
        &ns.name,
        "moving-out",
        &have,
        Duration::from_secs(5),
    )
    .await;
}
