//! The KmsSecret controller: keep Secrets and ConfigMaps in step with a KMS
//! scope.
//!
//! One reconcile, in order:
//! 1. **observe** the resource and its targets (from the watched caches; a
//!    target that is not cached is read from the API);
//! 2. **decide** what is needed: nothing (not due, targets intact), metadata
//!    only (labels or annotations changed; the targets' own data is reused),
//!    a conditional fetch (due, targets intact: `If-None-Match`), or an
//!    unconditional fetch (a target is missing or drifted, the spec changed,
//!    or nothing is known about the last sync — a `304` cannot rebuild data we
//!    do not keep);
//! 3. **plan** the data and metadata of every target (pure, [`plan`]);
//! 4. **apply** what differs ([`crate::controllers::apply`]), then prune
//!    owned targets no longer listed;
//! 5. **status**: conditions, `observedGeneration`, `lastSyncTime`,
//!    `syncedKeys`, `shard` in one patch, and an Event when `Ready` changes.
//!
//! A failure never empties or deletes a target: the data stays as it was, the
//! conditions say what failed, and the work queue retries with backoff.

pub mod plan;
pub mod record;
pub mod watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::plan::{AuthChoice, Decision};
use self::record::SyncRecord;
use super::apply::{self, FIELD_MANAGER, ensure_owner};
use super::conditions::{self, Status};
use super::context::Context;
use super::error::SyncError;
use super::force_sync;
use super::instant::{InstantUpdates, Nudge, StreamState};
use super::key::ObjectKey;
use super::queue::Queue;
use super::registry::OwnerId;
use super::stores::Scoped;
use super::target::{
    ADOPT_EXISTING_ANNOTATION, Claim, Desired, GO_VERSIONS_ANNOTATION, OWNER_ANNOTATION, Observed,
    TargetKind, claim, desired_meta, diff, go_versions, version_of,
};
use super::workers::{Action, Reconciler};
use super::written::WrittenStatus;
use crate::api::common::CreationPolicy;
use crate::api::conditions as ct;
use crate::api::kms_secret::{KmsSecret, KmsSecretStatus};
use crate::controllers::reload::Reloads;
use crate::controllers::target::Target;
use crate::kms::{Fetch, Fetched, Kms};
use crate::sharding::Ownership;

/// The controller's metric label.
pub const CONTROLLER: &str = "kmssecret";

/// How old an answer for the same scope may be and still serve another
/// resource that is due at the same time.
const SHARE_WINDOW: Duration = Duration::from_secs(2);

/// How long a first sync waits for its stream's first connection.
const FIRST_CONNECTION: Duration = Duration::from_secs(2);

/// Finalizers of earlier operator versions, removed when a KmsSecret is
/// deleted (KmsSecret itself needs none).
const LEGACY_FINALIZERS: [&str; 3] = [
    "secrets.finalizers.hanzo.ai",
    "secrets.finalizers.infisical.com",
    "secrets.finalizers.lux.network",
];

/// What a successful sync did.
struct Synced {
    /// When the KMS was last checked successfully, if known.
    last_sync: Option<SystemTime>,
    next_due: SystemTime,
    synced_keys: Option<i64>,
    targets: usize,
    /// The instant-update stream, when asked for.
    stream: Option<StreamState>,
}

/// The spec field of the resource's authentication method, for messages.
fn auth_method_name(cr: &KmsSecret) -> &'static str {
    match &cr.spec.authentication {
        None => "tokenSecretReference",
        Some(a) => a.method().map_or("no method", |m| m.name().field()),
    }
}

/// `KmsSecret/<ns>/<name>`.
pub fn owner_id(ns: &str, name: &str) -> String {
    format!("KmsSecret/{ns}/{name}")
}

/// Reconcile one KmsSecret.
pub async fn reconcile(
    ctx: &Context,
    this: &Controller,
    key: &ObjectKey,
    shard: u32,
    cancel: &CancellationToken,
) -> Result<Action, SyncError> {
    let Some(cr) = this.store.get(Some(&key.namespace), &key.name) else {
        this.forget(ctx, key);
        return Ok(Action::Done);
    };
    if cr.metadata.deletion_timestamp.is_some() {
        strip_legacy_finalizers(ctx, &cr).await?;
        this.forget(ctx, key);
        return Ok(Action::Done);
    }
    // Our last status write may not be in the cache yet (the target's
    // watch event came first): read the resource with it.
    let mut cr = (*cr).clone();
    cr.status = this.freshest_status(&cr);
    let mut progress = Progress::default();
    let outcome = sync(ctx, this, &cr, shard, cancel, &mut progress).await;
    if let (Some(why), true) = (progress.nudged, outcome.is_err()) {
        // The change event that made this sync due is not spent until a
        // sync succeeds (a write that lost a race must fetch again).
        this.instant.mark_fresh(key, why);
    }
    if matches!(outcome, Err(SyncError::NotOwner)) {
        return Err(SyncError::NotOwner);
    }
    ensure_owner(ctx, shard, cancel)?;
    write_status(ctx, this, &cr, shard, &outcome, &progress).await?;
    match outcome {
        Ok(s) => Ok(Action::RequeueAt(s.next_due)),
        Err(e) => Err(e),
    }
}

async fn strip_legacy_finalizers(ctx: &Context, cr: &KmsSecret) -> Result<(), SyncError> {
    let finalizers = cr.finalizers();
    if !finalizers
        .iter()
        .any(|f| LEGACY_FINALIZERS.contains(&f.as_str()))
    {
        return Ok(());
    }
    let keep: Vec<&String> = finalizers
        .iter()
        .filter(|f| !LEGACY_FINALIZERS.contains(&f.as_str()))
        .collect();
    let ns = cr.namespace().unwrap_or_default();
    Api::<KmsSecret>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": keep, "resourceVersion": cr.resource_version()}}),
            ),
        )
        .await
        .map_err(|e| SyncError::kube("removing legacy finalizers", e))?;
    Ok(())
}

/// A target as the cache has it. Managed objects are all cached; one that is
/// not is taken as missing, to be created without a read (a create finds an
/// object that exists: [`SyncError::Exists`], then it is read with
/// [`read_target`]). Outside the watched namespaces nothing is cached: read.
async fn observe(ctx: &Context, t: &Target) -> Result<Option<Observed>, SyncError> {
    let cached = match t.kind {
        TargetKind::Secret => ctx
            .secrets
            .get(Some(&t.namespace), &t.name)
            .map(|s| Observed::from_secret(&s)),
        TargetKind::ConfigMap => ctx
            .config_maps
            .get(Some(&t.namespace), &t.name)
            .map(|c| Observed::from_config_map(&c)),
    };
    let covered = match t.kind {
        TargetKind::Secret => ctx.secrets.covers(&t.namespace),
        TargetKind::ConfigMap => ctx.config_maps.covers(&t.namespace),
    };
    match cached {
        Some(o) => Ok(Some(o)),
        None if covered => Ok(None),
        None => read_target(ctx, t).await,
    }
}

