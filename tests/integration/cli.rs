//! The CLI as a kubectl user meets it: `kms-operator status` with kubectl's
//! `--kubeconfig`, `--context`, `-n` and `-A`, run with the token of a
//! ServiceAccount bound to one namespace only; the same binary found by
//! kubectl's plugin lookup as `kubectl-kms`; shell completion.

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace};
use crate::helm::{kubectl_binary, token_kubeconfig};
use crate::kms_secret::{apply_cr, kms_secrets};
use crate::kms_secret_extras::{cr, scope};
use crate::support::{TempDir, binary};

/// Output and success of a command.
fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("run the command");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Set a resource's Ready condition (and shard) as the operator would.
async fn set_ready(client: &kube::Client, ns: &str, name: &str, ready: &str, reason: &str) {
    let status = json!({"status": {"shard": 3, "conditions": [{
        "type": "Ready", "status": ready, "reason": reason,
        "message": format!("{reason}: as set by the test"),
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    kms_secrets(client, ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");
}

/// A kubeconfig whose only user is the ServiceAccount `viewer` of `ns`,
/// allowed to read the three kinds there and nothing else.
async fn namespaced_viewer(client: &kube::Client, ns: &str, path: &Path) {
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "viewer"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("ServiceAccount");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "kms-viewer"},
        "rules": [{"apiGroups": ["secrets.hanzo.ai"],
                   "resources": ["kmssecrets", "kmspushsecrets", "kmsdynamicsecrets"],
                   "verbs": ["get", "list"]}]}))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kms-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kms-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}]}))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .unwrap();
    let token = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request("viewer", &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .and_then(|s| s.token)
        .expect("token");
    token_kubeconfig(path, &token, ns);
}

#[tokio::test]
async fn status_works_for_a_user_of_one_namespace_and_as_a_kubectl_plugin() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cli-status").await;
    let other = TestNamespace::new(&client, "cli-status-other").await;
    let auth = json!({"universalAuth": {"credentialsRef": {"secretName": "creds"}, "secretsScope": scope()}});
    for (name, namespace) in [
        ("good", &ns.name),
        ("bad", &ns.name),
        ("new", &ns.name),
        ("elsewhere", &other.name),
    ] {
        apply_cr(
            &client,
            namespace,
            cr(
                name,
                "http://127.0.0.1:1/api",
                &format!("{name}-out"),
                auth.clone(),
            ),
        )
        .await;
    }
    set_ready(&client, &ns.name, "good", "True", "Synced").await;
    set_ready(&client, &ns.name, "bad", "False", "CredentialsNotFound").await;
    let dir = TempDir::new("cli-status");
    let kubeconfig = dir.0.join("kubeconfig");
    namespaced_viewer(&client, &ns.name, &kubeconfig).await;

    // `-n NS`: every resource of NS, Ready ones too, and a note for the
    // Leases this user may not read.
    let (ok, out, err) = run(Command::new(binary()).args([
        "status",
        "-n",
        &ns.name,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]));
    assert!(ok, "status failed: {err}\n{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("KIND") && lines[0].contains("READY") && lines[0].contains("REASON"),
        "{out}"
    );
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no row for {name}:\n{out}"))
    };
    assert_eq!(row("good"), ["KmsSecret", "good", "True", "Synced"]);
    assert_eq!(
        row("bad"),
        ["KmsSecret", "bad", "False", "CredentialsNotFound"]
    );
    assert_eq!(row("new"), ["KmsSecret", "new", "Unknown", "Pending"]);
    assert!(
        !out.contains("elsewhere"),
        "another namespace was listed:\n{out}"
    );
    assert!(out.contains("3 resources, 2 not ready"), "{out}");
    assert!(
        out.contains("note: leases.coordination.k8s.io in namespace kms-operator-system cannot be read: forbidden"),
        "{out}"
    );

    // The context's namespace is the default, as in kubectl; JSON has the
    // same rows and the note.
    let (ok, out, err) = run(Command::new(binary()).args([
        "status",
        "-o",
        "json",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]));
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(report["namespace"], ns.name.as_str());
    assert_eq!(
        report["resources"].as_array().unwrap().len(),
        3,
        "{report:#}"
    );
    assert_eq!(report["not_ready"], 2);
    assert_eq!(report["resources"][0]["shard"], 3, "{report:#}");

    // `-o wide` adds the shard and the message.
    let (ok, out, _) = run(Command::new(binary()).args([
        "status",
        "-o",
        "wide",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]));
    assert!(
        ok && out.contains("CredentialsNotFound: as set by the test"),
        "{out}"
    );

    // `-A` needs rights this user does not have: an error naming them.
    let (ok, out, err) = run(Command::new(binary()).args([
        "status",
        "-A",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]));
    assert!(!ok, "-A succeeded without the rights: {out}");
    assert!(
        err.contains("cannot be read: forbidden (needs list on kmssecrets.secrets.hanzo.ai)"),
        "{err}"
    );

    // An unknown context is an error that names it.
    let (ok, _, err) = run(Command::new(binary()).args([
        "status",
        "--context",
        "nope",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]));
    assert!(!ok && err.contains("nope"), "{err}");

    // As a kubectl plugin: kubectl finds `kubectl-kms` on the PATH.
    let bin_dir = dir.0.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(binary(), bin_dir.join("kubectl-kms")).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (ok, out, err) = run(Command::new(kubectl_binary())
        .args(["kms", "status", "-n", &ns.name])
        .env("PATH", &path)
        .env("KUBECONFIG", &kubeconfig));
    assert!(ok, "kubectl kms status: {err}");
    assert!(out.contains("3 resources, 2 not ready"), "{out}");
    let (_, out, _) = run(Command::new(kubectl_binary())
        .args(["kms", "--help"])
        .env("PATH", &path));
    assert!(out.contains("Usage: kubectl kms"), "{out}");
    let (ok, out, _) = run(Command::new(kubectl_binary())
        .args(["plugin", "list"])
        .env("PATH", &path));
    assert!(ok && out.contains("kubectl-kms"), "{out}");
}

