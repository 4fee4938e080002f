//! Publishing Events (`events.k8s.io/v1`), with kube's [`Event`] and
//! [`Reporter`] types and the series kube's recorder keeps, with one
//! difference: an Event's series is keyed by its note as well. kube's
//! `Recorder` merges every Event of one reason about one object into one
//! series that keeps the first note, so after a folder `/does-not-exist`
//! was fixed and `/backend/nope` broke it again, `kubectl describe` still
//! showed `FolderNotFound … /does-not-exist` with a count of 2. Here a new
//! note starts a new Event, and the same note again counts in its series.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, ResourceExt};

/// How long an Event's series is continued (as kube's recorder does).
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// What makes two Events one series: the object, the reporter, type,
/// action, reason and note.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    regarding: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    type_: &'static str,
    action: String,
    reason: String,
    note: Option<String>,
}

/// Publishes Events about objects; cheap to clone (one cache of series).
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    series: Arc<Mutex<HashMap<Key, K8sEvent>>>,
}

fn type_name(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

impl Recorder {
    /// A recorder that reports as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            series: Arc::default(),
        }
    }

    fn key(ev: &Event, r: &ObjectReference) -> Key {
        Key {
            regarding: (
                r.kind.clone(),
                r.namespace.clone(),
                r.name.clone(),
                r.uid.clone(),
            ),
            type_: type_name(ev.type_),
            action: ev.action.clone(),
            reason: ev.reason.clone(),
            note: ev.note.clone(),
        }
    }

    fn new_event(&self, ev: &Event, r: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = self.reporter.controller.clone();
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(r.clone()),
            related: ev.secondary.clone(),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: r.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    r.name.as_deref().unwrap_or(&controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_instance: Some(self.reporter.instance.clone().unwrap_or(controller.clone())),
            reporting_controller: Some(controller),
            type_: Some(type_name(ev.type_).to_owned()),
            ..K8sEvent::default()
        }
    }

    /// The Event to write for `ev`: a new one, or the next of its series.
    fn next(&self, ev: &Event, r: &ObjectReference, now: Timestamp) -> (Key, K8sEvent) {
        let key = Self::key(ev, r);
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series.retain(|_, e| {
            let last = e
                .series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or(e.event_time.as_ref().map(|t| t.0));
            last.is_none_or(|t| t + SERIES_TTL > now)
        });
        let event = match series.get(&key) {
            Some(e) => {
                let mut e = e.clone();
                e.series = Some(EventSeries {
                    count: e.series.as_ref().map_or(2, |s| s.count + 1),
                    last_observed_time: MicroTime(now),
                });
                e
            }
            None => self.new_event(ev, r, now),
        };
        (key, event)
    }

    /// Publish `ev` about the object `r` (in its namespace, or `default`
    /// for a cluster-scoped object).
    pub async fn publish(&self, ev: &Event, r: &ObjectReference) -> Result<(), kube::Error> {
        let (key, event) = self.next(ev, r, Timestamp::now());
        let ns = r.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), ns);
        if event.series.is_some() {
            let patch = serde_json::json!({"series": event.series});
            events
                .patch(
                    &event.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        } else {
            events.create(&PostParams::default(), &event).await?;
        }
        self.series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, event);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> Recorder {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        Recorder::new(
            Client::try_from(config).unwrap(),
            Reporter {
                controller: "c".into(),
                instance: None,
            },
        )
    }

    fn event(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "FolderNotFound".into(),
            note: Some(note.into()),
            action: "Sync".into(),
            secondary: None,
        }
    }

    fn object() -> ObjectReference {
        ObjectReference {
            kind: Some("KmsSecret".into()),
            namespace: Some("ns".into()),
            name: Some("app".into()),
            uid: Some("u".into()),
            ..ObjectReference::default()
        }
    }

    #[tokio::test]
    async fn a_new_note_starts_a_new_event_and_the_same_note_continues_its_series() {
        let r = recorder();
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        let remember = |key: Key, e: &K8sEvent| {
            r.series.lock().unwrap().insert(key, e.clone());
        };
        let (k, first) = r.next(&event("/does-not-exist"), &object(), t0);
        assert!(first.series.is_none());
        remember(k, &first);
        let t1 = t0 + SignedDuration::from_secs(10);
        let (k, other) = r.next(&event("/backend/nope"), &object(), t1);
        assert!(other.series.is_none(), "a new note is a new Event");
        assert_ne!(other.metadata.name, first.metadata.name);
        assert_eq!(other.note.as_deref(), Some("/backend/nope"));
        remember(k, &other);
        let (_, again) = r.next(&event("/does-not-exist"), &object(), t1);
        assert_eq!(again.metadata.name, first.metadata.name);
        assert_eq!(again.series.as_ref().map(|s| s.count), Some(2));
        // After the series' time, the same note starts afresh.
        let late = t1 + SERIES_TTL + SignedDuration::from_secs(1);
        let (_, fresh) = r.next(&event("/does-not-exist"), &object(), late);
        assert!(fresh.series.is_none());
    }
}
