//! Checker 4 — every shard covered (`docs/chaos.md`, checker 4).
//!
//! A shard is covered while some replica shows it holds it: every Lease
//! write (acquisition, renewal, release) is a sign of life stamped by its
//! writer. The uncovered time is the time from one sign of life to the next
//! write that names a holder: normally the retry period (renewals); after a
//! crash, the lease duration plus up to a retry period; after a graceful
//! release, well under a second. It must never exceed the bound (lease
//! duration + retry period + 1 s). Time inside windows in which kube-apiserver
//! or etcd was restarting, or the whole machine stood still, is not counted:
//! nobody can write a Lease then.
//! A change seen only after the watcher had to list again is not judged
//! (renewals in between may be missing from the record).

use std::collections::BTreeMap;

use crate::checkers::{Outcome, Violation};
use crate::history::{LeaseObs, Ms, Window, overlap_with};

/// Bounds of the check.
#[derive(Clone, Debug)]
pub struct Params {
    /// The longest allowed uncovered time (ms).
    pub bound: Ms,
    /// Start of the checked period (every shard owned by then).
    pub from: Ms,
    /// End of the checked period.
    pub to: Ms,
    /// Number of shards that must be covered.
    pub shards: u32,
}

/// Run the checker over the Lease states and the control-plane windows.
pub fn check(leases: &[LeaseObs], excluded: &[Window], p: &Params) -> Outcome {
    let mut out = Outcome::new(
        "coverage",
        format!(
            "no shard without a live holder for more than {} ms (lease duration + retry period + \
             1 s), not counting control-plane restarts and machine stalls",
            p.bound
        ),
    );
    let mut per: BTreeMap<u32, Vec<&LeaseObs>> = BTreeMap::new();
    for o in leases {
        per.entry(o.shard).or_default().push(o);
    }
    let mut worst: BTreeMap<u32, Ms> = BTreeMap::new();
    let mut failovers: Vec<Ms> = Vec::new();
    let mut unjudged = 0usize;
    let mut judge = |shard: u32, a: Ms, b: Ms, out: &mut Outcome| -> Ms {
        let (a, b) = (a.max(p.from), b.min(p.to));
        if b <= a {
            return 0;
        }
        let counted = (b - a) - overlap_with(excluded, a, b);
        let w = worst.entry(shard).or_default();
        *w = (*w).max(counted);
        if counted > p.bound {
            out.violations.push(Violation::at(
                a,
                format!(
                    "shard {shard} had no live holder for {counted} ms (from {a} to {b}; bound {} ms)",
                    p.bound
                ),
            ));
        }
        counted
    };
    for shard in 0..p.shards {
        let events = per.get(&shard).map(Vec::as_slice).unwrap_or(&[]);
        let mut last_signal = p.from;
        let mut last_holder: Option<&str> = None;
        for e in events {
            let t = if e.deleted {
                e.observed
            } else {
                e.renew.unwrap_or(e.observed)
            };
            let holder = if e.deleted { None } else { e.holder.as_deref() };
            if let Some(h) = holder {
                if e.after_gap {
                    unjudged += 1;
                } else {
                    let gap = judge(shard, last_signal, t, &mut out);
                    if last_holder != Some(h) && gap > 0 {
                        failovers.push(gap);
                    }
                }
            }
            last_signal = last_signal.max(t);
            last_holder = holder;
        }
        // Up to the end of the period.
        judge(shard, last_signal, p.to, &mut out);
    }
    failovers.sort_unstable();
    out.stat("bound_ms", p.bound);
    out.stat("checked_ms", (p.to - p.from).max(0));
    out.stat("excluded_ms", overlap_with(excluded, p.from, p.to));
    out.stat(
        "longest_uncovered_ms",
        worst.values().copied().max().unwrap_or(0),
    );
    out.stat("owner_changes", failovers.len());
    out.stat(
        "owner_change_gap_p50_ms",
        failovers.get(failovers.len() / 2).copied().unwrap_or(0),
    );
    out.stat(
        "owner_change_gap_max_ms",
        failovers.last().copied().unwrap_or(0),
    );
    out.stat("changes_not_judged_after_relist", unjudged);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::terms::tests::obs;

    fn params() -> Params {
        Params {
            bound: 7000,
            from: 0,
            to: 20_000,
            shards: 2,
        }
    }

    /// `holder` renews `shard` every second over `[from, to]`.
    fn renewing(shard: u32, holder: &str, acquired: Ms, from: Ms, to: Ms) -> Vec<LeaseObs> {
        (from..=to)
            .step_by(1000)
            .map(|t| obs(shard, Some(holder), acquired, t))
            .collect()
    }

    #[test]
    fn renewals_and_a_crash_failover_within_the_bound_pass() {
        let mut h = renewing(0, "a", 0, 0, 20_000);
        // b renews shard 1 until 8000 (then crashes); a takes over at 14_000.
        h.extend(renewing(1, "b", 0, 0, 8000));
        h.extend(renewing(1, "a", 14_000, 14_000, 20_000));
        let o = check(&h, &[], &params());
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["longest_uncovered_ms"], 6000);
    }

    #[test]
    fn a_long_gap_fails_unless_the_control_plane_was_restarting() {
        let mut h = renewing(0, "a", 0, 0, 20_000);
        h.extend(renewing(1, "b", 0, 0, 5000));
        h.extend(renewing(1, "a", 15_000, 15_000, 20_000));
        let o = check(&h, &[], &params());
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
        assert!(o.violations[0].message.contains("shard 1"));
        // The same gap, 4 s of which the API server was restarting.
        let o = check(
            &h,
            &[Window {
                from: 6000,
                to: 10_000,
            }],
            &params(),
        );
        assert!(o.passed(), "{:?}", o.violations);
    }

    #[test]
    fn a_released_shard_nobody_takes_and_a_shard_never_seen_fail() {
        let mut h = renewing(0, "a", 0, 0, 3000);
        h.push(obs(0, None, 0, 3500));
        let o = check(&h, &[], &params());
        // Shard 0 released at 3500 and never taken; shard 1 never held.
        assert_eq!(o.violations.len(), 2, "{:?}", o.violations);
    }
}
