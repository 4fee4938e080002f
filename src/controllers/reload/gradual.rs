//! Gradual reload: a change rolls the workloads that use an object one wave
//! at a time, and stops when one fails, so that a bad value cannot take
//! every workload down at once.
//!
//! - **Who.** A workload annotated `secrets.hanzo.ai/auto-reload-strategy:
//!   gradual`, or, without that annotation, one that uses a managed object
//!   whose resource is annotated so (the KmsSecret's annotation is carried
//!   to the objects it writes). `immediate` (the default) rolls at once as
//!   before, whatever the others do.
//! - **Order.** The gradual workloads that use one object, sorted by
//!   `secrets.hanzo.ai/auto-reload-order` (an integer, lowest first, default
//!   0), then kind (Deployment, StatefulSet, DaemonSet, Rollout), then name.
//! - **Waves.** `secrets.hanzo.ai/auto-reload-wave-size` on the resource
//!   (default 1): a workload rolls when every workload of the earlier waves
//!   has rolled to the object's version and completed its rollout.
//! - **Failure.** A rollout fails when the workload reports it (a
//!   Deployment's `ProgressDeadlineExceeded`, a Rollout's `Degraded`) or
//!   does not complete within `secrets.hanzo.ai/auto-reload-timeout` (on
//!   the workload, else the resource; default 10 minutes for kinds without
//!   a deadline of their own). Then the later waves **hold**: they keep
//!   their pods and their recorded version, and the hold is reported. A new
//!   version of the object starts over from the first wave, so fixing the
//!   value in the KMS lifts the hold.
//!
//! Everything here is pure; the reload runtime observes and writes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::jiff::Timestamp;

use super::WorkloadKey;
use super::rollouts::Rollout;

pub use crate::controllers::target::{
    RELOAD_STRATEGY_ANNOTATION as STRATEGY_ANNOTATION,
    RELOAD_TIMEOUT_ANNOTATION as TIMEOUT_ANNOTATION,
    RELOAD_WAVE_SIZE_ANNOTATION as WAVE_SIZE_ANNOTATION,
};
/// A workload's place in the order (lowest first).
pub const ORDER_ANNOTATION: &str = "secrets.hanzo.ai/auto-reload-order";
/// When auto-reload last rolled the workload (its metadata), for the
/// timeout.
pub const RELOADED_AT_ANNOTATION: &str = "secrets.hanzo.ai/reloaded-at";
/// The resource annotations carried to the objects it writes.
pub const CARRIED: [&str; 3] = [
    STRATEGY_ANNOTATION,
    WAVE_SIZE_ANNOTATION,
    TIMEOUT_ANNOTATION,
];
/// The timeout of a kind without a deadline of its own.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// How a workload reloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// At once (the default).
    Immediate,
    /// In order, in waves, stopping at a failure.
    Gradual,
}

/// The strategy of a workload for an object: its own annotation, else the
/// object's (carried from its resource), else immediate. An unknown value
/// is an error naming it.
pub fn strategy(
    workload: &BTreeMap<String, String>,
    object: &BTreeMap<String, String>,
) -> Result<Strategy, String> {
    let value = workload
        .get(STRATEGY_ANNOTATION)
        .or_else(|| object.get(STRATEGY_ANNOTATION));
    match value.map(|v| v.trim()) {
        None | Some("" | "immediate") => Ok(Strategy::Immediate),
        Some("gradual") => Ok(Strategy::Gradual),
        Some(other) => Err(format!(
            "{STRATEGY_ANNOTATION}: {other:?} is not a strategy; use \"immediate\" (the default) or \"gradual\""
        )),
    }
}