/// Read a target from the API.
async fn read_target(ctx: &Context, t: &Target) -> Result<Option<Observed>, SyncError> {
    let context = || format!("reading {} {}/{}", t.kind.as_str(), t.namespace, t.name);
    match t.kind {
        TargetKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await
            .map(|o| o.as_ref().map(Observed::from_secret)),
        TargetKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await
            .map(|o| o.as_ref().map(Observed::from_config_map)),
    }
    .map_err(|e| SyncError::kube(context(), e))
}

/// Whether `owner` (an owner id) is a live KmsSecret that still lists the
/// target; `found` is that KmsSecret as [`named_owner`] found it.
fn owner_lists(ctx: &Context, owner: &str, found: Option<&KmsSecret>, t: &Target) -> bool {
    let Some(owner) = OwnerId::parse(owner).filter(|o| o.kind == "KmsSecret") else {
        // Another kind (a dynamic secret) or a foreign marker: treat as live.
        return true;
    };
    let Some(other) = found.filter(|o| {
        o.namespace().as_deref() == Some(owner.namespace) && o.name_any() == owner.name
    }) else {
        return false;
    };
    if other.metadata.deletion_timestamp.is_some() {
        return false;
    }
    plan::targets(other, ctx.settings.allow_cross_namespace_refs)
        .map(|ts| {
            ts.iter()
                .any(|o| o.kind == t.kind && o.namespace == t.namespace && o.name == t.name)
        })
        .unwrap_or(false)
}

/// The KmsSecret other than `me` that an observed target names as its
/// owner ([`Context::resource`]: it may be in another replica's shard).
async fn named_owner(
    ctx: &Context,
    this: &Controller,
    me: &str,
    o: Option<&Observed>,
) -> Result<Option<Arc<KmsSecret>>, SyncError> {
    let Some(id) = o
        .and_then(|o| o.annotations.get(OWNER_ANNOTATION))
        .filter(|owner| owner.as_str() != me)
    else {
        return Ok(None);
    };
    let Some(owner) = OwnerId::parse(id).filter(|o| o.kind == "KmsSecret") else {
        return Ok(None);
    };
    ctx.resource(&this.store, owner.namespace, owner.name)
        .await
        .map_err(|e| SyncError::kube(format!("reading KmsSecret {id}'s spec"), e))
}

/// The record of the last sync: from memory; else from the persistent
/// cache, if it matches the targets as they are now (same generation, same
/// data by keyed hash); else derived from the status (the targets' version
/// annotations prove their data, the status says when the KMS was last
/// checked).
fn last_record(
    ctx: &Context,
    this: &Controller,
    cr: &KmsSecret,
    interval: Duration,
    shard: u32,
    targets: &[Target],
    observed: &[(Option<Observed>, Claim)],
) -> Option<SyncRecord> {
    let uid = cr.uid()?;
    if let Some(r) = this.record(&uid) {
        return Some(r);
    }
    let generation = cr.metadata.generation.unwrap_or(0);
    if let Some(r) = this.cached_record(ctx, &uid, shard) {
        let matches = r.generation == generation
            && r.target_hashes.len() == targets.len()
            && targets.iter().zip(observed).all(|(t, (o, _))| {
                o.as_ref()
                    .and_then(|o| ctx.data_hash(&o.data))
                    .is_some_and(|h| r.target_hashes.get(&t.id()) == Some(&h))
            });
        if matches {
            return Some(r);
        }
    }
    let status = cr.status.as_ref()?;
    if status.observed_generation != cr.metadata.generation {
        return None;
    }
    let ready = conditions::get(&status.conditions, ct::READY)?;
    if ready.status != "True" {
        return None;
    }
    let last = SystemTime::from(status.last_sync_time.as_ref()?.0);
    Some(SyncRecord {
        generation,
        etag: None,
        last_sync: last,
        next_due: last + crate::controllers::queue::jittered(interval, fastrand::f64()),
        synced_keys: status.synced_keys.unwrap_or(0),
        target_hashes: Default::default(),
    })
}

/// How a scope is named in messages: project, environment, folder.
fn describe_scope(scope: &crate::kms::Scope) -> String {
    let project = project_of(scope);
    let folder = if scope.recursive {
        format!("folder {} and its sub-folders", scope.path)
    } else {
        format!("folder {}", scope.path)
    };
    match &scope.secret_name {
        Some(name) => format!(
            "secret {name} in {project}, environment {}, {folder}",
            scope.environment
        ),
        None => format!("{project}, environment {}, {folder}", scope.environment),
    }
}

/// The KMS listed the scope as empty: find out whether its environment and
/// folder exist (older servers list missing ones as empty). Only an
/// existing folder lets the sync go on and empty the targets.
async fn confirm_folder(
    ctx: &Context,
    identity: &crate::kms::Identity,
    scope: &crate::kms::Scope,
) -> Result<(), SyncError> {
    use crate::kms::folders::FolderCheck;
    match ctx.kms.check_folder(identity, scope).await {
        Ok(FolderCheck::Exists) => Ok(()),
        Ok(FolderCheck::MissingEnvironment) => Err(missing_environment(scope)),
        Ok(FolderCheck::MissingFolder) => Err(missing_folder(scope)),
        Err(e) => Err(SyncError::Folder {
            reason: "FolderCheckFailed",
            message: format!(
                "the KMS listed no secrets for {}, and whether that folder exists could not be checked \
                 (the identity needs to read the project and its folders): {e}; {KEPT}",
                describe_scope(scope)
            ),
            transient: e.is_transient(),
        }),
    }
}

/// The KMS answered a list with 404 (current servers, for a project,
/// environment or folder that does not exist): find out which, to say
/// which field to fix. When the check cannot tell, the KMS's answer stands.
async fn missing_part(
    ctx: &Context,
    identity: &crate::kms::Identity,
    scope: &crate::kms::Scope,
    error: crate::kms::KmsError,
) -> SyncError {
    use crate::kms::folders::FolderCheck;
    match ctx.kms.check_folder(identity, scope).await {
        Ok(FolderCheck::MissingEnvironment) => missing_environment(scope),
        Ok(FolderCheck::MissingFolder) => missing_folder(scope),
        Err(crate::kms::KmsError::Api { status: 404, .. }) => SyncError::Folder {
            reason: "ProjectNotFound",
            message: format!(
                "{} was not found, or the identity is not a member of it ({}); check \
                 secretsScope.projectSlug (or projectId) and the identity's project access; {KEPT}",
                project_of(scope),
                describe_scope(scope)
            ),
            transient: false,
        },
        Ok(FolderCheck::Exists) | Err(_) => SyncError::KmsScope {
            error,
            scope: describe_scope(scope),
        },
    }
}

/// What a missing scope leaves alone.
const KEPT: &str = "the targets keep their data and none was created";

fn project_of(scope: &crate::kms::Scope) -> String {
    scope.project.describe()
}

fn missing_environment(scope: &crate::kms::Scope) -> SyncError {
    SyncError::Folder {
        reason: "EnvironmentNotFound",
        message: format!(
            "environment {} does not exist ({}); check secretsScope.envSlug against the project's \
             environments; {KEPT}",
            scope.environment,
            describe_scope(scope)
        ),
        transient: false,
    }
}

