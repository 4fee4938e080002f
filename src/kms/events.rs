//! The KMS's change notifications: `POST /api/v1/events/subscribe/project-events`
//! answers a server-sent event stream that stays open, with pings and an
//! event per secret change in the registered environment and path.

use std::time::Duration;

use secrecy::ExposeSecret;

use super::auth::Identity;
use super::client::{Kms, api_error_of};
use super::error::KmsError;

const SUBSCRIBE: &str = "POST /api/v1/events/subscribe/project-events";

/// Secret events a subscription registers for.
pub const SECRET_EVENTS: [&str; 4] = [
    "secret:create",
    "secret:update",
    "secret:delete",
    "secret:import-mutation",
];

/// What a subscription is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Subscription {
    /// Project id.
    pub project_id: String,
    /// Environment slug.
    pub environment: String,
    /// Folder path; `/**` appended for a recursive scope.
    pub path: String,
}

/// One message of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A keep-alive.
    Ping,
    /// Something changed in the scope.
    Change(String),
}

/// The longest line of the event stream accepted (a real server's lines are
/// a few hundred bytes); a longer one ends the stream with an error instead
/// of growing the buffer without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// Most of an error body read (enough for the KMS's JSON envelope).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The `text/event-stream` parser: bytes in, messages out. Pure and bounded
/// (a line longer than [`MAX_LINE`] is an error; the data of one event is
/// bounded by the same limit), so it can be fuzzed without a server.
#[derive(Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    data_len: usize,
}

impl SseParser {
    /// Add received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes received and not yet parsed.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// The next complete message, if the buffered bytes hold one.
    pub fn next_message(&mut self) -> Result<Option<Message>, String> {
        loop {
            let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') else {
                if self.buffer.len() > MAX_LINE {
                    return Err(format!("event stream line longer than {MAX_LINE} bytes"));
                }
                return Ok(None);
            };
            if pos > MAX_LINE {
                return Err(format!("event stream line longer than {MAX_LINE} bytes"));
            }
            let raw: Vec<u8> = self.buffer.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&raw);
            let line = text.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if let Some(m) = self.dispatch() {
                    return Ok(Some(m));
                }
                continue;
            }
            if line.starts_with(':') {
                // A comment: servers send these as keep-alives too.
                return Ok(Some(Message::Ping));
            }
            let (field, value) = line
                .split_once(':')
                .map_or((line, ""), |(f, v)| (f, v.trim_start()));
            match field {
                "event" => self.event = Some(value.to_owned()),
                "data" => {
                    self.data_len += value.len();
                    if self.data_len > MAX_LINE {
                        return Err(format!("event stream event larger than {MAX_LINE} bytes"));
                    }
                    self.data.push(value.to_owned());
                }
                _ => {}
            }
        }
    }

    fn dispatch(&mut self) -> Option<Message> {
        let event = self.event.take();
        let data = std::mem::take(&mut self.data).join("\n");
        self.data_len = 0;
        match event.as_deref() {
            None if data.is_empty() => None,
            Some("ping") => Some(Message::Ping),
            None if data.trim() == "1" => Some(Message::Ping),
            Some(name) => Some(Message::Change(name.to_owned())),
            None => Some(Message::Change("message".to_owned())),
        }
    }
}

/// An open event stream.
pub struct EventStream {
    response: reqwest::Response,
    parser: SseParser,
}

impl EventStream {
    /// The next message; `Ok(None)` when the server closed the stream.
    pub async fn next(&mut self) -> Result<Option<Message>, KmsError> {
        let interrupted = |reason: String| KmsError::Transport {
            host: String::new(),
            reason: format!("event stream interrupted: {reason}"),
        };
        loop {
            if let Some(m) = self.parser.next_message().map_err(interrupted)? {
                return Ok(Some(m));
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.parser.push(&bytes),
                Ok(None) => return Ok(None),
                Err(e) => return Err(interrupted(e.to_string())),
            }
        }
    }
}

impl Kms {
    /// The id of a project given its slug.
    pub async fn project_id(&self, identity: &Identity, slug: &str) -> Result<String, KmsError> {
        self.project(identity, &super::ProjectRef::Slug(slug.to_owned()))
            .await
            .map(|p| p.id)
    }

    /// Open an event stream for a subscription.
    pub async fn subscribe(
        &self,
        identity: &Identity,
        sub: &Subscription,
    ) -> Result<EventStream, KmsError> {
        self.check_endpoint(&identity.endpoint)?;
        let client = self.http_client(&identity.endpoint)?;
        let url = format!(
            "{}/v1/events/subscribe/project-events",
            identity.endpoint.base
        );
        let register: Vec<serde_json::Value> = SECRET_EVENTS
            .iter()
            .map(|e| {
                serde_json::json!({"event": e, "conditions": {"secretPath": sub.path, "environmentSlug": sub.environment}})
            })
            .collect();
        let body = serde_json::json!({"projectId": sub.project_id, "register": register});
        let token = self.token(identity).await?;
        let started = tokio::time::Instant::now();
        let response = client
            .post(&url)
            .bearer_auth(token.expose_secret())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .timeout(Duration::from_secs(60 * 60 * 24))
            .json(&body)
            .send()
            .await
            .map_err(|e| super::client::transport_error(&identity.endpoint.origin, &e))?;
        let status = response.status();
        self.record_request(SUBSCRIBE, Some(status.as_u16()), started.elapsed());
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = super::endpoint::read_capped(response, MAX_ERROR_BODY)
                .await
                .unwrap_or_default();
            return Err(api_error_of(SUBSCRIBE, status, &headers, &body));
        }
        Ok(EventStream {
            response,
            parser: SseParser::default(),
        })
    }
}

/// Whether a subscription error is permanent: the feature is not available
/// (plan, permission, unknown route), as opposed to a passing failure.
pub fn permanent(e: &KmsError) -> bool {
    match e {
        KmsError::Api {
            status, message, ..
        } => {
            message.to_ascii_lowercase().contains("plan")
                || matches!(status, 400 | 401 | 403 | 404 | 405)
        }
        _ => false,
    }
}
