//! The KmsSecret controller: keep Secrets and ConfigMaps in step with a KMS
//! scope.
//!
//! One reconcile reads down one file per stage (`Controller::sync` in this
//! file is the sequence):
//! 1. **observe** ([`observe`]) the resource and its targets (from the
//!    watched caches; a target that is not cached is read from the API), and
//!    what is known of its last sync;
//! 2. **decide** ([`plan`], pure) what is needed: nothing (not due, targets intact), metadata
//!    only (labels or annotations changed; the targets' own data is reused),
//!    a conditional fetch (due, targets intact: `If-None-Match`), or an
//!    unconditional fetch (a target is missing or drifted, the spec changed,
//!    or nothing is known about the last sync — a `304` cannot rebuild data we
//!    do not keep);
//!    The data and metadata of every target are planned there too;
//! 3. **act** ([`act`]): log in and listen, fetch, render, write what
//!    differs ([`crate::controllers::apply`]), then prune owned targets no
//!    longer listed;
//! 4. **next status** ([`status`], pure): conditions, `observedGeneration`,
//!    `lastSyncTime`, `syncedKeys`, `shard`;
//! 5. **write the status** ([`report`]) in one patch when it changed, and an
//!    Event when `Ready` changes.
//!
//! A failure never empties or deletes a target: the data stays as it was, the
//! conditions say what failed, and the work queue retries with backoff.

pub mod act;
pub mod observe;
pub mod plan;
pub mod rearm;
pub mod record;
pub mod report;
pub mod status;
pub mod watch;

use self::plan::Planned;
use self::status::{Progress, Synced};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use self::record::SyncRecord;
use super::apply::ensure_owner;
use super::conditions::{self};
use super::context::Context;
use super::error::SyncError;
use super::instant::InstantUpdates;
use super::key::ObjectKey;
use super::queue::Mark;
use super::queue::Queue;
use super::stores::Scoped;
use super::workers::{Action, Job, Reconciler};
use super::written::WrittenStatus;
use crate::api::kms_secret::{KmsSecret, KmsSecretStatus};
use crate::kms::Kms;
use crate::sharding::Ownership;

/// `KmsSecret/<ns>/<name>`.
pub fn owner_id(ns: &str, name: &str) -> String {
    format!("KmsSecret/{ns}/{name}")
}

/// The KmsSecret controller: its cache, queue, instant-update streams and
/// sync records (what every kind shares is in [`Context`]).
pub struct Controller {
    /// Watched KmsSecrets.
    pub store: Scoped<KmsSecret>,
    queue: Arc<Queue<ObjectKey>>,
    /// Instant-update streams of the KmsSecrets that ask for them.
    instant: InstantUpdates,
    records: Mutex<HashMap<String, SyncRecord>>,
    /// The count of global configuration changes at which each resource
    /// (by UID) last resolved its endpoint.
    endpoint_epochs: Mutex<HashMap<String, u64>>,
    /// The statuses it wrote that the watch does not show yet (the watch
    /// drops each as it delivers the write).
    written: Arc<WrittenStatus<KmsSecretStatus>>,
    /// What lets a scheduled resync do without a reconcile.
    tickets: rearm::Tickets,
}

