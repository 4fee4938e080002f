//! LDAP logins, legacy service tokens (their record, scope enforcement and
//! the routes that refuse them), identities scoped to some folders, the v4
//! secret list and the project lookup of newer servers.

use kms_devserver::{Running, SeedSource};
use serde_json::{Value, json};

use crate::common::{Client, start};

const SEED: &str = r#"
projects:
  - slug: demo
    environments: [dev, prod]
    secrets:
      dev:
        /: {ROOT: r, REF: "${dev.backend.API_KEY}"}
        /backend: {API_KEY: abc, LOCAL_REF: "<${dev.ROOT}>"}
        /backend/db: {DB_PASS: pw}
        /frontend: {UI: u}
      prod:
        /backend: {API_KEY: prod-abc}
    imports:
      dev:
        /: [{environment: dev, path: /backend}]
        /backend: [{environment: dev, path: /frontend}]
  - slug: other
    environments: [dev]
    secrets: {dev: {/: {X: x}}}
identities:
  - name: ldap-user
    ldapAuth: {username: alice, password: wonderland, accessTokenTTL: 600}
    projects: [demo]
  - name: backend-only
    universalAuth: {clientId: backend, clientSecret: backend-secret}
    projects: [{slug: demo, paths: ["/backend/**"]}, other]
  - name: op
    universalAuth: {clientId: op, clientSecret: op-secret}
    projects: [demo]
serviceTokens:
  - {token: st.fixed.s3cret.key, name: fixed, project: demo, environment: dev, path: /backend}
  - {token: st.globbed.s3cret.key, project: demo, environment: dev, path: "/backend/**", permissions: [read, write]}
"#;

async fn server() -> (Running, Client) {
    let server = start(SeedSource::Yaml(SEED.to_owned()), None).await;
    let c = Client::new(server.addr());
    (server, c)
}

fn id_of(server: &Running, kind: &str, name: &str) -> String {
    server
        .seeded()
        .iter()
        .find(|o| o.kind == kind && o.name == name)
        .map(|o| o.id.clone())
        .unwrap_or_else(|| panic!("seeded {kind} {name}"))
}

