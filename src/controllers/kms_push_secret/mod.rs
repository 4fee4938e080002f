//! The KmsPushSecret controller: push the keys of a Kubernetes Secret (and
//! generated values) into a KMS folder.
//!
//! One reconcile, in order:
//! 1. the finalizer `pushsecret.secrets.hanzo.ai/finalizer` is added first;
//! 2. **observe**: the source Secret (read under the namespace rule), the
//!    ClusterGenerators (watched), the credentials; a token; the folder,
//!    listed once, raw;
//! 3. **plan** the writes ([`plan`], pure): create what is missing, update
//!    what differs and is ours, take over foreign keys only with
//!    `updatePolicy: Replace`, delete ours no longer pushed; generated values
//!    are made once and kept;
//! 4. **apply** them ([`write`]), batched, failures collected per key;
//! 5. **status** ([`status`]): conditions, ownership, one Event per change of
//!    `Ready`.
//!
//! A resync with nothing changed makes one list request and no write.
//! Failures never delete anything: a missing source Secret, a template
//! error or an unreachable KMS stop the reconcile before any write.
//!
//! Deletion with `deletionPolicy: Delete` deletes the keys this resource
//! owns **before** the finalizer goes, retried with backoff; a key already
//! gone counts as deleted. When the credentials are gone too (namespace
//! deletion), the identity of the last successful login is used. The
//! annotation `secrets.hanzo.ai/skip-cleanup: "true"` releases the resource
//! without cleanup, and after `--cleanup-timeout` the operator gives up; both
//! with a Warning Event naming what was left in the KMS.
//!
//! Watches: the resources (spec, annotation, deletion and finalizer
//! changes, not status writes), their source and credential Secrets through
//! the shared [`RefIndex`], and the ClusterGenerators through an index of
//! their own.

pub mod generate;
pub mod plan;
pub mod status;
pub mod write;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::generate::SystemRandomSource;
use self::plan::FINALIZER;
use self::status::Report;
use self::write::Cause;
use super::apply::ensure_owner;
use super::context::Context;
use super::error::SyncError;
use super::force_sync;
use super::key::ObjectKey;
use super::packed::Packed;
use super::queue::Queue;
use super::refs::RefIndex;
use super::registry::{OwnerId, Registered, Watching, Wiring, queue_on_change};
use super::stores::{self, Scoped};
use super::workers::{Action, Job, Reconciler};
use super::written::WrittenStatus;
use crate::api::cluster_generator::{ClusterGenerator, ClusterGeneratorSpec};
use crate::api::common::SKIP_CLEANUP_ANNOTATION;
use crate::api::conditions as ct;
use crate::api::duration::format_duration;
use crate::api::kms_push_secret::{DeletionPolicy, KmsPushSecret, KmsPushSecretStatus};
use crate::kms::push::{Folder, StoredSecret};
use crate::kms::{Identity, KmsError};
use crate::sharding::Ownership;

/// The controller's watched state.
pub struct Controller {
    /// Watched resources.
    pub resources: Scoped<KmsPushSecret>,
    /// Watched ClusterGenerators.
    generators: Packed<ClusterGenerator>,
    /// Whether the ClusterGenerators are listed.
    generators_ready: stores::Ready,
    /// The controller's queue (to wake a resource at its cleanup deadline).
    queue: Arc<Queue<ObjectKey>>,
    /// The identity of each resource's last successful login, by UID: used
    /// for cleanup when the credentials Secret is gone.
    identities: Mutex<HashMap<String, Identity>>,
    /// The last status written per UID, with the resourceVersion the
    /// write made: used while the watched copy has not caught up yet, so
    /// that a reconcile right after another one starts from what it wrote.
    /// Dropped by the watch as it delivers each write.
    written: Arc<WrittenStatus<KmsPushSecretStatus>>,
    /// Woken at every change the watch delivers (a cleanup waits on it for
    /// the skip annotation).
    changed: Arc<tokio::sync::Notify>,
}

