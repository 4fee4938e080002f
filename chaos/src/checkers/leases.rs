//! Checker 3 — no leaked dynamic-secret leases (`docs/chaos.md`, checker 3).
//!
//! Each snapshot reads the KmsDynamicSecrets' statuses first and the KMS's
//! active leases right after. The operator records a lease in the status
//! before it uses it, and revokes a lease before it drops it from the
//! status, so with this order:
//!
//! * an active lease recorded by two resources is a violation;
//! * an active lease that some status recorded earlier but none records now
//!   was dropped without being revoked: a leak;
//! * an active lease no status ever recorded is brand new (its status write
//!   is under way), one whose status write failed (the operator then revokes
//!   it at once), or a crash orphan (the process died between the KMS's
//!   answer and the status write). Such a lease must never be renewed (its
//!   expiry moves by more than the slack) and must be gone at its TTL;
//! * at the end, the KMS's final state of every lease (`revoked` or
//!   `expired`) tells them apart: a lease no status ever recorded that was
//!   not revoked but left to expire is an orphan. It is allowed if a
//!   replica was killed (kill -9) within [`Params::crash_window`] after the
//!   lease was created (a crash orphan), or if a replica logged that it
//!   could not record the lease and tried to revoke it (the KMS refused the
//!   revocation, e.g. a long 429 pause, until the lease expired). An orphan
//!   with neither is a leak: the operator forgot the lease without a crash
//!   (for example a reconcile abandoned between the KMS's answer and the
//!   status write);
//! * after the runner deleted every resource (policy Revoke) and waited for
//!   the orphans' TTLs, no lease may be active.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkers::{Outcome, Violation};
use crate::history::{KmsLease, LeaseSnapshot, Ms};

/// Tolerances, in milliseconds.
#[derive(Clone, Debug)]
pub struct Params {
    /// An orphan's expiry may move this much between reads (rounding).
    pub renewal_slack: Ms,
    /// An orphan may still be listed this long after its expiry.
    pub expiry_slack: Ms,
    /// A kill -9 this long after a lease's creation explains an orphan.
    pub crash_window: Ms,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            renewal_slack: 1000,
            expiry_slack: 2000,
            crash_window: 30_000,
        }
    }
}