impl Controller {
    /// Reconcile one KmsSecret.
    async fn run(&self, job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
        let (ctx, key, shard, cancel) = (job.ctx, job.key, job.shard, job.cancel);
        if job.mark == Mark::Scheduled
            && let Some(next_due) = self.rearm(ctx, key, cancel).await
        {
            return Ok(Action::RequeueAt(next_due));
        }
        let Some(cr) = self.store.get(Some(&key.namespace), &key.name) else {
            self.forget(ctx, key);
            return Ok(Action::Done);
        };
        if cr.metadata.deletion_timestamp.is_some() {
            self.strip_legacy_finalizers(ctx, &cr).await?;
            self.forget(ctx, key);
            return Ok(Action::Done);
        }
        // Our last status write may not be in the cache yet (the target's
        // watch event came first): read the resource with it.
        // The store decoded this copy for this reconcile alone.
        let mut cr = Arc::try_unwrap(cr).unwrap_or_else(|shared| (*shared).clone());
        if let Some(written) = self.written_status(&cr) {
            cr.status = Some(written);
        }
        let mut progress = Progress::default();
        let outcome = self.sync(ctx, &cr, shard, cancel, &mut progress).await;
        if let (Some(why), true) = (progress.nudged, outcome.is_err()) {
            // The change event that made this sync due is not spent until a
            // sync succeeds (a write that lost a race must fetch again).
            self.instant.mark_fresh(key, why);
        }
        if matches!(outcome, Err(SyncError::NotOwner)) {
            return Err(SyncError::NotOwner);
        }
        ensure_owner(ctx, shard, cancel)?;
        let ticket = progress.ticket.take();
        self.write_status(ctx, &cr, shard, &outcome, &progress)
            .await?;
        match ticket {
            Some(t) if outcome.is_ok() => self.tickets.issue(key, t),
            _ => self.tickets.revoke(key),
        }
        match outcome {
            Ok(s) => Ok(Action::RequeueAt(s.next_due)),
            Err(e) => Err(e),
        }
    }

    /// One sync: observe the targets, decide what to ask of the KMS, log in and
    /// listen, fetch, render, write what differs, prune, and remember what was
    /// synced (each step below, in that order).
    async fn sync(
        &self,
        ctx: &Context,
        cr: &KmsSecret,
        shard: u32,
        cancel: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<Synced, SyncError> {
        let me = owner_id(&cr.namespace().unwrap_or_default(), &cr.name_any());
        let interval = plan::resync_interval(&cr.spec)?;
        let targets = plan::targets(cr, ctx.settings.allow_cross_namespace_refs)?;
        let observed = self.observe_targets(ctx, cr, &me, &targets).await?;
        let seen = plan::Seen {
            cr,
            interval,
            shard,
            targets: &targets,
            observed: &observed,
        };
        let asked = self.ask(ctx, &seen);
        progress.nudged = asked.nudged;
        let t_login = std::time::Instant::now();
        let (login, stream) = self.login_and_listen(ctx, cr, &asked, progress).await?;
        let t_fetch = std::time::Instant::now();
        let (fetched, etag) = self
            .fetch(ctx, &asked, login.as_ref(), &observed, cancel, progress)
            .await?;
        tracing::debug!(
            resource = %me,
            decision = ?asked.decision,
            login_ms = (t_fetch - t_login).as_millis(),
            fetch_ms = t_fetch.elapsed().as_millis(),
            "KMS steps of a sync timed"
        );
        // Render every target (off the runtime, one budget); plan; apply
        // what differs.
        let rendered = match &fetched {
            Some(secrets) => Some(
                crate::controllers::render::render_targets(
                    (&ctx.renders, &ctx.renderer),
                    &targets,
                    secrets.clone(),
                )
                .await?,
            ),
            None => None,
        };
        let plan = Planned {
            cr,
            me: &me,
            targets: &targets,
            rendered: rendered.as_deref(),
        };
        let seen_targets = self.targets_seen(ctx, &targets, &observed);
        let (desired_all, wrote) = self
            .write_planned(ctx, &plan, observed, shard, cancel)
            .await?;
        self.prune(ctx, cr, &me, &targets, shard, cancel).await?;
        let synced_keys = fetched
            .as_ref()
            .map(|s| s.len() as i64)
            .or_else(|| asked.record.as_ref().map(|r| r.synced_keys));
        let phase = plan::phase_of(cr);
        let (last_sync, next_due) = asked.times(interval, stream.as_ref(), wrote, phase);
        let target_hashes = targets
            .iter()
            .zip(&desired_all)
            .filter_map(|(t, d)| ctx.data_hash(&d.data).map(|h| (t.id(), h)))
            .collect();
        // In step with nothing written: the next scheduled resync may do
        // with the folder's answer alone (`rearm`).
        progress.ticket = match (&login, &etag, seen_targets) {
            (Some((identity, scope)), Some(etag), Some(targets))
                if !wrote && !asked.instant && !asked.forced =>
            {
                Some(rearm::Ticket {
                    uid: cr.uid().unwrap_or_default().into(),
                    shard,
                    version: super::packed::version_of(cr.metadata.resource_version.as_deref()),
                    epoch: asked.epoch,
                    folder: self.tickets.folder(identity, scope),
                    etag: etag.as_str().into(),
                    interval,
                    phase,
                    targets,
                    expires: asked.now + interval * rearm::SERVES,
                })
            }
            _ => None,
        };
        self.set_record(
            ctx,
            &cr.uid().unwrap_or_default(),
            shard,
            SyncRecord {
                generation: asked.generation,
                etag,
                last_sync: last_sync.unwrap_or(asked.now),
                next_due,
                synced_keys: synced_keys.unwrap_or(0),
                target_hashes,
            },
        );
        Ok(Synced {
            last_sync,
            wrote,
            next_due,
            synced_keys,
            targets: targets.len(),
            stream,
        })
    }
}

impl Controller {
    /// The controller of the KmsSecrets in `store`, queued in `queue`.
    pub fn new(
        kms: Arc<Kms>,
        gate: Arc<dyn Ownership>,
        store: Scoped<KmsSecret>,
        queue: Arc<Queue<ObjectKey>>,
        written: Arc<WrittenStatus<KmsSecretStatus>>,
    ) -> Self {
        Self {
            instant: InstantUpdates::new(kms, queue.clone(), gate),
            store,
            queue,
            records: Mutex::new(HashMap::new()),
            endpoint_epochs: Mutex::new(HashMap::new()),
            written,
            tickets: rearm::Tickets::default(),
        }
    }

