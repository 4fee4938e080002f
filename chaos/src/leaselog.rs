//! Reading a shard Lease history recorded outside this runner — the kind
//! runner records one with `kubectl get leases -w` — and judging it with
//! the same checkers (two holders, coverage).
//!
//! Lines are tab-separated: observed time (RFC 3339), watch event type,
//! Lease name, holder (`-` when empty), `acquireTime`, `renewTime` (`-`
//! when absent), `leaseDurationSeconds`. A line `#relist` says the watch
//! started again (the next state of each Lease may skip changes); a line
//! `#control-plane FROM TO` (ms since the epoch) is a window in which
//! kube-apiserver or etcd was restarting.

use std::collections::BTreeSet;

use crate::history::{LeaseObs, Ms, Window};

fn time(s: &str) -> Option<Ms> {
    if s == "-" || s.is_empty() {
        return None;
    }
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// The Lease states and control-plane windows of a recorded history.
pub fn parse(text: &str) -> (Vec<LeaseObs>, Vec<Window>) {
    let mut obs = Vec::new();
    let mut windows = Vec::new();
    let mut relisted: BTreeSet<u32> = BTreeSet::new();
    let mut pending = false;
    for line in text.lines() {
        if line.starts_with("#relist") {
            pending = true;
            relisted.clear();
            continue;
        }
        if let Some(rest) = line.strip_prefix("#control-plane ") {
            let mut it = rest.split_whitespace().filter_map(|x| x.parse::<Ms>().ok());
            if let (Some(from), Some(to)) = (it.next(), it.next()) {
                windows.push(Window { from, to });
            }
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        let [observed, kind, name, holder, acquire, renew, duration] = cols[..] else {
            continue;
        };
        let Some(shard) = name
            .rsplit_once("-shard-")
            .and_then(|(_, n)| n.parse::<u32>().ok())
        else {
            continue;
        };
        let after_gap = pending && relisted.insert(shard);
        let renew_ms = time(renew);
        obs.push(LeaseObs {
            observed: time(observed).or(renew_ms).unwrap_or(0),
            shard,
            holder: (holder != "-" && !holder.is_empty()).then(|| holder.to_owned()),
            acquire: time(acquire),
            renew: renew_ms,
            duration_s: duration.parse().unwrap_or(0),
            after_gap,
            deleted: kind == "DELETED",
        });
    }
    (obs, windows)
}

/// When every one of `shards` shards first had a holder.
pub fn all_held_at(obs: &[LeaseObs], shards: u32) -> Option<Ms> {
    let mut held: std::collections::BTreeMap<u32, bool> = Default::default();
    for o in obs {
        held.insert(o.shard, o.holder.is_some() && !o.deleted);
        if held.len() == shards as usize && held.values().all(|h| *h) {
            return Some(o.renew.unwrap_or(o.observed));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_lease_states() {
        let text = "2026-01-01T00:00:00Z\tADDED\tkms-operator-shard-03\tpod-0\t2026-01-01T00:00:00.000000Z\t2026-01-01T00:00:01.500000Z\t5\n\
                    #control-plane 100 200\n\
                    #relist\n\
                    2026-01-01T00:00:09Z\tADDED\tkms-operator-shard-03\t-\t2026-01-01T00:00:00.000000Z\t2026-01-01T00:00:08.000000Z\t5\n\
                    2026-01-01T00:00:10Z\tMODIFIED\tkms-operator-shard-03\tpod-1\t2026-01-01T00:00:10.000000Z\t2026-01-01T00:00:10.000000Z\t5\n\
                    2026-01-01T00:00:10Z\tADDED\tkms-operator-member-pod-1\tpod-1\t-\t-\t5\n";
        let (obs, windows) = parse(text);
        assert_eq!(obs.len(), 3);
        assert_eq!(windows, vec![Window { from: 100, to: 200 }]);
        assert_eq!(obs[0].holder.as_deref(), Some("pod-0"));
        assert_eq!(obs[0].renew, Some(1_767_225_601_500));
        assert!(!obs[0].after_gap && obs[1].after_gap && !obs[2].after_gap);
        assert_eq!(obs[1].holder, None);
        assert_eq!(all_held_at(&obs, 1), Some(1_767_225_601_500));
    }
}