/// The wave size an object's resource asks for (at least 1).
pub fn wave_size(object: &BTreeMap<String, String>) -> usize {
    object
        .get(WAVE_SIZE_ANNOTATION)
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// The timeout a workload's rollout gets: the workload's annotation, else
/// the object's, else `None` (the kind's own deadline, or
/// [`DEFAULT_TIMEOUT`]).
pub fn timeout(
    workload: &BTreeMap<String, String>,
    object: &BTreeMap<String, String>,
) -> Option<Duration> {
    workload
        .get(TIMEOUT_ANNOTATION)
        .or_else(|| object.get(TIMEOUT_ANNOTATION))
        .and_then(|v| crate::api::duration::parse_duration(v.trim()).ok())
}

/// A workload's place in the order.
pub fn order(workload: &BTreeMap<String, String>) -> i64 {
    workload
        .get(ORDER_ANNOTATION)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// How a workload's latest rollout stands, as its status says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every replica runs the current template and is available.
    Complete,
    /// Not there yet.
    Rolling,
    /// The workload says it failed (the reason).
    Failed(String),
}

impl Progress {
    /// Complete, or still rolling.
    fn complete_if(complete: bool) -> Self {
        if complete {
            Progress::Complete
        } else {
            Progress::Rolling
        }
    }
}

/// A Deployment's rollout: complete when the controller saw the current
/// generation and every replica is updated and available (no old ones);
/// failed at `ProgressDeadlineExceeded`.
pub fn deployment_progress(d: &Deployment) -> Progress {
    let Some(st) = &d.status else {
        return Progress::Rolling;
    };
    if st.observed_generation < d.metadata.generation {
        return Progress::Rolling;
    }
    let deadline = st.conditions.iter().flatten().find(|c| {
        c.type_.as_deref() == Some("Progressing")
            && c.status.as_deref() == Some("False")
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    if let Some(c) = deadline {
        return Progress::Failed(format!(
            "ProgressDeadlineExceeded: {}",
            c.message
                .as_deref()
                .unwrap_or("the rollout made no progress")
        ));
    }
    let want = d.spec.replicas.unwrap_or(1);
    let complete = st.updated_replicas.unwrap_or(0) == want
        && st.available_replicas.unwrap_or(0) == want
        && st.replicas.unwrap_or(0) == want;
    Progress::complete_if(complete)
}

/// A StatefulSet's rollout: the current generation seen, every replica
/// updated and ready, the update revision current.
pub fn stateful_set_progress(s: &StatefulSet) -> Progress {
    let Some(st) = &s.status else {
        return Progress::Rolling;
    };
    let want = s.spec.replicas.unwrap_or(1);
    let complete = st.observed_generation >= s.metadata.generation
        && st.updated_replicas.unwrap_or(0) == want
        && st.ready_replicas.unwrap_or(0) == want
        && (st.update_revision.is_none() || st.current_revision == st.update_revision);
    Progress::complete_if(complete)
}

/// A DaemonSet's rollout: the current generation seen, every scheduled pod
/// updated and available.
pub fn daemon_set_progress(d: &DaemonSet) -> Progress {
    let Some(st) = &d.status else {
        return Progress::Rolling;
    };
    let want = st.desired_number_scheduled;
    let complete = st.observed_generation >= d.metadata.generation
        && st.updated_number_scheduled.unwrap_or(0) == want
        && st.number_available.unwrap_or(0) == want;
    Progress::complete_if(complete)
}

/// A Rollout's restart: complete when the controller restarted at our
/// `restartAt` (or never was asked to) and calls it `Healthy`; failed when
/// it calls it `Degraded`.
pub fn rollout_progress(r: &Rollout) -> Progress {
    let Some(st) = &r.status else {
        return Progress::Rolling;
    };
    match st.phase.as_deref() {
        Some("Degraded") => {
            return Progress::Failed(format!(
                "Degraded: {}",
                st.message.as_deref().unwrap_or("the Rollout is degraded")
            ));
        }
        Some("Healthy") => {}
        _ => return Progress::Rolling,
    }
    let asked = r.spec.restart_at.as_ref().map(|t| t.0);
    let done = st.restarted_at.as_ref().map(|t| t.0);
    match (asked, done) {
        (None, _) => Progress::Complete,
        (Some(a), Some(d)) if d >= a => Progress::Complete,
        _ => Progress::Rolling,
    }
}

/// One gradual workload that uses the object, as its turn is decided.
#[derive(Clone, Debug)]
pub struct Member {
    /// The workload.
    pub key: WorkloadKey,
    /// Its place ([`order`]).
    pub order: i64,
    /// Whether it records the object's current version (it rolled to it,
    /// or started with it).
    pub current: bool,
    /// Its latest rollout.
    pub progress: Progress,
    /// When auto-reload rolled it ([`RELOADED_AT_ANNOTATION`]).
    pub rolled_at: Option<Timestamp>,
    /// Its timeout ([`timeout`]), or the kind's default where it has no
    /// deadline of its own.
    pub timeout: Option<Duration>,
}

impl Member {
    /// Its progress at `now`, with the timeout applied: a rollout still
    /// running past it has failed.
    pub fn progress_at(&self, now: Timestamp) -> Progress {
        match (&self.progress, self.rolled_at, self.timeout) {
            (Progress::Rolling, Some(at), Some(limit)) if elapsed(at, now) >= limit => {
                Progress::Failed(format!(
                    "not complete {}s after the rollout started (timeout)",
                    limit.as_secs()
                ))
            }
            (p, ..) => p.clone(),
        }
    }

    /// When a running rollout times out, if it can.
    pub fn deadline(&self) -> Option<Timestamp> {
        match (&self.progress, self.rolled_at, self.timeout) {
            (Progress::Rolling, Some(at), Some(limit)) => {
                let limit = k8s_openapi::jiff::SignedDuration::try_from(limit).ok()?;
                at.checked_add(limit).ok()
            }
            _ => None,
        }
    }
}

fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or_default()
}

/// Sort the members into their order.
pub fn sort(members: &mut [Member]) {
    members.sort_by(|a, b| (a.order, &a.key).cmp(&(b.order, &b.key)));
}

/// Whether a workload may roll to the object's version now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Its wave's turn: roll.
    Go,
    /// An earlier wave has not rolled or not completed yet.
    Wait,
    /// An earlier wave failed: hold.
    Held(Failure),
}

/// The workload whose rollout failed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The workload.
    pub workload: WorkloadKey,
    /// What its status (or the timeout) says.
    pub reason: String,
}

