//! Instant updates: one event stream per (identity, project, environment,
//! path), shared by every KmsSecret of that scope with `instantUpdates`. An
//! event queues the scope's resources at once, in the work queue's lane of
//! changes (ahead of resyncs; their next fetch takes only an answer whose
//! request started after the event); every time a stream
//! opens (the first time too) it queues them once, since a change made
//! before it was open sent no event; a resource that joins a stream that is
//! already open takes no answer from before the stream's last event either; a lost stream reconnects with backoff (1 s doubling to 30 s,
//! jittered); a stream silent for two minutes (no ping) is reopened. When the
//! KMS says the feature is not available (plan, permission, unknown route),
//! the scope falls back to polling and the resources say so.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::key::ObjectKey;
use super::queue::Queue;
use crate::kms::events::{Message, Subscription, permanent};
use crate::kms::flight::SingleFlight;
use crate::kms::{Identity, IdentityKey, Kms, ProjectRef, Scope};
use crate::sharding::Ownership;

type Key = (IdentityKey, Subscription);

/// The state of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamState {
    /// A stream this replica has just started: its first connection is
    /// being made. What a resource's status said about instant updates
    /// (before a restart or a hand-over) stands until it opens or fails.
    Opening,
    /// Connecting or reconnecting.
    Connecting,
    /// Open.
    Open,
    /// The KMS does not offer it; polling only.
    Unavailable(String),
}

type Subscribers = Arc<Mutex<HashSet<ObjectKey>>>;

/// Why a stream queued a subscriber to check its folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Nudge {
    /// The stream opened: a change may have been missed, most likely none
    /// was.
    Opened,
    /// A change event.
    Event,
}

type Fresh = Arc<Mutex<HashMap<ObjectKey, Nudge>>>;

/// Note `nudge` for `key`; an event outranks an opening.
fn nudge(fresh: &mut HashMap<ObjectKey, Nudge>, key: ObjectKey, nudge: Nudge) {
    let n = fresh.entry(key).or_insert(nudge);
    *n = (*n).max(nudge);
}

/// When a stream last queued its subscribers (an event, or its opening).
type Heard = Arc<Mutex<Option<Instant>>>;

struct Entry {
    subscribers: Subscribers,
    state: Arc<watch::Sender<StreamState>>,
    heard: Heard,
    task: JoinHandle<()>,
}

/// The streams and who listens to them.
pub struct InstantUpdates {
    kms: Arc<Kms>,
    queue: Arc<Queue<ObjectKey>>,
    gate: Arc<dyn Ownership>,
    streams: Mutex<HashMap<Key, Entry>>,
    by_resource: Mutex<HashMap<ObjectKey, Key>>,
    fresh: Fresh,
    /// Project ids by (KMS base URL, slug).
    projects: Mutex<HashMap<(String, String), String>>,
    /// Project look-ups in flight, by the same key.
    resolving: SingleFlight<(String, String), Result<String, String>>,
}

/// How long without a ping before a stream is reopened.
const SILENCE: Duration = Duration::from_secs(120);

impl InstantUpdates {
    /// A manager queueing into `queue`.
    pub fn new(kms: Arc<Kms>, queue: Arc<Queue<ObjectKey>>, gate: Arc<dyn Ownership>) -> Self {
        Self {
            kms,
            queue,
            gate,
            streams: Mutex::new(HashMap::new()),
            by_resource: Mutex::new(HashMap::new()),
            fresh: Fresh::default(),
            projects: Mutex::new(HashMap::new()),
            resolving: SingleFlight::default(),
        }
    }

