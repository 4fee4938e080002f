//! Property-based fuzzing of what the KMS sends: every response body the
//! client parses (random bytes, random JSON in the API's vocabulary, and the
//! recorded fixtures with parts replaced), the `Retry-After` and error
//! envelopes, and the event stream in random chunks. Nothing panics; the
//! event-stream parser holds at most one line plus one chunk. Runs on
//! stable Rust with proptest: `FUZZ_CASES` cases (256 by default, as in CI;
//! see docs/testing.md for a long run).

use proptest::prelude::*;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};

use super::client::{Reply, api_error, parse, retry_after};
use super::events::{MAX_LINE, SseParser};
use super::model::{
    FoldersBody, GetSecretResponse, ListSecretsResponse, LoginResponse, Project, WorkspaceBody,
    merge_list,
};

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Names the KMS's answers use, so random objects look like answers.
const KEYS: &[&str] = &[
    "secrets",
    "imports",
    "secret",
    "secretKey",
    "secretValue",
    "secretPath",
    "environment",
    "folderId",
    "version",
    "type",
    "accessToken",
    "expiresIn",
    "accessTokenMaxTTL",
    "tokenType",
    "statusCode",
    "message",
    "error",
    "id",
    "slug",
    "name",
    "environments",
    "workspace",
    "folders",
    "lease",
    "data",
    "expireAt",
    "dynamicSecret",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,16}".prop_map(Value::String),
        Just(json!("/")),
        Just(json!("dev")),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned),
                    ".{0,6}"
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The recorded responses of a real server.
fn fixtures() -> Vec<Value> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("devserver/tests/fixtures/kms-api");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("fixtures") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) == Some("json") {
            let v: Value =
                serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("JSON");
            out.push(v["response"]["body"].clone());
        }
    }
    out
}

/// Replace the node at a random position of `v` (walk index `at`).
fn mutate(v: &mut Value, at: &mut usize, with: &Value) -> bool {
    if *at == 0 {
        *v = with.clone();
        return true;
    }
    *at -= 1;
    match v {
        Value::Array(items) => items.iter_mut().any(|i| mutate(i, at, with)),
        Value::Object(map) => map.values_mut().any(|i| mutate(i, at, with)),
        _ => false,
    }
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let fixtures = fixtures();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        (prop::sample::select(fixtures), 0usize..64, json_value()).prop_map(
            |(mut f, mut at, with)| {
                mutate(&mut f, &mut at, &with);
                serde_json::to_vec(&f).unwrap_or_default()
            }
        ),
    ]
}

fn reply(status: u16, retry: Option<&str>, body: Vec<u8>) -> Reply {
    let mut headers = HeaderMap::new();
    if let Some(r) = retry.and_then(|r| HeaderValue::from_str(r).ok()) {
        headers.insert(RETRY_AFTER, r);
    }
    Reply {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
        headers,
        body: body.into(),
        held: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn fuzz_kms_answers_are_parsed_or_refused_never_panic(
        status in prop::sample::select(vec![200u16, 201, 304, 400, 401, 403, 404, 422, 429, 500, 503]),
        retry in prop::option::of(prop_oneof![".{0,8}", "[0-9]{1,12}"]),
        body in body(),
        path in prop_oneof![Just("/".to_owned()), "/[a-z/]{0,12}"],
    ) {
        let r = reply(status, retry.as_deref(), body);
        let route = "GET /api/v3/secrets/raw";
        if let Ok(list) = parse::<ListSecretsResponse>(route, &r) {
            let n = list.secrets.len() + list.imports.iter().map(|i| i.secrets.len()).sum::<usize>();
            prop_assert!(merge_list(list, &path).len() <= n);
        }
        let _ = parse::<GetSecretResponse>(route, &r);
        let _ = parse::<LoginResponse>(route, &r);
        let _ = parse::<Project>(route, &r);
        let _ = parse::<WorkspaceBody>(route, &r);
        let _ = parse::<FoldersBody>(route, &r);
        let _ = parse::<Value>(route, &r);
        let wait = retry_after(&r.headers, &r.body);
        prop_assert!(wait >= std::time::Duration::from_secs(1) && wait <= std::time::Duration::from_secs(600));
        if !r.status.is_success() {
            let e = api_error(route, &r);
            // Messages are bounded, whatever the server wrote.
            prop_assert!(e.to_string().len() < 1024, "{} bytes", e.to_string().len());
        }
    }

    #[test]
    fn fuzz_event_streams_are_parsed_in_bounded_memory(
        chunks in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                prop::collection::vec(prop::sample::select(b"event:data:ping\r\n :1x".to_vec()), 0..64),
                Just(b"event: secret:update\ndata: {}\n\n".to_vec()),
                Just(vec![b'x'; 3000]),
            ],
            0..40,
        ),
    ) {
        let mut parser = SseParser::default();
        let mut received = 0usize;
        'feed: for chunk in &chunks {
            parser.push(chunk);
            received += chunk.len();
            loop {
                match parser.next_message() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // An over-long line ends the stream.
                    Err(_) => break 'feed,
                }
            }
            prop_assert!(parser.buffered() <= MAX_LINE + chunk.len(), "{} buffered", parser.buffered());
        }
        prop_assert!(parser.buffered() <= received);
    }

    #[test]
    fn fuzz_a_line_without_end_is_refused(extra in 1usize..4096) {
        let mut parser = SseParser::default();
        parser.push(&vec![b'a'; MAX_LINE + extra]);
        prop_assert!(parser.next_message().is_err());
    }
}
