//! Observe: a KmsSecret's targets as they are (who may write each) and
//! what is known of its last sync, then the decision what to ask of the KMS
//! ([`super::plan::decide`]).

use super::plan::{Asked, Seen};
use super::rearm;
use super::{Controller, plan};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;

use super::plan::Decision;
use super::record::SyncRecord;
use crate::api::conditions as ct;
use crate::api::kms_secret::KmsSecret;
use crate::controllers::conditions::{self};
use crate::controllers::context::Context;
use crate::controllers::error::SyncError;
use crate::controllers::force_sync;
use crate::controllers::key::ObjectKey;
use crate::controllers::registry::OwnerId;
use crate::controllers::target::Target;
use crate::controllers::target::{
    ADOPT_EXISTING_ANNOTATION, Claim, OWNER_ANNOTATION, Observed, TargetKind, claim,
};

impl Controller {
    /// Each target as it is now, and who may write it; an error for a target
    /// that is not ours to write (foreign, or another resource's).
    pub(super) async fn observe_targets(
        &self,
        ctx: &Context,
        cr: &KmsSecret,
        me: &str,
        targets: &[Target],
    ) -> Result<Vec<(Option<Observed>, Claim)>, SyncError> {
        let mut observed = Vec::with_capacity(targets.len());
        for t in targets {
            let o = self.observe(ctx, t).await?;
            let c = self.claim_of(ctx, cr, me, t, o.as_ref()).await?;
            observed.push((o, c));
        }
        Ok(observed)
    }

    /// A target as the cache has it. Managed objects are all cached; one that is
    /// not is taken as missing, to be created without a read (a create finds an
    /// object that exists: [`SyncError::Exists`], then it is read with
    /// [`read_target`]). Outside the watched namespaces nothing is cached: read.
    pub(super) async fn observe(
        &self,
        ctx: &Context,
        t: &Target,
    ) -> Result<Option<Observed>, SyncError> {
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
            None => self.read_target(ctx, t).await,
        }
    }

    /// Read a target from the API.
    pub(super) async fn read_target(
        &self,
        ctx: &Context,
        t: &Target,
    ) -> Result<Option<Observed>, SyncError> {
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

    /// Who may write target `t` as observed; an error when it is not ours to
    /// write.
    pub(super) async fn claim_of(
        &self,
        ctx: &Context,
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
        let other = self.named_owner(ctx, me, o).await?;
        let c = claim(o, me, cr.uid().as_deref(), adopt_existing, |owner| {
            plan::owner_lists(
                ctx.settings.allow_cross_namespace_refs,
                owner,
                other.as_deref(),
                t,
            )
        });
        let what = format!("{} {}/{}", t.kind.as_str(), t.namespace, t.name);
        match c.refusal(&what, "KmsSecret") {
            Some(refused) => Err(refused),
            None => Ok(c),
        }
    }

    /// The KmsSecret other than `me` that an observed target names as its
    /// owner ([`Context::resource`]: it may be in another replica's shard).
    pub(super) async fn named_owner(
        &self,
        ctx: &Context,
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
        ctx.resource(&self.store, owner.namespace, owner.name)
            .await
            .map_err(|e| SyncError::kube(format!("reading KmsSecret {id}'s spec"), e))
    }

    /// The record of the last sync: from memory; else from the persistent
    /// cache, if it matches the targets as they are now (same generation, same
    /// data by keyed hash); else derived from the status (the targets' version
    /// annotations prove their data, the status says when the KMS was last
    /// checked).
    fn last_record(&self, ctx: &Context, seen: &Seen<'_>) -> Option<SyncRecord> {
        let Seen {
            cr,
            interval,
            shard,
            targets,
            observed,
        } = *seen;
        let uid = cr.uid()?;
        if let Some(r) = self.record(&uid) {
            return Some(r);
        }
        let generation = cr.metadata.generation.unwrap_or(0);
        if let Some(r) = self.cached_record(ctx, &uid, shard) {
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
            next_due: plan::on_grid(last, interval, plan::phase_of(cr)),
            synced_keys: status.synced_keys.unwrap_or(0),
            target_hashes: Default::default(),
        })
    }

    /// Decide: nothing, a conditional request, or a full one (see
    /// [`plan::decide`]), from what is known of the last sync and what made
    /// the resource due.
    pub(super) fn ask(&self, ctx: &Context, seen: &Seen<'_>) -> Asked {
        let (cr, observed) = (seen.cr, seen.observed);
        let now = SystemTime::now();
        let record = self.last_record(ctx, seen);
        let all_intact = observed
            .iter()
            .all(|(o, c)| *c == Claim::Ours && o.as_ref().is_some_and(Observed::data_intact));
        // Instant updates: an event since the last fetch makes the resource
        // due. A resource that starts listening (after a restart, a shard
        // hand-over, or the option turned on) may have missed events
        // meanwhile: it checks once, with a conditional request.
        let instant = plan::instant_updates(&cr.spec);
        let key = ObjectKey::new(cr.namespace().unwrap_or_default(), cr.name_any());
        let nudged = instant.then(|| self.instant.take_fresh(&key)).flatten();
        let newly_listening = instant && !self.instant.is_registered(&key);
        // The global configuration changed since the endpoint was resolved:
        // check now, against the endpoint it names now.
        let epoch = ctx.global_epoch();
        let endpoint_stale = self.endpoint_stale(cr, epoch);
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
        Asked {
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
}

impl Controller {
    /// Whether `key`'s ticket still holds (see [`rearm::holds`]).
    pub(super) fn ticket_holds(
        &self,
        ctx: &Context,
        key: &ObjectKey,
        ticket: &rearm::Ticket,
    ) -> bool {
        let version = self.store.version(Some(&key.namespace), &key.name);
        rearm::holds(
            ticket,
            SystemTime::now(),
            version,
            ctx.global_epoch(),
            |t| match t.kind {
                TargetKind::Secret => ctx.secrets.version(Some(&t.namespace), &t.name),
                TargetKind::ConfigMap => ctx.config_maps.version(Some(&t.namespace), &t.name),
            },
        )
    }
}
