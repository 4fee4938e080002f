//! Which live member should own which shard: a pure function of the member set
//! and the shard count that every replica computes alike.
//!
//! # Algorithm
//!
//! Every (member, shard) pair has a rank, [`rank`]`(member, shard)` =
//! `hash64(member bytes ‖ 0x00 ‖ shard as 4 bytes big-endian)` (see
//! [`crate::ring::hash64`]). With R distinct members and S shards, let
//! `base = ⌊S/R⌋`:
//!
//! 1. Walk all pairs from the highest rank down (ties: smaller member name,
//!    then smaller shard first). Give the shard to the member when the shard
//!    is still free and the member holds fewer than `base` shards.
//! 2. Walk the pairs again in the same order and hand each shard still free
//!    to its member when that member holds exactly `base` shards.
//!
//! After step 1 every member holds exactly `base` shards (a member below
//! `base` at the end would have been offered every free shard), and step 2
//! gives the `S mod R` leftovers to distinct members, so each member ends with
//! `⌊S/R⌋` or `⌈S/R⌉` shards. The result depends only on the set of members,
//! not on their order or repetitions.
//!
//! Walking the pairs globally by rank keeps the assignment sticky: a shard
//! stays with the member that ranks it highest unless that member is full.
//! Walking the same two steps shard by shard instead (the first design); on
//! random member sets that variant moved up to about twice as many extra
//! shards on a join (extra = beyond the newcomer's share, which must move
//! anyway). With 16 shards, a join or leave moves on average 0.0 / 0.8 / 1.1 /
//! 1.6 / 2.2 extra shards for 2 / 3 / 4 / 5 / 6 members, and at most two per
//! member in the tests. With more shards per member the cascade grows
//! (members 2 → 3 over 58 shards: 7 extra), and the tests bound it by two per
//! member plus one per eight shards. Exact ⌊S/R⌋/⌈S/R⌉ balance without
//! remembering the previous owners cannot always move only the newcomer's
//! share: when R changes, every member's quota changes and a few shards
//! cascade.

use std::collections::{BTreeMap, BTreeSet};

use crate::ring::hash64;

/// The rank of `member` for `shard` (higher is preferred).
pub fn rank(member: &str, shard: u32) -> u64 {
    let mut bytes = Vec::with_capacity(member.len() + 5);
    bytes.extend_from_slice(member.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&shard.to_be_bytes());
    hash64(&bytes)
}

