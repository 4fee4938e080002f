//! `kms-operator migrate` on a real API server with the dev KMS: manifests
//! of the Go operators' documented shape (their CRDs and templates,
//! Go templates with Sprig functions included) plus the seed documents'
//! Namespace and `kms-config` examples go through `migrate`, the output is
//! applied with kubectl, and the operator syncs to exactly the data the
//! original documents promise; the push lands in the KMS and the dynamic
//! lease is created. Also: the report lists what it cannot carry and flags
//! cross-namespace references; `--from-cluster` reads the Go operator's
//! objects from the API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, wait_for};
use crate::support::{
    CLIENT_ID, CLIENT_SECRET, DevServer, Operator, TempDir, binary, create_credentials,
};

/// The seed document's global-config example (reference/seeds, "kms-config"),
/// verbatim: a Namespace and the ConfigMap.
const SEED_NAMESPACE: &str =
    "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kms-operator-system\n";
const SEED_KMS_CONFIG: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: kms-config
  namespace: kms-operator-system
data:
  hostAPI: https://example.com/api # <-- global hostAPI
  tls.caRef.secretName: custom-ca-certificate # <-- global TLS CA secret name
  tls.caRef.secretNamespace: default # <-- global TLS CA secret namespace
  tls.caRef.key: ca.crt # <-- global TLS CA secret key
";

/// Values in the dev KMS (`demo`/`dev`, folder `/`).
const SECRETS: [(&str, &str); 4] = [
    ("DB_USER", "app"),
    ("DB_PASSWORD", "s3cr3t p@ss"),
    ("DB_NAME", "Orders"),
    ("API_KEY", "abc123"),
];

fn kms_seed() -> String {
    let mut s = String::from(
        "projects:\n  - slug: demo\n    name: Demo\n    environments: [dev, prod]\n    secrets:\n      dev:\n        /:\n",
    );
    for (k, v) in SECRETS {
        s.push_str(&format!(
            "          {k}: {}\n",
            serde_json::to_string(v).unwrap()
        ));
    }
    s.push_str(
        "    dynamicSecrets:\n      - name: db-creds\n        environment: dev\n        path: /\n        defaultTTL: 1h\n        maxTTL: 24h\n",
    );
    s.push_str(&format!(
        "identities:\n  - name: operator\n    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}\n    projects: [demo]\n"
    ));
    s
}

/// Five manifests as the Go operators document them, in namespace `NS` and
/// against host `HOST`: universal auth with the deprecated single target and
/// interval; a Go template with Sprig functions (and a ConfigMap target); a
/// push secret with its source Secret; a dynamic secret; a Hanzo KMSSecret
/// that takes its host from the global `kms-config`.
const GO_MANIFESTS: &str = r#"apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata:
  name: universal
  namespace: NS
spec:
  hostAPI: HOST
  resyncInterval: 60
  authentication:
    universalAuth:
      secretsScope:
        projectSlug: demo
        envSlug: dev
        secretsPath: "/"
      credentialsRef:
        secretName: universal-auth-credentials
        secretNamespace: NS
  managedSecretReference:
    secretName: universal-out
    secretNamespace: NS
    creationPolicy: "Owner"
---
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata:
  name: templated
  namespace: NS
spec:
  hostAPI: HOST
  syncConfig:
    resyncInterval: 10s
  authentication:
    universalAuth:
      secretsScope:
        projectSlug: demo
        envSlug: dev
        secretsPath: "/"
      credentialsRef:
        secretName: universal-auth-credentials
        secretNamespace: NS
  managedKubeSecretReferences:
    - secretName: templated-out
      secretNamespace: NS
      creationPolicy: "Orphan"
      template:
        includeAllSecrets: false
        data:
          DSN: "postgres://{{ .DB_USER.Value }}:{{ .DB_PASSWORD.Value | urlquery }}@db:5432/{{ .DB_NAME.Value | lower }}"
          USER_UPPER: "{{ .DB_USER.Value | upper }}"
          API_KEY_B64: "{{ .API_KEY.Value | b64enc }}"
          QUOTED: "{{ .DB_NAME.Value | quote }}"
          SECRET_PATH: "{{ .DB_PASSWORD.SecretPath }}"
          BRANCH: '{{ if eq .DB_USER.Value "app" }}yes{{ else }}no{{ end }}'
          JOINED: '{{ list .DB_USER.Value .DB_NAME.Value | join "," }}'
          DIGEST: "{{ .API_KEY.Value | sha256sum | trunc 12 }}"
  managedKubeConfigMapReferences:
    - configMapName: templated-cm
      configMapNamespace: NS
      template:
        data:
          USER: "{{ .DB_USER.Value | title }}"
