//! The coordinator's decisions as a pure function: given the Leases as last
//! observed (with the instants, on this replica's monotonic clock, at which
//! each was seen to change), what this replica holds, and the current instant,
//! which Leases to acquire, renew, hand over or clear, and which shards to
//! stop working on. No I/O and no clock reads: time is an argument.
//!
//! The rules (`docs/architecture.md`, "Shards and Leases"):
//!
//! * A Lease is **expired** when it has not changed for its duration on the
//!   observer's clock (`changed_at + duration <= now`), like client-go. The
//!   holder's `renewTime` is never compared with our clock, so clock skew
//!   cannot make two owners.
//! * **Live members** are member Leases with a holder that are not expired,
//!   plus this replica while it is not stopping. The assignment
//!   ([`crate::assign::assign`]) over them says who should own what.
//! * A held shard is **lost** at once when its Lease shows another holder or
//!   is gone, and when no renewal succeeded for the renew deadline (fencing).
//! * A held shard assigned to another live member (or every held shard, when
//!   stopping) is **handed over**: stop work, drain, then clear the holder.
//!   Held shards are renewed every retry period until then.
//! * A shard assigned to us and not held is **acquired** when its Lease is
//!   absent, free, already ours, or expired.
//! * While a live member runs with another shard count or hash version,
//!   nothing is acquired and nothing is handed over for rebalancing; held
//!   shards are still renewed, and a stop still hands everything over.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::assign::assign;
use crate::events::{LossReason, Mismatch};

/// One Lease as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `holderIdentity`, `None` when absent or empty (free).
    pub holder: Option<String>,
    /// When this replica first saw the Lease's current resourceVersion.
    pub changed_at: Instant,
    /// The Lease's `leaseDurationSeconds` (or ours when it has none).
    pub duration: Duration,
}

impl Observed {
    /// The instant from which the Lease counts as expired.
    pub fn expires_at(&self) -> Instant {
        self.changed_at + self.duration
    }

    /// Whether the Lease has not changed for its duration at `now`.
    pub fn is_expired(&self, now: Instant) -> bool {
        now >= self.expires_at()
    }
}

/// Another replica's member Lease as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The identity in the Lease name.
    pub identity: String,
    /// The Lease.
    pub lease: Observed,
    /// Its recorded shard count.
    pub shards: Option<u32>,
    /// Its recorded hash version.
    pub hash_version: Option<u32>,
    /// The demand it published.
    pub demand: Option<u32>,
}

/// Where a held shard is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Owned: work may run.
    Active,
    /// Being handed over: the token is cancelled, the drain hook runs; the
    /// Lease is still renewed.
    Draining,
    /// Drained: the Lease is to be cleared.
    Drained,
}

/// A shard whose Lease this replica holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// When the last successful acquisition or renewal was sent.
    pub renewed_at: Instant,
    /// When the next renewal (or clear) is due.
    pub next_attempt: Instant,
    /// The phase.
    pub phase: Phase,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// This replica's identity.
    pub identity: &'a str,
    /// Our shard count.
    pub shards: u32,
    /// Our hash version.
    pub hash_version: u32,
    /// The renew deadline.
    pub renew_deadline: Duration,
    /// Whether a graceful stop is in progress.
    pub stopping: bool,
    /// Member Leases as observed (ours may be among them; it is skipped).
    pub members: &'a [Member],
    /// Shard Leases as observed, by shard.
    pub leases: &'a BTreeMap<u32, Observed>,
    /// The shards this replica holds.
    pub held: &'a BTreeMap<u32, Held>,
    /// Shards whose acquisition must not be retried before the instant.
    pub backoff: &'a BTreeMap<u32, Instant>,
    /// When our member Lease is next due for renewal.
    pub member_due: Instant,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Live members, sorted.
    pub live: Vec<String>,
    /// The assignment over the live members.
    pub assignment: BTreeMap<u32, String>,
    /// Live members with a different configuration.
    pub mismatches: Vec<Mismatch>,
    /// Renew (or create) our member Lease.
    pub renew_member: bool,
    /// Acquire these shards (compare-and-swap, or create when absent).
    pub acquire: Vec<u32>,
    /// Renew these held shards.
    pub renew: Vec<u32>,
    /// Start handing these active shards over.
    pub hand_over: Vec<(u32, LossReason)>,
    /// Clear the holder of these drained shards.
    pub clear: Vec<u32>,
    /// Clear these Leases that name us as holder although we do not hold
    /// them (left by an earlier run of this replica, or given up after a
    /// failed renewal) and that are not ours to keep.
    pub release_unheld: Vec<u32>,
    /// Stop holding these shards at once, without writing.
    pub drop: Vec<(u32, LossReason)>,
    /// When to decide again at the latest (absent: nothing is time-bound).
    pub wake_at: Option<Instant>,
}

