//! The operator's flow against the example seed: log in, list with and
//! without `If-None-Match`, update, lease a dynamic secret, read the
//! counters; and the lifecycle of tokens and leases.

use std::collections::BTreeSet;
use std::time::Duration;

use kms_devserver::SeedSource;
use serde_json::{Value, json};

use crate::common::{Client, demo_seed, iso_ms, start, start_with};

const LIST: &str = "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev&secretPath=%2F";

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn login_list_update_lease_and_count() {
    let server = start(demo_seed(), None).await;
    let c = Client::new(server.addr());
    let token = c.login("op-client", "op-secret").await;

    // List, then list again with the ETag: 304.
    let first = c.get(LIST, Some(&token)).await;
    assert_eq!(first.status, 200);
    let etag = first.header("etag").expect("etag");
    let body = first.json();
    let names: BTreeSet<String> = body["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|s| s["secretKey"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, set(&["DB_PASSWORD", "LOG_LEVEL"]));
    let auth = format!("Bearer {token}");
    let again = c
        .send(
            "GET",
            LIST,
            &[("authorization", &auth), ("if-none-match", &etag)],
            None,
        )
        .await;
    assert_eq!(again.status, 304);
    assert!(again.body.is_empty());
    assert_eq!(again.header("etag").as_deref(), Some(etag.as_str()));

    // Update: version + 1, and the list changes its ETag.
    let before = body["secrets"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["secretKey"] == "DB_PASSWORD"))
        .cloned()
        .expect("DB_PASSWORD");
    let updated = c
        .json(
            "PATCH",
            "/api/v3/secrets/raw/DB_PASSWORD",
            Some(&token),
            &json!({"projectSlug": "demo", "environment": "dev", "secretPath": "/", "secretValue": "n3w", "unknownField": 1}),
        )
        .await;
    assert_eq!(
        updated.status,
        200,
        "{}",
        String::from_utf8_lossy(&updated.body)
    );
    let secret = &updated.json()["secret"];
    assert_eq!(
        secret["version"],
        before["version"].as_u64().expect("version") + 1
    );
    assert_eq!(secret["id"], before["id"]);
    assert_eq!(secret["secretValue"], "n3w");
    let changed = c
        .send(
            "GET",
            LIST,
            &[("authorization", &auth), ("if-none-match", &etag)],
            None,
        )
        .await;
    assert_eq!(changed.status, 200);
    assert_ne!(changed.header("etag"), Some(etag.clone()));
    let now = changed.json();
    let db = now["secrets"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["secretKey"] == "DB_PASSWORD"))
        .cloned()
        .expect("DB_PASSWORD");
    assert_eq!(db["secretValue"], "n3w");
    assert_eq!(db["version"], 2);

    // Imports.
    let with_imports = c
        .get(&format!("{LIST}&include_imports=true"), Some(&token))
        .await
        .json();
    assert_eq!(with_imports["imports"][0]["secretPath"], "/backend");
    assert_eq!(
        with_imports["imports"][0]["secrets"][0]["secretKey"],
        "API_KEY"
    );

    // A lease: create, read, renew, renew past the max, revoke.
    let lease_body = json!({"dynamicSecretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev", "path": "/", "ttl": "1h"});
    let created = c
        .json(
            "POST",
            "/api/v1/dynamic-secrets/leases",
            Some(&token),
            &lease_body,
        )
        .await;
    assert_eq!(
        created.status,
        200,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let created = created.json();
    assert_eq!(keys(&created), set(&["lease", "dynamicSecret", "data"]));
    assert_eq!(
        keys(&created["lease"]),
        set(&[
            "id",
            "version",
            "externalEntityId",
            "expireAt",
            "status",
            "statusDetails",
            "dynamicSecretId",
            "createdAt",
            "updatedAt"
        ])
    );
    assert_eq!(
        keys(&created["dynamicSecret"]),
        set(&[
            "id",
            "name",
            "version",
            "type",
            "defaultTTL",
            "maxTTL",
            "folderId",
            "status",
            "statusDetails",
            "createdAt",
            "updatedAt"
        ])
    );
    assert_eq!(created["dynamicSecret"]["defaultTTL"], "1h");
    assert_eq!(created["dynamicSecret"]["maxTTL"], "24h");
    assert_eq!(keys(&created["data"]), set(&["DB_USERNAME", "DB_PASSWORD"]));
    let username = created["data"]["DB_USERNAME"].as_str().expect("username");
    let password = created["data"]["DB_PASSWORD"].as_str().expect("password");
    assert!(password.len() >= 32 && username != password);
    assert_eq!(created["lease"]["externalEntityId"], username);
    let lease_id = created["lease"]["id"]
        .as_str()
        .expect("lease id")
        .to_owned();
    let created_at = iso_ms(created["lease"]["createdAt"].as_str().expect("createdAt"));
    let expire_at = iso_ms(created["lease"]["expireAt"].as_str().expect("expireAt"));
    assert_eq!(expire_at - created_at, 3_600_000);

    let second = c
        .json(
            "POST",
            "/api/v1/dynamic-secrets/leases",
            Some(&token),
            &lease_body,
        )
        .await
        .json();
    assert_ne!(
        second["data"]["DB_PASSWORD"], created["data"]["DB_PASSWORD"],
        "every lease mints new credentials"
    );

    let admin_leases = c.admin("GET", "/admin/leases", None).await.json();
    let listed: Vec<&str> = admin_leases
        .as_array()
        .expect("array")
        .iter()
        .map(|l| l["id"].as_str().unwrap_or_default())
        .collect();
    assert!(listed.contains(&lease_id.as_str()));
    let entry = admin_leases
        .as_array()
        .and_then(|a| a.iter().find(|l| l["id"] == lease_id.as_str()))
        .expect("entry");
    assert_eq!(entry["dynamicSecret"], "db-creds");
    assert_eq!(entry["expireAt"], created["lease"]["expireAt"]);

    let place = "projectSlug=demo&environmentSlug=dev&path=%2F";
    let got = c
        .get(
            &format!("/api/v1/dynamic-secrets/leases/{lease_id}?{place}"),
            Some(&token),
        )
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["lease"]["dynamicSecret"]["name"], "db-creds");

    let renew_path = format!("/api/v1/dynamic-secrets/leases/{lease_id}/renew");
    let place_body =
        json!({"projectSlug": "demo", "environmentSlug": "dev", "path": "/", "ttl": "2h"});
    let renewed = c.json("POST", &renew_path, Some(&token), &place_body).await;
    assert_eq!(
        renewed.status,
        200,
        "{}",
        String::from_utf8_lossy(&renewed.body)
    );
    let renewed_at = iso_ms(
        renewed.json()["lease"]["expireAt"]
            .as_str()
            .expect("expireAt"),
    );
    assert_eq!(
        renewed_at - expire_at,
        7_200_000,
        "renewal adds to the current expiry"
    );
    let too_far = c
        .json(
            "POST",
            &renew_path,
            Some(&token),
            &json!({"projectSlug": "demo", "environmentSlug": "dev", "path": "/", "ttl": "22h"}),
        )
        .await;
    assert_eq!(too_far.status, 400);
    assert_eq!(
        too_far.json(),
        json!({"statusCode": 400, "message": "TTL cannot be larger than max ttl", "error": "BadRequest"})
    );

    let revoked = c
        .json(
            "DELETE",
            &format!("/api/v1/dynamic-secrets/leases/{lease_id}"),
            Some(&token),
            &json!({"projectSlug": "demo", "environmentSlug": "dev", "path": "/", "isForced": false}),
        )
        .await;
    assert_eq!(revoked.status, 200);
    assert_eq!(revoked.json()["lease"]["id"], lease_id.as_str());
    let gone = c
        .get(
            &format!("/api/v1/dynamic-secrets/leases/{lease_id}?{place}"),
            Some(&token),
        )
        .await;
    assert_eq!(gone.status, 404);
    assert_eq!(
        gone.json()["message"],
        format!("Dynamic secret lease with ID '{lease_id}' not found")
    );
    let active = c.admin("GET", "/admin/leases", None).await.json();
    assert!(
        !active
            .as_array()
            .expect("array")
            .iter()
            .any(|l| l["id"] == lease_id.as_str())
    );
    let all = c.admin("GET", "/admin/leases?all=true", None).await.json();
    let state = all
        .as_array()
        .and_then(|a| a.iter().find(|l| l["id"] == lease_id.as_str()))
        .map(|l| l["state"].clone());
    assert_eq!(state, Some(json!("revoked")));

    // TTLs outside the bounds.
    let short = c
        .json("POST", "/api/v1/dynamic-secrets/leases", Some(&token), &json!({"dynamicSecretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev", "ttl": "30s"}))
        .await;
    assert_eq!(short.status, 400);
    assert_eq!(short.json()["message"], "TTL must be a greater than 1min");
    let long = c
        .json("POST", "/api/v1/dynamic-secrets/leases", Some(&token), &json!({"dynamicSecretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev", "ttl": "25h"}))
        .await;
    assert_eq!(long.status, 400);
    assert_eq!(long.json()["message"], "TTL cannot be larger than max TTL");

    // Dynamic secrets of the folder.
    let listed = c
        .get(&format!("/api/v1/dynamic-secrets?{place}"), Some(&token))
        .await
        .json();
    assert_eq!(listed["dynamicSecrets"][0]["name"], "db-creds");

    // The counters.
    let stats = c.admin("GET", "/admin/stats", None).await.json();
    let r = &stats["requests"];
    assert_eq!(
        r["POST /api/v1/auth/universal-auth/login"],
        json!({"200": 1})
    );
    assert_eq!(r["GET /api/v3/secrets/raw"], json!({"200": 3, "304": 1}));
    assert_eq!(
        stats["foldersRead"], 1,
        "four reads of one folder count it once"
    );
    assert_eq!(
        r["PATCH /api/v3/secrets/raw/:secretName"],
        json!({"200": 1})
    );
    assert_eq!(
        r["POST /api/v1/dynamic-secrets/leases"],
        json!({"200": 2, "400": 2})
    );
    assert_eq!(
        r["POST /api/v1/dynamic-secrets/leases/:leaseId/renew"],
        json!({"200": 1, "400": 1})
    );
    assert_eq!(
        r["GET /api/v1/dynamic-secrets/leases/:leaseId"],
        json!({"200": 1, "404": 1})
    );
    assert_eq!(
        r["DELETE /api/v1/dynamic-secrets/leases/:leaseId"],
        json!({"200": 1})
    );
    assert!(
        keys(r).iter().all(|k| !k.contains("/admin")),
        "admin requests are not counted"
    );

    // The admin API wants its token; a reset empties the counters.
    let anonymous = c.get("/admin/stats", None).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(c.admin("DELETE", "/admin/stats", None).await.status, 200);
    assert_eq!(
        c.admin("GET", "/admin/stats", None).await.json(),
        json!({"requests": {}, "rateLimited": {}, "foldersRead": 0})
    );
    server.shutdown().await;
}

