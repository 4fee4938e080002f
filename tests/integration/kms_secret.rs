//! KmsSecret end to end: a real API server, the dev KMS over HTTP, and the
//! operator as a separate process.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, holds_for, wait_for};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator, create_credentials, seed};

const LIST: &str = "GET /api/v3/secrets/raw";
const LOGIN: &str = "POST /api/v1/auth/universal-auth/login";

pub(crate) fn kms_secrets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsSecret"),
        "kmssecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn kms_secret(name: &str, host: &str, target: &str, interval: &str) -> Value {
    json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsSecret",
        "metadata": {"name": name, "labels": {"team": "blue"}},
        "spec": {
            "hostAPI": host,
            "syncConfig": {"resyncInterval": interval},
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "kms-credentials"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": target, "creationPolicy": "Owner"}]
        }
    })
}

pub(crate) async fn apply_cr(client: &Client, ns: &str, value: Value) {
    let obj: DynamicObject = serde_json::from_value(value).unwrap();
    kms_secrets(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create KmsSecret");
}

pub(crate) fn data_of(s: &Secret) -> BTreeMap<String, String> {
    s.data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

pub(crate) fn expect(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Wait until the Secret exists with exactly `want`.
pub(crate) async fn wait_data(
    client: &Client,
    ns: &str,
    name: &str,
    want: &BTreeMap<String, String>,
    timeout: Duration,
) -> Secret {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    let last = std::sync::Arc::new(std::sync::Mutex::new(None));
    let found = wait_for(timeout, || {
        let (api, last) = (api.clone(), last.clone());
        async move {
            let s = api.get_opt(name).await.ok().flatten()?;
            let data = data_of(&s);
            *last.lock().unwrap() = Some(data.clone());
            (data == *want).then_some(s)
        }
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "Secret {ns}/{name} did not reach {want:?}; last seen {:?}",
            last.lock().unwrap()
        )
    })
}

/// The condition `type_` of a KmsSecret as written, and the resource's
/// generation.
pub(crate) async fn condition_json(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<(Value, i64)> {
    let o = kms_secrets(client, ns).get(name).await.ok()?;
    let c = o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    Some((c, o.metadata.generation.unwrap_or(0)))
}

/// The condition `type_` of a KmsSecret: (status, reason, message).
pub(crate) async fn condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let (c, _) = condition_json(client, ns, name, type_).await?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
        c["message"].as_str()?.to_owned(),
    ))
}

pub(crate) async fn wait_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    timeout: Duration,
) -> (String, String, String) {
    let last = std::sync::Arc::new(std::sync::Mutex::new(None));
    let found = wait_for(timeout, || {
        let last = last.clone();
        async move {
            let c = condition(client, ns, name, type_).await;
            last.lock().unwrap().clone_from(&c);
            c.filter(|(s, _, _)| s == status)
        }
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "{ns}/{name}: {type_} did not become {status}; last {:?}",
            last.lock().unwrap()
        )
    })
}

