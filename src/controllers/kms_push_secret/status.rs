//! The status of a KmsPushSecret: conditions with the polarity of the spec
//! (`True` is good for `Ready`, `Authenticated` and `Reconcile`; the
//! `FailedTo…Secrets` conditions are `True` only when a write of that kind
//! failed, and then name the keys), `managedSecrets`, `generatedSecrets`,
//! `observedGeneration`, `lastSyncTime`, `syncedKeys`, `shard` — in one
//! patch, written only when something changed — and one Event per change of
//! `Ready`. Messages name keys, objects and the KMS's own words, never a
//! value.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;

use super::plan::{Op, key_list};
use super::write::{Applied, Cause};
use crate::api::conditions as ct;
use crate::api::kms_push_secret::{KmsPushSecret, KmsPushSecretStatus};
use crate::controllers::apply::FIELD_MANAGER;
use crate::controllers::conditions::{self, Status};
use crate::controllers::context::Context;
use crate::controllers::error::SyncError;
use crate::controllers::workers::Action;

/// What one reconcile found and did.
#[derive(Debug, Default)]
pub struct Report {
    /// The resync interval, when the spec could be read.
    pub interval: Option<Duration>,
    /// The login method, once a token was obtained.
    pub strategy: Option<&'static str>,
    /// Where the endpoint's host and CA came from, once resolved.
    pub endpoint: Option<String>,
    /// Why the reconcile stopped before writing (or could not finish).
    pub error: Option<SyncError>,
    /// The diff and its writes, when they ran.
    pub applied: Option<Applied>,
    /// Keys the resource pushes.
    pub wanted: usize,
    /// KMS folders this push created (`push.createFolders`).
    pub created_folders: Vec<String>,
}

/// Ready's verdict: status, reason, message.
struct Verdict {
    ready: bool,
    reason: String,
    message: String,
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

impl Report {
    /// Whether some key failed to be written.
    fn failures(&self) -> Vec<&(String, Cause)> {
        self.applied
            .as_ref()
            .map(|a| a.all_failures().collect())
            .unwrap_or_default()
    }

    fn skipped(&self) -> &[String] {
        self.applied
            .as_ref()
            .map(|a| a.skipped.as_slice())
            .unwrap_or_default()
    }

    fn conflicts(&self) -> &[(String, String)] {
        self.applied
            .as_ref()
            .map(|a| a.conflicts.as_slice())
            .unwrap_or_default()
    }

    /// Keys in step in the KMS now.
    pub fn synced(&self) -> Option<i64> {
        let a = self.applied.as_ref()?;
        let failed_wanted =
            a.failed(Op::Create).len() + a.failed(Op::Update).len() + a.failed(Op::Replace).len();
        let n = self
            .wanted
            .saturating_sub(failed_wanted)
            .saturating_sub(a.skipped.len())
            .saturating_sub(a.conflicts.len());
        Some(i64::try_from(n).unwrap_or(i64::MAX))
    }

    fn verdict(&self) -> Verdict {
        if let Some(e) = &self.error {
            return Verdict {
                ready: false,
                reason: e.reason().to_owned(),
                message: format!("Nothing was written to the KMS: {e}"),
            };
        }
        let failures = self.failures();
        if let Some((_, first)) = failures.first() {
            let keys: Vec<String> = failures.iter().map(|(k, _)| k.clone()).collect();
            return Verdict {
                ready: false,
                reason: first.reason().to_owned(),
                message: format!(
                    "{} key{} could not be written: {} ({first})",
                    keys.len(),
                    plural(keys.len()),
                    key_list(&keys)
                ),
            };
        }
        let conflicts = self.conflicts();
        if !conflicts.is_empty() {
            let named: Vec<String> = conflicts
                .iter()
                .map(|(k, owner)| format!("{k} ({owner})"))
                .collect();
            return Verdict {
                ready: false,
                reason: "KeyConflict".to_owned(),
                message: format!(
                    "{} key{} are pushed by another resource and were left as they are: {}",
                    named.len(),
                    plural(named.len()),
                    key_list(&named)
                ),
            };
        }
        let skipped = self.skipped();
        if !skipped.is_empty() {
            return Verdict {
                ready: false,
                reason: "KeysNotOwned".to_owned(),
                message: format!(
                    "{} key{} already exist in the KMS and were not created by this resource, so they were left as they are: {}. \
                     Set updatePolicy: Replace to overwrite them",
                    skipped.len(),
                    plural(skipped.len()),
                    key_list(skipped)
                ),
            };
        }
        let n = self.synced().unwrap_or(0);
        Verdict {
            ready: true,
            reason: "Pushed".to_owned(),
            message: format!(
                "{n} key{} in step in the KMS",
                plural(usize::try_from(n).unwrap_or(0))
            ),
        }
    }