fn missing_folder(scope: &crate::kms::Scope) -> SyncError {
    SyncError::Folder {
        reason: "FolderNotFound",
        message: format!(
            "folder {} does not exist in environment {} ({}); check secretsScope.secretsPath; {KEPT}",
            scope.path,
            scope.environment,
            describe_scope(scope)
        ),
        transient: false,
    }
}

/// What a sync got done before it ended (well or not).
#[derive(Default)]
struct Progress {
    /// The login method, when a token was obtained.
    logged_in: Option<&'static str>,
    /// An instant-update event (or its stream's opening) made this sync
    /// due.
    nudged: Option<Nudge>,
    /// Where the endpoint's host and CA came from, when it was resolved.
    endpoint: Option<String>,
}

/// One sync: observe the targets, decide what to ask of the KMS, log in and
/// listen, fetch, render, write what differs, prune, and remember what was
/// synced (each step below, in that order).
async fn sync(
    ctx: &Context,
    this: &Controller,
    cr: &KmsSecret,
    shard: u32,
    cancel: &CancellationToken,
    progress: &mut Progress,
) -> Result<Synced, SyncError> {
    let me = owner_id(&cr.namespace().unwrap_or_default(), &cr.name_any());
    let interval = plan::resync_interval(&cr.spec)?;
    let targets = plan::targets(cr, ctx.settings.allow_cross_namespace_refs)?;
    let observed = observe_targets(ctx, this, cr, &me, &targets).await?;
    let asked = Asked::decide(ctx, this, cr, interval, shard, &targets, &observed);
    progress.nudged = asked.nudged;
    let t_login = std::time::Instant::now();
    let (login, stream) = login_and_listen(ctx, this, cr, &asked, progress).await?;
    let t_fetch = std::time::Instant::now();
    let (fetched, etag) = fetch(
        ctx,
        this,
        &asked,
        login.as_ref(),
        &observed,
        cancel,
        progress,
    )
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
    let (desired_all, wrote) = plan.apply(ctx, this, observed, shard, cancel).await?;
    prune(ctx, cr, &me, &targets, shard, cancel).await?;
    let synced_keys = fetched
        .as_ref()
        .map(|s| s.len() as i64)
        .or_else(|| asked.record.as_ref().map(|r| r.synced_keys));
    let (last_sync, next_due) = asked.times(interval, stream.as_ref(), wrote);
    let target_hashes = targets
        .iter()
        .zip(&desired_all)
        .filter_map(|(t, d)| ctx.data_hash(&d.data).map(|h| (t.id(), h)))
        .collect();
    this.set_record(
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
        next_due,
        synced_keys,
        targets: targets.len(),
        stream,
    })
}

/// What a sync decided to ask of the KMS, and from what.
struct Asked {
    decision: Decision,
    /// A sync asked for by hand (`force-sync`): full, with a fresh answer.
    forced: bool,
    /// What was synced last (the cache, else the status).
    record: Option<SyncRecord>,
    /// An instant-update event (or its stream's opening) made it due.
    nudged: Option<Nudge>,
    key: ObjectKey,
    /// Instant updates are on.
    instant: bool,
    /// The global configuration's change count when decided.
    epoch: u64,
    generation: i64,
    now: SystemTime,
}

impl Asked {
    /// Decide: nothing, a conditional request, or a full one (see
    /// [`plan::decide`]).
    fn decide(
        ctx: &Context,
        this: &Controller,
        cr: &KmsSecret,
        interval: Duration,
        shard: u32,
        targets: &[Target],
        observed: &[(Option<Observed>, Claim)],
    ) -> Self {
        let now = SystemTime::now();
        let record = last_record(ctx, this, cr, interval, shard, targets, observed);
        let all_intact = observed
            .iter()
            .all(|(o, c)| *c == Claim::Ours && o.as_ref().is_some_and(Observed::data_intact));
        // Instant updates: an event since the last fetch makes the resource
        // due. A resource that starts listening (after a restart, a shard
        // hand-over, or the option turned on) may have missed events
        // meanwhile: it checks once, with a conditional request.
        let instant = plan::instant_updates(&cr.spec);
        let key = ObjectKey::new(cr.namespace().unwrap_or_default(), cr.name_any());
        let nudged = instant.then(|| this.instant.take_fresh(&key)).flatten();
        let newly_listening = instant && !this.instant.is_registered(&key);
        // The global configuration changed since the endpoint was resolved:
        // check now, against the endpoint it names now.
        let epoch = ctx.global_epoch();
        let endpoint_stale = this.endpoint_stale(cr, epoch);
        let generation = cr.metadata.generation.unwrap_or(0);
        // A sync asked for by hand (`force-sync`) is a full one.
        let forced = force_sync::pending(cr).is_some();
        let decision = if forced {
            Decision::Full
        } else {
            plan::decide(
                record.as_ref(),
                generation,
                all_intact,
                nudged.is_some() || newly_listening || endpoint_stale,
                now,
            )
        };
        Self {
            decision,
            forced,
            record,
            nudged,
            key,
            instant,
            epoch,
            generation,
            now,
        }
    }

    /// When the targets were last brought in step, and when the next check
    /// is due. A check made only because the resource started listening
    /// (after a restart or a hand-over), its stream opened, or its endpoint
    /// changed, that found every target in step (nothing `wrote`), is not a
    /// sync: the status keeps when the targets were last brought in step
    /// (no status write for it), and the scheduled check stays due when it
    /// was.
    fn times(
        &self,
        interval: Duration,
        stream: Option<&StreamState>,
        wrote: bool,
    ) -> (Option<SystemTime>, SystemTime) {
        let polling = stream.is_some_and(|s| *s != StreamState::Open);
        let open = stream == Some(&StreamState::Open);
        match &self.record {
            Some(r)
                if self.decision == Decision::Conditional
                    && self.nudged != Some(Nudge::Event)
                    && !wrote
                    && !plan::check_was_due(r, interval, open, self.now) =>
            {
                let (last, due) =
                    plan::times_after_check(r, interval, open, polling, self.now, fastrand::f64());
                (Some(last), due)
            }
            _ => plan::next_times(
                self.decision,
                self.record.as_ref(),
                interval,
                polling,
                self.now,
                fastrand::f64(),
            ),
        }
    }
}

/// Log in (when anything is due) and listen for changes (instant updates):
/// the identity and scope to fetch with, and the stream's state.
async fn login_and_listen(
    ctx: &Context,
    this: &Controller,
    cr: &KmsSecret,
    asked: &Asked,
    progress: &mut Progress,
) -> Result<
    (
        Option<(crate::kms::Identity, crate::kms::Scope)>,
        Option<StreamState>,
    ),
    SyncError,