const TOKEN_SEED: &str = r#"
projects:
  - slug: p
    environments: [dev]
    secrets: {dev: {/: {A: "1"}}}
  - slug: q
    environments: [dev]
identities:
  - name: short
    universalAuth: {clientId: short, clientSecret: s, accessTokenTTL: 3, accessTokenMaxTTL: 60}
    projects: [p]
  - name: capped
    universalAuth: {clientId: capped, clientSecret: s, accessTokenTTL: 1, accessTokenMaxTTL: 2}
    projects: [p]
"#;

#[tokio::test]
async fn tokens_expire_renew_and_revoke_like_the_real_server() {
    let server = start(SeedSource::Yaml(TOKEN_SEED.into()), None).await;
    let c = Client::new(server.addr());
    let list = "/api/v3/secrets/raw?workspaceSlug=p&environment=dev";

    // Renewing restarts the TTL; the same token is returned.
    let token = c.login("short", "s").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let renewed = c
        .json(
            "POST",
            "/api/v1/auth/token/renew",
            None,
            &json!({"accessToken": token}),
        )
        .await;
    assert_eq!(renewed.status, 200);
    assert_eq!(renewed.json()["accessToken"], token.as_str());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        c.get(list, Some(&token)).await.status,
        200,
        "3.5s after the login but 2s after the renewal, TTL 3s"
    );

    // Past the TTL: refused, and the token is gone.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let expired = c.get(list, Some(&token)).await;
    assert_eq!(expired.status, 401);
    assert_eq!(
        expired.json()["message"],
        "Failed to authenticate identity access token due to TTL expiration"
    );
    let after = c.get(list, Some(&token)).await;
    assert_eq!(after.json()["message"], "No identity access token found");

    // Past the max TTL the JWT itself has expired: 403 TokenError.
    let capped = c.login("capped", "s").await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let resp = c.get(list, Some(&capped)).await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        resp.json(),
        json!({"statusCode": 403, "message": "Your token has expired. Please re-authenticate.", "error": "TokenError"})
    );

    // Revoke.
    let token = c.login("short", "s").await;
    let revoked = c
        .json(
            "POST",
            "/api/v1/auth/token/revoke",
            None,
            &json!({"accessToken": token}),
        )
        .await;
    assert_eq!(
        revoked.json(),
        json!({"message": "Successfully revoked access token"})
    );
    assert_eq!(c.get(list, Some(&token)).await.status, 401);
    let again = c
        .json(
            "POST",
            "/api/v1/auth/token/revoke",
            None,
            &json!({"accessToken": token}),
        )
        .await;
    assert_eq!(again.status, 401);

    // A token of another server, and projects the identity is no member of.
    let other = start(SeedSource::Yaml(TOKEN_SEED.into()), None).await;
    let foreign = Client::new(other.addr()).login("short", "s").await;
    let resp = c.get(list, Some(&foreign)).await;
    assert_eq!(resp.status, 403);
    assert_eq!(resp.json()["error"], "TokenError");
    other.shutdown().await;
    let token = c.login("short", "s").await;
    let resp = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=q&environment=dev",
            Some(&token),
        )
        .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        resp.json()["message"],
        "You are not allowed to access this resource"
    );
    let resp = c
        .get(
            "/api/v3/secrets/raw?workspaceSlug=nope&environment=dev",
            Some(&token),
        )
        .await;
    assert_eq!(resp.status, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn leases_expire_and_renewals_respect_the_max_ttl() {
    let seed = r#"
projects:
  - slug: p
    environments: [dev]
    dynamicSecrets: [{name: creds, environment: dev, defaultTTL: 2s, maxTTL: 5s}]
identities:
  - name: i
    universalAuth: {clientId: i, clientSecret: s}
    projects: [p]
"#;
    let server = start_with(SeedSource::Yaml(seed.into()), None, Duration::from_secs(1)).await;
    let c = Client::new(server.addr());
    let token = c.login("i", "s").await;
    let body = json!({"dynamicSecretName": "CREDS", "projectSlug": "p", "environmentSlug": "dev"});
    let lease = c
        .json(
            "POST",
            "/api/v1/dynamic-secrets/leases",
            Some(&token),
            &body,
        )
        .await;
    assert_eq!(
        lease.status,
        200,
        "{}",
        String::from_utf8_lossy(&lease.body)
    );
    let lease = lease.json();
    let id = lease["lease"]["id"].as_str().expect("id").to_owned();
    let created = iso_ms(lease["lease"]["createdAt"].as_str().expect("createdAt"));
    let expire = iso_ms(lease["lease"]["expireAt"].as_str().expect("expireAt"));
    assert_eq!(expire - created, 2000, "defaultTTL applies");
    let renew = format!("/api/v1/dynamic-secrets/leases/{id}/renew");
    let place = json!({"projectSlug": "p", "environmentSlug": "dev"});
    let r = c.json("POST", &renew, Some(&token), &place).await;
    assert_eq!(r.status, 200);
    let r = c.json("POST", &renew, Some(&token), &place).await;
    assert_eq!(r.status, 400, "2s + 2s + 2s is past the 5s max");
    let admin = c.admin("GET", "/admin/leases", None).await.json();
    assert_eq!(admin.as_array().map(Vec::len), Some(1));
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let r = c.json("POST", &renew, Some(&token), &place).await;
    assert_eq!(r.status, 404, "an expired lease is gone");
    let admin = c.admin("GET", "/admin/leases", None).await.json();
    assert_eq!(admin, json!([]));
    let all = c.admin("GET", "/admin/leases?all=true", None).await.json();
    assert_eq!(all[0]["state"], "expired");
    server.shutdown().await;
}

#[tokio::test]
async fn secrets_crud_batches_recursion_and_references() {
    let seed = r#"
projects:
  - slug: p
    environments: [dev, prod]
    secrets:
      dev:
        /: {A: a, REF: "${A}-${prod.deep.er.B}-${MISSING}"}
        /x: {C: c}
        /x/y: {D: d}
      prod:
        /deep/er: {B: b}
identities:
  - name: i
    universalAuth: {clientId: i, clientSecret: s}
    projects: [p]
"#;
    let server = start(SeedSource::Yaml(seed.into()), None).await;
    let c = Client::new(server.addr());
    let t = c.login("i", "s").await;
    let t = Some(t.as_str());
    let base = "/api/v3/secrets/raw?workspaceSlug=p&environment=dev";

    let rec = c
        .get(&format!("{base}&secretPath=/x&recursive=true"), t)
        .await
        .json();
    let paths: Vec<(String, String)> = rec["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|s| {
            (
                s["secretKey"].as_str().unwrap_or_default().to_owned(),
                s["secretPath"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("C".to_owned(), "/x".to_owned()),
            ("D".to_owned(), "/x/y".to_owned())
        ]
    );
    let ids: Vec<String> = rec["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|s| s["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    let mut by_id = ids.clone();
    by_id.sort();
    assert_eq!(ids, by_id, "sorted by id");

    let expanded = c
        .get(
            "/api/v3/secrets/raw/REF?workspaceSlug=p&environment=dev&expandSecretReferences=true",
            t,
        )
        .await;
    assert_eq!(expanded.json()["secret"]["secretValue"], "a-b-");

    // Create, duplicate create, a new folder on the way.
    let write = |path: &str| json!({"projectSlug": "p", "environment": "dev", "secretPath": path, "secretValue": "  v1\n", "secretComment": "c"});
    let created = c
        .json("POST", "/api/v3/secrets/raw/NEW", t, &write("/new/folder/"))
        .await;
    assert_eq!(created.status, 200);
    assert_eq!(created.json()["secret"]["secretValue"], "v1\n");
    let dup = c
        .json("POST", "/api/v3/secrets/raw/NEW", t, &write("/new/folder"))
        .await;
    assert_eq!(
        dup.json(),
        json!({"statusCode": 400, "message": "Secret already exist", "error": "BadRequest"})
    );
    let listed = c
        .get(&format!("{base}&secretPath=/new/folder/"), t)
        .await
        .json();
    assert_eq!(listed["secrets"][0]["secretKey"], "NEW");
    let personal = c
        .json("POST", "/api/v3/secrets/raw/P", t, &json!({"projectSlug": "p", "environment": "dev", "secretValue": "x", "type": "personal"}))
        .await;
    assert_eq!(personal.status, 400);
    let no_env = c
        .json(
            "POST",
            "/api/v3/secrets/raw/P",
            t,
            &json!({"projectSlug": "p", "environment": "nope", "secretValue": "x"}),
        )
        .await;
    assert_eq!(no_env.status, 404);

    // Rename through PATCH, then delete.
    let renamed = c
        .json("PATCH", "/api/v3/secrets/raw/A", t, &json!({"projectSlug": "p", "environment": "dev", "secretValue": "a2", "newSecretName": "A2", "secretComment": "moved"}))
        .await;
    assert_eq!(renamed.status, 200);
    assert_eq!(renamed.json()["secret"]["secretKey"], "A2");
    assert_eq!(
        c.get("/api/v3/secrets/raw/A?workspaceSlug=p&environment=dev", t)
            .await
            .status,
        404
    );
    let deleted = c
        .json(
            "DELETE",
            "/api/v3/secrets/raw/A2",
            t,
            &json!({"projectSlug": "p", "environment": "dev"}),
        )
        .await;
    assert_eq!(deleted.json()["secret"]["secretValue"], "a2");
    let again = c
        .json(
            "DELETE",
            "/api/v3/secrets/raw/A2",
            t,
            &json!({"projectSlug": "p", "environment": "dev"}),
        )
        .await;
    assert_eq!(again.status, 404);

    // Batches are all or nothing.
    let batch = |keys: &[&str]| json!({"projectSlug": "p", "environment": "dev", "secrets": keys.iter().map(|k| json!({"secretKey": k, "secretValue": "b"})).collect::<Vec<_>>()});
    let made = c
        .json(
            "POST",
            "/api/v3/secrets/batch/raw",
            t,
            &batch(&["B1", "B2"]),
        )
        .await;
    assert_eq!(made.status, 200);
    let clash = c
        .json(
            "POST",
            "/api/v3/secrets/batch/raw",
            t,
            &batch(&["B3", "B1"]),
        )
        .await;
    assert_eq!(clash.status, 400);
    assert_eq!(
        c.get("/api/v3/secrets/raw/B3?workspaceSlug=p&environment=dev", t)
            .await
            .status,
        404
    );
    let missing = c
        .json(
            "PATCH",
            "/api/v3/secrets/batch/raw",
            t,
            &batch(&["B1", "B9"]),
        )
        .await;
    assert_eq!(missing.status, 404);
    let b1 = c
        .get("/api/v3/secrets/raw/B1?workspaceSlug=p&environment=dev", t)
        .await
        .json();
    assert_eq!(b1["secret"]["version"], 1, "a failed batch changes nothing");
    let mut upsert = batch(&["B1", "B9"]);
    upsert["mode"] = json!("upsert");
    let up = c
        .json("PATCH", "/api/v3/secrets/batch/raw", t, &upsert)
        .await
        .json();
    let versions: Vec<u64> = up["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|s| s["version"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(versions, [2, 1]);
    let gone = c
        .json(
            "DELETE",
            "/api/v3/secrets/batch/raw",
            t,
            &batch(&["B1", "B2", "B9"]),
        )
        .await;
    assert_eq!(gone.json()["secrets"].as_array().map(Vec::len), Some(3));
    let empty = c
        .json("POST", "/api/v3/secrets/batch/raw", t, &batch(&[]))
        .await;
    assert_eq!(empty.status, 401);
    assert_eq!(empty.json()["message"][0]["code"], "too_small");

    // The admin API changes values without a token and without counting.
    let put = c
        .admin("PUT", "/admin/secrets", Some(&json!({"project": "p", "environment": "dev", "path": "/x", "key": "C", "value": "c2"})))
        .await;
    assert_eq!(put.status, 200);
    assert_eq!(put.json()["secret"]["version"], 2);
    let c2 = c
        .get(
            "/api/v3/secrets/raw/C?workspaceSlug=p&environment=dev&secretPath=/x",
            t,
        )
        .await
        .json();
    assert_eq!(c2["secret"]["secretValue"], "c2");
    let del = c
        .admin(
            "DELETE",
            "/admin/secrets",
            Some(&json!({"project": "p", "environment": "dev", "path": "/x", "key": "C"})),
        )
        .await;
    assert_eq!(del.status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn projects_by_slug_and_id() {
    let server = start(demo_seed(), None).await;
    let c = Client::new(server.addr());
    let t = c.login("op-client", "op-secret").await;
    let by_slug = c.get("/api/v2/workspace/demo", Some(&t)).await.json();
    assert_eq!(by_slug["slug"], "demo");
    let envs: Vec<&str> = by_slug["environments"]
        .as_array()
        .expect("envs")
        .iter()
        .map(|e| e["slug"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(envs, ["dev", "prod"]);
    let id = by_slug["id"].as_str().expect("id");
    let seeded = server
        .seeded()
        .iter()
        .find(|o| o.kind == "project")
        .expect("seeded project");
    assert_eq!(seeded.id, id, "the printed id is the served one");
    let by_id = c
        .get(&format!("/api/v1/workspace/{id}"), Some(&t))
        .await
        .json();
    assert_eq!(by_id["workspace"], by_slug);
    let unknown = c.get("/api/v2/workspace/nope", Some(&t)).await;
    assert_eq!(unknown.status, 404);
    server.shutdown().await;
}
