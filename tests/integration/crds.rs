//! The CRDs on a real API server: established, the documented examples
//! accepted, invalid resources rejected by the schema with a message that
//! names the rule, and the printer columns served.

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace};

fn api_resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase());
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", kind),
        &plural,
    )
}

fn namespaced(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &api_resource(kind))
}

fn to_object(mut value: Value, ns: Option<&str>) -> DynamicObject {
    if let Some(ns) = ns {
        value["metadata"]["namespace"] = json!(ns);
    }
    serde_json::from_value(value).expect("object")
}

/// A KmsSecret that the schema accepts, to be broken one rule at a time.
fn valid_kms_secret(name: &str) -> Value {
    json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsSecret",
        "metadata": {"name": name},
        "spec": {
            "syncConfig": {"resyncInterval": "1h30m"},
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "creds"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": "out"}]
        }
    })
}

fn valid_push_secret(name: &str) -> Value {
    json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsPushSecret",
        "metadata": {"name": name},
        "spec": {
            "destination": {"projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/"},
            "authentication": {"universalAuth": {"credentialsRef": {"secretName": "creds"}}},
            "push": {"secret": {"secretName": "src"}}
        }
    })
}

fn valid_dynamic_secret(name: &str) -> Value {
    json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsDynamicSecret",
        "metadata": {"name": name},
        "spec": {
            "authentication": {"universalAuth": {"credentialsRef": {"secretName": "creds"}}},
            "dynamicSecret": {"secretName": "db", "projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/"},
            "managedSecretReference": {"secretName": "db-creds"}
        }
    })
}

/// Create `value` and return the API server's refusal message, or panic if it
/// was accepted.
async fn rejection(client: &Client, ns: &str, value: Value) -> String {
    let kind = value["kind"].as_str().expect("kind").to_owned();
    let api = namespaced(client, ns, &kind);
    match api
        .create(&PostParams::default(), &to_object(value, Some(ns)))
        .await
    {
        Ok(obj) => panic!(
            "{kind} {:?} was accepted but must be rejected",
            obj.metadata.name
        ),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "unexpected status {status:?}");
            status.message
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[tokio::test]
async fn crds_are_established_with_their_names() {
    let client = harness::client().await;
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client);
    for (plural, short) in [
        ("kmssecrets", Some("kmss")),
        ("kmspushsecrets", Some("kmsps")),
        ("kmsdynamicsecrets", Some("kmsds")),
        ("clustergenerators", None),
    ] {
        let crd = api
            .get(&format!("{plural}.secrets.hanzo.ai"))
            .await
            .expect("CRD installed");
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        for wanted in ["Established", "NamesAccepted"] {
            assert!(
                conditions
                    .iter()
                    .any(|c| c.type_ == wanted && c.status == "True"),
                "{plural}: {wanted} is not True: {conditions:?}"
            );
        }
        assert_eq!(
            crd.spec
                .names
                .short_names
                .unwrap_or_default()
                .first()
                .map(String::as_str),
            short
        );
    }
}

#[tokio::test]
async fn documented_examples_are_accepted() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "crd-examples").await;
    let dir = harness::repo().join("docs/examples");
    let mut created = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for mut doc in docs {
            let Some(api_version) = doc["apiVersion"].as_str() else {
                continue;
            };
            if !api_version.starts_with("secrets.hanzo.ai/") {
                continue;
            }
            let kind = doc["kind"].as_str().unwrap().to_owned();
            let obj = if kind == "ClusterGenerator" {
                // Cluster-scoped: give it a name of this run.
                doc["metadata"]["name"] = json!(format!(
                    "{}-{}",
                    ns.name,
                    doc["metadata"]["name"].as_str().unwrap()
                ));
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(&kind));
                let obj = api
                    .create(&PostParams::default(), &to_object(doc, None))
                    .await;
                let obj =
                    obj.unwrap_or_else(|e| panic!("{}: {kind} rejected: {e}", path.display()));
                let _ = api
                    .delete(&obj.metadata.name.clone().unwrap(), &Default::default())
                    .await;
                obj
            } else {
                let api = namespaced(&client, &ns.name, &kind);
                api.create(&PostParams::default(), &to_object(doc, Some(&ns.name)))
                    .await
                    .unwrap_or_else(|e| panic!("{}: {kind} rejected: {e}", path.display()))
            };
            created.push(kind);
            assert!(obj.metadata.uid.is_some());
        }
    }
    for kind in [
        "KmsSecret",
        "KmsPushSecret",
        "KmsDynamicSecret",
        "ClusterGenerator",
    ] {
        assert!(
            created.iter().any(|k| k == kind),
            "no example of {kind} in docs/examples"
        );
    }
}

