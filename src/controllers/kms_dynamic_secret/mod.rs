//! The KmsDynamicSecret controller: lease time-bound credentials into a
//! Secret, renew the lease in time, replace it when it cannot be renewed, and
//! revoke it on deletion — without leaking leases.
//!
//! Rules (see `docs/kmsdynamicsecret.md`):
//! - A new lease is written to the status **before** its credentials reach
//!   the Secret; if that status write fails, the lease is revoked at once.
//!   A lease created right before the process dies is never renewed; with a
//!   cache it was remembered there first (`pending`) and is revoked by the
//!   next reconcile, without one it expires at its TTL.
//! - Renewal happens at a jittered 50–70 % of the lease period and never
//!   later than min(30 s, period/3) before expiry; it touches neither the
//!   Secret nor any workload.
//! - At max TTL, when renewal is refused, or when the Secret no longer holds
//!   the current lease's credentials, a new lease is created, the Secret is
//!   updated (a real change: auto-reload fires) and the old lease is kept in
//!   `status.retiredLeases` until its grace period is over, then revoked.
//! - Deletion with `leaseRevocationPolicy: Revoke` revokes every lease,
//!   clears the Secret's data, and only then removes the finalizer; retried
//!   with backoff; `secrets.hanzo.ai/skip-cleanup: "true"` or
//!   `--cleanup-timeout` release the resource without cleanup.

pub mod pending;
pub mod plan;
pub mod status;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use secrecy::SecretString;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::pending::{Pending, Settle};
use self::plan::{Decision, LeaseView};
use self::status::{NewLease, Outcome, next_status, ready_event, record_lease};
use super::apply::{self, ensure_owner};
use super::auth::{generic_identity, generic_identity_with_source};
use super::conditions::{self, Status};
use super::context::Context;
use super::error::SyncError;
use super::force_sync;
use super::key::ObjectKey;
use super::refs::written_ref;
use super::registry::{Registered, Watching, Wiring, queue_on_change};
use super::stores::Scoped;
use super::target::Target;
use super::target::{
    ADOPT_EXISTING_ANNOTATION, Claim, Desired, Observed, TargetKind, claim, desired_meta, diff,
};
use super::workers::{Action, Job, Reconciler};
use crate::api::KmsDynamicSecret;
use crate::api::common::CreationPolicy;
use crate::api::conditions as ct;
use crate::api::kms_dynamic_secret::{
    DynamicSecretDetails, KmsDynamicSecretStatus, LeaseRevocationPolicy,
};
use crate::kms::leases::{LeaseTarget, renewal_refused};
use crate::kms::{Identity, KmsError, SecretItem, SecretMap};

/// The finalizer that guards lease revocation.
pub const FINALIZER: &str = "dynamicsecret.secrets.hanzo.ai/finalizer";
pub use self::status::RETIRE_GRACE;

/// `KmsDynamicSecret/<ns>/<name>`.
pub fn owner_id(ns: &str, name: &str) -> String {
    format!("KmsDynamicSecret/{ns}/{name}")
}

/// The controller's watched state and memory.
pub struct Controller {
    /// Watched resources.
    pub resources: Scoped<KmsDynamicSecret>,
    /// Project slugs by (KMS base URL, project id): looked up once.
    slugs: Mutex<HashMap<(String, String), String>>,
    /// The identity of the last successful reconcile per resource UID, used
    /// to clean up when the credentials are gone too.
    identities: Mutex<HashMap<String, Identity>>,
}

fn referenced(o: &KmsDynamicSecret) -> Vec<(String, String)> {
    let ns = o.namespace().unwrap_or_default();
    let pick = |r_ns: Option<&String>, name: &str| written_ref(&ns, r_ns, name);
    let mut out: Vec<(String, String)> =
        crate::controllers::auth::generic_method(&o.spec.authentication, &ns, true)
            .ok()
            .and_then(|m| m.secret_read().cloned())
            .into_iter()
            .collect();
    if let Some(ca) = o.spec.tls.as_ref().and_then(|t| t.ca_ref.as_ref()) {
        out.push(pick(ca.secret_namespace.as_ref(), &ca.secret_name));
    }
    out
}

/// The KmsDynamicSecret kind, registered: its queue, watches and
/// controller.
pub fn kind(w: &Wiring<'_>) -> Registered {
    w.register(watch, |c| c.resources.clone())
}

