//! Rate limits like the real server's: fixed 60-second windows counted per
//! client and per route (method and route template), each route with the
//! limit of its category (`secrets`: every secret list, get and write;
//! `read`: other reads; `write`: other writes, logins included). A window
//! starts with the first request counted in it.
//!
//! The client is the first address of `X-Forwarded-For` when the request has
//! one (the real server trusts its proxy), else the peer's IP. As on the real
//! server, requests refused before the rate limit (a missing, malformed,
//! revoked or expired token, or a kind of token the route does not accept)
//! are neither counted nor given rate-limit headers, and `/api/status` and
//! unknown routes are not limited. Off by default; set by
//! `--rate-limit-per-minute` or `POST /admin/ratelimit`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Length of a window.
const WINDOW: Duration = Duration::from_secs(60);
/// Above this many windows, expired ones are dropped.
const PRUNE_ABOVE: usize = 10_000;
/// Highest limit accepted.
const MAX_LIMIT: u32 = 10_000_000;

/// The category of a route, which decides its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Category {
    /// Secret lists, gets and writes.
    Secrets,
    /// Other reads.
    Read,
    /// Other writes, logins included.
    Write,
    /// Not limited.
    Exempt,
}

/// Requests allowed per window, per category; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Limits {
    pub secrets: Option<u32>,
    pub read: Option<u32>,
    pub write: Option<u32>,
}

impl Limits {
    /// The same limit for every route.
    pub fn all(per_minute: u32) -> Limits {
        Limits {
            secrets: Some(per_minute),
            read: Some(per_minute),
            write: Some(per_minute),
        }
    }

    fn of(&self, category: Category) -> Option<u32> {
        match category {
            Category::Secrets => self.secrets,
            Category::Read => self.read,
            Category::Write => self.write,
            Category::Exempt => None,
        }
    }

    fn is_off(&self) -> bool {
        self.secrets.is_none() && self.read.is_none() && self.write.is_none()
    }
}

/// The body of `POST /admin/ratelimit`: `perMinute` for every category, and
/// any category on its own (which wins over `perMinute`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct LimitSpec {
    #[serde(default)]
    pub per_minute: Option<u32>,
    #[serde(default)]
    pub secrets: Option<u32>,
    #[serde(default)]
    pub read: Option<u32>,
    #[serde(default)]
    pub write: Option<u32>,
}

impl LimitSpec {
    /// The limits, or why they cannot be used.
    pub fn limits(&self) -> Result<Limits, String> {
        for (name, v) in [
            ("perMinute", self.per_minute),
            ("secrets", self.secrets),
            ("read", self.read),
            ("write", self.write),
        ] {
            if v.is_some_and(|v| v == 0 || v > MAX_LIMIT) {
                return Err(format!("{name} is between 1 and {MAX_LIMIT}"));
            }
        }
        Ok(Limits {
            secrets: self.secrets.or(self.per_minute),
            read: self.read.or(self.per_minute),
            write: self.write.or(self.per_minute),
        })
    }
}

/// The fate of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Served: the limit, what is left of it, seconds to the window's end.
    Allowed {
        limit: u32,
        remaining: u32,
        reset: u64,
    },
    /// Refused: the limit and seconds until the window ends.
    Limited { limit: u32, retry_after: u64 },
}

#[derive(Debug)]
struct Window {
    start: Instant,
    count: u32,
}

/// The limits in force and the windows.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    limits: Limits,
    windows: HashMap<(String, String), Window>,
}

impl Limiter {
    /// A limiter with these limits.
    pub fn new(limits: Limits) -> Limiter {
        Limiter {
            inner: Mutex::new(Inner {
                limits,
                windows: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replace the limits; every window starts again.
    pub fn set(&self, limits: Limits) {
        let mut inner = self.lock();
        inner.limits = limits;
        inner.windows.clear();
    }

    /// The limits in force (`None` when off).
    pub fn limits(&self) -> Option<Limits> {
        let inner = self.lock();
        (!inner.limits.is_off()).then_some(inner.limits)
    }

    /// Whether any limit is in force.
    pub fn enabled(&self) -> bool {
        !self.lock().limits.is_off()
    }

    /// Count a request of `client` to `route` at `now`; `None` when its
    /// category is not limited.
    pub fn check(
        &self,
        client: &str,
        route: &str,
        category: Category,
        now: Instant,
    ) -> Option<Verdict> {
        let mut inner = self.lock();
        let limit = inner.limits.of(category)?;
        if inner.windows.len() > PRUNE_ABOVE {
            inner
                .windows
                .retain(|_, w| now.duration_since(w.start) < WINDOW);
        }
        let window = inner
            .windows
            .entry((client.to_owned(), route.to_owned()))
            .or_insert(Window {
                start: now,
                count: 0,
            });
        if now.duration_since(window.start) >= WINDOW {
            window.start = now;
            window.count = 0;
        }
        let left = WINDOW.saturating_sub(now.duration_since(window.start));
        let reset = (left.as_secs() + u64::from(left.subsec_nanos() > 0)).max(1);
        if window.count >= limit {
            return Some(Verdict::Limited {
                limit,
                retry_after: reset,
            });
        }
        window.count += 1;
        Some(Verdict::Allowed {
            limit,
            remaining: limit - window.count,
            reset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_windows_per_client_and_route() {
        let limiter = Limiter::new(Limits {
            secrets: Some(2),
            read: None,
            write: Some(5),
        });
        let t0 = Instant::now();
        let list = "GET /api/v3/secrets/raw";
        assert_eq!(
            limiter.check("a", list, Category::Secrets, t0),
            Some(Verdict::Allowed {
                limit: 2,
                remaining: 1,
                reset: 60
            })
        );
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(
            limiter.check("a", list, Category::Secrets, later),
            Some(Verdict::Allowed {
                limit: 2,
                remaining: 0,
                reset: 59
            })
        );
        assert_eq!(
            limiter.check("a", list, Category::Secrets, later),
            Some(Verdict::Limited {
                limit: 2,
                retry_after: 59
            })
        );
        // Another client, another route: their own windows.
        assert!(matches!(
            limiter.check("b", list, Category::Secrets, later),
            Some(Verdict::Allowed { remaining: 1, .. })
        ));
        assert!(matches!(
            limiter.check(
                "a",
                "GET /api/v3/secrets/raw/:secretName",
                Category::Secrets,
                later
            ),
            Some(Verdict::Allowed { remaining: 1, .. })
        ));
        // Unlimited category.
        assert_eq!(
            limiter.check("a", "GET /api/v2/workspace/:slug", Category::Read, later),
            None
        );
        // The window ends 60 s after its first request.
        assert!(matches!(
            limiter.check("a", list, Category::Secrets, t0 + WINDOW),
            Some(Verdict::Allowed {
                remaining: 1,
                reset: 60,
                ..
            })
        ));
        limiter.set(Limits::default());
        assert!(!limiter.enabled());
        assert_eq!(limiter.limits(), None);
    }

    #[test]
    fn specs() {
        let spec = LimitSpec {
            per_minute: Some(10),
            secrets: Some(40),
            ..LimitSpec::default()
        };
        assert_eq!(
            spec.limits(),
            Ok(Limits {
                secrets: Some(40),
                read: Some(10),
                write: Some(10)
            })
        );
        let zero = LimitSpec {
            read: Some(0),
            ..LimitSpec::default()
        };
        assert!(zero.limits().is_err());
        assert_eq!(LimitSpec::default().limits(), Ok(Limits::default()));
    }
}