#[tokio::test]
async fn schema_defaults_are_filled_in() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "crd-defaults").await;
    let api = namespaced(&client, &ns.name, "KmsSecret");
    let obj = api
        .create(
            &PostParams::default(),
            &to_object(valid_kms_secret("defaults"), Some(&ns.name)),
        )
        .await
        .expect("valid KmsSecret");
    let target = &obj.data["spec"]["managedKubeSecretReferences"][0];
    assert_eq!(target["creationPolicy"], json!("Orphan"));
    assert_eq!(target["secretType"], json!("Opaque"));
    let push = namespaced(&client, &ns.name, "KmsPushSecret")
        .create(
            &PostParams::default(),
            &to_object(valid_push_secret("defaults"), Some(&ns.name)),
        )
        .await
        .expect("valid KmsPushSecret");
    assert_eq!(push.data["spec"]["updatePolicy"], json!("None"));
    assert_eq!(push.data["spec"]["deletionPolicy"], json!("None"));
    // leaseTTL and leaseRevocationPolicy are optional (the Go operator required them).
    let dynamic = namespaced(&client, &ns.name, "KmsDynamicSecret")
        .create(
            &PostParams::default(),
            &to_object(valid_dynamic_secret("defaults"), Some(&ns.name)),
        )
        .await
        .expect("valid KmsDynamicSecret without leaseTTL");
    assert_eq!(dynamic.data["spec"]["leaseRevocationPolicy"], json!("None"));
    assert!(dynamic.data["spec"].get("leaseTTL").is_none());
}

#[tokio::test]
async fn invalid_resources_are_rejected_with_the_rule() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "crd-invalid").await;
    let mut cases: Vec<(&str, Value, &str)> = Vec::new();

    let mut v = valid_kms_secret("two-auth");
    v["spec"]["authentication"]["ldapAuth"] = json!({
        "identityId": "id", "credentialsRef": {"secretName": "ldap"},
        "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
    });
    cases.push((
        "two auth methods",
        v,
        "exactly one authentication method must be set",
    ));

    let mut v = valid_kms_secret("legacy-and-new");
    v["spec"]["tokenSecretReference"] = json!({"secretName": "st"});
    cases.push((
        "universal auth plus legacy tokenSecretReference",
        v,
        "exactly one authentication method must be set",
    ));

    let mut v = valid_kms_secret("no-auth");
    v["spec"].as_object_mut().unwrap().remove("authentication");
    cases.push((
        "no auth method",
        v,
        "exactly one authentication method must be set",
    ));

    let mut v = valid_kms_secret("both-projects");
    v["spec"]["authentication"]["universalAuth"]["secretsScope"]["projectId"] = json!("abc");
    cases.push((
        "projectSlug and projectId",
        v,
        "exactly one of projectSlug and projectId",
    ));

    let mut v = valid_kms_secret("no-project");
    v["spec"]["authentication"]["universalAuth"]["secretsScope"]
        .as_object_mut()
        .unwrap()
        .remove("projectSlug");
    cases.push((
        "neither projectSlug nor projectId",
        v,
        "exactly one of projectSlug and projectId",
    ));

    let mut v = valid_kms_secret("name-and-recursive");
    v["spec"]["authentication"]["universalAuth"]["secretsScope"]["secretName"] =
        json!("DB_PASSWORD");
    v["spec"]["authentication"]["universalAuth"]["secretsScope"]["recursive"] = json!(true);
    cases.push((
        "secretName with recursive",
        v,
        "secretName cannot be combined with recursive: true",
    ));

    let mut v = valid_kms_secret("bad-interval");
    v["spec"]["syncConfig"]["resyncInterval"] = json!("5 minutes");
    cases.push(("bad interval", v, "spec.syncConfig.resyncInterval"));

    let mut v = valid_kms_secret("bad-policy");
    v["spec"]["managedKubeSecretReferences"][0]["creationPolicy"] = json!("Sometimes");
    cases.push((
        "unknown creationPolicy",
        v,
        "Unsupported value: \"Sometimes\"",
    ));

    let mut v = valid_kms_secret("legacy-and-list");
    v["spec"]["managedSecretReference"] = json!({"secretName": "legacy"});
    cases.push((
        "legacy target plus target list",
        v,
        "managedSecretReference (deprecated) cannot be combined",
    ));

    let mut v = valid_kms_secret("no-target");
    v["spec"]
        .as_object_mut()
        .unwrap()
        .remove("managedKubeSecretReferences");
    cases.push(("no target", v, "at least one target is required"));

    let mut v = valid_push_secret("bad-update-policy");
    v["spec"]["updatePolicy"] = json!("Sometimes");
    cases.push((
        "unknown updatePolicy",
        v,
        "Unsupported value: \"Sometimes\"",
    ));

    let mut v = valid_push_secret("push-nothing");
    v["spec"]["push"] = json!({});
    cases.push((
        "push without source",
        v,
        "push: at least one of push.secret and push.generators",
    ));

    let mut v = valid_push_secret("push-both-projects");
    v["spec"]["destination"]["projectId"] = json!("abc");
    cases.push((
        "push destination with two projects",
        v,
        "destination: exactly one of projectSlug and projectId",
    ));

    let mut v = valid_dynamic_secret("bad-ttl");
    v["spec"]["leaseTTL"] = json!("1 hour");
    cases.push(("bad leaseTTL", v, "spec.leaseTTL"));

    let mut v = valid_dynamic_secret("bad-revocation");
    v["spec"]["leaseRevocationPolicy"] = json!("Always");
    cases.push((
        "unknown leaseRevocationPolicy",
        v,
        "Unsupported value: \"Always\"",
    ));

    let mut v = valid_dynamic_secret("two-auth");
    v["spec"]["authentication"]["awsIamAuth"] = json!({"identityId": "id"});
    cases.push((
        "dynamic with two auth methods",
        v,
        "exactly one authentication method must be set",
    ));

    for (what, value, expected) in cases {
        let message = rejection(&client, &ns.name, value).await;
        assert!(
            message.contains(expected),
            "{what}: expected {expected:?} in {message:?}"
        );
    }
}

