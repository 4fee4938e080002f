//! Bad input gets the real server's status and body, never a panic: fixed
//! cases, then a property test throwing random methods, paths, queries,
//! headers and bodies at a running server, and one feeding random seeds
//! (YAML built from the seed's own vocabulary, and random text) to the seed
//! parser and, when they pass, to a server. Cases: `FUZZ_CASES` (256 by
//! default, as in CI; see docs/testing.md for a long run).

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::common::{Client, Resp, demo_seed, start};

fn is_envelope(resp: &Resp) -> Result<(), String> {
    let body: Value = serde_json::from_slice(&resp.body).map_err(|e| {
        format!(
            "{} not JSON ({e}): {:?}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        )
    })?;
    if resp.status < 400 {
        return Ok(());
    }
    let ok = body["statusCode"] == json!(resp.status)
        && (body["message"].is_string() || body["message"].is_array())
        && body["error"].is_string();
    if ok && resp.header("content-type").as_deref() == Some("application/json; charset=utf-8") {
        Ok(())
    } else {
        Err(format!(
            "{} without the error envelope: {body}",
            resp.status
        ))
    }
}

#[tokio::test]
async fn bad_input_gets_the_real_answers() {
    let server = start(demo_seed(), None).await;
    let c = Client::new(server.addr());
    let token = c.login("op-client", "op-secret").await;
    let auth = format!("Bearer {token}");
    let json_headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let create = "/api/v3/secrets/raw/NEW";

    let r = c
        .send(
            "POST",
            create,
            &json_headers,
            Some(b"{\"environment\": ".to_vec()),
        )
        .await;
    assert_eq!(r.status, 400);
    let body = r.json();
    assert_eq!(body["error"], "Bad Request");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("JSON")),
        "{body}"
    );

    let r = c
        .send("POST", create, &json_headers, Some(Vec::new()))
        .await;
    assert_eq!(
        r.json(),
        json!({"statusCode": 400, "code": "FST_ERR_CTP_EMPTY_JSON_BODY", "error": "Bad Request", "message": "Body cannot be empty when content-type is set to 'application/json'"})
    );

    let huge = format!("{{\"secretValue\": \"{}\"}}", "x".repeat(1024 * 1024));
    let r = c
        .send("POST", create, &json_headers, Some(huge.into_bytes()))
        .await;
    assert_eq!(
        r.json(),
        json!({"statusCode": 413, "code": "FST_ERR_CTP_BODY_TOO_LARGE", "error": "Payload Too Large", "message": "Request body is too large"})
    );

    let r = c
        .send(
            "POST",
            create,
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/xml"),
            ],
            Some(b"<a/>".to_vec()),
        )
        .await;
    assert_eq!(r.status, 415);

    let r = c
        .send("POST", create, &json_headers, Some(b"[1, 2]".to_vec()))
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["message"][0]["expected"], "object");

    let r = c
        .get(
            "/api/v3/secrets/raw?workspaceId=00000000-0000-0000-0000-000000000000&environment=dev",
            Some(&token),
        )
        .await;
    assert_eq!(r.status, 403);
    let r = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=nope&environment=dev",
            Some(&token),
        )
        .await;
    assert_eq!(
        r.json(),
        json!({"statusCode": 404, "message": "Project with slug 'nope' not found", "error": "NotFound"})
    );
    let r = c
        .get("/api/v3/secrets/raw?workspaceSlug=demo", Some(&token))
        .await;
    assert_eq!(r.status, 400);
    let r = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev&recursive=yes",
            Some(&token),
        )
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["message"][0]["code"], "invalid_enum_value");
    let r = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev",
            Some("a.b.c"),
        )
        .await;
    assert_eq!(
        r.json(),
        json!({"statusCode": 403, "message": "invalid token", "error": "TokenError"})
    );
    let r = c
        .send(
            "GET",
            "/api/v3/secrets/raw",
            &[("authorization", "Basic")],
            None,
        )
        .await;
    assert_eq!(r.status, 401);
    let r = c
        .get(
            "/api/v3/secrets/raw/?workspaceSlug=demo&environment=dev",
            Some(&token),
        )
        .await;
    assert_eq!(r.status, 200, "a trailing slash is ignored");
    let r = c.send("PUT", "/api/v3/secrets/raw", &[], None).await;
    assert_eq!(
        r.json(),
        json!({"message": "Route PUT:/api/v3/secrets/raw not found", "error": "Not Found", "statusCode": 404})
    );
    let r = c
        .get(
            "/api/v3/secrets/raw/%ff%fe?workspaceSlug=demo&environment=dev",
            Some(&token),
        )
        .await;
    assert!(r.status == 400 || r.status == 404, "{}", r.status);
    is_envelope(&r).expect("envelope");
    server.shutdown().await;
}

