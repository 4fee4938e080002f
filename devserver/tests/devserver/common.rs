//! Helpers: start a server in-process, a small HTTP/1.1 client (one
//! connection per request, so a dropped connection is seen as such), and
//! JSON helpers.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use kms_devserver::{Config, Running, SeedSource};
use serde_json::Value;
use tokio::net::TcpStream;

/// The admin token of test servers.
pub const ADMIN: &str = "test-admin-token";

/// The seed of the examples, which the local run uses.
pub fn demo_seed() -> SeedSource {
    SeedSource::File(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/dev-seed.yaml"))
}

/// Start a server on a free port.
pub async fn start(seed: SeedSource, data_dir: Option<&Path>) -> Running {
    start_with(seed, data_dir, Duration::from_secs(60)).await
}

/// Start a server on a free port with a minimum lease TTL.
pub async fn start_with(
    seed: SeedSource,
    data_dir: Option<&Path>,
    min_lease_ttl: Duration,
) -> Running {
    start_config(Config {
        data_dir: data_dir.map(Path::to_path_buf),
        min_lease_ttl,
        ..config(seed)
    })
    .await
}

/// The settings of a test server: a free port, the admin token, `seed`.
pub fn config(seed: SeedSource) -> Config {
    Config {
        addr: "127.0.0.1:0".parse().expect("addr"),
        seed: Some(seed),
        admin_token: Some(ADMIN.to_owned()),
        ..Config::default()
    }
}

/// Start a server with these settings.
pub async fn start_config(config: Config) -> Running {
    kms_devserver::start(config)
        .await
        .expect("dev server starts")
}

/// An answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON (`null` when empty).
    pub fn json(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// A client of one server.
#[derive(Debug, Clone)]
pub struct Client {
    pub addr: SocketAddr,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr }
    }

    /// Send a request; `Err` when the connection closes without an answer.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Resp, String> {
        let stream = TcpStream::connect(self.addr)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Resp {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// Send a request that must be answered.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Resp {
        self.try_send(method, path, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A GET with an optional bearer token.
    pub async fn get(&self, path: &str, token: Option<&str>) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = Vec::new();
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        self.send("GET", path, &headers, None).await
    }

    /// A request with a JSON body and an optional bearer token.
    pub async fn json(&self, method: &str, path: &str, token: Option<&str>, body: &Value) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let bytes = serde_json::to_vec(body).expect("json");
        self.send(method, path, &headers, Some(bytes)).await
    }

    /// A request to the admin API.
    pub async fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> Resp {
        let auth = format!("Bearer {ADMIN}");
        let mut headers = vec![("authorization", auth.as_str())];
        let bytes = body.map(|b| serde_json::to_vec(b).expect("json"));
        if bytes.is_some() {
            headers.push(("content-type", "application/json"));
        }
        self.send(method, path, &headers, bytes).await
    }

    /// Log in with universal auth; the access token.
    pub async fn login(&self, client_id: &str, client_secret: &str) -> String {
        let resp = self
            .json(
                "POST",
                "/api/v1/auth/universal-auth/login",
                None,
                &serde_json::json!({"clientId": client_id, "clientSecret": client_secret}),
            )
            .await;
        assert_eq!(
            resp.status,
            200,
            "login: {}",
            String::from_utf8_lossy(&resp.body)
        );
        resp.json()["accessToken"]
            .as_str()
            .expect("accessToken")
            .to_owned()
    }
}

/// The `ETag` the real server would send for this body.
pub fn etag_of(body: &[u8]) -> String {
    use base64::Engine as _;
    let hash = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, body);
    format!(
        "\"{}\"",
        base64::engine::general_purpose::STANDARD.encode(hash.as_ref())
    )
}

/// Milliseconds since the epoch of an ISO-8601 UTC timestamp with
/// milliseconds, as the server writes them.
pub fn iso_ms(s: &str) -> i64 {
    let num = |a: usize, b: usize| -> i64 { s[a..b].parse().expect("digits") };
    let (y, m, d) = (num(0, 4), num(5, 7), num(8, 10));
    let (hh, mm, ss, ms) = (num(11, 13), num(14, 16), num(17, 19), num(20, 23));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) + ms
}

/// A unique suffix for names made by a test (time and process).
pub fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}{:x}", std::process::id(), nanos % 0xffff_ffff)
}

/// A message of an event stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub event: String,
    pub id: Option<String>,
    pub data: Option<Value>,
}

/// An open `text/event-stream` answer, read message by message.
pub struct EventStream {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    body: hyper::body::Incoming,
    buf: String,
}

impl EventStream {
    /// `POST /api/v1/events/subscribe/project-events` with `body`; the
    /// stream when the server answers 200, else the answer.
    pub async fn open(addr: SocketAddr, token: &str, body: &Value) -> Result<EventStream, Resp> {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::builder()
            .method("POST")
            .uri("/api/v1/events/subscribe/project-events")
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::from(
                serde_json::to_vec(body).expect("json"),
            )))
            .expect("request");
        let resp = sender.send_request(req).await.expect("answer");
        let (parts, body) = resp.into_parts();
        if parts.status != 200 {
            let body = body.collect().await.expect("body").to_bytes();
            return Err(Resp {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
            });
        }
        Ok(EventStream {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
            buf: String::new(),
        })
    }

    /// The next message, or `None` when none comes within `wait` (or the
    /// stream ended).
    pub async fn next(&mut self, wait: Duration) -> Option<Message> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                return Some(parse_message(&raw));
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??
                .ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// The next message that is not a ping.
    pub async fn next_event(&mut self, wait: Duration) -> Option<Message> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self.next(left).await?;
            if m.event != "ping" {
                return Some(m);
            }
        }
    }
}

fn parse_message(raw: &str) -> Message {
    let mut m = Message {
        event: String::new(),
        id: None,
        data: None,
    };
    for line in raw.lines() {
        if let Some(v) = line.strip_prefix("event: ") {
            m.event = v.to_owned();
        } else if let Some(v) = line.strip_prefix("id: ") {
            m.id = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            m.data = Some(serde_json::from_str(v).expect("event data is JSON"));
        }
    }
    m
}
