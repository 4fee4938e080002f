//! Cloud auth end to end: AWS IAM (environment, web identity through a
//! stand-in STS, instance metadata), Azure managed identity, GCP ID token and
//! GCP IAM (key file) log in against the dev server's test mode and sync a
//! Secret. The clouds are loopback stand-ins serving metadata and STS
//! answers; JWTs are signed with a fixed test key the dev server knows.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace};
use crate::kms_secret::{apply_cr, expect, wait_condition, wait_data};
use crate::kms_secret_extras::{cr, scope};
use crate::support::{DevServer, Operator, TempDir, seed};

const TOKEN_CONDITION: &str = "secrets.hanzo.ai/LoadedKMSToken";
const AWS_ID: &str = "5b1c3d0e-0000-4000-8000-00000000c001";
const AZURE_ID: &str = "5b1c3d0e-0000-4000-8000-00000000c002";
const GCP_ID: &str = "5b1c3d0e-0000-4000-8000-00000000c003";
const ACCOUNT: &str = "111122223333";
const SERVICE_ACCOUNT: &str = "kms-sa@demo-project.iam.gserviceaccount.com";
const TENANT: &str = "tenant-1";
const PRINCIPAL: &str = "oid-operator";
const KEY_PEM: &str = include_str!("../../src/kms/cloud/testdata/rsa-test-key.pem");

/// Every variable the cloud sources read, removed from the operator's
/// environment unless a test sets it.
const CLOUD_ENV: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "KMS_OPERATOR_AWS_STS_ENDPOINT",
    "KMS_OPERATOR_AWS_IMDS_ENDPOINT",
    "KMS_OPERATOR_AZURE_IMDS_ENDPOINT",
    "KMS_OPERATOR_GCP_METADATA_ENDPOINT",
    "KMS_OPERATOR_KEY_FILE_DIR",
];

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The fixed RSA test key.
fn key_pair() -> Arc<ring::signature::RsaKeyPair> {
    let body: String = KEY_PEM
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    Arc::new(ring::signature::RsaKeyPair::from_pkcs8(&der).unwrap())
}

/// The JWK members (`n`, `e`) of the test key's public half.
fn jwk() -> (String, String) {
    let pair = key_pair();
    let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(pair.public());
    (b64url(&public.n), b64url(&public.e))
}