/// What makes a resource worth reconciling (its status is not).
type Fingerprint = (Option<i64>, BTreeMap<String, String>, bool);

fn has_finalizer(cr: &KmsPushSecret) -> bool {
    cr.finalizers().iter().any(|f| f == FINALIZER)
}

/// The KmsPushSecret kind, registered: its queue, watches and controller.
pub fn kind(w: &Wiring<'_>) -> Registered {
    w.register(watch, |c| c.resources.clone())
}

/// Start watching the resources and the ClusterGenerators. A resource is
/// queued when it appears, its spec, annotations or deletion state change,
/// or it lacks the finalizer; its source and credential Secrets are
/// registered in `refs` (a change of one of them queues it), and a change of
/// a ClusterGenerator queues the resources that use it.
pub fn watch(w: Watching<'_>) -> (Controller, Vec<BoxFuture<'static, ()>>) {
    let (watches, gate, queue, refs) = (w.watches, w.gate, w.queue, w.refs);
    let by_generator = Arc::new(RefIndex::default());
    let written = Arc::new(WrittenStatus::default());
    let changed = Arc::new(tokio::sync::Notify::new());
    let (resources, mut drivers) = {
        let (gate, queue, by_generator) = (gate.clone(), queue.clone(), by_generator.clone());
        let (written, changed) = (written.clone(), changed.clone());
        let fingerprint = |o: &KmsPushSecret| -> Fingerprint {
            (
                o.metadata.generation,
                o.annotations().clone(),
                o.metadata.deletion_timestamp.is_some(),
            )
        };
        // A resource without its finalizer is queued to get it.
        let observe = move |o: &KmsPushSecret, key: &ObjectKey, deleted: bool| {
            if let (Some(uid), Some(rv)) = (&o.metadata.uid, &o.metadata.resource_version) {
                written.seen(uid, rv);
            }
            changed.notify_waiters();
            let owner = plan::owner_id(&key.namespace, &key.name);
            if deleted {
                refs.remove(&owner);
                by_generator.remove(&owner);
                return false;
            }
            refs.set(&owner, plan::referenced_secrets(o));
            by_generator.set(
                &owner,
                plan::generator_names(o)
                    .into_iter()
                    .map(|n| (String::new(), n))
                    .collect(),
            );
            o.metadata.deletion_timestamp.is_none() && !has_finalizer(o)
        };
        watches.watch::<KmsPushSecret, _>(
            &watcher::Config::default(),
            queue_on_change(gate, queue, fingerprint, observe),
        )
    };
    let (generators, generators_ready, d) =
        watch_generators(watches, gate, queue.clone(), by_generator);
    drivers.push(d);
    (
        Controller {
            resources,
            generators,
            generators_ready,
            queue,
            identities: Mutex::new(HashMap::new()),
            written,
            changed,
        },
        drivers,
    )
}

/// Watch the (cluster-scoped) ClusterGenerators; a new, changed or deleted
/// generator queues the resources that use it.
fn watch_generators(
    watches: &stores::Watches,
    gate: Arc<dyn Ownership>,
    queue: Arc<Queue<ObjectKey>>,
    by_generator: Arc<RefIndex>,
) -> (
    Packed<ClusterGenerator>,
    stores::Ready,
    BoxFuture<'static, ()>,
) {
    let mut seen: HashMap<String, Option<i64>> = HashMap::new();
    watches.watch_cluster::<ClusterGenerator, _>(&watcher::Config::default(), move |event| {
        let (name, changed) = match event {
            Event::Apply(g) | Event::InitApply(g) => {
                let name = g.name_any();
                let generation = g.metadata.generation;
                let changed = seen.insert(name.clone(), generation) != Some(generation);
                (name, changed)
            }
            Event::Delete(g) => {
                let name = g.name_any();
                seen.remove(&name);
                (name, true)
            }
            Event::Init | Event::InitDone => return,
        };
        if !changed {
            return;
        }
        for owner in by_generator.dependents("", &name) {
            if let Some(o) = OwnerId::parse(&owner) {
                queue.add(
                    ObjectKey::new(o.namespace, o.name),
                    gate.shard_of(o.namespace),
                );
            }
        }
    })
}