> {
    let ns = cr.namespace().unwrap_or_default();
    let login = if asked.decision == Decision::NotDue {
        None
    } else {
        let allow_cross = ctx.settings.allow_cross_namespace_refs;
        let AuthChoice { method, scope } = plan::auth_choice(&cr.spec, &ns, allow_cross)?;
        let (identity, choice) = super::auth::identity_with_source(
            ctx,
            &ns,
            cr.spec.host_api.as_deref(),
            cr.spec.tls.as_ref(),
            &method,
        )
        .await?;
        this.endpoint_resolved(cr, asked.epoch);
        progress.endpoint = Some(choice.describe());
        Some((identity, scope))
    };
    let key = &asked.key;
    let stream = match (&login, asked.instant) {
        (_, false) => {
            this.instant.unregister(key);
            None
        }
        (Some((identity, scope)), true) => Some(this.instant.ensure(key, identity, scope).await),
        (None, true) => this.instant.state_of(key),
    };
    // A resource whose status says nothing of instant updates yet waits
    // for its stream's first connection (a moment), so that its first
    // status says whether it listens.
    let stream = match stream {
        Some(StreamState::Opening)
            if conditions::get(
                cr.status.as_ref().map_or(&[][..], |s| &s.conditions),
                ct::INSTANT_UPDATES,
            )
            .is_none() =>
        {
            this.instant.first_connection(key, FIRST_CONNECTION).await
        }
        other => other,
    };
    Ok((login, stream))
}

/// Fetch what was decided (conditionally unless full): the secrets when
/// they came (`None` for a 304 or nothing due), and the ETag to send next.
async fn fetch(
    ctx: &Context,
    this: &Controller,
    asked: &Asked,
    login: Option<&(crate::kms::Identity, crate::kms::Scope)>,
    observed: &[(Option<Observed>, Claim)],
    cancel: &CancellationToken,
    progress: &mut Progress,
) -> Result<(Option<Arc<Fetched>>, Option<String>), SyncError> {
    let known = asked.record.as_ref().and_then(|r| r.etag.clone());
    let Some((identity, scope)) = login else {
        return Ok((None, known));
    };
    let request = FetchRequest {
        key: &asked.key,
        identity,
        scope,
        etag: match asked.decision {
            Decision::Full => None,
            _ => known.as_deref(),
        },
        fresh: asked.forced,
    };
    match fetch_scope(ctx, this, &request, observed, cancel, progress).await? {
        Some((secrets, etag)) => Ok((Some(secrets), etag)),
        // A 304 to an unconditional request cannot happen; be safe anyway.
        None if asked.decision == Decision::Full => {
            Err(SyncError::Kms(crate::kms::KmsError::Decode {
                endpoint: "GET /api/v3/secrets/raw",
                reason: "304 Not Modified to an unconditional request".to_owned(),
            }))
        }
        None => Ok((None, known)),
    }
}

/// What a sync plans its targets from.
struct Planned<'a> {
    cr: &'a KmsSecret,
    me: &'a str,
    targets: &'a [Target],
    /// Each target's data rendered from the fetched secrets (not fetched:
    /// none, the targets keep their data).
    rendered: Option<&'a [BTreeMap<String, Vec<u8>>]>,
}

impl Planned<'_> {
    /// Plan every target and write what differs; the desired states. A
    /// target created without a read that turns out to exist is read,
    /// checked and planned again.
    async fn apply(
        &self,
        ctx: &Context,
        this: &Controller,
        mut observed: Vec<(Option<Observed>, Claim)>,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<(Vec<Desired>, bool), SyncError> {
        let (cr, me, targets) = (self.cr, self.me, self.targets);
        let mut reads = 0;
        let mut wrote = false;
        loop {
            let desired = desired_targets(ctx, cr, me, targets, &observed, self.rendered);
            let written = write_targets(
                ctx,
                me,
                targets,
                &mut observed,
                &desired,
                shard,
                cancel,
                &mut wrote,
            )
            .await;
            match written {
                Err(SyncError::Exists(what)) if reads < targets.len() => {
                    reads += 1;
                    let i = observed
                        .iter()
                        .position(|(o, _)| o.is_none())
                        .ok_or(SyncError::Exists(what))?;
                    let o = read_target(ctx, &targets[i]).await?;
                    let c = claim_of(ctx, this, cr, me, &targets[i], o.as_ref()).await?;
                    observed[i] = (o, c);
                }
                r => return r.map(|()| (desired, wrote)),
            }
        }
    }
}

/// Write the targets whose desired state differs from what was observed,
/// in order, each observed as written (and `wrote` set); stops at the
/// first error.
#[allow(clippy::too_many_arguments)]
async fn write_targets(
    ctx: &Context,
    me: &str,
    targets: &[Target],
    observed: &mut [(Option<Observed>, Claim)],
    desired: &[Desired],
    shard: u32,
    cancel: &CancellationToken,
    wrote: &mut bool,
) -> Result<(), SyncError> {
    for ((t, (o, c)), d) in targets.iter().zip(observed.iter_mut()).zip(desired) {
        let (removals, changed) = match o {
            None => (Default::default(), true),
            Some(o) => diff(o, d, t.creation_policy),
        };
        if changed {
            let written = apply::write(ctx, d, o.as_ref(), &removals, shard, cancel).await?;
            *wrote = true;
            tracing::info!(resource = %me, target = %t.id(), "target written");
            (*o, *c) = (Some(written), Claim::Ours);
        }
    }
    Ok(())
}

/// Each target as it is now, and who may write it; an error for a target
/// that is not ours to write (foreign, or another resource's).
async fn observe_targets(
    ctx: &Context,
    this: &Controller,
    cr: &KmsSecret,
    me: &str,
    targets: &[Target],
) -> Result<Vec<(Option<Observed>, Claim)>, SyncError> {
    let mut observed = Vec::with_capacity(targets.len());
    for t in targets {
        let o = observe(ctx, t).await?;
        let c = claim_of(ctx, this, cr, me, t, o.as_ref()).await?;
        observed.push((o, c));
    }
    Ok(observed)
}

/// Who may write target `t` as observed; an error when it is not ours to
/// write.
async fn claim_of(
    ctx: &Context,
    this: &Controller,
    cr: &KmsSecret,
    me: &str,
    t: &Target,
    o: Option<&Observed>,
) -> Result<Claim, SyncError> {
    let adopt_existing = cr
        .annotations()
        .get(ADOPT_EXISTING_ANNOTATION)
        .map(String::as_str)
        == Some("true");
    let other = named_owner(ctx, this, me, o).await?;
    let c = claim(o, me, cr.uid().as_deref(), adopt_existing, |owner| {
        owner_lists(ctx, owner, other.as_deref(), t)
    });
    let what = format!("{} {}/{}", t.kind.as_str(), t.namespace, t.name);
    match c.refusal(&what, "KmsSecret") {
        Some(refused) => Err(refused),
        None => Ok(c),
    }
}

/// One fetch of a resource's scope.
struct FetchRequest<'a> {
    key: &'a ObjectKey,
    identity: &'a crate::kms::Identity,
    scope: &'a crate::kms::Scope,
    /// The last ETag, for a conditional request.
    etag: Option<&'a str>,
    /// Only an answer that starts now serves (a sync asked for by hand),
    /// not one another resource fetched a moment ago.
    fresh: bool,
}

