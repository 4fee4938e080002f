//! The ten most common first-hour mistakes, each as a new user makes it:
//! every one ends in `Ready=False` with a reason and a message that names
//! the cause and the fix, the same message in a Warning Event, and no data
//! touched (no target created, an existing one left as it was). The CRDs
//! missing is the tenth: the operator says which in its log and on
//! `/readyz`. docs/troubleshooting.md quotes each message.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, wait_for};
use crate::kms_secret::{apply_cr, data_of, wait_condition};
use crate::kms_secret_extras::{cr, create_secret};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator};

fn seed() -> String {
    format!(
        r#"projects:
  - slug: demo
    environments: [dev]
    secrets:
      dev:
        /:
          DB_PASSWORD: s3cret
        /backend:
          API_KEY: abc
identities:
  - name: operator
    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}
    projects: [demo]
"#
    )
}

fn universal(secret: &str, secret_ns: Option<&str>, project: &str, env: &str, path: &str) -> Value {
    let mut reference = json!({"secretName": secret});
    if let Some(ns) = secret_ns {
        reference["secretNamespace"] = json!(ns);
    }
    json!({"universalAuth": {"credentialsRef": reference,
        "secretsScope": {"projectSlug": project, "envSlug": env, "secretsPath": path}}})
}

/// One mistake: the resource's name, its spec, and what the user must read.
struct Mistake {
    name: &'static str,
    resource: Value,
    reason: &'static str,
    /// Phrases of the message: the cause and the fix.
    says: Vec<String>,
}