#[tokio::test]
async fn syncs_follows_changes_and_repairs_the_secret() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-e2e").await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret"), ("API_KEY", "abc")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let mut op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        kms_secret("app", &kms.api(), "app-secret", "5s"),
    )
    .await;

    let first = wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("API_KEY", "abc"), ("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
    let annotations = first.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("secrets.hanzo.ai/owner")
            .map(String::as_str),
        Some(format!("KmsSecret/{}/app", ns.name).as_str())
    );
    let labels = first.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("secrets.hanzo.ai/managed").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("kms-operator")
    );
    assert_eq!(labels.get("team").map(String::as_str), Some("blue"));
    let owners = first.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "KmsSecret");
    let (status, _, message) = wait_condition(
        &client,
        &ns.name,
        "app",
        "Ready",
        "True",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status, "True", "{message}");

    // A value changed in the KMS reaches the Secret within the interval.
    kms.set_secret("demo", "dev", "/", "DB_PASSWORD", "rotated")
        .await;
    wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("API_KEY", "abc"), ("DB_PASSWORD", "rotated")]),
        Duration::from_secs(15),
    )
    .await;

    // A deleted Secret is back within 5 s.
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    secrets
        .delete("app-secret", &DeleteParams::default())
        .await
        .unwrap();
    wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("API_KEY", "abc"), ("DB_PASSWORD", "rotated")]),
        Duration::from_secs(5),
    )
    .await;

    // An edited Secret is repaired within 5 s.
    secrets
        .patch(
            "app-secret",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"DB_PASSWORD": "tampered", "EXTRA": "x"}})),
        )
        .await
        .unwrap();
    wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("API_KEY", "abc"), ("DB_PASSWORD", "rotated")]),
        Duration::from_secs(5),
    )
    .await;

    // A key deleted in the KMS disappears from the Secret.
    kms.delete_secret("demo", "dev", "/", "API_KEY").await;
    wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("DB_PASSWORD", "rotated")]),
        Duration::from_secs(15),
    )
    .await;

    // A label changed on the resource reaches the Secret within 5 s.
    kms_secrets(&client, &ns.name)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "green", "tier": "web"}}})),
        )
        .await
        .unwrap();
    let labelled = wait_for(Duration::from_secs(5), || async {
        let s = secrets.get("app-secret").await.ok()?;
        let l = s.metadata.labels.unwrap_or_default();
        (l.get("team").map(String::as_str) == Some("green")
            && l.get("tier").map(String::as_str) == Some("web"))
        .then_some(())
    })
    .await;
    assert!(labelled.is_some(), "label change did not reach the Secret");

    // No secret value in the operator's log.
    op.stop();
    let log = op.output.text();
    assert!(!log.is_empty(), "no log captured");
    for value in ["s3cret", "rotated", "abc\"", CLIENT_SECRET, "tampered"] {
        assert!(
            !log.contains(value),
            "the log contains the secret value {value:?}"
        );
    }
}

#[tokio::test]
async fn a_resync_with_nothing_changed_is_a_304_and_writes_nothing() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-304").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(&client, &ns.name, kms_secret("cr", &kms.api(), "out", "5s")).await;
    let s = wait_data(
        &client,
        &ns.name,
        "out",
        &expect(&[("A", "1")]),
        Duration::from_secs(30),
    )
    .await;
    let rv = s.metadata.resource_version.clone();
    kms.reset_stats().await;
    // At least one full resync period (5 s ±10 %).
    let got_304 = wait_for(Duration::from_secs(15), || async {
        (kms.count(LIST, Some("304")).await >= 2).then_some(())
    })
    .await;
    assert!(
        got_304.is_some(),
        "no conditional GET answered 304: {}",
        kms.stats().await
    );
    assert_eq!(
        kms.count(LIST, Some("200")).await,
        0,
        "unconditional fetches: {}",
        kms.stats().await
    );
    assert_eq!(
        kms.count(LOGIN, None).await,
        0,
        "the token should be reused"
    );
    let now = Api::<Secret>::namespaced(client.clone(), &ns.name)
        .get("out")
        .await
        .unwrap();
    assert_eq!(
        now.metadata.resource_version, rv,
        "the Secret was written although nothing changed"
    );
}