/// Start watching the resources: a new resource, a spec, label, annotation,
/// finalizer or deletion change queues it (our own status writes do not).
pub fn watch(w: Watching<'_>) -> (Controller, Vec<BoxFuture<'static, ()>>) {
    let (watches, gate, queue, refs) = (w.watches, w.gate, w.queue, w.refs);
    let fingerprint = |o: &KmsDynamicSecret| {
        (
            o.metadata.generation,
            o.labels().clone(),
            o.annotations().clone(),
            o.metadata.deletion_timestamp.is_some(),
            o.finalizers().to_vec(),
        )
    };
    let observe = move |o: &KmsDynamicSecret, key: &ObjectKey, deleted: bool| {
        let owner = owner_id(&key.namespace, &key.name);
        if deleted {
            refs.remove(&owner);
        } else {
            refs.set(&owner, referenced(o));
        }
        false
    };
    let (resources, drivers) = watches.watch::<KmsDynamicSecret, _>(
        &watcher::Config::default(),
        queue_on_change(gate, queue, fingerprint, observe),
    );
    (
        Controller {
            resources,
            slugs: Mutex::new(HashMap::new()),
            identities: Mutex::new(HashMap::new()),
        },
        drivers,
    )
}

impl Reconciler<ObjectKey> for Controller {
    async fn reconcile(&self, job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
        self.run(job).await
    }

    /// `kms_operator_dynamic_leases`: the resources holding a lease, per
    /// shard this replica owns (0 for the others).
    fn report(&self, ctx: &Context) {
        let mut held: HashMap<u32, i64> = HashMap::new();
        for o in self.resources.all() {
            if o.status.as_ref().is_some_and(|st| st.lease.is_some()) {
                *held
                    .entry(ctx.gate.shard_of(&o.namespace().unwrap_or_default()))
                    .or_default() += 1;
            }
        }
        for shard in 0..ctx.gate.shard_count() {
            let n = if ctx.gate.owns(shard) {
                held.get(&shard).copied().unwrap_or(0)
            } else {
                0
            };
            ctx.metrics
                .dynamic_leases
                .with_label_values(&[&shard.to_string()])
                .set(n);
        }
    }
}

fn now_time() -> Time {
    Time(Timestamp::now())
}

fn kms_err(e: KmsError) -> SyncError {
    SyncError::Kms(e)
}

/// The target Secret as the KmsSecret planner describes targets.
fn target_of(cr: &KmsDynamicSecret, allow_cross: bool) -> Result<Target, SyncError> {
    let ns = cr.namespace().unwrap_or_default();
    let r = &cr.spec.managed_secret_reference;
    let target = Target::secret(&ns, "managedSecretReference".to_owned(), r, allow_cross)?;
    if r.creation_policy == CreationPolicy::Owner && target.namespace != ns {
        return Err(SyncError::Spec(format!(
            "managedSecretReference.creationPolicy: Owner needs the Secret in the resource's namespace {ns}"
        )));
    }
    Ok(target)
}

/// A Secret the Go operator wrote for the current lease: its data and
/// version.
type GoHeld = (BTreeMap<String, Vec<u8>>, String);

/// Whether the Secret as observed holds the lease in the status: written
/// by this resource for it, or (second) by the Go operator for it (its
/// version is `<leaseId>-<leaseVersion>` too; owned by this resource's uid,
/// or only marked by that version), with its data and version to adopt as
/// they are, so the hand-over creates no lease and changes no data
/// (docs/migration.md).
fn held_by_secret(
    status: &KmsDynamicSecretStatus,
    observed: Option<&Observed>,
    c: &Claim,
) -> (bool, Option<GoHeld>) {
    let ours = match (&status.lease, observed, c) {
        (Some(l), Some(o), Claim::Ours) => o
            .annotations
            .get(super::target::VERSION_ANNOTATION)
            .is_some_and(|v| v.starts_with(&format!("{}-", l.id))),
        _ => false,
    };
    let go_held = match (&status.lease, observed, c) {
        (Some(l), Some(o), Claim::Ours | Claim::Adoptable)
            if !o.annotations.contains_key(super::target::OWNER_ANNOTATION) =>
        {
            super::target::LEGACY_VERSION_ANNOTATIONS
                .iter()
                .filter_map(|k| o.annotations.get(*k))
                .find(|v| v.starts_with(&format!("{}-", l.id)))
                .cloned()
                .map(|v| (o.data.clone(), v))
        }
        _ => None,
    };
    (ours || go_held.is_some(), go_held)
}

/// The Secret's data for a lease just created: its credentials through the
/// target's template (rendered off the runtime).
async fn render_created(
    ctx: &Context,
    target: &Target,
    created: &crate::kms::leases::CreatedLease,
    path: &str,
) -> Result<BTreeMap<String, Vec<u8>>, SyncError> {
    let data: SecretMap = created
        .data
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                SecretItem {
                    key: k.clone(),
                    value: SecretString::from(secrecy::ExposeSecret::expose_secret(v).to_owned()),
                    secret_path: path.to_owned(),
                },
            )
        })
        .collect();
    let data = Arc::new(crate::kms::Fetched::unheld(data));
    Ok(super::render::render_targets(
        (&ctx.renders, &ctx.renderer),
        std::slice::from_ref(target),
        data,
    )
    .await?
    .pop()
    .unwrap_or_default())
}

/// The Secret a reconcile writes, as observed when it started, and who may
/// write it.
#[derive(Clone, Copy)]
struct SecretSlot<'a> {
    cr: &'a KmsDynamicSecret,
    me: &'a str,
    target: &'a Target,
    observed: Option<&'a Observed>,
    claim: &'a Claim,
    shard: u32,
    cancel: &'a CancellationToken,
}

