//! Fault injection for the chaos suite and for tests: per route template or
//! for all routes, an outage (503), dropped connections, added latency, a
//! rate of errors with a chosen status (reproducible with a seed), and a
//! per-minute rate limit answered with the real server's 429.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::errors::ApiError;
use crate::ids::random_u64;

/// Longest latency that can be injected.
const MAX_LATENCY_MS: u64 = 600_000;
/// Length of a rate-limit window.
const WINDOW: Duration = Duration::from_secs(60);

/// The faults of one scope, as the admin API takes and shows them.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FaultSpec {
    /// `METHOD /route/template`; absent for all routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Answer 503.
    #[serde(default, skip_serializing_if = "is_false")]
    pub outage: bool,
    /// Close the connection without an answer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drop_connections: bool,
    /// Delay every answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Fraction (0 to 1) of requests answered with `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    /// Status of the errors of `errorRate` (default 503).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// With `status: 429`: the `Retry-After` of those answers, in seconds
    /// (absent: none, as some servers answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Requests allowed per minute; more are answered 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_per_minute: Option<u32>,
    /// Seed of the generator deciding which requests fail under `errorRate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl FaultSpec {
    /// Check values; `known_routes` are the route templates of the API.
    pub fn check(&self, known_routes: &[&str]) -> Result<(), String> {
        if let Some(route) = &self.route
            && !known_routes.contains(&route.as_str())
        {
            return Err(format!(
                "unknown route {route:?}; routes are: {}",
                known_routes.join(", ")
            ));
        }
        if self.latency_ms.is_some_and(|ms| ms > MAX_LATENCY_MS) {
            return Err(format!("latencyMs is at most {MAX_LATENCY_MS}"));
        }
        if let Some(rate) = self.error_rate
            && !(0.0..=1.0).contains(&rate)
        {
            return Err("errorRate is between 0 and 1".into());
        }
        if let Some(status) = self.status
            && !(400..=599).contains(&status)
        {
            return Err("status is an error status (400 to 599)".into());
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        !self.outage
            && !self.drop_connections
            && self.latency_ms.unwrap_or(0) == 0
            && self.error_rate.unwrap_or(0.0) == 0.0
            && self.rate_limit_per_minute.is_none()
    }
}

/// A scope's faults and the state they need.
#[derive(Debug)]
struct Scope {
    spec: FaultSpec,
    rng: u64,
    window_start: Instant,
    window_count: u32,
}

/// What to do with a request.
#[derive(Debug, Default)]
pub(crate) struct Decision {
    /// Wait this long first.
    pub latency: Duration,
    /// Then do this.
    pub action: Action,
    /// Rate-limit headers for a request let through: limit, remaining,
    /// seconds to the window's end.
    pub rate_headers: Option<(u32, u32, u64)>,
}

/// The fate of a request.
#[derive(Debug, Default)]
pub(crate) enum Action {
    /// Serve it.
    #[default]
    Pass,
    /// Close the connection without an answer.
    Drop,
    /// Answer with this error.
    Fail(ApiError),
}

/// The faults in force.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    scopes: Mutex<BTreeMap<Option<String>, Scope>>,
}