#[tokio::test]
async fn an_outage_keeps_the_data_and_is_reported() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-outage").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(&client, &ns.name, kms_secret("cr", &kms.api(), "out", "5s")).await;
    wait_data(
        &client,
        &ns.name,
        "out",
        &expect(&[("A", "1")]),
        Duration::from_secs(30),
    )
    .await;

    kms.fault(json!({"outage": true})).await;
    let started = std::time::Instant::now();
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "cr",
        "secrets.hanzo.ai/ReadyToSyncSecrets",
        "False",
        Duration::from_secs(30),
    )
    .await;
    assert!(started.elapsed() <= Duration::from_secs(30));
    assert_eq!(reason, "KMSUnavailable", "{message}");
    assert!(message.contains("503"), "{message}");
    let (_, ready_reason, _) = condition(&client, &ns.name, "cr", "Ready").await.unwrap();
    assert_eq!(ready_reason, "KMSUnavailable");
    // Data kept.
    let s = Api::<Secret>::namespaced(client.clone(), &ns.name)
        .get("out")
        .await
        .unwrap();
    assert_eq!(data_of(&s), expect(&[("A", "1")]));

    kms.clear_faults().await;
    kms.set_secret("demo", "dev", "/", "A", "2").await;
    wait_data(
        &client,
        &ns.name,
        "out",
        &expect(&[("A", "2")]),
        Duration::from_secs(60),
    )
    .await;
    wait_condition(
        &client,
        &ns.name,
        "cr",
        "Ready",
        "True",
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test]
async fn a_rate_limit_is_respected() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-429").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    for i in 0..6 {
        apply_cr(
            &client,
            &ns.name,
            kms_secret(&format!("cr{i}"), &kms.api(), &format!("out{i}"), "5s"),
        )
        .await;
    }
    for i in 0..6 {
        wait_data(
            &client,
            &ns.name,
            &format!("out{i}"),
            &expect(&[("A", "1")]),
            Duration::from_secs(30),
        )
        .await;
    }
    for i in 0..6 {
        wait_condition(
            &client,
            &ns.name,
            &format!("cr{i}"),
            "Ready",
            "True",
            Duration::from_secs(15),
        )
        .await;
    }
    kms.fault(json!({"route": LIST, "rateLimitPerMinute": 10}))
        .await;
    kms.reset_stats().await;
    // Six resources every ~5 s would be ~70 lists a minute without a budget.
    // Throughout, every resource stays Ready: its targets hold the data of
    // its last sync, and the KMS only asked to come back later.
    let throttled_seen = std::cell::Cell::new(false);
    let held = holds_for(Duration::from_secs(65), || async {
        let Ok(list) = kms_secrets(&client, &ns.name)
            .list(&Default::default())
            .await
        else {
            return true;
        };
        for o in &list.items {
            let conditions = o.data["status"]["conditions"].as_array().cloned();
            let of = |t: &str| {
                conditions
                    .iter()
                    .flatten()
                    .find(|c| c["type"] == t)
                    .cloned()
                    .unwrap_or_default()
            };
            if of("Ready")["status"] != "True" {
                println!(
                    "{:?} not Ready while throttled: {}",
                    o.metadata.name,
                    of("Ready")
                );
                return false;
            }
            if of("secrets.hanzo.ai/ReadyToSyncSecrets")["reason"] == "KMSRateLimited" {
                throttled_seen.set(true);
            }
        }
        kms.count(LIST, None).await <= 10 + 3
    })
    .await;
    let total = kms.count(LIST, None).await;
    if let Err(when) = held {
        let limited = kms.count(LIST, Some("429")).await;
        panic!(
            "{total} list requests under a 10/min limit, more than 13 or a resource not Ready {when} ({limited} answered 429)"
        );
    }
    assert!(total >= 5, "the operator stopped syncing: {total}");
    assert!(
        throttled_seen.get(),
        "no resource said KMSRateLimited in secrets.hanzo.ai/ReadyToSyncSecrets"
    );
    kms.clear_faults().await;
}

/// Waiting for the KMS's budget is no failure: resources that have never
/// synced, refused again and again by short 429 pauses, have their status
/// written once (the condition's message does not change between
/// attempts), and the log has no warning for them; they sync as soon as
/// the KMS takes requests.
#[tokio::test]
async fn waiting_for_the_kms_budget_writes_the_status_once_and_warns_nothing() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-429-wait").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    kms.fault(json!({"route": LIST, "errorRate": 1.0, "status": 429, "retryAfterSeconds": 2}))
        .await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    for i in 0..3 {
        apply_cr(
            &client,
            &ns.name,
            kms_secret(&format!("w{i}"), &kms.api(), &format!("w{i}-out"), "5s"),
        )
        .await;
    }
    let api = kms_secrets(&client, &ns.name);
    let versions = || async {
        let mut out = Vec::new();
        for i in 0..3 {
            let o = api.get(&format!("w{i}")).await.ok()?;
            let limited = o.data["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["reason"] == "KMSRateLimited");
            if !limited {
                return None;
            }
            out.push(o.metadata.resource_version?);
        }
        Some(out)
    };
    let first = wait_for(Duration::from_secs(30), versions)
        .await
        .expect("the waiting resources did not say KMSRateLimited");
    let refused_before = kms.count(LIST, Some("429")).await;
    holds_for(Duration::from_secs(10), || async {
        versions().await.as_ref() == Some(&first)
    })
    .await
    .unwrap_or_else(|when| panic!("a waiting resource's status was written again {when}"));
    let refused = kms.count(LIST, Some("429")).await - refused_before;
    assert!(
        refused >= 3,
        "the resources were not tried again while they waited ({refused} refusals)"
    );
    let warnings: Vec<String> = op
        .output
        .text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("KMSRateLimited"))
        .map(str::to_owned)
        .collect();
    assert!(warnings.is_empty(), "warnings for waiting: {warnings:#?}");
    kms.clear_faults().await;
    for i in 0..3 {
        wait_data(
            &client,
            &ns.name,
            &format!("w{i}-out"),
            &expect(&[("A", "1")]),
            Duration::from_secs(30),
        )
        .await;
    }
}

