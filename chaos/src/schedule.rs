//! The fault schedule: a pure function of the seed, the scenarios and the
//! profile. Two tracks (replicas/control plane, KMS) are each a sequence of
//! steps run one after another; the tracks run side by side. Every enabled
//! kind occurs at least once when the track has room for it; the rest is
//! drawn by weight. Replica counts are simulated so that scaling stays
//! within bounds and a fault that takes a replica out always leaves another
//! one running.

use std::time::Duration;

use serde::Serialize;

use crate::rng::Rng;
use crate::scenario::{FaultKind, Scenario, Track};

/// One planned fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    /// Position within its track.
    pub index: usize,
    /// The track.
    pub track: Track,
    /// The fault.
    pub kind: FaultKind,
    /// Pause before the fault starts.
    #[serde(with = "secs")]
    pub gap_before: Duration,
    /// How long it lasts (see the scenario file for each kind's meaning).
    #[serde(with = "secs")]
    pub hold: Duration,
    /// Random number choosing the target (a replica) at run time.
    pub pick: u64,
    /// Random number for the fault's parameters (latency, error rate, …).
    pub param: u64,
}

/// Bounds the schedule respects.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Replicas at the start.
    pub initial_replicas: usize,
    /// Never fewer replicas than this (at least 2).
    pub min_replicas: usize,
    /// Never more replicas than this.
    pub max_replicas: usize,
    /// Whether the control plane can be restarted.
    pub control_plane: bool,
}

/// How many faults of each track, and the pauses between them.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Faults on the process track.
    pub process_faults: usize,
    /// Faults on the KMS track.
    pub kms_faults: usize,
    /// Shortest pause between two faults of a track.
    pub gap_min: Duration,
    /// Longest pause.
    pub gap_max: Duration,
}

/// The whole schedule.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// Process and control-plane faults, in order.
    pub process: Vec<Step>,
    /// KMS faults, in order.
    pub kms: Vec<Step>,
}

impl Plan {
    /// Number of faults planned, both tracks.
    pub fn faults(&self) -> usize {
        self.process.len() + self.kms.len()
    }
}

mod secs {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
    }
}

fn enabled(s: &Scenario, limits: &Limits) -> bool {
    s.weight > 0 && (limits.control_plane || !s.kind.needs_control_plane())
}

/// Whether `kind` may run with `replicas` running.
fn allowed(kind: FaultKind, replicas: usize, limits: &Limits) -> bool {
    match kind {
        FaultKind::ScaleUp => replicas < limits.max_replicas,
        FaultKind::ScaleDown => replicas > limits.min_replicas,
        k if k.takes_a_replica_out() => replicas >= 2,
        _ => true,
    }
}

fn hold(rng: &mut Rng, s: &Scenario) -> Duration {
    let lo = s.hold_min.as_millis() as u64;
    let hi = s.hold_max.as_millis() as u64;
    Duration::from_millis(rng.range(lo, hi))
}

