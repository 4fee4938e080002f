//! Project events: what a commit changed, announced to the server-sent
//! event streams of `POST /api/v1/events/subscribe/project-events`.
//!
//! A commit that creates, updates or deletes secrets announces one
//! `secret:create`, `secret:update` or `secret:delete` event per folder with
//! the keys it touched; every folder that imports a changed folder (directly
//! or through other imports) gets a `secret:import-mutation` event, as does a
//! folder whose imports change. Changes made through the admin API are
//! announced too; the seed is not.
//!
//! A stream sends each event whose type it registered and whose environment
//! and folder match the registration's conditions (`secretPath` is a glob:
//! `/app/**` is `/app` and every folder below it; a path without wildcards is
//! that folder only), and which the subscriber may read. It sends
//! `event: ping` at a fixed interval, ends after an hour, and ends when the
//! server stops. An actor may keep at most five streams open per project.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, Interval, interval_at};

use crate::clock::now_ms;
use crate::errors::ApiError;
use crate::model::Secret;
use crate::scope::glob_matches;
use crate::store::{Change, Kind, Record, State, Tx};

/// Most streams an actor may keep open on one project.
pub(crate) const MAX_STREAMS: usize = 5;
/// How long a stream stays open at most.
const STREAM_LIFETIME: Duration = Duration::from_secs(3600);
/// The event names a registration may use.
pub(crate) const EVENT_NAMES: &[&str] = &[
    "secret:create",
    "secret:update",
    "secret:delete",
    "secret:import-mutation",
];

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Create,
    Update,
    Delete,
    ImportMutation,
}

impl EventKind {
    /// The event name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Create => "secret:create",
            EventKind::Update => "secret:update",
            EventKind::Delete => "secret:delete",
            EventKind::ImportMutation => "secret:import-mutation",
        }
    }
}

/// A change of one folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProjectEvent {
    pub kind: EventKind,
    pub project_id: String,
    pub environment: String,
    pub path: String,
    /// The secret keys (empty for an import mutation).
    pub keys: Vec<String>,
}

/// The events of a transaction, computed from the state before it applies.
pub(crate) fn of_changes(st: &State, tx: &Tx) -> Vec<ProjectEvent> {
    let mut out: Vec<ProjectEvent> = Vec::new();
    let mut push = |kind: EventKind, s: &Secret| match out.iter_mut().find(|e| {
        e.kind == kind
            && e.project_id == s.project_id
            && e.environment == s.environment
            && e.path == s.path
    }) {
        Some(e) => e.keys.push(s.key.clone()),
        None => out.push(ProjectEvent {
            kind,
            project_id: s.project_id.clone(),
            environment: s.environment.clone(),
            path: s.path.clone(),
            keys: vec![s.key.clone()],
        }),
    };
    let mut import_folders = Vec::new();
    for change in tx.changes() {
        match change {
            Change::Put(record) => match record.as_ref() {
                Record::Secret(s) => {
                    let kind = if st.secrets.contains_key(&s.id) {
                        EventKind::Update
                    } else {
                        EventKind::Create
                    };
                    push(kind, s);
                }
                Record::Import(i) => {
                    import_folders.push((
                        i.project_id.clone(),
                        i.environment.clone(),
                        i.path.clone(),
                    ));
                }
                _ => {}
            },
            Change::Delete(Kind::Secret, id) => {
                if let Some(s) = st.secrets.get(id) {
                    push(EventKind::Delete, s);
                }
            }
            Change::Delete(Kind::Import, id) => {
                if let Some(i) = st.imports.get(id) {
                    import_folders.push((
                        i.project_id.clone(),
                        i.environment.clone(),
                        i.path.clone(),
                    ));
                }
            }
            Change::Delete(..) => {}
        }
    }
    // Folders importing a changed folder, transitively.
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut queue: Vec<(String, String, String)> = out
        .iter()
        .map(|e| (e.project_id.clone(), e.environment.clone(), e.path.clone()))
        .collect();
    for folder in import_folders {
        if seen.insert(folder.clone()) {
            queue.push(folder.clone());
            out.push(import_mutation(folder));
        }
    }
    while let Some((project, env, path)) = queue.pop() {
        for i in st.imports.values().filter(|i| {
            i.project_id == project && i.import_environment == env && i.import_path == path
        }) {
            let importer = (i.project_id.clone(), i.environment.clone(), i.path.clone());
            if seen.insert(importer.clone()) {
                queue.push(importer.clone());
                out.push(import_mutation(importer));
            }
        }
    }
    out
}

