//! Terms of shard ownership, derived from the recorded Lease states.
//!
//! A term is a holder's claim on a shard: it starts at the Lease's
//! `acquireTime` and is valid until the holder releases the Lease, another
//! holder takes it, or `renewTime + leaseDurationSeconds` passes without a
//! renewal — whichever comes first. The times are those written into the
//! Lease by its holder (the same machine clock as everything else), not the
//! times the watcher happened to see the updates.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::{LeaseObs, Ms};

/// How a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum End {
    /// The holder cleared `holderIdentity`.
    Released,
    /// Another holder took the Lease.
    TakenOver,
    /// No renewal within the lease duration.
    Expired,
    /// Still valid at the end of the history.
    Open,
}

/// One holder's continuous claim on one shard.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    /// The shard.
    pub shard: u32,
    /// The holder.
    pub holder: String,
    /// `acquireTime` (or the first renewal of a term resumed after expiry).
    pub start: Ms,
    /// The last renewal.
    pub last_renew: Ms,
    /// Valid until.
    pub end: Ms,
    /// Why it ended.
    pub how: End,
}

/// A holder change that broke exclusivity: the new holder acquired before
/// the previous holder's term had ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Overlap {
    /// The shard.
    pub shard: u32,
    /// The previous holder.
    pub previous: String,
    /// Its term was valid until.
    pub valid_until: Ms,
    /// The new holder.
    pub next: String,
    /// It acquired at.
    pub acquired: Ms,
}

/// The terms of every shard.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Terms {
    /// Terms, by shard, in time order.
    pub by_shard: BTreeMap<u32, Vec<Term>>,
    /// Takeovers while the previous term was still valid (beyond the
    /// tolerance).
    pub overlaps: Vec<Overlap>,
    /// Holder changes seen only across a re-list of the watcher (a release
    /// in between may have been missed), not judged.
    pub unverified: usize,
    /// Spans, by shard, in which the watcher was away and the Lease
    /// changed hands in a way the re-list cannot fully tell (someone
    /// acquired and released it, or the holder changed): who held the
    /// shard then is unknown.
    pub unknown: BTreeMap<u32, Vec<(Ms, Ms)>>,
}

struct Current {
    holder: String,
    start: Ms,
    acquire: Option<Ms>,
    last_renew: Ms,
    duration: Ms,
}

impl Current {
    fn valid_until(&self) -> Ms {
        self.last_renew + self.duration
    }

    fn close(self, shard: u32, end: Ms, how: End) -> Term {
        Term {
            shard,
            holder: self.holder,
            start: self.start,
            last_renew: self.last_renew,
            end,
            how,
        }
    }
}