    /// What the worker does next: requeue at the resync interval or the
    /// next rotation; back off after failures that a retry may fix.
    pub fn next(&self, now: SystemTime) -> Result<Action, SyncError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let failures = self.failures();
        // An approval request is not retried at once: every attempt would
        // open another change request in the KMS.
        if let Some((_, cause)) = failures.iter().find(|(_, c)| !matches!(c, Cause::Approval)) {
            return Err(match cause {
                Cause::Kms(e) => SyncError::Kms(e.clone()),
                Cause::Generator(why) => SyncError::Spec(why.clone()),
                Cause::Approval => unreachable!("filtered above"),
            });
        }
        let mut due: Option<SystemTime> = self
            .interval
            .map(|i| now + crate::controllers::queue::jittered(i, fastrand::f64()));
        if let Some(r) = self.applied.as_ref().and_then(|a| a.next_rotation) {
            due = Some(due.map_or(r, |d| d.min(r)));
        }
        // Keys left alone are checked again now and then, so that a key
        // removed from the KMS by hand is pushed without waiting for a change.
        if !self.skipped().is_empty() || !self.conflicts().is_empty() {
            let recheck =
                now + Duration::from_secs(300).min(self.interval.unwrap_or(Duration::MAX));
            due = Some(due.map_or(recheck, |d| d.min(recheck)));
        }
        Ok(match due {
            Some(at) => Action::RequeueAt(at),
            None => Action::Done,
        })
    }
}

/// The current time as a status timestamp.
pub fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn failed_condition(
    c: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    type_: &str,
    verb: &str,
    failed: &[(String, Cause)],
    generation: Option<i64>,
    now: &Time,
) {
    match failed.first() {
        None => conditions::set(
            c,
            type_,
            Status::False,
            "NoFailures",
            &format!("No key failed to be {verb}"),
            generation,
            now,
        ),
        Some((_, first)) => {
            let keys: Vec<String> = failed.iter().map(|(k, _)| k.clone()).collect();
            conditions::set(
                c,
                type_,
                Status::True,
                first.reason(),
                &conditions::bounded(&format!(
                    "Failed to be {verb}: {} ({first})",
                    key_list(&keys)
                )),
                generation,
                now,
            );
        }
    }
}

const FAILED_TYPES: [(&str, Op, &str); 4] = [
    (ct::FAILED_TO_CREATE_SECRETS, Op::Create, "created"),
    (ct::FAILED_TO_UPDATE_SECRETS, Op::Update, "updated"),
    (ct::FAILED_TO_DELETE_SECRETS, Op::Delete, "deleted"),
    (ct::FAILED_TO_REPLACE_SECRETS, Op::Replace, "replaced"),
];

