//! The fault scenarios, read from `chaos/scenarios.tsv` — the file the kind
//! runner reads too, so both runners inject the same kinds of faults with
//! the same weights and durations.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

/// The scenario file shipped with the crate.
pub const BUILTIN: &str = include_str!("../scenarios.tsv");

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// kill -9 a replica, restart it under the same name.
    Kill,
    /// SIGTERM a replica, restart it under the same name.
    Term,
    /// SIGSTOP a replica past its lease, then SIGCONT.
    Pause,
    /// Restart kube-apiserver.
    ApiserverRestart,
    /// Restart etcd.
    EtcdRestart,
    /// Delete a replica's cache between stop and restart.
    CacheDelete,
    /// Corrupt a replica's cache between kill and restart.
    CacheCorrupt,
    /// One more replica.
    ScaleUp,
    /// One fewer replica.
    ScaleDown,
    /// The KMS answers 503.
    KmsOutage,
    /// The KMS answers slowly.
    KmsLatency,
    /// The KMS answers 429 beyond a small per-minute cap.
    Kms429,
    /// The KMS answers a share of requests with 5xx.
    Kms5xx,
    /// The KMS drops connections.
    KmsDrop,
}

impl FaultKind {
    /// Every kind, in the order of the scenario file.
    pub const ALL: [FaultKind; 14] = [
        FaultKind::Kill,
        FaultKind::Term,
        FaultKind::Pause,
        FaultKind::ApiserverRestart,
        FaultKind::EtcdRestart,
        FaultKind::CacheDelete,
        FaultKind::CacheCorrupt,
        FaultKind::ScaleUp,
        FaultKind::ScaleDown,
        FaultKind::KmsOutage,
        FaultKind::KmsLatency,
        FaultKind::Kms429,
        FaultKind::Kms5xx,
        FaultKind::KmsDrop,
    ];

    /// The name used in the scenario file and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Term => "term",
            FaultKind::Pause => "pause",
            FaultKind::ApiserverRestart => "apiserver-restart",
            FaultKind::EtcdRestart => "etcd-restart",
            FaultKind::CacheDelete => "cache-delete",
            FaultKind::CacheCorrupt => "cache-corrupt",
            FaultKind::ScaleUp => "scale-up",
            FaultKind::ScaleDown => "scale-down",
            FaultKind::KmsOutage => "kms-outage",
            FaultKind::KmsLatency => "kms-latency",
            FaultKind::Kms429 => "kms-429",
            FaultKind::Kms5xx => "kms-5xx",
            FaultKind::KmsDrop => "kms-drop",
        }
    }

    /// Whether the fault needs the control plane's restart command.
    pub fn needs_control_plane(self) -> bool {
        matches!(self, FaultKind::ApiserverRestart | FaultKind::EtcdRestart)
    }

    /// Whether the fault takes one replica out for a while (so at least two
    /// must be running before it).
    pub fn takes_a_replica_out(self) -> bool {
        matches!(
            self,
            FaultKind::Kill
                | FaultKind::Term
                | FaultKind::Pause
                | FaultKind::CacheDelete
                | FaultKind::CacheCorrupt
                | FaultKind::ScaleDown
        )
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .with_context(|| format!("unknown fault kind {s:?}"))
    }
}

/// Which sequence of faults a kind belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Track {
    /// Replica processes and the control plane.
    Process,
    /// The KMS.
    Kms,
}

/// One line of the scenario file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    /// The fault.
    pub kind: FaultKind,
    /// Its track.
    pub track: Track,
    /// Relative frequency within the track (0 disables it).
    pub weight: u32,
    /// Shortest hold.
    pub hold_min: Duration,
    /// Longest hold.
    pub hold_max: Duration,
    /// Description.
    pub text: String,
}

/// Parse a scenario file. Every line names a known kind once; blank lines
/// and `#` comments are skipped.
pub fn parse(text: &str) -> anyhow::Result<Vec<Scenario>> {
    let mut out: Vec<Scenario> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut cols = line.split_whitespace();
        let (Some(kind), Some(track), Some(weight), Some(hold)) =
            (cols.next(), cols.next(), cols.next(), cols.next())
        else {
            bail!(
                "scenario line {}: expected kind, track, weight, hold",
                i + 1
            );
        };
        let kind: FaultKind = kind
            .parse()
            .with_context(|| format!("scenario line {}", i + 1))?;
        let track = match track {
            "process" => Track::Process,
            "kms" => Track::Kms,
            other => bail!("scenario line {}: unknown track {other:?}", i + 1),
        };
        let expected = if kind.as_str().starts_with("kms-") {
            Track::Kms
        } else {
            Track::Process
        };
        if track != expected {
            bail!("scenario line {}: {kind} belongs to another track", i + 1);
        }
        let weight: u32 = weight
            .parse()
            .with_context(|| format!("scenario line {}: weight", i + 1))?;
        let (lo, hi) = hold
            .split_once('-')
            .with_context(|| format!("scenario line {}: hold is MIN-MAX", i + 1))?;
        let lo: u64 = lo
            .parse()
            .with_context(|| format!("line {}: hold", i + 1))?;
        let hi: u64 = hi
            .parse()
            .with_context(|| format!("line {}: hold", i + 1))?;
        if hi < lo {
            bail!("scenario line {}: hold {lo}-{hi} is reversed", i + 1);
        }
        if out.iter().any(|s| s.kind == kind) {
            bail!("scenario line {}: {kind} is listed twice", i + 1);
        }
        out.push(Scenario {
            kind,
            track,
            weight,
            hold_min: Duration::from_secs(lo),
            hold_max: Duration::from_secs(hi),
            text: cols.collect::<Vec<_>>().join(" "),
        });
    }
    if out.is_empty() {
        bail!("the scenario file lists no faults");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_file_lists_every_kind_once() {
        let s = parse(BUILTIN).unwrap();
        assert_eq!(s.len(), FaultKind::ALL.len());
        for k in FaultKind::ALL {
            assert!(s.iter().any(|x| x.kind == k), "{k} missing");
        }
        assert!(s.iter().all(|x| x.weight > 0));
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(parse("bogus process 1 0-0 x").is_err());
        assert!(parse("kill kms 1 0-0 x").is_err());
        assert!(parse("kill process 1 3-1 x").is_err());
        assert!(parse("kill process 1 1-2 x\nkill process 1 1-2 y").is_err());
        assert!(parse("# nothing").is_err());
        let one = parse("kill process 2 1-3 kill it").unwrap();
        assert_eq!(one[0].hold_max, Duration::from_secs(3));
        assert_eq!(one[0].text, "kill it");
    }
}
