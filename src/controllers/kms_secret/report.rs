//! Write the status a sync ends with (one patch, only when it changed), and
//! the Events of a change of `Ready` or of a held reload.

use super::Controller;
use super::plan;
use super::status::{Progress, Synced, next_status, now_time, status_changes, status_unchanged};

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;

use crate::api::conditions as ct;
use crate::api::kms_secret::{KmsSecret, KmsSecretStatus};
use crate::controllers::apply::FIELD_MANAGER;
use crate::controllers::conditions::{self};
use crate::controllers::context::Context;
use crate::controllers::error::SyncError;
use crate::controllers::reload::Reloads;
use crate::controllers::target::TargetKind;

impl Controller {
    pub(super) async fn write_status(
        &self,
        ctx: &Context,
        cr: &KmsSecret,
        shard: u32,
        outcome: &Result<Synced, SyncError>,
        progress: &Progress,
    ) -> Result<(), SyncError> {
        let old = cr.status.clone().unwrap_or_default();
        let reloads = if outcome.is_ok() {
            self.consumers_of(ctx, cr)
        } else {
            Reloads::default()
        };
        let status = next_status(cr, shard, outcome, progress, &reloads, &now_time());
        if status_unchanged(&old, &status) {
            return Ok(());
        }
        let ns = cr.namespace().unwrap_or_default();
        let started = std::time::Instant::now();
        let made = Api::<KmsSecret>::namespaced(ctx.client.clone(), &ns)
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
        if let (Some(uid), Some(rv)) = (cr.uid(), made.resource_version()) {
            self.written.written(&uid, &rv, status.clone());
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

    /// Opted-in workloads that use any target of the resource, and the gradual
    /// reloads of its targets that are held.
    pub(super) fn consumers_of(&self, ctx: &Context, cr: &KmsSecret) -> Reloads {
        let targets =
            plan::targets(cr, ctx.settings.allow_cross_namespace_refs).unwrap_or_default();
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
}