impl Controller {
    /// Reconcile one resource.
    async fn run(&self, job: Job<'_, ObjectKey>) -> Result<Action, SyncError> {
        let (ctx, key, shard, cancel) = (job.ctx, job.key, job.shard, job.cancel);
        let Some(cr) = self.resources.get(Some(&key.namespace), &key.name) else {
            return Ok(Action::Done);
        };
        if cr.metadata.deletion_timestamp.is_some() {
            return self.cleanup(ctx, &cr, shard, cancel).await;
        }
        if !cr.finalizers().iter().any(|f| f == FINALIZER) {
            ensure_owner(ctx, shard, cancel)?;
            let mut finalizers = cr.finalizers().to_vec();
            finalizers.push(FINALIZER.to_owned());
            patch_meta(ctx, &cr, json!({"finalizers": finalizers})).await?;
            // The update comes back as a watch event.
            return Ok(Action::Done);
        }
        let outcome = self.sync(ctx, &cr, shard, cancel).await;
        match outcome {
            Ok(next) => Ok(Action::RequeueAt(next)),
            Err(SyncError::NotOwner) => Err(SyncError::NotOwner),
            // Written concurrently (or our copy is behind): retried soon,
            // not worth a failed condition.
            Err(
                e @ SyncError::Kube {
                    code: Some(409), ..
                },
            ) => Err(e),
            Err(e) => {
                // Report; the status of a successful step was written by it.
                let fresh = self
                    .resources
                    .get(Some(&key.namespace), &key.name)
                    .unwrap_or(cr);
                let status = next_status(
                    &fresh,
                    fresh.status.clone().unwrap_or_default(),
                    Outcome::Failed(&e),
                    shard,
                    &now_time(),
                );
                write_conditions(ctx, &fresh, &status).await;
                publish_ready_change(ctx, &fresh, &status, Some(&e)).await;
                Err(e)
            }
        }
    }

