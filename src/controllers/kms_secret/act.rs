//! Act: log in and listen, fetch the scope, write the targets whose data
//! differs, prune the ones no longer listed (and, on deletion, remove the
//! finalizers of earlier versions). Every KMS or API call of a sync is here.

use super::plan::{Asked, Planned};
use super::plan::{KEPT, describe_scope, missing_environment, missing_folder, project_of};
use super::status::Progress;
use super::{Controller, plan};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::plan::{AuthChoice, Decision};
use crate::api::conditions as ct;
use crate::api::kms_secret::KmsSecret;
use crate::controllers::apply::{self, ensure_owner};
use crate::controllers::conditions::{self};
use crate::controllers::context::Context;
use crate::controllers::error::SyncError;
use crate::controllers::instant::StreamState;
use crate::controllers::key::ObjectKey;
use crate::controllers::target::Target;
use crate::controllers::target::{Claim, Desired, Observed, TargetKind, diff};
use crate::kms::{Fetch, Fetched};

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

impl Controller {
    /// Plan every target and write what differs; the desired states. A
    /// target created without a read that turns out to exist is read,
    /// checked and planned again.
    pub(super) async fn write_planned(
        &self,
        ctx: &Context,
        plan: &Planned<'_>,
        mut observed: Vec<(Option<Observed>, Claim)>,
        shard: u32,
        cancel: &CancellationToken,
    ) -> Result<(Vec<Desired>, bool), SyncError> {
        let (cr, me, targets) = (plan.cr, plan.me, plan.targets);
        let owner_ref = ctx.served.owner_ref(cr);
        let mut reads = 0;
        let mut wrote = false;
        loop {
            let desired = plan::desired_targets(
                owner_ref.as_ref(),
                cr,
                me,
                targets,
                &observed,
                plan.rendered,
            );
            let written = self
                .write_targets(
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
                    let o = self.read_target(ctx, &targets[i]).await?;
                    let c = self.claim_of(ctx, cr, me, &targets[i], o.as_ref()).await?;
                    observed[i] = (o, c);
                }
                r => return r.map(|()| (desired, wrote)),
            }
        }
    }

    /// Log in (when anything is due) and listen for changes (instant updates):
    /// the identity and scope to fetch with, and the stream's state.
    pub(super) async fn login_and_listen(
        &self,
        ctx: &Context,
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
            let (identity, choice) = crate::controllers::auth::identity_with_source(
                ctx,
                &ns,
                cr.spec.host_api.as_deref(),
                cr.spec.tls.as_ref(),
                &method,
            )
            .await?;
            self.endpoint_resolved(cr, asked.epoch);
            progress.endpoint = Some(choice.describe());
            Some((identity, scope))
        };
        let key = &asked.key;
        let stream = match (&login, asked.instant) {
            (_, false) => {
                self.instant.unregister(key);
                None
            }
            (Some((identity, scope)), true) => {
                Some(self.instant.ensure(key, identity, scope).await)
            }
            (None, true) => self.instant.state_of(key),
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
                self.instant.first_connection(key, FIRST_CONNECTION).await
            }
            other => other,
        };
        Ok((login, stream))
    }

    /// Fetch what was decided (conditionally unless full): the secrets when
    /// they came (`None` for a 304 or nothing due), and the ETag to send next.
    pub(super) async fn fetch(
        &self,
        ctx: &Context,
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
        match self
            .fetch_scope(ctx, &request, observed, cancel, progress)
            .await?
        {
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

    /// Log in and fetch: the secrets and their ETag, or `None` when the KMS
    /// says nothing changed (304). An empty folder is confirmed to exist before
    /// it may empty a target.
    async fn fetch_scope(
        &self,
        ctx: &Context,
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
        // When the KMS's budget refuses the request, an answer up to
        // LIMITED_KEPT old serves instead (never one from before an event
        // heard, never for a forced sync).
        let (not_before, refused_from) = if req.fresh {
            let now = tokio::time::Instant::now();
            (now, now)
        } else {
            (
                self.instant.not_before(req.key, SHARE_WINDOW),
                self.instant.not_before(req.key, crate::kms::LIMITED_KEPT),
            )
        };
        let result = tokio::select! {
            r = ctx.kms.fetch(identity, scope, req.etag, not_before, refused_from) => r.map(|(answer, _)| answer),
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
                    e = self.missing_part(ctx, identity, scope, error) => e,
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
                        r = self.confirm_folder(ctx, identity, scope) => r?,
                        () = cancel.cancelled() => return Err(SyncError::NotOwner),
                    }
                }
                Ok(Some((secrets.clone(), etag.clone())))
            }
        }
    }

    /// The KMS listed the scope as empty: find out whether its environment and
    /// folder exist (older servers list missing ones as empty). Only an
    /// existing folder lets the sync go on and empty the targets.
    async fn confirm_folder(
        &self,
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
        &self,
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

    /// Write the targets whose desired state differs from what was observed,
    /// in order, each observed as written (and `wrote` set); stops at the
    /// first error.
    #[allow(clippy::too_many_arguments)]
    async fn write_targets(
        &self,
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

    /// Delete owned targets that are no longer listed; release orphan ones.
    pub(super) async fn prune(
        &self,
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
        let mut stale: Vec<(apply::Unlisted, bool)> = Vec::new();
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
            let (namespace, name) = (
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            );
            if !listed(kind, &namespace, &name) {
                let owned = meta.owner_references.iter().flatten().any(|r| r.uid == uid);
                let resource_version = meta.resource_version.clone().unwrap_or_default();
                let o = apply::Unlisted {
                    kind,
                    namespace,
                    name,
                    resource_version,
                };
                stale.push((o, owned));
            }
        }
        for (o, owned) in stale {
            ensure_owner(ctx, shard, cancel)?;
            let target = format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name);
            if owned {
                apply::delete(ctx, &o).await?;
                tracing::info!(resource = %me, %target, "owned target no longer listed: deleted");
            } else {
                apply::release(ctx, &o).await?;
                tracing::info!(resource = %me, %target, "target no longer listed: released");
            }
        }
        Ok(())
    }

    pub(super) async fn strip_legacy_finalizers(
        &self,
        ctx: &Context,
        cr: &KmsSecret,
    ) -> Result<(), SyncError> {
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
}