fn import_mutation((project_id, environment, path): (String, String, String)) -> ProjectEvent {
    ProjectEvent {
        kind: EventKind::ImportMutation,
        project_id,
        environment,
        path,
        keys: Vec::new(),
    }
}

/// One registration of a subscription.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub event: String,
    /// Environment slug; any when absent.
    pub environment: Option<String>,
    /// Folder glob.
    pub path: String,
}

impl Registration {
    fn matches(&self, e: &ProjectEvent) -> bool {
        self.event == e.kind.name()
            && self
                .environment
                .as_ref()
                .is_none_or(|env| *env == e.environment)
            && glob_matches(&self.path, &e.path)
    }
}

/// Who may see what on a stream: decided once, when it opens.
pub(crate) type Visibility = Box<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// The open streams, counted per project and actor, and the switch that
/// ends them all at shutdown.
#[derive(Debug)]
pub(crate) struct Streams {
    open: Arc<Mutex<HashMap<(String, String), usize>>>,
    closed: watch::Sender<bool>,
    ping: Duration,
}

/// A place among the open streams, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    open: Arc<Mutex<HashMap<(String, String), usize>>>,
    key: (String, String),
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

impl Streams {
    /// Streams that ping every `ping`.
    pub fn new(ping: Duration) -> Streams {
        Streams {
            open: Arc::default(),
            closed: watch::channel(false).0,
            ping: ping.max(Duration::from_millis(10)),
        }
    }

    /// Take a place for a new stream of `actor` on `project`, or refuse
    /// with 429 when it has the most it may have.
    pub fn open(&self, project: &str, actor: &str) -> Result<Slot, ApiError> {
        let key = (project.to_owned(), actor.to_owned());
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(key.clone()).or_default();
        if *n >= MAX_STREAMS {
            return Err(ApiError::too_many_streams());
        }
        *n += 1;
        Ok(Slot {
            open: self.open.clone(),
            key,
        })
    }

    /// End every stream (at shutdown).
    pub fn close_all(&self) {
        let _ = self.closed.send(true);
    }

    /// The `text/event-stream` response of a subscription.
    pub fn response(
        &self,
        project_id: String,
        registrations: Vec<Registration>,
        may_read: Visibility,
        events: broadcast::Receiver<Arc<ProjectEvent>>,
        slot: Slot,
    ) -> Response {
        let now = Instant::now();
        let sub = Subscriber {
            project_id,
            registrations,
            may_read,
            events,
            ping: interval_at(now + self.ping, self.ping),
            closed: self.closed.subscribe(),
            deadline: now + STREAM_LIFETIME,
            _slot: slot,
        };
        let stream = futures_util::stream::unfold(sub, |mut sub| async move {
            let chunk = sub.next_chunk().await?;
            Some((Ok::<_, Infallible>(chunk), sub))
        });
        let mut resp = Response::new(Body::from_stream(stream));
        *resp.status_mut() = StatusCode::OK;
        let headers = resp.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        resp
    }
}

/// The state of one stream.
struct Subscriber {
    project_id: String,
    registrations: Vec<Registration>,
    may_read: Visibility,
    events: broadcast::Receiver<Arc<ProjectEvent>>,
    ping: Interval,
    closed: watch::Receiver<bool>,
    deadline: Instant,
    _slot: Slot,
}

