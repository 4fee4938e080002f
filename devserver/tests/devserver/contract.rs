//! Replays every request recorded from the real server
//! (`tests/fixtures/kms-api`, copied from the shared fixtures) against a dev
//! server seeded with the same data, in the recorded order, and compares
//! the answers: status, content type, the `ETag` scheme, the presence and
//! JSON type of every field (recursively, no field missing or extra), the
//! values that do not depend on ids or clocks, and, for bodies without
//! such values, the exact bytes (through the recorded `ETag`). The rate
//! limits run with the recorded limits (40 per secret route, 60 per other
//! read, 200 per other write), so the `x-ratelimit-*` headers are compared
//! too, value for value.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use kms_devserver::SeedSource;
use serde_json::{Value, json};

use crate::common::{Client, etag_of, start};

/// The recording's project, identity and data.
const SEED: &str = r#"
projects:
  - id: 505c2458-c1cd-42f0-8524-03d4ba9b61cd
    slug: operator-test
    name: Operator Test
    autoCapitalization: true
    environments: [dev, staging, prod]
    secrets:
      dev:
        /:
          REF_SECRET: "key=${API_KEY};tok=${dev.backend.BACKEND_TOKEN}"
          DATABASE_URL: {value: "postgres://app:pw@db:5432/app", comment: root secret}
          MULTILINE: {value: "line1\nline2\n", comment: multiline}
          API_KEY: abc456
          LOWER_CASE_KEY: {value: v2, comment: renamed}
        /backend:
          BACKEND_TOKEN: {value: tok-1, comment: nested}
        /backend/db:
          DB_PASSWORD: {value: s3cr3t, comment: deep nested}
    imports:
      dev:
        /: [{environment: dev, path: /backend}]
    dynamicSecrets:
      - {name: db-creds, environment: dev, path: /dynamic, defaultTTL: 1h, maxTTL: 2h}
  - id: 91e16f6d-c435-4248-9cb8-c339c171fbe8
    slug: not-a-member
identities:
  - id: d851ad4e-f00b-4eec-8f31-b9a76ac5d857
    name: fixture-recorder
    universalAuth:
      clientId: 0c3af4a3-cf4f-487c-ae54-2f1567953e6c
      clientSecret: the-fixture-client-secret
      accessTokenTTL: 3600
      accessTokenMaxTTL: 86400
    projects: [operator-test]
"#;

const CLIENT_SECRET: &str = "the-fixture-client-secret";

/// Fields whose values depend on ids, clocks or history, not on the data.
const VOLATILE: &[&str] = &[
    "id",
    "_id",
    "createdAt",
    "updatedAt",
    "version",
    "folderId",
    "orgId",
    "accessToken",
];

/// Where the dev server answers differently from the recording, on purpose
/// (case 26, the project lookup of newer servers, is checked on its own).
fn deviation(case: u32) -> Option<(u16, &'static str)> {
    match case {
        // The recording ran without a licence, so the real server refused
        // leases for its plan; the dev server has no plans and answers that
        // the (unseeded) dynamic secret does not exist.
        31 => Some((
            404,
            "Dynamic secret with name 'redis-dev' in folder with path '/' not found",
        )),
        _ => None,
    }
}

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kms-api")
}

fn load_fixtures() -> Vec<(u32, String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(fixtures_dir()).expect("fixtures directory") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_owned();
        let case: u32 = name[..2].parse().expect("numbered fixture");
        let text = std::fs::read_to_string(&path).expect("fixture");
        out.push((
            case,
            name,
            serde_json::from_str(&text).expect("fixture JSON"),
        ));
    }
    out.sort_by_key(|(case, _, _)| *case);
    out
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_volatile(v: &Value) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, v)| VOLATILE.contains(&k.as_str()) || has_volatile(v)),
        Value::Array(a) => a.iter().any(has_volatile),
        _ => false,
    }
}

