//! Checker 5 — the KMS budget (`--kms-rate-limit`; `docs/chaos.md`, checker 5).
//!
//! The operator shares a token bucket of `rate` requests per second, with a
//! burst of `burst_factor × rate`, among its live replicas (each takes
//! `rate ÷ members`). The dev server counts every request it receives,
//! refused and faulted ones included; the runner samples that count (minus
//! its own requests) every second. Over any window of `T` seconds the
//! replicas may send at most
//!
//! ```text
//! rate × (T + slack) + burst_factor × rate × (1 + starts) + rate × lag × starts
//! ```
//!
//! where `starts` counts replica processes started in or just before the
//! window: each new process begins with a full bucket of its own, and for
//! up to `lag` seconds it and the others may count members differently
//! (each then takes a larger share). `slack` absorbs the sampling jitter.
//! Windows of several lengths are checked: short ones catch bursts, long
//! ones a sustained excess that a burst allowance would hide.

use crate::checkers::{Outcome, Violation};
use crate::history::{BudgetSample, Ms};

/// The budget and its allowances.
#[derive(Clone, Debug)]
pub struct Params {
    /// `--kms-rate-limit`: requests per second for the whole operator.
    pub rate: f64,
    /// Burst as a multiple of the rate (the operator's bucket holds 2×).
    pub burst_factor: f64,
    /// Seconds a new replica and the others may disagree on the member
    /// count.
    pub lag_s: f64,
    /// Sampling jitter, seconds.
    pub slack_s: f64,
    /// Window lengths to check, seconds.
    pub windows_s: Vec<u64>,
}

/// Requests allowed in a window of `secs` seconds with `starts` replica
/// starts.
pub fn allowed(p: &Params, secs: f64, starts: usize) -> f64 {
    let n = starts as f64;
    p.rate * (secs + p.slack_s) + p.burst_factor * p.rate * (1.0 + n) + p.rate * p.lag_s * n
}

/// Run the checker over the samples and the replicas' start times.
pub fn check(samples: &[BudgetSample], starts: &[Ms], p: &Params) -> Outcome {
    let mut out = Outcome::new(
        "budget",
        format!(
            "KMS requests in any window of T s ≤ rate × (T + {}) + {} × rate × (1 + starts) + \
             rate × {} × starts, rate = {} req/s, windows {:?} s",
            p.slack_s, p.burst_factor, p.lag_s, p.rate, p.windows_s
        ),
    );
    let mut peaks = serde_json::Map::new();
    for &w in &p.windows_s {
        let w_ms = i64::try_from(w).unwrap_or(i64::MAX / 2000) * 1000;
        let mut peak = 0.0f64;
        let mut over = 0usize;
        let mut worst: Option<(f64, Violation)> = None;
        let mut j = 0usize;
        for i in 0..samples.len() {
            let a = samples[i];
            if j < i {
                j = i;
            }
            while j < samples.len() && samples[j].at < a.at + w_ms {
                j += 1;
            }
            let Some(b) = samples.get(j) else { break };
            let Some(count) = b.total.checked_sub(a.total) else {
                continue;
            };
            let secs = (b.at - a.at) as f64 / 1000.0;
            let n = starts
                .iter()
                .filter(|&&s| s >= a.at - 1000 && s <= b.at)
                .count();
            let limit = allowed(p, secs, n);
            let count = count as f64;
            peak = peak.max(count / secs);
            if count > limit {
                over += 1;
                let excess = count / limit;
                if worst.as_ref().is_none_or(|(e, _)| excess > *e) {
                    worst = Some((
                        excess,
                        Violation::at(
                            a.at,
                            format!(
                                "{count} KMS requests in {secs:.1} s (window {w} s, {n} replica \
                                 starts): allowed {limit:.0}"
                            ),
                        ),
                    ));
                }
            }
        }
        if let Some((_, mut v)) = worst {
            if over > 1 {
                v.message
                    .push_str(&format!(" ({over} windows over the budget)"));
            }
            out.violations.push(v);
        }
        peaks.insert(
            format!("{w}s"),
            serde_json::json!((peak * 100.0).round() / 100.0),
        );
    }
    if let (Some(first), Some(last)) = (samples.first(), samples.last())
        && last.at > first.at
    {
        let mean =
            last.total.saturating_sub(first.total) as f64 / ((last.at - first.at) as f64 / 1000.0);
        out.stat("mean_rate", (mean * 100.0).round() / 100.0);
    }
    out.stat("rate_limit", p.rate);
    out.stat("peak_rate_by_window", peaks);
    out.stat("samples", samples.len());
    out.stat("replica_starts", starts.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            rate: 10.0,
            burst_factor: 2.0,
            lag_s: 1.0,
            slack_s: 0.5,
            windows_s: vec![10, 60],
        }
    }

    /// One sample per second for `secs` seconds at `per_s` requests per
    /// second, starting with a burst of `burst`.
    fn steady(secs: i64, per_s: u64, burst: u64) -> Vec<BudgetSample> {
        (0..=secs)
            .map(|s| BudgetSample {
                at: s * 1000,
                total: burst + per_s * s as u64,
            })
            .collect()
    }

    #[test]
    fn a_rate_under_the_budget_passes() {
        let mut h = steady(120, 9, 0);
        // A full burst at t=30 (a refilled bucket after a quiet spell).
        for s in h.iter_mut().skip(30) {
            s.total += 20;
        }
        let o = check(&h, &[], &params());
        assert!(o.passed(), "{:?}", o.violations);
    }

    #[test]
    fn a_rate_over_the_budget_fails() {
        // Every replica using the whole budget: 3 × 10 req/s.
        let o = check(&steady(120, 30, 0), &[], &params());
        assert_eq!(o.violations.len(), 2, "{:?}", o.violations);
        // Slightly over, sustained: only the long window sees it.
        let o = check(&steady(120, 11, 0), &[], &params());
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
        assert!(o.violations[0].message.contains("window 60 s"));
    }

    #[test]
    fn a_restart_brings_its_own_bucket() {
        // 30 extra requests right after a replica start at t=50.
        let mut h = steady(120, 10, 0);
        for s in h.iter_mut().skip(51) {
            s.total += 30;
        }
        assert!(!check(&h, &[], &params()).passed());
        assert!(check(&h, &[50_000], &params()).passed());
    }
}