struct Fixture {
    rt: tokio::runtime::Runtime,
    client: Client,
    token: String,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (client, token) = rt.block_on(async {
            let server = start(demo_seed(), None).await;
            let client = Client::new(server.addr());
            let token = client.login("op-client", "op-secret").await;
            // The server lives as long as the test process.
            std::mem::forget(server);
            (client, token)
        });
        Fixture { rt, client, token }
    })
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("api".to_owned()),
        Just("v1".to_owned()),
        Just("v2".to_owned()),
        Just("v3".to_owned()),
        Just("secrets".to_owned()),
        Just("raw".to_owned()),
        Just("batch".to_owned()),
        Just("auth".to_owned()),
        Just("token".to_owned()),
        Just("renew".to_owned()),
        Just("workspace".to_owned()),
        Just("dynamic-secrets".to_owned()),
        Just("leases".to_owned()),
        Just("demo".to_owned()),
        Just("%2F".to_owned()),
        Just("%ff".to_owned()),
        "[A-Za-z0-9_.~-]{0,12}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let known = prop_oneof![
        Just("/api/v3/secrets/raw".to_owned()),
        Just("/api/v3/secrets/raw/DB_PASSWORD".to_owned()),
        Just("/api/v3/secrets/batch/raw".to_owned()),
        Just("/api/v1/auth/universal-auth/login".to_owned()),
        Just("/api/v1/auth/token/renew".to_owned()),
        Just("/api/v1/auth/token/revoke".to_owned()),
        Just("/api/v1/auth/kubernetes-auth/login".to_owned()),
        Just("/api/v2/workspace/demo".to_owned()),
        Just("/api/v1/dynamic-secrets".to_owned()),
        Just("/api/v1/dynamic-secrets/leases".to_owned()),
        Just("/api/v1/dynamic-secrets/leases/x/renew".to_owned()),
        Just("/api/v1/folders".to_owned()),
    ];
    let random = prop::collection::vec(segment(), 0..6).prop_map(|s| format!("/{}", s.join("/")));
    let query = prop::collection::vec(
        (
            prop_oneof![
                Just("workspaceSlug"),
                Just("workspaceId"),
                Just("environment"),
                Just("secretPath"),
                Just("recursive"),
                Just("include_imports"),
                Just("expandSecretReferences"),
                Just("projectSlug"),
                Just("environmentSlug"),
                Just("path"),
                Just("x"),
            ],
            prop_oneof![
                Just("demo".to_owned()),
                Just("dev".to_owned()),
                Just("true".to_owned()),
                Just("%2F".to_owned()),
                "[A-Za-z0-9%+/=.-]{0,10}",
            ],
        ),
        0..5,
    )
    .prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    });
    (prop_oneof![known, random], query)
        .prop_map(|(p, q)| if q.is_empty() { p } else { format!("{p}?{q}") })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        Just(json!("demo")),
        Just(json!("dev")),
        Just(json!("/")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("secretValue".to_owned()),
                    Just("secretKey".to_owned()),
                    Just("environment".to_owned()),
                    Just("projectSlug".to_owned()),
                    Just("workspaceId".to_owned()),
                    Just("secrets".to_owned()),
                    Just("accessToken".to_owned()),
                    Just("clientId".to_owned()),
                    Just("clientSecret".to_owned()),
                    Just("ttl".to_owned()),
                    Just("dynamicSecretName".to_owned()),
                    Just("environmentSlug".to_owned()),
                    ".{0,6}",
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Option<(Option<&'static str>, Vec<u8>)>> {
    prop_oneof![
        Just(None),
        json_value().prop_map(|v| Some((
            Some("application/json"),
            serde_json::to_vec(&v).unwrap_or_default()
        ))),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| Some((Some("application/json"), b))),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(|b| Some((None, b))),
        ".{0,32}".prop_map(|s| Some((Some("text/plain"), s.into_bytes()))),
    ]
}

