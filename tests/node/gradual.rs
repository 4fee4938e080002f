//! Gradual reload on the real node: three Deployments of the probe image
//! (`tests/testenv/probe`, ready only when the value it reads is good)
//! use a Secret of a KmsSecret annotated `auto-reload-strategy: gradual`.
//! A good change rolls them one after another; a bad one rolls the first,
//! which never becomes ready, and the other two keep serving with their
//! old pods while the KmsSecret's condition names the first; a fixed value
//! rolls all three.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::default_install;
use crate::harness::*;

const NS: &str = "node-gradual";
const NAMES: [&str; 3] = ["g-1", "g-2", "g-3"];

fn deployment(name: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {NS}
  annotations: {{secrets.hanzo.ai/auto-reload: "true"}}
spec:
  replicas: 1
  progressDeadlineSeconds: 15
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 0, maxSurge: 1}}}}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: localhost/probe:1
        imagePullPolicy: Never
        env: [{{name: VALUE, valueFrom: {{secretKeyRef: {{name: app-out, key: A}}}}}}]
        readinessProbe:
          exec: {{command: [/probe, ready]}}
          periodSeconds: 1
          failureThreshold: 1
"#
    )
}

/// Each Deployment's state: the version its template was rolled to,
/// whether its rollout is complete, and the UIDs of its ready pods.
#[derive(Clone, Debug, PartialEq)]
struct State {
    rolled: Option<String>,
    complete: bool,
    ready_pods: Vec<String>,
}

async fn states(client: &Client) -> BTreeMap<&'static str, State> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut out = BTreeMap::new();
    // Read from the last Deployment to the first: one that has rolled was
    // let through when the one before it was complete, and that one is
    // still complete when it is read afterwards. Read first to last, the
    // one before can complete, and the next roll, between the two reads:
    // a snapshot that seems out of order while the order held (CI12 saw
    // g-2 mid-rollout and g-3 already rolled).
    for name in NAMES.iter().rev() {
        let name = *name;
        let Ok(d) = deployments.get(name).await else {
            continue;
        };
        let rolled = d
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("secrets.hanzo.ai/managed-secret.app-out").cloned());
        let st = d.status.clone().unwrap_or_default();
        let complete = st.observed_generation >= d.metadata.generation
            && st.updated_replicas == Some(1)
            && st.available_replicas == Some(1)
            && st.replicas == Some(1);
        let mut ready_pods: Vec<String> = pods
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .filter(|p| ready(p))
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        ready_pods.sort();
        out.insert(
            name,
            State {
                rolled,
                complete,
                ready_pods,
            },
        );
    }
    out
}

async fn version(client: &Client) -> Option<String> {
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS)
        .get("app-out")
        .await
        .ok()?
        .metadata
        .annotations?
        .get("secrets.hanzo.ai/version")
        .cloned()
}

/// The KmsSecret's `AutoRedeployReady`: reason and message.
async fn auto_redeploy(client: &Client) -> Option<(String, String)> {
    let o = kms_secrets(client, NS).get("app").await.ok()?;
    let c = o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "secrets.hanzo.ai/AutoRedeployReady")?
        .clone();
    Some((
        c["reason"].as_str()?.to_owned(),
        c["message"].as_str()?.to_owned(),
    ))
}