/// Log in and fetch: the secrets and their ETag, or `None` when the KMS
/// says nothing changed (304). An empty folder is confirmed to exist before
/// it may empty a target.
async fn fetch_scope(
    ctx: &Context,
    this: &Controller,
    req: &FetchRequest<'_>,
    observed: &[(Option<Observed>, Claim)],
    cancel: &CancellationToken,
    progress: &mut Progress,
) -> Result<Option<(Arc<crate::kms::Fetched>, Option<String>)>, SyncError> {
    let (identity, scope) = (req.identity, req.scope);
    tokio::select! {
        r = ctx.kms.token(identity) => { r.map_err(SyncError::Auth)?; }
        () = cancel.cancelled() => return Err(SyncError::NotOwner),
    }
    progress.logged_in = Some(identity.credentials.strategy_name());
    // An answer up to SHARE_WINDOW old serves; with instant updates, only
    // one that started after the stream's last event (this resource's own,
    // or one it joined the stream too late to hear).
    let not_before = if req.fresh {
        tokio::time::Instant::now()
    } else {
        this.instant.not_before(req.key, SHARE_WINDOW)
    };
    let result = tokio::select! {
        r = ctx.kms.fetch(identity, scope, req.etag, not_before) => r,
        () = cancel.cancelled() => return Err(SyncError::NotOwner),
    };
    let result = match result {
        Ok(result) => result,
        // A service token has no login: a refused token shows here.
        Err(
            e @ crate::kms::KmsError::Api {
                status: 401 | 403, ..
            },
        ) if matches!(
            identity.credentials,
            crate::kms::Credentials::ServiceToken { .. }
        ) =>
        {
            return Err(SyncError::Auth(e));
        }
        Err(error @ crate::kms::KmsError::Api { status: 404, .. }) => {
            return Err(tokio::select! {
                e = missing_part(ctx, identity, scope, error) => e,
                () = cancel.cancelled() => SyncError::NotOwner,
            });
        }
        Err(error) => {
            return Err(SyncError::KmsScope {
                error,
                scope: describe_scope(scope),
            });
        }
    };
    match &*result {
        Fetch::NotModified => Ok(None),
        Fetch::Secrets { secrets, etag } => {
            // An empty answer may mean "no such folder" (older servers list
            // a missing folder or environment as empty): make sure before
            // any target is emptied or created empty.
            let would_empty = observed
                .iter()
                .any(|(o, _)| o.as_ref().is_none_or(|o| !o.data.is_empty()));
            if secrets.is_empty() && scope.secret_name.is_none() && would_empty {
                tokio::select! {
                    r = confirm_folder(ctx, identity, scope) => r?,
                    () = cancel.cancelled() => return Err(SyncError::NotOwner),
                }
            }
            Ok(Some((secrets.clone(), etag.clone())))
        }
    }
}

/// What every target should be: the data rendered from the fetched
/// secrets, or (not fetched) its own current data; with the resource's
/// labels and annotations, the owner marker and the data's version.
fn desired_targets(
    ctx: &Context,
    cr: &KmsSecret,
    me: &str,
    targets: &[Target],
    observed: &[(Option<Observed>, Claim)],
    rendered: Option<&[BTreeMap<String, Vec<u8>>]>,
) -> Vec<Desired> {
    let mut desired_all = Vec::with_capacity(targets.len());
    for (i, (t, (o, c))) in targets.iter().zip(observed).enumerate() {
        let data: BTreeMap<String, Vec<u8>> = match rendered.and_then(|r| r.get(i)) {
            Some(data) => data.clone(),
            None => o.as_ref().map(|o| o.data.clone()).unwrap_or_default(),
        };
        let version = version_of(&data);
        let created_by_us = *c == Claim::Missing
            || o.as_ref().is_some_and(|o| {
                o.labels
                    .get(super::target::MANAGED_BY_LABEL)
                    .map(String::as_str)
                    == Some(super::target::MANAGED_BY_VALUE)
                    && o.annotations.get(OWNER_ANNOTATION).map(String::as_str) == Some(me)
            });
        let template_meta = t.template.as_ref().and_then(|tpl| tpl.metadata.as_ref());
        let mut meta = desired_meta(
            cr.labels(),
            cr.annotations(),
            template_meta,
            me,
            &version,
            created_by_us,
        );
        // Taken over from a Go operator without a data change: its version
        // stays known, so that workloads it stamped do not roll.
        meta.annotations.remove(GO_VERSIONS_ANNOTATION);
        if let Some(go) = go_versions(o.as_ref(), &data, &version) {
            meta.annotations
                .insert(GO_VERSIONS_ANNOTATION.to_owned(), go);
        }
        desired_all.push(Desired {
            kind: t.kind,
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            data,
            meta,
            owner_reference: (t.creation_policy == CreationPolicy::Owner)
                .then(|| ctx.served.owner_ref(cr))
                .flatten(),
            secret_type: t.secret_type.clone(),
        });
    }
    desired_all
}

