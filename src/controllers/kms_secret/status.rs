//! The status after a sync (pure): which conditions say what, the last
//! sync time, the number of keys, the shard. No I/O; unit-tested here.

use super::plan;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::api::conditions as ct;
use crate::api::kms_secret::{KmsSecret, KmsSecretStatus};
use crate::controllers::conditions::{self, Status};
use crate::controllers::error::SyncError;
use crate::controllers::force_sync;
use crate::controllers::instant::{Nudge, StreamState};
use crate::controllers::reload::Reloads;

/// What a successful sync did.
pub(super) struct Synced {
    /// When the KMS was last checked successfully, if known.
    pub(super) last_sync: Option<SystemTime>,
    /// A target was written (created, or its data, labels or annotations
    /// changed).
    pub(super) wrote: bool,
    pub(super) next_due: SystemTime,
    pub(super) synced_keys: Option<i64>,
    pub(super) targets: usize,
    /// The instant-update stream, when asked for.
    pub(super) stream: Option<StreamState>,
}

/// What a sync got done before it ended (well or not).
#[derive(Default)]
pub(super) struct Progress {
    /// What lets the next scheduled resync do without a reconcile, when
    /// the sync left the resource in step ([`super::rearm`]).
    pub(super) ticket: Option<super::rearm::Ticket>,
    /// The login method, when a token was obtained.
    pub(super) logged_in: Option<&'static str>,
    /// An instant-update event (or its stream's opening) made this sync
    /// due.
    pub(super) nudged: Option<Nudge>,
    /// Where the endpoint's host and CA came from, when it was resolved.
    pub(super) endpoint: Option<String>,
}

/// The spec field of the resource's authentication method, for messages.
pub(super) fn auth_method_name(cr: &KmsSecret) -> &'static str {
    match &cr.spec.authentication {
        None => "tokenSecretReference",
        Some(a) => a.method().map_or("no method", |m| m.name().field()),
    }
}

pub(super) fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// A time as the API server stores it (RFC 3339, whole seconds), so that a
/// status compared with its cached copy is not "changed" by the fraction
/// of a second the cache never had (a write the server would find empty).
pub(super) fn whole_seconds(t: k8s_openapi::jiff::Timestamp) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// Write the status for the outcome of a sync (one patch, only when it
/// changes), and an Event when `Ready` changes.
/// The status of `cr` after a sync (pure): the login, sync, readiness,
/// instant-update and auto-reload conditions, the last sync time, the
/// number of keys and the shard. `reloads` is how many workloads that
/// opted in to auto-reload use the targets, and the gradual reloads held.
pub(super) fn next_status(
    cr: &KmsSecret,
    shard: u32,
    outcome: &Result<Synced, SyncError>,
    progress: &Progress,
    reloads: &Reloads,
    now: &Time,
) -> KmsSecretStatus {
    let generation = cr.metadata.generation;
    let auth_method = auth_method_name(cr);
    let old = cr.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let c = &mut status.conditions;
    // A login that worked is reported whatever happened after it (a
    // template error, a KMS refusal of the folder).
    if let Some(endpoint) = &progress.endpoint {
        conditions::endpoint_resolved(c, endpoint, generation, now);
    }
    if let Some(strategy) = progress.logged_in {
        conditions::logged_in(c, ct::LOADED_KMS_TOKEN, strategy, generation, now);
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
    status.force_sync = force_sync::settle(
        cr,
        throttled,
        &mut status.conditions,
        ct::READY_TO_SYNC_SECRETS,
    );
    // `lastSyncTime` moves with a sync that changed something: a target, or
    // the status itself. A check that finds everything in step writes
    // nothing, so a steady state costs the API server no write.
    if let Ok(Synced {
        last_sync: Some(t),
        wrote,
        ..
    }) = outcome
        && (*wrote || old.last_sync_time.is_none() || !status_unchanged(&old, &status))
    {
        status.last_sync_time = Some(whole_seconds(
            k8s_openapi::jiff::Timestamp::try_from(*t).unwrap_or(now.0),
        ));
    }
    status
}

/// The `InstantUpdates` condition after a sync, by its stream's state.
pub(super) fn instant_updates_condition(
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
pub(super) fn login_fix(cr: &KmsSecret, e: &SyncError) -> Option<String> {
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
pub(super) struct Failure<'a> {
    error: &'a SyncError,
    /// What to do about it, when the error alone does not say.
    fix: Option<&'a str>,
    auth_method: &'a str,
    /// Only throttled, while the targets are in step with the spec.
    throttled_in_step: bool,
}

/// The conditions of a failed sync: the login's (when it failed), the
/// sync's and `Ready` (unless only throttled while in step).
pub(super) fn failure_conditions(
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
    if e.is_login_failure() {
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

/// The condition types (and status fields) that differ between two
/// statuses, for the debug line of a status write.
pub(super) fn status_changes(old: &KmsSecretStatus, new: &KmsSecretStatus) -> Vec<String> {
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

pub(super) fn status_unchanged(a: &KmsSecretStatus, b: &KmsSecretStatus) -> bool {
    conditions::same(&a.conditions, &b.conditions)
        && a.observed_generation == b.observed_generation
        && a.last_sync_time == b.last_sync_time
        && a.synced_keys == b.synced_keys
        && a.shard == b.shard
        && a.force_sync == b.force_sync
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

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
            wrote: true,
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
            wrote: true,
            next_due: SystemTime::now(),
            synced_keys: Some(3),
            targets: 1,
            stream: Some(StreamState::Connecting),
        };
        let progress = Progress {
            logged_in: Some("universal"),
            nudged: None,
            endpoint: Some("hostAPI https://kms.example/api from spec; CA: system roots".into()),
            ticket: None,
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
    fn a_check_that_changes_nothing_leaves_the_status_as_it_was() {
        let first = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let synced = |at: u64, wrote: bool| Synced {
            last_sync: Some(first + Duration::from_secs(at)),
            wrote,
            next_due: SystemTime::now(),
            synced_keys: Some(3),
            targets: 1,
            stream: None,
        };
        let progress = Progress::default();
        let status_after = |cr: &KmsSecret, s: Synced| {
            next_status(cr, 5, &Ok(s), &progress, &0.into(), &now_time())
        };
        let ok = status_after(&kms_secret(None), synced(0, true));
        let second = |s: &KmsSecretStatus| s.last_sync_time.as_ref().map(|t| t.0.as_second());
        assert_eq!(second(&ok), Some(1_800_000_000));
        // A resync a minute later that finds the targets in step (a `304`,
        // or the same data): nothing to write, not even the time.
        let checked = status_after(&kms_secret(Some(ok.clone())), synced(60, false));
        assert!(status_unchanged(&ok, &checked), "{checked:?}");
        // A sync that wrote a target moves it.
        let wrote = status_after(&kms_secret(Some(ok.clone())), synced(120, true));
        assert_eq!(second(&wrote), Some(1_800_000_120));
        // So does one whose status changes anyway (a new generation).
        let mut edited = kms_secret(Some(ok.clone()));
        edited.metadata.generation = Some(3);
        let regenerated = status_after(&edited, synced(180, false));
        assert_eq!(second(&regenerated), Some(1_800_000_180));
        // And a first sync that found its targets already in step.
        let adopted = status_after(&kms_secret(None), synced(240, false));
        assert_eq!(second(&adopted), Some(1_800_000_240));
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
