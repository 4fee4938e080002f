//! The global configuration as the Go operators' documentation has users
//! write it: the ConfigMap `kms-config` in the namespace
//! `kms-operator-system`, created by the user (never by the operator or the
//! chart), read and followed without a restart, each field (host, CA)
//! falling back on its own, and each resource's status naming where its
//! host and CA came from.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace};
use crate::kms_secret::{apply_cr, condition, expect, wait_condition, wait_data};
use crate::kms_secret_extras::{certificates, cr, scope, universal_credentials};
use crate::support::{DevServer, Operator, TempDir, seed};

/// The namespace the documentation names (and the operator's default).
const DOCUMENTED_NAMESPACE: &str = "kms-operator-system";
/// The status condition naming the endpoint's sources.
const ENDPOINT: &str = "secrets.hanzo.ai/Endpoint";

/// A KmsSecret with no `hostAPI` (and no `tls`) of its own.
fn without_host(name: &str, target: &str) -> Value {
    let mut v = cr(
        name,
        "",
        target,
        json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}, "secretsScope": scope()}}),
    );
    v["spec"].as_object_mut().unwrap().remove("hostAPI");
    v
}

/// Create `ns` unless it exists.
async fn ensure_namespace(client: &Client, ns: &str) {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {ns}: {e}"),
    }
}

/// Write `kms-config` in `ns` with `data` (replacing what is there), as a
/// user's `kubectl apply` would.
async fn apply_kms_config(client: &Client, ns: &str, data: Value) {
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kms-config", "namespace": ns},
        "data": data
    });
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "kms-config",
            &PatchParams::apply("kubectl-client-side-apply").force(),
            &Patch::Apply(cm),
        )
        .await
        .expect("apply kms-config");
}

/// Wait until the resource's Endpoint condition says `want` (all of it).
async fn wait_endpoint(client: &Client, ns: &str, name: &str, want: &[&str]) -> String {
    let got = harness::wait_for(Duration::from_secs(30), || async {
        let (status, _, message) = condition(client, ns, name, ENDPOINT).await?;
        (status == "True" && want.iter().all(|w| message.contains(w))).then_some(message)
    })
    .await;
    match got {
        Some(message) => message,
        None => panic!(
            "{name}: the Endpoint condition never said {want:?}; it is {:?}",
            condition(client, ns, name, ENDPOINT).await
        ),
    }
}