/// The owner of every shard `0..shards` among `members` (duplicates and empty
/// names are ignored). Empty when there are no members or no shards.
pub fn assign(members: &[String], shards: u32) -> BTreeMap<u32, String> {
    let members: Vec<&str> = members
        .iter()
        .map(String::as_str)
        .filter(|m| !m.is_empty())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let count = members.len() as u32;
    if count == 0 || shards == 0 {
        return BTreeMap::new();
    }
    let base = shards / count;

    let mut pairs: Vec<(u64, usize, u32)> = Vec::with_capacity(members.len() * shards as usize);
    for (index, member) in members.iter().enumerate() {
        for shard in 0..shards {
            pairs.push((rank(member, shard), index, shard));
        }
    }
    // Highest rank first; members are sorted, so a smaller index is a smaller
    // name.
    pairs.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));

    let mut held = vec![0u32; members.len()];
    let mut owner: Vec<Option<usize>> = vec![None; shards as usize];
    for cap in [base, base + 1] {
        for &(_, member, shard) in &pairs {
            let slot = &mut owner[shard as usize];
            if slot.is_none() && held[member] < cap {
                *slot = Some(member);
                held[member] += 1;
            }
        }
    }

    owner
        .into_iter()
        .enumerate()
        .filter_map(|(shard, member)| member.map(|m| (shard as u32, members[m].to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn counts(assignment: &BTreeMap<u32, String>) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for member in assignment.values() {
            *counts.entry(member.clone()).or_insert(0) += 1;
        }
        counts
    }

    fn moves(a: &BTreeMap<u32, String>, b: &BTreeMap<u32, String>) -> usize {
        a.iter()
            .filter(|(shard, owner)| b.get(shard) != Some(owner))
            .count()
    }

    #[test]
    fn sixteen_over_three_is_six_five_five() {
        let a = assign(&names(&["kms-0", "kms-1", "kms-2"]), 16);
        assert_eq!(a.len(), 16);
        let mut c: Vec<u32> = counts(&a).into_values().collect();
        c.sort_unstable();
        assert_eq!(c, vec![5, 5, 6]);
    }

    #[test]
    fn degenerate_inputs() {
        assert!(assign(&[], 16).is_empty());
        assert!(assign(&names(&["a"]), 0).is_empty());
        assert!(assign(&names(&[""]), 4).is_empty());
        let one = assign(&names(&["a", "a", ""]), 4);
        assert_eq!(one.len(), 4);
        assert!(one.values().all(|m| m == "a"));
        // More members than shards: every shard owned once, nobody twice.
        let many = assign(&names(&["a", "b", "c", "d", "e"]), 3);
        assert_eq!(many.len(), 3);
        assert!(counts(&many).values().all(|&c| c == 1));
    }

    /// Over a fixed sample of member sets, for 16 shards and 2–6 members: how
    /// many shards a join moves beyond the newcomer's share, on average and at
    /// worst. (Measured: mean extra 0.0 / 0.8 / 1.1 / 1.6 / 2.2 for 2 / 3 / 4
    /// / 5 / 6 members after the join.)
    #[test]
    fn few_extra_moves_for_sixteen_shards() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for size in 1..=5usize {
            let (mut extra_sum, mut extra_max) = (0usize, 0usize);
            let trials = 400;
            for trial in 0..trials {
                let members: Vec<String> = (0..size)
                    .map(|i| format!("kms-operator-{:x}-{i}-{trial}", next() % 100_000))
                    .collect();
                let newcomer = format!("kms-operator-new-{:x}", next() % 1_000_000);
                let mut grown = members.clone();
                grown.push(newcomer.clone());
                let (before, after) = (assign(&members, 16), assign(&grown, 16));
                let share = after.values().filter(|m| **m == newcomer).count();
                let extra = moves(&before, &after) - share;
                extra_sum += extra;
                extra_max = extra_max.max(extra);
            }
            let mean = extra_sum as f64 / trials as f64;
            assert!(mean <= 2.5, "{} members: mean extra moves {mean}", size + 1);
            assert!(
                extra_max <= 2 * (size + 1),
                "{} members: {extra_max} extra moves",
                size + 1
            );
        }
    }

    /// The most shards a join or leave moves beyond the newcomer's share, as
    /// the tests hold it: two per member plus one per eight shards. Two per
    /// member alone is exceeded by one, rarely, when a quota drops by ten or
    /// more (members 2 → 3 over 58 shards moved 7 extra; over 300,000 random
    /// joins of 1–8 members to 1–64 shards, 7 went one above `2 × members` and
    /// none above this bound). Not a proven maximum: the cascade of quota
    /// changes grows with the shards each member gives up.
    fn cascade_bound(members: usize, shards: u32) -> usize {
        2 * members + shards as usize / 8
    }

    /// The join the property test found above `2 × members`: kept with the
    /// bound it really has.
    #[test]
    fn join_of_a_third_member_over_58_shards() {
        let members = names(&["lj0", "pe73-vxozs-v"]);
        let grown = names(&["lj0", "pe73-vxozs-v", "s"]);
        let (before, after) = (assign(&members, 58), assign(&grown, 58));
        let share = after.values().filter(|m| *m == "s").count();
        assert_eq!(share, 19 + usize::from(counts(&after)["s"] == 20));
        let extra = moves(&before, &after) - share;
        assert!(extra > 2 * grown.len(), "extra {extra}");
        assert!(extra <= cascade_bound(grown.len(), 58), "extra {extra}");
    }

    fn member_set() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set("[a-z][a-z0-9-]{0,12}", 1..9)
            .prop_map(|set| set.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn deterministic_and_order_free(members in member_set(), shards in 1u32..=64, seed in any::<u64>()) {
            let a = assign(&members, shards);
            let mut shuffled = members.clone();
            // A deterministic shuffle from the seed, plus a duplicate.
            let n = shuffled.len();
            for i in (1..n).rev() {
                let j = (seed.rotate_left(i as u32) as usize) % (i + 1);
                shuffled.swap(i, j);
            }
            shuffled.push(members[0].clone());
            prop_assert_eq!(&a, &assign(&shuffled, shards));
            prop_assert_eq!(&a, &assign(&members, shards));
        }

        #[test]
        fn balanced(members in member_set(), shards in 1u32..=64) {
            let a = assign(&members, shards);
            prop_assert_eq!(a.len() as u32, shards);
            let r = members.len() as u32;
            let (lo, hi) = (shards / r, shards.div_ceil(r));
            let c = counts(&a);
            for member in &members {
                let held = c.get(member).copied().unwrap_or(0);
                prop_assert!(held >= lo && held <= hi, "{member} holds {held}, want {lo}..={hi}");
            }
        }

        #[test]
        fn sticky_when_one_member_joins_or_leaves(
            members in member_set(),
            newcomer in "[a-z][a-z0-9-]{0,12}",
            shards in 1u32..=64,
        ) {
            prop_assume!(!members.contains(&newcomer));
            let before = assign(&members, shards);
            let mut grown = members.clone();
            grown.push(newcomer.clone());
            let after = assign(&grown, shards);
            // The shards that must move are the newcomer's share; the cascade
            // on top of it stays below two per member plus one per eight
            // shards (see `cascade_bound`).
            let share = after.values().filter(|m| **m == newcomer).count();
            let bound = share + cascade_bound(grown.len(), shards);
            let m = moves(&before, &after);
            prop_assert!(m <= bound, "join moved {m} > {bound}");
            // Leaving is the reverse change.
            let m = moves(&after, &before);
            prop_assert!(m <= bound, "leave moved {m} > {bound}");
        }
    }
}