/// The turn of `me` among `members` (sorted, see [`sort`]) in waves of
/// `wave`: every member of the earlier waves must be current and complete;
/// a failed one holds the rest.
pub fn turn(members: &[Member], me: &WorkloadKey, wave: usize, now: Timestamp) -> Turn {
    let Some(pos) = members.iter().position(|m| m.key == *me) else {
        return Turn::Go;
    };
    let earlier = &members[..(pos / wave.max(1)) * wave.max(1)];
    if let Some(f) = first_failure(earlier, now) {
        return Turn::Held(f);
    }
    let ready = earlier
        .iter()
        .all(|m| m.current && m.progress_at(now) == Progress::Complete);
    if ready { Turn::Go } else { Turn::Wait }
}

fn first_failure(members: &[Member], now: Timestamp) -> Option<Failure> {
    members
        .iter()
        .filter(|m| m.current)
        .find_map(|m| match m.progress_at(now) {
            Progress::Failed(reason) => Some(Failure {
                workload: m.key.clone(),
                reason,
            }),
            _ => None,
        })
}

/// A held rollout of one object, as the resource that writes it reports
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The object (`Secret app`).
    pub object: String,
    /// Its version the failing workload rolled to.
    pub version: String,
    /// The failing workload and why.
    pub failure: Failure,
    /// The workloads that keep the previous version.
    pub waiting: usize,
}

impl Hold {
    /// The condition message.
    pub fn message(&self) -> String {
        let short: String = self.version.chars().take(12).collect();
        format!(
            "gradual reload held: {} did not become available after rolling to {} version {short} ({}); \
             {} workload(s) keep the previous version. It resumes when the value changes again \
             (fix it in the KMS), or when {} becomes available",
            self.failure.workload,
            self.object,
            self.failure.reason,
            self.waiting,
            self.failure.workload
        )
    }
}

/// The hold of a group, if any: a current member failed while others have
/// not rolled to the version.
pub fn hold_of(members: &[Member], object: &str, version: &str, now: Timestamp) -> Option<Hold> {
    let waiting = members.iter().filter(|m| !m.current).count();
    if waiting == 0 {
        return None;
    }
    let failure = first_failure(members, now)?;
    Some(Hold {
        object: object.to_owned(),
        version: version.to_owned(),
        failure,
        waiting,
    })
}

#[cfg(test)]
mod tests {
    use super::super::WorkloadKind;
    use super::*;

