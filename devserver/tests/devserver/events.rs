//! The project-events stream: events for the folders registered arrive
//! quickly (measured), none for other folders, pings keep coming, the
//! import mutations of importing folders, the limit of five streams, path
//! scopes, and the end of streams at shutdown.

use std::time::{Duration, Instant};

use kms_devserver::{Config, SeedSource};
use serde_json::{Value, json};

use crate::common::{Client, EventStream, config, start_config};

const SEED: &str = r#"
projects:
  - slug: demo
    environments: [dev, prod]
    secrets:
      dev:
        /: {ROOT_KEY: r}
        /backend: {API_KEY: abc}
        /frontend: {UI_KEY: u}
      prod:
        /backend: {API_KEY: prod-abc}
    imports:
      dev:
        /: [{environment: dev, path: /backend}]
  - slug: other
identities:
  - name: operator
    universalAuth: {clientId: op, clientSecret: op-secret}
    projects: [demo]
  - name: scoped
    universalAuth: {clientId: scoped, clientSecret: scoped-secret}
    projects: [{slug: demo, paths: ["/backend/**"]}]
serviceTokens:
  - {token: st.evt.secret.key, project: demo, environment: dev, path: /backend}
"#;

/// A server whose streams ping every 200 ms.
fn settings() -> Config {
    Config {
        event_ping_interval: Duration::from_millis(200),
        ..config(SeedSource::Yaml(SEED.to_owned()))
    }
}

fn project_id(server: &kms_devserver::Running, slug: &str) -> String {
    server
        .seeded()
        .iter()
        .find(|o| o.kind == "project" && o.name == slug)
        .map(|o| o.id.clone())
        .expect("seeded project")
}

fn subscription(project: &str, events: &[&str], env: &str, path: &str) -> Value {
    let register: Vec<Value> = events
        .iter()
        .map(|e| json!({"event": e, "conditions": {"secretPath": path, "environmentSlug": env}}))
        .collect();
    json!({"projectId": project, "register": register})
}