/// Under a KMS's per-minute limit, a resource refused a read takes the
/// answer its replica got for the same folder moments before (for a
/// sibling resource) instead of waiting for the KMS's next window: one
/// list per minute serves three resources of one folder at once.
#[tokio::test]
async fn a_refused_read_takes_the_folders_kept_answer() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-429-kept").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    kms.fault(json!({"route": LIST, "rateLimitPerMinute": 1}))
        .await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        kms_secret("k0", &kms.api(), "k0-out", "1h"),
    )
    .await;
    wait_data(
        &client,
        &ns.name,
        "k0-out",
        &expect(&[("A", "1")]),
        Duration::from_secs(30),
    )
    .await;
    // Past the sharing window of an answer (2 s): the siblings' reads go
    // to the KMS, which refuses them until its window ends.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 1..3 {
        apply_cr(
            &client,
            &ns.name,
            kms_secret(&format!("k{i}"), &kms.api(), &format!("k{i}-out"), "1h"),
        )
        .await;
    }
    for i in 1..3 {
        wait_data(
            &client,
            &ns.name,
            &format!("k{i}-out"),
            &expect(&[("A", "1")]),
            Duration::from_secs(15),
        )
        .await;
        wait_condition(
            &client,
            &ns.name,
            &format!("k{i}"),
            "Ready",
            "True",
            Duration::from_secs(10),
        )
        .await;
    }
    let (served, refused) = (
        kms.count(LIST, Some("200")).await,
        kms.count(LIST, Some("429")).await,
    );
    assert_eq!(served, 1, "one list a minute: {served} served");
    assert!(
        refused >= 1,
        "no read was refused ({refused}): the test did not test the limit"
    );
    kms.clear_faults().await;
}

