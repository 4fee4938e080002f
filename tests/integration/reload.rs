//! Auto-reload on a real API server: workloads that opted in roll exactly
//! when a Secret they use really changed (counted by the Deployment's
//! `metadata.generation`, which moves only on spec changes).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, holds_for, wait_for};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator};

fn kms_secrets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsSecret"),
        "kmssecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn seed() -> String {
    format!(
        "projects:\n  - slug: demo\n    name: Demo\n    environments: [dev]\n    secrets:\n      dev:\n        /:\n          A: a1\n          B: b1\n        /other:\n          D: d1\n\
         identities:\n  - name: operator\n    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}\n    projects: [demo]\n"
    )
}

async fn kms_secret(
    client: &Client,
    ns: &str,
    name: &str,
    host: &str,
    target: &str,
    template: Option<Value>,
) {
    let mut target_spec = json!({"secretName": target});
    if let Some(t) = template {
        target_spec["template"] = t;
    }
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
        "metadata": {"name": name},
        "spec": {
            "hostAPI": host,
            "syncConfig": {"resyncInterval": "5s"},
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "creds"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [target_spec]
        }
    }))
    .unwrap();
    kms_secrets(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .expect("KmsSecret");
}

/// The universal-auth credentials Secret `creds` the resources log in with.
async fn credentials(client: &Client, ns: &str) {
    let creds: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"}, "stringData": {"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
}

async fn deployment(client: &Client, ns: &str, name: &str, opt_in: bool, pod: Value) {
    let mut annotations = serde_json::Map::new();
    if opt_in {
        annotations.insert("secrets.hanzo.ai/auto-reload".into(), json!("true"));
    }
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod}
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await
        .expect("Deployment");
}

/// Counts changes of each Deployment's pod template (a rollout is a
/// template change; a Deployment's generation also moves on annotation
/// changes, so it cannot serve as the counter).
#[derive(Clone, Default)]
struct Rollouts(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (String, i64)>>>);

impl Rollouts {
    fn watch(client: &Client, ns: &str) -> (Self, tokio::task::JoinHandle<()>) {
        use futures::StreamExt;
        let me = Self::default();
        let api = Api::<Deployment>::namespaced(client.clone(), ns);
        let state = me.0.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(kube::runtime::watcher(api, Default::default()));
            while let Some(Ok(event)) = stream.next().await {
                let (kube::runtime::watcher::Event::Apply(d)
                | kube::runtime::watcher::Event::InitApply(d)) = event
                else {
                    continue;
                };
                let name = d.metadata.name.clone().unwrap_or_default();
                let template = serde_json::to_string(&d.spec.template).unwrap();
                let mut state = state.lock().unwrap();
                let entry = state.entry(name).or_insert_with(|| (template.clone(), 0));
                if entry.0 != template {
                    *entry = (template, entry.1 + 1);
                }
            }
        });
        (me, task)
    }

    fn count(&self, name: &str) -> i64 {
        self.0.lock().unwrap().get(name).map_or(-1, |e| e.1)
    }

    fn counts(&self, names: &[&str]) -> Vec<i64> {
        names.iter().map(|n| self.count(n)).collect()
    }
}

async fn stamps(client: &Client, ns: &str, name: &str) -> (usize, usize) {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let count = |m: Option<std::collections::BTreeMap<String, String>>| {
        m.unwrap_or_default()
            .keys()
            .filter(|k| k.starts_with("secrets.hanzo.ai/managed-secret."))
            .count()
    };
    let template = d.spec.template.metadata.and_then(|m| m.annotations);
    (count(d.metadata.annotations), count(template))
}

