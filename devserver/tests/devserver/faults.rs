//! Faults as a client sees them: latency, outage, dropped connections,
//! rate limits and reproducible error rates, scoped per route or global,
//! and counted in the stats.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Client, demo_seed, start};

const STATUS: &str = "/api/status";

#[tokio::test]
async fn faults_are_visible_to_clients_and_counted() {
    let server = start(demo_seed(), None).await;
    let c = Client::new(server.addr());
    let token = c.login("op-client", "op-secret").await;
    let list = "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev";

    // Latency on one route only.
    let set = c
        .admin(
            "POST",
            "/admin/faults",
            Some(&json!({"route": "GET /api/status", "latencyMs": 300})),
        )
        .await;
    assert_eq!(set.status, 200, "{}", String::from_utf8_lossy(&set.body));
    let t = Instant::now();
    assert_eq!(c.get(STATUS, None).await.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    assert_eq!(c.get(list, Some(&token)).await.status, 200);
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "other routes are not delayed"
    );

    // An outage of every route, with the envelope; the admin API still works.
    c.admin("POST", "/admin/faults", Some(&json!({"outage": true})))
        .await;
    let down = c.get(list, Some(&token)).await;
    assert_eq!(down.status, 503);
    assert_eq!(
        down.json(),
        json!({"statusCode": 503, "message": "Service Unavailable", "error": "ServiceUnavailable"})
    );
    assert!(down.header("etag").is_some());
    let listed = c.admin("GET", "/admin/faults", None).await.json();
    assert_eq!(listed["faults"].as_array().map(Vec::len), Some(2));
    // Setting a scope replaces it: the outage is lifted, latency stays.
    c.admin("POST", "/admin/faults", Some(&json!({}))).await;
    assert_eq!(c.get(list, Some(&token)).await.status, 200);

    // Dropped connections: no answer at all.
    c.admin(
        "POST",
        "/admin/faults",
        Some(&json!({"route": "GET /api/v3/secrets/raw", "dropConnections": true})),
    )
    .await;
    let dropped = c.try_send("GET", list, &[], None).await;
    assert!(dropped.is_err(), "{dropped:?}");
    assert_eq!(c.get(STATUS, None).await.status, 200);

    // A rate limit: the real 429 with Retry-After.
    c.admin(
        "POST",
        "/admin/faults",
        Some(&json!({"route": "GET /api/v3/secrets/raw", "rateLimitPerMinute": 2})),
    )
    .await;
    let first = c.get(list, Some(&token)).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-remaining").as_deref(), Some("1"));
    assert_eq!(c.get(list, Some(&token)).await.status, 200);
    let limited = c.get(list, Some(&token)).await;
    assert_eq!(limited.status, 429);
    assert_eq!(
        limited.json(),
        json!({"statusCode": 429, "message": "Rate limit exceeded. Please try again in 1 minute", "error": "RateLimitExceeded"})
    );
    let retry: u64 = limited
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((1..=60).contains(&retry));

    // An error rate with a seed is reproducible.
    let spec = json!({"route": "GET /api/status", "errorRate": 0.5, "status": 500, "seed": 42});
    let mut runs = Vec::new();
    for _ in 0..2 {
        c.admin("POST", "/admin/faults", Some(&spec)).await;
        let mut statuses = Vec::new();
        for _ in 0..24 {
            statuses.push(c.get(STATUS, None).await.status);
        }
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(
        runs[0].contains(&200) && runs[0].contains(&500),
        "{:?}",
        runs[0]
    );
    let failed = c.get("/api/status", None).await;
    if failed.status == 500 {
        assert_eq!(failed.json()["error"], "InternalServerError");
    }

    // Everything was counted, faulted requests included.
    let stats = c.admin("GET", "/admin/stats", None).await.json();
    let raw = &stats["requests"]["GET /api/v3/secrets/raw"];
    assert_eq!(raw["503"], 1);
    assert_eq!(raw["dropped"], 1);
    assert_eq!(raw["429"], 1);
    let failures = runs[0].iter().filter(|s| **s == 500).count() * 2;
    assert!(
        stats["requests"]["GET /api/status"]["500"]
            .as_u64()
            .expect("500s")
            >= failures as u64
    );

    // Clearing restores service.
    assert_eq!(
        c.admin("DELETE", "/admin/faults", None).await.json(),
        json!({"faults": []})
    );
    assert_eq!(c.get(list, Some(&token)).await.status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn bad_fault_specs_are_refused() {
    let server = start(demo_seed(), None).await;
    let c = Client::new(server.addr());
    for spec in [
        json!({"route": "GET /api/v9/nothing", "outage": true}),
        json!({"errorRate": 2}),
        json!({"errorRate": 0.1, "status": 200}),
        json!({"outtage": true}),
        json!({"latencyMs": -1}),
    ] {
        let r = c.admin("POST", "/admin/faults", Some(&spec)).await;
        assert_eq!(r.status, 400, "{spec}");
        assert_eq!(r.json()["error"], "BadRequest");
    }
    let wrong = c
        .send(
            "GET",
            "/admin/stats",
            &[("authorization", "Bearer nope")],
            None,
        )
        .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(c.admin("GET", "/admin/nothing", None).await.status, 404);
    server.shutdown().await;
}