    /// Whether the endpoint a resource last resolved may be out of date: the
    /// global configuration changed since (`epoch` is the current count of
    /// its changes; the first load makes it 1).
    fn endpoint_stale(&self, cr: &KmsSecret, epoch: u64) -> bool {
        use super::registry::HostApi;
        if !cr.uses_global_config() {
            return false;
        }
        let uid = cr.uid().unwrap_or_default();
        match self
            .endpoint_epochs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uid)
        {
            Some(e) => *e != epoch,
            None => epoch > 1,
        }
    }

    /// A resource resolved its endpoint at `epoch`.
    fn endpoint_resolved(&self, cr: &KmsSecret, epoch: u64) {
        if let Some(uid) = cr.uid() {
            self.endpoint_epochs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid, epoch);
        }
    }

    /// The resource's status as last written by this replica when the
    /// cached copy has not caught up with that write yet (else the cached
    /// copy's status is the freshest).
    fn written_status(&self, cr: &KmsSecret) -> Option<KmsSecretStatus> {
        let meta = &cr.metadata;
        self.written
            .freshest(meta.uid.as_deref()?, meta.resource_version.as_deref()?)
    }

    /// The sync record of an object UID.
    fn record(&self, uid: &str) -> Option<SyncRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// Whether the in-memory sync record of `uid` holds `etag`.
    fn record_holds(&self, uid: &str, etag: &str) -> bool {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .is_some_and(|r| r.etag.as_deref() == Some(etag))
    }

    /// Move the in-memory sync record of `uid` on to a check at
    /// `last_sync`, due again at `next_due`, if it still holds `etag` (in
    /// place: a resync by ticket copies nothing).
    fn move_record_on(&self, uid: &str, etag: &str, last_sync: SystemTime, next_due: SystemTime) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = records.get_mut(uid)
            && r.etag.as_deref() == Some(etag)
        {
            r.last_sync = last_sync;
            r.next_due = next_due;
        }
    }

    /// Store the sync record of an object UID (in memory, and in the
    /// persistent cache when there is one). The targets' data hashes go to
    /// the cache only: they are what lets a record read back after a
    /// restart be trusted, while the copy in memory is this process's own
    /// (at 10,000 resources they were ~0.6 KiB each of a replica's memory).
    fn set_record(&self, ctx: &Context, uid: &str, shard: u32, mut record: SyncRecord) {
        if let Some(cache) = &ctx.cache
            && let Err(e) = cache.put_sync(uid, &record.to_stored())
        {
            ctx.metrics
                .cache_errors
                .with_label_values(&[&shard.to_string()])
                .inc();
            tracing::warn!(error = %e, "could not write a cache record");
        }
        record.target_hashes.clear();
        self.keep_record(uid, record);
    }

    /// Store the sync record of an object UID in memory only (the
    /// persistent copy is the caller's).
    fn keep_record(&self, uid: &str, record: SyncRecord) {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), record);
    }

    /// Each target's version as observed from the caches, when every one
    /// was (a target outside the watched namespaces is read from the API:
    /// nothing would tell of its changes, so no ticket).
    fn targets_seen(
        &self,
        ctx: &Context,
        targets: &[crate::controllers::target::Target],
        observed: &[(
            Option<crate::controllers::target::Observed>,
            crate::controllers::target::Claim,
        )],
    ) -> Option<Box<[rearm::TargetSeen]>> {
        use crate::controllers::target::TargetKind;
        targets
            .iter()
            .zip(observed)
            .map(|(t, (o, _))| {
                let covered = match t.kind {
                    TargetKind::Secret => ctx.secrets.covers(&t.namespace),
                    TargetKind::ConfigMap => ctx.config_maps.covers(&t.namespace),
                };
                let version = super::packed::version_of(Some(&o.as_ref()?.resource_version));
                (covered && version != 0).then(|| rearm::TargetSeen {
                    kind: t.kind,
                    namespace: t.namespace.as_str().into(),
                    name: t.name.as_str().into(),
                    version,
                })
            })
            .collect()
    }

    /// The persisted sync record of an object UID (counted as a cache hit,
    /// miss or error).
    fn cached_record(&self, ctx: &Context, uid: &str, shard: u32) -> Option<SyncRecord> {
        let cache = ctx.cache.as_ref()?;
        let s = shard.to_string();
        match cache.get_sync(uid) {
            storage::Lookup::Hit(r) => {
                ctx.metrics.cache_hits.with_label_values(&[&s]).inc();
                Some(SyncRecord::from_stored(r))
            }
            storage::Lookup::Miss => {
                ctx.metrics.cache_misses.with_label_values(&[&s]).inc();
                None
            }
            storage::Lookup::Error(reason) => {
                ctx.metrics.cache_errors.with_label_values(&[&s]).inc();
                tracing::warn!(%reason, "unreadable cache record dropped");
                None
            }
        }
    }

    /// Forget what is known of a deleted KmsSecret.
    fn forget(&self, ctx: &Context, key: &ObjectKey) {
        self.instant.unregister(key);
        self.tickets.revoke(key);
        self.tickets.retain(|_, _| true);
        self.queue.reset_backoff(key);
        let live = self.store.uids();
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live.contains(uid));
        self.endpoint_epochs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live.contains(uid));
        self.written.retain(|uid| live.contains(uid));
        if let Some(cache) = &ctx.cache
            && let Err(e) =
                cache.retain(|kind, uid| kind != storage::RecordKind::Sync || live.contains(uid))
        {
            tracing::warn!(error = %e, "could not prune the cache");
        }
    }
}

