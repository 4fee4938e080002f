//! Checker 1 — exclusive ownership (`docs/chaos.md`, checker 1).
//!
//! *Two holders*: every holder change recorded by the Lease watcher is
//! judged by the Lease's own times. A new holder may acquire only after the
//! previous term ended: released, or `renewTime + leaseDuration` passed.
//! Replicas judge expiry on their own monotonic clock from the moment they
//! saw the last change, which is after the holder stamped `renewTime`, so a
//! correct takeover is never earlier than that sum; the tolerance
//! ([`Params::takeover_tolerance`]) only absorbs timestamp rounding.
//!
//! *Writes outside a term*: every `target written` / `lease created` line
//! of a replica's log is a Kubernetes write that succeeded. Its namespace
//! maps to a shard (the operator's own ring); the replica must hold a term
//! of that shard at that time. The log line is stamped *after* the API
//! server answered, so the write happened at or before the stamp: the
//! stamp may trail the end of the term by [`Params::end_slack`] (the time
//! between the answer and the stamp on a loaded machine), and a line
//! stamped within [`Params::resume_slack`] after a SIGCONT may describe a
//! write answered before the SIGSTOP, so it counts from the SIGSTOP. The
//! start of a term is stamped before the Lease update is sent, and work
//! only starts after it succeeded, so a write can never precede it; the
//! [`Params::start_slack`] again only absorbs rounding.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkers::terms::{self, Term};
use crate::checkers::{Outcome, Violation};
use crate::history::{LeaseObs, Ms, Pause, WriteObs};

/// Tolerances, in milliseconds.
#[derive(Clone, Debug)]
pub struct Params {
    /// A takeover this much before the previous term's end is still fine.
    pub takeover_tolerance: Ms,
    /// A write this much before its term's start is still fine.
    pub start_slack: Ms,
    /// A write stamped this much after its term's end is still fine.
    pub end_slack: Ms,
    /// A write stamped this long after a SIGCONT may date from the SIGSTOP.
    pub resume_slack: Ms,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            takeover_tolerance: 100,
            start_slack: 100,
            end_slack: 1000,
            resume_slack: 2000,
        }
    }
}

/// Earliest time the write logged at `w.at` may have happened.
fn earliest(w: &WriteObs, pauses: &[Pause], resume_slack: Ms) -> Ms {
    pauses
        .iter()
        .filter(|p| p.replica == w.replica && p.to <= w.at && w.at <= p.to + resume_slack)
        .map(|p| p.from)
        .min()
        .unwrap_or(w.at)
}