/// The status a report leads to.
pub fn next_status(
    old: &KmsPushSecretStatus,
    report: &Report,
    generation: Option<i64>,
    shard: u32,
    now: &Time,
) -> KmsPushSecretStatus {
    let mut status = old.clone();
    let c = &mut status.conditions;
    if let Some(endpoint) = &report.endpoint {
        conditions::endpoint_resolved(c, endpoint, generation, now);
    }
    if let Some(strategy) = report.strategy {
        conditions::logged_in(c, ct::AUTHENTICATED, strategy, generation, now);
    } else if let Some(e) = &report.error
        && e.is_login_failure()
    {
        conditions::set(
            c,
            ct::AUTHENTICATED,
            Status::False,
            e.reason(),
            &conditions::bounded(&format!("Failed to log in to the KMS: {e}")),
            generation,
            now,
        );
    }
    for (type_, op, verb) in FAILED_TYPES {
        match &report.applied {
            Some(a) => failed_condition(c, type_, verb, a.failed(op), generation, now),
            None if conditions::get(c, type_).is_none() => conditions::set(
                c,
                type_,
                Status::Unknown,
                "NotAttempted",
                "No write has been attempted yet",
                generation,
                now,
            ),
            None => {}
        }
    }
    let verdict = report.verdict();
    let reconcile_ok = report.error.is_none() && report.failures().is_empty();
    if reconcile_ok {
        let created = if report.created_folders.is_empty() {
            String::new()
        } else {
            format!(
                " (it created the KMS folder{} {})",
                plural(report.created_folders.len()),
                report.created_folders.join(", ")
            )
        };
        conditions::set(
            c,
            ct::RECONCILE,
            Status::True,
            "OK",
            &format!("The last reconcile pushed every key it could{created}"),
            generation,
            now,
        );
    } else {
        conditions::set(
            c,
            ct::RECONCILE,
            Status::False,
            &verdict.reason,
            &conditions::bounded(&verdict.message),
            generation,
            now,
        );
    }
    conditions::set(
        c,
        ct::READY,
        if verdict.ready {
            Status::True
        } else {
            Status::False
        },
        &verdict.reason,
        &conditions::bounded(&verdict.message),
        generation,
        now,
    );
    if let Some(a) = &report.applied {
        status.managed_secrets = Some(a.managed.clone()).filter(|m| !m.is_empty());
        status.generated_secrets = Some(a.generated.clone()).filter(|m| !m.is_empty());
        status.synced_keys = report.synced();
    }
    status.observed_generation = generation;
    status.shard = Some(i32::try_from(shard).unwrap_or(i32::MAX));
    // `lastSyncTime` moves with a reconcile that changed something: a key
    // written to the KMS, a folder created, or the status itself. One that
    // finds the KMS in step writes nothing.
    if let Some(a) = &report.applied
        && reconcile_ok
        && (a.written.values().any(|n| *n > 0)
            || !report.created_folders.is_empty()
            || old.last_sync_time.is_none()
            || !unchanged(old, &status))
    {
        status.last_sync_time = Some(now.clone());
    }
    status
}

fn non_empty<T: Clone>(m: &Option<BTreeMap<String, T>>) -> Option<BTreeMap<String, T>> {
    m.clone().filter(|m| !m.is_empty())
}

fn unchanged(a: &KmsPushSecretStatus, b: &KmsPushSecretStatus) -> bool {
    conditions::same(&a.conditions, &b.conditions)
        && non_empty(&a.managed_secrets) == non_empty(&b.managed_secrets)
        && non_empty(&a.generated_secrets) == non_empty(&b.generated_secrets)
        && a.observed_generation == b.observed_generation
        && a.last_sync_time == b.last_sync_time
        && a.synced_keys == b.synced_keys
        && a.shard == b.shard
        && a.force_sync == b.force_sync
}

/// Patch the status (when it changed) and publish an Event when `Ready`
/// changed (status or reason): the resourceVersion the write made, `None`
/// when nothing was written.
pub async fn write(
    ctx: &Context,
    cr: &KmsPushSecret,
    old: &KmsPushSecretStatus,
    status: &KmsPushSecretStatus,
) -> Result<Option<String>, SyncError> {
    if unchanged(old, status) {
        return Ok(None);
    }
    let ns = cr.namespace().unwrap_or_default();
    // The whole status is applied by one field manager, so entries left
    // out (a key no longer managed) are removed.
    let made = Api::<KmsPushSecret>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &cr.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(ctx.served.status_apply::<KmsPushSecret>(status)),
        )
        .await
        .map_err(|e| SyncError::kube("writing the status", e))?;

    if let Some(ready) = conditions::ready_changed(&old.conditions, &status.conditions) {
        let type_ = if ready.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(ctx, cr, type_, &ready.reason, &ready.message).await;
    }
    Ok(made.resource_version())
}

/// Publish an Event about the resource (failures are logged, not returned).
pub async fn publish(
    ctx: &Context,
    cr: &KmsPushSecret,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    ctx.publish(&ctx.served.object_ref(cr), "Push", type_, reason, note)
        .await;
}