/// Bump the generation of a KmsSecret so it syncs right away.
/// Sync `name` now with a fresh answer (a new `force-sync` value: a spec
/// change alone may take the folder's answer of up to 2 s ago, from before
/// the change the test just made), and set its resync interval.
async fn poke(client: &Client, ns: &str, name: &str, interval: &str) {
    let nonce = format!("{interval}-{}", fastrand::u64(..));
    kms_secrets(client, ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"secrets.hanzo.ai/force-sync": nonce}},
                "spec": {"syncConfig": {"resyncInterval": interval}}
            })),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn workloads_roll_exactly_when_a_secret_they_use_changes() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "reload").await;
    let kms = DevServer::start(&seed()).await;
    credentials(&client, &ns.name).await;
    let flags = ["--reload-debounce", "6"];
    let (rollouts, watch) = Rollouts::watch(&client, &ns.name);
    let mut op = Operator::start(&ns.name, &[&ns.name], &flags).await;

    // s1 holds only A (a template); s2 and s3 hold everything at "/".
    kms_secret(
        &client,
        &ns.name,
        "one",
        &kms.api(),
        "s1",
        Some(json!({"data": {"A": "{{ A.Value }}"}})),
    )
    .await;
    kms_secret(&client, &ns.name, "two", &kms.api(), "s2", None).await;
    kms_secret(&client, &ns.name, "three", &kms.api(), "s3", None).await;
    let container =
        |env: Value| json!({"name": "init", "image": "example.invalid/app:1", "env": env});
    deployment(&client, &ns.name, "web", true, json!({"containers": [
        {"name": "app", "image": "example.invalid/app:1", "envFrom": [{"secretRef": {"name": "s1"}}]}
    ]}))
    .await;
    deployment(&client, &ns.name, "api", true, json!({
        "initContainers": [container(json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "A"}}}]))],
        "containers": [{"name": "app", "image": "example.invalid/app:1", "volumeMounts": [{"name": "v", "mountPath": "/s"}]}],
        "volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s3"}}, {"secret": {"name": "s1"}}]}}]
    }))
    .await;
    deployment(&client, &ns.name, "plain", false, json!({"containers": [
        {"name": "app", "image": "example.invalid/app:1", "envFrom": [{"secretRef": {"name": "s1"}}]}
    ]}))
    .await;
    deployment(&client, &ns.name, "other", true, json!({"containers": [
        {"name": "app", "image": "example.invalid/app:1", "envFrom": [{"secretRef": {"name": "unrelated"}}]}
    ]}))
    .await;

    // Opting in records the versions without rolling.
    let recorded = wait_for(Duration::from_secs(30), || async {
        (stamps(&client, &ns.name, "web").await == (1, 0)
            && stamps(&client, &ns.name, "api").await == (3, 0))
            .then_some(())
    })
    .await;
    assert!(
        recorded.is_some(),
        "stamps not recorded: web {:?} api {:?}\n{}",
        stamps(&client, &ns.name, "web").await,
        stamps(&client, &ns.name, "api").await,
        op.output.text()
    );
    let names = ["web", "api", "plain", "other"];
    // For a debounce window: nothing rolls on opt-in.
    holds_for(Duration::from_secs(6), || async {
        rollouts.counts(&names) == [0, 0, 0, 0]
    })
    .await
    .unwrap_or_else(|when| {
        panic!(
            "something rolled on opt-in {when}: {:?}",
            rollouts.counts(&names)
        )
    });
    // The condition counts the workloads that use s1: web and api.
    let counted = wait_for(Duration::from_secs(15), || async {
        let o = kms_secrets(&client, &ns.name).get("one").await.ok()?;
        let c = o.data["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "secrets.hanzo.ai/AutoRedeployReady")?
            .clone();
        c["message"]
            .as_str()?
            .starts_with("2 workload")
            .then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "AutoRedeployReady does not count 2 workloads"
    );

    // B changes: it reaches s2 and s3, not s1. Three Secrets of "api"
    // change within the debounce window: one rollout; "web" none.
    kms.set_secret("demo", "dev", "/", "B", "b2").await;
    for cr in ["one", "two", "three"] {
        poke(&client, &ns.name, cr, "6s").await;
    }
    let rolled = wait_for(Duration::from_secs(30), || async {
        (rollouts.count("api") == 1).then_some(())
    })
    .await;
    assert!(rolled.is_some(), "api did not roll after B changed");
    // While more resyncs pass, nothing else may roll.
    holds_for(Duration::from_secs(10), || async {
        rollouts.counts(&names) == [0, 1, 0, 0]
    })
    .await
    .unwrap_or_else(|when| {
        panic!(
            "web/plain/other must not roll, api exactly once; {when}: {:?}",
            rollouts.counts(&names)
        )
    });

    // A change in another folder reaches no Secret: nothing rolls.
    kms.set_secret("demo", "dev", "/other", "D", "d2").await;
    holds_for(Duration::from_secs(10), || async {
        rollouts.counts(&names) == [0, 1, 0, 0]
    })
    .await
    .unwrap_or_else(|when| {
        panic!(
            "a key outside the scope rolled something {when}: {:?}",
            rollouts.counts(&names)
        )
    });

    // A changes: s1, s2, s3 all change together; web and api roll once
    // each.
    kms.set_secret("demo", "dev", "/", "A", "a2").await;
    for cr in ["one", "two", "three"] {
        poke(&client, &ns.name, cr, "7s").await;
    }
    let rolled = wait_for(Duration::from_secs(30), || async {
        (rollouts.count("web") == 1 && rollouts.count("api") == 2).then_some(())
    })
    .await;
    assert!(
        rolled.is_some(),
        "web/api did not roll after A changed: {:?}",
        rollouts.counts(&names)
    );
    holds_for(Duration::from_secs(10), || async {
        rollouts.counts(&names) == [1, 2, 0, 0]
    })
    .await
    .unwrap_or_else(|when| {
        panic!(
            "more rollouts than changes {when}: {:?}",
            rollouts.counts(&names)
        )
    });
    let web = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("web")
        .await
        .unwrap();
    let template = web.spec.template.metadata.unwrap().annotations.unwrap();
    let s1 = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns.name)
        .get("s1")
        .await
        .unwrap();
    assert_eq!(
        template.get("secrets.hanzo.ai/managed-secret.s1"),
        s1.metadata
            .annotations
            .unwrap()
            .get("secrets.hanzo.ai/version"),
        "the pod template carries the Secret's version"
    );

    // A restart rolls nothing.
    op.stop();
    let _op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    holds_for(Duration::from_secs(15), || async {
        rollouts.counts(&names) == [1, 2, 0, 0]
    })
    .await
    .unwrap_or_else(|when| {
        panic!(
            "a restart rolled something {when}: {:?}",
            rollouts.counts(&names)
        )
    });
    watch.abort();

    // One Event per rollout, naming the Secret.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap();
    let for_web: Vec<_> = events
        .items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                && e.reason.as_deref() == Some("SecretChanged")
        })
        .collect();
    assert_eq!(for_web.len(), 1, "{for_web:?}");
    assert!(
        for_web[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("Secret s1")
    );
}

