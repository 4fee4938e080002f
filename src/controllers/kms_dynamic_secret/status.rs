//! The pure part of a KmsDynamicSecret's status: what a new lease records
//! (and the lease it retires), the conditions a reconcile ends with, and the
//! Event a change of `Ready` gets. No I/O; unit-tested here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::plan::LeaseView;
use crate::api::KmsDynamicSecret;
use crate::api::conditions as ct;
use crate::api::kms_dynamic_secret::{KmsDynamicSecretStatus, LeaseStatus, RetiredLease};
use crate::controllers::conditions::{self, Status};
use crate::controllers::error::SyncError;
use crate::controllers::force_sync;

/// How long a replaced lease stays valid before it is revoked, at most (a
/// shorter lease period shortens it).
pub const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// What a new lease is recorded with.
pub struct NewLease {
    /// Why it was created (the condition's message says so).
    pub reason: &'static str,
    /// When it was created.
    pub now: Timestamp,
    /// The generation being reconciled.
    pub generation: Option<i64>,
    /// The time the conditions of this reconcile carry.
    pub condition_now: Time,
    /// The TTL asked for (`spec.leaseTtl`), if any.
    pub ttl: Option<String>,
}

/// The status with `created` as the current lease; the previous one is
/// retired (revoked after a grace, before it would expire by itself).
pub fn record_lease(
    status: &mut KmsDynamicSecretStatus,
    created: &crate::kms::leases::CreatedLease,
    step: &NewLease,
) {
    let (lease, now) = (&created.lease, step.now);
    let ttl = step
        .ttl
        .clone()
        .or_else(|| created.default_ttl.clone())
        .or_else(|| {
            let secs = lease.expire_at.as_second() - now.as_second();
            (secs > 0).then(|| format!("{secs}s"))
        });
    if let Some(old) = status.lease.take() {
        let period = LeaseView::from_status(&old).ttl;
        let grace = k8s_openapi::jiff::SignedDuration::try_from(RETIRE_GRACE.min(period))
            .unwrap_or_default();
        let before_expiry = old.expires_at.0 - k8s_openapi::jiff::SignedDuration::from_secs(1);
        status.retired_leases.push(RetiredLease {
            id: old.id,
            revoke_after: Time((now + grace).min(before_expiry).max(now)),
        });
    }
    status.lease = Some(LeaseStatus {
        id: lease.id.clone(),
        version: lease.version,
        creation_timestamp: Time(now),
        expires_at: Time(lease.expire_at),
        ttl,
    });
    status.dynamic_secret_id = Some(created.dynamic_secret_id.clone()).filter(|s| !s.is_empty());
    status.max_ttl = created.max_ttl.clone();
    conditions::set(
        &mut status.conditions,
        ct::LEASE_CREATED,
        Status::True,
        "Created",
        &format!(
            "Lease {} created ({}); expires at {}",
            lease.id, step.reason, lease.expire_at
        ),
        step.generation,
        &step.condition_now,
    );
}

/// How a reconcile of a KmsDynamicSecret ended.
pub enum Outcome<'a> {
    /// The lease and the Secret are in line.
    InLine {
        /// Where the endpoint's host and CA came from.
        endpoint: &'a str,
        /// Workloads that opted in to auto-reload and use the Secret.
        workloads: usize,
    },
    /// It failed; the lease fields are left as the copy at hand has them.
    Failed(&'a SyncError),
}