    async fn project_slug(
        &self,
        ctx: &Context,
        identity: &Identity,
        d: &DynamicSecretDetails,
    ) -> Result<String, SyncError> {
        if let Some(slug) = d.project_slug.as_deref().filter(|s| !s.is_empty()) {
            return Ok(slug.to_owned());
        }
        let id = d.project_id.clone().unwrap_or_default();
        let cache_key = (identity.endpoint.base.clone(), id.clone());
        if let Some(slug) = self
            .slugs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&cache_key)
        {
            return Ok(slug.clone());
        }
        let slug = ctx.kms.project_slug(identity, &id).await.map_err(kms_err)?;
        self.slugs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cache_key, slug.clone());
        Ok(slug)
    }

    async fn lease_target(
        &self,
        ctx: &Context,
        identity: &Identity,
        cr: &KmsDynamicSecret,
    ) -> Result<LeaseTarget, SyncError> {
        let d = &cr.spec.dynamic_secret;
        Ok(LeaseTarget {
            project_slug: self.project_slug(ctx, identity, d).await?,
            environment: d.environment_slug.clone(),
            path: crate::kms::folders::normalize_path(&d.secrets_path),
            name: d.secret_name.clone(),
        })
    }

    /// Bring the lease and the Secret in line; returns when to look again.
    async fn sync(
        &self,
        ctx: &Context,
        cr: &KmsDynamicSecret,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<std::time::SystemTime, SyncError> {
        let ns = cr.namespace().unwrap_or_default();
        let me = owner_id(&ns, &cr.name_any());
        let uid = cr.uid().unwrap_or_default();
        let target = target_of(cr, ctx.settings.allow_cross_namespace_refs)?;
        let (identity, endpoint) = generic_identity_with_source(
            ctx,
            &ns,
            cr.spec.host_api.as_deref(),
            cr.spec.tls.as_ref(),
            &cr.spec.authentication,
        )
        .await?;
        self.identities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.clone(), identity.clone());
        let lease_target = self.lease_target(ctx, &identity, cr).await?;
        let step = Step {
            ctx,
            cr,
            me: &me,
            identity: &identity,
            lease_target: &lease_target,
            shard,
            cancel,
            now: Timestamp::now(),
            condition_now: now_time(),
        };
        let mut status = cr.status.clone().unwrap_or_default();
        // The object as last written by this reconcile: every status write
        // is made over its resourceVersion.
        let mut written = cr.clone();

        // The Secret: who may write it, and does it hold the current lease?
        let observed = observe_secret(ctx, &target).await?;
        let adopt = cr
            .annotations()
            .get(ADOPT_EXISTING_ANNOTATION)
            .map(String::as_str)
            == Some("true");
        let c = claim(observed.as_ref(), &me, cr.uid().as_deref(), adopt, |_| true);
        let what = format!("Secret {}/{}", target.namespace, target.name);
        if let Some(refused) = c.refusal(&what, "KmsDynamicSecret") {
            return Err(refused);
        }
        let (holds_current, go_held) = held_by_secret(&status, observed.as_ref(), &c);
        let slot = SecretSlot {
            cr,
            me: &me,
            target: &target,
            observed: observed.as_ref(),
            claim: &c,
            shard,
            cancel,
        };
        if let Some((data, version)) = go_held {
            self.write_secret(ctx, &slot, data, &version).await?;
        }

        // A lease created and never recorded (the process died before its
        // status write) is revoked; retired leases whose grace is over go;
        // then renew or create.
        step.settle_pending(&status).await;
        step.revoke_retired(&mut status).await?;
        let view = status.lease.as_ref().map(LeaseView::from_status);
        let max_ttl = status
            .max_ttl
            .as_deref()
            .and_then(crate::kms::leases::parse_ttl);
        let mut decision = plan::decide(view.as_ref(), holds_current, max_ttl, step.now);
        // A sync asked for by hand (`force-sync`) checks the lease with the
        // KMS now: a renewal.
        if decision == Decision::Wait && force_sync::pending(cr).is_some() {
            decision = Decision::Renew;
        }
        if decision == Decision::Renew {
            decision = step.renew(&mut status, &written).await?;
        }
        if let Decision::Create { reason } = decision {
            let (recorded, w, created) = step.create(reason, status, written).await?;
            (status, written) = (recorded, w);
            let rendered = render_created(ctx, &target, &created, &lease_target.path).await?;
            let version = format!("{}-{}", created.lease.id, created.lease.version);
            self.write_secret(ctx, &slot, rendered, &version).await?;
            status.synced_keys = Some(i64::try_from(created.data.len()).unwrap_or(i64::MAX));
            status.last_sync_time = Some(Time(Timestamp::now()));
        }

        // In line: say so.
        let workloads = ctx
            .consumers
            .consumers(
                &target.namespace,
                crate::controllers::reload::Source::Secret,
                &target.name,
            )
            .len();
        let status = next_status(
            cr,
            status,
            Outcome::InLine {
                endpoint: &endpoint.describe(),
                workloads,
            },
            shard,
            &step.condition_now,
        );
        ensure_owner(ctx, shard, cancel)?;
        let before = cr.status.clone().unwrap_or_default();
        write_status(&ctx.client, &written, &status).await?;
        publish_ready_change_from(ctx, cr, &before, &status, None).await;
        let view = status.lease.as_ref().map(LeaseView::from_status);
        let next = plan::next_check(
            view.as_ref(),
            &status.retired_leases,
            max_ttl,
            Timestamp::now(),
        );
        Ok(std::time::SystemTime::from(next))
    }

    async fn write_secret(
        &self,
        ctx: &Context,
        slot: &SecretSlot<'_>,
        data: BTreeMap<String, Vec<u8>>,
        version: &str,
    ) -> Result<(), SyncError> {
        let SecretSlot {
            cr,
            me,
            target,
            observed,
            claim: c,
            shard,
            cancel,
        } = *slot;
        let created_by_us = *c == Claim::Missing
            || observed.is_some_and(|o| {
                o.labels
                    .get(super::target::MANAGED_BY_LABEL)
                    .map(String::as_str)
                    == Some(super::target::MANAGED_BY_VALUE)
            });
        let template_meta = target.template.as_ref().and_then(|t| t.metadata.as_ref());
        let meta = desired_meta(
            cr.labels(),
            cr.annotations(),
            template_meta,
            me,
            version,
            created_by_us,
        );
        let desired = Desired {
            kind: TargetKind::Secret,
            namespace: target.namespace.clone(),
            name: target.name.clone(),
            data,
            meta,
            owner_reference: (target.creation_policy == CreationPolicy::Owner)
                .then(|| ctx.served.owner_ref(cr))
                .flatten(),
            secret_type: target.secret_type.clone(),
        };
        let removals = match observed {
            None => Default::default(),
            Some(o) => diff(o, &desired, target.creation_policy).0,
        };
        apply::write(ctx, &desired, observed, &removals, shard, cancel).await?;
        Ok(())
    }

    /// Deletion: revoke (with `Revoke`), clear the Secret's data, then
    /// release the finalizer.
    async fn cleanup(
        &self,
        ctx: &Context,
        cr: &KmsDynamicSecret,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<Action, SyncError> {
        if !cr.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::Done);
        }
        let uid = cr.uid().unwrap_or_default();
        let skip = cr
            .annotations()
            .get(crate::api::common::SKIP_CLEANUP_ANNOTATION)
            .map(String::as_str)
            == Some("true");
        let status = cr.status.clone().unwrap_or_default();
        // A lease created and never recorded goes with the recorded ones.
        let pending = Pending::new(ctx.cache.as_ref(), &uid);
        let unrecorded = match pending::settle(pending.get().as_ref(), &status, Timestamp::now()) {
            Settle::Revoke(id) => Some(id),
            Settle::Nothing | Settle::Forget => None,
        };
        let leases: Vec<String> = status
            .lease
            .iter()
            .map(|l| l.id.clone())
            .chain(status.retired_leases.iter().map(|r| r.id.clone()))
            .chain(unrecorded)
            .collect();
        if skip {
            event(
                ctx,
                cr,
                EventType::Warning,
                "CleanupSkipped",
                "secrets.hanzo.ai/skip-cleanup is set: leases were not revoked",
            )
            .await;
        } else if cr.spec.lease_revocation_policy == LeaseRevocationPolicy::Revoke
            && !leases.is_empty()
        {
            let result = self.revoke_all(ctx, cr, &leases, shard, cancel).await;
            if let Err(e) = result {
                let deleted_at = cr
                    .metadata
                    .deletion_timestamp
                    .as_ref()
                    .map_or(Timestamp::now(), |t| t.0);
                let waited = Timestamp::now().duration_since(deleted_at);
                let timeout =
                    k8s_openapi::jiff::SignedDuration::try_from(ctx.settings.cleanup_timeout)
                        .unwrap_or_default();
                if waited < timeout {
                    let mut s = status.clone();
                    let now = now_time();
                    let message = conditions::bounded(&format!(
                        "Revoking the lease before deletion failed: {e}; retrying (set secrets.hanzo.ai/skip-cleanup=true to release without revoking)"
                    ));
                    conditions::set(
                        &mut s.conditions,
                        ct::READY,
                        Status::False,
                        "CleanupFailed",
                        &message,
                        cr.metadata.generation,
                        &now,
                    );
                    write_conditions(ctx, cr, &s).await;
                    return Err(e);
                }
                event(
                    ctx,
                    cr,
                    EventType::Warning,
                    "CleanupAbandoned",
                    &conditions::bounded(&format!("Gave up revoking after --cleanup-timeout: {e}")),
                )
                .await;
            } else {
                event(
                    ctx,
                    cr,
                    EventType::Normal,
                    "LeaseRevoked",
                    "Revoked the lease before deletion",
                )
                .await;
            }
        }
        ensure_owner(ctx, shard, cancel)?;
        let finalizers: Vec<&String> = cr.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        patch_meta(ctx, cr, json!({"finalizers": finalizers})).await?;
        pending.forget();
        self.identities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        Ok(Action::Done)
    }

    async fn revoke_all(
        &self,
        ctx: &Context,
        cr: &KmsDynamicSecret,
        leases: &[String],
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<(), SyncError> {
        let ns = cr.namespace().unwrap_or_default();
        let uid = cr.uid().unwrap_or_default();
        // The credentials may be gone with the namespace: use the last
        // identity that worked.
        let identity = match generic_identity(
            ctx,
            &ns,
            cr.spec.host_api.as_deref(),
            cr.spec.tls.as_ref(),
            &cr.spec.authentication,
        )
        .await
        {
            Ok(i) => i,
            Err(e) => self
                .identities
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&uid)
                .cloned()
                .ok_or(e)?,
        };
        let lease_target = self.lease_target(ctx, &identity, cr).await?;
        for id in leases {
            ensure_owner(ctx, shard, cancel)?;
            ctx.kms
                .revoke_lease(&identity, &lease_target, id)
                .await
                .map_err(kms_err)?;
        }
        // Clear the Secret's data if it is ours.
        let target = target_of(cr, ctx.settings.allow_cross_namespace_refs)?;
        let me = owner_id(&ns, &cr.name_any());
        if let Some(o) = observe_secret(ctx, &target).await?
            && o.annotations.get(super::target::OWNER_ANNOTATION) == Some(&me)
            && !o.data.is_empty()
        {
            ensure_owner(ctx, shard, cancel)?;
            let nulls: serde_json::Map<String, serde_json::Value> = o
                .data
                .keys()
                .map(|k| (k.clone(), serde_json::Value::Null))
                .collect();
            let patch = json!({"metadata": {"resourceVersion": o.resource_version}, "data": nulls});
            match Api::<Secret>::namespaced(ctx.client.clone(), &target.namespace)
                .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(SyncError::kube("clearing the Secret's data", e)),
            }
        }
        Ok(())
    }
}

