//! Per-client rate limits: the 11th request in a minute under a 10/min limit
//! is refused with the real 429 and `Retry-After`, counted in the stats;
//! windows are per client and route; refused authentications and
//! `/api/status` are not limited; the admin API sets and lifts limits.

use std::time::Instant;

use kms_devserver::Config;
use serde_json::json;

use crate::common::{Client, config, demo_seed, start, start_config};

const LIST: &str = "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev";

#[tokio::test]
async fn the_eleventh_request_in_a_minute_gets_429_and_is_counted() {
    let server = start_config(Config {
        rate_limit_per_minute: Some(10),
        ..config(demo_seed())
    })
    .await;
    let c = Client::new(server.addr());
    let token = c.login("op-client", "op-secret").await;
    let started = Instant::now();
    for i in 0..10u32 {
        let r = c.get(LIST, Some(&token)).await;
        assert_eq!(r.status, 200, "request {}", i + 1);
        assert_eq!(r.header("x-ratelimit-limit").as_deref(), Some("10"));
        assert_eq!(r.header("x-ratelimit-remaining"), Some((9 - i).to_string()));
        let reset: u64 = r
            .header("x-ratelimit-reset")
            .and_then(|v| v.parse().ok())
            .expect("x-ratelimit-reset");
        assert!((1..=60).contains(&reset), "{reset}");
    }
    let eleventh = c.get(LIST, Some(&token)).await;
    assert!(
        started.elapsed().as_secs() < 60,
        "the test ran within one window"
    );
    assert_eq!(eleventh.status, 429);
    assert_eq!(
        eleventh.body.as_ref(),
        br#"{"statusCode":429,"message":"Rate limit exceeded. Please try again in 1 minute","error":"RateLimitExceeded"}"#
    );
    let retry_after: u64 = eleventh
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        eleventh.header("x-ratelimit-remaining").as_deref(),
        Some("0")
    );
    assert_eq!(eleventh.header("x-ratelimit-limit").as_deref(), Some("10"));
    assert_eq!(c.get(LIST, Some(&token)).await.status, 429);

    // Other routes and other clients have windows of their own.
    let project = c.get("/api/v2/workspace/demo", Some(&token)).await;
    assert_eq!(project.status, 200);
    assert_eq!(
        project.header("x-ratelimit-remaining").as_deref(),
        Some("9")
    );
    let auth = format!("Bearer {token}");
    let elsewhere = c
        .send(
            "GET",
            LIST,
            &[("authorization", &auth), ("x-forwarded-for", "10.1.2.3")],
            None,
        )
        .await;
    assert_eq!(elsewhere.status, 200);
    assert_eq!(
        elsewhere.header("x-ratelimit-remaining").as_deref(),
        Some("9")
    );

    // Refused authentications are answered before the limit and carry no
    // rate-limit headers; /api/status is not limited.
    let anonymous = c.get(LIST, None).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("x-ratelimit-limit"), None);
    let forged = c.get(LIST, Some("not-a-token")).await;
    assert_eq!(forged.status, 403);
    for _ in 0..12 {
        let status = c.get("/api/status", None).await;
        assert_eq!(status.status, 200);
        assert_eq!(status.header("x-ratelimit-limit"), None);
    }

    let stats = c.admin("GET", "/admin/stats", None).await.json();
    assert_eq!(
        stats["requests"]["GET /api/v3/secrets/raw"],
        json!({"200": 11, "429": 2, "401": 1, "403": 1}),
        "{stats}"
    );
    assert_eq!(
        stats["rateLimited"],
        json!({"GET /api/v3/secrets/raw": 2}),
        "{stats}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_sets_and_lifts_limits() {
    let server = start(demo_seed(), None).await;
    let c = Client::new(server.addr());
    let token = c.login("op-client", "op-secret").await;
    // Off by default.
    let free = c.get(LIST, Some(&token)).await;
    assert_eq!(free.status, 200);
    assert_eq!(free.header("x-ratelimit-limit"), None);
    assert_eq!(
        c.admin("GET", "/admin/ratelimit", None).await.json(),
        json!({"limits": null})
    );

    // Per category; `perMinute` fills the others.
    let set = c
        .admin(
            "POST",
            "/admin/ratelimit",
            Some(&json!({"perMinute": 5, "secrets": 2})),
        )
        .await;
    assert_eq!(set.status, 200);
    assert_eq!(
        set.json(),
        json!({"limits": {"secrets": 2, "read": 5, "write": 5}})
    );
    assert_eq!(c.get(LIST, Some(&token)).await.status, 200);
    assert_eq!(c.get(LIST, Some(&token)).await.status, 200);
    assert_eq!(c.get(LIST, Some(&token)).await.status, 429);
    let read = c.get("/api/v2/workspace/demo", Some(&token)).await;
    assert_eq!(read.header("x-ratelimit-limit").as_deref(), Some("5"));
    let login = c
        .json(
            "POST",
            "/api/v1/auth/universal-auth/login",
            None,
            &json!({"clientId": "op-client", "clientSecret": "wrong"}),
        )
        .await;
    assert_eq!(login.status, 401);
    assert_eq!(login.header("x-ratelimit-remaining").as_deref(), Some("4"));

    // Setting limits starts every window again.
    c.admin("POST", "/admin/ratelimit", Some(&json!({"secrets": 2})))
        .await;
    assert_eq!(c.get(LIST, Some(&token)).await.status, 200);
    let unlimited = c.get("/api/v2/workspace/demo", Some(&token)).await;
    assert_eq!(unlimited.header("x-ratelimit-limit"), None);

    // Bad specs.
    for bad in [
        json!({"perMinute": 0}),
        json!({"perMinute": -1}),
        json!({"burst": 3}),
    ] {
        let r = c.admin("POST", "/admin/ratelimit", Some(&bad)).await;
        assert_eq!(r.status, 400, "{bad}");
    }

    // Lifted.
    let off = c.admin("DELETE", "/admin/ratelimit", None).await;
    assert_eq!(off.json(), json!({"limits": null}));
    for _ in 0..3 {
        let r = c.get(LIST, Some(&token)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), None);
    }
    server.shutdown().await;
}
