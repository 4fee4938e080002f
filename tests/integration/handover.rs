//! Hand-over in place from the Hanzo Go operator (docs/migration.md), on a
//! control plane of its own: the CRDs are cluster-wide, and this test
//! replaces ours with the Go operator's spelling (`KMSSecret`, …), which
//! every other test's objects would be refused under.
//!
//! The Go operator is a stand-in chart (tests/fixtures/go-operator: its CRDs
//! written from the Go operator's published schemas as ordinary templates without a keep
//! policy, and its Deployment). The test creates custom resources under
//! those CRDs, the Secrets the Go operator would have written (its owner
//! references of kind `KMSSecret`, its `W/"secrets-…"` version annotation)
//! and a workload it stamped for auto-reload; then
//!
//! 1. installs our chart first, as a user who skips the procedure would:
//!    helm refuses with a message naming the CRD's ownership, and nothing is
//!    deleted or changed;
//! 2. runs the documented procedure with the real helm, and starts our
//!    operator: no custom resource is deleted (same uids), every Secret
//!    keeps its uid and data and is adopted, statuses are written in the
//!    served spelling, owned Secrets keep an owner reference the garbage
//!    collector resolves, and the workload's pod template does not change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, Config};
use serde_json::{Value, json};

use crate::harness::{self, holds_for, wait_for};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator, TempDir};

/// The CRDs both operators name alike.
const CRDS: [&str; 4] = [
    "kmssecrets.secrets.hanzo.ai",
    "kmspushsecrets.secrets.hanzo.ai",
    "kmsdynamicsecrets.secrets.hanzo.ai",
    "clustergenerators.secrets.hanzo.ai",
];
/// The Go operator's release and namespace.
const OLD: (&str, &str) = ("secrets-operator", "kms-operator-system");
/// Ours, beside it as docs/install.md installs it.
const NEW: (&str, &str) = ("kms-operator", "kms-operator-system");
/// The application namespace.
const APP: &str = "app";
/// A version annotation as the Go operator writes it.
const GO_VERSION: &str = "W/\"secrets-262-5D1E2C7A\"";

/// A control plane of this test's own, stopped (and its directory removed)
/// on drop.
pub(crate) struct ControlPlane {
    dir: TempDir,
}

impl ControlPlane {
    pub(crate) fn up() -> Self {
        let dir = TempDir::new("handover-cp");
        let out = Command::new(harness::repo().join("tests/testenv/testenv"))
            .arg("up")
            .arg(&dir.0)
            .output()
            .expect("run tests/testenv/testenv up");
        assert!(
            out.status.success(),
            "testenv up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.dir.0.join("kubeconfig")
    }

    pub(crate) async fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    /// Run a tool (helm, kubectl) against this control plane.
    fn run(&self, tool: &str, args: &[&str]) -> (bool, String) {
        let out = Command::new(tool_path(tool))
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .env("HELM_CONFIG_HOME", self.dir.0.join("helm/config"))
            .env("HELM_CACHE_HOME", self.dir.0.join("helm/cache"))
            .env("HELM_DATA_HOME", self.dir.0.join("helm/data"))
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn ok(&self, tool: &str, args: &[&str]) -> String {
        let (ok, text) = self.run(tool, args);
        assert!(ok, "{tool} {} failed:\n{text}", args.join(" "));
        text
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(harness::repo().join("tests/testenv/testenv"))
            .arg("down")
            .arg(&self.dir.0)
            .output();
    }
}

fn tool_path(name: &str) -> PathBuf {
    let out = Command::new(harness::repo().join("tests/testenv/testenv"))
        .args(["path", name])
        .output()
        .expect("testenv path");
    assert!(out.status.success(), "testenv path {name}");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", kind),
        plural,
    )
}

fn api(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), APP, &resource(kind, plural))
}

fn kms_secrets(client: &Client) -> Api<DynamicObject> {
    api(client, "KMSSecret", "kmssecrets")
}

async fn create(api: &Api<DynamicObject>, value: Value) -> String {
    let o: DynamicObject = serde_json::from_value(value).expect("object");
    let o = api
        .create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", o.metadata.name));
    o.metadata.uid.expect("uid")
}

