//! The two profiles: `short` (CI: about five minutes, at least 30 faults)
//! and `long` (at least 100 faults). Everything a run does is derived from
//! the profile and the seed.

use std::time::Duration;

use serde::Serialize;

use crate::workload::Timing;

/// The settings of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// `short` or `long`.
    pub name: String,
    /// Workload namespaces (four resources each).
    pub namespaces: usize,
    /// Replicas at the start.
    pub replicas: usize,
    /// Scaling never goes below this.
    pub min_replicas: usize,
    /// Scaling never goes above this.
    pub max_replicas: usize,
    /// `--shards`.
    pub shards: u32,
    /// `--lease-duration`, seconds.
    pub lease_duration: u64,
    /// `--renew-deadline`, seconds.
    pub renew_deadline: u64,
    /// `--retry-period`, seconds.
    pub retry_period: u64,
    /// `--kms-rate-limit`, requests per second.
    pub kms_rate_limit: f64,
    /// Faults on the process track.
    pub process_faults: usize,
    /// Faults on the KMS track.
    pub kms_faults: usize,
    /// Pause between faults of a track: at least.
    #[serde(skip)]
    pub gap_min: Duration,
    /// … at most.
    #[serde(skip)]
    pub gap_max: Duration,
    /// One KMS or source change this often.
    #[serde(skip)]
    pub churn_every: Duration,
    /// Resource timing.
    #[serde(skip)]
    pub timing: Timing,
    /// Every object must match the KMS this soon after the faults stop.
    #[serde(skip)]
    pub convergence_bound: Duration,
    /// The workload must be in step this soon after the start.
    #[serde(skip)]
    pub ready_timeout: Duration,
}

impl Profile {
    /// The profile called `name`.
    pub fn named(name: &str) -> Option<Self> {
        let base = Profile {
            name: name.to_owned(),
            namespaces: 16,
            replicas: 3,
            min_replicas: 2,
            max_replicas: 4,
            shards: 16,
            lease_duration: 5,
            renew_deadline: 3,
            retry_period: 1,
            kms_rate_limit: 10.0,
            process_faults: 17,
            kms_faults: 15,
            gap_min: Duration::from_secs(3),
            gap_max: Duration::from_secs(6),
            churn_every: Duration::from_secs(2),
            timing: Timing {
                resync: "20s".into(),
                push_resync: "30s".into(),
                lease_ttl: "30s".into(),
                lease_max_ttl: "90s".into(),
            },
            convergence_bound: Duration::from_secs(120),
            ready_timeout: Duration::from_secs(180),
        };
        match name {
            "short" => Some(base),
            "long" => Some(Profile {
                namespaces: 32,
                process_faults: 60,
                kms_faults: 50,
                ..base
            }),
            _ => None,
        }
    }

    /// Coverage bound: lease duration + retry period + 1 s, in ms.
    pub fn coverage_bound_ms(&self) -> i64 {
        i64::try_from((self.lease_duration + self.retry_period + 1) * 1000).unwrap_or(i64::MAX)
    }

    /// The settings as figures for the report.
    pub fn describe(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["gap_s"] = serde_json::json!([self.gap_min.as_secs_f64(), self.gap_max.as_secs_f64()]);
        v["churn_every_s"] = serde_json::json!(self.churn_every.as_secs_f64());
        v["kmssecret_resync"] = serde_json::json!(self.timing.resync);
        v["kmspushsecret_resync"] = serde_json::json!(self.timing.push_resync);
        v["lease_ttl"] = serde_json::json!(self.timing.lease_ttl);
        v["lease_max_ttl"] = serde_json::json!(self.timing.lease_max_ttl);
        v["convergence_bound_s"] = serde_json::json!(self.convergence_bound.as_secs());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_meet_their_fault_counts() {
        let s = Profile::named("short").unwrap();
        assert!(s.process_faults + s.kms_faults >= 30);
        let l = Profile::named("long").unwrap();
        assert!(l.process_faults + l.kms_faults >= 100);
        assert!(Profile::named("medium").is_none());
        assert_eq!(s.coverage_bound_ms(), 7000);
        assert!(s.renew_deadline < s.lease_duration);
    }
}