async fn observe_secret(ctx: &Context, t: &Target) -> Result<Option<Observed>, SyncError> {
    if let Some(s) = ctx.secrets.get(Some(&t.namespace), &t.name) {
        return Ok(Some(Observed::from_secret(&s)));
    }
    Api::<Secret>::namespaced(ctx.client.clone(), &t.namespace)
        .get_opt(&t.name)
        .await
        .map(|o| o.as_ref().map(Observed::from_secret))
        .map_err(|e| SyncError::kube(format!("reading Secret {}/{}", t.namespace, t.name), e))
}

/// Merge-patch the resource's metadata from the resourceVersion it was read
/// at.
async fn patch_meta(
    ctx: &Context,
    cr: &KmsDynamicSecret,
    meta: serde_json::Value,
) -> Result<(), SyncError> {
    let ns = cr.namespace().unwrap_or_default();
    let mut meta = meta;
    meta["resourceVersion"] = json!(cr.resource_version());
    match Api::<KmsDynamicSecret>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": meta})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(SyncError::kube("updating the finalizers", e)),
    }
}

/// How long recording a new lease may take before it is revoked instead.
const RECORD_TIMEOUT: Duration = Duration::from_secs(10);

/// Create a lease and record it in the status (over the version the
/// reconcile read); revoke it when it cannot be recorded. Returns the lease,
/// the status written and the object as written.
#[allow(clippy::too_many_arguments)]
async fn create_and_record(
    kms: Arc<crate::kms::Kms>,
    client: Client,
    cache: Option<storage::Store>,
    identity: Identity,
    target: LeaseTarget,
    written: KmsDynamicSecret,
    mut status: KmsDynamicSecretStatus,
    cancel: CancellationToken,
    step: NewLease,
) -> Result<
    (
        crate::kms::leases::CreatedLease,
        KmsDynamicSecretStatus,
        KmsDynamicSecret,
    ),
    SyncError,
