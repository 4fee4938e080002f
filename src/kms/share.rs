//! This replica's part of a budget that all replicas share (the KMS request
//! rate, the reload rate), in proportion to the demand each replica
//! publishes on its member Lease.
//!
//! The parts of every replica add up to the whole only if no replica takes
//! more before the others have given it up. So every change that *lowers*
//! this replica's part applies at once, and one that *raises* it applies
//! only after it has held for [`RISE_HOLD`]: by then the others have seen
//! the demand this replica published and lowered theirs. A member whose
//! Lease lapsed keeps its weight for [`SHARE_HOLD`] (restarted by
//! [`Share::hold`] on every failed Lease renewal): when the control plane is
//! unreachable every replica sees the others lapse at the same moment, and
//! must not take the whole budget each. Pure: every method takes `now`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// How long a member that left keeps its weight.
pub const SHARE_HOLD: Duration = Duration::from_secs(60);

/// How long a larger part must hold before it applies: more than the time
/// the other replicas take to see a published demand (one watch event).
pub const RISE_HOLD: Duration = Duration::from_secs(3);

/// The smallest weight: a replica with nothing waiting keeps a sliver, so
/// the first request of new work is not stuck behind its next renewal.
pub const MIN_WEIGHT: f64 = 1.0;

#[derive(Clone, Copy, Debug)]
struct Weight {
    value: f64,
    /// When the member was last seen leaving (its Lease lapsed).
    left: Option<Instant>,
}

/// This replica's part of a shared budget.
#[derive(Debug)]
pub struct Share {
    own: String,
    weights: BTreeMap<String, Weight>,
    /// The parts computed lately, `(since, part)`, oldest first; the one in
    /// force at the start of the [`RISE_HOLD`] window is kept too.
    history: VecDeque<(Instant, f64)>,
}

impl Share {
    /// Alone: the whole budget.
    pub fn new(now: Instant) -> Self {
        Self {
            own: String::new(),
            weights: BTreeMap::new(),
            history: VecDeque::from([(now, 1.0)]),
        }
    }

    /// The live members (`own` is this replica) and the weight each
    /// published (at least [`MIN_WEIGHT`]); members not listed have left.
    /// With `leases` (the members that still have a member Lease), a
    /// member that left and has none left gracefully: it gave up its work
    /// before deleting its Lease, so its weight goes at once; the others
    /// (and all of them without `leases`) keep theirs for [`SHARE_HOLD`].
    pub fn set(
        &mut self,
        own: &str,
        live: &BTreeMap<String, f64>,
        leases: Option<&BTreeSet<String>>,
        now: Instant,
    ) {
        own.clone_into(&mut self.own);
        if let Some(leases) = leases {
            self.weights
                .retain(|m, _| live.contains_key(m) || leases.contains(m) || *m == self.own);
        }
        for w in self.weights.values_mut() {
            w.left.get_or_insert(now);
        }
        for (member, value) in live {
            self.weights.insert(
                member.clone(),
                Weight {
                    value: value.max(MIN_WEIGHT),
                    left: None,
                },
            );
        }
        self.record(now);
    }

    /// The control plane could not be reached: the members that left may
    /// only have lapsed for the same reason; their hold starts again.
    pub fn hold(&mut self, now: Instant) {
        for w in self.weights.values_mut() {
            if w.left.is_some() {
                w.left = Some(now);
            }
        }
        self.record(now);
    }

    /// The part of the budget this replica may use now, in `(0, 1]`.
    pub fn part(&mut self, now: Instant) -> f64 {
        self.record(now);
        let start = now.checked_sub(RISE_HOLD).unwrap_or(now);
        // The lowest part in force at any time within the window.
        let mut lowest = f64::INFINITY;
        for (i, (since, part)) in self.history.iter().enumerate() {
            let until = self.history.get(i + 1).map(|(s, _)| *s);
            if until.is_none_or(|u| u > start) && *since <= now {
                lowest = lowest.min(*part);
            }
        }
        lowest.clamp(f64::MIN_POSITIVE, 1.0)
    }

    /// The members counted now (live, or left within [`SHARE_HOLD`]).
    pub fn members(&mut self, now: Instant) -> usize {
        self.record(now);
        self.weights.len().max(1)
    }

    /// Drop members whose hold is over, then note the part they leave.
    fn record(&mut self, now: Instant) {
        self.weights.retain(|_, w| {
            w.left
                .is_none_or(|l| now.saturating_duration_since(l) < SHARE_HOLD)
        });
        let own = self.weights.get(&self.own).map_or(MIN_WEIGHT, |w| w.value);
        let others: f64 = self
            .weights
            .iter()
            .filter(|(m, _)| **m != self.own)
            .map(|(_, w)| w.value)
            .sum();
        let part = own / (own + others);
        if self
            .history
            .back()
            .is_none_or(|(_, p)| (p - part).abs() > 1e-12)
        {
            self.history.push_back((now, part));
        }
        // Keep the part in force at the window's start, and what follows.
        let start = now.checked_sub(RISE_HOLD).unwrap_or(now);
        while self.history.len() > 1 && self.history[1].0 <= start {
            self.history.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(m, w)| ((*m).to_owned(), *w)).collect()
    }

