//! The namespace → shard mapping is part of the product's contract: an
//! upgrade that moved namespaces between shards would make two replicas of
//! different versions disagree about ownership. These tests pin the mapping
//! (hash version 1) and check how it behaves when the shard count changes.
//!
//! The table was cross-checked against an independent implementation of the
//! definition in `src/ring.rs` (Python's hashlib): if it fails, the mapping
//! changed, and `HASH_VERSION` must be bumped together with the table.

use shard::{HASH_VERSION, Ring};

/// (namespace, shard) for 16 shards, hash version 1.
const GOLDEN_16: &[(&str, u32)] = &[
    ("", 9),
    ("default", 2),
    ("kube-system", 13),
    ("kube-public", 11),
    ("kube-node-lease", 10),
    ("kms-operator-system", 2),
    ("cert-manager", 8),
    ("ingress-nginx", 3),
    ("monitoring", 2),
    ("observability", 4),
    ("argocd", 2),
    ("flux-system", 12),
    ("istio-system", 10),
    ("payments", 8),
    ("payments-staging", 5),
    ("checkout", 11),
    ("billing", 14),
    ("auth", 14),
    ("identity", 1),
    ("search", 2),
    ("data-platform", 0),
    ("ml-training", 2),
    ("analytics", 12),
    ("web", 7),
    ("api", 7),
    ("backend", 5),
    ("frontend", 14),
    ("staging", 12),
    ("production", 10),
    ("dev", 0),
    ("team-1", 8),
    ("team-2", 12),
    ("team-3", 4),
    ("team-4", 8),
    ("team-5", 5),
    ("team-6", 13),
    ("team-7", 7),
    ("team-8", 5),
    ("team-9", 7),
    ("team-10", 1),
    ("team-a", 2),
    ("team-b", 13),
    ("team-c", 11),
    ("team-d", 0),
    ("team-e", 11),
    ("ns-000", 9),
    ("ns-001", 9),
    ("ns-002", 1),
    ("ns-003", 2),
    ("ns-004", 14),
    ("ns-005", 14),
    ("ns-006", 14),
    ("ns-007", 6),
    ("ns-008", 1),
    ("ns-009", 10),
    (
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        3,
    ),
    ("ünïcode-namespace-ok-as-bytes", 2),
];

#[test]
fn golden_mapping_for_sixteen_shards() {
    assert_eq!(
        HASH_VERSION, 1,
        "a new hash version needs a new golden table"
    );
    assert!(GOLDEN_16.len() >= 50);
    let ring = Ring::new(16).expect("ring");
    let wrong: Vec<String> = GOLDEN_16
        .iter()
        .filter(|(ns, shard)| ring.shard_of(ns) != *shard)
        .map(|(ns, shard)| format!("{ns:?}: pinned {shard}, now {}", ring.shard_of(ns)))
        .collect();
    assert!(
        wrong.is_empty(),
        "the namespace mapping changed:\n{}",
        wrong.join("\n")
    );
}

fn namespaces(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 4 {
            0 => format!("ns-{i}"),
            1 => format!("team-{i}-prod"),
            2 => format!("app{i}"),
            _ => format!("customer-{i:06}"),
        })
        .collect()
}

#[test]
fn growing_by_one_shard_moves_only_onto_the_new_shard() {
    let names = namespaces(10_000);
    for shards in [1u32, 2, 3, 8, 15, 16, 31] {
        let (before, after) = (
            Ring::new(shards).expect("ring"),
            Ring::new(shards + 1).expect("ring"),
        );
        let mut moved = 0;
        for ns in &names {
            let (a, b) = (before.shard_of(ns), after.shard_of(ns));
            if a != b {
                assert_eq!(
                    b, shards,
                    "{ns} moved from {a} to {b}, not to the new shard"
                );
                moved += 1;
            }
        }
        // The new shard's fair share is 1/(S+1); allow 25 % more.
        let fair = names.len() as f64 / f64::from(shards + 1);
        assert!(
            f64::from(moved) <= fair * 1.25,
            "{shards} -> {}: {moved} of {} moved (fair {fair:.0})",
            shards + 1,
            names.len()
        );
        assert!(moved > 0);
    }
}

#[test]
fn shrinking_by_one_shard_moves_only_the_removed_shard() {
    let names = namespaces(10_000);
    let (before, after) = (Ring::new(16).expect("ring"), Ring::new(15).expect("ring"));
    for ns in &names {
        let (a, b) = (before.shard_of(ns), after.shard_of(ns));
        assert!(a == b || a == 15, "{ns} moved from {a} to {b}");
    }
}

#[test]
fn doubling_moves_about_half() {
    let names = namespaces(10_000);
    let (before, after) = (Ring::new(16).expect("ring"), Ring::new(32).expect("ring"));
    let moved = names
        .iter()
        .filter(|ns| before.shard_of(ns) != after.shard_of(ns))
        .count();
    // Ideal: half of them; a modulo mapping would also move half, but to
    // arbitrary shards — here every namespace lands on a new shard only.
    assert!(
        (4_000..=6_000).contains(&moved),
        "16 -> 32 moved {moved} of 10000"
    );
    for ns in &names {
        let (a, b) = (before.shard_of(ns), after.shard_of(ns));
        assert!(
            a == b || b >= 16,
            "{ns} moved between old shards ({a} -> {b})"
        );
    }
}

#[test]
fn shards_are_balanced() {
    let names = namespaces(20_000);
    for shards in [3u32, 16, 17] {
        let ring = Ring::new(shards).expect("ring");
        let mut counts = vec![0u32; shards as usize];
        for ns in &names {
            counts[ring.shard_of(ns) as usize] += 1;
        }
        let mean = names.len() as f64 / f64::from(shards);
        for (shard, &count) in counts.iter().enumerate() {
            let ratio = f64::from(count) / mean;
            assert!(
                (0.85..=1.15).contains(&ratio),
                "{shards} shards: shard {shard} has {count} ({ratio:.2} of the mean)"
            );
        }
    }
}