impl Plan {
    fn wake(&mut self, at: Instant) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }
}

/// Decide what to do at `now`.
pub fn decide(inputs: &Inputs<'_>, now: Instant) -> Plan {
    let mut plan = Plan::default();
    let me = inputs.identity;

    // Live members and configuration mismatches.
    let mut live = BTreeSet::new();
    for member in inputs.members {
        if member.identity == me || member.lease.holder.is_none() {
            continue;
        }
        if member.lease.is_expired(now) {
            continue;
        }
        plan.wake(member.lease.expires_at());
        live.insert(member.identity.clone());
        if member.shards != Some(inputs.shards) || member.hash_version != Some(inputs.hash_version)
        {
            plan.mismatches.push(Mismatch {
                member: member.identity.clone(),
                shards: member.shards,
                hash_version: member.hash_version,
                our_shards: inputs.shards,
                our_hash_version: inputs.hash_version,
            });
        }
    }
    if !inputs.stopping {
        live.insert(me.to_owned());
    }
    plan.mismatches.sort_by(|a, b| a.member.cmp(&b.member));
    plan.mismatches.dedup_by(|a, b| a.member == b.member);
    plan.live = live.into_iter().collect();
    plan.assignment = assign(&plan.live, inputs.shards);
    let mismatch = !plan.mismatches.is_empty();

    plan.renew_member = now >= inputs.member_due;
    if !plan.renew_member {
        plan.wake(inputs.member_due);
    }

    // Shards we hold.
    for (&shard, held) in inputs.held {
        let lease = inputs.leases.get(&shard);
        if lease.and_then(|l| l.holder.as_deref()) != Some(me) {
            plan.drop.push((shard, LossReason::TakenOver));
            continue;
        }
        let deadline = held.renewed_at + inputs.renew_deadline;
        if now >= deadline {
            plan.drop.push((shard, LossReason::RenewDeadline));
            continue;
        }
        plan.wake(deadline);
        let due = now >= held.next_attempt;
        if !due {
            plan.wake(held.next_attempt);
        }
        match held.phase {
            Phase::Active => {
                let assigned_elsewhere =
                    plan.assignment.get(&shard).is_none_or(|owner| owner != me);
                if inputs.stopping {
                    plan.hand_over.push((shard, LossReason::Shutdown));
                } else if assigned_elsewhere && !mismatch {
                    plan.hand_over.push((shard, LossReason::Rebalanced));
                } else if due {
                    plan.renew.push(shard);
                }
            }
            Phase::Draining => {
                if due {
                    plan.renew.push(shard);
                }
            }
            Phase::Drained => {
                if due {
                    plan.clear.push(shard);
                }
            }
        }
    }

    // Leases naming us that we do not hold.
    for (&shard, lease) in inputs.leases {
        if lease.holder.as_deref() != Some(me) || inputs.held.contains_key(&shard) {
            continue;
        }
        let ours = plan.assignment.get(&shard).is_some_and(|owner| owner == me);
        if !(inputs.stopping || (!mismatch && !ours)) {
            continue;
        }
        match inputs.backoff.get(&shard) {
            Some(&until) if now < until => plan.wake(until),
            _ => plan.release_unheld.push(shard),
        }
    }

    // Shards assigned to us that we do not hold.
    if inputs.stopping || mismatch {
        return plan;
    }
    let mine: Vec<u32> = plan
        .assignment
        .iter()
        .filter(|(shard, owner)| owner.as_str() == me && !inputs.held.contains_key(shard))
        .map(|(shard, _)| *shard)
        .collect();
    for shard in mine {
        if let Some(&until) = inputs.backoff.get(&shard)
            && now < until
        {
            plan.wake(until);
            continue;
        }
        match inputs.leases.get(&shard) {
            None => plan.acquire.push(shard),
            Some(lease) => match lease.holder.as_deref() {
                None => plan.acquire.push(shard),
                Some(holder) if holder == me => plan.acquire.push(shard),
                Some(_) if lease.is_expired(now) => plan.acquire.push(shard),
                Some(_) => plan.wake(lease.expires_at()),
            },
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "kms-0";
    const OTHER: &str = "kms-1";
    const S: Duration = Duration::from_secs(1);

    struct World {
        t0: Instant,
        members: Vec<Member>,
        leases: BTreeMap<u32, Observed>,
        held: BTreeMap<u32, Held>,
        backoff: BTreeMap<u32, Instant>,
        stopping: bool,
        shards: u32,
    }

    impl World {
        fn new(shards: u32) -> Self {
            Self {
                t0: Instant::now(),
                members: Vec::new(),
                leases: BTreeMap::new(),
                held: BTreeMap::new(),
                backoff: BTreeMap::new(),
                stopping: false,
                shards,
            }
        }
        fn at(&self, secs: u64) -> Instant {
            self.t0 + S * secs as u32
        }
        fn member(&mut self, identity: &str, changed: u64, shards: u32) {
            self.members.push(Member {
                identity: identity.to_owned(),
                lease: Observed {
                    holder: Some(identity.to_owned()),
                    changed_at: self.at(changed),
                    duration: 10 * S,
                },
                shards: Some(shards),
                hash_version: Some(crate::HASH_VERSION),
                demand: None,
            });
        }
        fn lease(&mut self, shard: u32, holder: Option<&str>, changed: u64) {
            self.leases.insert(
                shard,
                Observed {
                    holder: holder.map(str::to_owned),
                    changed_at: self.at(changed),
                    duration: 10 * S,
                },
            );
        }
        fn hold(&mut self, shard: u32, renewed: u64, phase: Phase) {
            self.lease(shard, Some(ME), renewed);
            self.held.insert(
                shard,
                Held {
                    renewed_at: self.at(renewed),
                    next_attempt: self.at(renewed + 2),
                    phase,
                },
            );
        }
        fn decide(&self, now: u64) -> Plan {
            decide(
                &Inputs {
                    identity: ME,
                    shards: self.shards,
                    hash_version: crate::HASH_VERSION,
                    renew_deadline: 7 * S,
                    stopping: self.stopping,
                    members: &self.members,
                    leases: &self.leases,
                    held: &self.held,
                    backoff: &self.backoff,
                    member_due: self.at(1000),
                },
                self.at(now),
            )
        }
    }

    /// Shards the assignment gives to `who` with the world's members.
    fn assigned_to(plan: &Plan, who: &str) -> Vec<u32> {
        plan.assignment
            .iter()
            .filter(|(_, o)| o.as_str() == who)
            .map(|(s, _)| *s)
            .collect()
    }

    #[test]
    fn alone_acquires_absent_and_free_leases() {
        let mut w = World::new(4);
        w.lease(1, None, 0);
        let plan = w.decide(0);
        assert_eq!(plan.live, vec![ME]);
        assert_eq!(plan.acquire, vec![0, 1, 2, 3]);
        assert!(plan.drop.is_empty() && plan.hand_over.is_empty());
    }

    #[test]
    fn lease_of_live_other_is_left_until_it_expires_on_our_clock() {
        let mut w = World::new(4);
        w.member(OTHER, 0, 4);
        let probe = w.decide(0);
        let mine = assigned_to(&probe, ME);
        let shard = mine[0];
        // The previous holder (say, a replica that just left) still holds it.
        w.lease(shard, Some("kms-gone"), 5);
        let plan = w.decide(14);
        assert!(!plan.acquire.contains(&shard));
        assert_eq!(plan.wake_at, Some(w.at(15)));
        // Unchanged for the full duration since we saw it change: expired.
        let plan = w.decide(15);
        assert!(plan.acquire.contains(&shard));
    }

    #[test]
    fn shards_assigned_to_a_live_other_are_not_acquired() {
        let mut w = World::new(8);
        w.member(OTHER, 0, 8);
        let plan = w.decide(1);
        let theirs = assigned_to(&plan, OTHER);
        assert!(!theirs.is_empty());
        for s in &theirs {
            assert!(!plan.acquire.contains(s));
        }
        assert_eq!(plan.acquire, assigned_to(&plan, ME));
    }

    #[test]
    fn held_shard_assigned_elsewhere_is_handed_over() {
        let mut w = World::new(8);
        w.member(OTHER, 0, 8);
        let probe = w.decide(0);
        let theirs = assigned_to(&probe, OTHER)[0];
        let mine = assigned_to(&probe, ME)[0];
        w.hold(theirs, 0, Phase::Active);
        w.hold(mine, 0, Phase::Active);
        let plan = w.decide(1);
        assert_eq!(plan.hand_over, vec![(theirs, LossReason::Rebalanced)]);
        assert!(plan.renew.is_empty(), "nothing due before the retry period");
        let plan = w.decide(2);
        assert_eq!(plan.renew, vec![mine]);
    }

    #[test]
    fn renew_deadline_drops_the_shard() {
        let mut w = World::new(1);
        w.hold(0, 0, Phase::Active);
        let plan = w.decide(6);
        assert!(plan.drop.is_empty());
        assert_eq!(plan.renew, vec![0]);
        assert!(plan.wake_at.is_some_and(|t| t <= w.at(7)));
        let plan = w.decide(7);
        assert_eq!(plan.drop, vec![(0, LossReason::RenewDeadline)]);
        assert!(plan.renew.is_empty());
    }

    #[test]
    fn a_lease_with_another_holder_is_lost_at_once() {
        let mut w = World::new(2);
        w.hold(0, 0, Phase::Active);
        w.lease(0, Some(OTHER), 1);
        let plan = w.decide(1);
        assert_eq!(plan.drop, vec![(0, LossReason::TakenOver)]);
        // A deleted Lease too.
        w.leases.remove(&0);
        assert_eq!(w.decide(1).drop, vec![(0, LossReason::TakenOver)]);
    }

    #[test]
    fn our_own_holder_is_reclaimed_after_a_restart() {
        let mut w = World::new(1);
        w.lease(0, Some(ME), 0);
        assert_eq!(w.decide(0).acquire, vec![0]);
    }

    #[test]
    fn expiry_ignores_the_holders_renew_time() {
        // Observed carries no renewTime at all: whatever the holder wrote (far
        // past, far future), only our own observation instant counts. See the
        // store tests for the conversion from a Lease.
        let mut w = World::new(1);
        w.lease(0, Some(OTHER), 3);
        assert!(w.decide(12).acquire.is_empty());
        assert_eq!(w.decide(13).acquire, vec![0]);
    }

    #[test]
    fn expired_member_leaves_the_assignment() {
        let mut w = World::new(4);
        w.member(OTHER, 0, 4);
        assert_eq!(w.decide(9).live, vec![ME, OTHER]);
        let plan = w.decide(10);
        assert_eq!(plan.live, vec![ME]);
        assert_eq!(plan.acquire, vec![0, 1, 2, 3]);
    }

    #[test]
    fn wakes_when_a_member_expires() {
        let mut w = World::new(4);
        w.member(OTHER, 0, 4);
        for s in 0..4 {
            w.hold(s, 0, Phase::Active);
        }
        // Renewals are due at 2; member expiry at 10; deadline at 7.
        assert_eq!(w.decide(1).wake_at, Some(w.at(2)));
    }

    #[test]
    fn mismatch_stops_acquiring_and_rebalancing_but_keeps_renewing() {
        let mut w = World::new(4);
        w.member(OTHER, 0, 8);
        let probe = w.decide(0);
        assert_eq!(probe.mismatches.len(), 1);
        let m = &probe.mismatches[0];
        assert_eq!(
            (m.member.as_str(), m.shards, m.our_shards),
            (OTHER, Some(8), 4)
        );
        assert!(m.to_string().contains("kms-1 runs with 8 shards"));
        assert!(probe.acquire.is_empty());
        let theirs = assigned_to(&probe, OTHER)[0];
        w.hold(theirs, 0, Phase::Active);
        let plan = w.decide(2);
        assert!(plan.hand_over.is_empty());
        assert_eq!(plan.renew, vec![theirs]);
        // An unreadable or missing annotation is a mismatch too.
        w.members[0].shards = Some(4);
        w.members[0].hash_version = None;
        assert_eq!(w.decide(2).mismatches[0].hash_version, None);
        // Once the member agrees, acquisition resumes.
        w.members[0].hash_version = Some(crate::HASH_VERSION);
        let plan = w.decide(2);
        assert!(plan.mismatches.is_empty());
        assert!(!plan.acquire.is_empty());
    }

    #[test]
    fn stopping_hands_everything_over_and_acquires_nothing() {
        let mut w = World::new(4);
        w.member(OTHER, 0, 4);
        w.hold(0, 0, Phase::Active);
        w.hold(1, 0, Phase::Draining);
        w.hold(2, 0, Phase::Drained);
        w.stopping = true;
        let plan = w.decide(2);
        assert_eq!(plan.live, vec![OTHER]);
        assert_eq!(plan.hand_over, vec![(0, LossReason::Shutdown)]);
        assert_eq!(plan.renew, vec![1]);
        assert_eq!(plan.clear, vec![2]);
        assert!(plan.acquire.is_empty());
        // Even with a mismatched member, a stop hands over.
        w.members[0].shards = Some(8);
        assert_eq!(w.decide(2).hand_over, vec![(0, LossReason::Shutdown)]);
    }

    #[test]
    fn backoff_delays_acquisition() {
        let mut w = World::new(1);
        w.backoff.insert(0, w.at(3));
        let plan = w.decide(1);
        assert!(plan.acquire.is_empty());
        assert_eq!(plan.wake_at, Some(w.at(3)));
        assert_eq!(w.decide(3).acquire, vec![0]);
    }

    #[test]
    fn stale_claims_of_ours_are_released_unless_assigned_to_us() {
        let mut w = World::new(8);
        w.member(OTHER, 0, 8);
        let probe = w.decide(0);
        let theirs = assigned_to(&probe, OTHER)[0];
        let mine = assigned_to(&probe, ME)[0];
        w.lease(theirs, Some(ME), 0);
        w.lease(mine, Some(ME), 0);
        let plan = w.decide(1);
        assert_eq!(plan.release_unheld, vec![theirs]);
        assert!(plan.acquire.contains(&mine));
        // Not while backing off (a shard given up after a drain timeout).
        w.backoff.insert(theirs, w.at(10));
        assert!(w.decide(1).release_unheld.is_empty());
        // All of them when stopping.
        w.backoff.clear();
        w.stopping = true;
        assert_eq!(w.decide(1).release_unheld.len(), 2);
    }

    #[test]
    fn member_renewal_is_due_on_time() {
        let w = World::new(1);
        let mut inputs = Inputs {
            identity: ME,
            shards: 1,
            hash_version: 1,
            renew_deadline: 7 * S,
            stopping: false,
            members: &w.members,
            leases: &w.leases,
            held: &w.held,
            backoff: &w.backoff,
            member_due: w.at(2),
        };
        assert!(!decide(&inputs, w.at(1)).renew_member);
        assert!(decide(&inputs, w.at(2)).renew_member);
        inputs.stopping = true;
        assert!(decide(&inputs, w.at(2)).renew_member);
    }

    #[test]
    fn our_own_member_lease_is_not_a_peer() {
        let mut w = World::new(2);
        w.member(ME, 0, 99);
        let plan = w.decide(1);
        assert!(plan.mismatches.is_empty());
        assert_eq!(plan.live, vec![ME]);
    }
}