    /// Make sure `key` listens to the events of `scope` (resolving a project
    /// slug to its id once). Returns the stream's state.
    pub async fn ensure(&self, key: &ObjectKey, identity: &Identity, scope: &Scope) -> StreamState {
        let project_id = match &scope.project {
            ProjectRef::Id(id) => id.clone(),
            ProjectRef::OfServiceToken => {
                self.unregister(key);
                return StreamState::Unavailable(
                    "service tokens cannot subscribe to change events; polling only".to_owned(),
                );
            }
            ProjectRef::Slug(slug) => {
                let cache_key = (identity.endpoint.base.clone(), slug.clone());
                let known = self
                    .projects
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&cache_key)
                    .cloned();
                let resolved = match known {
                    Some(id) => Ok(id),
                    None => self.resolve(identity, slug, cache_key).await,
                };
                match resolved {
                    Ok(id) => id,
                    Err(e) => {
                        tracing::debug!(error = %e, "could not resolve the project for instant updates");
                        return StreamState::Connecting;
                    }
                }
            }
        };
        self.register(key, identity, subscription(project_id, scope))
    }

    /// Look up the id of project `slug` and remember it. Resources that
    /// start listening together (a first sync, a gained shard) share one
    /// look-up; one that shared a failed look-up (another identity's, which
    /// may lack access) makes its own.
    async fn resolve(
        &self,
        identity: &Identity,
        slug: &str,
        cache_key: (String, String),
    ) -> Result<String, String> {
        let lookup = || async {
            self.kms
                .project_id(identity, slug)
                .await
                .map_err(|e| e.to_string())
        };
        // A project's id does not change: any look-up in flight will do,
        // however early it started.
        let any = Instant::now()
            .checked_sub(Duration::from_secs(3600))
            .unwrap_or_else(Instant::now);
        let shared = self.resolving.run(cache_key.clone(), any, lookup).await;
        let id = match shared.value {
            Err(_) if shared.shared => lookup().await?,
            other => other?,
        };
        self.projects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cache_key, id.clone());
        Ok(id)
    }

    /// The state channel of the stream `key` listens to, if any.
    fn state_channel(&self, key: &ObjectKey) -> Option<Arc<watch::Sender<StreamState>>> {
        let stream_key = self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()?;
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        Some(streams.get(&stream_key)?.state.clone())
    }

    /// The state of the stream `key` listens to, if any.
    pub fn state_of(&self, key: &ObjectKey) -> Option<StreamState> {
        Some(self.state_channel(key)?.borrow().clone())
    }

    /// Wait until the stream `key` listens to has made its first
    /// connection (or failed it), at most `within`: its state then. A
    /// resource's first sync waits for it, so that its first status says
    /// whether it listens, instead of `Connecting` followed by a second
    /// write a moment later.
    pub async fn first_connection(&self, key: &ObjectKey, within: Duration) -> Option<StreamState> {
        let mut changes = self.state_channel(key)?.subscribe();
        let _ =
            tokio::time::timeout(within, changes.wait_for(|s| *s != StreamState::Opening)).await;
        let state = changes.borrow().clone();
        Some(state)
    }

    /// The oldest start an answer for `key` may have had and still be
    /// used: no older than `share`, and not before its stream last queued
    /// its subscribers. A resource that joins an open stream after an event
    /// was heard (and so was not queued by it) would otherwise be served an
    /// answer from before that change, and hear of it no more.
    pub fn not_before(&self, key: &ObjectKey, share: Duration) -> Instant {
        let now = Instant::now();
        let window = now.checked_sub(share).unwrap_or(now);
        let heard = self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
            .and_then(|stream_key| {
                let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
                let entry = streams.get(&stream_key)?;
                *entry.heard.lock().unwrap_or_else(|e| e.into_inner())
            });
        heard.map_or(window, |h| h.max(window))
    }

    /// Whether `key` listens to a stream.
    pub fn is_registered(&self, key: &ObjectKey) -> bool {
        self.by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// Listen for `key` on `sub` with `identity` (replacing what it listened
    /// to before). Returns the stream's current state.
    fn register(&self, key: &ObjectKey, identity: &Identity, sub: Subscription) -> StreamState {
        let stream_key = (identity.key(), sub.clone());
        let previous = self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), stream_key.clone());
        if let Some(prev) = previous.filter(|p| *p != stream_key) {
            self.leave(key, &prev);
        }
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let entry = streams.entry(stream_key).or_insert_with(|| {
            let state = Arc::new(watch::channel(StreamState::Opening).0);
            let subscribers: Subscribers = Arc::default();
            let heard: Heard = Arc::default();
            let task = tokio::spawn(run(
                self.kms.clone(),
                identity.clone(),
                sub,
                state.clone(),
                Notify {
                    queue: self.queue.clone(),
                    gate: self.gate.clone(),
                    fresh: self.fresh.clone(),
                    subscribers: subscribers.clone(),
                    heard: heard.clone(),
                },
            ));
            Entry {
                subscribers,
                state,
                heard,
                task,
            }
        });
        entry
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone());
        entry.state.borrow().clone()
    }

    fn leave(&self, key: &ObjectKey, stream_key: &Key) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = streams.get_mut(stream_key) {
            let empty = {
                let mut subscribers = entry.subscribers.lock().unwrap_or_else(|e| e.into_inner());
                subscribers.remove(key);
                subscribers.is_empty()
            };
            if empty && let Some(entry) = streams.remove(stream_key) {
                entry.task.abort();
            }
        }
    }

    /// Stop listening for `key`.
    pub fn unregister(&self, key: &ObjectKey) {
        let previous = self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if let Some(prev) = previous {
            self.leave(key, &prev);
        }
        self.fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Stop listening for every resource of a lost shard.
    pub fn drop_shard(&self, shard: u32) {
        let keys: Vec<ObjectKey> = self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .filter(|k| self.gate.shard_of(&k.namespace) == shard)
            .cloned()
            .collect();
        for k in keys {
            self.unregister(&k);
        }
    }

    /// Mark `key` as having an event (or an opening) to fetch again (its
    /// sync failed after taking it), if it still listens.
    pub fn mark_fresh(&self, key: &ObjectKey, why: Nudge) {
        if self.is_registered(key) {
            nudge(
                &mut self.fresh.lock().unwrap_or_else(|e| e.into_inner()),
                key.clone(),
                why,
            );
        }
    }

    /// Whether an event arrived for `key`, or its stream opened, since its
    /// last fetch (and clear it).
    pub fn take_fresh(&self, key: &ObjectKey) -> Option<Nudge> {
        self.fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }
}