    fn key(name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn member(name: &str, current: bool, progress: Progress) -> Member {
        Member {
            key: key(name),
            order: 0,
            current,
            progress,
            rolled_at: None,
            timeout: None,
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(2_000_000_000).unwrap()
    }

    #[test]
    fn one_at_a_time_each_after_the_last_completed() {
        use Progress::*;
        let mut m = vec![
            member("c", false, Complete),
            member("a", false, Complete),
            member("b", false, Complete),
        ];
        sort(&mut m);
        let names: Vec<&str> = m.iter().map(|m| m.key.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(turn(&m, &key("a"), 1, now()), Turn::Go);
        assert_eq!(turn(&m, &key("b"), 1, now()), Turn::Wait);
        // a rolled and is rolling: b waits.
        m[0].current = true;
        m[0].progress = Rolling;
        assert_eq!(turn(&m, &key("b"), 1, now()), Turn::Wait);
        // a complete: b goes, c still waits for b.
        m[0].progress = Complete;
        assert_eq!(turn(&m, &key("b"), 1, now()), Turn::Go);
        assert_eq!(turn(&m, &key("c"), 1, now()), Turn::Wait);
    }

    #[test]
    fn waves_roll_together() {
        use Progress::*;
        let m = vec![
            member("a", false, Complete),
            member("b", false, Complete),
            member("c", false, Complete),
        ];
        assert_eq!(turn(&m, &key("a"), 2, now()), Turn::Go);
        assert_eq!(turn(&m, &key("b"), 2, now()), Turn::Go);
        assert_eq!(turn(&m, &key("c"), 2, now()), Turn::Wait);
    }

    #[test]
    fn a_failure_holds_the_later_waves_and_names_the_workload() {
        use Progress::*;
        let m = vec![
            member("a", true, Failed("ProgressDeadlineExceeded: x".into())),
            member("b", false, Complete),
            member("c", false, Complete),
        ];
        let Turn::Held(f) = turn(&m, &key("c"), 1, now()) else {
            panic!("not held")
        };
        assert_eq!(f.workload, key("a"));
        let hold = hold_of(&m, "Secret s", "0123456789abcdef", now()).unwrap();
        assert_eq!(hold.waiting, 2);
        let msg = hold.message();
        assert!(
            msg.contains("Deployment ns/a") && msg.contains("Secret s version 0123456789ab"),
            "{msg}"
        );
        assert!(msg.contains("ProgressDeadlineExceeded"), "{msg}");
        // Everyone current: nothing held any more.
        let all: Vec<Member> = m
            .iter()
            .cloned()
            .map(|mut x| {
                x.current = true;
                x
            })
            .collect();
        assert_eq!(hold_of(&all, "Secret s", "v", now()), None);
    }

    #[test]
    fn a_rollout_past_its_timeout_has_failed() {
        let mut a = member("a", true, Progress::Rolling);
        a.rolled_at = Some(Timestamp::from_second(2_000_000_000 - 30).unwrap());
        a.timeout = Some(Duration::from_secs(60));
        assert_eq!(a.progress_at(now()), Progress::Rolling);
        assert_eq!(a.deadline(), Timestamp::from_second(2_000_000_030).ok());
        a.timeout = Some(Duration::from_secs(20));
        assert!(matches!(a.progress_at(now()), Progress::Failed(r) if r.contains("20s")));
    }

    #[test]
    fn strategy_wave_and_order_annotations() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let none = map(&[]);
        assert_eq!(strategy(&none, &none), Ok(Strategy::Immediate));
        let gradual = map(&[(STRATEGY_ANNOTATION, "gradual")]);
        let immediate = map(&[(STRATEGY_ANNOTATION, "immediate")]);
        assert_eq!(strategy(&none, &gradual), Ok(Strategy::Gradual));
        assert_eq!(strategy(&immediate, &gradual), Ok(Strategy::Immediate));
        let bad = map(&[(STRATEGY_ANNOTATION, "slow")]);
        assert!(strategy(&bad, &none).unwrap_err().contains("\"slow\""));
        assert_eq!(wave_size(&map(&[(WAVE_SIZE_ANNOTATION, "3")])), 3);
        assert_eq!(wave_size(&map(&[(WAVE_SIZE_ANNOTATION, "0")])), 1);
        assert_eq!(order(&map(&[(ORDER_ANNOTATION, "-5")])), -5);
        assert_eq!(
            timeout(&map(&[(TIMEOUT_ANNOTATION, "90s")]), &none),
            Some(Duration::from_secs(90))
        );
    }

    #[test]
    fn a_deployment_completes_only_with_every_replica_updated_and_available() {
        let d = |status: serde_json::Value| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "a", "generation": 2},
                "spec": {"replicas": 2, "selector": {}, "template": {}},
                "status": status
            }))
            .unwrap()
        };
        assert_eq!(
            deployment_progress(&d(
                serde_json::json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2})
            )),
            Progress::Rolling
        );
        assert_eq!(
            deployment_progress(&d(
                serde_json::json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2})
            )),
            Progress::Rolling
        );
        assert_eq!(
            deployment_progress(&d(
                serde_json::json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2})
            )),
            Progress::Complete
        );
        let failed = deployment_progress(&d(
            serde_json::json!({"observedGeneration": 2, "conditions": [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet \"a-1\" has timed out progressing."}]}),
        ));
        assert!(matches!(failed, Progress::Failed(r) if r.contains("timed out")));
    }
}