    #[test]
    fn parts_follow_published_demand_and_add_up_to_the_whole() {
        let t0 = Instant::now();
        let mut shares: Vec<(String, Share)> = ["a", "b", "c"]
            .iter()
            .map(|m| ((*m).to_owned(), Share::new(t0)))
            .collect();
        let weights = live(&[("a", 600.0), ("b", 300.0), ("c", 100.0)]);
        for (m, s) in &mut shares {
            s.set(m, &weights, None, t0);
        }
        // Lower parts apply at once; larger ones after the hold.
        let now = t0 + RISE_HOLD;
        let parts: Vec<f64> = shares.iter_mut().map(|(_, s)| s.part(now)).collect();
        assert!((parts[0] - 0.6).abs() < 1e-9, "{parts:?}");
        assert!((parts[1] - 0.3).abs() < 1e-9, "{parts:?}");
        assert!((parts[2] - 0.1).abs() < 1e-9, "{parts:?}");
        assert!((parts.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_larger_part_waits_for_the_others_a_smaller_one_does_not() {
        let t0 = Instant::now();
        let mut a = Share::new(t0);
        a.set("a", &live(&[("a", 1.0), ("b", 1.0)]), None, t0);
        assert!((a.part(t0) - 0.5).abs() < 1e-9, "smaller at once");
        // a's work grows: its part rises only after the hold.
        let t1 = t0 + Duration::from_secs(10);
        a.set("a", &live(&[("a", 3.0), ("b", 1.0)]), None, t1);
        assert!((a.part(t1) - 0.5).abs() < 1e-9);
        assert!((a.part(t1 + RISE_HOLD / 2) - 0.5).abs() < 1e-9);
        assert!((a.part(t1 + RISE_HOLD) - 0.75).abs() < 1e-9);
        // b's grows: a's part falls at once.
        let t2 = t1 + Duration::from_secs(10);
        a.set("a", &live(&[("a", 3.0), ("b", 9.0)]), None, t2);
        assert!((a.part(t2) - 0.25).abs() < 1e-9);
        // Work-conserving: b done, a takes nearly all after the hold.
        let t3 = t2 + Duration::from_secs(10);
        a.set("a", &live(&[("a", 99.0), ("b", 0.0)]), None, t3);
        assert!((a.part(t3 + RISE_HOLD) - 0.99).abs() < 1e-9);
    }

    #[test]
    fn a_member_that_left_counts_until_its_hold_is_over() {
        let t0 = Instant::now();
        let mut a = Share::new(t0);
        a.set("a", &live(&[("a", 1.0), ("b", 1.0), ("c", 1.0)]), None, t0);
        let t1 = t0 + Duration::from_secs(5);
        a.set("a", &live(&[("a", 1.0)]), None, t1);
        assert_eq!(a.members(t1), 3, "a drop is not believed at once");
        // Renewals fail meanwhile: the hold starts again.
        let t2 = t1 + SHARE_HOLD / 2;
        a.hold(t2);
        assert_eq!(a.members(t1 + SHARE_HOLD), 3);
        assert!((a.part(t1 + SHARE_HOLD) - 1.0 / 3.0).abs() < 1e-9);
        // Believed once it held with renewals working, then the rise hold.
        let t3 = t2 + SHARE_HOLD;
        assert_eq!(a.members(t3), 1);
        assert!((a.part(t3) - 1.0 / 3.0).abs() < 1e-9);
        assert!((a.part(t3 + RISE_HOLD) - 1.0).abs() < 1e-9);
        // A member that comes back counts at once.
        let t4 = t3 + Duration::from_secs(10);
        a.set("a", &live(&[("a", 1.0), ("b", 1.0)]), None, t4);
        assert!((a.part(t4) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_member_that_left_gracefully_gives_its_weight_back_at_once() {
        let t0 = Instant::now();
        let mut a = Share::new(t0);
        let all = live(&[("a", 1.0), ("b", 1.0), ("c", 4.0)]);
        let leases: BTreeSet<String> = all.keys().cloned().collect();
        a.set("a", &all, Some(&leases), t0);
        assert!((a.part(t0) - 1.0 / 6.0).abs() < 1e-9);
        // c deleted its member Lease (a graceful stop); b's lapsed (cut
        // off, or the control plane unreachable): only b is still counted.
        let t1 = t0 + Duration::from_secs(5);
        let leases: BTreeSet<String> = ["a", "b"].iter().map(|m| (*m).to_owned()).collect();
        a.set("a", &live(&[("a", 1.0)]), Some(&leases), t1);
        assert_eq!(a.members(t1), 2);
        assert!((a.part(t1 + RISE_HOLD) - 0.5).abs() < 1e-9);
        // Without the Lease list every member that left is held.
        let mut h = Share::new(t0);
        h.set("a", &all, None, t0);
        h.set("a", &live(&[("a", 1.0)]), None, t1);
        assert_eq!(h.members(t1), 3);
    }

    #[test]
    fn alone_and_unlisted_own_weight() {
        let t0 = Instant::now();
        let mut a = Share::new(t0);
        assert!((a.part(t0) - 1.0).abs() < 1e-9);
        // Our own Lease not seen yet: we count with the least weight.
        a.set("a", &live(&[("b", 3.0)]), None, t0);
        assert!((a.part(t0) - 0.25).abs() < 1e-9);
    }
}