impl Controller {
    fn generator(&self, name: &str) -> Option<ClusterGeneratorSpec> {
        self.generators.get(None, name).map(|g| g.spec.clone())
    }

    fn remember(&self, uid: &str, identity: &Identity) {
        self.identities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), identity.clone());
    }

    fn remembered(&self, uid: &str) -> Option<Identity> {
        self.identities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// Forget identities of resources that no longer exist.
    fn forget(&self) {
        let live = self.resources.uids();
        self.identities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live.contains(uid));
        self.written.retain(|uid| live.contains(uid));
    }

    /// The resource with the status this controller last wrote, when the
    /// watched copy is older than that write.
    fn freshest(&self, cr: &KmsPushSecret) -> KmsPushSecret {
        let mut cr = cr.clone();
        if let (Some(uid), Some(rv)) = (cr.uid(), cr.resource_version())
            && let Some(status) = self.written.freshest(&uid, &rv)
        {
            cr.status = Some(status);
        }
        cr
    }

    /// Write a status over `cr` and remember it.
    async fn write_status(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        old: &KmsPushSecretStatus,
        new: &KmsPushSecretStatus,
    ) -> Result<(), SyncError> {
        let made = status::write(ctx, cr, old, new).await?;
        if let (Some(uid), Some(rv)) = (cr.uid(), made) {
            self.written.written(&uid, &rv, new.clone());
        }
        Ok(())
    }

    /// Reconcile one resource.
    async fn run(&self, job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
        let (ctx, key, shard, cancel) = (job.ctx, job.key, job.shard, job.cancel);
        let Some(cr) = self.resources.get(Some(&key.namespace), &key.name) else {
            self.forget();
            return Ok(Action::Done);
        };
        let cr = self.freshest(&cr);
        if cr.metadata.deletion_timestamp.is_some() {
            return self.finalize(ctx, key, &cr, shard, cancel).await;
        }
        let cr = if has_finalizer(&cr) {
            cr
        } else {
            ensure_owner(ctx, shard, cancel)?;
            add_finalizer(ctx, &cr).await?
        };
        let now = SystemTime::now();
        let report = self.sync(ctx, &cr, shard, cancel).await;
        if matches!(report.error, Some(SyncError::NotOwner)) {
            return Err(SyncError::NotOwner);
        }
        ensure_owner(ctx, shard, cancel)?;
        let old = cr.status.clone().unwrap_or_default();
        let mut new = status::next_status(
            &old,
            &report,
            cr.metadata.generation,
            shard,
            &status::now_time(),
        );
        // Every reconcile reads the whole folder: a forced one is queued
        // ahead of the others, and recorded once it ran.
        let throttled = report.error.as_ref().is_some_and(SyncError::is_throttled);
        new.force_sync = force_sync::settle(&cr, throttled, &mut new.conditions, ct::RECONCILE);
        self.write_status(ctx, &cr, &old, &new).await?;
        report.next(now)
    }

    /// Steps 2–4 of a reconcile; the report says how far it got.
    async fn sync(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Report {
        let mut report = Report::default();
        if let Err(e) = self.try_sync(ctx, cr, shard, cancel, &mut report).await {
            report.error = Some(e);
        }
        report
    }

    /// The destination's secrets. A folder the KMS does not have (a 404 to
    /// the list, as current servers answer) is created with
    /// `push.createFolders`, path and all, and listed again; without it the
    /// push stops with a condition that names the folder and the fix.
    async fn list_or_create(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        identity: &Identity,
        folder: &Folder,
        report: &mut Report,
    ) -> Result<Vec<StoredSecret>, SyncError> {
        match ctx.kms.list_folder(identity, folder).await {
            Err(KmsError::Api { status: 404, .. }) => {}
            other => return other.map_err(SyncError::Kms),
        }
        let place = format!(
            "folder {} in environment {} ({})",
            folder.path,
            folder.environment,
            folder.project.describe()
        );
        if cr.spec.push.create_folders != Some(true) {
            return Err(SyncError::Folder {
                reason: "FolderNotFound",
                message: format!(
                    "{place} does not exist; create it in the KMS, or set spec.push.createFolders: true to let the operator create it"
                ),
                transient: false,
            });
        }
        match ctx
            .kms
            .create_folders(identity, &folder.project, &folder.environment, &folder.path)
            .await
        {
            Ok(created) => {
                if !created.is_empty() {
                    tracing::info!(resource = %cr.name_any(), folders = ?created, "created KMS folders");
                }
                report.created_folders = created;
            }
            Err(KmsError::Api {
                status: 403,
                message,
                ..
            }) => {
                return Err(SyncError::Folder {
                    reason: "FolderCreateDenied",
                    message: format!(
                        "{place} does not exist and the KMS refused to create it (403: {message}); grant the identity's project role the action `create` on the subject `secret-folders` (for environment {} and path {}), or create the folder in the KMS",
                        folder.environment, folder.path
                    ),
                    transient: false,
                });
            }
            Err(e) => return Err(SyncError::Kms(e)),
        }
        ctx.kms
            .list_folder(identity, folder)
            .await
            .map_err(SyncError::Kms)
    }

    async fn try_sync(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        shard: u32,
        cancel: &CancellationToken,
        report: &mut Report,
    ) -> Result<(), SyncError> {
        let ns = cr.namespace().unwrap_or_default();
        let name = cr.name_any();
        let uid = cr.uid().unwrap_or_default();
        report.interval = plan::resync_interval(&cr.spec)?;
        let folder = plan::folder(&cr.spec)?;

        // What the resource wants: source keys (and templates), generators.
        let source = self.source_values(ctx, cr, &folder.path).await?;
        let generators = cr.spec.push.generators.clone().unwrap_or_default();
        if !generators.is_empty() {
            tokio::select! {
                () = self.generators_ready.wait() => {}
                () = cancel.cancelled() => return Err(SyncError::NotOwner),
            }
        }
        let entries = plan::generator_entries(
            &generators,
            |n| self.generator(n),
            &mut SystemRandomSource::default(),
        )?;
        let wanted = plan::wanted(source, entries);
        report.wanted = wanted.len();

        // Log in.
        let auth = cr.spec.authentication.clone().unwrap_or_default();
        let (identity, choice) = super::auth::generic_identity_with_source(
            ctx,
            &ns,
            cr.spec.host_api.as_deref(),
            cr.spec.tls.as_ref(),
            &auth,
        )
        .await?;
        report.endpoint = Some(choice.describe());
        tokio::select! {
            r = ctx.kms.token(&identity) => { r.map_err(SyncError::Auth)?; }
            () = cancel.cancelled() => return Err(SyncError::NotOwner),
        }
        report.strategy = Some(identity.credentials.strategy_name());
        self.remember(&uid, &identity);

        // List the folder once (creating it first when it is missing and
        // the spec asks for that), then diff.
        let stored = tokio::select! {
            r = self.list_or_create(ctx, cr, &identity, &folder, report) => r?,
            () = cancel.cancelled() => return Err(SyncError::NotOwner),
        };
        let status = cr.status.clone().unwrap_or_default();
        let managed = status.managed_secrets.unwrap_or_default();
        let generated = status.generated_secrets.unwrap_or_default();
        let marker = plan::marker(&ns, &name, &uid);
        let named = self.owners_named(ctx, &stored).await?;
        let pushed_by_other = |comment: &str| -> Option<String> {
            let (owner, owner_uid) = plan::parse_marker(comment)?;
            let o = OwnerId::parse(&owner)?;
            let other = named
                .get(&(o.namespace.to_owned(), o.name.to_owned()))?
                .clone()?;
            (other.uid().as_deref() == Some(owner_uid.as_str())
                && owner_uid != uid
                && other.metadata.deletion_timestamp.is_none())
            .then_some(owner)
        };
        let the_plan = plan::plan(&plan::Input {
            wanted: &wanted,
            stored: &stored,
            managed: &managed,
            generated: &generated,
            policy: cr.spec.update_policy,
            marker: &marker,
            pushed_by_other: &pushed_by_other,
            now: SystemTime::now(),
        });
        let me = plan::owner_id(&ns, &name);
        if !the_plan.is_noop() {
            tracing::info!(
                resource = %me,
                create = the_plan.creates.len(),
                update = the_plan.updates.len(),
                replace = the_plan.replaces.len(),
                delete = the_plan.deletes.len(),
                "pushing to the KMS"
            );
        }
        let applied = write::apply(&ctx.kms, &identity, &folder, the_plan, || {
            ensure_owner(ctx, shard, cancel)
        })
        .await?;
        for (key, cause) in applied.all_failures() {
            tracing::warn!(resource = %me, key = %key, reason = cause.reason(), error = %cause, "a key could not be written");
        }
        report.applied = Some(applied);
        Ok(())
    }

    /// The values the source Secret contributes (its keys, through the
    /// templates, rendered off the runtime with one budget); none without
    /// a source Secret.
    async fn source_values(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        path: &str,
    ) -> Result<BTreeMap<String, secrecy::SecretString>, SyncError> {
        let allow_cross = ctx.settings.allow_cross_namespace_refs;
        Ok(match plan::source_ref(cr, allow_cross)? {
            Some((sns, sname)) => {
                let secret = ctx
                    .referenced
                    .get(&ctx.client, &sns, &sname)
                    .await?
                    .ok_or_else(|| SyncError::Reference {
                        reason: "SourceSecretNotFound",
                        message: format!("source Secret {sns}/{sname} not found"),
                    })?;
                let data: BTreeMap<String, Vec<u8>> = secret
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect();
                let template = cr
                    .spec
                    .push
                    .secret
                    .as_ref()
                    .and_then(|s| s.template.clone());
                let (source, path) = (format!("{sns}/{sname}"), path.to_owned());
                let renderer = ctx.renderer.clone();
                let render = move |budget: &mut kms_template::Budget| {
                    plan::source_values(
                        &source,
                        &data,
                        template.as_ref(),
                        &path,
                        renderer.as_ref(),
                        budget,
                    )
                };
                // Templates render off the runtime, with one budget.
                let templated = cr
                    .spec
                    .push
                    .secret
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .and_then(|t| t.data.as_ref())
                    .is_some_and(|d| !d.is_empty());
                if templated {
                    ctx.renders.run(render).await?
                } else {
                    render(&mut kms_template::Budget::new(0))?
                }
            }
            None => BTreeMap::new(),
        })
    }

    /// The resources other keys' markers in `stored` name, once each
    /// (another replica's shard is read from the API server).
    async fn owners_named(
        &self,
        ctx: &Context,
        stored: &[crate::kms::push::StoredSecret],
    ) -> Result<HashMap<(String, String), Option<Arc<KmsPushSecret>>>, SyncError> {
        let mut named: HashMap<(String, String), Option<Arc<KmsPushSecret>>> = HashMap::new();
        for s in stored {
            let Some((owner, _)) = plan::parse_marker(&s.comment) else {
                continue;
            };
            let Some(o) = OwnerId::parse(&owner) else {
                continue;
            };
            let id = (o.namespace.to_owned(), o.name.to_owned());
            if named.contains_key(&id) {
                continue;
            }
            let found = ctx
                .resource(&self.resources, o.namespace, o.name)
                .await
                .map_err(|e| SyncError::kube(format!("reading KmsPushSecret {owner}"), e))?;
            named.insert(id, found);
        }
        Ok(named)
    }

    /// A resource being deleted: clean up per `deletionPolicy`, then remove
    /// the finalizer.
    async fn finalize(
        &self,
        ctx: &Context,
        key: &ObjectKey,
        cr: &KmsPushSecret,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<Action, SyncError> {
        if !has_finalizer(cr) {
            return Ok(Action::Done);
        }
        let old = cr.status.clone().unwrap_or_default();
        let managed = old.managed_secrets.clone().unwrap_or_default();
        if cr.spec.deletion_policy != DeletionPolicy::Delete || managed.is_empty() {
            ensure_owner(ctx, shard, cancel)?;
            remove_finalizer(ctx, cr).await?;
            return Ok(Action::Done);
        }
        if skip_cleanup(cr) {
            return self.release(ctx, cr, shard, cancel, Release::Skipped).await;
        }
        let timeout = ctx.settings.cleanup_timeout;
        let since = cr
            .metadata
            .deletion_timestamp
            .as_ref()
            .map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
        let deadline = since + timeout;
        let left = deadline
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if left.is_zero() {
            return self
                .release(ctx, cr, shard, cancel, Release::TimedOut)
                .await;
        }

        // Clean up; but a skip-cleanup annotation added meanwhile, or the
        // deadline, end the wait at once (a KMS that hangs can hold one
        // attempt for a while).
        let skip_requested = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                // Registered before looking, so a change in between counts.
                changed.as_mut().enable();
                match self.resources.get(Some(&key.namespace), &key.name) {
                    None => return None,
                    Some(o) if skip_cleanup(&o) => return Some(o),
                    Some(_) => {}
                }
                changed.await;
            }
        };
        let result = tokio::select! {
            r = self.cleanup(ctx, cr, &managed, shard, cancel) => r,
            o = skip_requested => return match o {
                Some(o) => self.release(ctx, &o, shard, cancel, Release::Skipped).await,
                None => Ok(Action::Done),
            },
            () = tokio::time::sleep(left) => {
                return self.release(ctx, cr, shard, cancel, Release::TimedOut).await;
            }
        };
        match result {
            Ok(deleted) => {
                ensure_owner(ctx, shard, cancel)?;
                remove_finalizer(ctx, cr).await?;
                let me = plan::owner_id(&key.namespace, &key.name);
                tracing::info!(resource = %me, deleted, "pushed keys deleted; finalizer removed");
                let note = format!(
                    "deleted the {deleted} pushed key(s) from the KMS at {}",
                    describe_folder(cr)
                );
                status::publish(ctx, cr, EventType::Normal, "CleanedUp", &note).await;
                Ok(Action::Done)
            }
            Err(Cleanup {
                error,
                remaining,
                failed,
            }) => {
                if matches!(error, SyncError::NotOwner) {
                    return Err(error);
                }
                ensure_owner(ctx, shard, cancel)?;
                let at = k8s_openapi::jiff::Timestamp::try_from(deadline)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                let message = format!(
                    "Deleting the pushed keys from the KMS failed; the resource stays until they are deleted, \
                     {SKIP_CLEANUP_ANNOTATION}: \"true\" is set, or --cleanup-timeout passes (at {at}): {error}"
                );
                let new = status::cleanup_status(
                    &old,
                    &remaining,
                    &failed,
                    &message,
                    error.reason(),
                    cr.metadata.generation,
                    &status::now_time(),
                );
                self.write_status(ctx, cr, &old, &new).await?;
                // Come back at the deadline at the latest, whatever the
                // backoff says.
                let wait = deadline
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                self.queue.add_after(key.clone(), shard, wait);
                Err(error)
            }
        }
    }

    /// Remove the finalizer without cleanup, with a Warning Event naming
    /// what is left in the KMS.
    async fn release(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        shard: u32,
        cancel: &CancellationToken,
        why: Release,
    ) -> Result<Action, SyncError> {
        ensure_owner(ctx, shard, cancel)?;
        remove_finalizer(ctx, cr).await?;
        let managed = cr
            .status
            .as_ref()
            .and_then(|s| s.managed_secrets.clone())
            .unwrap_or_default();
        let keys = plan::owned_keys(&managed);
        let left = format!(
            "left in the KMS at {}: {}",
            describe_folder(cr),
            plan::key_list(&keys)
        );
        let me = plan::owner_id(&cr.namespace().unwrap_or_default(), &cr.name_any());
        let (reason, note) = match why {
            Release::Skipped => {
                tracing::warn!(resource = %me, left = keys.len(), "cleanup skipped on request; finalizer removed");
                (
                    "CleanupSkipped",
                    format!("{SKIP_CLEANUP_ANNOTATION} is set: released without cleanup; {left}"),
                )
            }
            Release::TimedOut => {
                tracing::warn!(resource = %me, left = keys.len(), "cleanup timed out; finalizer removed");
                (
                    "CleanupTimedOut",
                    format!(
                        "cleanup did not succeed within --cleanup-timeout ({}); released; {left}",
                        format_duration(ctx.settings.cleanup_timeout)
                    ),
                )
            }
        };
        status::publish(ctx, cr, EventType::Warning, reason, &note).await;
        Ok(Action::Done)
    }

    /// Delete the keys this resource owns. Returns how many were deleted
    /// (keys already gone are not counted).
    async fn cleanup(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        managed: &BTreeMap<String, String>,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<usize, Cleanup> {
        let fail = |error: SyncError| Cleanup {
            error,
            remaining: managed.clone(),
            failed: Vec::new(),
        };
        let ns = cr.namespace().unwrap_or_default();
        let uid = cr.uid().unwrap_or_default();
        let folder = plan::folder(&cr.spec).map_err(fail)?;
        let identity = self
            .cleanup_identity(ctx, cr, &ns, &uid, cancel)
            .await
            .map_err(fail)?;
        let stored = tokio::select! {
            r = ctx.kms.list_folder(&identity, &folder) => r.map_err(|e| fail(SyncError::Kms(e)))?,
            () = cancel.cancelled() => return Err(fail(SyncError::NotOwner)),
        };
        // Delete by id, under the key each has now (ids no longer listed are
        // already gone), and keys carrying this resource's marker whose
        // creation was never recorded.
        let marker = plan::marker(&ns, &cr.name_any(), &uid);
        let targets: Vec<(String, String)> = stored
            .iter()
            .filter(|s| managed.contains_key(&s.id) || s.comment.contains(&marker))
            .map(|s| (s.id.clone(), s.key.clone()))
            .collect();
        ensure_owner(ctx, shard, cancel).map_err(fail)?;
        let mut stop = None;
        let results = write::delete_keys(&ctx.kms, &identity, &folder, &targets, &mut stop).await;
        let mut remaining = BTreeMap::new();
        let mut failed: Vec<(String, Cause)> = Vec::new();
        for ((id, key), r) in targets.iter().zip(results) {
            if let Err(cause) = r {
                remaining.insert(id.clone(), key.clone());
                failed.push((key.clone(), cause));
            }
        }
        match failed.first() {
            None => Ok(targets.len()),
            Some((_, cause)) => {
                let keys: Vec<String> = failed.iter().map(|(k, _)| k.clone()).collect();
                let error = match cause {
                    Cause::Kms(e) => SyncError::Kms(e.clone()),
                    other => SyncError::Spec(format!(
                        "could not delete {}: {other}",
                        plan::key_list(&keys)
                    )),
                };
                Err(Cleanup {
                    error,
                    remaining,
                    failed,
                })
            }
        }
    }

    /// The identity for cleanup: from the credentials as they are now, else
    /// the one of the last successful login (the credentials Secret may be
    /// gone with its namespace). A token is obtained with it.
    async fn cleanup_identity(
        &self,
        ctx: &Context,
        cr: &KmsPushSecret,
        ns: &str,
        uid: &str,
        cancel: &CancellationToken,
    ) -> Result<Identity, SyncError> {
        let auth = cr.spec.authentication.clone().unwrap_or_default();
        let current = super::auth::generic_identity(
            ctx,
            ns,
            cr.spec.host_api.as_deref(),
            cr.spec.tls.as_ref(),
            &auth,
        )
        .await;
        let remembered = self.remembered(uid);
        let mut candidates: Vec<Identity> = Vec::new();
        let mut first_error = None;
        match current {
            Ok(i) => candidates.push(i),
            Err(e) => first_error = Some(e),
        }
        if let Some(r) = remembered
            && !candidates.iter().any(|c| c.key() == r.key())
        {
            candidates.push(r);
        }
        for identity in candidates {
            let r = tokio::select! {
                r = ctx.kms.token(&identity) => r,
                () = cancel.cancelled() => return Err(SyncError::NotOwner),
            };
            match r {
                Ok(_) => return Ok(identity),
                Err(e) => {
                    first_error.get_or_insert(SyncError::Auth(e));
                }
            }
        }
        Err(match first_error {
            Some(SyncError::Reference { reason, message }) => SyncError::Reference {
                reason,
                message: format!(
                    "{message}, and this operator process knows no earlier login of this resource to delete its keys with"
                ),
            },
            Some(e) => e,
            None => SyncError::Spec("no way to log in to the KMS".to_owned()),
        })
    }
}