/// Run the checker. `shard_of` maps a namespace to its shard; `until` is
/// the end of the recorded history.
pub fn check(
    leases: &[LeaseObs],
    writes: &[WriteObs],
    pauses: &[Pause],
    shard_of: &dyn Fn(&str) -> u32,
    until: Ms,
    p: &Params,
) -> Outcome {
    let mut out = Outcome::new(
        "exclusive",
        format!(
            "one valid holder per shard (takeover tolerance {} ms); every logged write inside \
             the writer's term (start slack {} ms, end slack {} ms, {} ms after SIGCONT counted \
             from the SIGSTOP)",
            p.takeover_tolerance, p.start_slack, p.end_slack, p.resume_slack
        ),
    );
    let derived = terms::derive(leases, until, p.takeover_tolerance);
    for o in &derived.overlaps {
        out.violations.push(Violation::at(
            o.acquired,
            format!(
                "shard {}: {} acquired while {}'s term was valid for another {} ms",
                o.shard,
                o.next,
                o.previous,
                o.valid_until - o.acquired
            ),
        ));
    }
    let mut index: BTreeMap<(u32, &str), Vec<&Term>> = BTreeMap::new();
    for t in derived.by_shard.values().flatten() {
        index
            .entry((t.shard, t.holder.as_str()))
            .or_default()
            .push(t);
    }
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    let mut outside = 0usize;
    let mut not_judged = 0usize;
    for w in writes {
        *per_replica.entry(w.replica.as_str()).or_default() += 1;
        let shard = shard_of(&w.namespace);
        let from = earliest(w, pauses, p.resume_slack);
        let ok = index.get(&(shard, w.replica.as_str())).is_some_and(|ts| {
            ts.iter()
                .any(|t| t.start - p.start_slack <= w.at && from <= t.end + p.end_slack)
        });
        let in_unknown = derived.unknown.get(&shard).is_some_and(|spans| {
            spans
                .iter()
                .any(|&(a, b)| a - p.start_slack <= w.at && from <= b + p.end_slack)
        });
        if !ok && in_unknown {
            not_judged += 1;
        } else if !ok {
            outside += 1;
            let nearest = index
                .get(&(shard, w.replica.as_str()))
                .and_then(|ts| {
                    ts.iter()
                        .min_by_key(|t| (t.end - w.at).abs().min((t.start - w.at).abs()))
                })
                .map(|t| format!("nearest term {}..{} ({:?})", t.start, t.end, t.how))
                .unwrap_or_else(|| "it never held that shard".to_owned());
            let holders: BTreeSet<&str> = derived
                .by_shard
                .get(&shard)
                .into_iter()
                .flatten()
                .filter(|t| t.start <= w.at && w.at <= t.end)
                .map(|t| t.holder.as_str())
                .collect();
            out.violations.push(Violation::at(
                w.at,
                format!(
                    "{} wrote {} ({}) in shard {shard} outside its term; {nearest}; holder then: {:?}",
                    w.replica, w.resource, w.message, holders
                ),
            ));
        }
    }
    let takeovers = derived
        .by_shard
        .values()
        .flatten()
        .filter(|t| t.how == terms::End::TakenOver || t.how == terms::End::Released)
        .count();
    out.stat("shards", derived.by_shard.len());
    out.stat(
        "terms",
        derived.by_shard.values().map(Vec::len).sum::<usize>(),
    );
    out.stat("hand_overs_and_takeovers", takeovers);
    out.stat("two_holder_overlaps", derived.overlaps.len());
    out.stat("holder_changes_not_judged_after_relist", derived.unverified);
    out.stat("writes_checked", writes.len());
    out.stat("writes_outside_term", outside);
    out.stat("writes_not_judged_after_relist", not_judged);
    out.stat("writes_per_replica", per_replica);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::terms::tests::obs;

    fn write(at: Ms, replica: &str, ns: &str) -> WriteObs {
        WriteObs {
            at,
            replica: replica.into(),
            namespace: ns.into(),
            resource: format!("KmsSecret/{ns}/app"),
            message: "target written".into(),
        }
    }

    /// Namespace `nsN` is in shard N.
    fn shard_of(ns: &str) -> u32 {
        ns.trim_start_matches("ns").parse().unwrap()
    }

    fn good_leases() -> Vec<LeaseObs> {
        vec![
            obs(0, Some("a"), 0, 0),
            obs(0, Some("a"), 0, 1000),
            obs(0, None, 0, 1500),
            obs(0, Some("b"), 1700, 1700),
            obs(0, Some("b"), 1700, 2700),
            obs(1, Some("b"), 0, 0),
            obs(1, Some("b"), 0, 1000),
        ]
    }

    #[test]
    fn a_clean_history_passes() {
        let writes = [
            write(500, "a", "ns0"),
            write(1400, "a", "ns0"),
            write(2000, "b", "ns0"),
            write(3000, "b", "ns1"),
        ];
        let o = check(
            &good_leases(),
            &writes,
            &[],
            &shard_of,
            10_000,
            &Params::default(),
        );
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["writes_checked"], 4);
    }

    #[test]
    fn two_holders_fail() {
        let mut h = good_leases();
        // c takes shard 1 while b renewed it 1 s ago (5 s lease).
        h.push(obs(1, Some("c"), 2000, 2000));
        let o = check(&h, &[], &[], &shard_of, 10_000, &Params::default());
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
        assert!(
            o.violations[0]
                .message
                .contains("c acquired while b's term")
        );
    }

    #[test]
    fn a_write_outside_the_term_fails() {
        // a released shard 0 at 1500 and writes at 4000; b writes in shard
        // 0 before it acquired.
        let writes = [write(4000, "a", "ns0"), write(1200, "b", "ns0")];
        let o = check(
            &good_leases(),
            &writes,
            &[],
            &shard_of,
            10_000,
            &Params::default(),
        );
        assert_eq!(o.violations.len(), 2, "{:?}", o.violations);
        // A replica that never held the shard.
        let o = check(
            &good_leases(),
            &[write(500, "z", "ns1")],
            &[],
            &shard_of,
            10_000,
            &Params::default(),
        );
        assert!(!o.passed());
    }

    #[test]
    fn a_write_while_the_watcher_missed_a_hand_over_is_not_judged() {
        // b renews shard 1 until 3000; the watcher re-lists and finds the
        // Lease released after someone acquired it at 9000: a's write at
        // 10_000 cannot be judged.
        let mut h = vec![obs(1, Some("b"), 0, 0), obs(1, Some("b"), 0, 3000)];
        let mut released = obs(1, None, 9000, 11_000);
        released.after_gap = true;
        h.push(released);
        let o = check(
            &h,
            &[write(10_000, "a", "ns1")],
            &[],
            &shard_of,
            20_000,
            &Params::default(),
        );
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["writes_not_judged_after_relist"], 1);
        // Outside that span it is judged.
        let o = check(
            &h,
            &[write(15_000, "a", "ns1")],
            &[],
            &shard_of,
            20_000,
            &Params::default(),
        );
        assert!(!o.passed());
    }

    #[test]
    fn a_write_logged_right_after_sigcont_may_date_from_the_sigstop() {
        // a was stopped at 1200 (inside its term) and continued at 8000; a
        // line stamped at 8100 may describe a write answered before 1200.
        let pauses = [Pause {
            replica: "a".into(),
            from: 1200,
            to: 8000,
        }];
        let o = check(
            &good_leases(),
            &[write(8100, "a", "ns0")],
            &pauses,
            &shard_of,
            10_000,
            &Params::default(),
        );
        assert!(o.passed(), "{:?}", o.violations);
        // Well after the SIGCONT it is a write outside the term.
        let o = check(
            &good_leases(),
            &[write(10_500, "a", "ns0")],
            &pauses,
            &shard_of,
            20_000,
            &Params::default(),
        );
        assert!(!o.passed());
    }
}