> {
    // No lease for a shard that is gone already (or a replica stopping):
    // nobody could record it. Once the request is out, it is seen through:
    // dropping it would forget a lease the KMS may have made.
    if cancel.is_cancelled() {
        return Err(SyncError::NotOwner);
    }
    let created = kms
        .create_lease(&identity, &target, step.ttl.as_deref())
        .await
        .map_err(kms_err)?;
    let uid = written.uid().unwrap_or_default();
    let pending = Pending::new(cache.as_ref(), &uid);
    pending.remember(&created.lease);
    record_lease(&mut status, &created, &step);
    // The lease is recorded before its credentials are used; if that fails
    // or the shard is lost first, it is revoked now.
    // Bounded: with etcd down the API server holds a write for up to a
    // minute, and a replica stopped meanwhile would forget the lease.
    let record = tokio::time::timeout(RECORD_TIMEOUT, write_status(&client, &written, &status));
    let result = tokio::select! {
        biased;
        () = cancel.cancelled() => Err(SyncError::NotOwner),
        r = record => r.unwrap_or_else(|_| {
            Err(SyncError::Kube {
                context: "writing the status".to_owned(),
                message: format!("no answer within {}s", RECORD_TIMEOUT.as_secs()),
                code: None,
            })
        }),
    };
    match result {
        Ok(w) => {
            pending.forget();
            Ok((created, status, w))
        }
        Err(e) => {
            let id = &created.lease.id;
            // Said before the attempt: a replica stopped while it runs has
            // still told why the lease is not recorded.
            tracing::warn!(lease = %id, error = %e, "could not record a new lease; revoking it");
            match revoke_unrecorded(&kms, &identity, &target, &created.lease).await {
                Ok(()) => {
                    pending.forget();
                    tracing::info!(lease = %id, "unrecorded lease revoked");
                }
                Err(r) => tracing::warn!(
                    lease = %id,
                    error = %r,
                    expires = %created.lease.expire_at,
                    "could not revoke an unrecorded lease; it is never renewed and expires at its TTL"
                ),
            }
            Err(e)
        }
    }
}

/// Longest time spent revoking a lease that could not be recorded.
const UNRECORDED_REVOKE_WINDOW: Duration = Duration::from_secs(120);

/// Revoke a lease nobody recorded, waiting out the KMS's 429 pauses and
/// passing failures, until it is revoked, it expires by itself, or
/// [`UNRECORDED_REVOKE_WINDOW`] has passed.
async fn revoke_unrecorded(
    kms: &crate::kms::Kms,
    identity: &Identity,
    target: &LeaseTarget,
    lease: &crate::kms::leases::Lease,
) -> Result<(), KmsError> {
    let give_up = tokio::time::Instant::now() + UNRECORDED_REVOKE_WINDOW;
    let mut delay = Duration::from_secs(1);
    loop {
        let error = match kms.revoke_lease(identity, target, &lease.id).await {
            Ok(()) => return Ok(()),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => e,
        };
        let wait = error.retry_after().unwrap_or(delay);
        let expired = Timestamp::now() + wait >= lease.expire_at;
        if expired || tokio::time::Instant::now() + wait > give_up {
            return Err(error);
        }
        tokio::time::sleep(wait).await;
        delay = (delay * 2).min(Duration::from_secs(15));
    }
}

