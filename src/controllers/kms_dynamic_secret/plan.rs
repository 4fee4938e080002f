//! The pure part of the dynamic-secret controller: when to create, renew or
//! replace a lease, and when to look again. Time is an argument.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::kms_dynamic_secret::{LeaseStatus, RetiredLease};

/// The facts about a lease the decisions need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// Lease id.
    pub id: String,
    /// When it was created.
    pub created: Timestamp,
    /// When it expires unless renewed.
    pub expires: Timestamp,
    /// The period each renewal adds.
    pub ttl: Duration,
}

impl LeaseView {
    /// From the status.
    pub fn from_status(l: &LeaseStatus) -> Self {
        let ttl = l
            .ttl
            .as_deref()
            .and_then(crate::kms::leases::parse_ttl)
            .unwrap_or_else(|| {
                let secs = (l.expires_at.0.as_second() - l.creation_timestamp.0.as_second()).max(1);
                Duration::from_secs(secs.unsigned_abs())
            });
        Self {
            id: l.id.clone(),
            created: l.creation_timestamp.0,
            expires: l.expires_at.0,
            ttl,
        }
    }

    /// How long before expiry renewal must have happened: min(30 s, TTL/3).
    pub fn margin(&self) -> Duration {
        Duration::from_secs(30).min(self.ttl / 3)
    }

    /// When to renew: a jittered 50–70 % into the current period (stable for
    /// a given lease and expiry, so reconciles agree), and never later than
    /// the margin before expiry.
    pub fn renew_at(&self) -> Timestamp {
        let start = self.expires - sd(self.ttl);
        let fraction = 0.5 + 0.2 * unit_hash(&self.id, self.expires.as_second());
        let planned = start + sd(self.ttl.mul_f64(fraction));
        planned.min(self.expires - sd(self.margin()))
    }
}

fn sd(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// A number in `[0, 1)` from a lease id and an instant.
fn unit_hash(id: &str, at: i64) -> f64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(id.as_bytes());
    ctx.update(&at.to_be_bytes());
    let d = ctx.finish();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_ref()[..8]);
    // 53 bits of mantissa.
    (u64::from_be_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// What to do with the lease now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Create a lease (the current one, if any, is retired).
    Create {
        /// Why, for the condition and the Event.
        reason: &'static str,
    },
    /// Renew the current lease.
    Renew,
    /// Nothing to do yet.
    Wait,
}

/// Decide. `holds_current` says whether the Secret holds the credentials of
/// the current lease; `max_ttl` is the dynamic secret's maximum lifetime.
pub fn decide(
    lease: Option<&LeaseView>,
    holds_current: bool,
    max_ttl: Option<Duration>,
    now: Timestamp,
) -> Decision {
    let Some(l) = lease else {
        return Decision::Create {
            reason: "no lease yet",
        };
    };
    if now + SignedDuration::from_secs(1) >= l.expires {
        return Decision::Create {
            reason: "the lease expired",
        };
    }
    if !holds_current {
        return Decision::Create {
            reason: "the Secret does not hold the lease's credentials",
        };
    }
    if let Some(max) = max_ttl
        && now >= l.created + sd(max) - sd(l.margin())
    {
        return Decision::Create {
            reason: "the lease reached its maximum lifetime",
        };
    }
    if now >= l.renew_at() {
        Decision::Renew
    } else {
        Decision::Wait
    }
}

/// When to look again: the renewal time, the replacement before the
/// maximum lifetime, or the revocation of a retired lease, whichever comes
/// first; at least a second from now, at most five minutes.
pub fn next_check(
    lease: Option<&LeaseView>,
    retired: &[RetiredLease],
    max_ttl: Option<Duration>,
    now: Timestamp,
) -> Timestamp {
    let mut next = now + SignedDuration::from_secs(300);
    if let Some(l) = lease {
        next = next.min(l.renew_at());
        if let Some(max) = max_ttl {
            next = next.min(l.created + sd(max) - sd(l.margin()));
        }
    }
    for r in retired {
        next = next.min(r.revoke_after.0);
    }
    next.max(now + SignedDuration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    fn lease(created: i64, expires: i64, ttl: u64) -> LeaseView {
        LeaseView {
            id: "lease-1".into(),
            created: ts(created),
            expires: ts(expires),
            ttl: Duration::from_secs(ttl),
        }
    }

    #[test]
    fn renewal_lands_between_half_and_seventy_percent() {
        for id in ["a", "b", "c", "d", "e", "f"] {
            let l = LeaseView {
                id: id.into(),
                ..lease(1000, 1000 + 3600, 3600)
            };
            let at = l.renew_at().as_second() - 1000;
            assert!((1800..=2520).contains(&at), "{id}: {at}");
        }
    }

    #[test]
    fn short_leases_renew_before_the_margin() {
        // TTL 60 s: margin = min(30, 20) = 20 s; 70 % would be 42 s, inside.
        let l = lease(0, 60, 60);
        assert!(l.renew_at() <= ts(40));
        assert!(l.renew_at() >= ts(30));
    }

    #[test]
    fn decisions() {
        let l = lease(0, 100, 100);
        assert_eq!(
            decide(None, false, None, ts(0)),
            Decision::Create {
                reason: "no lease yet"
            }
        );
        assert_eq!(decide(Some(&l), true, None, ts(10)), Decision::Wait);
        assert_eq!(decide(Some(&l), true, None, ts(75)), Decision::Renew);
        assert!(matches!(
            decide(Some(&l), true, None, ts(100)),
            Decision::Create { .. }
        ));
        assert!(matches!(
            decide(Some(&l), false, None, ts(10)),
            Decision::Create { .. }
        ));
        // Max TTL 120 s: replaced within the margin (30 s) of 120 s.
        assert_eq!(
            decide(Some(&l), true, Some(Duration::from_secs(120)), ts(60)),
            Decision::Wait
        );
        assert!(matches!(
            decide(Some(&l), true, Some(Duration::from_secs(120)), ts(95)),
            Decision::Create {
                reason: "the lease reached its maximum lifetime"
            }
        ));
    }

    #[test]
    fn renewed_leases_keep_their_period() {
        // After a renewal the expiry moved by one TTL: the next renewal is
        // one period later.
        let first = lease(0, 100, 100).renew_at().as_second();
        let second = lease(0, 200, 100).renew_at().as_second();
        assert!((second - first - 100).abs() <= 20, "{first} {second}");
    }

    #[test]
    fn next_check_is_the_earliest_event() {
        let l = lease(0, 100, 100);
        let retired = vec![RetiredLease {
            id: "old".into(),
            revoke_after: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(20)),
        }];
        assert_eq!(next_check(Some(&l), &retired, None, ts(10)), ts(20));
        assert_eq!(next_check(Some(&l), &[], None, ts(10)), l.renew_at());
        assert_eq!(next_check(None, &[], None, ts(10)), ts(310));
        assert_eq!(next_check(Some(&l), &retired, None, ts(30)), ts(31));
    }
}