/// Compare `ours` with the recorded `want`; problems are pushed to `errs`.
fn compare(at: &str, want: &Value, ours: &Value, errs: &mut Vec<String>) {
    if type_of(want) != type_of(ours) {
        errs.push(format!(
            "{at}: type {} recorded, {} served",
            type_of(want),
            type_of(ours)
        ));
        return;
    }
    match (want, ours) {
        (Value::Object(w), Value::Object(o)) => {
            for k in w.keys().filter(|k| !o.contains_key(*k)) {
                errs.push(format!("{at}.{k}: missing"));
            }
            for k in o.keys().filter(|k| !w.contains_key(*k)) {
                errs.push(format!("{at}.{k}: not in the recording"));
            }
            for (k, wv) in w {
                let Some(ov) = o.get(k) else { continue };
                let sub = format!("{at}.{k}");
                if VOLATILE.contains(&k.as_str()) {
                    if type_of(wv) != type_of(ov) {
                        errs.push(format!(
                            "{sub}: type {} recorded, {} served",
                            type_of(wv),
                            type_of(ov)
                        ));
                    }
                } else {
                    compare(&sub, wv, ov, errs);
                }
            }
        }
        (Value::Array(w), Value::Array(o)) => {
            if w.len() != o.len() {
                errs.push(format!(
                    "{at}: {} items recorded, {} served",
                    w.len(),
                    o.len()
                ));
                return;
            }
            let keyed = |v: &Value| {
                v.get("secretKey")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            if w.iter().all(|v| keyed(v).is_some()) {
                let mine: HashMap<String, &Value> =
                    o.iter().filter_map(|v| keyed(v).map(|k| (k, v))).collect();
                for wv in w {
                    let key = keyed(wv).unwrap_or_default();
                    match mine.get(&key) {
                        Some(ov) => compare(&format!("{at}[{key}]"), wv, ov, errs),
                        None => errs.push(format!("{at}: no item {key}")),
                    }
                }
            } else {
                for (i, (wv, ov)) in w.iter().zip(o).enumerate() {
                    compare(&format!("{at}[{i}]"), wv, ov, errs);
                }
            }
        }
        _ => {
            if want != ours {
                errs.push(format!("{at}: {want} recorded, {ours} served"));
            }
        }
    }
}

/// Replace the recording's placeholders.
fn fill(v: &Value, token: &str) -> Value {
    match v {
        Value::String(s) if s == "<ACCESS_TOKEN>" => Value::String(token.to_owned()),
        Value::String(s) if s == "<CLIENT_SECRET>" => Value::String(CLIENT_SECRET.to_owned()),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), fill(v, token))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| fill(v, token)).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn every_recorded_exchange_is_answered_alike() {
    let server = start(SeedSource::Yaml(SEED.to_owned()), None).await;
    let client = Client::new(server.addr());
    let fixtures = load_fixtures();
    assert_eq!(fixtures.len(), 36, "all recorded exchanges are present");
    let mut token = String::new();
    // Recorded ETag -> ours: equal recorded bodies must give equal bodies.
    let mut etags: HashMap<String, String> = HashMap::new();
    let mut failures = BTreeMap::new();
    let limits = client
        .admin(
            "POST",
            "/admin/ratelimit",
            Some(&json!({"secrets": 40, "read": 60, "write": 200})),
        )
        .await;
    assert_eq!(
        limits.json(),
        json!({"limits": {"secrets": 40, "read": 60, "write": 200}})
    );
    let mut project_body = Value::Null;
    let mut burst = 0;
    for (case, name, fx) in &fixtures {
        let req = &fx["request"];
        let want = &fx["response"];
        if *case == 29 {
            // 29 is the 40th list of a burst from one client: send the 39
            // before it.
            let auth = format!("Bearer {token}");
            for _ in 0..39 {
                let r = client
                    .send(
                        "GET",
                        req["path"].as_str().expect("path"),
                        &[("authorization", &auth), ("x-forwarded-for", "10.9.9.9")],
                        None,
                    )
                    .await;
                assert_eq!(r.status, 200, "the burst before 29");
                burst += 1;
            }
        }
        let method = req["method"].as_str().expect("method");
        let path = req["path"].as_str().expect("path");
        let mut headers: Vec<(String, String)> = Vec::new();
        for (k, v) in req["headers"].as_object().expect("headers") {
            let v = v.as_str().expect("header value");
            let v = match k.to_ascii_lowercase().as_str() {
                "authorization" => v.replace("<ACCESS_TOKEN>", &token),
                "if-none-match" => etags
                    .get(v)
                    .cloned()
                    .unwrap_or_else(|| panic!("{name}: If-None-Match of an unseen answer")),
                _ => v.to_owned(),
            };
            headers.push((k.clone(), v));
        }
        let body = match &req["body"] {
            Value::Null => None,
            b => Some(serde_json::to_vec(&fill(b, &token)).expect("body")),
        };
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let resp = client.send(method, path, &header_refs, body).await;
        let mut errs = Vec::new();

        let want_status = want["status"].as_u64().expect("status") as u16;
        if *case == 25 {
            project_body = resp.json();
        }
        if *case == 26 {
            // The recorded build did not have this route; newer servers
            // answer the bare project, as `GET /api/v2/workspace/:slug`.
            if resp.status != 200 || resp.json() != project_body {
                errs.push(format!(
                    "{} {}",
                    resp.status,
                    String::from_utf8_lossy(&resp.body)
                ));
                failures.insert(name.clone(), errs);
            }
            continue;
        }
        if let Some((status, message)) = deviation(*case) {
            if resp.status != status {
                errs.push(format!("status {} (expected {status})", resp.status));
            }
            let ours = resp.json();
            let envelope = json!({"statusCode": status, "message": message, "error": "NotFound"});
            if ours != envelope {
                errs.push(format!("body {ours}"));
            }
            if !errs.is_empty() {
                failures.insert(name.clone(), errs);
            }
            continue;
        }
        if resp.status != want_status {
            errs.push(format!(
                "status {} recorded, {} served: {}",
                want_status,
                resp.status,
                String::from_utf8_lossy(&resp.body)
            ));
            failures.insert(name.clone(), errs);
            continue;
        }

        // Headers.
        let want_headers = want["headers"].as_object().expect("headers");
        if resp.header("content-type").as_deref() != want_headers["content-type"].as_str() {
            errs.push(format!("content-type {:?}", resp.header("content-type")));
        }
        let our_etag = resp.header("etag").unwrap_or_default();
        if resp.status == 304 {
            let sent = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("if-none-match"))
                .map(|(_, v)| v.clone());
            if Some(&our_etag) != sent.as_ref() || !resp.body.is_empty() {
                errs.push("a 304 keeps the ETag and has no body".into());
            }
        } else if our_etag != etag_of(&resp.body) {
            errs.push(format!("etag {our_etag} is not the hash of the body"));
        }
        let recorded_etag = want_headers["etag"].as_str().expect("etag").to_owned();
        match etags.get(&recorded_etag) {
            Some(seen) if *seen != our_etag => errs.push(format!(
                "the recording has the same body as an earlier answer, ours differs ({seen} vs {our_etag})"
            )),
            Some(_) => {}
            None => {
                etags.insert(recorded_etag.clone(), our_etag.clone());
            }
        }
        if want_headers.contains_key("retry-after") {
            let ra = resp
                .header("retry-after")
                .and_then(|v| v.parse::<u64>().ok());
            if !ra.is_some_and(|s| (1..=60).contains(&s)) {
                errs.push(format!("retry-after {ra:?}"));
            }
        }
        for h in ["x-ratelimit-limit", "x-ratelimit-remaining"] {
            let recorded = want_headers.get(h).and_then(Value::as_str);
            if resp.header(h).as_deref() != recorded {
                errs.push(format!(
                    "header {h}: {:?} recorded, {:?} served",
                    recorded,
                    resp.header(h)
                ));
            }
        }
        let reset = resp
            .header("x-ratelimit-reset")
            .and_then(|v| v.parse::<u64>().ok());
        let reset_ok = match want_headers.contains_key("x-ratelimit-reset") {
            true => reset.is_some_and(|r| (50..=60).contains(&r)),
            false => reset.is_none(),
        };
        if !reset_ok {
            errs.push(format!("header x-ratelimit-reset: {reset:?}"));
        }

        // Body.
        let ours = resp.json();
        compare("body", &want["body"], &ours, &mut errs);
        if !want["body"].is_null() && !has_volatile(&want["body"]) && our_etag != recorded_etag {
            errs.push(format!(
                "the body differs from the recorded bytes: {}",
                String::from_utf8_lossy(&resp.body)
            ));
        }

        if *case == 1 {
            token = ours["accessToken"].as_str().unwrap_or_default().to_owned();
            assert_eq!(token.split('.').count(), 3, "the token looks like a JWT");
        }
        if !errs.is_empty() {
            failures.insert(name.clone(), errs);
        }
    }
    assert!(
        failures.is_empty(),
        "differences from the recording:\n{failures:#?}"
    );

    // Every one of them was counted.
    let stats = client.admin("GET", "/admin/stats", None).await.json();
    let total: u64 = stats["requests"]
        .as_object()
        .expect("requests")
        .values()
        .flat_map(|by_status| by_status.as_object().expect("statuses").values())
        .map(|n| n.as_u64().expect("count"))
        .sum();
    assert_eq!(total, 36 + burst, "{stats}");
    assert_eq!(stats["requests"]["GET /api/v3/secrets/raw"]["304"], 1);
    assert_eq!(stats["requests"]["GET /api/v3/secrets/raw"]["429"], 1);
    assert_eq!(
        stats["rateLimited"],
        json!({"GET /api/v3/secrets/raw": 1}),
        "{stats}"
    );
    assert_eq!(
        stats["requests"]["GET /api/v1/projects/slug/:slug"]["200"],
        1
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_fixture_copy_matches_the_shared_one_when_present() {
    // The fixtures are copied into the crate so a fresh clone can run the
    // contract; when the shared folder is next to the repository, the copy
    // must not have drifted from it.
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/kms-api");
    if !shared.is_dir() {
        return;
    }
    for entry in std::fs::read_dir(&shared).expect("shared fixtures") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name");
        let copy = fixtures_dir().join(name);
        assert_eq!(
            std::fs::read(&path).ok(),
            std::fs::read(&copy).ok(),
            "{} differs from the shared fixture",
            copy.display()
        );
    }
}