/// Derive terms from Lease states (in the order the watcher received them)
/// up to `until`. A takeover earlier than `tolerance` ms before the previous
/// term's end is an [`Overlap`].
pub fn derive(obs: &[LeaseObs], until: Ms, tolerance: Ms) -> Terms {
    let mut per: BTreeMap<u32, Vec<&LeaseObs>> = BTreeMap::new();
    for o in obs {
        per.entry(o.shard).or_default().push(o);
    }
    let mut out = Terms::default();
    for (shard, events) in per {
        let terms = out.by_shard.entry(shard).or_default();
        let unknown = out.unknown.entry(shard).or_default();
        let mut cur: Option<Current> = None;
        // The latest stamp and acquisition seen for this shard.
        let mut last_stamp: Option<Ms> = None;
        let mut last_acquire: Option<Ms> = None;
        for e in events {
            let renew = e.renew.unwrap_or(e.observed);
            let acquire = e.acquire.unwrap_or(renew);
            let duration = Ms::from(e.duration_s.max(1)) * 1000;
            let holder = if e.deleted { None } else { e.holder.clone() };
            if e.after_gap
                && let Some(since) = last_stamp
            {
                let holder_changed = cur.as_ref().map(|c| &c.holder) != holder.as_ref();
                if holder_changed || e.acquire != last_acquire {
                    // Changes were missed between `since` and this state.
                    let until = if holder.is_some() { acquire } else { renew };
                    unknown.push((since, until.max(since)));
                }
            }
            last_stamp = Some(last_stamp.map_or(renew, |l| l.max(renew)));
            if e.acquire.is_some() {
                last_acquire = e.acquire;
            }
            match (cur.take(), holder) {
                (None, None) => {}
                (None, Some(h)) => {
                    cur = Some(Current {
                        holder: h,
                        start: acquire.min(renew),
                        acquire: e.acquire,
                        last_renew: renew,
                        duration,
                    });
                }
                (Some(c), None) => {
                    let release = if e.deleted { e.observed } else { renew };
                    let end = release.min(c.valid_until());
                    let how = if release <= c.valid_until() {
                        End::Released
                    } else {
                        End::Expired
                    };
                    terms.push(c.close(shard, end, how));
                }
                (Some(mut c), Some(h)) if h == c.holder => {
                    let reacquired = e.acquire.is_some() && e.acquire != c.acquire;
                    if !e.after_gap && renew > c.valid_until() {
                        // The holder renewed after its own term expired: the
                        // claim lapsed in between and starts again now.
                        let end = c.valid_until();
                        terms.push(c.close(shard, end, End::Expired));
                        cur = Some(Current {
                            holder: h,
                            start: renew,
                            acquire: e.acquire,
                            last_renew: renew,
                            duration,
                        });
                    } else if reacquired && e.after_gap {
                        // Released and taken again by the same holder while
                        // the watcher was away.
                        let end = c.valid_until().min(acquire);
                        terms.push(c.close(shard, end, End::Released));
                        cur = Some(Current {
                            holder: h,
                            start: acquire,
                            acquire: e.acquire,
                            last_renew: renew,
                            duration,
                        });
                    } else {
                        c.last_renew = c.last_renew.max(renew);
                        c.duration = duration;
                        cur = Some(c);
                    }
                }
                (Some(c), Some(h)) => {
                    if e.after_gap {
                        out.unverified += 1;
                    } else if acquire + tolerance < c.valid_until() {
                        out.overlaps.push(Overlap {
                            shard,
                            previous: c.holder.clone(),
                            valid_until: c.valid_until(),
                            next: h.clone(),
                            acquired: acquire,
                        });
                    }
                    let (end, how) = if acquire < c.valid_until() {
                        (acquire, End::TakenOver)
                    } else {
                        (c.valid_until(), End::Expired)
                    };
                    terms.push(c.close(shard, end, how));
                    cur = Some(Current {
                        holder: h,
                        start: acquire,
                        acquire: e.acquire,
                        last_renew: renew,
                        duration,
                    });
                }
            }
        }
        if let Some(c) = cur {
            let (end, how) = if c.valid_until() > until {
                (until, End::Open)
            } else {
                (c.valid_until(), End::Expired)
            };
            terms.push(c.close(shard, end, how));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Lease state for tests: `holder` renewed at `renew` (acquired at
    /// `acquire`), duration 5 s, seen 20 ms later.
    pub(crate) fn obs(shard: u32, holder: Option<&str>, acquire: Ms, renew: Ms) -> LeaseObs {
        LeaseObs {
            observed: renew + 20,
            shard,
            holder: holder.map(str::to_owned),
            acquire: Some(acquire),
            renew: Some(renew),
            duration_s: 5,
            after_gap: false,
            deleted: false,
        }
    }

    #[test]
    fn renewals_extend_a_term_and_a_release_ends_it() {
        let h = [
            obs(0, Some("a"), 0, 0),
            obs(0, Some("a"), 0, 1000),
            obs(0, Some("a"), 0, 2000),
            obs(0, None, 0, 2500),
            obs(0, Some("b"), 2800, 2800),
        ];
        let t = derive(&h, 10_000, 100);
        let terms = &t.by_shard[&0];
        assert_eq!(terms.len(), 2);
        assert_eq!(
            (terms[0].start, terms[0].end, terms[0].how),
            (0, 2500, End::Released)
        );
        assert_eq!(
            (terms[1].holder.as_str(), terms[1].start, terms[1].end),
            ("b", 2800, 7800)
        );
        assert!(t.overlaps.is_empty());
    }

    #[test]
    fn a_takeover_after_expiry_is_fine_and_before_it_is_an_overlap() {
        let fine = [obs(1, Some("a"), 0, 1000), obs(1, Some("b"), 6100, 6100)];
        let t = derive(&fine, 20_000, 100);
        assert!(t.overlaps.is_empty());
        assert_eq!(t.by_shard[&1][0].how, End::Expired);
        assert_eq!(t.by_shard[&1][0].end, 6000);

        let early = [obs(1, Some("a"), 0, 1000), obs(1, Some("b"), 3000, 3000)];
        let t = derive(&early, 20_000, 100);
        assert_eq!(t.overlaps.len(), 1);
        assert_eq!(t.overlaps[0].next, "b");
        assert_eq!(t.by_shard[&1][0].how, End::TakenOver);
    }

    #[test]
    fn a_late_renewal_splits_the_term_and_a_relist_is_not_judged() {
        let lapse = [obs(2, Some("a"), 0, 0), obs(2, Some("a"), 0, 9000)];
        let t = derive(&lapse, 20_000, 100);
        let terms = &t.by_shard[&2];
        assert_eq!(terms.len(), 2);
        assert_eq!((terms[0].end, terms[1].start), (5000, 9000));

        let mut relisted = obs(2, Some("b"), 1000, 1000);
        relisted.after_gap = true;
        let t = derive(&[obs(2, Some("a"), 0, 0), relisted], 20_000, 100);
        assert!(t.overlaps.is_empty());
        assert_eq!(t.unverified, 1);
        assert_eq!(t.unknown[&2], vec![(0, 1000)]);
    }

    #[test]
    fn an_acquisition_and_release_missed_by_the_watcher_is_an_unknown_span() {
        // a renews until 3000; the watcher comes back to a released Lease
        // that someone acquired at 9000 and released at 11_000.
        let mut released = obs(3, None, 9000, 11_000);
        released.after_gap = true;
        let t = derive(
            &[
                obs(3, Some("a"), 0, 3000),
                released,
                obs(3, Some("b"), 12_000, 12_000),
            ],
            20_000,
            100,
        );
        assert_eq!(t.unknown[&3], vec![(3000, 11_000)]);
        // Nothing missed: a plain renewal after a re-list adds no span.
        let mut same = obs(3, Some("a"), 0, 4000);
        same.after_gap = true;
        let t = derive(&[obs(3, Some("a"), 0, 3000), same], 20_000, 100);
        assert!(t.unknown[&3].is_empty());
    }
}