/// Delete owned targets that are no longer listed; release orphan ones.
async fn prune(
    ctx: &Context,
    cr: &KmsSecret,
    me: &str,
    targets: &[Target],
    shard: u32,
    cancel: &CancellationToken,
) -> Result<(), SyncError> {
    let uid = cr.uid().unwrap_or_default();
    let listed = |kind: TargetKind, ns: &str, name: &str| {
        targets
            .iter()
            .any(|t| t.kind == kind && t.namespace == ns && t.name == name)
    };
    let mut stale: Vec<(TargetKind, String, String, String, bool)> = Vec::new();
    // The owner annotation is kept apart in the caches: only this
    // resource's own targets are decoded.
    let secrets = ctx.secrets.owned_by(me);
    let config_maps = ctx.config_maps.owned_by(me);
    let metas = (secrets.iter().map(|s| (TargetKind::Secret, &s.metadata))).chain(
        config_maps
            .iter()
            .map(|c| (TargetKind::ConfigMap, &c.metadata)),
    );
    for (kind, meta) in metas {
        let (ns, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        if !listed(kind, &ns, &name) {
            let owned = meta.owner_references.iter().flatten().any(|r| r.uid == uid);
            let rv = meta.resource_version.clone().unwrap_or_default();
            stale.push((kind, ns, name, rv, owned));
        }
    }
    for (kind, ns, name, rv, owned) in stale {
        ensure_owner(ctx, shard, cancel)?;
        if owned {
            apply::delete(ctx, kind, &ns, &name, &rv).await?;
            tracing::info!(resource = %me, target = %format!("{}/{ns}/{name}", kind.as_str()), "owned target no longer listed: deleted");
        } else {
            apply::release(ctx, kind, &ns, &name, &rv).await?;
            tracing::info!(resource = %me, target = %format!("{}/{ns}/{name}", kind.as_str()), "target no longer listed: released");
        }
    }
    Ok(())
}

fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// A time as the API server stores it (RFC 3339, whole seconds), so that a
/// status compared with its cached copy is not "changed" by the fraction
/// of a second the cache never had (a write the server would find empty).
fn whole_seconds(t: k8s_openapi::jiff::Timestamp) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// Write the status for the outcome of a sync (one patch, only when it
/// changes), and an Event when `Ready` changes.
/// The status of `cr` after a sync (pure): the login, sync, readiness,
/// instant-update and auto-reload conditions, the last sync time, the
/// number of keys and the shard. `reloads` is how many workloads that
/// opted in to auto-reload use the targets, and the gradual reloads held.
fn next_status(
    cr: &KmsSecret,
    shard: u32,
    outcome: &Result<Synced, SyncError>,
    progress: &Progress,
    reloads: &Reloads,
    now: &Time,
) -> KmsSecretStatus {
    let generation = cr.metadata.generation;
    let auth_method = auth_method_name(cr);
    let mut status = cr.status.clone().unwrap_or_default();
    let c = &mut status.conditions;
    // A login that worked is reported whatever happened after it (a
    // template error, a KMS refusal of the folder).
    if let Some(endpoint) = &progress.endpoint {
        conditions::set(
            c,
            ct::ENDPOINT,
            Status::True,
            "Resolved",
            &conditions::bounded(endpoint),
            generation,
            now,
        );
    }
    if let Some(strategy) = progress.logged_in {
        conditions::set(
            c,
            ct::LOADED_KMS_TOKEN,
            Status::True,
            "OK",
            &format!("Logged in to the KMS using the {strategy} authentication strategy"),
            generation,
            now,
        );
    }
    let throttled_in_step =
        matches!(outcome, Err(e) if e.is_throttled()) && conditions::ready_for(c, generation);
    match outcome {
        Ok(s) => {
            let keys = s.synced_keys.unwrap_or(0);
            conditions::set(
                c,
                ct::READY_TO_SYNC_SECRETS,
                Status::True,
                "OK",
                &format!("Synced {keys} secrets into {} target(s)", s.targets),
                generation,
                now,
            );
            conditions::set(
                c,
                ct::READY,
                Status::True,
                "Synced",
                &format!("Synced {keys} secrets"),
                generation,
                now,
            );
            if let Some(t) = s.last_sync {
                status.last_sync_time = Some(whole_seconds(
                    k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or(now.0),
                ));
            }
            status.synced_keys = s.synced_keys.or(status.synced_keys);
            instant_updates_condition(c, s.stream.as_ref(), generation, now);
        }
        Err(e) => {
            let fix = login_fix(cr, e);
            let failure = Failure {
                error: e,
                fix: fix.as_deref(),
                auth_method,
                throttled_in_step,
            };
            failure_conditions(c, &failure, generation, now);
        }
    }
    match outcome {
        Ok(_) if !reloads.held.is_empty() => {
            conditions::set(
                c,
                ct::AUTO_REDEPLOY_READY,
                Status::False,
                "RolloutHeld",
                &reloads.held.join("; "),
                generation,
                now,
            );
        }
        Ok(_) => {
            conditions::set(
                c,
                ct::AUTO_REDEPLOY_READY,
                Status::True,
                "OK",
                &format!(
                    "{} workload(s) that opted in to auto-reload use the targets",
                    reloads.workloads
                ),
                generation,
                now,
            );
        }
        // Auto-reload keeps working on the data the targets hold.
        Err(_) if throttled_in_step => {}
        Err(e) => conditions::set(
            c,
            ct::AUTO_REDEPLOY_READY,
            Status::False,
            "Stopped",
            &format!("Auto-reload waits for a successful sync: {}", e.reason()),
            generation,
            now,
        ),
    }
    status.observed_generation = generation;
    status.shard = Some(i32::try_from(shard).unwrap_or(i32::MAX));
    let throttled = matches!(outcome, Err(e) if e.is_throttled());
    status.force_sync = force_sync::after_sync(cr, throttled);
    if let (true, Some(value)) = (throttled, force_sync::pending(cr)) {
        conditions::append_note(
            &mut status.conditions,
            ct::READY_TO_SYNC_SECRETS,
            &force_sync::waiting(value),
        );
    }

    status
}

/// The `InstantUpdates` condition after a sync, by its stream's state.
fn instant_updates_condition(
    c: &mut Vec<crate::api::common::Condition>,
    stream: Option<&StreamState>,
    generation: Option<i64>,
    now: &Time,
) {
    match stream {
        Some(StreamState::Open) => conditions::set(
            c,
            ct::INSTANT_UPDATES,
            Status::True,
            "Subscribed",
            "Listening to the KMS's change events",
            generation,
            now,
        ),
        Some(StreamState::Opening) if conditions::get(c, ct::INSTANT_UPDATES).is_some() => {
            // A stream just started keeps what the status said (a
            // restart or a hand-over does not flip it to
            // `Connecting` and back); its opening or failure comes
            // next.
        }
        Some(StreamState::Opening | StreamState::Connecting) => conditions::set(
            c,
            ct::INSTANT_UPDATES,
            Status::False,
            "Connecting",
            "Connecting to the KMS's change events; polling meanwhile",
            generation,
            now,
        ),
        Some(StreamState::Unavailable(why)) => conditions::set(
            c,
            ct::INSTANT_UPDATES,
            Status::False,
            "Unavailable",
            &conditions::bounded(&format!(
                "Instant updates are not available, polling instead: {why}"
            )),
            generation,
            now,
        ),
        None => c.retain(|x| x.type_ != ct::INSTANT_UPDATES),
    }
}

/// What to check when the KMS refused the resource's login, naming where
/// its credentials come from.
fn login_fix(cr: &KmsSecret, e: &SyncError) -> Option<String> {
    if e.reason() != "AuthenticationFailed" {
        return None;
    }
    let ns = cr.namespace().unwrap_or_default();
    plan::auth_choice(&cr.spec, &ns, true)
        .ok()?
        .method
        .refused_login_fix()
}

/// A failed sync, as its conditions tell it.
struct Failure<'a> {
    error: &'a SyncError,
    /// What to do about it, when the error alone does not say.
    fix: Option<&'a str>,
    auth_method: &'a str,
    /// Only throttled, while the targets are in step with the spec.
    throttled_in_step: bool,
}

/// The conditions of a failed sync: the login's (when it failed), the
/// sync's and `Ready` (unless only throttled while in step).
fn failure_conditions(
    c: &mut Vec<crate::api::common::Condition>,
    f: &Failure<'_>,
    generation: Option<i64>,
    now: &Time,
) {
    let (e, auth_method, throttled_in_step) = (f.error, f.auth_method, f.throttled_in_step);
    let message = match f.fix {
        Some(fix) => conditions::bounded(&format!("{e}; {fix}")),
        None => conditions::bounded(&e.to_string()),
    };
    let auth_failure = matches!(e, SyncError::Auth(_))
        || matches!(e, SyncError::Reference { reason, .. } if reason.starts_with("Credentials"));
    if auth_failure {
        conditions::set(
            c,
            ct::LOADED_KMS_TOKEN,
            Status::False,
            e.reason(),
            &format!("Failed to log in to the KMS with {auth_method}: {message}"),
            generation,
            now,
        );
    }
    conditions::set(
        c,
        ct::READY_TO_SYNC_SECRETS,
        Status::False,
        e.reason(),
        &format!("Failed to sync secrets; the targets keep their data: {message}"),
        generation,
        now,
    );
    // A throttled check of a resource whose targets are in step with
    // this spec leaves `Ready` as it is: the targets hold the data of
    // the last sync and the KMS only asked to come back later. The
    // condition above says so; a spec change not yet synced, or any
    // other failure, still turns `Ready` false.
    if !throttled_in_step {
        conditions::set(
            c,
            ct::READY,
            Status::False,
            e.reason(),
            &message,
            generation,
            now,
        );
    }
}