/// The served kinds of the group, once all of `plurals` are served.
async fn served(client: &Client, plurals: &[&str]) -> BTreeMap<String, String> {
    wait_for(Duration::from_secs(30), || async {
        let list = client
            .list_api_group_resources("secrets.hanzo.ai/v1alpha1")
            .await
            .ok()?;
        let kinds: BTreeMap<String, String> = list
            .resources
            .into_iter()
            .filter(|r| !r.name.contains('/'))
            .map(|r| (r.name, r.kind))
            .collect();
        plurals
            .iter()
            .all(|p| kinds.contains_key(*p))
            .then_some(kinds)
    })
    .await
    .expect("the custom resources are served")
}

/// The dev KMS: `demo`/`dev` with two secrets and a dynamic secret, `prod`
/// for the push.
fn seed() -> String {
    format!(
        "projects:\n  - slug: demo\n    name: Demo\n    environments: [dev, prod]\n    secrets:\n      dev:\n        /:\n          A: \"1\"\n          B: \"2\"\n\
         \x20   dynamicSecrets:\n      - name: db-creds\n        environment: dev\n        path: /\n        defaultTTL: 1h\n        maxTTL: 24h\n\
         identities:\n  - name: operator\n    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}, accessTokenTTL: 3600, accessTokenMaxTTL: 86400}}\n    projects: [demo]\n"
    )
}

/// A KMSDynamicSecret as the Go operator leaves it: a lease taken in the
/// KMS, recorded in its status, its Secret written with
/// the lease's data and version `<leaseId>-<leaseVersion>`. Returns
/// the lease id.
async fn go_dynamic_secret(client: &Client, kms: &DevServer, name: &str, owned: bool) -> String {
    let http = kms.http();
    let login: Value = http
        .post(format!("{}/v1/auth/universal-auth/login", kms.api()))
        .json(&json!({"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = login["accessToken"].as_str().expect("accessToken");
    let created: Value = http
        .post(format!("{}/v1/dynamic-secrets/leases", kms.api()))
        .bearer_auth(token)
        .json(&json!({
            "dynamicSecretName": "db-creds", "projectSlug": "demo",
            "environmentSlug": "dev", "path": "/", "ttl": "1h"
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lease = &created["lease"];
    let id = lease["id"].as_str().expect("lease id").to_owned();
    let target = format!("{name}-out");
    let dynamic = api(client, "KMSDynamicSecret", "kmsdynamicsecrets");
    let uid = create(
        &dynamic,
        json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSDynamicSecret",
            "metadata": {"name": name, "namespace": APP,
                         "finalizers": ["dynamicsecret.secrets.hanzo.ai/finalizer"]},
            "spec": {
                "hostAPI": kms.api(),
                "authentication": universal_auth(None),
                "dynamicSecret": {"secretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/"},
                "leaseTTL": "1h",
                "leaseRevocationPolicy": "Revoke",
                "managedSecretReference": {
                    "secretName": target, "secretNamespace": APP,
                    "creationPolicy": if owned { "Owner" } else { "Orphan" }
                }
            }
        }),
    )
    .await;
    dynamic
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "conditions": [{
                    "type": "secrets.hanzo.ai/LeaseCreated", "status": "True", "reason": "Ok",
                    "message": "lease created", "lastTransitionTime": "2026-11-01T00:00:00Z"
                }],
                "lease": {
                    "id": id, "version": lease["version"],
                    "creationTimestamp": lease["createdAt"], "expiresAt": lease["expireAt"]
                },
                "dynamicSecretId": created["dynamicSecret"]["id"],
                "maxTTL": created["dynamicSecret"]["maxTTL"],
            }})),
        )
        .await
        .expect("the Go operator's status");
    let mut secret = json!({
        "metadata": {
            "name": target, "namespace": APP,
            "annotations": {"secrets.hanzo.ai/version": format!("{id}-{}", lease["version"])}
        },
        "type": "Opaque",
        "stringData": created["data"]
    });
    if owned {
        secret["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSDynamicSecret",
            "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true
        }]);
    }
    Api::<Secret>::namespaced(client.clone(), APP)
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret).expect("Secret"),
        )
        .await
        .expect("the Go operator's Secret");
    id
}

fn universal_auth(scope: Option<Value>) -> Value {
    let mut auth = json!({"credentialsRef": {"secretName": "creds", "secretNamespace": APP}});
    if let Some(scope) = scope {
        auth["secretsScope"] = scope;
    }
    json!({"universalAuth": auth})
}

fn dev_scope() -> Value {
    json!({"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"})
}

