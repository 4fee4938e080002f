//! KmsPushSecret and ClusterGenerator end to end: a real API server, the dev
//! KMS over HTTP, and the operator as a separate process.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, holds_for, wait_event, wait_for};
use crate::support::{CLIENT_SECRET, DevServer, Operator, create_credentials, seed};

const LIST: &str = "GET /api/v3/secrets/raw";
const WRITES: [&str; 6] = [
    "POST /api/v3/secrets/raw/:secretName",
    "PATCH /api/v3/secrets/raw/:secretName",
    "DELETE /api/v3/secrets/raw/:secretName",
    "POST /api/v3/secrets/batch/raw",
    "PATCH /api/v3/secrets/batch/raw",
    "DELETE /api/v3/secrets/batch/raw",
];
const FINALIZER: &str = "pushsecret.secrets.hanzo.ai/finalizer";

fn push_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsPushSecret"),
        "kmspushsecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn generator_api(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "ClusterGenerator"),
        "clustergenerators",
    );
    Api::all_with(client.clone(), &ar)
}

/// Create the source Secret, or replace its data as a whole (one write, so
/// the operator never sees a half-edited Secret).
async fn set_source(client: &Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    let data: BTreeMap<String, k8s_openapi::ByteString> = data
        .iter()
        .map(|(k, v)| {
            (
                (*k).to_owned(),
                k8s_openapi::ByteString(v.as_bytes().to_vec()),
            )
        })
        .collect();
    match api.get_opt(name).await.unwrap() {
        Some(mut existing) => {
            existing.data = Some(data);
            existing.string_data = None;
            api.replace(name, &PostParams::default(), &existing)
                .await
                .unwrap();
        }
        None => {
            let mut secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns}
            }))
            .unwrap();
            secret.data = Some(data);
            api.create(&PostParams::default(), &secret).await.unwrap();
        }
    }
}