fn method() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("PATCH"),
        Just("DELETE"),
        Just("PUT"),
        Just("HEAD")
    ]
}

fn auth() -> impl Strategy<Value = u8> {
    0u8..4
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// A seed: YAML in the seed's vocabulary (keys and values it knows, nested
/// at random), or random text.
fn seed_text() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        prop::sample::select(vec![
            "projects",
            "slug",
            "name",
            "environments",
            "secrets",
            "imports",
            "dynamicSecrets",
            "identities",
            "universalAuth",
            "kubernetesAuth",
            "ldapAuth",
            "awsAuth",
            "azureAuth",
            "gcpAuth",
            "clientId",
            "clientSecret",
            "accessTokenTTL",
            "accessTokenMaxTTL",
            "allowedAudience",
            "allowedNamespaces",
            "projects",
            "paths",
            "serviceTokens",
            "token",
            "project",
            "environment",
            "path",
            "permissions",
            "defaultTTL",
            "maxTTL",
            "demo",
            "dev",
            "/",
            "/a/**",
            "1h",
            "30s",
            "-1",
            "0",
            "read",
            "write",
            "''",
            "~",
            "[]",
            "{}",
        ])
        .prop_map(str::to_owned),
        "[a-zA-Z0-9/*._-]{0,8}",
    ];
    let yaml = prop::collection::vec(
        (
            0usize..4,
            word.clone(),
            prop::option::of(word),
            any::<bool>(),
        ),
        0..24,
    )
    .prop_map(|lines| {
        lines
            .into_iter()
            .map(|(depth, key, value, item)| {
                let indent = "  ".repeat(depth);
                let dash = if item { "- " } else { "" };
                match value {
                    Some(v) => format!("{indent}{dash}{key}: {v}"),
                    None => format!("{indent}{dash}{key}:"),
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    prop_oneof![yaml, ".{0,64}"]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_seeds_are_refused_or_served_never_panic(text in seed_text()) {
        match kms_devserver::Seed::from_yaml(&text) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(seed) => {
                // An accepted seed starts a server that answers.
                let f = fixture();
                let config = kms_devserver::Config {
                    addr: "127.0.0.1:0".parse().unwrap(),
                    seed: Some(kms_devserver::SeedSource::Yaml(text.clone())),
                    ..kms_devserver::Config::default()
                };
                let started = f.rt.block_on(kms_devserver::start(config));
                if let Ok(server) = started {
                    let client = Client::new(server.addr());
                    let alive = f.rt.block_on(client.try_send("GET", "/api/status", &[], None));
                    prop_assert!(alive.is_ok_and(|r| r.status == 200));
                    f.rt.block_on(server.shutdown());
                }
                let _ = seed;
            }
        }
    }

    #[test]
    fn random_requests_get_json_answers(method in method(), path in path(), body in body(), auth in auth()) {
        let f = fixture();
        let bearer = format!("Bearer {}", f.token);
        let mut headers: Vec<(&str, &str)> = Vec::new();
        match auth {
            1 => headers.push(("authorization", bearer.as_str())),
            2 => headers.push(("authorization", "Bearer not.a.jwt")),
            3 => headers.push(("authorization", "x")),
            _ => {}
        }
        let bytes = body.map(|(ct, b)| {
            if let Some(ct) = ct {
                headers.push(("content-type", ct));
            }
            b
        });
        let result = f.rt.block_on(f.client.try_send(method, &path, &headers, bytes));
        let resp = result.map_err(|e| TestCaseError::fail(format!("{method} {path}: no answer: {e}")))?;
        prop_assert!((200..600).contains(&resp.status));
        if method != "HEAD" {
            is_envelope(&resp).map_err(|e| TestCaseError::fail(format!("{method} {path}: {e}")))?;
        }
        let alive = f.rt.block_on(f.client.try_send("GET", "/api/status", &[], None));
        prop_assert!(alive.is_ok_and(|r| r.status == 200));
    }
}