/// SplitMix64: small, fast and good enough to pick failing requests.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Option<String>, Scope>> {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replace the faults of the spec's scope (an empty spec clears it).
    pub fn set(&self, spec: FaultSpec) {
        let mut scopes = self.lock();
        let key = spec.route.clone();
        if spec.is_empty() {
            scopes.remove(&key);
            return;
        }
        let rng = spec.seed.unwrap_or_else(random_u64);
        scopes.insert(
            key,
            Scope {
                spec,
                rng,
                window_start: Instant::now(),
                window_count: 0,
            },
        );
    }

    /// Remove every fault.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The faults in force, all-routes scope first.
    pub fn list(&self) -> Vec<FaultSpec> {
        self.lock().values().map(|s| s.spec.clone()).collect()
    }

    /// Decide the fate of a request to `route` (both its route's scope and
    /// the all-routes scope apply; latencies add up).
    pub fn decide(&self, route: &str) -> Decision {
        let mut scopes = self.lock();
        if scopes.is_empty() {
            return Decision::default();
        }
        let keys = [None, Some(route.to_owned())];
        let mut d = Decision::default();
        let mut drop = false;
        let mut outage = false;
        for key in &keys {
            if let Some(s) = scopes.get(key) {
                d.latency += Duration::from_millis(s.spec.latency_ms.unwrap_or(0));
                drop |= s.spec.drop_connections;
                outage |= s.spec.outage;
            }
        }
        if drop {
            d.action = Action::Drop;
            return d;
        }
        if outage {
            d.action = Action::Fail(ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE));
            return d;
        }
        let now = Instant::now();
        for key in &keys {
            let Some(s) = scopes.get_mut(key) else {
                continue;
            };
            let Some(limit) = s.spec.rate_limit_per_minute else {
                continue;
            };
            if now.duration_since(s.window_start) >= WINDOW {
                s.window_start = now;
                s.window_count = 0;
            }
            let left = WINDOW.saturating_sub(now.duration_since(s.window_start));
            let reset = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            if s.window_count >= limit {
                d.action = Action::Fail(ApiError::rate_limited(limit, reset.max(1)));
                return d;
            }
            s.window_count += 1;
            let remaining = limit - s.window_count;
            if d.rate_headers.is_none_or(|(_, r, _)| remaining < r) {
                d.rate_headers = Some((limit, remaining, reset));
            }
        }
        for key in &keys {
            let Some(s) = scopes.get_mut(key) else {
                continue;
            };
            let Some(rate) = s.spec.error_rate else {
                continue;
            };
            // 53 random bits as a fraction in [0, 1).
            let draw = (next(&mut s.rng) >> 11) as f64 / (1u64 << 53) as f64;
            if draw < rate && matches!(d.action, Action::Pass) {
                let status = StatusCode::from_u16(s.spec.status.unwrap_or(503))
                    .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                d.action = Action::Fail(match s.spec.retry_after_seconds {
                    Some(after) if status == StatusCode::TOO_MANY_REQUESTS => {
                        ApiError::rate_limited(0, after)
                    }
                    _ => ApiError::with_status(status),
                });
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(f: &Faults, n: usize) -> Vec<bool> {
        (0..n)
            .map(|_| matches!(f.decide("GET /x").action, Action::Fail(_)))
            .collect()
    }

    #[test]
    fn error_rate_is_reproducible_with_a_seed() {
        let f = Faults::default();
        let spec = FaultSpec {
            error_rate: Some(0.5),
            seed: Some(42),
            ..FaultSpec::default()
        };
        f.set(spec.clone());
        let first = pattern(&f, 64);
        f.set(spec);
        assert_eq!(first, pattern(&f, 64));
        let failures = first.iter().filter(|b| **b).count();
        assert!((16..=48).contains(&failures), "{failures}");
    }

    #[test]
    fn scopes_and_rate_limits() {
        let f = Faults::default();
        f.set(FaultSpec {
            route: Some("GET /x".into()),
            rate_limit_per_minute: Some(2),
            latency_ms: Some(5),
            ..FaultSpec::default()
        });
        f.set(FaultSpec {
            latency_ms: Some(7),
            ..FaultSpec::default()
        });
        let d = f.decide("GET /x");
        assert_eq!(d.latency, Duration::from_millis(12));
        assert_eq!(d.rate_headers.map(|h| (h.0, h.1)), Some((2, 1)));
        assert!(matches!(f.decide("GET /x").action, Action::Pass));
        match f.decide("GET /x").action {
            Action::Fail(e) => assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS),
            other => panic!("{other:?}"),
        }
        assert!(matches!(f.decide("GET /y").action, Action::Pass));
        assert_eq!(f.decide("GET /y").latency, Duration::from_millis(7));
        f.set(FaultSpec::default());
        assert_eq!(f.list().len(), 1);
        f.clear();
        assert!(f.list().is_empty());
    }

    #[test]
    fn checks() {
        let routes = ["GET /x"];
        let bad = [
            FaultSpec {
                route: Some("GET /nope".into()),
                ..FaultSpec::default()
            },
            FaultSpec {
                error_rate: Some(1.5),
                ..FaultSpec::default()
            },
            FaultSpec {
                status: Some(200),
                ..FaultSpec::default()
            },
            FaultSpec {
                latency_ms: Some(MAX_LATENCY_MS + 1),
                ..FaultSpec::default()
            },
        ];
        for spec in bad {
            assert!(spec.check(&routes).is_err(), "{spec:?}");
        }
        assert!(
            FaultSpec {
                route: Some("GET /x".into()),
                outage: true,
                ..FaultSpec::default()
            }
            .check(&routes)
            .is_ok()
        );
    }
}