/// A Deployment as the Go operators leave it: opted in with `opt_in` (one
/// of their annotation spellings), stamped (metadata and pod template) with
/// `stamps`, using the Secrets `uses` through `envFrom`.
async fn go_deployment(
    client: &Client,
    ns: &str,
    name: &str,
    opt_in: &str,
    stamps: &[(&str, &str)],
    uses: &[&str],
) {
    let mut annotations = serde_json::Map::new();
    annotations.insert(opt_in.into(), json!("true"));
    let mut template = serde_json::Map::new();
    for (k, v) in stamps {
        annotations.insert((*k).into(), json!(v));
        template.insert((*k).into(), json!(v));
    }
    let env_from: Vec<Value> = uses
        .iter()
        .map(|s| json!({"secretRef": {"name": s}}))
        .collect();
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": template},
                "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1", "envFrom": env_from}]}
            }
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await
        .expect("Deployment");
}

/// What a workload records for `secret` under our stamp key.
async fn recorded(client: &Client, ns: &str, name: &str, secret: &str) -> Option<String> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    d.metadata
        .annotations?
        .get(&format!("secrets.hanzo.ai/managed-secret.{secret}"))
        .cloned()
}

#[tokio::test]
async fn the_go_operators_annotations_and_stamps_are_understood() {
    use k8s_openapi::api::core::v1::Secret;
    use kms_operator::controllers::target::go_version_of;

    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "reload-go").await;
    let kms = DevServer::start(&seed()).await;
    credentials(&client, &ns.name).await;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);

    // Secrets the Go operator wrote with the KMS's current data: one with
    // its older version format (a hash of its fetched list, which only the
    // annotation knows), one with the newer (a CRC of the data).
    let data = [("A", "a1"), ("B", "b1")];
    let bytes: std::collections::BTreeMap<String, Vec<u8>> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
    let old_format = "W/\"secrets-180-5E2A9C11\"";
    let new_format = go_version_of(&bytes);
    for (name, version) in [("go-old", old_format), ("go-new", new_format.as_str())] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"secrets.hanzo.ai/version": version}},
            "stringData": {"A": "a1", "B": "b1"}
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    // Workloads the Go operator stamped for that data (the seed documents'
    // group: the same stamp key as ours), and one opted in with upstream
    // Infisical's annotation, never stamped.
    go_deployment(
        &client,
        &ns.name,
        "stamped-old",
        "secrets.hanzo.ai/auto-reload",
        &[("secrets.hanzo.ai/managed-secret.go-old", old_format)],
        &["go-old"],
    )
    .await;
    go_deployment(
        &client,
        &ns.name,
        "stamped-new",
        "kms.hanzo.ai/auto-reload",
        &[("secrets.hanzo.ai/managed-secret.go-new", &new_format)],
        &["go-new"],
    )
    .await;
    go_deployment(
        &client,
        &ns.name,
        "infisical",
        "secrets.infisical.com/auto-reload",
        &[],
        &["inf"],
    )
    .await;

    let (rollouts, watch) = Rollouts::watch(&client, &ns.name);
    let _op = Operator::start(&ns.name, &[&ns.name], &["--reload-debounce", "2"]).await;
    // kms-operator takes the Secrets over (their Go version annotation lets
    // it) and writes the same data.
    kms_secret(&client, &ns.name, "old", &kms.api(), "go-old", None).await;
    kms_secret(&client, &ns.name, "new", &kms.api(), "go-new", None).await;
    kms_secret(&client, &ns.name, "inf", &kms.api(), "inf", None).await;

    // Our versions are recorded in place of the Go stamps, without a
    // rollout.
    let names = ["stamped-old", "stamped-new", "infisical"];
    let taken_over = wait_for(Duration::from_secs(30), || async {
        for (workload, secret) in [
            ("stamped-old", "go-old"),
            ("stamped-new", "go-new"),
            ("infisical", "inf"),
        ] {
            let s = secrets.get(secret).await.ok()?;
            let ours = s
                .metadata
                .annotations?
                .get("secrets.hanzo.ai/version")?
                .clone();
            if ours.starts_with("W/")
                || recorded(&client, &ns.name, workload, secret).await? != ours
            {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert!(
        taken_over.is_some(),
        "our versions not recorded; rollouts {:?}; stamped-old records {:?}",
        rollouts.counts(&names),
        recorded(&client, &ns.name, "stamped-old", "go-old").await
    );
    let adopted = secrets.get("go-old").await.unwrap();
    let bound = adopted
        .metadata
        .annotations
        .unwrap_or_default()
        .get("secrets.hanzo.ai/go-versions")
        .cloned()
        .unwrap_or_default();
    assert!(bound.ends_with(old_format), "go-versions: {bound:?}");
    holds_for(Duration::from_secs(8), || async {
        rollouts.counts(&names) == [0, 0, 0]
    })
    .await
    .unwrap_or_else(|when| {
        panic!(
            "a workload stamped by the Go operator rolled at the hand-over {when}: {:?}",
            rollouts.counts(&names)
        )
    });

    // A real change rolls each of them once, the Infisical-annotated one
    // included.
    kms.set_secret("demo", "dev", "/", "A", "a2").await;
    for cr in ["old", "new", "inf"] {
        poke(&client, &ns.name, cr, "6s").await;
    }
    let rolled = wait_for(Duration::from_secs(30), || async {
        (rollouts.counts(&names) == [1, 1, 1]).then_some(())
    })
    .await;
    assert!(
        rolled.is_some(),
        "not one rollout each after a real change: {:?}",
        rollouts.counts(&names)
    );
    // The binding is gone with the data it stood for.
    let changed = secrets.get("go-old").await.unwrap();
    assert!(
        !changed
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("secrets.hanzo.ai/go-versions")
    );
    holds_for(Duration::from_secs(6), || async {
        rollouts.counts(&names) == [1, 1, 1]
    })
    .await
    .unwrap_or_else(|when| panic!("more rollouts {when}: {:?}", rollouts.counts(&names)));
    watch.abort();
}

/// The Argo Rollouts CRD as far as the API server needs it to serve
/// Rollouts (the real one adds a full schema; what auto-reload reads and
/// writes is the same).
fn rollout_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": "rollouts.argoproj.io"},
        "spec": {
            "group": "argoproj.io",
            "scope": "Namespaced",
            "names": {"kind": "Rollout", "listKind": "RolloutList", "plural": "rollouts",
                      "singular": "rollout", "shortNames": ["ro"]},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap()
}

/// Remove the Rollout CRD (left by an earlier run on the same API server)
/// and wait until it is gone.
async fn remove_rollout_crd(client: &Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let _ = crds
        .delete("rollouts.argoproj.io", &Default::default())
        .await;
    let gone = wait_for(Duration::from_secs(60), || async {
        crds.get_opt("rollouts.argoproj.io")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the Rollout CRD was not deleted");
}

fn rollouts(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout"),
        "rollouts",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn rollout(client: &Client, ns: &str, name: &str, opt_in: bool, spec: Value) {
    let mut annotations = serde_json::Map::new();
    if opt_in {
        annotations.insert("secrets.hanzo.ai/auto-reload".into(), json!("true"));
    }
    let mut body = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {}}]}}}
    });
    for (k, v) in spec.as_object().unwrap() {
        body["spec"][k] = v.clone();
    }
    rollouts(client, ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .expect("Rollout");
}