/// What [`Controller::in_step`] reads of a cached KmsSecret (the few
/// fields of its conditions it compares: no message, no time).
#[derive(serde::Deserialize)]
struct StepView {
    metadata: StepMeta,
    #[serde(default)]
    status: Option<StepStatus>,
}

impl StepView {
    /// [`conditions::ready_for`] of the cached status.
    fn ready(&self) -> bool {
        let generation = self.metadata.generation;
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == crate::api::conditions::READY)
                .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
        })
    }
}

#[derive(serde::Deserialize)]
struct StepStatus {
    #[serde(default)]
    conditions: Vec<StepCondition>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StepCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    observed_generation: Option<i64>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StepMeta {
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
}

impl Reconciler<ObjectKey> for Controller {
    async fn reconcile(&self, job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
        self.run(job).await
    }

    fn retry_interval(&self, _ctx: &Context, key: &ObjectKey) -> Option<Duration> {
        let cr = self.store.get(Some(&key.namespace), &key.name)?;
        plan::resync_interval(&cr.spec).ok()
    }

    fn in_step(&self, ctx: &Context, key: &ObjectKey) -> bool {
        // Asked before every scheduled resync. A ticket that holds says it
        // without decoding anything (it was issued by a sync that left the
        // resource in step, and the resource has not changed since);
        // otherwise only the fields it reads are decoded.
        if self
            .tickets
            .get(key)
            .is_some_and(|t| self.ticket_holds(ctx, key, &t))
        {
            return true;
        }
        let Some(v) = self.store.view::<StepView>(Some(&key.namespace), &key.name) else {
            return false;
        };
        let generation = v.metadata.generation;
        let written = match (&v.metadata.uid, &v.metadata.resource_version) {
            (Some(uid), Some(rv)) => self.written.freshest(uid, rv),
            _ => None,
        };
        match written {
            Some(s) => conditions::ready_for(&s.conditions, generation),
            None => v.ready(),
        }
    }