/// Why a resource is released without cleanup.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// `secrets.hanzo.ai/skip-cleanup: "true"`.
    Skipped,
    /// `--cleanup-timeout` passed.
    TimedOut,
}

fn skip_cleanup(cr: &KmsPushSecret) -> bool {
    cr.annotations()
        .get(SKIP_CLEANUP_ANNOTATION)
        .is_some_and(|v| v.trim() == "true")
}

/// A failed cleanup: why, what is still owned, which keys failed.
struct Cleanup {
    error: SyncError,
    remaining: BTreeMap<String, String>,
    failed: Vec<(String, Cause)>,
}

fn describe_folder(cr: &KmsPushSecret) -> String {
    let d = &cr.spec.destination;
    let project = d
        .project_slug
        .as_deref()
        .or(d.project_id.as_deref())
        .unwrap_or_default();
    format!(
        "{project}/{}:{}",
        d.environment_slug,
        crate::kms::folders::normalize_path(&d.secrets_path)
    )
}

/// Add the finalizer (a merge patch from the resourceVersion it was read
/// at); returns the updated resource.
async fn add_finalizer(ctx: &Context, cr: &KmsPushSecret) -> Result<KmsPushSecret, SyncError> {
    let mut finalizers = cr.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    patch_finalizers(ctx, cr, finalizers, "adding the finalizer")
        .await?
        .ok_or_else(|| SyncError::Kube {
            context: "adding the finalizer".to_owned(),
            message: "the resource is gone".to_owned(),
            code: Some(404),
        })
}