async fn write_status(
    ctx: &Context,
    this: &Controller,
    cr: &KmsSecret,
    shard: u32,
    outcome: &Result<Synced, SyncError>,
    progress: &Progress,
) -> Result<(), SyncError> {
    let old = cr.status.clone().unwrap_or_default();
    let reloads = if outcome.is_ok() {
        consumers_of(ctx, cr)
    } else {
        Reloads::default()
    };
    let status = next_status(cr, shard, outcome, progress, &reloads, &now_time());
    if status_unchanged(&old, &status) {
        return Ok(());
    }
    let ns = cr.namespace().unwrap_or_default();
    let started = std::time::Instant::now();
    Api::<KmsSecret>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &cr.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(ctx.served.status_apply::<KmsSecret>(&status)),
        )
        .await
        .map_err(|e| SyncError::kube("writing the status", e))?;
    tracing::debug!(
        resource = %cr.name_any(),
        namespace = %ns,
        ms = started.elapsed().as_millis(),
        changed = ?status_changes(&old, &status),
        "status written"
    );
    if let (Some(uid), Some(rv)) = (cr.uid(), cr.resource_version()) {
        this.written.written(&uid, &rv, status.clone());
    }
    // A gradual reload held: one Warning Event when it starts (or changes).
    let held = |s: &KmsSecretStatus| {
        conditions::get(&s.conditions, ct::AUTO_REDEPLOY_READY)
            .filter(|c| c.reason == "RolloutHeld")
            .map(|c| c.message.clone())
    };
    if let Some(message) = held(&status).filter(|m| held(&old).as_ref() != Some(m)) {
        ctx.publish(
            &ctx.served.object_ref(cr),
            "Reload",
            EventType::Warning,
            "RolloutHeld",
            &message,
        )
        .await;
    }
    // One Event per change of Ready (status or reason), not per resync.
    if let Some(ready) = conditions::ready_changed(&old.conditions, &status.conditions) {
        let type_ = if ready.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        ctx.publish(
            &ctx.served.object_ref(cr),
            "Sync",
            type_,
            &ready.reason,
            &ready.message,
        )
        .await;
    }
    Ok(())
}

/// The condition types (and status fields) that differ between two
/// statuses, for the debug line of a status write.
fn status_changes(old: &KmsSecretStatus, new: &KmsSecretStatus) -> Vec<String> {
    let mut out: Vec<String> = new
        .conditions
        .iter()
        .filter(|c| {
            conditions::get(&old.conditions, &c.type_).is_none_or(|o| {
                (&o.status, &o.reason, &o.message, o.observed_generation)
                    != (&c.status, &c.reason, &c.message, c.observed_generation)
            })
        })
        .map(|c| c.type_.clone())
        .collect();
    out.extend(
        old.conditions
            .iter()
            .filter(|c| conditions::get(&new.conditions, &c.type_).is_none())
            .map(|c| format!("-{}", c.type_)),
    );
    if old.last_sync_time != new.last_sync_time {
        out.push("lastSyncTime".to_owned());
    }
    if old.shard != new.shard {
        out.push("shard".to_owned());
    }
    out
}

/// Opted-in workloads that use any target of the resource, and the gradual
/// reloads of its targets that are held.
fn consumers_of(ctx: &Context, cr: &KmsSecret) -> Reloads {
    let targets = plan::targets(cr, ctx.settings.allow_cross_namespace_refs).unwrap_or_default();
    let mut workloads = std::collections::BTreeSet::new();
    let mut held = Vec::new();
    for t in &targets {
        let source = match t.kind {
            TargetKind::Secret => crate::controllers::reload::Source::Secret,
            TargetKind::ConfigMap => crate::controllers::reload::Source::ConfigMap,
        };
        workloads.extend(ctx.consumers.consumers(&t.namespace, source, &t.name));
        held.extend(ctx.consumers.hold(&t.namespace, source, &t.name));
    }
    Reloads {
        workloads: workloads.len(),
        held,
    }
}

fn status_unchanged(a: &KmsSecretStatus, b: &KmsSecretStatus) -> bool {
    conditions::same(&a.conditions, &b.conditions)
        && a.observed_generation == b.observed_generation
        && a.last_sync_time == b.last_sync_time
        && a.synced_keys == b.synced_keys
        && a.shard == b.shard
        && a.force_sync == b.force_sync
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
    /// cached copy has not caught up with that write yet, else the cached
    /// copy's.
    fn freshest_status(&self, cr: &KmsSecret) -> Option<KmsSecretStatus> {
        match (cr.uid(), cr.resource_version()) {
            (Some(uid), Some(rv)) => self.written.freshest(&uid, &rv),
            _ => None,
        }
        .or_else(|| cr.status.clone())
    }

    /// The sync record of an object UID.
    fn record(&self, uid: &str) -> Option<SyncRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
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
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), record);
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