    fn shard_lost(&self, shard: u32) {
        self.instant.drop_shard(shard);
        self.tickets.retain(|_, t| t.shard != shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The view `in_step` decodes says what the whole resource's
    /// conditions say.
    #[test]
    fn the_step_view_reads_ready_as_the_whole_resource_does() {
        let ready = |status: &str, observed: i64| {
            serde_json::json!({"type": "Ready", "status": status, "reason": "R",
                "message": "m", "lastTransitionTime": "2026-12-05T05:43:20Z",
                "observedGeneration": observed})
        };
        let other = serde_json::json!({"type": "secrets.hanzo.ai/AutoRedeployReady",
            "status": "True", "reason": "R", "message": "m",
            "lastTransitionTime": "2026-12-05T05:43:20Z", "observedGeneration": 2});
        let cases = [
            (Some(vec![ready("True", 2), other.clone()]), true),
            (Some(vec![other.clone(), ready("True", 2)]), true),
            (Some(vec![ready("True", 1)]), false),
            (Some(vec![ready("False", 2)]), false),
            (Some(vec![other]), false),
            (Some(vec![]), false),
            (None, false),
        ];
        for (conditions, expected) in cases {
            let mut cr = serde_json::json!({
                "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
                "metadata": {"name": "r", "namespace": "ns", "generation": 2, "uid": "u",
                    "resourceVersion": "7"},
                "spec": {"hostAPI": "https://kms.example/api",
                    "authentication": {"universalAuth": {
                        "credentialsRef": {"secretName": "c", "secretNamespace": "ns"},
                        "secretsScope": {"projectSlug": "p", "envSlug": "dev", "secretsPath": "/"}}},
                    "managedKubeSecretReferences": [{"secretName": "out", "secretNamespace": "ns"}]},
            });
            if let Some(c) = &conditions {
                cr["status"] = serde_json::json!({"conditions": c, "syncedKeys": 3});
            }
            let whole: KmsSecret = serde_json::from_value(cr.clone()).unwrap();
            let view: StepView = serde_json::from_value(cr).unwrap();
            let by_whole = whole
                .status
                .as_ref()
                .is_some_and(|s| conditions::ready_for(&s.conditions, whole.metadata.generation));
            assert_eq!(by_whole, expected, "{conditions:?}");
            assert_eq!(view.ready(), expected, "{conditions:?}");
        }
    }
}