/// A Rollout's `spec.restartAt`, its recorded version of `secret`, and
/// its pod template's annotations.
async fn rollout_state(
    client: &Client,
    ns: &str,
    name: &str,
    secret: &str,
) -> (Value, Value, Value) {
    let r = rollouts(client, ns).get(name).await.unwrap();
    (
        r.data["spec"]["restartAt"].clone(),
        r.metadata
            .annotations
            .unwrap_or_default()
            .get(&format!("secrets.hanzo.ai/managed-secret.{secret}"))
            .map_or(Value::Null, |v| json!(v)),
        r.data["spec"]["template"]["metadata"]["annotations"].clone(),
    )
}

async fn version_of(client: &Client, ns: &str, secret: &str) -> Option<String> {
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .get_opt(secret)
        .await
        .ok()??
        .metadata
        .annotations?
        .get("secrets.hanzo.ai/version")
        .cloned()
}

/// Argo Rollouts join auto-reload when their CRD is served, even when it
/// is installed after the operator started: a Rollout is restarted through
/// `spec.restartAt` (its template untouched), whether it holds its pod
/// template or takes it from a Deployment through `workloadRef`; one that
/// did not opt in is never written.
#[tokio::test]
async fn argo_rollouts_are_reloaded_once_their_crd_is_served() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "reload-argo").await;
    let kms = DevServer::start(&seed()).await;
    credentials(&client, &ns.name).await;
    remove_rollout_crd(&client).await;
    let op = Operator::start(
        &ns.name,
        &[&ns.name],
        &["--reload-debounce", "1", "--argo-rollouts"],
    )
    .await;
    kms_secret(&client, &ns.name, "one", &kms.api(), "s1", None).await;
    kms_secret(
        &client,
        &ns.name,
        "two",
        &kms.api(),
        "s2",
        Some(json!({"data": {"B": "{{ B.Value }}"}})),
    )
    .await;
    let env_from = |s: &str| {
        json!({"containers": [
            {"name": "app", "image": "example.invalid/app:1", "envFrom": [{"secretRef": {"name": s}}]}
        ]})
    };
    // The Deployment a Rollout takes its template from (not opted in
    // itself, as Argo Rollouts leaves it scaled to zero).
    deployment(&client, &ns.name, "base", false, env_from("s1")).await;
    let first = wait_for(Duration::from_secs(30), || async {
        let (a, b) = (
            version_of(&client, &ns.name, "s1").await?,
            version_of(&client, &ns.name, "s2").await?,
        );
        Some((a, b))
    })
    .await;
    let (v1, s2_version) = first.expect("s1 and s2 were not written");

    // Installed while the operator runs.
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &rollout_crd())
        .await
        .expect("the Rollout CRD");
    let served = wait_for(Duration::from_secs(30), || async {
        rollouts(&client, &ns.name)
            .list(&Default::default())
            .await
            .ok()
    })
    .await;
    assert!(served.is_some(), "the API server does not serve Rollouts");
    let template = |s: &str| json!({"metadata": {"labels": {"app": "x"}}, "spec": env_from(s)});
    rollout(
        &client,
        &ns.name,
        "inline",
        true,
        json!({"template": template("s1")}),
    )
    .await;
    rollout(
        &client,
        &ns.name,
        "by-ref",
        true,
        json!({"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "base"}}),
    )
    .await;
    rollout(
        &client,
        &ns.name,
        "plain",
        false,
        json!({"template": template("s1")}),
    )
    .await;

    // Opting in records the version without restarting.
    let recorded = wait_for(Duration::from_secs(30), || async {
        let a = rollout_state(&client, &ns.name, "inline", "s1").await;
        let b = rollout_state(&client, &ns.name, "by-ref", "s1").await;
        (a.1 == json!(v1) && b.1 == json!(v1)).then_some(())
    })
    .await;
    assert!(
        recorded.is_some(),
        "the Rollouts' versions were not recorded: {:?} {:?}\n{}",
        rollout_state(&client, &ns.name, "inline", "s1").await,
        rollout_state(&client, &ns.name, "by-ref", "s1").await,
        op.output.text()
    );
    holds_for(Duration::from_secs(3), || async {
        let mut none = true;
        for name in ["inline", "by-ref", "plain"] {
            none &= rollout_state(&client, &ns.name, name, "s1")
                .await
                .0
                .is_null();
        }
        none
    })
    .await
    .unwrap_or_else(|when| panic!("a Rollout restarted on opt-in {when}"));

    // A change restarts both opted-in Rollouts through restartAt.
    kms.set_secret("demo", "dev", "/", "A", "a2").await;
    poke(&client, &ns.name, "one", "6s").await;
    let v2 = wait_for(Duration::from_secs(30), || async {
        version_of(&client, &ns.name, "s1")
            .await
            .filter(|v| *v != v1)
    })
    .await
    .expect("s1 did not change");
    let restarted = wait_for(Duration::from_secs(30), || async {
        let a = rollout_state(&client, &ns.name, "inline", "s1").await;
        let b = rollout_state(&client, &ns.name, "by-ref", "s1").await;
        (a.1 == json!(v2) && b.1 == json!(v2) && a.0.is_string() && b.0.is_string())
            .then_some((a, b))
    })
    .await;
    let (inline, by_ref) = restarted
        .unwrap_or_else(|| panic!("the Rollouts were not restarted\n{}", op.output.text()));
    for at in [&inline.0, &by_ref.0] {
        let at = at.as_str().unwrap();
        assert!(
            at.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && at.ends_with('Z'),
            "restartAt is not an RFC 3339 time: {at}"
        );
    }
    assert!(
        inline.2.get("secrets.hanzo.ai/managed-secret.s1").is_none(),
        "a Rollout's pod template was stamped (a new revision): {}",
        inline.2
    );
    let plain = rollout_state(&client, &ns.name, "plain", "s1").await;
    assert!(
        plain.0.is_null() && plain.1.is_null(),
        "a Rollout that did not opt in was written: {plain:?}"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap();
    let on_inline = events.items.iter().any(|e| {
        let r = e.regarding.as_ref();
        r.and_then(|r| r.kind.as_deref()) == Some("Rollout")
            && r.and_then(|r| r.name.as_deref()) == Some("inline")
            && e.reason.as_deref() == Some("SecretChanged")
            && e.note.as_deref().unwrap_or_default().contains("Secret s1")
    });
    assert!(on_inline, "no SecretChanged Event on Rollout inline");

    // The Deployment behind `workloadRef` now uses s2 as well: the Rollout
    // that references it records s2.
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .patch(
            "base",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "example.invalid/app:1",
                 "envFrom": [{"secretRef": {"name": "s1"}}, {"secretRef": {"name": "s2"}}]}
            ]}}}})),
        )
        .await
        .unwrap();
    let followed = wait_for(Duration::from_secs(30), || async {
        (rollout_state(&client, &ns.name, "by-ref", "s2").await.1 == json!(s2_version))
            .then_some(())
    })
    .await;
    assert!(
        followed.is_some(),
        "the workloadRef Deployment's new Secret was not recorded on the Rollout"
    );

    // The CRD removed: the watch stops (and the operator keeps running).
    remove_rollout_crd(&client).await;
    let stopped = wait_for(Duration::from_secs(30), || async {
        op.output
            .text()
            .contains("Argo Rollouts are no longer served")
            .then_some(())
    })
    .await;
    assert!(stopped.is_some(), "{}", op.output.text());
}