/// The status a reconcile ends with (pure). In line: `Endpoint`,
/// `Reconcile`, `Ready` and `AutoRedeployReady` true, with the lease that is
/// valid and until when. Failed: `Reconcile` and `Ready` false with the
/// error's reason and message, and a sync asked for by hand that the KMS's
/// budget holds back noted as waiting.
pub fn next_status(
    cr: &KmsDynamicSecret,
    mut status: KmsDynamicSecretStatus,
    outcome: Outcome<'_>,
    shard: u32,
    now: &Time,
) -> KmsDynamicSecretStatus {
    let generation = cr.metadata.generation;
    match outcome {
        Outcome::InLine {
            endpoint,
            workloads,
        } => {
            conditions::endpoint_resolved(&mut status.conditions, endpoint, generation, now);
            let mut status = active_status(status, generation, shard, workloads, now);
            status.force_sync = force_sync::after_sync(cr, false);
            status
        }
        Outcome::Failed(e) => {
            let message = conditions::bounded(&e.to_string());
            for type_ in [ct::RECONCILE, ct::READY] {
                conditions::set(
                    &mut status.conditions,
                    type_,
                    Status::False,
                    e.reason(),
                    &message,
                    generation,
                    now,
                );
            }
            status.observed_generation = generation;
            let throttled = e.is_throttled();
            status.force_sync =
                force_sync::settle(cr, throttled, &mut status.conditions, ct::RECONCILE);
            status
        }
    }
}

/// The status once the lease and the Secret are in line (pure): Reconcile
/// and Ready say which lease is valid until when, AutoRedeployReady how
/// many workloads that opted in to auto-reload use the Secret.
fn active_status(
    mut status: KmsDynamicSecretStatus,
    generation: Option<i64>,
    shard: u32,
    workloads: usize,
    now: &Time,
) -> KmsDynamicSecretStatus {
    let message = status.lease.as_ref().map_or_else(
        || "No lease".to_owned(),
        |l| format!("Lease {} valid until {}", l.id, l.expires_at.0),
    );
    conditions::set(
        &mut status.conditions,
        ct::RECONCILE,
        Status::True,
        "OK",
        &message,
        generation,
        now,
    );
    conditions::set(
        &mut status.conditions,
        ct::READY,
        Status::True,
        "LeaseActive",
        &message,
        generation,
        now,
    );
    conditions::set(
        &mut status.conditions,
        ct::AUTO_REDEPLOY_READY,
        Status::True,
        "OK",
        &format!("{workloads} workload(s) that opted in to auto-reload use the Secret"),
        generation,
        now,
    );
    status.observed_generation = generation;
    status.shard = Some(i32::try_from(shard).unwrap_or(i32::MAX));
    status
}