async fn patch(c: &Client, token: &str, path: &str, key: &str, value: &str, env: &str) {
    let r = c
        .json(
            "PATCH",
            &format!("/api/v3/secrets/raw/{key}"),
            Some(token),
            &json!({"projectSlug": "demo", "environment": env,
                    "secretPath": path, "secretValue": value}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[tokio::test]
async fn subscribers_get_their_events_within_500_ms_and_no_others() {
    let server = start_config(settings()).await;
    let c = Client::new(server.addr());
    let token = c.login("op", "op-secret").await;
    let demo = project_id(&server, "demo");
    let mut stream = EventStream::open(
        server.addr(),
        &token,
        &subscription(
            &demo,
            &["secret:create", "secret:update", "secret:delete"],
            "dev",
            "/backend/**",
        ),
    )
    .await
    .unwrap_or_else(|r| panic!("{} {}", r.status, String::from_utf8_lossy(&r.body)));
    assert_eq!(stream.status, 200);
    let header = |name: &str| {
        stream
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("content-type").as_deref(), Some("text/event-stream"));
    assert_eq!(header("cache-control").as_deref(), Some("no-cache"));

    // Pings keep the stream alive.
    for _ in 0..2 {
        let ping = stream.next(Duration::from_secs(2)).await.expect("a ping");
        assert_eq!(ping.event, "ping");
        assert_eq!((ping.id, ping.data), (None, None));
    }

    // An update in the registered folder, through the API: measured from
    // the moment the update is sent.
    let sent = Instant::now();
    patch(&c, &token, "/backend", "API_KEY", "v2", "dev").await;
    let event = stream
        .next_event(Duration::from_secs(2))
        .await
        .expect("an update event");
    let latency = sent.elapsed();
    eprintln!("update event received {latency:?} after the update was sent");
    assert!(latency < Duration::from_millis(500), "{latency:?}");
    assert_eq!(event.event, "secret:update");
    assert!(
        event
            .id
            .as_deref()
            .is_some_and(|id| id.parse::<i64>().is_ok()),
        "{event:?}"
    );
    assert_eq!(
        event.data,
        Some(
            json!({"type": "secret-manager", "data": {"eventType": "secret:update",
            "payload": [{"environment": "dev", "secretPath": "/backend", "secretKeys": "API_KEY"}]}})
        )
    );

    // Changes elsewhere: another folder (through the API and the admin
    // API), another environment. Only pings come.
    patch(&c, &token, "/", "ROOT_KEY", "r2", "dev").await;
    patch(&c, &token, "/backend", "API_KEY", "p2", "prod").await;
    let r = c
        .admin(
            "PUT",
            "/admin/secrets",
            Some(
                &json!({"project": "demo", "environment": "dev", "path": "/frontend",
                         "key": "UI_KEY", "value": "u2"}),
            ),
        )
        .await;
    assert_eq!(r.status, 200);
    let quiet_until = Instant::now() + Duration::from_millis(800);
    let mut pings = 0;
    while let Some(m) = stream
        .next(quiet_until.saturating_duration_since(Instant::now()))
        .await
    {
        assert_eq!(m.event, "ping", "no event for other folders: {m:?}");
        pings += 1;
    }
    assert!(pings >= 2, "pings keep coming ({pings})");

    // A create below the folder (the glob is recursive), then deletes
    // through the admin API and the API: each within 500 ms.
    let sent = Instant::now();
    let created = c
        .json(
            "POST",
            "/api/v3/secrets/raw/DB_URL",
            Some(&token),
            &json!({"workspaceId": demo, "environment": "dev", "secretPath": "/backend/db",
                    "secretValue": "postgres://"}),
        )
        .await;
    assert_eq!(created.status, 200);
    let event = stream
        .next_event(Duration::from_secs(2))
        .await
        .expect("a create event");
    assert!(sent.elapsed() < Duration::from_millis(500));
    assert_eq!(event.event, "secret:create");
    assert_eq!(
        event.data.expect("data")["data"]["payload"],
        json!([{"environment": "dev", "secretPath": "/backend/db", "secretKeys": "DB_URL"}])
    );

    let sent = Instant::now();
    let r = c
        .admin(
            "DELETE",
            "/admin/secrets",
            Some(
                &json!({"project": "demo", "environment": "dev", "path": "/backend",
                         "key": "API_KEY"}),
            ),
        )
        .await;
    assert_eq!(r.status, 200);
    let event = stream
        .next_event(Duration::from_secs(2))
        .await
        .expect("a delete event");
    assert!(sent.elapsed() < Duration::from_millis(500));
    assert_eq!(event.event, "secret:delete");

    // A batch is one event with every key.
    let r = c
        .json(
            "POST",
            "/api/v3/secrets/batch/raw",
            Some(&token),
            &json!({"workspaceId": demo, "environment": "dev", "secretPath": "/backend",
                    "secrets": [{"secretKey": "A", "secretValue": "1"},
                                {"secretKey": "B", "secretValue": "2"}]}),
        )
        .await;
    assert_eq!(r.status, 200);
    let event = stream
        .next_event(Duration::from_secs(2))
        .await
        .expect("a batch event");
    let keys: Vec<Value> = event.data.expect("data")["data"]["payload"]
        .as_array()
        .expect("payload")
        .iter()
        .map(|p| p["secretKeys"].clone())
        .collect();
    assert_eq!(keys, [json!("A"), json!("B")]);
    server.shutdown().await;
}

#[tokio::test]
async fn importing_folders_get_import_mutations_and_scopes_apply() {
    let server = start_config(settings()).await;
    let c = Client::new(server.addr());
    let token = c.login("op", "op-secret").await;
    let demo = project_id(&server, "demo");
    // `/` imports `/backend`: a change there is an import mutation of `/`.
    let mut root = EventStream::open(
        server.addr(),
        &token,
        &subscription(
            &demo,
            &["secret:update", "secret:import-mutation"],
            "dev",
            "/",
        ),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.status));
    patch(&c, &token, "/backend", "API_KEY", "v3", "dev").await;
    let event = root
        .next_event(Duration::from_secs(2))
        .await
        .expect("an import mutation");
    assert_eq!(event.event, "secret:import-mutation");
    assert_eq!(
        event.data,
        Some(
            json!({"type": "secret-manager", "data": {"eventType": "secret:import-mutation",
            "payload": {"environment": "dev", "secretPath": "/"}}})
        )
    );
    // The update itself is in /backend, which `/` (no glob) does not cover.
    assert_eq!(root.next_event(Duration::from_millis(400)).await, None);

    // A path-scoped identity may subscribe within its folders only, and
    // gets nothing from outside them even with a wide registration.
    let scoped = c.login("scoped", "scoped-secret").await;
    let refused = EventStream::open(
        server.addr(),
        &scoped,
        &subscription(&demo, &["secret:update"], "dev", "/**"),
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(refused.status, 403);
    assert_eq!(refused.json()["error"], "PermissionDenied");
    let mut mine = EventStream::open(
        server.addr(),
        &scoped,
        &subscription(&demo, &["secret:update"], "dev", "/backend/**"),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.status));
    patch(&c, &token, "/", "ROOT_KEY", "r3", "dev").await;
    patch(&c, &token, "/backend", "API_KEY", "v4", "dev").await;
    let event = mine
        .next_event(Duration::from_secs(2))
        .await
        .expect("an update in scope");
    assert_eq!(
        event.data.expect("data")["data"]["payload"][0]["secretPath"],
        "/backend"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn five_streams_per_project_and_actor_then_429() {
    let server = start_config(settings()).await;
    let c = Client::new(server.addr());
    let token = c.login("op", "op-secret").await;
    let demo = project_id(&server, "demo");
    let body = subscription(&demo, &["secret:update"], "dev", "/");
    let mut streams = Vec::new();
    for _ in 0..5 {
        streams.push(
            EventStream::open(server.addr(), &token, &body)
                .await
                .unwrap_or_else(|r| panic!("{}", r.status)),
        );
    }
    let sixth = EventStream::open(server.addr(), &token, &body)
        .await
        .err()
        .expect("a sixth stream is refused");
    assert_eq!(sixth.status, 429);
    assert_eq!(sixth.json()["statusCode"], 429);
    // Another actor has its own five.
    let second_login = c.login("scoped", "scoped-secret").await;
    let scoped_body = subscription(&demo, &["secret:update"], "dev", "/backend");
    assert!(
        EventStream::open(server.addr(), &second_login, &scoped_body)
            .await
            .is_ok()
    );
    // Closing a stream gives its place back once the server sees it gone.
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match EventStream::open(server.addr(), &token, &body).await {
            Ok(s) => {
                streams.push(s);
                break;
            }
            Err(r) if r.status == 429 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(r) => panic!("the place was not given back: {}", r.status),
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn subscriptions_are_checked() {
    let server = start_config(settings()).await;
    let c = Client::new(server.addr());
    let token = c.login("op", "op-secret").await;
    let demo = project_id(&server, "demo");
    let other = project_id(&server, "other");
    let refused = |body: Value, token: String| {
        let addr = server.addr();
        async move {
            EventStream::open(addr, &token, &body)
                .await
                .err()
                .expect("refused")
        }
    };
    // Not a member.
    let r = refused(
        subscription(&other, &["secret:update"], "dev", "/"),
        token.clone(),
    )
    .await;
    assert_eq!(r.status, 403);
    // Schema: unknown event, no registration, more than ten.
    let r = refused(
        subscription(&demo, &["secret:rotate"], "dev", "/"),
        token.clone(),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"], "ValidationFailure");
    assert_eq!(
        r.json()["message"][0]["path"],
        json!(["register", 0, "event"])
    );
    let r = refused(json!({"projectId": demo, "register": []}), token.clone()).await;
    assert_eq!(r.json()["message"][0]["code"], "too_small");
    let eleven = vec!["secret:update"; 11];
    let r = refused(subscription(&demo, &eleven, "dev", "/"), token.clone()).await;
    assert_eq!(r.json()["message"][0]["code"], "too_big");
    let r = refused(
        json!({"projectId": demo, "register": [{"event": "secret:update", "conditions": {"secretPath": "/"}}]}),
        token.clone(),
    )
    .await;
    assert_eq!(
        r.json()["message"][0]["path"],
        json!(["register", 0, "conditions", "environmentSlug"])
    );
    // Service tokens cannot subscribe.
    let r = refused(
        subscription(&demo, &["secret:update"], "dev", "/"),
        "st.evt.secret".to_owned(),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["error"],
        "/api/v1/events/subscribe/project-events Unauthorized Access"
    );
    // No conditions: every folder of every environment.
    let mut all = EventStream::open(
        server.addr(),
        &token,
        &json!({"projectId": demo, "register": [{"event": "secret:update"}]}),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.status));
    patch(&c, &token, "/backend", "API_KEY", "p9", "prod").await;
    let event = all.next_event(Duration::from_secs(2)).await.expect("event");
    assert_eq!(
        event.data.expect("data")["data"]["payload"][0]["environment"],
        "prod"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let server = start_config(settings()).await;
    let c = Client::new(server.addr());
    let token = c.login("op", "op-secret").await;
    let demo = project_id(&server, "demo");
    let mut stream = EventStream::open(
        server.addr(),
        &token,
        &subscription(&demo, &["secret:update"], "dev", "/"),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.status));
    let t = Instant::now();
    server.shutdown().await;
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "an open stream does not hold up shutdown: {:?}",
        t.elapsed()
    );
    // What was sent before the end may still be read; then it ends.
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Some(m) = stream.next(Duration::from_millis(500)).await {
        assert_eq!(m.event, "ping");
        assert!(Instant::now() < deadline, "the stream ended");
    }
}