/// Set A, wait for the Secret's new version, and follow the rollouts
/// until all three complete at it: each Deployment must be complete at
/// the new version in the first snapshot where the next one has rolled.
async fn good_change(client: &Client, kms: &Kms, value: &str) -> String {
    kms.set_secret("A", value).await;
    wait_value(client, NS, "app-out", "A", value, Duration::from_secs(60)).await;
    let v = version(client).await.expect("a version");
    let order_checked = std::sync::Mutex::new([false; 3]);
    let done = wait_for(Duration::from_secs(180), || async {
        let s = states(client).await;
        let mut order_checked = order_checked.lock().unwrap();
        for i in 1..3 {
            if !order_checked[i] && s[NAMES[i]].rolled.as_ref() == Some(&v) {
                let before = &s[NAMES[i - 1]];
                assert!(
                    before.rolled.as_ref() == Some(&v) && before.complete,
                    "{} rolled before {} completed: {s:#?}",
                    NAMES[i],
                    NAMES[i - 1]
                );
                order_checked[i] = true;
            }
        }
        s.values()
            .all(|x| x.rolled.as_ref() == Some(&v) && x.complete && x.ready_pods.len() == 1)
            .then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "the good change {value} did not roll all three: {:#?}",
        states(client).await
    );
    v
}

/// Gradual reload of real Deployments (issue: a bad secret cannot take
/// down every workload at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14_gradual_reload_stops_a_bad_value_at_the_first_workload() {
    let started = Instant::now();
    let client = client().await;
    let kms = default_install(&client).await;
    tenant(&client, NS).await;
    kms.set_secret("A", "gradual-good-1").await;
    kms_secret(&client, NS, "app", "app-out", "Owner", "5s").await;
    kms_secrets(&client, NS)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "secrets.hanzo.ai/auto-reload-strategy": "gradual"}}})),
        )
        .await
        .unwrap();
    wait_value(
        &client,
        NS,
        "app-out",
        "A",
        "gradual-good-1",
        Duration::from_secs(60),
    )
    .await;
    for name in NAMES {
        let _ = run(
            "kubectl",
            &["-n", NS, "delete", "deployment", name, "--wait=true"],
        );
        apply(&deployment(name));
    }
    let up = wait_for(Duration::from_secs(120), || async {
        let s = states(&client).await;
        (s.len() == 3 && s.values().all(|x| x.complete && x.ready_pods.len() == 1)).then_some(())
    })
    .await;
    assert!(
        up.is_some(),
        "the probes did not start: {:#?}",
        states(&client).await
    );

    // A good change: one after another.
    let t = Instant::now();
    good_change(&client, &kms, "gradual-good-2").await;
    println!(
        "gradual reload of three Deployments: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let serving = states(&client).await;

    // A bad change: the first rolls and never becomes ready; the other two
    // keep their pods.
    kms.set_secret("A", "bad-gradual-3").await;
    wait_value(
        &client,
        NS,
        "app-out",
        "A",
        "bad-gradual-3",
        Duration::from_secs(60),
    )
    .await;
    let bad = version(&client).await.expect("a version");
    let held = wait_for(Duration::from_secs(120), || async {
        let (reason, message) = auto_redeploy(&client).await?;
        (reason == "RolloutHeld").then_some(message)
    })
    .await;
    let Some(held) = held else {
        panic!(
            "the reload was not held: {:?} {:#?}",
            auto_redeploy(&client).await,
            states(&client).await
        );
    };
    let short: String = bad.chars().take(12).collect();
    assert!(
        held.contains(&format!("Deployment {NS}/g-1"))
            && held.contains(&format!("Secret app-out version {short}")),
        "{held}"
    );
    let s = states(&client).await;
    assert_eq!(s["g-1"].rolled.as_ref(), Some(&bad), "{s:#?}");
    assert_eq!(
        s["g-1"].ready_pods, serving["g-1"].ready_pods,
        "g-1's old pod must keep serving (maxUnavailable 0 keeps it)"
    );
    let kept = holds_for(Duration::from_secs(10), || async {
        let s = states(&client).await;
        ["g-2", "g-3"].iter().all(|n| s[n] == serving[n])
    })
    .await;
    if let Err(when) = kept {
        panic!(
            "g-2 or g-3 moved while held {when}: {:#?} (before: {serving:#?})",
            states(&client).await
        );
    }

    // Fixed: all three roll, the first again first.
    good_change(&client, &kms, "gradual-good-4").await;
    let recovered = wait_for(Duration::from_secs(30), || async {
        (auto_redeploy(&client).await?.0 == "OK").then_some(())
    })
    .await;
    assert!(recovered.is_some(), "{:?}", auto_redeploy(&client).await);
    // Nothing stays behind: the other scenarios share the dev KMS (s10
    // counts its requests) and change A too.
    for name in NAMES {
        let _ = run(
            "kubectl",
            &["-n", NS, "delete", "deployment", name, "--wait=false"],
        );
    }
    ok(
        "kubectl",
        &["-n", NS, "delete", "kmssecret", "app", "--wait=true"],
    );
    report("s14 gradual reload", started.elapsed());
}