/// The Event a change of `Ready` gets (none when it did not change): the
/// error's reason and message, or `LeaseActive`.
pub fn ready_event(
    before: &KmsDynamicSecretStatus,
    after: &KmsDynamicSecretStatus,
    error: Option<&SyncError>,
) -> Option<(EventType, String, String)> {
    conditions::ready_changed(&before.conditions, &after.conditions)?;
    Some(match error {
        Some(e) => (
            EventType::Warning,
            e.reason().to_owned(),
            conditions::bounded(&e.to_string()),
        ),
        None => (
            EventType::Normal,
            "LeaseActive".to_owned(),
            "The Secret holds an active lease".to_owned(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_active_lease_is_what_ready_says() {
        let now = Time(Timestamp::now());
        let expires = Timestamp::from_second(1_800_000_000).unwrap();
        let status = KmsDynamicSecretStatus {
            lease: Some(crate::api::kms_dynamic_secret::LeaseStatus {
                id: "lease-1".into(),
                version: 2,
                creation_timestamp: Time(Timestamp::UNIX_EPOCH),
                expires_at: Time(expires),
                ttl: None,
            }),
            ..KmsDynamicSecretStatus::default()
        };
        let s = active_status(status, Some(4), 7, 1, &now);
        let ready = conditions::get(&s.conditions, ct::READY).unwrap();
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            (
                "True",
                "LeaseActive",
                &*format!("Lease lease-1 valid until {expires}")
            )
        );
        assert_eq!(
            conditions::get(&s.conditions, ct::AUTO_REDEPLOY_READY)
                .unwrap()
                .message,
            "1 workload(s) that opted in to auto-reload use the Secret"
        );
        assert_eq!((s.observed_generation, s.shard), (Some(4), Some(7)));
        let none = active_status(KmsDynamicSecretStatus::default(), Some(1), 0, 0, &now);
        assert_eq!(
            conditions::get(&none.conditions, ct::RECONCILE)
                .unwrap()
                .message,
            "No lease"
        );
    }

    /// A KmsDynamicSecret with a force-sync value asked for and one handled.
    fn resource(asked: &str, handled: &str) -> KmsDynamicSecret {
        let mut cr: KmsDynamicSecret = serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1",
            "kind": "KmsDynamicSecret",
            "metadata": {"name": "db", "namespace": "ns", "generation": 3,
                         "annotations": {force_sync::ANNOTATION: asked}},
            "spec": {
                "dynamicSecret": {"secretName": "pg", "projectSlug": "p",
                                  "environmentSlug": "dev", "secretsPath": "/"},
                "managedSecretReference": {"secretName": "db-creds"},
                "authentication": {"universalAuth": {"credentialsRef": {"secretName": "c"}}}
            }
        }))
        .unwrap();
        cr.status = Some(KmsDynamicSecretStatus {
            force_sync: Some(handled.to_owned()),
            ..KmsDynamicSecretStatus::default()
        });
        cr
    }

    fn throttled() -> SyncError {
        SyncError::Kms(crate::kms::KmsError::RateLimited {
            endpoint: "POST /api/v1/dynamic-secrets/leases",
            retry_after: std::time::Duration::from_secs(3),
            until: std::time::SystemTime::now(),
        })
    }

    #[test]
    fn a_failure_says_why_and_a_throttled_forced_sync_waits() {
        let now = Time(Timestamp::now());
        let cr = resource("2", "1");
        let before = cr.status.clone().unwrap();
        let e = throttled();
        let s = next_status(&cr, before.clone(), Outcome::Failed(&e), 5, &now);
        let ready = conditions::get(&s.conditions, ct::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "KMSRateLimited")
        );
        let reconcile = conditions::get(&s.conditions, ct::RECONCILE).unwrap();
        assert!(
            reconcile.message.ends_with(&force_sync::waiting("2")),
            "{}",
            reconcile.message
        );
        // Held back: the value stays pending; the shard is not the failure's to say.
        assert_eq!(
            (s.force_sync.as_deref(), s.shard, s.observed_generation),
            (Some("1"), None, Some(3))
        );
        // Waiting for the KMS's budget is no failure: no Event.
        assert!(ready_event(&before, &s, Some(&e)).is_none());
        // Any other failure spends the value.
        let other = SyncError::Kms(crate::kms::KmsError::Decode {
            endpoint: "POST /api/v1/dynamic-secrets/leases",
            reason: "not JSON".into(),
        });
        let failed = next_status(&cr, before.clone(), Outcome::Failed(&other), 5, &now);
        assert_eq!(failed.force_sync.as_deref(), Some("2"));
        let (type_, reason, _) = ready_event(&before, &failed, Some(&other)).unwrap();
        assert_eq!(
            (type_, reason.as_str()),
            (EventType::Warning, "KMSBadResponse")
        );
        assert!(
            ready_event(&failed, &failed, Some(&other)).is_none(),
            "no Event without a change of Ready"
        );
        // In line again after the failure: a recovery Event.
        let s = next_status(
            &cr,
            failed.clone(),
            Outcome::InLine {
                endpoint: "e",
                workloads: 0,
            },
            5,
            &now,
        );
        let (type_, reason, _) = ready_event(&failed, &s, None).unwrap();
        assert_eq!((type_, reason.as_str()), (EventType::Normal, "LeaseActive"));
    }

    #[test]
    fn in_line_names_the_endpoint_and_spends_the_forced_sync() {
        let now = Time(Timestamp::now());
        let cr = resource("2", "1");
        let s = next_status(
            &cr,
            cr.status.clone().unwrap(),
            Outcome::InLine {
                endpoint: "host from kms-config",
                workloads: 2,
            },
            5,
            &now,
        );
        let endpoint = conditions::get(&s.conditions, ct::ENDPOINT).unwrap();
        assert_eq!(
            (endpoint.status.as_str(), endpoint.message.as_str()),
            ("True", "host from kms-config")
        );
        assert_eq!((s.force_sync.as_deref(), s.shard), (Some("2"), Some(5)));
        // A first success is no news: the status says it.
        assert!(ready_event(&KmsDynamicSecretStatus::default(), &s, None).is_none());
    }
}