/// A Secret as the Go operator writes it for a KMSSecret target: data, its version and tracking annotations, and
/// with `creationPolicy: Owner` a controller reference of kind `KMSSecret`.
fn go_secret(name: &str, owner: Option<(&str, &str)>) -> Secret {
    let mut s = json!({
        "metadata": {
            "name": name, "namespace": APP,
            "annotations": {
                "secrets.hanzo.ai/version": GO_VERSION,
                "secrets.hanzo.ai/managed-labels": "",
                "secrets.hanzo.ai/managed-annotations": "",
            }
        },
        "type": "Opaque",
        "stringData": {"A": "1", "B": "2"}
    });
    if let Some((cr, uid)) = owner {
        s["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSSecret",
            "name": cr, "uid": uid, "controller": true, "blockOwnerDeletion": true
        }]);
    }
    serde_json::from_value(s).expect("Secret")
}

/// A workload the Go operator stamped for auto-reload.
fn go_workload() -> Deployment {
    let stamp = json!({"secrets.hanzo.ai/managed-secret.out-owner": GO_VERSION});
    let mut annotations = stamp.clone();
    annotations["secrets.hanzo.ai/auto-reload"] = json!("true");
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": APP, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": stamp},
                "spec": {"containers": [{
                    "name": "web", "image": "example.com/web:1",
                    "envFrom": [{"secretRef": {"name": "out-owner"}}]
                }]}
            }
        }
    }))
    .expect("Deployment")
}

/// Uid and data of a Secret.
async fn secret_state(client: &Client, name: &str) -> (String, BTreeMap<String, Vec<u8>>, Secret) {
    let s = Api::<Secret>::namespaced(client.clone(), APP)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Secret {name}: {e}"));
    let data = s
        .data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    (s.metadata.uid.clone().unwrap_or_default(), data, s)
}

fn ready(o: &DynamicObject) -> Option<(String, String)> {
    o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

async fn uids(client: &Client) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    for (kind, plural) in [
        ("KMSSecret", "kmssecrets"),
        ("KMSPushSecret", "kmspushsecrets"),
        ("KMSDynamicSecret", "kmsdynamicsecrets"),
    ] {
        for o in api(client, kind, plural)
            .list(&ListParams::default())
            .await
            .expect("list")
        {
            all.insert(
                format!("{kind}/{}", o.metadata.name.unwrap_or_default()),
                o.metadata.uid.unwrap_or_default(),
            );
        }
    }
    all
}

async fn crd_kinds(client: &Client) -> Vec<String> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let mut kinds = Vec::new();
    for name in CRDS {
        kinds.push(crds.get(name).await.expect("CRD").spec.names.kind);
    }
    kinds
}

/// The procedure of docs/migration.md ("From the Hanzo Go operator"), as
/// the commands a user runs.
fn procedure(cp: &ControlPlane, old_chart: &Path) {
    let (old, old_ns) = OLD;
    let (new, new_ns) = NEW;
    let old_chart = old_chart.display().to_string();
    let our_chart = harness::repo().join("helm/secrets-operator");
    let our_chart = our_chart.display().to_string();
    let kubectl = |args: &[&str]| cp.ok("kubectl", args);
    let helm = |args: &[&str]| cp.ok("helm", args);

    // 1. Keep the CRDs whatever happens to the old release.
    let mut annotate = vec!["annotate", "crd"];
    annotate.extend(CRDS);
    annotate.extend(["helm.sh/resource-policy=keep", "--overwrite"]);
    kubectl(&annotate);
    // 2. Take the CRDs out of the old release (its upgrade leaves objects
    //    whose live copy says keep).
    helm(&[
        "upgrade",
        old,
        &old_chart,
        "-n",
        old_ns,
        "--reuse-values",
        "--set",
        "installCRDs=false",
    ]);
    // 3. Stop the Go operator: uninstall its release (the CRDs are no longer
    //    part of it).
    helm(&["uninstall", old, "-n", old_ns]);
    // 4. Hand the CRDs to our release.
    let mut label = vec!["label", "crd"];
    label.extend(CRDS);
    label.extend(["app.kubernetes.io/managed-by=Helm", "--overwrite"]);
    kubectl(&label);
    let release_name = format!("meta.helm.sh/release-name={new}");
    let release_ns = format!("meta.helm.sh/release-namespace={new_ns}");
    let mut annotate = vec!["annotate", "crd"];
    annotate.extend(CRDS);
    annotate.extend([release_name.as_str(), release_ns.as_str(), "--overwrite"]);
    kubectl(&annotate);
    // 5. Install ours.
    helm(&[
        "install",
        new,
        &our_chart,
        "-n",
        new_ns,
        "--create-namespace",
    ]);
}

