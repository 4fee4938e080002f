//! `outage`: every replica stopped for twice the resync interval, then
//! started again on warm caches. Every resource is overdue at once; the
//! restart must spread that work under the KMS budget rather than fire it
//! together: every folder checked within `(folders ÷ budget) × 1.1`, and no
//! 10-second window above the budget. The session runs it in
//! `Session::outage`; the measures are computed here.

use std::time::Duration;

use serde::Serialize;

use crate::replicas::Usage;
use crate::scenarios::Load;
use crate::stats::KmsCounts;
use crate::workload::SyncMode;

/// The operator's default `--kms-rate-limit`, requests per second.
const DEFAULT_BUDGET: f64 = 20.0;

/// The window the budget is held over.
pub const WINDOW: usize = 10;

/// Result of `outage`.
#[derive(Clone, Debug, Serialize)]
pub struct Outage {
    /// Resources.
    pub n: usize,
    /// KMS folders (one per namespace).
    pub folders: usize,
    /// Replicas.
    pub replicas: usize,
    /// The resources' sync settings.
    pub sync: SyncMode,
    /// Load before the start.
    pub load: Load,
    /// Seconds every replica was stopped.
    pub outage_seconds: f64,
    /// The replicas' KMS budget after the outage, requests per second.
    pub budget: f64,
    /// `(folders ÷ budget) × 1.1`, seconds.
    pub target_seconds: f64,
    /// Seconds from the start until every replica's `/readyz` said 200.
    pub seconds_to_ready: Option<f64>,
    /// Seconds from the start until every folder had been read (`200` or
    /// `304`) and the replicas had finished as many reconciles as there are
    /// resources; `None`: not within the wait.
    pub seconds_all_checked: Option<f64>,
    /// Seconds until the replicas had finished as many reconciles as there
    /// are resources (`controller_runtime_reconcile_total`, summed).
    pub seconds_reconciled: Option<f64>,
    /// Folders read by the end.
    pub folders_checked: u64,
    /// KMS requests from the start to the end of the measure.
    pub kms: KmsCounts,
    /// KMS requests between consecutive samples, about a second apart.
    pub per_second: Vec<u64>,
    /// When each sample was taken, seconds from the start (the first is
    /// the start).
    pub sample_seconds: Vec<f64>,
    /// The most requests in 10 consecutive seconds (the busiest stretch of
    /// ten samples, scaled to 10 s by its own length).
    pub max_window: f64,
    /// 10 × budget.
    pub window_budget: f64,
    /// Stretches of ten samples (one for each start) with more requests
    /// than the budget allows in their own length.
    pub windows_above_budget: usize,
    /// Peak RSS and CPU per replica at the end.
    pub usage: Vec<Usage>,
}

/// The budget the replicas run with: the last `--kms-rate-limit` of their
/// arguments (`--kms-rate-limit=N` or `--kms-rate-limit N`), else the
/// operator's default.
pub fn budget_of(args: &[String]) -> f64 {
    let mut budget = DEFAULT_BUDGET;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.strip_prefix("--kms-rate-limit") {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_owned()),
            Some("") => it.next().cloned(),
            _ => None,
        };
        if let Some(v) = value.and_then(|v| v.parse().ok()) {
            budget = v;
        }
    }
    budget
}

/// The arguments with every `--kms-rate-limit` replaced by `budget`.
pub fn with_budget(args: &[String], budget: f64) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--kms-rate-limit" {
            it.next();
        } else if !a.starts_with("--kms-rate-limit=") {
            out.push(a.clone());
        }
    }
    out.push(format!("--kms-rate-limit={budget}"));
    out
}

/// The busiest stretch of `window` consecutive samples and how many
/// stretches went above `budget` requests a second. `at[i]` is when sample
/// `i` was taken (seconds from the start; `at[0]` the start) and
/// `counts[i]` the requests between samples `i` and `i + 1`: a sample taken
/// late puts requests in the wrong second, so each stretch is held against
/// the budget for its own length, not for `window` seconds. Returns the
/// busiest stretch's requests scaled to `window` seconds (`budget × window`
/// is the most the budget allows) and the count of stretches above it.
pub fn windows(at: &[f64], counts: &[u64], window: usize, budget: f64) -> (f64, usize) {
    let n = counts.len().min(at.len().saturating_sub(1));
    if n == 0 {
        return (0.0, 0);
    }
    let w = window.min(n);
    let mut cumulative = vec![0u64; n + 1];
    for i in 0..n {
        cumulative[i + 1] = cumulative[i] + counts[i];
    }
    let (mut busiest, mut above) = (0.0_f64, 0);
    for i in 0..=n - w {
        let requests = (cumulative[i + w] - cumulative[i]) as f64;
        let seconds = at[i + w] - at[i];
        if seconds <= 0.0 {
            continue;
        }
        busiest = busiest.max(requests / seconds * window as f64);
        // A request of rounding is not above the budget.
        if requests > budget * seconds + 0.5 {
            above += 1;
        }
    }
    (busiest, above)
}

/// `(folders ÷ budget) × 1.1`.
pub fn target(folders: usize, budget: f64) -> Duration {
    Duration::from_secs_f64(folders as f64 / budget * 1.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_budget_is_the_last_rate_limit_given() {
        assert_eq!(budget_of(&[]), 20.0);
        assert_eq!(budget_of(&args(&["--kms-rate-limit=1000"])), 1000.0);
        assert_eq!(
            budget_of(&args(&[
                "--kms-rate-limit",
                "50",
                "--workers=8",
                "--kms-rate-limit=70"
            ])),
            70.0
        );
        assert_eq!(
            with_budget(
                &args(&[
                    "--kms-rate-limit",
                    "50",
                    "--workers=8",
                    "--kms-rate-limit=70"
                ]),
                200.0
            ),
            args(&["--workers=8", "--kms-rate-limit=200"])
        );
    }

    #[test]
    fn stretches_are_held_against_the_budget_for_their_own_length() {
        let at: Vec<f64> = (0..=13).map(f64::from).collect();
        let s = [5, 30, 30, 30, 0, 0, 0, 0, 0, 0, 0, 1, 40];
        // 10-second sums: 95, 90, 61, 71.
        assert_eq!(windows(&at, &s, 10, 8.0), (95.0, 2));
        assert_eq!(windows(&at, &s, 10, 9.5), (95.0, 0));
        // Fewer samples than a window: the whole run, scaled to 10 s.
        assert_eq!(windows(&at[..5], &s[..4], 10, 9.0), (237.5, 1));
        assert_eq!(windows(&[0.0], &[], 10, 0.0), (0.0, 0));
        // A sample 0.2 s late: 24 requests in its second and 16 in the
        // next, 20 a second all along; no stretch is above 20/s.
        let at = [0.0, 1.0, 2.2, 3.0, 4.0];
        let late = [20, 24, 16, 20];
        let (busiest, above) = windows(&at, &late, 2, 20.0);
        assert_eq!(above, 0);
        assert!((busiest - 40.0).abs() < 1e-9, "{busiest}");
        assert_eq!(windows(&at, &[20, 24, 30, 20], 2, 20.0).1, 2);
        assert_eq!(target(1000, 20.0).as_secs_f64().round(), 55.0);
    }
}
