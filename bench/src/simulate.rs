//! `simulate`: what the shard assignment and the shared KMS budget do for
//! 1 to 20 replicas, computed without a cluster from the `shard` crate's own
//! assignment and the budget rule of `docs/architecture.md`.
//!
//! - **Assignment**: for each replica count R, the fewest and most shards a
//!   replica owns, and how many shards change owner when one replica joins
//!   (R → R+1) or leaves (R+1 → R), against the fewest possible.
//! - **Budget**: N resources over N/10 namespaces (hashed to shards as the
//!   operator hashes them), one KMS request each, a total rate B shared by
//!   R replicas; seconds until every request is made when each replica's
//!   part follows its demand (owned shards plus requests waiting, published
//!   once a second, rises applied after 3 s), against an even split.

use std::collections::BTreeMap;

use serde::Serialize;

/// One replica count.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Replicas.
    pub replicas: usize,
    /// Fewest shards a replica owns.
    pub min_shards: usize,
    /// Most shards a replica owns.
    pub max_shards: usize,
    /// Shards that change owner when one replica joins.
    pub moves_on_join: usize,
    /// The fewest possible on a join (what the new replica must get).
    pub least_on_join: usize,
    /// Shards that change owner when that replica leaves again.
    pub moves_on_leave: usize,
    /// Seconds to make every request with parts by demand.
    pub budget_by_demand_seconds: f64,
    /// Seconds with an even split.
    pub even_split_seconds: f64,
    /// The lower bound: requests ÷ rate.
    pub bound_seconds: f64,
}

/// The whole simulation.
#[derive(Clone, Debug, Serialize)]
pub struct Simulation {
    /// Shards.
    pub shards: u32,
    /// Resources (one request each).
    pub resources: usize,
    /// Total KMS rate, requests per second.
    pub rate: f64,
    /// Per replica count.
    pub steps: Vec<Step>,
}

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("kms-operator-{i}")).collect()
}

fn moves(a: &BTreeMap<u32, String>, b: &BTreeMap<u32, String>) -> usize {
    a.iter().filter(|(s, m)| b.get(s) != Some(m)).count()
}

/// Seconds until `pending` (requests waiting per replica) is drained at a
/// total `rate`, with each replica's part computed by `part` from the
/// published weights, in steps of 0.1 s.
fn drain(mut pending: Vec<f64>, shards: &[usize], rate: f64, by_demand: bool) -> f64 {
    const DT: f64 = 0.1;
    const PUBLISH_EVERY: usize = 10; // 1 s
    const RISE_STEPS: usize = 30; // 3 s
    let n = pending.len();
    let weights = |pending: &[f64]| -> Vec<f64> {
        pending
            .iter()
            .zip(shards)
            .map(|(p, s)| (p + *s as f64).max(1.0))
            .collect()
    };
    let parts_of = |w: &[f64]| -> Vec<f64> {
        let total: f64 = w.iter().sum();
        w.iter().map(|x| x / total).collect()
    };
    // Each replica's recent targets, for the rise hold.
    let mut history: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut published = weights(&pending);
    let mut t = 0usize;
    while pending.iter().any(|p| *p > 1e-9) {
        if t.is_multiple_of(PUBLISH_EVERY) {
            published = weights(&pending);
        }
        let targets = if by_demand {
            parts_of(&published)
        } else {
            vec![1.0 / n as f64; n]
        };
        for (i, target) in targets.iter().enumerate() {
            history[i].push(*target);
            if history[i].len() > RISE_STEPS {
                history[i].remove(0);
            }
            let part = history[i].iter().copied().fold(f64::INFINITY, f64::min);
            pending[i] = (pending[i] - part * rate * DT).max(0.0);
        }
        t += 1;
        if t > 10_000_000 {
            break;
        }
    }
    t as f64 * DT
}

/// Run the simulation for 1..=`max_replicas` replicas.
pub fn run(shards: u32, resources: usize, rate: f64, max_replicas: usize) -> Simulation {
    let ring = shard::Ring::new(shards).expect("a valid shard count");
    let namespaces = resources.div_ceil(10);
    let mut per_shard = vec![0usize; shards as usize];
    for i in 0..namespaces {
        let in_ns = 10.min(resources - i * 10);
        per_shard[ring.shard_of(&format!("ns-{i:05}")) as usize] += in_ns;
    }
    let mut steps = Vec::new();
    for r in 1..=max_replicas {
        let now = shard::assign(&members(r), shards);
        let grown = shard::assign(&members(r + 1), shards);
        let names = members(r);
        let counts: Vec<usize> = names
            .iter()
            .map(|n| now.values().filter(|m| *m == n).count())
            .collect();
        let newcomer = members(r + 1).pop().unwrap_or_default();
        let least_on_join = grown.values().filter(|m| **m == newcomer).count();
        let pending: Vec<f64> = names
            .iter()
            .map(|n| {
                now.iter()
                    .filter(|(_, m)| *m == n)
                    .map(|(s, _)| per_shard[*s as usize] as f64)
                    .sum()
            })
            .collect();
        steps.push(Step {
            replicas: r,
            min_shards: counts.iter().copied().min().unwrap_or(0),
            max_shards: counts.iter().copied().max().unwrap_or(0),
            moves_on_join: moves(&now, &grown),
            least_on_join,
            moves_on_leave: moves(&grown, &now),
            budget_by_demand_seconds: drain(pending.clone(), &counts, rate, true),
            even_split_seconds: drain(pending, &counts, rate, false),
            bound_seconds: resources as f64 / rate,
        });
    }
    Simulation {
        shards,
        resources,
        rate,
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_replica_drains_at_the_full_rate_and_demand_beats_an_even_split() {
        let sim = run(16, 1000, 20.0, 5);
        let one = &sim.steps[0];
        assert_eq!((one.min_shards, one.max_shards), (16, 16));
        assert!((one.budget_by_demand_seconds - 50.0).abs() < 0.2, "{one:?}");
        for s in &sim.steps[1..] {
            assert!(s.max_shards - s.min_shards <= 1, "{s:?}");
            assert!(
                s.budget_by_demand_seconds <= s.even_split_seconds + 0.2,
                "{s:?}"
            );
            assert!(s.budget_by_demand_seconds >= s.bound_seconds - 0.2, "{s:?}");
            assert!(s.moves_on_join >= s.least_on_join, "{s:?}");
        }
    }
}