#[tokio::test]
async fn the_documented_kms_config_is_read_followed_per_field_and_named_in_the_status() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "gc-doc").await;
    let dir = TempDir::new("gc-certs");
    let (ca, cert, key) = certificates(&dir, "kms");
    let kms = DevServer::start_with(
        &seed(&[("DB_PASSWORD", "s3cret")]),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    )
    .await;
    let moved = DevServer::start(&seed(&[("DB_PASSWORD", "moved")])).await;
    universal_credentials(&client, &ns.name).await;
    crate::kms_secret_extras::create_secret(&client, &ns.name, "kms-ca", json!({"ca.crt": ca}))
        .await;

    // The documented workflow: the namespace and the ConfigMap, applied by
    // the user. This test is the only one that writes it.
    ensure_namespace(&client, DOCUMENTED_NAMESPACE).await;
    apply_kms_config(
        &client,
        DOCUMENTED_NAMESPACE,
        json!({
            "hostAPI": kms.api(),
            "tls.caRef.secretName": "kms-ca",
            "tls.caRef.secretNamespace": ns.name,
            "tls.caRef.key": "ca.crt"
        }),
    )
    .await;
    let _cleanup = DeleteOnDrop(DOCUMENTED_NAMESPACE);

    // The operator as installed: no global-config flag, its default.
    let op = Operator::start_with_env(
        &ns.name,
        &[&ns.name],
        &[],
        &[("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE", None)],
    )
    .await;

    // No hostAPI of its own: host and CA from kms-config.
    apply_cr(&client, &ns.name, without_host("doc", "doc-out")).await;
    // Its own host (the same TLS server by another name), no CA: the CA
    // still comes from kms-config, field by field.
    let own_host = kms.api().replace("127.0.0.1", "localhost");
    apply_cr(
        &client,
        &ns.name,
        cr(
            "own-host",
            &own_host,
            "own-host-out",
            json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}, "secretsScope": scope()}}),
        ),
    )
    .await;
    let want = expect(&[("DB_PASSWORD", "s3cret")]);
    for target in ["doc-out", "own-host-out"] {
        wait_data(&client, &ns.name, target, &want, Duration::from_secs(30)).await;
    }
    let from_config = "from kms-config (kms-operator-system/kms-config)";
    let doc = wait_endpoint(
        &client,
        &ns.name,
        "doc",
        &[&format!("hostAPI {} {from_config}", kms.api())],
    )
    .await;
    assert!(
        doc.contains(&format!(
            "CA Secret {}/kms-ca key ca.crt {from_config}",
            ns.name
        )),
        "{doc}"
    );
    let own = wait_endpoint(
        &client,
        &ns.name,
        "own-host",
        &[&format!("hostAPI {own_host} from spec")],
    )
    .await;
    assert!(
        own.contains(&format!(
            "CA Secret {}/kms-ca key ca.crt {from_config}",
            ns.name
        )),
        "{own}"
    );

    // A change of the ConfigMap is followed without a restart: the resource
    // that follows it moves to the new host; the one with its own host
    // stays where it is.
    apply_kms_config(
        &client,
        DOCUMENTED_NAMESPACE,
        json!({
            "hostAPI": moved.api(),
            "tls.caRef.secretName": "kms-ca",
            "tls.caRef.secretNamespace": ns.name,
            "tls.caRef.key": "ca.crt"
        }),
    )
    .await;
    wait_data(
        &client,
        &ns.name,
        "doc-out",
        &expect(&[("DB_PASSWORD", "moved")]),
        Duration::from_secs(30),
    )
    .await;
    wait_endpoint(
        &client,
        &ns.name,
        "doc",
        &[&format!("hostAPI {} {from_config}", moved.api())],
    )
    .await;
    wait_condition(
        &client,
        &ns.name,
        "own-host",
        "Ready",
        "True",
        Duration::from_secs(5),
    )
    .await;
    let still = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns.name)
        .get("own-host-out")
        .await
        .unwrap();
    assert_eq!(
        crate::kms_secret::data_of(&still),
        want,
        "the resource with its own host moved"
    );
    drop(op);
}

/// Deletes `kms-config` of a namespace when dropped (the namespace stays:
/// it is shared and, without a controller manager, could not be deleted).
struct DeleteOnDrop(&'static str);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let ns = self.0;
        let path = harness::kubeconfig();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let client = harness::client_for(&path).await.ok()?;
                Api::<ConfigMap>::namespaced(client, ns)
                    .delete("kms-config", &DeleteParams::default())
                    .await
                    .ok()
            })
        })
        .join();
    }
}

#[tokio::test]
async fn a_global_config_namespace_that_does_not_exist_yet_is_picked_up_when_it_appears() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "gc-late").await;
    let late = format!("{}-cfg", ns.name);
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret")])).await;
    universal_credentials(&client, &ns.name).await;

    // The operator starts although the namespace does not exist; its own
    // default host is a dead local port (nothing outside is ever asked).
    let _op = Operator::start_with_env(
        &ns.name,
        &[&ns.name],
        &[
            "--default-host-api",
            "http://127.0.0.1:9/api",
            "--allowed-kms-hosts",
            "127.0.0.1",
        ],
        &[("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE", Some(&late))],
    )
    .await;
    apply_cr(&client, &ns.name, without_host("app", "app-out")).await;
    wait_endpoint(
        &client,
        &ns.name,
        "app",
        &["hostAPI http://127.0.0.1:9/api from operator default (--default-host-api)"],
    )
    .await;
    wait_condition(
        &client,
        &ns.name,
        "app",
        "Ready",
        "False",
        Duration::from_secs(30),
    )
    .await;

    // The namespace and kms-config appear: picked up, without a restart.
    ensure_namespace(&client, &late).await;
    let _late = TestNamespace { name: late.clone() };
    apply_kms_config(&client, &late, json!({"hostAPI": kms.api()})).await;
    wait_data(
        &client,
        &ns.name,
        "app-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(60),
    )
    .await;
    wait_endpoint(
        &client,
        &ns.name,
        "app",
        &[&format!(
            "hostAPI {} from kms-config ({late}/kms-config); CA: system roots",
            kms.api()
        )],
    )
    .await;
}