/// The keys of a list answer, sorted.
fn keys(list: &Value) -> Vec<String> {
    let mut keys: Vec<String> = list["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|s| s["secretKey"].as_str().expect("key").to_owned())
        .collect();
    keys.sort();
    keys
}

fn value_of(list: &Value, key: &str) -> Value {
    list["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .find(|s| s["secretKey"] == key)
        .map(|s| s["secretValue"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn ldap_logins() {
    let (server, c) = server().await;
    let identity = id_of(&server, "identity", "ldap-user");
    let login = |body: Value| {
        let c = c.clone();
        async move {
            c.json("POST", "/api/v1/auth/ldap-auth/login", None, &body)
                .await
        }
    };
    let ok =
        login(json!({"identityId": identity, "username": "alice", "password": "wonderland"})).await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let body = ok.json();
    assert_eq!(body["expiresIn"], 600);
    assert_eq!(body["accessTokenMaxTTL"], 2_592_000);
    assert_eq!(body["tokenType"], "Bearer");
    let token = body["accessToken"].as_str().expect("token");
    let list = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev",
            Some(token),
        )
        .await;
    assert_eq!(list.status, 200);

    let failed = json!({"statusCode": 401, "message": "LDAP authentication failed",
                        "error": "UnauthorizedError"});
    let wrong =
        login(json!({"identityId": identity, "username": "alice", "password": "queen"})).await;
    assert_eq!((wrong.status, wrong.json()), (401, failed.clone()));
    let wrong =
        login(json!({"identityId": identity, "username": "bob", "password": "wonderland"})).await;
    assert_eq!((wrong.status, wrong.json()), (401, failed));
    let op = id_of(&server, "identity", "op");
    let none =
        login(json!({"identityId": op, "username": "alice", "password": "wonderland"})).await;
    assert_eq!(none.status, 404);
    assert_eq!(
        none.json()["message"],
        "LDAP auth method not found for identity, did you configure LDAP auth?"
    );
    let missing = login(json!({"identityId": identity, "username": "alice"})).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["error"], "ValidationFailure");
    server.shutdown().await;
}

#[tokio::test]
async fn service_tokens_are_scoped_like_the_real_ones() {
    let (server, c) = server().await;
    let demo = id_of(&server, "project", "demo");
    let fixed = "st.fixed.s3cret";

    // The token's record, with its project in `workspace`; the full
    // four-part token works as well.
    let record = c.get("/api/v2/service-token", Some(fixed)).await;
    assert_eq!(
        record.status,
        200,
        "{}",
        String::from_utf8_lossy(&record.body)
    );
    let body = record.json();
    assert_eq!(body["workspace"], json!(demo));
    assert_eq!(body["projectId"], json!(demo));
    assert_eq!(body["_id"], "fixed");
    assert_eq!(body["name"], "fixed");
    assert_eq!(body["__v"], 0);
    assert_eq!(
        body["scopes"],
        json!([{"environment": "dev", "secretPath": "/backend"}])
    );
    assert_eq!(body["permissions"], json!(["read"]));
    assert!(body["user"]["_id"].is_string());
    assert!(
        !String::from_utf8_lossy(&record.body).contains("s3cret"),
        "the secret is not shown"
    );
    assert_eq!(
        c.get("/api/v2/service-token", Some("st.fixed.s3cret.key"))
            .await
            .status,
        200
    );

    // One folder, no glob: the scope's folder whatever the query names.
    for query in [
        "environment=prod&secretPath=/",
        "workspaceSlug=other&environment=dev",
        "",
    ] {
        let list = c
            .get(&format!("/api/v3/secrets/raw?{query}"), Some(fixed))
            .await;
        assert_eq!(
            list.status,
            200,
            "{query}: {}",
            String::from_utf8_lossy(&list.body)
        );
        assert_eq!(keys(&list.json()), ["API_KEY", "LOCAL_REF"], "{query}");
        assert_eq!(value_of(&list.json(), "API_KEY"), "abc");
    }
    let one = c
        .get(
            "/api/v3/secrets/raw/API_KEY?environment=prod&secretPath=/",
            Some(fixed),
        )
        .await;
    assert_eq!(one.json()["secret"]["secretValue"], "abc");
    let v4 = c.get("/api/v4/secrets", Some(fixed)).await;
    assert_eq!(v4.status, 200);
    assert_eq!(keys(&v4.json()), ["API_KEY", "LOCAL_REF"]);

    // A glob scope: the query picks the folder, which must be in scope.
    let globbed = "st.globbed.s3cret";
    let db = c
        .get(
            "/api/v3/secrets/raw?environment=dev&secretPath=/backend/db",
            Some(globbed),
        )
        .await;
    assert_eq!(keys(&db.json()), ["DB_PASS"]);
    let denied = json!({"statusCode": 403, "message": "You are not allowed to read on secrets",
                        "error": "PermissionDenied"});
    for query in [
        "environment=dev&secretPath=/",
        "environment=prod&secretPath=/backend",
    ] {
        let r = c
            .get(&format!("/api/v3/secrets/raw?{query}"), Some(globbed))
            .await;
        assert_eq!((r.status, r.json()), (403, denied.clone()), "{query}");
    }
    let recursive = c
        .get(
            "/api/v3/secrets/raw?environment=dev&secretPath=/&recursive=true",
            Some(globbed),
        )
        .await;
    assert_eq!(keys(&recursive.json()), ["API_KEY", "DB_PASS", "LOCAL_REF"]);
    let no_env = c.get("/api/v3/secrets/raw", Some(globbed)).await;
    assert_eq!(no_env.status, 400);

    // Writes need the write permission and a folder in scope.
    let write = |token: &'static str, path: &'static str| {
        let c = c.clone();
        async move {
            c.json(
                "POST",
                "/api/v3/secrets/raw/NEW_KEY",
                Some(token),
                &json!({"environment": "dev", "secretPath": path, "secretValue": "n"}),
            )
            .await
        }
    };
    let r = write("st.fixed.s3cret", "/backend").await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "You are not allowed to create on secrets"
    );
    assert_eq!(write("st.globbed.s3cret", "/backend/db").await.status, 200);
    assert_eq!(write("st.globbed.s3cret", "/").await.status, 403);

    // Refusals of the token itself.
    let bad = c.get("/api/v2/service-token", Some("st.fixed.wrong")).await;
    assert_eq!(
        (bad.status, bad.json()),
        (
            401,
            json!({"statusCode": 401, "message": "Invalid service token", "error": "UnauthorizedError"})
        )
    );
    let unknown = c.get("/api/v2/service-token", Some("st.nope.s3cret")).await;
    assert_eq!(unknown.status, 404);
    // Routes that do not take service tokens, and the reverse.
    let project = c.get("/api/v2/workspace/demo", Some(fixed)).await;
    assert_eq!(project.status, 403);
    assert_eq!(
        project.json()["error"],
        "/api/v2/workspace/demo Unauthorized Access"
    );
    let leases = c
        .get(
            "/api/v1/dynamic-secrets?projectSlug=demo&environmentSlug=dev&path=/",
            Some(fixed),
        )
        .await;
    assert_eq!(leases.status, 403);
    let op = c.login("op", "op-secret").await;
    let reverse = c.get("/api/v2/service-token", Some(&op)).await;
    assert_eq!(reverse.status, 403);
    server.shutdown().await;
}

#[tokio::test]
async fn path_scoped_identities_see_only_their_folders() {
    let (server, c) = server().await;
    let token = c.login("backend", "backend-secret").await;
    let list = |query: &str| {
        let c = c.clone();
        let token = token.clone();
        let path = format!("/api/v3/secrets/raw?workspaceSlug=demo&environment=dev&{query}");
        async move { c.get(&path, Some(&token)).await }
    };
    // Outside the scope: refused.
    let root = list("secretPath=/").await;
    assert_eq!(root.status, 403);
    assert_eq!(
        root.json(),
        json!({"statusCode": 403, "message": "You are not allowed to read on secrets",
               "error": "PermissionDenied"})
    );
    // Inside: served; imported secrets and references from outside are
    // left out.
    let backend =
        list("secretPath=/backend&include_imports=true&expandSecretReferences=true").await;
    assert_eq!(backend.status, 200);
    let body = backend.json();
    assert_eq!(keys(&body), ["API_KEY", "LOCAL_REF"]);
    assert_eq!(value_of(&body, "LOCAL_REF"), "<>");
    assert_eq!(body["imports"][0]["secretPath"], "/frontend");
    assert_eq!(body["imports"][0]["secrets"], json!([]));
    // Recursive from the root: only the folders in scope.
    let all = list("secretPath=/&recursive=true").await;
    assert_eq!(keys(&all.json()), ["API_KEY", "DB_PASS", "LOCAL_REF"]);
    // Environments are not restricted.
    let prod = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=demo&environment=prod&secretPath=/backend",
            Some(&token),
        )
        .await;
    assert_eq!(keys(&prod.json()), ["API_KEY"]);
    // Gets and writes.
    let get = |path: &str, key: &str| {
        let c = c.clone();
        let token = token.clone();
        let url = format!(
            "/api/v3/secrets/raw/{key}?workspaceSlug=demo&environment=dev&secretPath={path}"
        );
        async move { c.get(&url, Some(&token)).await }
    };
    assert_eq!(get("/", "ROOT").await.status, 403);
    assert_eq!(get("/backend/db", "DB_PASS").await.status, 200);
    let write = |method: &'static str, body: Value| {
        let c = c.clone();
        let token = token.clone();
        async move {
            c.json(method, "/api/v3/secrets/raw/ROOT", Some(&token), &body)
                .await
        }
    };
    let r = write(
        "PATCH",
        json!({"projectSlug": "demo", "environment": "dev", "secretPath": "/", "secretValue": "x"}),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "You are not allowed to edit on secrets"
    );
    let r = write(
        "POST",
        json!({"projectSlug": "demo", "environment": "dev", "secretPath": "/backend", "secretValue": "x"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let batch = c
        .json(
            "PATCH",
            "/api/v3/secrets/batch/raw",
            Some(&token),
            &json!({"projectSlug": "demo", "environment": "dev", "secretPath": "/backend",
                    "secrets": [{"secretKey": "API_KEY", "secretValue": "1"},
                                {"secretKey": "ROOT", "secretValue": "2", "secretPath": "/"}]}),
        )
        .await;
    assert_eq!(batch.status, 403);
    // A plain membership in another project is unrestricted.
    let other = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=other&environment=dev",
            Some(&token),
        )
        .await;
    assert_eq!(keys(&other.json()), ["X"]);
    server.shutdown().await;
}

#[tokio::test]
async fn v4_list_and_project_lookup_as_newer_servers() {
    let (server, c) = server().await;
    let token = c.login("op", "op-secret").await;
    let demo = id_of(&server, "project", "demo");

    // The project by slug, bare, as GET /api/v2/workspace/:slug.
    let v1 = c.get("/api/v1/projects/slug/demo", Some(&token)).await;
    assert_eq!(v1.status, 200);
    let v2 = c.get("/api/v2/workspace/demo", Some(&token)).await;
    assert_eq!(v1.json(), v2.json());
    assert_eq!(v1.json()["id"], json!(demo));
    assert_eq!(v1.json()["environments"][1]["slug"], "prod");
    assert_eq!(
        c.get("/api/v1/projects/slug/nope", Some(&token))
            .await
            .status,
        404
    );
    assert_eq!(
        c.get("/api/v1/projects/slug/other", Some(&token))
            .await
            .status,
        403
    );

    // v4: projectId only; imports and expanded references by default.
    let missing = json!({"statusCode": 400, "message": "Missing project id or environment",
                         "error": "BadRequest"});
    for query in [
        "environment=dev".to_owned(),
        "workspaceSlug=demo&environment=dev".to_owned(),
        format!("projectId={demo}"),
    ] {
        let r = c
            .get(&format!("/api/v4/secrets?{query}"), Some(&token))
            .await;
        assert_eq!((r.status, r.json()), (400, missing.clone()), "{query}");
    }
    let base = format!("/api/v4/secrets?projectId={demo}&environment=dev&secretPath=/");
    let v4 = c.get(&base, Some(&token)).await;
    assert_eq!(v4.status, 200);
    let body = v4.json();
    assert_eq!(keys(&body), ["REF", "ROOT"]);
    assert_eq!(value_of(&body, "REF"), "abc");
    assert_eq!(body["imports"][0]["secretPath"], "/backend");
    assert_eq!(value_of(&body["imports"][0], "LOCAL_REF"), "<r>");
    // The same items as v3 (field for field), with the flags spelled out.
    let v3 = c
        .get(
            &format!(
                "/api/v3/secrets/raw?workspaceId={demo}&environment=dev&secretPath=/\
                 &include_imports=true&expandSecretReferences=true"
            ),
            Some(&token),
        )
        .await;
    assert_eq!(v3.json(), body);
    // Both spellings turn imports off; references can be kept.
    for flag in ["includeImports=false", "include_imports=false"] {
        let r = c.get(&format!("{base}&{flag}"), Some(&token)).await;
        assert!(r.json().get("imports").is_none(), "{flag}");
    }
    let raw = c
        .get(
            &format!("{base}&expandSecretReferences=false"),
            Some(&token),
        )
        .await;
    assert_eq!(value_of(&raw.json(), "REF"), "${dev.backend.API_KEY}");
    let recursive = c
        .get(
            &format!("{base}&recursive=true&includeImports=false"),
            Some(&token),
        )
        .await;
    assert_eq!(
        keys(&recursive.json()),
        ["API_KEY", "DB_PASS", "LOCAL_REF", "REF", "ROOT", "UI"]
    );
    let bad = c
        .get(&format!("{base}&includeImports=yes"), Some(&token))
        .await;
    assert_eq!(bad.status, 401);
    assert_eq!(bad.json()["error"], "ValidationFailure");
    server.shutdown().await;
}
