//! Kubernetes auth against a real API server: service-account tokens made
//! with TokenRequest are reviewed by the cluster of the kubeconfig, then
//! checked against the identity's namespaces, names and audience.
//!
//! The control plane is the one of `KUBECONFIG` when it is set; otherwise
//! `tests/testenv/testenv up` starts (or resumes) the local one under
//! `target/testenv`, as the operator's integration tests do. Without a
//! control plane these tests fail and say how to get one.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kms_devserver::{Config, SeedSource};
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::common::{Client as HttpClient, config, start_config, unique};

/// The repository root.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn find_kubeconfig() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let dir = repo().join("target").join("testenv");
    let out = Command::new(repo().join("tests/testenv/testenv"))
        .arg("up")
        .arg(&dir)
        .output()
        .map_err(|e| format!("running tests/testenv/testenv: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "tests/testenv/testenv up {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir.join("kubeconfig"))
}

/// The kubeconfig of the test control plane (found once per test binary).
fn kubeconfig() -> PathBuf {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match FOUND.get_or_init(find_kubeconfig) {
        Ok(path) => path.clone(),
        Err(e) => panic!(
            "the Kubernetes-auth tests need a control plane and none is available: {e}\n\
             Set KUBECONFIG to a cluster whose API server serves TokenRequest and \
             TokenReview, or let tests/testenv/testenv build and start the local \
             one (etcd + kube-apiserver, built from Go modules; see tests/testenv)."
        ),
    }
}

async fn kube_client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let path = kubeconfig();
    let unusable = |e: String| -> ! {
        panic!(
            "the kubeconfig of the Kubernetes-auth tests ({}) cannot be used: {e}\n\
             Point KUBECONFIG at a reachable cluster, or unset it to use tests/testenv.",
            path.display()
        )
    };
    let kc = Kubeconfig::read_from(&path).unwrap_or_else(|e| unusable(e.to_string()));
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| unusable(e.to_string()));
    Client::try_from(config).unwrap_or_else(|e| unusable(e.to_string()))
}

/// Namespaces with service accounts, deleted at the end.
struct Fixture {
    client: Client,
    namespaces: Vec<String>,
}

impl Fixture {
    async fn namespace(&mut self, name: &str, accounts: &[&str]) {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
        self.namespaces.push(name.to_owned());
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        for account in accounts {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some((*account).to_owned()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            };
            api.create(&PostParams::default(), &sa)
                .await
                .expect("service account");
        }
    }