#[tokio::test]
async fn hand_over_in_place_from_the_go_operator_keeps_every_resource_and_secret() {
    let cp = ControlPlane::up();
    let client = cp.client().await;
    let old_chart = harness::repo().join("tests/fixtures/go-operator");

    // --- The Go operator's installation.
    cp.ok(
        "helm",
        &[
            "install",
            OLD.0,
            &old_chart.display().to_string(),
            "-n",
            OLD.1,
            "--create-namespace",
        ],
    );
    let kinds = served(
        &client,
        &["kmssecrets", "kmspushsecrets", "kmsdynamicsecrets"],
    )
    .await;
    assert_eq!(kinds["kmssecrets"], "KMSSecret");
    cp.ok("kubectl", &["create", "namespace", APP]);
    let kms = DevServer::start(&seed()).await;
    let creds: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "stringData": {"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}
    }))
    .unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), APP);
    secrets
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();

    // Its custom resources, in its documented shape (secretNamespace set,
    // the deprecated top-level resyncInterval).
    let app_uid = create(
        &kms_secrets(&client),
        json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSSecret",
            "metadata": {"name": "app", "namespace": APP},
            "spec": {
                "hostAPI": kms.api(),
                "resyncInterval": 60,
                "authentication": universal_auth(Some(dev_scope())),
                "managedKubeSecretReferences": [
                    {"secretName": "out-owner", "secretNamespace": APP, "creationPolicy": "Owner"},
                    {"secretName": "out-orphan", "secretNamespace": APP}
                ]
            }
        }),
    )
    .await;
    // Valid for the Go operator (it logs in with `authentication` and
    // ignores the leftover legacy reference), invalid under our schema's
    // "exactly one method" rule: its status must still be writable.
    create(
        &kms_secrets(&client),
        json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSSecret",
            "metadata": {"name": "legacy", "namespace": APP},
            "spec": {
                "hostAPI": kms.api(),
                "tokenSecretReference": {"secretName": "old-token", "secretNamespace": APP},
                "authentication": universal_auth(Some(dev_scope())),
                "managedSecretReference": {"secretName": "out-legacy", "secretNamespace": APP}
            }
        }),
    )
    .await;
    let source: Secret = serde_json::from_value(json!({
        "metadata": {"name": "src"}, "stringData": {"PUSHED": "p"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &source)
        .await
        .unwrap();
    create(
        &api(&client, "KMSPushSecret", "kmspushsecrets"),
        json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSPushSecret",
            "metadata": {"name": "push", "namespace": APP,
                         "finalizers": ["pushsecret.secrets.hanzo.ai/finalizer"]},
            "spec": {
                "hostAPI": kms.api(),
                "updatePolicy": "Replace",
                "destination": {"projectSlug": "demo", "environmentSlug": "prod", "secretsPath": "/"},
                "authentication": universal_auth(None),
                "push": {"secret": {"secretName": "src", "secretNamespace": APP}}
            }
        }),
    )
    .await;
    create(
        &api(&client, "KMSDynamicSecret", "kmsdynamicsecrets"),
        json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSDynamicSecret",
            "metadata": {"name": "db", "namespace": APP,
                         "finalizers": ["dynamicsecret.secrets.hanzo.ai/finalizer"]},
            "spec": {
                "hostAPI": kms.api(),
                "authentication": universal_auth(None),
                "dynamicSecret": {"secretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/"},
                "leaseTTL": "1h",
                "leaseRevocationPolicy": "Revoke",
                "managedSecretReference": {"secretName": "db-out", "secretNamespace": APP, "creationPolicy": "Owner"}
            }
        }),
    )
    .await;
    // What the Go operator wrote: its status, its Secrets, its stamp.
    kms_secrets(&client)
        .patch_status(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "secrets.hanzo.ai/ReadyToSyncSecrets", "status": "True",
                "reason": "OK", "message": "KMS controller has started syncing your secrets",
                "lastTransitionTime": "2026-11-01T00:00:00Z"
            }]}})),
        )
        .await
        .expect("the Go operator's status");
    for s in [
        go_secret("out-owner", Some(("app", &app_uid))),
        go_secret("out-orphan", None),
    ] {
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), APP);
    deployments
        .create(&PostParams::default(), &go_workload())
        .await
        .unwrap();

    // Dynamic secrets the Go operator holds a lease for: one with an
    // `Owner` target (its reference by uid, kind KMSDynamicSecret), one
    // `Orphan` (only its version annotation marks it).
    let mut go_leases = BTreeMap::new();
    for (name, owned) in [("db-go-owned", true), ("db-go", false)] {
        go_leases.insert(name, go_dynamic_secret(&client, &kms, name, owned).await);
    }

    let uids_before = uids(&client).await;
    assert_eq!(uids_before.len(), 6, "{uids_before:?}");
    let mut dynamic_before = BTreeMap::new();
    for name in go_leases.keys() {
        dynamic_before.insert(*name, secret_state(&client, &format!("{name}-out")).await);
    }
    let owner_before = secret_state(&client, "out-owner").await;
    let orphan_before = secret_state(&client, "out-orphan").await;
    let template_before = deployments.get("web").await.unwrap().spec.template;

    // --- The wrong order: our chart over the Go operator's CRDs.
    let (ok, text) = cp.run(
        "helm",
        &[
            "install",
            NEW.0,
            &harness::repo()
                .join("helm/secrets-operator")
                .display()
                .to_string(),
            "-n",
            NEW.1,
            "--create-namespace",
        ],
    );
    assert!(
        !ok,
        "our chart installed over the Go operator's CRDs:\n{text}"
    );
    assert!(
        text.contains("exists and cannot be imported into the current release")
            && text.contains("invalid ownership metadata"),
        "the refusal does not say why:\n{text}"
    );
    assert_eq!(
        uids(&client).await,
        uids_before,
        "a custom resource went away"
    );
    assert_eq!(crd_kinds(&client).await[0], "KMSSecret");
    assert_eq!(secret_state(&client, "out-owner").await.0, owner_before.0);
    // Refused before anything was created: no release to clean up.
    assert!(
        !cp.run("helm", &["status", NEW.0, "-n", NEW.1]).0,
        "the refused install left a release"
    );

    // --- The procedure.
    procedure(&cp, &old_chart);
    assert_eq!(
        crd_kinds(&client).await,
        [
            "KMSSecret",
            "KMSPushSecret",
            "KMSDynamicSecret",
            "ClusterGenerator"
        ],
        "the CRDs keep the kinds they serve"
    );
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("kmssecrets.secrets.hanzo.ai")
        .await
        .unwrap();
    let labels = crd.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["kmss".to_owned()][..]),
        "our CRD (its short name) replaced theirs"
    );
    assert_eq!(
        uids(&client).await,
        uids_before,
        "a custom resource went away"
    );
    assert!(
        !cp.run("helm", &["status", OLD.0, "-n", OLD.1]).0,
        "the old release is gone"
    );
    // Later upgrades of our release keep the served kinds too.
    cp.ok(
        "helm",
        &[
            "upgrade",
            NEW.0,
            &harness::repo()
                .join("helm/secrets-operator")
                .display()
                .to_string(),
            "-n",
            NEW.1,
            "--reuse-values",
        ],
    );
    assert_eq!(
        crd_kinds(&client).await[..3],
        ["KMSSecret", "KMSPushSecret", "KMSDynamicSecret"]
    );

    // --- Our operator takes over.
    let mut op = Operator::start_with_env(
        NEW.1,
        &[APP],
        &[],
        &[("KUBECONFIG", Some(&cp.kubeconfig().display().to_string()))],
    )
    .await;
    for (kind, plural, name) in [
        ("KMSSecret", "kmssecrets", "app"),
        ("KMSPushSecret", "kmspushsecrets", "push"),
        ("KMSDynamicSecret", "kmsdynamicsecrets", "db"),
    ] {
        let a = api(&client, kind, plural);
        let got = wait_for(Duration::from_secs(60), || async {
            let o = a.get(name).await.ok()?;
            (ready(&o)?.0 == "True").then_some(o)
        })
        .await;
        assert!(
            got.is_some(),
            "{kind} {name} not Ready: {:?}\n{}",
            a.get(name).await.ok().and_then(|o| ready(&o)),
            op.output.text()
        );
    }
    // The resource the Go operator accepted and our schema would not: its
    // status is written all the same (validation ratcheting).
    let legacy = wait_for(Duration::from_secs(30), || async {
        ready(&kms_secrets(&client).get("legacy").await.ok()?)
    })
    .await;
    assert!(
        legacy.is_some(),
        "no status on legacy\n{}",
        op.output.text()
    );

    // Same resources, same Secrets (uid and data), adopted.
    assert_eq!(
        uids(&client).await,
        uids_before,
        "a custom resource went away"
    );
    for (name, before) in [("out-owner", &owner_before), ("out-orphan", &orphan_before)] {
        let after = wait_for(Duration::from_secs(30), || async {
            let s = secret_state(&client, name).await;
            let annotations = s.2.metadata.annotations.clone().unwrap_or_default();
            (annotations
                .get("secrets.hanzo.ai/owner")
                .map(String::as_str)
                == Some("KmsSecret/app/app"))
            .then_some(s)
        })
        .await
        .unwrap_or_else(|| panic!("{name} not adopted\n{}", op.output.text()));
        assert_eq!(after.0, before.0, "{name} was recreated");
        assert_eq!(after.1, before.1, "{name}'s data changed");
    }
    let owners = secret_state(&client, "out-owner")
        .await
        .2
        .metadata
        .owner_references
        .unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].uid.as_str()),
        ("KMSSecret", app_uid.as_str())
    );
    // The leases the Go operator held are kept: same Secrets, same data,
    // same lease in the status, no new lease in the KMS.
    for (name, lease) in &go_leases {
        let a = api(&client, "KMSDynamicSecret", "kmsdynamicsecrets");
        let o = wait_for(Duration::from_secs(30), || async {
            let o = a.get(name).await.ok()?;
            (ready(&o)?.0 == "True").then_some(o)
        })
        .await
        .unwrap_or_else(|| panic!("{name} not Ready\n{}", op.output.text()));
        assert_eq!(
            o.data["status"]["lease"]["id"],
            lease.as_str(),
            "{name} took a new lease"
        );
        let (uid, data, s) = secret_state(&client, &format!("{name}-out")).await;
        let before = &dynamic_before[name];
        assert_eq!(uid, before.0, "{name}-out was recreated");
        assert_eq!(data, before.1, "{name}-out's data changed");
        let annotations = s.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("secrets.hanzo.ai/owner")
                .map(String::as_str),
            Some(format!("KmsDynamicSecret/{APP}/{name}").as_str()),
            "{name}-out not adopted"
        );
    }
    let active: Vec<String> = kms
        .leases(false)
        .await
        .iter()
        .filter_map(|l| l["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(active.len(), 3, "one lease per dynamic secret: {active:?}");
    for lease in go_leases.values() {
        assert!(active.contains(lease), "{lease} is gone: {active:?}");
    }
    let db = secret_state(&client, "db-out").await.2;
    let owners = db.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        owners.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(),
        ["KMSDynamicSecret"],
        "a new owned Secret names its owner as the cluster serves it"
    );
    // Events are found under the served kind (what `kubectl describe`
    // asks): the dynamic secret's first lease has one (a first successful
    // sync has none).
    let events = Api::<Event>::namespaced(client.clone(), APP);
    let kinds_of_events = || async {
        events
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|e| {
                        (
                            e.involved_object.kind.unwrap_or_default(),
                            e.involved_object.name.unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let found = wait_for(Duration::from_secs(15), || async {
        kinds_of_events()
            .await
            .contains(&("KMSDynamicSecret".to_owned(), "db".to_owned()))
            .then_some(())
    })
    .await;
    let all = kinds_of_events().await;
    assert!(
        found.is_some(),
        "no Event under kind KMSDynamicSecret: {all:?}"
    );
    assert!(
        all.iter().all(|(kind, _)| !kind.starts_with("Kms")),
        "an Event names a kind the cluster does not serve: {all:?}"
    );

    // No workload rolls: the pod template is the Go operator's, and stays.
    let unchanged = holds_for(Duration::from_secs(5), || async {
        deployments
            .get("web")
            .await
            .is_ok_and(|d| d.spec.template == template_before)
    })
    .await;
    if let Err(e) = unchanged {
        let now = deployments.get("web").await.ok().map(|d| d.spec.template);
        panic!(
            "the pod template changed ({e}): {}",
            serde_json::to_string(&now).unwrap_or_default()
        );
    }
    op.stop();
}