fn push_cr(name: &str, host: &str, extra: Value) -> Value {
    let mut spec = json!({
        "hostAPI": host,
        "destination": {"projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/"},
        "authentication": {"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}}},
        "push": {"secret": {"secretName": "src"}}
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsPushSecret",
        "metadata": {"name": name},
        "spec": spec
    })
}

async fn apply_cr(client: &Client, ns: &str, value: Value) {
    let obj: DynamicObject = serde_json::from_value(value).unwrap();
    push_api(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create KmsPushSecret");
}

async fn patch_cr(client: &Client, ns: &str, name: &str, patch: Value) {
    push_api(client, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("patch KmsPushSecret");
}

/// The dev KMS folder `/` of `demo`/`dev`: key → (value, comment). Counted
/// in the dev server's stats.
async fn kms_folder(kms: &DevServer) -> BTreeMap<String, (String, String)> {
    kms.list_secrets("demo", "dev", "/")
        .await
        .iter()
        .map(|s| {
            (
                s["secretKey"].as_str().unwrap_or_default().to_owned(),
                (
                    s["secretValue"].as_str().unwrap_or_default().to_owned(),
                    s["secretComment"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect()
}

/// Wait until `check` holds for the KMS folder; panic with the last view.
async fn wait_kms<F>(
    kms: &DevServer,
    timeout: Duration,
    what: &str,
    check: F,
) -> BTreeMap<String, String>
where
    F: Fn(&BTreeMap<String, String>) -> bool,
{
    let values = || async {
        kms_folder(kms)
            .await
            .into_iter()
            .map(|(k, (v, _))| (k, v))
            .collect::<BTreeMap<String, String>>()
    };
    let reached = wait_for(timeout, || async {
        let folder = values().await;
        check(&folder).then_some(folder)
    })
    .await;
    if let Some(folder) = reached {
        return folder;
    }
    let keys: Vec<String> = values().await.into_keys().collect();
    panic!("KMS did not reach: {what} within {timeout:?}; last seen keys {keys:?}");
}

fn has(folder: &BTreeMap<String, String>, key: &str, value: &str) -> bool {
    folder.get(key).map(String::as_str) == Some(value)
}

/// The condition `type_` of a KmsPushSecret: (status, reason, message).
async fn condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let o = push_api(client, ns).get(name).await.ok()?;
    let c = o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
        c["message"].as_str()?.to_owned(),
    ))
}

async fn wait_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    want: impl Fn(&(String, String, String)) -> bool,
    timeout: Duration,
) -> (String, String, String) {
    let last = std::sync::Arc::new(std::sync::Mutex::new(None));
    let found = wait_for(timeout, || {
        let last = last.clone();
        let want = &want;
        async move {
            let c = condition(client, ns, name, type_).await;
            last.lock().unwrap().clone_from(&c);
            c.filter(|c| want(c))
        }
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "{ns}/{name}: {type_} not as expected; last {:?}",
            last.lock().unwrap()
        )
    })
}

async fn wait_gone(client: &Client, ns: &str, name: &str, timeout: Duration) -> bool {
    wait_for(timeout, || async {
        push_api(client, ns)
            .get_opt(name)
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await
    .is_some()
}

async fn writes(kms: &DevServer) -> u64 {
    let mut n = 0;
    for route in WRITES {
        n += kms.count(route, None).await;
    }
    n
}

#[tokio::test]
async fn pushes_follows_the_source_and_deletes_only_its_own_keys() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-e2e").await;
    let kms = DevServer::start(&seed(&[("EXISTING", "kms-value")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(
        &client,
        &ns.name,
        "src",
        &[("A", "1"), ("B", "2"), ("EXISTING", "mine")],
    )
    .await;
    let mut op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(&client, &ns.name, push_cr("p", &kms.api(), json!({}))).await;

    let folder = wait_kms(&kms, Duration::from_secs(30), "A=1, B=2", |f| {
        has(f, "A", "1") && has(f, "B", "2")
    })
    .await;
    // The existing key was not created by the resource: left alone, reported.
    assert!(has(&folder, "EXISTING", "kms-value"), "{folder:?}");
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "False",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(reason, "KeysNotOwned", "{message}");
    assert!(message.contains("EXISTING"), "{message}");
    assert!(
        !message.contains("mine"),
        "a value in a condition: {message}"
    );
    let (status, _, _) = condition(&client, &ns.name, "p", "secrets.hanzo.ai/Reconcile")
        .await
        .unwrap();
    assert_eq!(status, "True");
    let (status, _, _) = condition(&client, &ns.name, "p", "secrets.hanzo.ai/Authenticated")
        .await
        .unwrap();
    assert_eq!(status, "True");
    for t in ["Create", "Update", "Delete", "Replace"] {
        let (status, _, m) = condition(
            &client,
            &ns.name,
            "p",
            &format!("secrets.hanzo.ai/FailedTo{t}Secrets"),
        )
        .await
        .unwrap();
        assert_eq!(status, "False", "FailedTo{t}Secrets: {m}");
    }
    let cr = push_api(&client, &ns.name).get("p").await.unwrap();
    assert!(
        cr.metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|f| f == FINALIZER),
        "finalizer missing"
    );
    let managed = cr.data["status"]["managedSecrets"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut owned: Vec<&str> = managed.values().filter_map(Value::as_str).collect();
    owned.sort_unstable();
    assert_eq!(owned, vec!["A", "B"]);
    assert_eq!(cr.data["status"]["syncedKeys"], 2);
    assert_eq!(
        cr.data["status"]["observedGeneration"],
        cr.metadata.generation.unwrap()
    );

    // A changed source key reaches the KMS within 5 s (the source Secret is
    // watched through the index; no resyncInterval is set).
    set_source(
        &client,
        &ns.name,
        "src",
        &[("A", "10"), ("B", "2"), ("EXISTING", "mine")],
    )
    .await;
    wait_kms(&kms, Duration::from_secs(5), "A=10", |f| has(f, "A", "10")).await;

    // Keys removed from the source: ours are deleted, the foreign one stays.
    set_source(&client, &ns.name, "src", &[("A", "10")]).await;
    let folder = wait_kms(&kms, Duration::from_secs(5), "B deleted", |f| {
        !f.contains_key("B")
    })
    .await;
    assert!(has(&folder, "EXISTING", "kms-value"), "{folder:?}");
    wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(5),
    )
    .await;

    // No deletionPolicy: deleting the resource leaves the keys.
    push_api(&client, &ns.name)
        .delete("p", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        wait_gone(&client, &ns.name, "p", Duration::from_secs(10)).await,
        "the resource stayed"
    );
    let folder = wait_kms(&kms, Duration::from_secs(1), "A kept", |f| {
        has(f, "A", "10")
    })
    .await;
    assert!(folder.contains_key("EXISTING"));

    op.stop();
    let log = op.output.text();
    assert!(!log.is_empty(), "no log captured");
    for value in ["kms-value", "\"mine\"", CLIENT_SECRET] {
        assert!(
            !log.contains(value),
            "the log contains the secret value {value:?}"
        );
    }
}

#[tokio::test]
async fn replace_takes_over_existing_keys() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-replace").await;
    let kms = DevServer::start(&seed(&[("EXISTING", "kms-value"), ("SAME", "s")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(
        &client,
        &ns.name,
        "src",
        &[("EXISTING", "mine"), ("SAME", "s")],
    )
    .await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(&client, &ns.name, push_cr("p", &kms.api(), json!({}))).await;
    wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.1 == "KeysNotOwned",
        Duration::from_secs(30),
    )
    .await;
    assert!(has(
        &kms_folder(&kms)
            .await
            .into_iter()
            .map(|(k, (v, _))| (k, v))
            .collect(),
        "EXISTING",
        "kms-value"
    ));

    patch_cr(
        &client,
        &ns.name,
        "p",
        json!({"spec": {"updatePolicy": "Replace"}}),
    )
    .await;
    wait_kms(&kms, Duration::from_secs(10), "EXISTING=mine", |f| {
        has(f, "EXISTING", "mine")
    })
    .await;
    wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(10),
    )
    .await;
    let cr = push_api(&client, &ns.name).get("p").await.unwrap();
    let managed = cr.data["status"]["managedSecrets"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut owned: Vec<&str> = managed.values().filter_map(Value::as_str).collect();
    owned.sort_unstable();
    assert_eq!(
        owned,
        vec!["EXISTING", "SAME"],
        "taken-over keys are owned from then on"
    );

    // Owned now: removed from the source, they are deleted.
    set_source(&client, &ns.name, "src", &[("SAME", "s")]).await;
    wait_kms(&kms, Duration::from_secs(5), "EXISTING deleted", |f| {
        !f.contains_key("EXISTING") && has(f, "SAME", "s")
    })
    .await;
}

#[tokio::test]
async fn an_idle_resync_lists_once_and_writes_nothing() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-idle").await;
    let kms = DevServer::start(&seed(&[("UNRELATED", "x")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(
        &client,
        &ns.name,
        "src",
        &[("A", "1"), ("B", " padded \n\n"), ("C", "3")],
    )
    .await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(&client, &ns.name, push_cr("p", &kms.api(), json!({}))).await;
    wait_kms(&kms, Duration::from_secs(30), "A, B, C", |f| {
        ["A", "B", "C"].iter().all(|k| f.contains_key(*k))
    })
    .await;
    wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(10),
    )
    .await;
    // Settled: the KMS sees no request for a second (a pass the status
    // write may cause is over).
    let quiet = wait_for(Duration::from_secs(30), || async {
        let seen = kms.stats().await;
        holds_for(Duration::from_secs(1), || async {
            kms.stats().await == seen
        })
        .await
        .ok()
    })
    .await;
    assert!(
        quiet.is_some(),
        "the KMS never went quiet: {}",
        kms.stats().await
    );
    kms.reset_stats().await;

    // A burst of unrelated Secret changes sends no resource round.
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    for i in 0..100 {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("noise-{i}")},
            "stringData": {"x": i.to_string()}
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let held = holds_for(Duration::from_secs(2), || async {
        kms.stats().await == json!({})
    })
    .await;
    if let Err(when) = held {
        panic!(
            "KMS traffic after unrelated Secret changes, {when}: {}",
            kms.stats().await
        );
    }

    // An annotation change sends it round: one list, no write (the KMS
    // trims values; the comparison does too).
    patch_cr(
        &client,
        &ns.name,
        "p",
        json!({"metadata": {"annotations": {"touched": "1"}}}),
    )
    .await;
    let listed = wait_for(Duration::from_secs(10), || async {
        (kms.count(LIST, None).await >= 1).then_some(())
    })
    .await;
    assert!(
        listed.is_some(),
        "no list after the change: {}",
        kms.stats().await
    );
    let held = holds_for(Duration::from_secs(2), || async {
        kms.count(LIST, None).await == 1 && writes(&kms).await == 0
    })
    .await;
    if let Err(when) = held {
        panic!(
            "more than one list or a write, {when}: {}",
            kms.stats().await
        );
    }

    // With a resync interval: one list per period, still no write.
    patch_cr(
        &client,
        &ns.name,
        "p",
        json!({"spec": {"resyncInterval": "5s"}}),
    )
    .await;
    // The pass the change causes lists (the second list since the reset)
    // before the count starts again.
    let listed = wait_for(Duration::from_secs(10), || async {
        (kms.count(LIST, None).await >= 2).then_some(())
    })
    .await;
    assert!(
        listed.is_some(),
        "no list after the spec change: {}",
        kms.stats().await
    );
    kms.reset_stats().await;
    let held = holds_for(Duration::from_secs(12), || async {
        kms.count(LIST, None).await <= 3 && writes(&kms).await == 0
    })
    .await;
    let lists = kms.count(LIST, None).await;
    if let Err(when) = held {
        panic!(
            "more than 3 lists or a write in 12 s, {when}: {}",
            kms.stats().await
        );
    }
    assert!(lists >= 2, "{lists} lists in 12 s: {}", kms.stats().await);
    assert_eq!(
        kms.count("POST /api/v1/auth/universal-auth/login", None)
            .await,
        0
    );
}

async fn create_generator(client: &Client, name: &str, spec: Value) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "ClusterGenerator",
        "metadata": {"name": name},
        "spec": spec
    }))
    .unwrap();
    generator_api(client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create ClusterGenerator");
}

async fn delete_generator(client: &Client, name: &str) {
    let _ = generator_api(client)
        .delete(name, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn generated_values_are_made_once_and_survive_resyncs_and_restarts() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-gen").await;
    let (pw, ids, late) = (
        format!("{}-pw", ns.name),
        format!("{}-ids", ns.name),
        format!("{}-late", ns.name),
    );
    create_generator(
        &client,
        &pw,
        json!({"kind": "Password", "generator": {"passwordSpec": {
            "length": 32, "digits": 4, "symbols": 5, "symbolCharacters": "!#%&*", "noUpper": true
        }}}),
    )
    .await;
    create_generator(&client, &ids, json!({"kind": "UUID"})).await;
    let kms = DevServer::start(&seed(&[("UNRELATED", "x")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let mut op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let generators = |extra: Value| {
        let mut list = vec![
            json!({"destinationSecretName": "DB_PASSWORD", "generatorRef": {"kind": "Password", "name": pw}}),
            json!({"destinationSecretName": "INSTANCE_ID", "generatorRef": {"kind": "UUID", "name": ids}}),
        ];
        if !extra.is_null() {
            list.push(extra);
        }
        json!({"resyncInterval": "5s", "push": {"generators": list}})
    };
    apply_cr(
        &client,
        &ns.name,
        push_cr("gen", &kms.api(), generators(Value::Null)),
    )
    .await;
    let first = wait_kms(&kms, Duration::from_secs(30), "generated keys", |f| {
        f.contains_key("DB_PASSWORD") && f.contains_key("INSTANCE_ID")
    })
    .await;
    let password = first["DB_PASSWORD"].clone();
    assert_eq!(password.chars().count(), 32, "{}", password.len());
    assert_eq!(password.chars().filter(char::is_ascii_digit).count(), 4);
    assert_eq!(password.chars().filter(|c| "!#%&*".contains(*c)).count(), 5);
    assert!(
        password
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "!#%&*".contains(c))
    );
    let mut seen = std::collections::HashSet::new();
    assert!(
        password.chars().all(|c| seen.insert(c)),
        "a repeated character"
    );
    let uuid = first["INSTANCE_ID"].clone();
    let re =
        regex::Regex::new("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
            .unwrap();
    assert!(re.is_match(&uuid), "{uuid}");
    // The status records the generator (written after the push, so waited
    // for: the KMS can hold the keys a moment before the status does).
    let want = format!("Password/{pw}");
    let recorded = wait_for(Duration::from_secs(30), || async {
        let cr = push_api(&client, &ns.name).get("gen").await.ok()?;
        let got = cr.data["status"]["generatedSecrets"]["DB_PASSWORD"]["generator"].clone();
        (got == want.as_str()).then_some(())
    })
    .await;
    if recorded.is_none() {
        let cr = push_api(&client, &ns.name).get("gen").await.unwrap();
        panic!(
            "the status does not record {want}: {}",
            cr.data["status"]["generatedSecrets"]
        );
    }

    // Two resyncs later (two more lists; the test itself reads the KMS
    // only after the restart), and after a restart, the values are the
    // same.
    let lists = kms.count(LIST, None).await;
    let resynced = wait_for(Duration::from_secs(30), || async {
        (kms.count(LIST, None).await >= lists + 2).then_some(())
    })
    .await;
    assert!(resynced.is_some(), "no two resyncs: {}", kms.stats().await);
    op.stop();
    let log = op.output.text();
    assert!(
        !log.contains(&password) && !log.contains(&uuid),
        "a generated value in the log"
    );
    // Its first pass is over when the second list starts.
    let lists = kms.count(LIST, None).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let resynced = wait_for(Duration::from_secs(30), || async {
        (kms.count(LIST, None).await >= lists + 2).then_some(())
    })
    .await;
    assert!(
        resynced.is_some(),
        "no two passes after the restart: {}",
        kms.stats().await
    );
    let later: BTreeMap<String, String> = kms_folder(&kms)
        .await
        .into_iter()
        .map(|(k, (v, _))| (k, v))
        .collect();
    assert_eq!(
        later.get("DB_PASSWORD"),
        Some(&password),
        "the password changed"
    );
    assert_eq!(later.get("INSTANCE_ID"), Some(&uuid), "the UUID changed");

    // A reference whose kind differs from the generator's: a condition
    // naming both.
    patch_cr(
        &client,
        &ns.name,
        "gen",
        json!({"spec": generators(
            json!({"destinationSecretName": "WRONG", "generatorRef": {"kind": "UUID", "name": pw}}),
        )}),
    )
    .await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "gen",
        "Ready",
        |c| c.1 == "GeneratorKindMismatch",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        message.contains("UUID") && message.contains("Password") && message.contains(&pw),
        "{reason}: {message}"
    );

    // A missing generator is named; once it exists (watched), the key is pushed.
    patch_cr(
        &client,
        &ns.name,
        "gen",
        json!({"spec": generators(json!({"destinationSecretName": "LATE", "generatorRef": {"kind": "UUID", "name": late}}))}),
    )
    .await;
    let (_, _, message) = wait_condition(
        &client,
        &ns.name,
        "gen",
        "Ready",
        |c| c.1 == "GeneratorNotFound",
        Duration::from_secs(10),
    )
    .await;
    assert!(message.contains(&late), "{message}");
    create_generator(&client, &late, json!({"kind": "UUID"})).await;
    let after = wait_kms(&kms, Duration::from_secs(10), "LATE", |f| {
        f.contains_key("LATE")
    })
    .await;
    assert_eq!(after.get("DB_PASSWORD"), Some(&password));
    wait_condition(
        &client,
        &ns.name,
        "gen",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(10),
    )
    .await;

    for g in [&pw, &ids, &late] {
        delete_generator(&client, g).await;
    }
}

#[tokio::test]
async fn deletion_waits_for_the_kms_and_uses_the_last_login() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-del").await;
    let kms = DevServer::start(&seed(&[("FOREIGN", "f")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(&client, &ns.name, "src", &[("A", "1"), ("B", "2")]).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        push_cr("p", &kms.api(), json!({"deletionPolicy": "Delete"})),
    )
    .await;
    wait_kms(&kms, Duration::from_secs(30), "A, B", |f| {
        has(f, "A", "1") && has(f, "B", "2")
    })
    .await;
    wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(10),
    )
    .await;

    // The KMS is down: the resource stays (finalizer) and says why.
    kms.fault(json!({"outage": true})).await;
    push_api(&client, &ns.name)
        .delete("p", &DeleteParams::default())
        .await
        .unwrap();
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "False",
        Duration::from_secs(40),
    )
    .await;
    assert_eq!(reason, "KMSUnavailable", "{message}");
    assert!(message.contains("skip-cleanup"), "{message}");
    assert!(
        push_api(&client, &ns.name)
            .get_opt("p")
            .await
            .unwrap()
            .is_some()
    );

    // Back up: the keys are deleted, then the resource goes.
    kms.clear_faults().await;
    assert!(
        wait_gone(&client, &ns.name, "p", Duration::from_secs(60)).await,
        "the resource stayed after the KMS came back"
    );
    let folder = wait_kms(&kms, Duration::from_secs(1), "A, B deleted", |f| {
        !f.contains_key("A") && !f.contains_key("B")
    })
    .await;
    assert!(
        has(&folder, "FOREIGN", "f"),
        "a key it did not own was deleted"
    );

    // The namespace's Secrets go first (credentials included): the keys are
    // deleted with the identity of the last login.
    set_source(&client, &ns.name, "src", &[("C", "3")]).await;
    apply_cr(
        &client,
        &ns.name,
        push_cr("q", &kms.api(), json!({"deletionPolicy": "Delete"})),
    )
    .await;
    wait_kms(&kms, Duration::from_secs(30), "C", |f| has(f, "C", "3")).await;
    wait_condition(
        &client,
        &ns.name,
        "q",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(10),
    )
    .await;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    for s in ["kms-credentials", "src"] {
        secrets.delete(s, &DeleteParams::default()).await.unwrap();
    }
    push_api(&client, &ns.name)
        .delete("q", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        wait_gone(&client, &ns.name, "q", Duration::from_secs(20)).await,
        "q stayed"
    );
    wait_kms(&kms, Duration::from_secs(1), "C deleted", |f| {
        !f.contains_key("C")
    })
    .await;
    wait_event(&client, &ns.name, "q", "CleanedUp", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn skip_cleanup_and_the_cleanup_timeout_release_the_resource() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-skip").await;
    let kms = DevServer::start(&seed(&[("UNRELATED", "x")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(&client, &ns.name, "src", &[("A", "1")]).await;
    set_source(&client, &ns.name, "src2", &[("B", "2")]).await;
    // The timeout is long enough that, on a loaded machine, the escape
    // hatch below is never overtaken by it.
    let _op = Operator::start(&ns.name, &[&ns.name], &["--cleanup-timeout=20s"]).await;
    apply_cr(
        &client,
        &ns.name,
        push_cr("skip", &kms.api(), json!({"deletionPolicy": "Delete"})),
    )
    .await;
    apply_cr(
        &client,
        &ns.name,
        push_cr(
            "late",
            &kms.api(),
            json!({"deletionPolicy": "Delete", "push": {"secret": {"secretName": "src2"}}}),
        ),
    )
    .await;
    wait_kms(&kms, Duration::from_secs(30), "A, B", |f| {
        has(f, "A", "1") && has(f, "B", "2")
    })
    .await;
    for name in ["skip", "late"] {
        wait_condition(
            &client,
            &ns.name,
            name,
            "Ready",
            |c| c.0 == "True",
            Duration::from_secs(10),
        )
        .await;
    }

    kms.fault(json!({"outage": true})).await;
    let api = push_api(&client, &ns.name);
    api.delete("skip", &DeleteParams::default()).await.unwrap();
    api.delete("late", &DeleteParams::default()).await.unwrap();
    let held = holds_for(Duration::from_secs(2), || async {
        api.get_opt("skip").await.unwrap().is_some()
    })
    .await;
    if let Err(when) = held {
        panic!("released while the KMS is down, {when}");
    }

    // The escape hatch releases at once, without cleanup, even while an
    // attempt is waiting on the KMS.
    patch_cr(
        &client,
        &ns.name,
        "skip",
        json!({"metadata": {"annotations": {"secrets.hanzo.ai/skip-cleanup": "true"}}}),
    )
    .await;
    assert!(
        wait_gone(&client, &ns.name, "skip", Duration::from_secs(12)).await,
        "skip-cleanup ignored"
    );
    let note = wait_event(
        &client,
        &ns.name,
        "skip",
        "CleanupSkipped",
        Duration::from_secs(5),
    )
    .await;
    assert!(note.contains(": A"), "{note}");

    // The other one is released after --cleanup-timeout, with a Warning.
    assert!(
        wait_gone(&client, &ns.name, "late", Duration::from_secs(40)).await,
        "cleanup timeout ignored"
    );
    let note = wait_event(
        &client,
        &ns.name,
        "late",
        "CleanupTimedOut",
        Duration::from_secs(5),
    )
    .await;
    assert!(note.contains(": B"), "{note}");

    kms.clear_faults().await;
    wait_kms(
        &kms,
        Duration::from_secs(1),
        "A and B left in the KMS",
        |f| has(f, "A", "1") && has(f, "B", "2"),
    )
    .await;
}

/// A Secret one resource manages is another's source: a KmsSecret writes
/// `synced`, a KmsPushSecret pushes it to another environment. Managed
/// Secrets are not in the metadata watch of referenced Secrets, so the
/// change must reach the push resource through the managed Secrets' own
/// watch: within seconds, not at its hourly resync.
#[tokio::test]
async fn a_managed_secret_that_is_another_resources_source_is_followed() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-chain").await;
    let kms = DevServer::start(&seed(&[("UPSTREAM", "1")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let sync: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsSecret",
        "metadata": {"name": "sync"},
        "spec": {
            "hostAPI": kms.api(),
            "syncConfig": {"instantUpdates": true, "resyncInterval": "1h"},
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "kms-credentials"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": "synced", "creationPolicy": "Owner"}]
        }
    }))
    .unwrap();
    crate::kms_secret::kms_secrets(&client, &ns.name)
        .create(&PostParams::default(), &sync)
        .await
        .expect("create KmsSecret");
    apply_cr(
        &client,
        &ns.name,
        push_cr(
            "p",
            &kms.api(),
            json!({
                "resyncInterval": "1h",
                "destination": {"projectSlug": "demo", "environmentSlug": "prod", "secretsPath": "/"},
                "push": {"secret": {"secretName": "synced"}}
            }),
        ),
    )
    .await;
    let prod = || kms.values("demo", "prod", "/");
    let reached = wait_for(Duration::from_secs(30), || async {
        has(&prod().await, "UPSTREAM", "1").then_some(())
    })
    .await;
    assert!(
        reached.is_some(),
        "prod never got UPSTREAM=1: {:?}",
        prod().await
    );

    kms.set_secret("demo", "dev", "/", "UPSTREAM", "2").await;
    let reached = wait_for(Duration::from_secs(20), || async {
        has(&prod().await, "UPSTREAM", "2").then_some(())
    })
    .await;
    assert!(
        reached.is_some(),
        "the change of the managed Secret did not reach the push within 20 s: {:?}",
        prod().await
    );
}

/// `secrets.hanzo.ai/force-sync` on a KmsPushSecret: a key deleted in the
/// KMS behind the operator's back comes back at once, not at the hour's
/// resync, and the status records the value handled.
#[tokio::test]
async fn force_sync_pushes_again_at_once() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-force").await;
    let kms = DevServer::start(&seed(&[("UNRELATED", "x")])).await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(&client, &ns.name, "src", &[("A", "1")]).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    apply_cr(
        &client,
        &ns.name,
        push_cr("p", &kms.api(), json!({"resyncInterval": "1h"})),
    )
    .await;
    wait_kms(&kms, Duration::from_secs(30), "A", |f| has(f, "A", "1")).await;
    wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.0 == "True",
        Duration::from_secs(10),
    )
    .await;
    kms.delete_secret("demo", "dev", "/", "A").await;
    let api = push_api(&client, &ns.name);
    crate::force_sync::force(&api, "p", "one").await;
    wait_kms(&kms, Duration::from_secs(10), "A pushed again", |f| {
        has(f, "A", "1")
    })
    .await;
    crate::force_sync::wait_handled(&api, "p", "one").await;
}

/// A destination folder the KMS does not have (a current server: writes
/// and lists of it are 404s): without `push.createFolders` the condition
/// names the folder and the fix; a KMS that refuses to create it (403) gets
/// a condition naming the folder and the permission; with the flag the
/// whole path is created, one `POST /api/v1/folders` per missing folder,
/// and the keys are pushed there.
#[tokio::test]
async fn push_creates_missing_folders_only_when_asked() {
    const CREATE: &str = "POST /api/v1/folders";
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "push-folders").await;
    let kms = DevServer::start_with(
        &seed(&[("UNRELATED", "x")]),
        &["--missing-folders-not-found"],
    )
    .await;
    create_credentials(&client, &ns.name, "kms-credentials").await;
    set_source(&client, &ns.name, "src", &[("A", "1")]).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let destination =
        json!({"projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/apps/new/deep"});
    apply_cr(
        &client,
        &ns.name,
        push_cr("p", &kms.api(), json!({"destination": destination})),
    )
    .await;
    let timeout = Duration::from_secs(30);
    let (_, reason, message) =
        wait_condition(&client, &ns.name, "p", "Ready", |c| c.0 == "False", timeout).await;
    assert_eq!(reason, "FolderNotFound", "{message}");
    assert!(
        message.contains("folder /apps/new/deep in environment dev (project demo) does not exist; create it in the KMS, or set spec.push.createFolders: true"),
        "{message}"
    );
    assert_eq!(kms.count(CREATE, None).await, 0);

    // Asked to create, but the KMS refuses.
    kms.fault(json!({"route": CREATE, "errorRate": 1.0, "status": 403}))
        .await;
    patch_cr(
        &client,
        &ns.name,
        "p",
        json!({"spec": {"push": {"createFolders": true}}}),
    )
    .await;
    let (_, reason, message) = wait_condition(
        &client,
        &ns.name,
        "p",
        "Ready",
        |c| c.1 == "FolderCreateDenied",
        timeout,
    )
    .await;
    assert!(
        message.contains("folder /apps/new/deep in environment dev (project demo) does not exist and the KMS refused to create it (403"),
        "{reason}: {message}"
    );
    assert!(
        message.contains("the action `create` on the subject `secret-folders`"),
        "{message}"
    );

    // Allowed: the three folders are created, parents first, and the key
    // is pushed into the deepest.
    kms.clear_faults().await;
    kms.reset_stats().await;
    crate::force_sync::force(&push_api(&client, &ns.name), "p", "retry").await;
    let (_, _, message) = wait_condition(
        &client,
        &ns.name,
        "p",
        "secrets.hanzo.ai/Reconcile",
        |c| c.0 == "True",
        timeout,
    )
    .await;
    assert!(
        message.ends_with("(it created the KMS folders /apps, /apps/new, /apps/new/deep)"),
        "{message}"
    );
    assert_eq!(
        kms.count(CREATE, Some("200")).await,
        3,
        "{}",
        kms.stats().await
    );
    let values = kms.values("demo", "dev", "/apps/new/deep").await;
    assert_eq!(values.get("A").map(String::as_str), Some("1"), "{values:?}");
}