/// The status while a deletion's cleanup fails: what is still owned, which
/// keys could not be deleted, and why the resource is still there.
pub fn cleanup_status(
    old: &KmsPushSecretStatus,
    managed: &BTreeMap<String, String>,
    failed: &[(String, Cause)],
    error: &str,
    reason: &str,
    generation: Option<i64>,
    now: &Time,
) -> KmsPushSecretStatus {
    let mut status = old.clone();
    let c = &mut status.conditions;
    if !failed.is_empty() {
        failed_condition(
            c,
            ct::FAILED_TO_DELETE_SECRETS,
            "deleted",
            failed,
            generation,
            now,
        );
    }
    conditions::set(
        c,
        ct::RECONCILE,
        Status::False,
        reason,
        &conditions::bounded(error),
        generation,
        now,
    );
    conditions::set(
        c,
        ct::READY,
        Status::False,
        reason,
        &conditions::bounded(error),
        generation,
        now,
    );
    status.managed_secrets = Some(managed.clone()).filter(|m| !m.is_empty());
    status.generated_secrets = status.generated_secrets.take().map(|mut g| {
        g.retain(|k, _| managed.values().any(|v| v == k));
        g
    });
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::kms_push_secret::write::op_key;

    fn t() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap())
    }

    fn cond<'a>(
        s: &'a KmsPushSecretStatus,
        type_: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        conditions::get(&s.conditions, type_).unwrap()
    }

    #[test]
    fn a_clean_push_is_good_everywhere() {
        let report = Report {
            strategy: Some("UNIVERSAL_MACHINE_IDENTITY"),
            applied: Some(Applied {
                in_step: 2,
                ..Applied::default()
            }),
            wanted: 2,
            ..Report::default()
        };
        let s = next_status(&KmsPushSecretStatus::default(), &report, Some(3), 0, &t());
        for (type_, want) in [
            (ct::READY, "True"),
            (ct::AUTHENTICATED, "True"),
            (ct::RECONCILE, "True"),
            (ct::FAILED_TO_CREATE_SECRETS, "False"),
            (ct::FAILED_TO_UPDATE_SECRETS, "False"),
            (ct::FAILED_TO_DELETE_SECRETS, "False"),
            (ct::FAILED_TO_REPLACE_SECRETS, "False"),
        ] {
            assert_eq!(cond(&s, type_).status, want, "{type_}");
            assert_eq!(cond(&s, type_).observed_generation, Some(3), "{type_}");
        }
        assert_eq!(s.synced_keys, Some(2));
        assert!(s.last_sync_time.is_some());
        assert_eq!(
            report.next(SystemTime::now()).unwrap(),
            Action::Done,
            "no resyncInterval: event-driven only"
        );
    }

    #[test]
    fn a_resync_that_finds_the_kms_in_step_writes_no_status() {
        let report = |updated: usize| {
            let mut applied = Applied {
                in_step: 2 - updated,
                ..Applied::default()
            };
            if updated > 0 {
                applied.written.insert(op_key(Op::Update), updated);
            }
            Report {
                strategy: Some("UNIVERSAL_MACHINE_IDENTITY"),
                applied: Some(applied),
                wanted: 2,
                ..Report::default()
            }
        };
        let first = next_status(
            &KmsPushSecretStatus::default(),
            &report(0),
            Some(3),
            0,
            &t(),
        );
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(5_000).unwrap());
        let again = next_status(&first, &report(0), Some(3), 0, &later);
        assert!(unchanged(&first, &again), "{again:?}");
        // A key written moves the time.
        let pushed = next_status(&first, &report(1), Some(3), 0, &later);
        assert_eq!(pushed.last_sync_time, Some(later));
    }

    #[test]
    fn the_endpoint_and_its_sources_are_reported_once_resolved() {
        let none = next_status(
            &KmsPushSecretStatus::default(),
            &Report::default(),
            Some(1),
            0,
            &t(),
        );
        assert!(conditions::get(&none.conditions, ct::ENDPOINT).is_none());
        let report = Report {
            endpoint: Some(
                "hostAPI https://kms.example/api from kms-config (kms-operator-system/kms-config); \
                 CA: system roots"
                    .to_owned(),
            ),
            ..Report::default()
        };
        let s = next_status(&KmsPushSecretStatus::default(), &report, Some(2), 0, &t());
        let c = cond(&s, ct::ENDPOINT);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Resolved"));
        assert!(
            c.message
                .contains("from kms-config (kms-operator-system/kms-config)")
        );
    }

    #[test]
    fn failures_name_keys_not_values() {
        let mut applied = Applied::default();
        applied.failures.insert(
            op_key(Op::Create),
            vec![(
                "DB_PASSWORD".into(),
                Cause::Kms(crate::kms::KmsError::Api {
                    endpoint: "POST /api/v3/secrets/batch/raw",
                    status: 403,
                    error: "PermissionDenied".into(),
                    message: "You are not allowed to create secrets".into(),
                }),
            )],
        );
        applied.failures.insert(
            op_key(Op::Update),
            vec![("API_KEY".into(), Cause::Approval)],
        );
        let report = Report {
            strategy: Some("UNIVERSAL_MACHINE_IDENTITY"),
            applied: Some(applied),
            wanted: 3,
            ..Report::default()
        };
        let s = next_status(&KmsPushSecretStatus::default(), &report, Some(1), 0, &t());
        let create = cond(&s, ct::FAILED_TO_CREATE_SECRETS);
        assert_eq!(create.status, "True");
        assert!(create.message.contains("DB_PASSWORD"), "{}", create.message);
        assert_eq!(create.reason, "KMSAccessDenied");
        let update = cond(&s, ct::FAILED_TO_UPDATE_SECRETS);
        assert_eq!(
            (update.status.as_str(), update.reason.as_str()),
            ("True", "ApprovalRequired")
        );
        assert_eq!(cond(&s, ct::FAILED_TO_DELETE_SECRETS).status, "False");
        assert_eq!(cond(&s, ct::READY).status, "False");
        assert_eq!(cond(&s, ct::RECONCILE).status, "False");
        assert!(s.last_sync_time.is_none());
        assert_eq!(s.synced_keys, Some(1));
        // A 403 is retried with backoff.
        assert!(report.next(SystemTime::now()).is_err());
    }

    #[test]
    fn approvals_alone_are_not_retried_at_once() {
        let mut applied = Applied::default();
        applied
            .failures
            .insert(op_key(Op::Create), vec![("K".into(), Cause::Approval)]);
        let report = Report {
            applied: Some(applied),
            wanted: 1,
            ..Report::default()
        };
        assert_eq!(report.next(SystemTime::now()).unwrap(), Action::Done);
    }

    #[test]
    fn keys_left_alone_are_reported_and_rechecked() {
        let report = Report {
            applied: Some(Applied {
                skipped: vec!["EXISTING".into()],
                ..Applied::default()
            }),
            wanted: 1,
            ..Report::default()
        };
        let s = next_status(&KmsPushSecretStatus::default(), &report, Some(1), 0, &t());
        let ready = cond(&s, ct::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "KeysNotOwned")
        );
        assert!(
            ready.message.contains("EXISTING") && ready.message.contains("updatePolicy: Replace")
        );
        assert_eq!(cond(&s, ct::RECONCILE).status, "True");
        let now = SystemTime::now();
        match report.next(now).unwrap() {
            Action::RequeueAt(at) => {
                assert!(at <= now + Duration::from_secs(300));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn early_errors_keep_the_write_conditions() {
        let mut old = KmsPushSecretStatus::default();
        conditions::set(
            &mut old.conditions,
            ct::FAILED_TO_CREATE_SECRETS,
            Status::False,
            "NoFailures",
            "x",
            Some(1),
            &t(),
        );
        old.managed_secrets = Some([("id1".to_owned(), "A".to_owned())].into());
        let report = Report {
            error: Some(SyncError::Reference {
                reason: "CredentialsNotFound",
                message: "credentials Secret ns/c not found".into(),
            }),
            ..Report::default()
        };
        let s = next_status(&old, &report, Some(2), 0, &t());
        assert_eq!(
            cond(&s, ct::FAILED_TO_CREATE_SECRETS).observed_generation,
            Some(1)
        );
        assert_eq!(cond(&s, ct::FAILED_TO_UPDATE_SECRETS).status, "Unknown");
        assert_eq!(cond(&s, ct::AUTHENTICATED).status, "False");
        assert_eq!(cond(&s, ct::READY).reason, "CredentialsNotFound");
        assert_eq!(s.managed_secrets, old.managed_secrets, "ownership is kept");
    }
}