#[tokio::test]
async fn one_login_per_identity_and_one_list_per_scope() {
    let client = harness::client().await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    let mut namespaces = Vec::new();
    for _ in 0..5 {
        let ns = TestNamespace::new(&client, "ks-many").await;
        create_credentials(&client, &ns.name, "kms-credentials").await;
        namespaces.push(ns);
    }
    let names: Vec<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    let _op = Operator::start(names[0], &names, &["--allow-cross-namespace-refs"]).await;
    kms.reset_stats().await;
    for ns in &namespaces {
        for i in 0..10 {
            apply_cr(
                &client,
                &ns.name,
                kms_secret(&format!("cr{i}"), &kms.api(), &format!("out{i}"), "1h"),
            )
            .await;
        }
    }
    for ns in &namespaces {
        for i in 0..10 {
            wait_data(
                &client,
                &ns.name,
                &format!("out{i}"),
                &expect(&[("A", "1")]),
                Duration::from_secs(60),
            )
            .await;
        }
    }
    assert_eq!(
        kms.count(LOGIN, None).await,
        1,
        "logins: {}",
        kms.stats().await
    );
    let lists = kms.count(LIST, None).await;
    assert!(
        lists <= 10,
        "{lists} list requests for 50 resources on one scope"
    );

    // Resources on one scope that are due together share one list.
    let before = kms.count(LIST, None).await;
    let ns = &namespaces[0].name;
    for i in 0..10 {
        // Bump the generation of all ten at once: each needs fresh values now.
        kms_secrets(&client, ns)
            .patch(
                &format!("cr{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"syncConfig": {"resyncInterval": "2h"}}})),
            )
            .await
            .unwrap();
    }
    let settled = wait_for(Duration::from_secs(20), || async {
        let done = kms_secrets(&client, ns)
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .all(|o| {
                o.data["status"]["observedGeneration"]
                    == o.metadata.generation.map_or(Value::Null, Value::from)
            });
        done.then_some(())
    })
    .await;
    assert!(settled.is_some(), "resources did not settle");
    let shared = kms.count(LIST, None).await - before;
    assert!(
        shared <= 3,
        "{shared} list requests for 10 resources due together on one scope"
    );
}

// Credentials Secrets are read once per version and shared by the resources
// that use them; a change is read again at once, without waiting for a
// resync (the shared copy must never outlive its version).
#[tokio::test]
async fn changed_credentials_are_read_again_at_once() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-creds").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    let wrong: Secret = serde_json::from_value(json!({
        "metadata": {"name": "kms-credentials", "namespace": ns.name},
        "stringData": {"clientId": CLIENT_ID, "clientSecret": "not-the-secret"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &wrong)
        .await
        .expect("credentials");
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    for i in 0..3 {
        apply_cr(
            &client,
            &ns.name,
            kms_secret(&format!("cr{i}"), &kms.api(), &format!("out{i}"), "1h"),
        )
        .await;
    }
    for i in 0..3 {
        let (_, _, message) = wait_condition(
            &client,
            &ns.name,
            &format!("cr{i}"),
            "secrets.hanzo.ai/LoadedKMSToken",
            "False",
            Duration::from_secs(20),
        )
        .await;
        assert!(!message.contains("not-the-secret"), "{message}");
    }
    assert!(kms.count(LOGIN, Some("401")).await >= 1);
    assert!(secrets.get_opt("out0").await.unwrap().is_none());

    kms.reset_stats().await;
    secrets
        .patch(
            "kms-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"clientSecret": CLIENT_SECRET}})),
        )
        .await
        .expect("fix the credentials");
    for i in 0..3 {
        wait_data(
            &client,
            &ns.name,
            &format!("out{i}"),
            &expect(&[("A", "1")]),
            Duration::from_secs(15),
        )
        .await;
    }
    // One identity: one successful login for the three resources.
    assert_eq!(kms.count(LOGIN, Some("200")).await, 1);
}

#[tokio::test]
async fn invalid_references_are_reported_and_nothing_is_written() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-invalid").await;
    let other = TestNamespace::new(&client, "ks-other").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    let _op = Operator::start(&ns.name, &[&ns.name, &other.name], &[]).await;

    // Missing credentials Secret.
    apply_cr(
        &client,
        &ns.name,
        kms_secret("nocreds", &kms.api(), "out1", "5s"),
    )
    .await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "nocreds",
        "secrets.hanzo.ai/LoadedKMSToken",
        "False",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(reason, "CredentialsNotFound");
    assert!(
        message.contains(&format!(
            "credentials Secret {}/kms-credentials not found",
            ns.name
        )),
        "{message}"
    );
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    assert!(secrets.get_opt("out1").await.unwrap().is_none());
    // Creating the credentials fixes it without waiting for a resync.
    create_credentials(&client, &ns.name, "kms-credentials").await;
    wait_data(
        &client,
        &ns.name,
        "out1",
        &expect(&[("A", "1")]),
        Duration::from_secs(15),
    )
    .await;

    // A cross-namespace reference without the flag.
    let mut cross = kms_secret("cross", &kms.api(), "out2", "5s");
    cross["spec"]["authentication"]["universalAuth"]["credentialsRef"]["secretNamespace"] =
        json!(other.name);
    apply_cr(&client, &ns.name, cross).await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "cross",
        "Ready",
        "False",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(reason, "CrossNamespaceRefDenied");
    assert!(
        message.contains("--allow-cross-namespace-refs"),
        "{message}"
    );
    assert!(secrets.get_opt("out2").await.unwrap().is_none());

    // An existing Secret the operator did not create.
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "foreign", "namespace": ns.name},
        "stringData": {"keep": "me"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    apply_cr(
        &client,
        &ns.name,
        kms_secret("adopter", &kms.api(), "foreign", "5s"),
    )
    .await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "adopter",
        "Ready",
        "False",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(reason, "TargetNotManaged");
    assert!(
        message.contains(&format!("Secret {}/foreign exists", ns.name)),
        "{message}"
    );
    assert_eq!(
        data_of(&secrets.get("foreign").await.unwrap()),
        expect(&[("keep", "me")])
    );
    // Marking it adoptable lets the operator take it over.
    secrets
        .patch(
            "foreign",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"secrets.hanzo.ai/adopt": "true"}}})),
        )
        .await
        .unwrap();
    wait_data(
        &client,
        &ns.name,
        "foreign",
        &expect(&[("A", "1")]),
        Duration::from_secs(40),
    )
    .await;

    // Two resources on one target: the second gets a conflict naming the first.
    apply_cr(
        &client,
        &ns.name,
        kms_secret("second", &kms.api(), "out1", "5s"),
    )
    .await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "second",
        "Ready",
        "False",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(reason, "TargetConflict");
    assert!(
        message.contains(&format!("KmsSecret/{}/nocreds", ns.name)),
        "{message}"
    );
    let owner = secrets
        .get("out1")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    assert_eq!(
        owner.get("secrets.hanzo.ai/owner").map(String::as_str),
        Some(format!("KmsSecret/{}/nocreds", ns.name).as_str())
    );
}