/// A Deployment's status as its controller would report it (the control
/// plane has none): `complete`, every replica updated and available at the
/// current generation; else the progress deadline exceeded.
async fn report_rollout(client: &Client, ns: &str, name: &str, complete: bool) {
    let api = Api::<Deployment>::namespaced(client.clone(), ns);
    let generation = api.get(name).await.unwrap().metadata.generation.unwrap();
    let status = if complete {
        json!({"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
               "readyReplicas": 1, "availableReplicas": 1,
               "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                              {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]})
    } else {
        json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1,
               "readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 1,
               "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                               "message": format!("ReplicaSet \"{name}-new\" has timed out progressing.")}]})
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

/// The version a Deployment's pod template was rolled to for `secret`.
async fn rolled_to(client: &Client, ns: &str, name: &str, secret: &str) -> Option<String> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?
        .spec
        .template
        .metadata?
        .annotations?
        .get(&format!("secrets.hanzo.ai/managed-secret.{secret}"))
        .cloned()
}

/// The `AutoRedeployReady` condition of a KmsSecret: status, reason,
/// message.
async fn auto_redeploy(client: &Client, ns: &str, name: &str) -> Option<(String, String, String)> {
    let o = kms_secrets(client, ns).get(name).await.ok()?;
    let c = o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "secrets.hanzo.ai/AutoRedeployReady")?
        .clone();
    let text = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// Gradual reload: the KmsSecret's annotation makes the workloads that use