    /// A token of a service account (TokenRequest), for `audience` or the
    /// API server's default audience.
    async fn token(&self, namespace: &str, account: &str, audience: Option<&str>) -> String {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: audience.map(|a| vec![a.to_owned()]),
                expiration_seconds: Some(600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        api.create_token_request(account, &PostParams::default(), &request)
            .await
            .expect("token request")
            .status
            .and_then(|s| s.token)
            .expect("a token")
    }

    async fn cleanup(self) {
        let api = Api::<Namespace>::all(self.client.clone());
        for ns in &self.namespaces {
            let _ = api.delete(ns, &DeleteParams::default()).await;
        }
    }
}

fn seed(ns: &str, prefix: &str) -> String {
    format!(
        r#"
projects:
  - slug: demo
    environments: [dev]
    secrets: {{dev: {{/: {{KEY: value}}}}}}
identities:
  - name: k8s
    kubernetesAuth:
      allowedNamespaces: [{ns}]
      allowedNames: [app]
      allowedAudience: kms-dev
      accessTokenTTL: 300
      accessTokenMaxTTL: 900
    projects: [demo]
  - name: any-app
    kubernetesAuth: {{allowedNamespaces: ["{prefix}-*"], allowedNames: "app, worker"}}
    projects: [demo]
  - name: empty-audience
    kubernetesAuth: {{allowedNamespaces: ["{prefix}-*"], allowedAudience: ""}}
    projects: [demo]
  - name: plain
    universalAuth: {{clientSecret: s}}
    projects: [demo]
"#
    )
}

fn identity(server: &kms_devserver::Running, name: &str) -> String {
    server
        .seeded()
        .iter()
        .find(|o| o.kind == "identity" && o.name == name)
        .map(|o| o.id.clone())
        .expect("seeded identity")
}

async fn login(c: &HttpClient, identity: &str, jwt: &str) -> (u16, Value) {
    let r = c
        .json(
            "POST",
            "/api/v1/auth/kubernetes-auth/login",
            None,
            &json!({"identityId": identity, "jwt": jwt}),
        )
        .await;
    (r.status, r.json())
}

#[tokio::test]
async fn logins_are_reviewed_by_the_cluster_and_checked() {
    let client = kube_client().await;
    let prefix = format!("kmsdev-{}", unique());
    let allowed = format!("{prefix}-a");
    let elsewhere = format!("{prefix}-b");
    let mut fx = Fixture {
        client,
        namespaces: Vec::new(),
    };
    fx.namespace(&allowed, &["app", "other"]).await;
    fx.namespace(&elsewhere, &["app"]).await;
    let good = fx.token(&allowed, "app", Some("kms-dev")).await;
    let wrong_name = fx.token(&allowed, "other", Some("kms-dev")).await;
    let wrong_namespace = fx.token(&elsewhere, "app", Some("kms-dev")).await;
    let wrong_audience = fx.token(&allowed, "app", Some("someone-else")).await;
    let default_audience = fx.token(&elsewhere, "app", None).await;
    let other_default_audience = fx.token(&allowed, "other", None).await;

    let server = start_config(Config {
        kubeconfig: Some(kubeconfig()),
        ..config(SeedSource::Yaml(seed(&allowed, &prefix)))
    })
    .await;
    let c = HttpClient::new(server.addr());
    let k8s = identity(&server, "k8s");

    // A token of the allowed service account, for the allowed audience.
    let (status, body) = login(&c, &k8s, &good).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["expiresIn"], 300);
    assert_eq!(body["accessTokenMaxTTL"], 900);
    assert_eq!(body["tokenType"], "Bearer");
    let token = body["accessToken"].as_str().expect("token");
    let list = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev",
            Some(token),
        )
        .await;
    assert_eq!(list.status, 200);
    assert_eq!(list.json()["secrets"][0]["secretKey"], "KEY");

    // Refusals, in the real server's words.
    let denied = |message: &str| json!({"statusCode": 401, "message": message, "error": "UnauthorizedError"});
    assert_eq!(
        login(&c, &k8s, &wrong_namespace).await,
        (401, denied("Access denied: K8s namespace not allowed."))
    );
    assert_eq!(
        login(&c, &k8s, &wrong_name).await,
        (401, denied("Access denied: K8s name not allowed."))
    );
    for (what, jwt) in [
        ("another audience", wrong_audience.as_str()),
        ("the default audience", default_audience.as_str()),
        ("a garbage JWT", "garbage-not-a-jwt"),
    ] {
        let (status, body) = login(&c, &k8s, jwt).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(
            body["error"], "KubernetesTokenReviewError",
            "{what}: {body}"
        );
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {body}"
        );
    }

    // Globs, a comma list and no audience: any app of the prefix.
    let any = identity(&server, "any-app");
    let (status, body) = login(&c, &any, &default_audience).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        login(&c, &any, &other_default_audience).await,
        (401, denied("Access denied: K8s name not allowed."))
    );

    // An empty allowedAudience is no audience check, as in the real API:
    // the seed is accepted and a token the cluster accepts logs in.
    let empty = identity(&server, "empty-audience");
    for jwt in [&default_audience, &other_default_audience] {
        let (status, body) = login(&c, &empty, jwt).await;
        assert_eq!(status, 200, "{body}");
    }

    // An identity without Kubernetes auth: the recorded 404, JWT unread.
    let plain = identity(&server, "plain");
    assert_eq!(
        login(&c, &plain, "garbage-not-a-jwt").await,
        (
            404,
            json!({"statusCode": 404, "message":
                "Kubernetes auth method not found for identity, did you configure Kubernetes auth?",
                "error": "NotFound"})
        )
    );
    server.shutdown().await;

    // Without a kubeconfig there is no cluster to ask.
    let server = start_config(config(SeedSource::Yaml(seed(&allowed, &prefix)))).await;
    let c = HttpClient::new(server.addr());
    let (status, body) = login(&c, &identity(&server, "k8s"), &good).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("no cluster") && m.contains("--kubeconfig")),
        "{body}"
    );
    server.shutdown().await;
    fx.cleanup().await;
}

#[tokio::test]
async fn an_unreadable_kubeconfig_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, "not: [a kubeconfig").expect("write");
    let err = kms_devserver::start(Config {
        kubeconfig: Some(path),
        ..config(SeedSource::Yaml(String::new()))
    })
    .await
    .expect_err("refused")
    .to_string();
    assert!(err.starts_with("kubeconfig "), "{err}");
}