#[tokio::test]
async fn templates_render_a_tls_secret_from_pkcs12_and_a_config_map() {
    use base64::Engine as _;
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-tls").await;
    // A real certificate and key, bundled as PKCS#12 with a password by the
    // engine itself, stored base64-encoded in the KMS as users do.
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["app.example.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    let mut data = kms_template::SecretData::new();
    data.insert(
        "CERT".into(),
        kms_template::SecretEntry::new(cert_pem.clone(), "/"),
    );
    data.insert(
        "KEY".into(),
        kms_template::SecretEntry::new(key_pem.clone(), "/"),
    );
    let p12_b64 = kms_template::Engine::default()
        .render(
            "setup",
            "{{ pemToPkcs12Pass(CERT.Value, KEY.Value, 'pw') }}",
            &data,
        )
        .unwrap();
    assert!(
        base64::engine::general_purpose::STANDARD
            .decode(p12_b64.trim())
            .is_ok()
    );

    let kms = DevServer::start(&seed(&[("P12", p12_b64.trim()), ("LOG_LEVEL", "debug")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let mut cr = kms_secret("tls", &kms.api(), "app-tls", "1h");
    cr["spec"]["managedKubeSecretReferences"] = json!([{
        "secretName": "app-tls",
        "secretType": "kubernetes.io/tls",
        "template": {"data": {
            "tls.crt": "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass('pw') }}",
            "tls.key": "{{ pkcs12keyPass('pw', decodeBase64ToBytes(P12.Value)) }}"
        }}
    }]);
    cr["spec"]["managedKubeConfigMapReferences"] = json!([{
        "configMapName": "app-config",
        "template": {"data": {"level": "{{ LOG_LEVEL.Value | upper }}", "from": "{{ secrets['LOG_LEVEL'].SecretPath }}"}}
    }]);
    apply_cr(&client, &ns.name, cr).await;

    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    let s = wait_for(Duration::from_secs(30), || async {
        secrets.get_opt("app-tls").await.ok().flatten()
    })
    .await
    .expect("the TLS Secret was not written");
    assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
    let d = data_of(&s);
    assert_eq!(
        d.keys().collect::<Vec<_>>(),
        vec!["tls.crt", "tls.key"],
        "only the template keys"
    );
    assert_eq!(d["tls.crt"].trim(), cert_pem.trim());
    assert!(
        d["tls.key"].starts_with("-----BEGIN PRIVATE KEY-----"),
        "key is PKCS#8 PEM"
    );
    // The key is the one that was bundled.
    let rekeyed = rcgen::KeyPair::from_pem(&d["tls.key"]).expect("parsable key");
    assert_eq!(rekeyed.public_key_raw(), key.public_key_raw());

    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns.name);
    let cm = wait_for(Duration::from_secs(10), || async {
        cms.get_opt("app-config").await.ok().flatten()
    })
    .await
    .expect("the ConfigMap was not written");
    let cm_data = cm.data.unwrap_or_default();
    assert_eq!(cm_data.get("level").map(String::as_str), Some("DEBUG"));
    assert_eq!(cm_data.get("from").map(String::as_str), Some("/"));

    // A template error names the field and writes nothing new.
    kms_secrets(&client, &ns.name)
        .patch(
            "tls",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"managedKubeConfigMapReferences": [{
                "configMapName": "app-config",
                "template": {"data": {"level": "{{ NOPE.Value }}"}}
            }]}})),
        )
        .await
        .unwrap();
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "tls",
        "Ready",
        "False",
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(reason, "TemplateError");
    assert!(
        message.contains("managedKubeConfigMapReferences[0].template.data.level"),
        "{message}"
    );
    let cm_after = cms
        .get("app-config")
        .await
        .unwrap()
        .data
        .unwrap_or_default();
    assert_eq!(
        cm_after.get("level").map(String::as_str),
        Some("DEBUG"),
        "the last good data stays"
    );
}