---
apiVersion: v1
kind: Secret
metadata:
  name: push-source
  namespace: NS
stringData:
  password: hunter2
  user: bob
---
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalPushSecret
metadata:
  name: push
  namespace: NS
spec:
  hostAPI: HOST
  resyncInterval: 1m
  updatePolicy: Replace
  deletionPolicy: Delete
  destination:
    projectSlug: demo
    environmentSlug: prod
    secretsPath: /
  push:
    secret:
      secretName: push-source
      secretNamespace: NS
      template:
        includeAllSecrets: true
        data:
          PASSWORD_UPPER: "{{ .password.Value | upper }}"
  authentication:
    universalAuth:
      credentialsRef:
        secretName: universal-auth-credentials
        secretNamespace: NS
---
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalDynamicSecret
metadata:
  name: dynamic
  namespace: NS
spec:
  hostAPI: HOST
  dynamicSecret:
    secretName: db-creds
    projectSlug: demo
    environmentSlug: dev
    secretsPath: /
  leaseTTL: 1h
  leaseRevocationPolicy: Revoke
  managedSecretReference:
    secretName: dynamic-out
    secretNamespace: NS
    creationPolicy: Owner
  authentication:
    universalAuth:
      credentialsRef:
        secretName: universal-auth-credentials
        secretNamespace: NS
---
apiVersion: secrets.hanzo.ai/v1alpha1
kind: KMSSecret
metadata:
  name: hanzo
  namespace: NS
spec:
  syncConfig:
    resyncInterval: 30s
  authentication:
    universalAuth:
      secretsScope:
        projectSlug: demo
        envSlug: dev
        secretsPath: /
        secretName: DB_PASSWORD
      credentialsRef:
        secretName: universal-auth-credentials
        secretNamespace: NS
  managedKubeSecretReferences:
    - secretName: hanzo-out
      secretNamespace: NS
      template:
        includeAllSecrets: true
        metadata:
          labels:
            app: web
"#;

fn kubectl() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = Command::new(harness::repo().join("tests/testenv/testenv"))
            .args(["path", "kubectl"])
            .output()
            .expect("tests/testenv/testenv path kubectl");
        assert!(out.status.success(), "testenv path kubectl");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// `kms-operator migrate <args>`: (exit status, stdout, stderr).