#[test]
fn completion_scripts_for_three_shells() {
    for (shell, marker) in [
        ("bash", "complete -F _kms__operator"),
        ("zsh", "#compdef kms-operator"),
        ("fish", "complete -c kms-operator"),
    ] {
        let (ok, out, err) = run(Command::new(binary()).args(["completion", shell]));
        assert!(ok, "{shell}: {err}");
        assert!(
            out.contains(marker),
            "{shell}: {}",
            &out[..out.len().min(300)]
        );
        assert!(out.contains("status"), "{shell}: no subcommands");
    }
}

/// `kms-operator check` (what the chart's `helm test` runs) against the API
/// server: passes when the CRDs are served, the StatefulSet runs the
/// replicas asked for and all are Ready, the shards have fresh holders and
/// the resources named are Ready; otherwise exits 1 with one line naming
/// each failure.
#[tokio::test]
async fn check_passes_on_a_healthy_install_and_names_each_failure() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::coordination::v1::Lease;
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cli-check").await;
    let home = TestNamespace::new(&client, "cli-check-op").await;
    let auth = json!({"universalAuth": {"credentialsRef": {"secretName": "creds"}, "secretsScope": scope()}});
    for name in ["good", "bad"] {
        apply_cr(
            &client,
            &ns.name,
            cr(
                name,
                "http://127.0.0.1:1/api",
                &format!("{name}-out"),
                auth.clone(),
            ),
        )
        .await;
    }
    set_ready(&client, &ns.name, "good", "True", "Synced").await;
    set_ready(&client, &ns.name, "bad", "False", "CredentialsNotFound").await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    for (shard, holder) in [("00", Some("op-0")), ("01", None)] {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": format!("rel-shard-{shard}")},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": now}
        }))
        .unwrap();
        Api::<Lease>::namespaced(client.clone(), &home.name)
            .create(&PostParams::default(), &lease)
            .await
            .unwrap();
    }
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "rel-controller-manager"},
        "spec": {
            "replicas": 2, "serviceName": "rel",
            "selector": {"matchLabels": {"app": "rel"}},
            "template": {"metadata": {"labels": {"app": "rel"}},
                         "spec": {"containers": [{"name": "c", "image": "x"}]}}
        }
    }))
    .unwrap();
    let sts_api = Api::<StatefulSet>::namespaced(client.clone(), &home.name);
    sts_api.create(&PostParams::default(), &sts).await.unwrap();
    // What the StatefulSet controller would report for two Ready pods.
    sts_api
        .patch_status(
            "rel-controller-manager",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2}}),
            ),
        )
        .await
        .unwrap();
    let check = |extra: &[&str]| {
        let mut cmd = Command::new(binary());
        cmd.env("KUBECONFIG", harness::kubeconfig()).args([
            "check",
            "--pod-namespace",
            &home.name,
            "--lease-prefix",
            "rel",
            "--statefulset",
            "rel-controller-manager",
            "-n",
            &ns.name,
        ]);
        cmd.args(extra);
        run(&mut cmd)
    };

    let (ok, out, err) = check(&["--replicas", "2", "--shards", "1", "good"]);
    assert!(ok, "check failed on a healthy install: {err}\n{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "ok    the CRDs of secrets.hanzo.ai/v1alpha1 are served",
            "ok    StatefulSet rel-controller-manager: 2 of 2 replicas Ready",
            "ok    1 shards held and renewed (Leases rel-shard-NN)",
            &format!("ok    KmsSecret {}/good is Ready", ns.name),
            "4 checks passed",
        ]
    );

    let (ok, out, _) = check(&[
        "--replicas",
        "3",
        "--shards",
        "2",
        "bad",
        "KmsPushSecret/none",
    ]);
    assert!(!ok, "check passed:\n{out}");
    let failed: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 4, "{out}");
    assert!(failed[0].ends_with("it runs 2 replicas where the release asks for 3 (scaled by hand? `helm upgrade` or `kubectl scale --replicas=3` restores them)"), "{out}");
    assert!(failed[1].ends_with("shard 1: no holder"), "{out}");
    assert!(
        failed[2].ends_with(
            "Ready is False (CredentialsNotFound): CredentialsNotFound: as set by the test"
        ),
        "{out}"
    );
    assert!(
        failed[3].starts_with(&format!(
            "FAIL  KmsPushSecret {}/none is Ready: not found",
            ns.name
        )),
        "{out}"
    );
    assert!(out.ends_with("4 of 5 checks failed\n"), "{out}");
}