/// Run the checker. `at_end` is the KMS's active leases after every
/// resource was deleted and the orphans' TTLs passed, `every` every lease
/// the KMS ever created with its final state (`None` when the run did not
/// get that far); `kills` are the times replicas were killed; `tried` the
/// leases a replica logged it tried to revoke after failing to record them.
pub fn check(
    snapshots: &[LeaseSnapshot],
    at_end: Option<&[KmsLease]>,
    every: Option<&[KmsLease]>,
    kills: &[Ms],
    tried: &[String],
    p: &Params,
) -> Outcome {
    let mut out = Outcome::new(
        "leases",
        format!(
            "every active KMS lease recorded by exactly one KmsDynamicSecret; unrecorded (crash) \
             leases never renewed (slack {} ms) and gone at their TTL (slack {} ms), revoked \
             unless a replica was killed within {} ms after their creation; none left after \
             deletion",
            p.renewal_slack, p.expiry_slack, p.crash_window
        ),
    );
    let mut ever: BTreeMap<String, String> = BTreeMap::new();
    let mut reported: BTreeSet<(String, &'static str)> = BTreeSet::new();
    let mut first_expiry: BTreeMap<String, Ms> = BTreeMap::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut max_active = 0usize;
    let mut report = |out: &mut Outcome, id: &str, kind: &'static str, at: Ms, msg: String| {
        if reported.insert((id.to_owned(), kind)) {
            out.violations.push(Violation::at(at, msg));
        }
    };
    for s in snapshots {
        let mut by: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (cr, r) in &s.statuses {
            for id in r.current.iter().chain(&r.retired) {
                by.entry(id.as_str()).or_default().insert(cr.as_str());
            }
        }
        for (id, crs) in &by {
            if crs.len() > 1 {
                report(
                    &mut out,
                    id,
                    "two",
                    s.at,
                    format!("lease {id} is recorded by {} resources: {crs:?}", crs.len()),
                );
            }
            ever.insert(
                (*id).to_owned(),
                crs.iter().next().copied().unwrap_or_default().to_owned(),
            );
        }
        max_active = max_active.max(s.active.len());
        for l in &s.active {
            seen.insert(l.id.clone());
            if by.contains_key(l.id.as_str()) {
                continue;
            }
            if let Some(cr) = ever.get(&l.id) {
                let now = s
                    .statuses
                    .get(cr)
                    .map(|r| format!("current {:?}, retired {:?}", r.current, r.retired))
                    .unwrap_or_else(|| "the resource is gone".to_owned());
                report(
                    &mut out,
                    &l.id,
                    "dropped",
                    s.at,
                    format!(
                        "lease {} is active but {cr} no longer records it (leaked; its status now \
                         records {now})",
                        l.id
                    ),
                );
                continue;
            }
            let first = *first_expiry.entry(l.id.clone()).or_insert(l.expires);
            if l.expires > first + p.renewal_slack {
                report(
                    &mut out,
                    &l.id,
                    "renewed",
                    s.at,
                    format!(
                        "lease {} is recorded by no resource but was renewed ({} → {})",
                        l.id, first, l.expires
                    ),
                );
            }
            if s.at > first + p.expiry_slack {
                report(
                    &mut out,
                    &l.id,
                    "late",
                    s.at,
                    format!(
                        "unrecorded lease {} still active {} ms after its expiry",
                        l.id,
                        s.at - first
                    ),
                );
            }
        }
    }
    let (mut revoked, mut crash_orphans, mut refused, mut leaked) =
        (0usize, 0usize, 0usize, 0usize);
    match every {
        Some(all) => {
            for l in all.iter().filter(|l| !ever.contains_key(&l.id)) {
                if l.state == "revoked" {
                    revoked += 1;
                    continue;
                }
                let crash = kills
                    .iter()
                    .any(|&k| k >= l.created - 1000 && k <= l.created + p.crash_window);
                if crash {
                    crash_orphans += 1;
                } else if tried.contains(&l.id) {
                    refused += 1;
                } else {
                    leaked += 1;
                    out.violations.push(Violation::at(
                        l.created,
                        format!(
                            "lease {} was never recorded by any resource and never revoked \
                             (final state {}), no replica tried to revoke it, and no replica was \
                             killed within {} ms after its creation: orphaned without a crash",
                            l.id, l.state, p.crash_window
                        ),
                    ));
                }
            }
            out.stat("leases_created", all.len());
        }
        None => out.violations.push(Violation::timeless(
            "the run ended before the final lease states could be read",
        )),
    }
    match at_end {
        Some(left) => {
            for l in left {
                out.violations.push(Violation::timeless(format!(
                    "lease {} still active after every resource was deleted ({})",
                    l.id,
                    if ever.contains_key(&l.id) {
                        "it was recorded"
                    } else {
                        "an unrecorded orphan past its TTL"
                    }
                )));
            }
            out.stat("active_after_deletion", left.len());
        }
        None => out.violations.push(Violation::timeless(
            "the run ended before the leases left after deletion could be checked",
        )),
    }
    out.stat("snapshots", snapshots.len());
    out.stat("leases_seen_active", seen.len());
    out.stat("leases_recorded", ever.len());
    out.stat("unrecorded_revoked", revoked);
    out.stat("crash_orphans", crash_orphans);
    out.stat("unrecorded_revocation_refused_until_expiry", refused);
    out.stat("orphans_without_crash", leaked);
    out.stat("max_active_at_once", max_active);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::RecordedLeases;

    fn lease(id: &str, created: Ms, expires: Ms) -> KmsLease {
        ended(id, created, expires, "active")
    }

    fn ended(id: &str, created: Ms, expires: Ms, state: &str) -> KmsLease {
        KmsLease {
            id: id.into(),
            created,
            expires,
            state: state.into(),
        }
    }

    type Status<'a> = (&'a str, Option<&'a str>, &'a [&'a str]);

    fn snap(at: Ms, statuses: &[Status<'_>], active: Vec<KmsLease>) -> LeaseSnapshot {
        LeaseSnapshot {
            at,
            statuses: statuses
                .iter()
                .map(|(cr, cur, retired)| {
                    (
                        (*cr).to_owned(),
                        RecordedLeases {
                            current: cur.map(str::to_owned),
                            retired: retired.iter().map(|s| (*s).to_owned()).collect(),
                        },
                    )
                })
                .collect(),
            active,
        }
    }

    fn good() -> Vec<LeaseSnapshot> {
        vec![
            // l1 recorded by a; o1 brand new, never recorded (a crash).
            snap(
                0,
                &[("a", Some("l1"), &[])],
                vec![lease("l1", 0, 30_000), lease("o1", 0, 20_000)],
            ),
            // a replaced l1 by l2: l1 retired, still active.
            snap(
                10_000,
                &[("a", Some("l2"), &["l1"])],
                vec![
                    lease("l1", 0, 30_000),
                    lease("l2", 9000, 39_000),
                    lease("o1", 0, 20_000),
                ],
            ),
            // l1 revoked and dropped; o1 expired.
            snap(
                21_000,
                &[("a", Some("l2"), &[])],
                vec![lease("l2", 9000, 54_000)],
            ),
        ]
    }

    fn final_states(o1: &str) -> Vec<KmsLease> {
        vec![
            ended("l1", 0, 30_000, "revoked"),
            ended("l2", 9000, 54_000, "revoked"),
            ended("o1", 0, 20_000, o1),
        ]
    }

    #[test]
    fn recorded_leases_and_a_crash_orphan_pass() {
        let all = final_states("expired");
        let o = check(
            &good(),
            Some(&[]),
            Some(&all),
            &[500],
            &[],
            &Params::default(),
        );
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["crash_orphans"], 1);
        assert_eq!(o.stats["leases_recorded"], 2);
        // Not recorded because its status write failed, then revoked.
        let all = final_states("revoked");
        let o = check(&good(), Some(&[]), Some(&all), &[], &[], &Params::default());
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["unrecorded_revoked"], 1);
    }

    #[test]
    fn an_orphan_without_a_crash_fails() {
        let all = final_states("expired");
        let o = check(&good(), Some(&[]), Some(&all), &[], &[], &Params::default());
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
        assert!(o.violations[0].message.contains("orphaned without a crash"));
        // A revocation the KMS refused until the lease expired is no leak.
        let o = check(
            &good(),
            Some(&[]),
            Some(&all),
            &[],
            &["o1".to_owned()],
            &Params::default(),
        );
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["unrecorded_revocation_refused_until_expiry"], 1);
        // A kill long after its creation explains nothing.
        let o = check(
            &good(),
            Some(&[]),
            Some(&all),
            &[60_000],
            &[],
            &Params::default(),
        );
        assert!(!o.passed());
    }

    #[test]
    fn a_dropped_lease_fails() {
        let mut h = good();
        // l1 disappears from the status while still active.
        h.push(snap(
            22_000,
            &[("a", Some("l2"), &[])],
            vec![lease("l1", 0, 30_000)],
        ));
        let all = final_states("expired");
        let o = check(&h, Some(&[]), Some(&all), &[500], &[], &Params::default());
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
        assert!(o.violations[0].message.contains("leaked"));
    }

    #[test]
    fn a_renewed_orphan_two_owners_and_leftovers_fail() {
        let all = final_states("expired");
        let mut h = good();
        h.insert(
            2,
            snap(
                15_000,
                &[("a", Some("l2"), &["l1"])],
                vec![lease("o1", 0, 40_000)],
            ),
        );
        let o = check(&h, Some(&[]), Some(&all), &[500], &[], &Params::default());
        assert!(
            o.violations.iter().any(|v| v.message.contains("renewed")),
            "{:?}",
            o.violations
        );

        let two = [snap(
            0,
            &[("a", Some("l1"), &[]), ("b", None, &["l1"])],
            vec![lease("l1", 0, 9000)],
        )];
        let o = check(&two, Some(&[]), Some(&[]), &[], &[], &Params::default());
        assert!(o.violations[0].message.contains("2 resources"));

        let left = [lease("l2", 9000, 54_000)];
        let o = check(
            &good(),
            Some(&left),
            Some(&all),
            &[500],
            &[],
            &Params::default(),
        );
        assert!(
            o.violations[0]
                .message
                .contains("after every resource was deleted")
        );
        assert!(!check(&good(), None, Some(&all), &[500], &[], &Params::default()).passed());
        assert!(!check(&good(), Some(&[]), None, &[500], &[], &Params::default()).passed());
    }
}