/// Write the status, only over the resourceVersion `cr` was read at: a
/// status computed from a stale copy (an informer behind after an apiserver
/// restart) must not roll `status.lease` back. Returns the written object
/// (or `cr` when nothing changed), for the next write of the same reconcile.
async fn write_status(
    client: &Client,
    cr: &KmsDynamicSecret,
    status: &KmsDynamicSecretStatus,
) -> Result<KmsDynamicSecret, SyncError> {
    if cr.status.as_ref() == Some(status) {
        return Ok(cr.clone());
    }
    let ns = cr.namespace().unwrap_or_default();
    let body = json!({
        "metadata": {"resourceVersion": cr.resource_version()},
        "status": status,
    });
    Api::<KmsDynamicSecret>::namespaced(client.clone(), &ns)
        .patch_status(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
        .map_err(|e| SyncError::kube("writing the status", e))
}

/// Report a failure in the conditions (and the force-sync value handled)
/// only, never the lease fields, which the copy at hand may hold in an
/// older state.
async fn write_conditions(ctx: &Context, cr: &KmsDynamicSecret, status: &KmsDynamicSecretStatus) {
    if cr
        .status
        .as_ref()
        .map(|s| (&s.conditions, s.observed_generation, &s.force_sync))
        == Some((
            &status.conditions,
            status.observed_generation,
            &status.force_sync,
        ))
    {
        return;
    }
    let ns = cr.namespace().unwrap_or_default();
    let body = json!({"status": {
        "conditions": status.conditions,
        "observedGeneration": status.observed_generation,
        "forceSync": status.force_sync,
    }});
    if let Err(e) = Api::<KmsDynamicSecret>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
    {
        tracing::debug!(error = %e, "could not report a failure in the status");
    }
}

/// What the lease steps of one sync share.
struct Step<'a> {
    ctx: &'a Context,
    cr: &'a KmsDynamicSecret,
    /// The resource's owner id.
    me: &'a str,
    identity: &'a Identity,
    lease_target: &'a LeaseTarget,
    shard: u32,
    cancel: &'a CancellationToken,
    /// When the sync started (lease times).
    now: Timestamp,
    /// The same, for conditions.
    condition_now: Time,
}