impl Subscriber {
    /// The next bytes to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if *self.closed.borrow() {
                return None;
            }
            tokio::select! {
                () = tokio::time::sleep_until(self.deadline) => return None,
                changed = self.closed.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = self.ping.tick() => return Some(Bytes::from_static(b"event: ping\n\n")),
                received = self.events.recv() => match received {
                    Ok(event) => {
                        if let Some(chunk) = self.render(&event) {
                            return Some(chunk);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "an event stream fell behind; events were dropped");
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    }

    /// The SSE message of an event, if this stream wants it.
    fn render(&self, e: &ProjectEvent) -> Option<Bytes> {
        if e.project_id != self.project_id
            || !self.registrations.iter().any(|r| r.matches(e))
            || !(self.may_read)(&e.environment, &e.path)
        {
            return None;
        }
        let payload = if e.kind == EventKind::ImportMutation {
            Payload::Folder(FolderOut {
                environment: &e.environment,
                secret_path: &e.path,
            })
        } else {
            Payload::Keys(
                e.keys
                    .iter()
                    .map(|k| KeyOut {
                        environment: &e.environment,
                        secret_path: &e.path,
                        secret_keys: k,
                    })
                    .collect(),
            )
        };
        let data = MessageOut {
            kind: "secret-manager",
            data: DataOut {
                event_type: e.kind.name(),
                payload,
            },
        };
        let json = serde_json::to_string(&data).ok()?;
        Some(Bytes::from(format!(
            "id: {}\nevent: {}\ndata: {json}\n\n",
            now_ms(),
            e.kind.name()
        )))
    }
}

#[derive(Serialize)]
struct MessageOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    data: DataOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DataOut<'a> {
    event_type: &'static str,
    payload: Payload<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    Keys(Vec<KeyOut<'a>>),
    Folder(FolderOut<'a>),
}

/// One changed key. The real server names the field `secretKeys` although
/// it holds one key.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyOut<'a> {
    environment: &'a str,
    secret_path: &'a str,
    secret_keys: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FolderOut<'a> {
    environment: &'a str,
    secret_path: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Import;

    fn secret(id: &str, path: &str, key: &str) -> Secret {
        Secret {
            id: id.into(),
            project_id: "p".into(),
            environment: "dev".into(),
            path: path.into(),
            key: key.into(),
            value: "v".into(),
            comment: String::new(),
            version: 1,
            skip_multiline_encoding: false,
            reminder_note: None,
            reminder_repeat_days: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn import(id: &str, path: &str, from: &str) -> Import {
        Import {
            id: id.into(),
            project_id: "p".into(),
            environment: "dev".into(),
            path: path.into(),
            position: 0,
            import_environment: "dev".into(),
            import_path: from.into(),
        }
    }

    #[test]
    fn changes_become_events_with_import_mutations() {
        let mut st = State::default();
        let old = secret("1", "/backend", "A");
        st.secrets.insert(old.id.clone(), old.clone());
        st.secrets
            .insert("2".into(), secret("2", "/backend", "GONE"));
        // / imports /backend, /top imports /.
        st.imports
            .insert("i1".into(), import("i1", "/", "/backend"));
        st.imports.insert("i2".into(), import("i2", "/top", "/"));
        let mut tx = Tx::default();
        tx.put(Record::Secret(Secret {
            value: "w".into(),
            ..old
        }));
        tx.put(Record::Secret(secret("3", "/backend", "B")));
        tx.put(Record::Secret(secret("4", "/backend", "C")));
        tx.delete(Kind::Secret, "2");
        let events = of_changes(&st, &tx);
        let summary: Vec<(&str, &str, Vec<&str>)> = events
            .iter()
            .map(|e| {
                (
                    e.kind.name(),
                    e.path.as_str(),
                    e.keys.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("secret:update", "/backend", vec!["A"]),
                ("secret:create", "/backend", vec!["B", "C"]),
                ("secret:delete", "/backend", vec!["GONE"]),
                ("secret:import-mutation", "/", vec![]),
                ("secret:import-mutation", "/top", vec![]),
            ]
        );
    }

    #[test]
    fn registrations_match_by_type_environment_and_glob() {
        let e = ProjectEvent {
            kind: EventKind::Update,
            project_id: "p".into(),
            environment: "dev".into(),
            path: "/backend/db".into(),
            keys: vec!["K".into()],
        };
        let reg = |event: &str, env: Option<&str>, path: &str| Registration {
            event: event.into(),
            environment: env.map(str::to_owned),
            path: path.into(),
        };
        assert!(reg("secret:update", Some("dev"), "/backend/**").matches(&e));
        assert!(reg("secret:update", None, "/**").matches(&e));
        assert!(reg("secret:update", Some("dev"), "/backend/db").matches(&e));
        assert!(!reg("secret:update", Some("dev"), "/backend").matches(&e));
        assert!(!reg("secret:update", Some("prod"), "/**").matches(&e));
        assert!(!reg("secret:create", Some("dev"), "/**").matches(&e));
    }

    #[tokio::test]
    async fn streams_are_counted_and_given_back() {
        let streams = Streams::new(Duration::from_secs(15));
        let slots: Vec<Slot> = (0..MAX_STREAMS)
            .map(|_| streams.open("p", "a").expect("slot"))
            .collect();
        assert!(streams.open("p", "a").is_err());
        assert!(streams.open("p", "b").is_ok());
        assert!(streams.open("q", "a").is_ok());
        drop(slots);
        assert!(streams.open("p", "a").is_ok());
    }
}