/// A JWT with `claims` (plus `iat`/`exp`) signed with the test key.
fn sign_jwt(pair: &ring::signature::RsaKeyPair, mut claims: Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    claims["iat"] = json!(now);
    claims["exp"] = json!(now + 600);
    let input = format!(
        "{}.{}",
        b64url(json!({"alg": "RS256", "typ": "JWT"}).to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let mut sig = vec![0; pair.public().modulus_len()];
    pair.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .unwrap();
    format!("{input}.{}", b64url(&sig))
}

/// A loopback HTTP server answering with `handler(method, uri, headers, body)`.
struct StandIn {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Handler = Arc<dyn Fn(&str, &str, &axum::http::HeaderMap, &str) -> (u16, String) + Send + Sync>;

impl StandIn {
    async fn start(
        handler: impl Fn(&str, &str, &axum::http::HeaderMap, &str) -> (u16, String)
        + Send
        + Sync
        + 'static,
    ) -> Self {
        let handler: Handler = Arc::new(handler);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let handler = handler.clone();
            async move {
                use axum::response::IntoResponse;
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20)
                    .await
                    .unwrap_or_default();
                let (status, text) = handler(
                    parts.method.as_str(),
                    &parts.uri.to_string(),
                    &parts.headers,
                    &String::from_utf8_lossy(&body),
                );
                let mut resp = text.into_response();
                *resp.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
                resp
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, task }
    }
}

fn query_param(uri: &str, name: &str) -> Option<String> {
    let query = uri.split_once('?')?.1;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// One stand-in for every cloud: AWS STS (web identity), AWS IMDSv2, Azure
/// IMDS and the GCP metadata server (they use different paths).
async fn clouds() -> StandIn {
    let pair = key_pair();
    StandIn::start(move |method, uri, headers, body| {
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
        let path = uri.split('?').next().unwrap_or_default();
        match (method, path) {
            // AWS STS: AssumeRoleWithWebIdentity for the projected token.
            ("POST", "/") => {
                if body.contains("Action=AssumeRoleWithWebIdentity")
                    && body.contains("WebIdentityToken=projected-sa-token")
                {
                    (200, "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAWEBIDENTITY</AccessKeyId><SecretAccessKey>web-secret</SecretAccessKey><SessionToken>web-session</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>".to_owned())
                } else {
                    (403, "<ErrorResponse><Error><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>".to_owned())
                }
            }
            // AWS IMDSv2.
            ("PUT", "/latest/api/token") => (200, "imds-session".to_owned()),
            ("GET", p) if p.starts_with("/latest/meta-data/iam/security-credentials/") => {
                if header("x-aws-ec2-metadata-token") != "imds-session" {
                    return (401, String::new());
                }
                if p.ends_with("/node-role") {
                    (200, r#"{"Code":"Success","AccessKeyId":"ASIAIMDS","SecretAccessKey":"imds-secret","Token":"imds-token","Expiration":"2099-01-01T00:00:00Z"}"#.to_owned())
                } else {
                    (200, "node-role".to_owned())
                }
            }
            // Azure IMDS.
            ("GET", "/metadata/identity/oauth2/token") => {
                if header("metadata") != "true" {
                    return (400, r#"{"error":"invalid_request","error_description":"Required metadata header not specified"}"#.to_owned());
                }
                let resource = query_param(uri, "resource").unwrap_or_default();
                let jwt = sign_jwt(
                    &pair,
                    json!({"aud": resource, "iss": format!("https://sts.windows.net/{TENANT}/"), "oid": PRINCIPAL}),
                );
                (200, json!({"access_token": jwt, "token_type": "Bearer", "expires_in": "3599"}).to_string())
            }
            // GCP metadata server.
            ("GET", "/computeMetadata/v1/instance/service-accounts/default/identity") => {
                if header("metadata-flavor") != "Google" {
                    return (403, "Missing Metadata-Flavor:Google header.".to_owned());
                }
                let audience = query_param(uri, "audience").unwrap_or_default();
                (200, sign_jwt(&pair, json!({"aud": audience, "email": SERVICE_ACCOUNT, "sub": "1234567890", "iss": "https://accounts.google.com"})))
            }
            _ => (404, String::new()),
        }
    })
    .await
}

/// The demo seed plus the cloud identities (test mode).
fn cloud_seed() -> String {
    let (n, e) = jwk();
    let mut s = seed(&[("DB_PASSWORD", "s3cret")]);
    let arn = |session: &str| format!("arn:aws:sts::{ACCOUNT}:assumed-role/kms/{session}");
    s.push_str(&format!(
        "  - name: aws\n    id: {AWS_ID}\n    awsAuth:\n      allowedPrincipalArns: ['arn:aws:sts::{ACCOUNT}:assumed-role/kms/*']\n      allowedAccountIds: ['{ACCOUNT}']\n      keys:\n\
         \x20       - {{accessKeyId: AKIAENVIRONMENT, secretAccessKey: env-secret, arn: '{}'}}\n\
         \x20       - {{accessKeyId: ASIAWEBIDENTITY, secretAccessKey: web-secret, arn: '{}'}}\n\
         \x20       - {{accessKeyId: ASIAIMDS, secretAccessKey: imds-secret, arn: '{}'}}\n\
         \x20   projects: [demo]\n\
         \x20 - name: azure\n    id: {AZURE_ID}\n    azureAuth: {{tenantId: {TENANT}, allowedServicePrincipalIds: [{PRINCIPAL}], jwks: [{{n: '{n}', e: '{e}'}}]}}\n    projects: [demo]\n\
         \x20 - name: gcp\n    id: {GCP_ID}\n    gcpAuth: {{allowedServiceAccounts: ['{SERVICE_ACCOUNT}'], jwks: [{{n: '{n}', e: '{e}'}}]}}\n    projects: [demo]\n",
        arn("env"),
        arn("web"),
        arn("imds"),
    ));
    s
}

fn aws() -> Value {
    json!({"awsIamAuth": {"identityId": AWS_ID, "secretsScope": scope()}})
}

/// An operator whose environment holds only `env` of the cloud variables,
/// trusting the loopback dev servers (`--allowed-kms-hosts=127.0.0.1`) for
/// the cloud methods.
async fn operator(ns: &str, flags: &[&str], env: &[(&str, &str)]) -> Operator {
    let mut flags = flags.to_vec();
    flags.push("--allowed-kms-hosts=127.0.0.1");
    operator_with(ns, &flags, env).await
}

/// [`operator`] without the allow list: only the global hostAPI is trusted.
/// Its namespace may use any cloud identity and key file.
async fn operator_with(ns: &str, flags: &[&str], env: &[(&str, &str)]) -> Operator {
    let rules = format!("- namespaces: [{ns}]\n  identityIds: [\"*\"]\n  keyFiles: [\"*\"]\n");
    operator_with_rules(&[ns], &rules, flags, env).await
}

/// An operator watching `namespaces` (the first is its own), with the
/// cloud identity rules `rules` (YAML) and only `env` of the cloud
/// variables.
async fn operator_with_rules(
    namespaces: &[&str],
    rules: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Operator {
    let dir = TempDir::new("cloud-identities");
    let file = dir.0.join("rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let rules_flag = format!("--cloud-identities={}", file.display());
    let mut flags = flags.to_vec();
    flags.push(&rules_flag);
    let mut vars: Vec<(&str, Option<&str>)> = CLOUD_ENV
        .iter()
        .filter(|n| !env.iter().any(|(k, _)| k == *n))
        .map(|n| (*n, None))
        .collect();
    vars.extend(env.iter().map(|(k, v)| (*k, Some(*v))));
    // Read at start: the file may go once the replica is ready.
    Operator::start_with_env(namespaces[0], namespaces, &flags, &vars).await
}

/// A tenant cannot borrow another team's cloud identity (an identity ID is
/// not a secret): only the namespaces the admin's rules allow may use an
/// identity; another namespace naming it gets `CloudIdentityNotAllowed`,
/// nothing is sent to the KMS for it, and its target is never written.
#[tokio::test]
async fn a_tenant_cannot_use_another_teams_cloud_identity() {
    let client = harness::client().await;
    let team = TestNamespace::new(&client, "cloud-team-b").await;
    let tenant = TestNamespace::new(&client, "cloud-tenant-a").await;
    let stranger = TestNamespace::new(&client, "cloud-stranger").await;
    let kms = DevServer::start(&cloud_seed()).await;
    let rules = format!(
        "- namespaces: [{}]\n  methods: [awsIamAuth]\n  identityIds: [{AWS_ID}]\n\
         - namespaces: [{}]\n  identityIds: [an-identity-of-team-a]\n",
        team.name, tenant.name
    );
    let _op = operator_with_rules(
        &[&team.name, &tenant.name, &stranger.name],
        &rules,
        &[
            "--aws-imds-endpoint=http://127.0.0.1:9",
            "--allowed-kms-hosts=127.0.0.1",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_REGION", "eu-west-1"),
        ],
    )
    .await;
    for ns in [&team.name, &tenant.name, &stranger.name] {
        apply_cr(&client, ns, cr("aws", &kms.api(), "aws-out", aws())).await;
    }
    expect_synced(&client, &team.name, "aws", "aws-out", "AWS_IAM").await;
    let logins = kms.count("POST /api/v1/auth/aws-auth/login", None).await;
    for ns in [&tenant.name, &stranger.name] {
        let (_, reason, message) = wait_condition(
            &client,
            ns,
            "aws",
            "Ready",
            "False",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(reason, "CloudIdentityNotAllowed", "{message}");
        assert!(message.contains(AWS_ID), "{message}");
        assert!(message.contains(ns.as_str()), "{message}");
        assert!(message.contains("--cloud-identities"), "{message}");
        let target =
            kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
                .get_opt("aws-out")
                .await
                .unwrap();
        assert!(target.is_none(), "{ns}: the target was written");
    }
    // The refused resources never logged in: the one login is team B's
    // (its token is shared, so none came after its sync either).
    assert_eq!(
        kms.count("POST /api/v1/auth/aws-auth/login", None).await,
        logins,
        "a refused resource logged in"
    );
}

async fn expect_synced(client: &kube::Client, ns: &str, name: &str, target: &str, strategy: &str) {
    wait_data(
        client,
        ns,
        target,
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
    // Set on a sync that logs in; if that status write lost a race the
    // next resync (30 s) sets it.
    let (_, _, message) = wait_condition(
        client,
        ns,
        name,
        TOKEN_CONDITION,
        "True",
        Duration::from_secs(45),
    )
    .await;
    assert!(message.contains(strategy), "{name}: {message}");
}

/// AWS by web identity (IRSA), Azure, GCP ID token and GCP IAM with one
/// operator; a key file outside `--key-file-dir` is refused.
#[tokio::test]
async fn cloud_methods_log_in_and_sync() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cloud-auth").await;
    let kms = DevServer::start(&cloud_seed()).await;
    let clouds = clouds().await;
    let dir = TempDir::new("cloud");
    let keys = dir.0.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let key_file = json!({
        "type": "service_account",
        "client_email": SERVICE_ACCOUNT,
        "private_key_id": "test-key",
        "private_key": KEY_PEM,
    });
    std::fs::write(keys.join("sa.json"), key_file.to_string()).unwrap();
    std::fs::write(dir.0.join("outside.json"), key_file.to_string()).unwrap();
    let token_file = dir.0.join("web-identity-token");
    std::fs::write(&token_file, "projected-sa-token\n").unwrap();

    let keys_flag = format!("--key-file-dir={}", keys.display());
    let sts_flag = format!("--aws-sts-endpoint={}", clouds.url);
    let azure_flag = format!("--azure-imds-endpoint={}", clouds.url);
    let gcp_flag = format!("--gcp-metadata-endpoint={}", clouds.url);
    let op = operator(
        &ns.name,
        &[&keys_flag, &sts_flag, &azure_flag, &gcp_flag],
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
            ("AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/kms"),
        ],
    )
    .await;

    apply_cr(&client, &ns.name, cr("aws", &kms.api(), "aws-out", aws())).await;
    apply_cr(
        &client,
        &ns.name,
        cr(
            "azure",
            &kms.api(),
            "azure-out",
            json!({"azureAuth": {"identityId": AZURE_ID, "secretsScope": scope()}}),
        ),
    )
    .await;
    apply_cr(
        &client,
        &ns.name,
        cr(
            "gcp-id",
            &kms.api(),
            "gcp-id-out",
            json!({"gcpIdTokenAuth": {"identityId": GCP_ID, "secretsScope": scope()}}),
        ),
    )
    .await;
    apply_cr(
        &client,
        &ns.name,
        cr(
            "gcp-iam",
            &kms.api(),
            "gcp-iam-out",
            json!({"gcpIamAuth": {"identityId": GCP_ID, "serviceAccountKeyFilePath": "sa.json", "secretsScope": scope()}}),
        ),
    )
    .await;
    apply_cr(
        &client,
        &ns.name,
        cr(
            "gcp-escape",
            &kms.api(),
            "gcp-escape-out",
            json!({"gcpIamAuth": {"identityId": GCP_ID, "serviceAccountKeyFilePath": "../outside.json", "secretsScope": scope()}}),
        ),
    )
    .await;
    // An Azure resource the identity does not accept: the KMS refuses.
    apply_cr(
        &client,
        &ns.name,
        cr(
            "azure-wrong",
            &kms.api(),
            "azure-wrong-out",
            json!({"azureAuth": {"identityId": AZURE_ID, "resource": "api://other", "secretsScope": scope()}}),
        ),
    )
    .await;

    expect_synced(&client, &ns.name, "aws", "aws-out", "AWS_IAM").await;
    expect_synced(&client, &ns.name, "azure", "azure-out", "AZURE").await;
    expect_synced(&client, &ns.name, "gcp-id", "gcp-id-out", "GCP_ID_TOKEN").await;
    expect_synced(&client, &ns.name, "gcp-iam", "gcp-iam-out", "GCP_IAM").await;
    for route in ["aws-auth", "azure-auth", "gcp-auth"] {
        let n = kms
            .count(&format!("POST /api/v1/auth/{route}/login"), Some("200"))
            .await;
        assert!(n >= 1, "{route}: {n} logins");
    }

    let (_, _, message) = wait_condition(
        &client,
        &ns.name,
        "gcp-escape",
        "Ready",
        "False",
        Duration::from_secs(30),
    )
    .await;
    assert!(message.contains("not under --key-file-dir"), "{message}");
    let (_, _, message) = wait_condition(
        &client,
        &ns.name,
        "azure-wrong",
        "Ready",
        "False",
        Duration::from_secs(30),
    )
    .await;
    assert!(message.contains("audience"), "{message}");
    assert!(!message.contains("eyJ"), "a token leaked: {message}");

    // No credential, token or signature in the operator's log.
    let log = op.output.text();
    for secret in [
        "projected-sa-token",
        "web-secret",
        "web-session",
        "PRIVATE KEY",
        "Signature=",
        "eyJ",
    ] {
        assert!(!log.contains(secret), "{secret} is in the operator log");
    }
}

/// AWS from environment variables, and from the instance metadata service.
#[tokio::test]
async fn aws_environment_and_instance_metadata() {
    let client = harness::client().await;
    let kms = DevServer::start(&cloud_seed()).await;
    let clouds = clouds().await;

    let ns_env = TestNamespace::new(&client, "cloud-aws-env").await;
    let _op_env = operator(
        &ns_env.name,
        &["--aws-imds-endpoint=http://127.0.0.1:9"],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_REGION", "eu-west-1"),
        ],
    )
    .await;
    let ns_imds = TestNamespace::new(&client, "cloud-aws-imds").await;
    let imds_flag = format!("--aws-imds-endpoint={}", clouds.url);
    let _op_imds = operator(&ns_imds.name, &[&imds_flag], &[]).await;

    apply_cr(
        &client,
        &ns_env.name,
        cr("aws", &kms.api(), "aws-out", aws()),
    )
    .await;
    apply_cr(
        &client,
        &ns_imds.name,
        cr("aws", &kms.api(), "aws-out", aws()),
    )
    .await;
    expect_synced(&client, &ns_env.name, "aws", "aws-out", "AWS_IAM").await;
    expect_synced(&client, &ns_imds.name, "aws", "aws-out", "AWS_IAM").await;
}

/// Without ambient AWS credentials the condition names every source tried.
#[tokio::test]
async fn missing_aws_credentials_name_the_sources_tried() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cloud-aws-none").await;
    let kms = DevServer::start(&cloud_seed()).await;
    // Nothing listens there.
    let imds = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let imds_flag = format!("--aws-imds-endpoint={imds}");
    let _op = operator(&ns.name, &[&imds_flag], &[]).await;
    apply_cr(&client, &ns.name, cr("aws", &kms.api(), "aws-out", aws())).await;
    let (_, _, message) = wait_condition(
        &client,
        &ns.name,
        "aws",
        "Ready",
        "False",
        Duration::from_secs(30),
    )
    .await;
    let want = format!(
        "no AWS credentials: tried environment (AWS_ACCESS_KEY_ID unset), web identity (AWS_WEB_IDENTITY_TOKEN_FILE unset), container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI unset), instance metadata at {imds} (connection refused)"
    );
    assert!(message.contains(&want), "{message}");
    assert!(message.contains("AWS_IAM_MACHINE_IDENTITY"), "{message}");
    assert_eq!(kms.count("POST /api/v1/auth/aws-auth/login", None).await, 0);
}

/// The methods that prove the operator's own cloud identity never reach a
/// host the admin did not trust: by default only the global hostAPI of
/// `kms-config`. A resource naming another host gets `UntrustedKMSHost` and
/// that host sees no request at all, while universal auth (credentials of
/// the resource's namespace) may still use any host.
#[tokio::test]
async fn cloud_identities_go_only_to_trusted_hosts() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cloud-trust").await;
    let kms = DevServer::start(&cloud_seed()).await;
    let attacker = DevServer::start(&cloud_seed()).await;
    let clouds = clouds().await;
    let global: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kms-config", "namespace": ns.name},
        "data": {"hostAPI": kms.api()}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &global)
        .await
        .unwrap();
    crate::kms_secret_extras::create_secret(
        &client,
        &ns.name,
        "kms-credentials",
        json!({"clientId": crate::support::CLIENT_ID, "clientSecret": crate::support::CLIENT_SECRET}),
    )
    .await;
    let gcp_flag = format!("--gcp-metadata-endpoint={}", clouds.url);
    let azure_flag = format!("--azure-imds-endpoint={}", clouds.url);
    let _op = operator_with(
        &ns.name,
        &[&gcp_flag, &azure_flag],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
        ],
    )
    .await;
    let gcp = json!({"gcpIdTokenAuth": {"identityId": GCP_ID, "secretsScope": scope()}});
    let azure = json!({"azureAuth": {"identityId": AZURE_ID, "resource": "api://attacker", "secretsScope": scope()}});
    let universal = json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}, "secretsScope": scope()}});
    // The global host, named or by default.
    apply_cr(
        &client,
        &ns.name,
        cr("named", &kms.api(), "named-out", gcp.clone()),
    )
    .await;
    let mut by_default = cr("default", &kms.api(), "default-out", gcp.clone());
    by_default["spec"]
        .as_object_mut()
        .unwrap()
        .remove("hostAPI");
    apply_cr(&client, &ns.name, by_default).await;
    // Another host.
    for (name, auth) in [("gcp", gcp.clone()), ("aws", aws()), ("azure", azure)] {
        apply_cr(
            &client,
            &ns.name,
            cr(
                &format!("{name}-elsewhere"),
                &attacker.api(),
                &format!("{name}-out"),
                auth,
            ),
        )
        .await;
    }
    apply_cr(
        &client,
        &ns.name,
        cr(
            "universal-elsewhere",
            &attacker.api(),
            "universal-out",
            universal,
        ),
    )
    .await;

    expect_synced(&client, &ns.name, "named", "named-out", "GCP_ID_TOKEN").await;
    expect_synced(&client, &ns.name, "default", "default-out", "GCP_ID_TOKEN").await;
    wait_data(
        &client,
        &ns.name,
        "universal-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
    let attacker_origin = attacker.url.clone();
    for (name, field) in [
        ("gcp", "gcpIdTokenAuth"),
        ("aws", "awsIamAuth"),
        ("azure", "azureAuth"),
    ] {
        let (_, reason, message) = wait_condition(
            &client,
            &ns.name,
            &format!("{name}-elsewhere"),
            "Ready",
            "False",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(reason, "UntrustedKMSHost", "{name}: {message}");
        assert!(message.starts_with(field), "{name}: {message}");
        assert!(message.contains(&attacker_origin), "{name}: {message}");
        assert!(message.contains("--allowed-kms-hosts"), "{name}: {message}");
        assert!(message.contains("no request was sent"), "{name}: {message}");
    }
    // The other host saw the universal-auth resource only: no cloud login,
    // no proof of the operator's identity.
    let stats = attacker.stats().await;
    let routes: Vec<&String> = stats.as_object().unwrap().keys().collect();
    assert!(
        routes.iter().all(|r| !r.contains("aws-auth")
            && !r.contains("azure-auth")
            && !r.contains("gcp-auth")),
        "the other host was sent a cloud login: {routes:?}"
    );
    assert!(
        attacker
            .count("POST /api/v1/auth/universal-auth/login", None)
            .await
            >= 1
    );
}
