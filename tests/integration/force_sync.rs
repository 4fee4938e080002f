//! "Sync this now": the annotation `secrets.hanzo.ai/force-sync` and
//! `kms-operator sync` on a real API server with the dev KMS. A new value
//! makes the owning replica run a full sync at once (no not-due check, no
//! conditional request), once per value; the status records the value; a
//! sync the KMS throttles leaves it pending and the condition says so.
//! (The push and dynamic kinds are in `push.rs` and `dynamic.rs`.)

use std::process::Command;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::harness::{self, TestNamespace, holds_for, wait_for};
use crate::kms_secret::{apply_cr, condition, expect, kms_secrets, wait_condition, wait_data};
use crate::support::{DevServer, Operator, binary, create_credentials, seed};

const LIST: &str = "GET /api/v3/secrets/raw";
pub(crate) const ANNOTATION: &str = "secrets.hanzo.ai/force-sync";

/// Set the force-sync annotation of `name` to `value`.
pub(crate) async fn force(api: &Api<DynamicObject>, name: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: value}}})),
    )
    .await
    .expect("set the force-sync annotation");
}

/// `status.forceSync` of `name`.
pub(crate) async fn handled(api: &Api<DynamicObject>, name: &str) -> Option<String> {
    let o = api.get(name).await.ok()?;
    o.data["status"]["forceSync"].as_str().map(str::to_owned)
}

/// Wait until `status.forceSync` of `name` is `value`.
pub(crate) async fn wait_handled(api: &Api<DynamicObject>, name: &str, value: &str) {
    let done = wait_for(Duration::from_secs(20), || async {
        (handled(api, name).await.as_deref() == Some(value)).then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "status.forceSync of {name} is {:?}, not {value:?}, after 20 s",
        handled(api, name).await
    );
}

#[tokio::test]
async fn force_sync_runs_a_full_sync_once_per_value_and_waits_for_a_throttled_kms() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "force").await;
    let kms = DevServer::start(&seed(&[("A", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": "app"},
            "spec": {
                "hostAPI": kms.api(),
                "syncConfig": {"resyncInterval": "1h"},
                "authentication": {"universalAuth": {
                    "credentialsRef": {"secretName": "kms-credentials"},
                    "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
                }},
                "managedKubeSecretReferences": [{"secretName": "app-out"}]
            }
        }),
    )
    .await;
    let timeout = Duration::from_secs(30);
    wait_data(
        &client,
        &ns.name,
        "app-out",
        &expect(&[("A", "1")]),
        timeout,
    )
    .await;
    wait_condition(&client, &ns.name, "app", "Ready", "True", timeout).await;
    let api = kms_secrets(&client, &ns.name);

    // A change in the KMS that the hour's resync would not see for an
    // hour: force-sync brings it with one full fetch (a 200, not a 304).
    kms.set_secret("demo", "dev", "/", "A", "2").await;
    kms.reset_stats().await;
    force(&api, "app", "one").await;
    wait_data(
        &client,
        &ns.name,
        "app-out",
        &expect(&[("A", "2")]),
        timeout,
    )
    .await;
    wait_handled(&api, "app", "one").await;
    assert_eq!(kms.count(LIST, Some("200")).await, 1);
    assert_eq!(kms.count(LIST, None).await, 1, "{}", kms.stats().await);

    // Unchanged KMS, forced again: still a full fetch, not a conditional one.
    force(&api, "app", "two").await;
    wait_handled(&api, "app", "two").await;
    assert_eq!(kms.count(LIST, Some("200")).await, 2);
    assert_eq!(kms.count(LIST, Some("304")).await, 0);

    // The same value applied again, with another change that queues the
    // resource: no fetch (the value was handled; the resource is not due).
    api.patch(
        "app",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {ANNOTATION: "two"}, "labels": {"touched": "yes"}}}),
        ),
    )
    .await
    .unwrap();
    holds_for(Duration::from_secs(3), || async {
        kms.count(LIST, None).await == 2
    })
    .await
    .expect("a handled force-sync value fetched again");

    // `kms-operator sync` sets a new value and waits for the result.
    let out = Command::new(binary())
        .env("KUBECONFIG", harness::kubeconfig())
        .args(["sync", "app", "-n", &ns.name])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        format!(
            "KmsSecret {}/app synced: Ready is True (Synced): Synced 1 secrets",
            ns.name
        )
    );
    assert_eq!(kms.count(LIST, Some("200")).await, 3);
    let by_cli = handled(&api, "app").await.unwrap();
    assert_ne!(by_cli, "two");

    // The KMS answers 429 (come back in 3 s): the forced sync waits, says
    // so, stays pending, and runs once the KMS takes requests again.
    kms.fault(json!({"route": LIST, "errorRate": 1.0, "status": 429, "retryAfterSeconds": 3}))
        .await;
    force(&api, "app", "three").await;
    let waiting = wait_for(timeout, || async {
        let (_, _, message) = condition(&client, &ns.name, "app", "secrets.hanzo.ai/ReadyToSyncSecrets").await?;
        message
            .contains("the forced sync (secrets.hanzo.ai/force-sync: three) runs once the KMS takes requests again")
            .then_some(message)
    })
    .await;
    assert!(
        waiting.is_some(),
        "no condition says the forced sync waits: {:?}",
        condition(
            &client,
            &ns.name,
            "app",
            "secrets.hanzo.ai/ReadyToSyncSecrets"
        )
        .await
    );
    assert_eq!(handled(&api, "app").await.as_deref(), Some(by_cli.as_str()));
    kms.set_secret("demo", "dev", "/", "A", "3").await;
    kms.clear_faults().await;
    wait_handled(&api, "app", "three").await;
    wait_data(
        &client,
        &ns.name,
        "app-out",
        &expect(&[("A", "3")]),
        timeout,
    )
    .await;
}