#[tokio::test]
async fn immutable_fields_cannot_change() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "crd-immutable").await;
    let pp = PatchParams::default();

    let push = namespaced(&client, &ns.name, "KmsPushSecret");
    push.create(
        &PostParams::default(),
        &to_object(valid_push_secret("push"), Some(&ns.name)),
    )
    .await
    .expect("valid push");
    let err = push
        .patch(
            "push",
            &pp,
            &Patch::Merge(json!({"spec": {"destination": {"secretsPath": "/other"}}})),
        )
        .await
        .expect_err("destination change must be refused");
    assert!(
        err.to_string().contains("destination is immutable"),
        "{err}"
    );
    // Other fields still change.
    push.patch(
        "push",
        &pp,
        &Patch::Merge(json!({"spec": {"resyncInterval": "10m"}})),
    )
    .await
    .expect("a mutable field changes");

    let dynamic = namespaced(&client, &ns.name, "KmsDynamicSecret");
    dynamic
        .create(
            &PostParams::default(),
            &to_object(valid_dynamic_secret("dyn"), Some(&ns.name)),
        )
        .await
        .expect("valid dynamic");
    let err = dynamic
        .patch(
            "dyn",
            &pp,
            &Patch::Merge(json!({"spec": {"dynamicSecret": {"secretName": "other"}}})),
        )
        .await
        .expect_err("dynamicSecret change must be refused");
    assert!(
        err.to_string().contains("dynamicSecret is immutable"),
        "{err}"
    );
}

#[tokio::test]
async fn printer_columns_are_served() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "crd-columns").await;
    namespaced(&client, &ns.name, "KmsSecret")
        .create(
            &PostParams::default(),
            &to_object(valid_kms_secret("cols"), Some(&ns.name)),
        )
        .await
        .expect("valid KmsSecret");
    for (plural, third) in [
        ("kmssecrets", "Last Sync"),
        ("kmspushsecrets", "Last Sync"),
        ("kmsdynamicsecrets", "Lease Expires"),
    ] {
        let req = http::Request::get(format!(
            "/apis/secrets.hanzo.ai/v1alpha1/namespaces/{}/{plural}",
            ns.name
        ))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
        let table: Value = client.request(req).await.expect("table view");
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec!["Name", "Ready", "Reason", third, "Age"],
            "{plural}"
        );
    }
}