impl Reconciler<ObjectKey> for Controller {
    fn reconcile<'a>(
        &'a self,
        ctx: &'a Context,
        key: &'a ObjectKey,
        shard: u32,
        cancel: &'a CancellationToken,
    ) -> futures::future::BoxFuture<'a, Result<Action, SyncError>> {
        Box::pin(reconcile(ctx, self, key, shard, cancel))
    }

    fn retry_interval(&self, _ctx: &Context, key: &ObjectKey) -> Option<Duration> {
        let cr = self.store.get(Some(&key.namespace), &key.name)?;
        plan::resync_interval(&cr.spec).ok()
    }

    fn in_step(&self, _ctx: &Context, key: &ObjectKey) -> bool {
        self.store
            .get(Some(&key.namespace), &key.name)
            .is_some_and(|cr| {
                self.freshest_status(&cr)
                    .is_some_and(|s| conditions::ready_for(&s.conditions, cr.metadata.generation))
            })
    }

    fn shard_lost(&self, shard: u32) {
        self.instant.drop_shard(shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kms_secret(status: Option<KmsSecretStatus>) -> KmsSecret {
        let mut cr: KmsSecret = serde_json::from_value(json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1",
            "kind": "KmsSecret",
            "metadata": {"name": "app", "namespace": "ns", "generation": 2},
            "spec": {
                "authentication": {"universalAuth": {
                    "credentialsRef": {"secretName": "creds"},
                    "secretsScope": {"projectSlug": "p", "envSlug": "dev", "secretsPath": "/"}
                }},
                "managedKubeSecretReferences": [{"secretName": "out"}]
            }
        }))
        .unwrap();
        cr.status = status;
        cr
    }

    #[test]
    fn the_method_is_named_as_the_spec_field_that_is_set() {
        let mut cr = kms_secret(None);
        assert_eq!(auth_method_name(&cr), "universalAuth");
        cr.spec.authentication = serde_json::from_value(json!({
            "serviceAccount": {"serviceAccountSecretReference": {"secretName": "sa"},
                "projectId": "p", "environmentName": "dev"}
        }))
        .ok();
        assert_eq!(auth_method_name(&cr), "serviceAccount");
        cr.spec.authentication = serde_json::from_value(json!({
            "gcpIamAuth": {"identityId": "i", "serviceAccountKeyFilePath": "/k",
                "secretsScope": {"projectSlug": "p", "envSlug": "dev", "secretsPath": "/"}}
        }))
        .ok();
        assert_eq!(auth_method_name(&cr), "gcpIamAuth");
        cr.spec.authentication = None;
        assert_eq!(auth_method_name(&cr), "tokenSecretReference");
    }

    fn condition<'a>(s: &'a KmsSecretStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = conditions::get(&s.conditions, type_).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn a_stream_just_started_keeps_what_the_status_said() {
        let now = now_time();
        let synced = |stream| Synced {
            last_sync: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
            next_due: SystemTime::now(),
            synced_keys: Some(3),
            targets: 1,
            stream: Some(stream),
        };
        let progress = Progress::default();
        let open = next_status(
            &kms_secret(None),
            5,
            &Ok(synced(StreamState::Open)),
            &progress,
            &0.into(),
            &now,
        );
        assert_eq!(condition(&open, ct::INSTANT_UPDATES).1, "Subscribed");
        // After a restart or a hand-over: still `Subscribed`, unchanged.
        let cr = kms_secret(Some(open.clone()));
        let opening = next_status(
            &cr,
            5,
            &Ok(synced(StreamState::Opening)),
            &progress,
            &0.into(),
            &now,
        );
        assert!(status_unchanged(&open, &opening));
        // With nothing said before, it says it is connecting.
        let fresh = next_status(
            &kms_secret(None),
            5,
            &Ok(synced(StreamState::Opening)),
            &progress,
            &0.into(),
            &now,
        );
        assert_eq!(condition(&fresh, ct::INSTANT_UPDATES).1, "Connecting");
        // A stream that was open and reconnects says so.
        let reconnecting = next_status(
            &cr,
            5,
            &Ok(synced(StreamState::Connecting)),
            &progress,
            &0.into(),
            &now,
        );
        assert_eq!(
            condition(&reconnecting, ct::INSTANT_UPDATES).1,
            "Connecting"
        );
    }

    #[test]
    fn the_status_says_what_the_sync_did() {
        let now = now_time();
        let synced = Synced {
            last_sync: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
            next_due: SystemTime::now(),
            synced_keys: Some(3),
            targets: 1,
            stream: Some(StreamState::Connecting),
        };
        let progress = Progress {
            logged_in: Some("universal"),
            nudged: None,
            endpoint: Some("hostAPI https://kms.example/api from spec; CA: system roots".into()),
        };
        let ok = next_status(
            &kms_secret(None),
            5,
            &Ok(synced),
            &progress,
            &2.into(),
            &now,
        );
        assert_eq!(
            condition(&ok, ct::ENDPOINT),
            (
                "True",
                "Resolved",
                "hostAPI https://kms.example/api from spec; CA: system roots"
            )
        );
        assert_eq!(
            condition(&ok, ct::READY),
            ("True", "Synced", "Synced 3 secrets")
        );
        assert_eq!(condition(&ok, ct::LOADED_KMS_TOKEN).0, "True");
        assert_eq!(condition(&ok, ct::INSTANT_UPDATES).1, "Connecting");
        assert_eq!(
            condition(&ok, ct::AUTO_REDEPLOY_READY).2,
            "2 workload(s) that opted in to auto-reload use the targets"
        );
        assert_eq!(
            (ok.synced_keys, ok.shard, ok.observed_generation),
            (Some(3), Some(5), Some(2))
        );
        assert_eq!(
            ok.last_sync_time.as_ref().map(|t| t.0.as_second()),
            Some(1_800_000_000)
        );

        // A refused login after a good sync: Ready and the token condition
        // say so, naming the method; what was synced stays in the status.
        let refused = SyncError::Auth(crate::kms::KmsError::Api {
            endpoint: "POST /api/v1/auth/universal-auth/login",
            status: 401,
            error: "UnauthorizedError".into(),
            message: "invalid client secret".into(),
        });
        let expected_reason = refused.reason().to_owned();
        let failed = next_status(
            &kms_secret(Some(ok.clone())),
            5,
            &Err(refused),
            &Progress::default(),
            &0.into(),
            &now,
        );
        let (status, reason, message) = condition(&failed, ct::READY);
        assert_eq!((status, reason), ("False", expected_reason.as_str()));
        assert!(message.contains("invalid client secret"), "{message}");
        let token = condition(&failed, ct::LOADED_KMS_TOKEN);
        assert_eq!(token.0, "False");
        assert!(
            token
                .2
                .starts_with("Failed to log in to the KMS with universalAuth"),
            "{}",
            token.2
        );
        assert_eq!(condition(&failed, ct::AUTO_REDEPLOY_READY).1, "Stopped");
        assert_eq!(failed.synced_keys, Some(3));
        assert_eq!(failed.last_sync_time, ok.last_sync_time);

        // A throttled check of a resource in step with its spec: the sync
        // condition says what failed, Ready and auto-reload stay as they
        // were (same transition time: no Event).
        let throttled = || {
            SyncError::Kms(crate::kms::KmsError::rate_limited(
                "GET /api/v3/secrets/raw",
                Duration::from_secs(55),
            ))
        };
        let paused = next_status(
            &kms_secret(Some(ok.clone())),
            5,
            &Err(throttled()),
            &Progress::default(),
            &0.into(),
            &now_time(),
        );
        assert_eq!(
            conditions::get(&paused.conditions, ct::READY),
            conditions::get(&ok.conditions, ct::READY)
        );
        assert_eq!(
            condition(&paused, ct::AUTO_REDEPLOY_READY),
            condition(&ok, ct::AUTO_REDEPLOY_READY)
        );
        let (status, reason, message) = condition(&paused, ct::READY_TO_SYNC_SECRETS);
        assert_eq!((status, reason), ("False", "KMSRateLimited"));
        assert!(message.contains("keep their data"), "{message}");

        // Throttled after a spec change (not yet synced) or after a failure:
        // not Ready.
        let mut changed = kms_secret(Some(ok.clone()));
        changed.metadata.generation = Some(3);
        let behind = next_status(
            &changed,
            5,
            &Err(throttled()),
            &Progress::default(),
            &0.into(),
            &now,
        );
        assert_eq!(condition(&behind, ct::READY).1, "KMSRateLimited");
        let after_failure = next_status(
            &kms_secret(Some(failed.clone())),
            5,
            &Err(throttled()),
            &Progress::default(),
            &0.into(),
            &now,
        );
        assert_eq!(
            condition(&after_failure, ct::READY).0,
            "False",
            "{after_failure:?}"
        );
        assert_eq!(condition(&after_failure, ct::READY).1, "KMSRateLimited");
    }

    #[test]
    fn a_sync_time_compares_equal_to_its_copy_read_back_from_the_api() {
        let t = k8s_openapi::jiff::Timestamp::from_nanosecond(1_764_756_877_123_456_789).unwrap();
        let written = KmsSecretStatus {
            last_sync_time: Some(whole_seconds(t)),
            ..KmsSecretStatus::default()
        };
        // What the watch cache holds after the round trip through the API.
        let cached: KmsSecretStatus =
            serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
        assert!(status_unchanged(&cached, &written));
        let exact = KmsSecretStatus {
            last_sync_time: Some(Time(t)),
            ..KmsSecretStatus::default()
        };
        assert!(!status_unchanged(&cached, &exact));
    }
}