/// its Secret roll one at a time, in their order, each after the one before
/// completed; a rollout that fails holds the rest (their templates
/// unchanged), which the KmsSecret's condition, a Warning Event and
/// `kms-operator status` report; a new value starts over and rolls them
/// all. A workload that asks for immediate reload rolls at once.
#[tokio::test]
async fn a_gradual_reload_rolls_one_workload_at_a_time_and_holds_at_a_failure() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "reload-gradual").await;
    let kms = DevServer::start(&seed()).await;
    credentials(&client, &ns.name).await;
    let op = Operator::start(&ns.name, &[&ns.name], &["--reload-debounce", "1"]).await;
    kms_secret(&client, &ns.name, "app", &kms.api(), "s1", None).await;
    kms_secrets(&client, &ns.name)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "secrets.hanzo.ai/auto-reload-strategy": "gradual"}}})),
        )
        .await
        .unwrap();
    let uses_s1 = json!({"containers": [
        {"name": "app", "image": "example.invalid/app:1", "envFrom": [{"secretRef": {"name": "s1"}}]}
    ]});
    for name in ["a", "b", "c", "now"] {
        deployment(&client, &ns.name, name, true, uses_s1.clone()).await;
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns.name);
    // c goes first (its order is lower); "now" asks for immediate reload.
    for (name, key, value) in [
        ("c", "secrets.hanzo.ai/auto-reload-order", "-1"),
        ("now", "secrets.hanzo.ai/auto-reload-strategy", "immediate"),
    ] {
        deployments
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .unwrap();
    }
    for name in ["a", "b", "c", "now"] {
        report_rollout(&client, &ns.name, name, true).await;
    }
    let v1 = wait_for(Duration::from_secs(30), || async {
        let v = version_of(&client, &ns.name, "s1").await?;
        for name in ["a", "b", "c", "now"] {
            if recorded(&client, &ns.name, name, "s1").await.as_ref() != Some(&v) {
                return None;
            }
        }
        Some(v)
    })
    .await
    .unwrap_or_else(|| panic!("versions not recorded\n{}", op.output.text()));
    let s1 = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns.name)
        .get("s1")
        .await
        .unwrap();
    assert_eq!(
        s1.metadata
            .annotations
            .unwrap_or_default()
            .get("secrets.hanzo.ai/auto-reload-strategy"),
        Some(&"gradual".to_owned()),
        "the KmsSecret's strategy is carried to its Secret"
    );

    // A good change: c, then a, then b, each once the one before completed.
    let change = |value: &'static str, interval: &'static str| {
        let (kms, client, ns) = (&kms, &client, ns.name.clone());
        async move {
            let before = version_of(client, &ns, "s1").await;
            kms.set_secret("demo", "dev", "/", "A", value).await;
            poke(client, &ns, "app", interval).await;
            wait_for(Duration::from_secs(30), || async {
                version_of(client, &ns, "s1")
                    .await
                    .filter(|v| Some(v) != before.as_ref())
            })
            .await
            .expect("s1 did not change")
        }
    };
    let v2 = change("a2", "6s").await;
    assert_ne!(v1, v2);
    let rolled = |names: &'static [&'static str], version: String| {
        let (client, ns) = (&client, ns.name.clone());
        async move {
            let mut out = Vec::new();
            for name in names {
                out.push(rolled_to(client, &ns, name, "s1").await.as_ref() == Some(&version));
            }
            out
        }
    };
    let names: &[&str] = &["c", "a", "b", "now"];
    let first = wait_for(Duration::from_secs(30), || async {
        (rolled(names, v2.clone()).await == [true, false, false, true]).then_some(())
    })
    .await;
    assert!(
        first.is_some(),
        "c and now should roll first: {:?}\n{}",
        rolled(names, v2.clone()).await,
        op.output.text()
    );
    holds_for(Duration::from_secs(4), || async {
        rolled(names, v2.clone()).await == [true, false, false, true]
    })
    .await
    .unwrap_or_else(|when| panic!("a or b rolled before c completed {when}"));
    for (done, expect) in [
        ("c", [true, true, false, true]),
        ("a", [true, true, true, true]),
    ] {
        report_rollout(&client, &ns.name, done, true).await;
        let next = wait_for(Duration::from_secs(30), || async {
            (rolled(names, v2.clone()).await == expect).then_some(())
        })
        .await;
        assert!(
            next.is_some(),
            "after {done} completed: {:?}\n{}",
            rolled(names, v2.clone()).await,
            op.output.text()
        );
    }
    report_rollout(&client, &ns.name, "b", true).await;

    // A bad change: c rolls and fails; a and b hold with their templates.
    let v3 = change("bad", "7s").await;
    let c_rolled = wait_for(Duration::from_secs(30), || async {
        (rolled(names, v3.clone()).await == [true, false, false, true]).then_some(())
    })
    .await;
    assert!(c_rolled.is_some(), "{:?}", rolled(names, v3.clone()).await);
    let uids = |client: Client, ns: String| async move {
        let mut out = Vec::new();
        for name in ["a", "b"] {
            let d = Api::<Deployment>::namespaced(client.clone(), &ns)
                .get(name)
                .await
                .unwrap();
            out.push(serde_json::to_string(&d.spec.template).unwrap());
        }
        out
    };
    let templates_before = uids(client.clone(), ns.name.clone()).await;
    report_rollout(&client, &ns.name, "c", false).await;
    let held = wait_for(Duration::from_secs(30), || async {
        let (status, reason, message) = auto_redeploy(&client, &ns.name, "app").await?;
        (status == "False" && reason == "RolloutHeld").then_some(message)
    })
    .await
    .unwrap_or_else(|| panic!("no RolloutHeld condition\n{}", op.output.text()));
    let short: String = v3.chars().take(12).collect();
    assert!(
        held.contains(&format!("Deployment {}/c", ns.name))
            && held.contains(&format!("Secret s1 version {short}"))
            && held.contains("ProgressDeadlineExceeded")
            && held.contains("2 workload(s) keep the previous version"),
        "{held}"
    );
    holds_for(Duration::from_secs(4), || async {
        rolled(names, v3.clone()).await == [true, false, false, true]
    })
    .await
    .unwrap_or_else(|when| panic!("a held workload rolled {when}"));
    assert_eq!(
        uids(client.clone(), ns.name.clone()).await,
        templates_before,
        "the held workloads' templates changed"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap();
    let event = |kind: &str, name: &str, reason: &str| {
        events.items.iter().any(|e| {
            let r = e.regarding.as_ref();
            r.and_then(|r| r.kind.as_deref()) == Some(kind)
                && r.and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        })
    };
    assert!(
        event("KmsSecret", "app", "RolloutHeld"),
        "no RolloutHeld Event on the KmsSecret"
    );
    assert!(
        event("Deployment", "c", "RolloutFailed"),
        "no RolloutFailed Event on c"
    );
    let out = std::process::Command::new(crate::support::binary())
        .env("KUBECONFIG", crate::harness::kubeconfig())
        .args(["status", "-n", &ns.name])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "held reload: KmsSecret {}/app: gradual reload held",
            ns.name
        )),
        "kms-operator status does not show the held reload:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Fixed in the KMS: a new version starts over from c, and rolls all.
    let v4 = change("a4", "8s").await;
    let c_again = wait_for(Duration::from_secs(30), || async {
        (rolled(names, v4.clone()).await == [true, false, false, true]).then_some(())
    })
    .await;
    assert!(c_again.is_some(), "{:?}", rolled(names, v4.clone()).await);
    for name in ["c", "a", "b"] {
        report_rollout(&client, &ns.name, name, true).await;
        let _ = wait_for(Duration::from_secs(30), || async {
            let r = rolled(names, v4.clone()).await;
            let i = ["c", "a", "b"].iter().position(|n| *n == name).unwrap();
            (i == 2 || r[i + 1]).then_some(())
        })
        .await;
    }
    assert_eq!(rolled(names, v4.clone()).await, [true, true, true, true]);
    let ok = wait_for(Duration::from_secs(30), || async {
        let (status, reason, _) = auto_redeploy(&client, &ns.name, "app").await?;
        (status == "True" && reason == "OK").then_some(())
    })
    .await;
    assert!(
        ok.is_some(),
        "{:?}",
        auto_redeploy(&client, &ns.name, "app").await
    );
}