/// Remove the finalizer (from the resourceVersion it was read at).
async fn remove_finalizer(ctx: &Context, cr: &KmsPushSecret) -> Result<(), SyncError> {
    let finalizers: Vec<String> = cr
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(ctx, cr, finalizers, "removing the finalizer")
        .await
        .map(|_| ())
}

/// `None` when the resource no longer exists.
async fn patch_finalizers(
    ctx: &Context,
    cr: &KmsPushSecret,
    finalizers: Vec<String>,
    context: &str,
) -> Result<Option<KmsPushSecret>, SyncError> {
    let ns = cr.namespace().unwrap_or_default();
    let r = Api::<KmsPushSecret>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"finalizers": finalizers, "resourceVersion": cr.resource_version()}
            })),
        )
        .await;
    match r {
        Ok(o) => Ok(Some(o)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(SyncError::kube(context, e)),
    }
}

impl Reconciler<ObjectKey> for Controller {
    async fn reconcile(&self, job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
        self.run(job).await
    }

    fn retry_interval(&self, _ctx: &Context, key: &ObjectKey) -> Option<Duration> {
        let cr = self.resources.get(Some(&key.namespace), &key.name)?;
        plan::resync_interval(&cr.spec).ok().flatten()
    }

    fn in_step(&self, _ctx: &Context, key: &ObjectKey) -> bool {
        self.resources
            .get(Some(&key.namespace), &key.name)
            .map(|cr| self.freshest(&cr))
            .is_some_and(|cr| {
                cr.status.as_ref().is_some_and(|s| {
                    super::conditions::ready_for(&s.conditions, cr.metadata.generation)
                })
            })
    }
}