impl Step<'_> {
    /// Revoke a lease remembered in the cache that the status does not
    /// name (created before the process died, never recorded), and forget
    /// it; a revocation that fails is retried at the next reconcile.
    async fn settle_pending(&self, status: &KmsDynamicSecretStatus) {
        let uid = self.cr.uid().unwrap_or_default();
        let pending = Pending::new(self.ctx.cache.as_ref(), &uid);
        let id = match pending::settle(pending.get().as_ref(), status, self.now) {
            Settle::Nothing => return,
            Settle::Forget => return pending.forget(),
            Settle::Revoke(id) => id,
        };
        if ensure_owner(self.ctx, self.shard, self.cancel).is_err() {
            return;
        }
        match self
            .ctx
            .kms
            .revoke_lease(self.identity, self.lease_target, &id)
            .await
        {
            Ok(()) => {
                pending.forget();
                tracing::info!(resource = %self.me, lease = %id, "revoked a lease created before a restart and never recorded");
                event(
                    self.ctx,
                    self.cr,
                    EventType::Normal,
                    "UnrecordedLeaseRevoked",
                    &format!(
                        "Revoked lease {id}: it was created before a restart and never recorded"
                    ),
                )
                .await;
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(resource = %self.me, lease = %id, error = %e, "could not revoke an unrecorded lease; retried at the next reconcile");
            }
            Err(e) => {
                pending.forget();
                tracing::warn!(resource = %self.me, lease = %id, error = %e, "an unrecorded lease cannot be revoked; it expires at its TTL");
            }
        }
    }

    /// Revoke the retired leases whose grace is over; the others (and
    /// those whose revocation failed, retried next time) stay listed.
    async fn revoke_retired(&self, status: &mut KmsDynamicSecretStatus) -> Result<(), SyncError> {
        let mut kept = Vec::new();
        for r in std::mem::take(&mut status.retired_leases) {
            if r.revoke_after.0 <= self.now {
                ensure_owner(self.ctx, self.shard, self.cancel)?;
                match self
                    .ctx
                    .kms
                    .revoke_lease(self.identity, self.lease_target, &r.id)
                    .await
                {
                    Ok(()) => {
                        tracing::info!(resource = %self.me, lease = %r.id, "replaced lease revoked");
                        event(
                            self.ctx,
                            self.cr,
                            EventType::Normal,
                            "LeaseRevoked",
                            &format!("Revoked replaced lease {}", r.id),
                        )
                        .await;
                    }
                    Err(e) => {
                        tracing::warn!(lease = %r.id, error = %e, "could not revoke a replaced lease; will retry");
                        kept.push(r);
                    }
                }
            } else {
                kept.push(r);
            }
        }
        status.retired_leases = kept;
        Ok(())
    }

    /// Renew the lease; a refused renewal asks for a new lease, a failed
    /// one is recorded in the status and returned.
    async fn renew(
        &self,
        status: &mut KmsDynamicSecretStatus,
        written: &KmsDynamicSecret,
    ) -> Result<Decision, SyncError> {
        let Some(lease) = status.lease.clone() else {
            return Ok(Decision::Create {
                reason: "no lease is recorded",
            });
        };
        ensure_owner(self.ctx, self.shard, self.cancel)?;
        match self
            .ctx
            .kms
            .renew_lease(
                self.identity,
                self.lease_target,
                &lease.id,
                lease.ttl.as_deref(),
            )
            .await
        {
            Ok(renewed) => {
                tracing::debug!(resource = %self.me, lease = %lease.id, expires = %renewed.expire_at, "lease renewed");
                if let Some(l) = status.lease.as_mut() {
                    l.expires_at = Time(renewed.expire_at);
                    l.version = renewed.version;
                }
                conditions::set(
                    &mut status.conditions,
                    ct::LEASE_RENEWAL,
                    Status::True,
                    "Renewed",
                    &format!(
                        "Lease {} renewed; expires at {}",
                        lease.id, renewed.expire_at
                    ),
                    self.cr.metadata.generation,
                    &self.condition_now,
                );
                Ok(Decision::Renew)
            }
            Err(e) if renewal_refused(&e) => {
                conditions::set(
                    &mut status.conditions,
                    ct::LEASE_RENEWAL,
                    Status::False,
                    "RenewalRefused",
                    &conditions::bounded(&format!(
                        "Lease {} cannot be renewed ({e}); it is replaced",
                        lease.id
                    )),
                    self.cr.metadata.generation,
                    &self.condition_now,
                );
                event(
                    self.ctx,
                    self.cr,
                    EventType::Warning,
                    "LeaseRenewalRefused",
                    &format!("Lease {} cannot be renewed; replacing it", lease.id),
                )
                .await;
                Ok(Decision::Create {
                    reason: "its renewal was refused",
                })
            }
            Err(e) => {
                conditions::set(
                    &mut status.conditions,
                    ct::LEASE_RENEWAL,
                    Status::False,
                    e.reason(),
                    &conditions::bounded(&format!("Renewing lease {} failed: {e}", lease.id)),
                    self.cr.metadata.generation,
                    &self.condition_now,
                );
                // Keeps the revocations of retired leases made above.
                let _ = write_status(&self.ctx.client, written, status).await;
                event(
                    self.ctx,
                    self.cr,
                    EventType::Warning,
                    "LeaseRenewalFailed",
                    &conditions::bounded(&e.to_string()),
                )
                .await;
                Err(SyncError::Kms(e))
            }
        }
    }

    /// Create a lease and record it (a step that finishes even when the
    /// reconcile is dropped; a lease that cannot be recorded is revoked):
    /// the recorded status, the object as written, the new lease.
    async fn create(
        &self,
        reason: &'static str,
        status: KmsDynamicSecretStatus,
        written: KmsDynamicSecret,
    ) -> Result<
        (
            KmsDynamicSecretStatus,
            KmsDynamicSecret,
            crate::kms::leases::CreatedLease,
        ),
        SyncError,
    > {
        ensure_owner(self.ctx, self.shard, self.cancel)?;
        // Creating and recording the lease runs as a task of its own: a
        // reconcile dropped when its shard is lost does not stop it
        // halfway, and a lease that cannot be recorded (write failed,
        // shard lost meanwhile) is revoked.
        let step = NewLease {
            reason,
            now: self.now,
            generation: self.cr.metadata.generation,
            condition_now: self.condition_now.clone(),
            ttl: self.cr.spec.lease_ttl.clone().filter(|t| !t.is_empty()),
        };
        let (created, recorded, w) = self
            .ctx
            .critical
            .spawn(create_and_record(
                self.ctx.kms.clone(),
                self.ctx.client.clone(),
                self.ctx.cache.clone(),
                self.identity.clone(),
                self.lease_target.clone(),
                written,
                status,
                self.cancel.clone(),
                step,
            ))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
        let lease = &created.lease;
        tracing::info!(resource = %self.me, lease = %lease.id, reason, retired = ?recorded.retired_leases.iter().map(|r| (&r.id, r.revoke_after.0)).collect::<Vec<_>>(), "lease created");
        event(
            self.ctx,
            self.cr,
            EventType::Normal,
            "LeaseCreated",
            &format!("Created lease {} ({reason})", lease.id),
        )
        .await;
        Ok((recorded, w, created))
    }
}

async fn event(ctx: &Context, cr: &KmsDynamicSecret, type_: EventType, reason: &str, note: &str) {
    ctx.publish(&ctx.served.object_ref(cr), "Lease", type_, reason, note)
        .await;
}

async fn publish_ready_change(
    ctx: &Context,
    cr: &KmsDynamicSecret,
    status: &KmsDynamicSecretStatus,
    error: Option<&SyncError>,
) {
    let before = cr.status.clone().unwrap_or_default();
    publish_ready_change_from(ctx, cr, &before, status, error).await;
}

async fn publish_ready_change_from(
    ctx: &Context,
    cr: &KmsDynamicSecret,
    before: &KmsDynamicSecretStatus,
    after: &KmsDynamicSecretStatus,
    error: Option<&SyncError>,
) {
    if let Some((type_, reason, note)) = ready_event(before, after, error) {
        event(ctx, cr, type_, &reason, &note).await;
    }
}