#[tokio::test]
async fn the_first_hour_mistakes_explain_themselves_and_touch_nothing() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "mistakes").await;
    let elsewhere = TestNamespace::new(&client, "mistakes-other").await;
    let kms = DevServer::start_with(&seed(), &["--missing-folders-not-found"]).await;
    let good = json!({"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET});
    create_secret(&client, &ns.name, "kms-credentials", good.clone()).await;
    create_secret(&client, &elsewhere.name, "kms-credentials", good).await;
    create_secret(
        &client,
        &ns.name,
        "typo-credentials",
        json!({"clientId": CLIENT_ID, "clientSecret": "not-the-secret"}),
    )
    .await;
    // A Secret someone else made, that a resource names as its target.
    create_secret(&client, &ns.name, "taken", json!({"OWNER": "someone else"})).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;

    let api = kms.api();
    let at = |name: &'static str, target: &str, auth: Value| cr(name, &api, target, auth);
    let ok = |p: &str| universal("kms-credentials", None, "demo", "dev", p);
    let mut template = at("template-typo", "template-typo-out", ok("/"));
    template["spec"]["managedKubeSecretReferences"][0]["template"] =
        json!({"data": {"DSN": "postgres://app:{{ .DB_PASSWORD.Value | upperr }}@db/app"}});
    let mut scheme = at("scheme-typo", "scheme-typo-out", ok("/"));
    scheme["spec"]["hostAPI"] = json!(api.replacen("http://", "htp://", 1));
    let mut unreachable = at("unreachable", "unreachable-out", ok("/"));
    unreachable["spec"]["hostAPI"] = json!("http://127.0.0.1:1/api");
    let ns_name = ns.name.clone();
    let mistakes = vec![
        Mistake {
            name: "wrong-secret",
            resource: at(
                "wrong-secret",
                "wrong-secret-out",
                universal("typo-credentials", None, "demo", "dev", "/"),
            ),
            reason: "AuthenticationFailed",
            says: vec![
                format!("Secret {ns_name}/typo-credentials"),
                "clientId and clientSecret".into(),
            ],
        },
        Mistake {
            name: "no-credentials",
            resource: at(
                "no-credentials",
                "no-credentials-out",
                universal("kms-creds", None, "demo", "dev", "/"),
            ),
            reason: "CredentialsNotFound",
            says: vec![
                format!("{ns_name}/kms-creds not found"),
                "create it with the keys clientId and clientSecret".into(),
            ],
        },
        Mistake {
            name: "credentials-elsewhere",
            resource: at(
                "credentials-elsewhere",
                "credentials-elsewhere-out",
                universal("kms-credentials", Some(&elsewhere.name), "demo", "dev", "/"),
            ),
            reason: "CrossNamespaceRefDenied",
            says: vec![
                format!("points to namespace {}", elsewhere.name),
                "--allow-cross-namespace-refs".into(),
            ],
        },
        Mistake {
            name: "wrong-project",
            resource: at(
                "wrong-project",
                "wrong-project-out",
                universal("kms-credentials", None, "dmeo", "dev", "/"),
            ),
            reason: "ProjectNotFound",
            says: vec!["project dmeo".into(), "projectSlug".into()],
        },
        Mistake {
            name: "wrong-env",
            resource: at(
                "wrong-env",
                "wrong-env-out",
                universal("kms-credentials", None, "demo", "prod", "/"),
            ),
            reason: "EnvironmentNotFound",
            says: vec!["environment prod does not exist".into(), "envSlug".into()],
        },
        Mistake {
            name: "folder-typo",
            resource: at("folder-typo", "folder-typo-out", ok("/bakend")),
            reason: "FolderNotFound",
            says: vec!["/bakend".into(), "secretsPath".into()],
        },
        Mistake {
            name: "unreachable",
            resource: unreachable,
            reason: "KMSUnreachable",
            says: vec![
                "cannot reach the KMS at http://127.0.0.1:1".into(),
                "spec.hostAPI".into(),
            ],
        },
        Mistake {
            name: "scheme-typo",
            resource: scheme,
            reason: "InvalidHost",
            says: vec!["htp://".into(), "http:// or https://".into()],
        },
        Mistake {
            name: "template-typo",
            resource: template,
            reason: "TemplateError",
            says: vec!["line 1".into(), "column".into(), "upperr".into()],
        },
        Mistake {
            name: "taken",
            resource: at("taken", "taken", ok("/")),
            reason: "TargetNotManaged",
            says: vec![
                format!("Secret {ns_name}/taken exists and was not created by kms-operator"),
                "secrets.hanzo.ai/adopt=true".into(),
            ],
        },
    ];
    for m in &mistakes {
        apply_cr(&client, &ns.name, m.resource.clone()).await;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for m in &mistakes {
        let (_, reason, message) = wait_condition(
            &client,
            &ns.name,
            m.name,
            "Ready",
            "False",
            Duration::from_secs(60),
        )
        .await;
        let missing: Vec<&String> = m
            .says
            .iter()
            .filter(|p| !message.contains(p.as_str()))
            .collect();
        if reason != m.reason || !missing.is_empty() {
            wrong.push(format!(
                "{}: {reason}: {message}\n  wanted {} saying {missing:?}",
                m.name, m.reason
            ));
            continue;
        }
        // The same words in a Warning Event.
        let event = wait_for(Duration::from_secs(20), || async {
            harness::events_of(&client, &ns.name, m.name)
                .await
                .into_iter()
                .find(|(r, note)| r == m.reason && note == &message)
        })
        .await;
        if event.is_none() {
            let events = harness::events_of(&client, &ns.name, m.name).await;
            wrong.push(format!(
                "{}: no {} Event with the message: {events:#?}",
                m.name, m.reason
            ));
        }
        println!("{:<22} {reason}: {message}", m.name);
        seen.push((m, message));
    }
    assert!(
        wrong.is_empty(),
        "mistakes that do not explain themselves:\n{}",
        wrong.join("\n")
    );
    // docs/troubleshooting.md quotes each message: its reason, and its
    // words other than this run's namespaces and addresses.
    let page = std::fs::read_to_string(harness::repo().join("docs/troubleshooting.md")).unwrap();
    for (m, message) in &seen {
        assert!(
            page.contains(&format!("{}: ", m.reason)),
            "{}: {} is not quoted",
            m.name,
            m.reason
        );
        let words = message
            .split([';', ':', '(', ')'])
            .map(str::trim)
            .filter(|w| {
                w.len() > 12
                    && !w.contains(&ns_name)
                    && !w.contains("127.0.0.1")
                    && !w.contains("mistakes")
            });
        for w in words {
            assert!(
                page.contains(w),
                "docs/troubleshooting.md does not quote {}: {w:?}",
                m.name
            );
        }
    }
    // Nothing written: no target created, the taken Secret as it was.
    for m in mistakes.iter().filter(|m| m.name != "taken") {
        let target = format!("{}-out", m.name);
        assert!(
            secrets.get_opt(&target).await.unwrap().is_none(),
            "{}: the target {target} was created",
            m.name
        );
    }
    let taken = secrets.get("taken").await.unwrap();
    assert_eq!(
        data_of(&taken),
        [("OWNER".to_owned(), "someone else".to_owned())].into(),
        "the taken Secret was changed"
    );
}

/// The tenth mistake: the CRDs are not installed. The operator does not
/// exit: it says which CRDs are missing in its log and on `/readyz` (a
/// `503` whose body names them), and starts once they are applied.
#[tokio::test]
async fn without_the_crds_the_operator_waits_and_says_which() {
    let plane = crate::handover::ControlPlane::up();
    let kubeconfig = plane.kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap();
    let mut op = crate::support::Operator::spawn(
        "default",
        &["default"],
        &[],
        &[("KUBECONFIG", Some(kubeconfig))],
    );
    let missing = "the CRDs of kmssecrets.secrets.hanzo.ai, kmspushsecrets.secrets.hanzo.ai, \
                   kmsdynamicsecrets.secrets.hanzo.ai are not installed";
    let http = reqwest::Client::new();
    let readyz = || async {
        for addr in op.served() {
            if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await {
                return Some((r.status().as_u16(), r.text().await.unwrap_or_default()));
            }
        }
        None
    };
    let said = wait_for(Duration::from_secs(30), || async {
        readyz()
            .await
            .filter(|(code, body)| *code == 503 && body.contains(missing))
    })
    .await;
    assert!(
        said.is_some(),
        "/readyz does not name the missing CRDs: {:?}\n{}",
        readyz().await,
        op.output.text()
    );
    assert!(op.output.text().contains(missing), "{}", op.output.text());
    assert!(op.pid().is_some(), "the operator exited");
    // Installed, the operator starts without a restart.
    let crds = std::process::Command::new(crate::support::binary())
        .arg("crds")
        .output()
        .expect("kms-operator crds");
    let mut apply = std::process::Command::new(crate::helm::kubectl_binary())
        .args(["apply", "--server-side", "-f", "-"])
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("kubectl apply");
    {
        use std::io::Write as _;
        apply.stdin.take().unwrap().write_all(&crds.stdout).unwrap();
    }
    assert!(apply.wait().unwrap().success(), "kubectl apply of the CRDs");
    op.ready().await;
    op.stop();
}
