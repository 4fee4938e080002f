//! The KMS's change notifications: `POST /api/v1/events/subscribe/project-events`
//! answers a server-sent event stream that stays open, with pings and an
//! event per secret change in the registered environment and path.

use std::time::Duration;

use secrecy::ExposeSecret;
use serde::Deserialize;

use super::client::{Kms, api_error_of, parse};
use super::{Identity, KmsError};

const SUBSCRIBE: &str = "POST /api/v1/events/subscribe/project-events";
const PROJECT: &str = "GET /api/v2/workspace/:slug";

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

/// An open event stream.
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
    event: Option<String>,
    data: Vec<String>,
}

impl EventStream {
    /// The next message; `Ok(None)` when the server closed the stream.
    pub async fn next(&mut self) -> Result<Option<Message>, KmsError> {
        loop {
            if let Some(pos) = self.buffer.find('\n') {
                let line: String = self.buffer.drain(..=pos).collect();
                let line = line.trim_end_matches(['\n', '\r']);
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
                    "data" => self.data.push(value.to_owned()),
                    _ => {}
                }
                continue;
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(None) => return Ok(None),
                Err(e) => {
                    return Err(KmsError::Transport {
                        host: String::new(),
                        reason: format!("event stream interrupted: {e}"),
                    });
                }
            }
        }
    }

    fn dispatch(&mut self) -> Option<Message> {
        let event = self.event.take();
        let data = std::mem::take(&mut self.data).join("\n");
        match event.as_deref() {
            None if data.is_empty() => None,
            Some("ping") => Some(Message::Ping),
            None if data.trim() == "1" => Some(Message::Ping),
            Some(name) => Some(Message::Change(name.to_owned())),
            None => Some(Message::Change("message".to_owned())),
        }
    }
}

#[derive(Deserialize)]
struct ProjectBody {
    id: String,
}

impl Kms {
    /// The id of a project given its slug.
    pub async fn project_id(&self, identity: &Identity, slug: &str) -> Result<String, KmsError> {
        let url = format!(
            "{}/v2/workspace/{}",
            identity.endpoint.base,
            super::client::urlencode(slug)
        );
        self.with_token(identity, |token| {
            let url = url.clone();
            async move {
                let reply = self
                    .send(&identity.endpoint, PROJECT, |c| {
                        c.get(&url).bearer_auth(token.expose_secret())
                    })
                    .await?;
                let body: ProjectBody = parse(PROJECT, &reply)?;
                Ok(body.id)
            }
        })
        .await
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
            .map_err(|e| KmsError::Transport {
                host: identity.endpoint.host.clone(),
                reason: e.to_string(),
            })?;
        let status = response.status();
        self.record_request(SUBSCRIBE, Some(status.as_u16()), started.elapsed());
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = response.bytes().await.unwrap_or_default();
            return Err(api_error_of(SUBSCRIBE, status, &headers, &body));
        }
        Ok(EventStream {
            response,
            buffer: String::new(),
            event: None,
            data: Vec::new(),
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