/// Access tokens that live 8 s and at most 24 s (the KMS refuses them
/// after that, as it does in production at its configured TTLs): a
/// resource resyncing every 5 s for 30 s keeps syncing with no failed
/// request — the operator renews a token before its TTL (twice per token)
/// and logs in again before its max TTL — and its conditions never leave
/// Ready; a change made late in the run still arrives. No restart is
/// involved.
#[tokio::test]
async fn syncs_never_stop_at_the_access_tokens_ttl_or_max_ttl() {
    const RENEW: &str = "POST /api/v1/auth/token/renew";
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "ks-ttl").await;
    let seed = seed(&[("A", "1")]).replace(
        "accessTokenTTL: 3600, accessTokenMaxTTL: 86400",
        "accessTokenTTL: 8, accessTokenMaxTTL: 24",
    );
    let kms = DevServer::start(&seed).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        kms_secret("app", &kms.api(), "app-secret", "5s"),
    )
    .await;
    wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("A", "1")]),
        Duration::from_secs(30),
    )
    .await;
    wait_condition(
        &client,
        &ns.name,
        "app",
        "Ready",
        "True",
        Duration::from_secs(10),
    )
    .await;
    kms.reset_stats().await;
    let steady = holds_for(Duration::from_secs(30), || async {
        matches!(
            condition(&client, &ns.name, "app", "Ready").await,
            Some((s, r, _)) if s == "True" && r == "Synced"
        ) && matches!(
            condition(&client, &ns.name, "app", "secrets.hanzo.ai/LoadedKMSToken").await,
            Some((s, _, _)) if s == "True"
        )
    })
    .await;
    assert!(steady.is_ok(), "{steady:?}");
    let stats = kms.stats().await;
    let failed: Vec<String> = stats
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(route, by)| {
            by.as_object()
                .unwrap()
                .keys()
                .filter(|code| !code.starts_with('2') && *code != "304")
                .map(move |code| format!("{route} {code}"))
        })
        .collect();
    assert!(failed.is_empty(), "failed requests: {failed:?} in {stats}");
    let (renewals, logins) = (
        kms.count(RENEW, Some("200")).await,
        kms.count(LOGIN, Some("200")).await,
    );
    assert!(renewals >= 2, "{renewals} renewals in 30 s: {stats}");
    assert!(
        logins >= 1,
        "{logins} logins in 30 s (max TTL 24 s): {stats}"
    );
    println!(
        "30 s with 8 s tokens capped at 24 s: {renewals} renewals, {logins} logins, no failed request"
    );
    kms.set_secret("demo", "dev", "/", "A", "late").await;
    wait_data(
        &client,
        &ns.name,
        "app-secret",
        &expect(&[("A", "late")]),
        Duration::from_secs(15),
    )
    .await;
}