impl Controller {
    /// A scheduled resync by ticket: when `key`'s ticket holds and its
    /// folder answers `304` to the ETag it names, the next check is moved
    /// on (in memory and in the persistent cache) and its time returned.
    /// `None`: the whole reconcile is needed.
    pub(super) async fn rearm(
        &self,
        ctx: &Context,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> Option<SystemTime> {
        let ticket = self.tickets.get(key)?;
        if !self.ticket_holds(ctx, key, &ticket) {
            self.tickets.revoke(key);
            return None;
        }
        if !self.record_holds(&ticket.uid, &ticket.etag) {
            return None;
        }
        let folder = &ticket.folder;
        let not_before = self.instant.not_before(key, SHARE_WINDOW);
        // Another resource of the folder had its ETag confirmed within
        // the window: that is this resource's answer too, without asking
        // the KMS client (the folder's resources come due together, and
        // one asks while the others wait).
        let _asking = if folder.confirmed(&ticket.etag, not_before) {
            None
        } else {
            // One of the folder's resources asks at a time; the others due
            // with it find its confirmation when their turn comes.
            tokio::select! {
                g = folder.asking.lock() => Some(g),
                () = cancel.cancelled() => return None,
            }
        };
        if !folder.confirmed(&ticket.etag, not_before) {
            // The client logs in if it must (a shared answer needs no token).
            let refused_from = self.instant.not_before(key, crate::kms::LIMITED_KEPT);
            let (answer, started) = tokio::select! {
                r = ctx.kms.fetch(&folder.identity, &folder.scope, Some(&ticket.etag), not_before, refused_from) => r.ok()?,
                () = cancel.cancelled() => return None,
            };
            if !matches!(*answer, Fetch::NotModified) {
                return None;
            }
            folder.confirm(&ticket.etag, started);
        }
        let now = SystemTime::now();
        let next_due = plan::on_grid(now, ticket.interval, ticket.phase);
        // The persistent copy moves on too, or a restart would find every
        // resource overdue: its times alone, without reading the record
        // (written with the others moved on, in one batch every few seconds).
        if let Some(cache) = &ctx.cache {
            let ms = crate::kms::client::unix_ms;
            cache.touch_sync(&ticket.uid, &ticket.etag, ms(now), ms(next_due));
        }
        self.move_record_on(&ticket.uid, &ticket.etag, now, next_due);
        tracing::debug!(resource = %key, "resync by ticket: the folder answered 304");
        Some(next_due)
    }
}