fn migrate(args: &[&str], kubeconfig: Option<&Path>) -> (i32, String, String) {
    let mut cmd = Command::new(binary());
    cmd.arg("migrate").args(args);
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    let out = cmd.output().expect("run kms-operator migrate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    )
}

fn kubectl_apply(dir: &Path, manifest: &str) {
    let file = dir.join("apply.yaml");
    std::fs::write(&file, manifest).unwrap();
    let out = Command::new(kubectl())
        .env("KUBECONFIG", harness::kubeconfig())
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args([
            "apply",
            "--server-side",
            "--field-manager=migrate-test",
            "--validate=strict",
            "-f",
        ])
        .arg(&file)
        .output()
        .expect("kubectl apply");
    assert!(
        out.status.success(),
        "kubectl apply of the migrated manifests failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

async fn secret_data(client: &Client, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let s: Secret = Api::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    Some(
        s.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect(),
    )
}

fn bytes(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// Wait until Secret `name` holds exactly `want`; panic with what it holds.
async fn wait_secret(client: &Client, ns: &str, name: &str, want: &BTreeMap<String, Vec<u8>>) {
    let got = wait_for(Duration::from_secs(60), || async {
        secret_data(client, ns, name).await.filter(|d| d == want)
    })
    .await;
    if got.is_none() {
        let keys: Vec<String> = secret_data(client, ns, name)
            .await
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default();
        panic!("Secret {ns}/{name} never held the promised data; its keys: {keys:?}");
    }
}

/// The dev KMS folder `/` of `demo`/`prod`: key → value.
async fn kms_prod(kms: &DevServer) -> BTreeMap<String, String> {
    kms.values("demo", "prod", "/").await
}

fn dynamic_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsDynamicSecret"),
        "kmsdynamicsecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A CA certificate (PEM) for the seed's `custom-ca-certificate`.
fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    rcgen::CertificateParams::new(vec!["kms.example.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem()
}

#[tokio::test]
async fn migrate_round_trip_applies_and_syncs_as_the_go_documents_promise() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "migrate").await;
    // Stands in for the seed's kms-operator-system (shared by every test).
    let system = TestNamespace::new(&client, "migrate-sys").await;
    let kms = DevServer::start(&kms_seed()).await;
    let dir = TempDir::new("migrate");

    let go = GO_MANIFESTS
        .replace("NS", &ns.name)
        .replace("HOST", &kms.api());
    let bundle = format!("{SEED_NAMESPACE}---\n{SEED_KMS_CONFIG}---\n{go}");
    let input = dir.0.join("bundle.yaml");
    std::fs::write(&input, &bundle).unwrap();

    let (code, out, report) = migrate(&[input.to_str().unwrap()], None);
    eprintln!("migrate report:\n{report}");
    assert_eq!(code, 0, "migrate exited {code}:\n{report}");
    // Other documents pass through byte for byte.
    assert!(
        out.starts_with(&format!("---\n{SEED_NAMESPACE}---\n{SEED_KMS_CONFIG}---\n")),
        "{out}"
    );
    assert!(
        out.contains("kind: Secret\nmetadata:\n  name: push-source\n"),
        "{out}"
    );
    for kind in [
        "InfisicalSecret",
        "InfisicalPushSecret",
        "InfisicalDynamicSecret",
        "KMSSecret",
    ] {
        assert!(
            !out.contains(&format!("kind: {kind}\n")),
            "{kind} left in the output:\n{out}"
        );
    }
    for line in [
        format!(
            "converted    InfisicalSecret {0}/universal (secrets.infisical.com/v1alpha1) -> KmsSecret {0}/universal (secrets.hanzo.ai/v1alpha1)",
            ns.name
        ),
        format!("converted    InfisicalPushSecret {}/push", ns.name),
        format!("converted    InfisicalDynamicSecret {}/dynamic", ns.name),
        format!(
            "converted    KMSSecret {}/hanzo (secrets.hanzo.ai/v1alpha1) -> KmsSecret",
            ns.name
        ),
        "passed       Namespace kms-operator-system (unchanged)".to_owned(),
        "passed       ConfigMap kms-operator-system/kms-config (unchanged)".to_owned(),
        format!("{:<18}spec.managedSecretReference", "folded:"),
        format!("{:<18}spec.resyncInterval", "folded:"),
        "summary: 5 converted, 3 passed through".to_owned(),
    ] {
        assert!(report.contains(&line), "report lacks {line:?}:\n{report}");
    }
    assert!(
        !report.contains("hunter2") && !report.contains("s3cr3t"),
        "{report}"
    );

    // Apply as the docs say, with the seed's kms-operator-system and its
    // example host and CA standing for this test's namespace and KMS.
    create_credentials(&client, &ns.name, "universal-auth-credentials").await;
    let ca: Secret = serde_json::from_value(json!({
        "metadata": {"name": "custom-ca-certificate"},
        "stringData": {"ca.crt": ca_pem()}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &system.name)
        .create(&PostParams::default(), &ca)
        .await
        .unwrap();
    let applied = out
        .replace("kms-operator-system", &system.name)
        .replace("https://example.com/api", &kms.api())
        .replace(
            "tls.caRef.secretNamespace: default",
            &format!("tls.caRef.secretNamespace: {}", system.name),
        );
    kubectl_apply(&dir.0, &applied);
    let config: ConfigMap = Api::namespaced(client.clone(), &system.name)
        .get("kms-config")
        .await
        .expect("the seed's kms-config applied");
    assert_eq!(
        config
            .data
            .unwrap_or_default()
            .get("hostAPI")
            .map(String::as_str),
        Some(kms.api().as_str())
    );

    // The operator reads kms-config where the seed put it (standing in for
    // kms-operator-system).
    let global = format!("--global-config-namespace={}", system.name);
    let _op = Operator::start(&system.name, &[&ns.name], &[&global]).await;

    // 1. Universal auth, deprecated single target: every secret of the scope.
    wait_secret(&client, &ns.name, "universal-out", &bytes(&SECRETS)).await;
    // 2. Go templates with Sprig functions, rendered as Go renders them.
    wait_secret(
        &client,
        &ns.name,
        "templated-out",
        &bytes(&[
            ("DSN", "postgres://app:s3cr3t+p%40ss@db:5432/orders"),
            ("USER_UPPER", "APP"),
            ("API_KEY_B64", "YWJjMTIz"),
            ("QUOTED", "\"Orders\""),
            ("SECRET_PATH", "/"),
            ("BRANCH", "yes"),
            ("JOINED", "app,Orders"),
            ("DIGEST", "6ca13d52ca70"),
        ]),
    )
    .await;
    let cm = wait_for(Duration::from_secs(30), || async {
        Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
            .get_opt("templated-cm")
            .await
            .ok()
            .flatten()
            .and_then(|c| c.data)
    })
    .await
    .expect("ConfigMap templated-cm written");
    assert_eq!(cm, BTreeMap::from([("USER".to_owned(), "App".to_owned())]));
    // 5. The Hanzo KMSSecret: no hostAPI of its own (the seed's kms-config
    // names it), one secret by name, template metadata labels.
    wait_secret(
        &client,
        &ns.name,
        "hanzo-out",
        &bytes(&[("DB_PASSWORD", "s3cr3t p@ss")]),
    )
    .await;
    let hanzo: Secret = Api::namespaced(client.clone(), &ns.name)
        .get("hanzo-out")
        .await
        .unwrap();
    assert_eq!(
        hanzo
            .metadata
            .labels
            .unwrap_or_default()
            .get("app")
            .map(String::as_str),
        Some("web")
    );

    // 3. The push lands in the KMS: every source key plus the template's.
    let want: BTreeMap<String, String> = [
        ("password", "hunter2"),
        ("user", "bob"),
        ("PASSWORD_UPPER", "HUNTER2"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let pushed = wait_for(Duration::from_secs(60), || async {
        Some(kms_prod(&kms).await).filter(|f| *f == want)
    })
    .await;
    assert!(
        pushed.is_some(),
        "the push never landed; KMS keys: {:?}",
        kms_prod(&kms).await.keys().collect::<Vec<_>>()
    );

    // 4. The dynamic secret: a lease in the KMS, its id in status, its
    // credentials in the Secret.
    let lease_id = wait_for(Duration::from_secs(60), || async {
        let o = dynamic_api(&client, &ns.name).get("dynamic").await.ok()?;
        o.data["status"]["lease"]["id"].as_str().map(str::to_owned)
    })
    .await
    .expect("a lease in the KmsDynamicSecret's status");
    let leases = kms.leases(false).await;
    assert!(
        leases
            .iter()
            .any(|l| l["id"].as_str() == Some(lease_id.as_str())),
        "lease {lease_id} not active in the KMS: {leases:?}"
    );
    let creds = wait_for(Duration::from_secs(30), || async {
        secret_data(&client, &ns.name, "dynamic-out")
            .await
            .filter(|d| d.contains_key("DB_USERNAME") && d.contains_key("DB_PASSWORD"))
    })
    .await;
    assert!(
        creds.is_some(),
        "dynamic-out never received the lease's credentials"
    );
}

#[tokio::test]
async fn migrate_reports_what_it_cannot_carry_and_cross_namespace_references() {
    let dir = TempDir::new("migrate-report");
    let input = dir.0.join("in.yaml");
    std::fs::write(
        &input,
        r#"apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata:
  name: shared-creds
  namespace: app
spec:
  authentication:
    universalAuth:
      credentialsRef:
        secretName: machine-identity
        secretNamespace: infra
      secretsScope: {projectSlug: demo, envSlug: prod, secretsPath: /}
  managedKubeSecretReferences:
    - secretName: out
      secretNamespace: app
---
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalDynamicSecret
metadata:
  name: db
  namespace: app
spec:
  authentication:
    universalAuth:
      credentialsRef: {secretName: machine-identity, secretNamespace: app}
  dynamicSecret: {secretName: db-creds, projectSlug: demo, environmentSlug: prod, secretsPath: /}
  leaseTTL: 1.5h
  leaseRevocationPolicy: Revoke
  managedSecretReference: {secretName: db, secretNamespace: app}
"#,
    )
    .unwrap();
    let (code, out, report) = migrate(&[input.to_str().unwrap()], None);
    assert_eq!(code, 2, "{report}");
    // What could be carried is still printed.
    assert!(out.contains("kind: KmsSecret\n"), "{out}");
    assert!(out.contains("kind: KmsDynamicSecret\n"), "{out}");
    assert!(!out.contains("leaseTTL"), "{out}");
    for line in [
        format!(
            "{:<18}spec.leaseTTL: \"1.5h\" is not an interval",
            "not carried:"
        ),
        format!(
            "{:<18}spec.authentication.universalAuth.credentialsRef.secretNamespace: the credentials Secret in namespace \"infra\", the resource is in \"app\": the operator must run with --allow-cross-namespace-refs (chart value security.allowCrossNamespaceReferences: true)",
            "cross-namespace:"
        ),
        "1 fields not carried, 1 cross-namespace references".to_owned(),
        "exit status 2".to_owned(),
    ] {
        assert!(report.contains(&line), "report lacks {line:?}:\n{report}");
    }

    // Through stdin, the same.
    let mut child = Command::new(binary())
        .args(["migrate", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&std::fs::read(&input).unwrap()).unwrap();
    }
    let piped = child.wait_with_output().unwrap();
    assert_eq!(piped.status.code(), Some(2));
    assert_eq!(String::from_utf8(piped.stdout).unwrap(), out);
}

#[tokio::test]
async fn migrate_from_cluster_reads_the_go_operators_objects() {
    let client = harness::client().await;
    // The Infisical operator's CRD (as far as listing it needs).
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "infisicalsecrets.secrets.infisical.com"},
        "spec": {
            "group": "secrets.infisical.com",
            "names": {"kind": "InfisicalSecret", "listKind": "InfisicalSecretList", "plural": "infisicalsecrets", "singular": "infisicalsecret"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    }))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "infisicalsecrets.secrets.infisical.com",
        &PatchParams::apply("migrate-test").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("the Infisical CRD");
    kms_testkit::testenv::wait_established(
        &client,
        &["infisicalsecrets.secrets.infisical.com".to_owned()],
        Duration::from_secs(30),
    )
    .await
    .expect("established");

    let ns = TestNamespace::new(&client, "migrate-cluster").await;
    let kms = DevServer::start(&crate::support::seed(&[("A", "1"), ("B", "two")])).await;
    create_credentials(&client, &ns.name, "creds").await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.infisical.com", "v1alpha1", "InfisicalSecret"),
        "infisicalsecrets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.infisical.com/v1alpha1", "kind": "InfisicalSecret",
        "metadata": {"name": "live", "labels": {"team": "a"}},
        "spec": {
            "hostAPI": kms.api(),
            "resyncInterval": 30,
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "creds", "secretNamespace": ns.name},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedSecretReference": {"secretName": "live-out", "secretNamespace": ns.name}
        }
    }))
    .unwrap();
    // The API server may need a moment to serve the new resource.
    let created = wait_for(Duration::from_secs(30), || async {
        api.create(&PostParams::default(), &obj).await.ok()
    })
    .await
    .expect("InfisicalSecret not created");
    // The Secret as the Infisical operator wrote it: its version annotation
    // and an owner reference to the InfisicalSecret.
    let written: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "live-out",
            "annotations": {"secrets.infisical.com/version": "W/\"secrets-40-0A1B2C3D\""},
            "ownerReferences": [{
                "apiVersion": "secrets.infisical.com/v1alpha1", "kind": "InfisicalSecret",
                "name": "live", "uid": created.metadata.uid.clone().unwrap(),
            }]
        },
        "stringData": {"A": "1", "B": "two"}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let before = secrets
        .create(&PostParams::default(), &written)
        .await
        .expect("the Go operator's Secret");

    let kubeconfig = harness::kubeconfig();
    let (code, out, report) = migrate(
        &["--from-cluster", "--namespace", &ns.name],
        Some(&kubeconfig),
    );
    assert_eq!(code, 0, "{report}");
    let docs: Vec<Value> = out
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_saphyr::from_str(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 1, "{out}");
    let d = &docs[0];
    assert_eq!(d["kind"], "KmsSecret");
    assert_eq!(d["metadata"]["name"], "live");
    assert_eq!(d["metadata"]["namespace"], ns.name.as_str());
    assert_eq!(d["metadata"]["labels"]["team"], "a");
    assert!(d["metadata"].get("resourceVersion").is_none(), "{out}");
    assert!(d["metadata"].get("uid").is_none(), "{out}");
    assert_eq!(d["spec"]["syncConfig"]["resyncInterval"], "30s");
    assert_eq!(
        d["spec"]["managedKubeSecretReferences"][0]["secretName"],
        "live-out"
    );
    assert!(
        report.contains(&format!("converted    InfisicalSecret {}/live", ns.name)),
        "{report}"
    );

    // And it applies: our CRD accepts what was read from the cluster, and
    // the operator takes the Go operator's Secret over in place: same
    // object, same data, now stamped by kms-operator.
    let dir = TempDir::new("migrate-cluster");
    kubectl_apply(&dir.0, &out);
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let after = wait_for(Duration::from_secs(60), || async {
        secrets
            .get_opt("live-out")
            .await
            .ok()
            .flatten()
            .filter(|s| {
                s.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("secrets.hanzo.ai/version"))
            })
    })
    .await
    .expect("kms-operator never took the Go operator's Secret over");
    assert_eq!(after.metadata.uid, before.metadata.uid);
    let data: BTreeMap<String, Vec<u8>> = after
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    assert_eq!(data, bytes(&[("A", "1"), ("B", "two")]));
}