fn track(
    seed: u64,
    which: Track,
    scenarios: &[Scenario],
    count: usize,
    shape: &Shape,
    limits: &Limits,
) -> Vec<Step> {
    let mut rng = Rng::fork(
        seed,
        match which {
            Track::Process => "process",
            Track::Kms => "kms",
        },
    );
    let pool: Vec<&Scenario> = scenarios
        .iter()
        .filter(|s| s.track == which && enabled(s, limits))
        .collect();
    if pool.is_empty() {
        return Vec::new();
    }
    // Each kind once first (in a random order), then by weight.
    let mut must: Vec<&Scenario> = pool.clone();
    for i in (1..must.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        must.swap(i, j);
    }
    let mut replicas = limits.initial_replicas;
    let mut steps = Vec::with_capacity(count);
    for index in 0..count {
        let chosen = match must.iter().position(|s| allowed(s.kind, replicas, limits)) {
            Some(i) => must.remove(i),
            None => {
                let candidates: Vec<&Scenario> = pool
                    .iter()
                    .copied()
                    .filter(|s| allowed(s.kind, replicas, limits))
                    .collect();
                let total: u64 = candidates.iter().map(|s| u64::from(s.weight)).sum();
                let mut x = rng.below(total);
                let mut pick = candidates[0];
                for c in &candidates {
                    let w = u64::from(c.weight);
                    if x < w {
                        pick = c;
                        break;
                    }
                    x -= w;
                }
                pick
            }
        };
        match chosen.kind {
            FaultKind::ScaleUp => replicas += 1,
            FaultKind::ScaleDown => replicas -= 1,
            _ => {}
        }
        let gap_lo = shape.gap_min.as_millis() as u64;
        let gap_hi = shape.gap_max.as_millis() as u64;
        steps.push(Step {
            index,
            track: which,
            kind: chosen.kind,
            gap_before: Duration::from_millis(rng.range(gap_lo, gap_hi)),
            hold: hold(&mut rng, chosen),
            pick: rng.next_u64(),
            param: rng.next_u64(),
        });
    }
    steps
}

/// The schedule for `seed`.
pub fn plan(seed: u64, scenarios: &[Scenario], shape: &Shape, limits: &Limits) -> Plan {
    Plan {
        process: track(
            seed,
            Track::Process,
            scenarios,
            shape.process_faults,
            shape,
            limits,
        ),
        kms: track(seed, Track::Kms, scenarios, shape.kms_faults, shape, limits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{BUILTIN, parse};

    fn shape(p: usize, k: usize) -> Shape {
        Shape {
            process_faults: p,
            kms_faults: k,
            gap_min: Duration::from_secs(2),
            gap_max: Duration::from_secs(5),
        }
    }

    fn limits(cp: bool) -> Limits {
        Limits {
            initial_replicas: 3,
            min_replicas: 2,
            max_replicas: 4,
            control_plane: cp,
        }
    }

    #[test]
    fn a_seed_gives_the_same_plan_and_another_seed_another() {
        let s = parse(BUILTIN).unwrap();
        let a = plan(42, &s, &shape(17, 15), &limits(true));
        let b = plan(42, &s, &shape(17, 15), &limits(true));
        let c = plan(43, &s, &shape(17, 15), &limits(true));
        assert_eq!(a.process, b.process);
        assert_eq!(a.kms, b.kms);
        assert_ne!(a.process, c.process);
        assert_eq!(a.faults(), 32);
    }

    #[test]
    fn every_kind_occurs_and_replica_counts_stay_in_bounds() {
        let s = parse(BUILTIN).unwrap();
        for seed in 0..200 {
            let p = plan(seed, &s, &shape(17, 15), &limits(true));
            for k in FaultKind::ALL {
                assert!(
                    p.process.iter().chain(&p.kms).any(|x| x.kind == k),
                    "seed {seed}: {k} never planned"
                );
            }
            let mut n = 3usize;
            for step in &p.process {
                assert!(
                    allowed(step.kind, n, &limits(true)),
                    "seed {seed}: {step:?}"
                );
                match step.kind {
                    FaultKind::ScaleUp => n += 1,
                    FaultKind::ScaleDown => n -= 1,
                    _ => {}
                }
                assert!((2..=4).contains(&n));
            }
            for step in p.process.iter().chain(&p.kms) {
                let sc = s.iter().find(|x| x.kind == step.kind).unwrap();
                assert!(step.hold >= sc.hold_min && step.hold <= sc.hold_max);
            }
        }
    }

    #[test]
    fn without_a_control_plane_it_is_never_restarted() {
        let s = parse(BUILTIN).unwrap();
        let p = plan(5, &s, &shape(60, 0), &limits(false));
        assert!(p.process.iter().all(|x| !x.kind.needs_control_plane()));
        assert!(p.kms.is_empty());
    }
}