/// One stream's task: open, read, notify the listeners, reopen with backoff
/// until the KMS says the feature is not available.
async fn run(
    kms: Arc<Kms>,
    identity: Identity,
    sub: Subscription,
    state: Arc<watch::Sender<StreamState>>,
    notify: Notify,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let set = |s: StreamState| {
            state.send_replace(s);
        };
        match kms.subscribe(&identity, &sub).await {
            Ok(mut stream) => {
                set(StreamState::Open);
                backoff = Duration::from_secs(1);
                tracing::debug!(project = %sub.project_id, path = %sub.path, "instant-update stream open");
                // A change made between a subscriber's last fetch and this
                // moment sent no event to anyone: every open (the first one
                // too) has the subscribers check once, conditionally.
                notify.notify(false);
                let mut last = Instant::now();
                loop {
                    let next = tokio::time::timeout_at(last + SILENCE, stream.next()).await;
                    match next {
                        Ok(Ok(Some(Message::Ping))) => last = Instant::now(),
                        Ok(Ok(Some(Message::Change(event)))) => {
                            last = Instant::now();
                            tracing::debug!(%event, path = %sub.path, "instant update");
                            notify.notify(true);
                        }
                        Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
                    }
                }
                // Events missed while it is down are caught when it reopens.
                set(StreamState::Connecting);
            }
            Err(e) if permanent(&e) => {
                tracing::warn!(error = %e, path = %sub.path, "instant updates are not available; polling only");
                set(StreamState::Unavailable(e.to_string()));
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "instant-update stream failed; retrying");
                // The first connection failed: the subscribers say so
                // (they kept what their status said while it was made) and
                // poll meanwhile.
                let first = *state.borrow() == StreamState::Opening;
                if first {
                    set(StreamState::Connecting);
                    notify.notify(false);
                }
            }
        }
        tokio::time::sleep(backoff.mul_f64(0.8 + 0.4 * fastrand::f64())).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// The subscription of a scope: its folder, or everything under it when
/// recursive.
fn subscription(project_id: String, scope: &Scope) -> Subscription {
    let path = if scope.recursive && scope.secret_name.is_none() {
        format!("{}/**", scope.path.trim_end_matches('/'))
    } else {
        scope.path.clone()
    };
    Subscription {
        project_id,
        environment: scope.environment.clone(),
        path,
    }
}

/// What a stream's task needs to queue its subscribers.
struct Notify {
    queue: Arc<Queue<ObjectKey>>,
    gate: Arc<dyn Ownership>,
    fresh: Fresh,
    subscribers: Subscribers,
    heard: Heard,
}

impl Notify {
    /// Mark every subscriber fresh and queue it now: for an event, in the
    /// lane of changes, ahead of every resync and first sync; when the
    /// stream opens (a change may have been missed, most likely none was),
    /// in line. The instant is set first: a subscriber that joins after the
    /// list below was taken still sees it (and fetches an answer that
    /// started after it).
    fn notify(&self, event: bool) {
        *self.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let keys: Vec<ObjectKey> = self
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        let why = if event { Nudge::Event } else { Nudge::Opened };
        for key in keys {
            nudge(&mut fresh, key.clone(), why);
            let shard = self.gate.shard_of(&key.namespace);
            if event {
                self.queue.add_change(key, shard);
            } else {
                self.queue.add(key, shard);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(path: &str, recursive: bool, secret: Option<&str>) -> Scope {
        Scope {
            project: ProjectRef::Id("p".to_owned()),
            environment: "dev".to_owned(),
            path: path.to_owned(),
            recursive,
            secret_name: secret.map(str::to_owned),
        }
    }

    #[test]
    fn an_event_outranks_an_opening() {
        let key = ObjectKey::new("ns", "a");
        let mut fresh = HashMap::new();
        nudge(&mut fresh, key.clone(), Nudge::Opened);
        assert_eq!(fresh.get(&key), Some(&Nudge::Opened));
        nudge(&mut fresh, key.clone(), Nudge::Event);
        nudge(&mut fresh, key.clone(), Nudge::Opened);
        assert_eq!(fresh.get(&key), Some(&Nudge::Event));
    }

    #[test]
    fn subscription_paths() {
        assert_eq!(
            subscription("p".into(), &scope("/", true, None)).path,
            "/**"
        );
        assert_eq!(
            subscription("p".into(), &scope("/a/b/", true, None)).path,
            "/a/b/**"
        );
        assert_eq!(
            subscription("p".into(), &scope("/a", false, None)).path,
            "/a"
        );
        assert_eq!(
            subscription("p".into(), &scope("/a", true, Some("K"))).path,
            "/a"
        );
        assert_eq!(
            subscription("p".into(), &scope("/a", false, None)).environment,
            "dev"
        );
    }
}
