//! The invariant checkers. Each is pure: it takes what the runner recorded
//! (see [`crate::history`]) and returns an [`Outcome`], so each can be fed
//! a hand-made history in a unit test — a good one that must pass and a bad
//! one that must fail.
//!
//! * [`exclusive`]: one holder per shard at a time, and no write by a
//!   replica outside its term;
//! * [`data`]: no managed Secret emptied or deleted; convergence to the KMS
//!   after the faults;
//! * [`leases`]: every active KMS lease recorded by exactly one resource,
//!   orphans never renewed, none left after deletion;
//! * [`coverage`]: no shard without an owner for longer than the bound;
//! * [`budget`]: the KMS request rate within the configured budget.

use serde::Serialize;

use crate::history::Ms;

pub mod budget;
pub mod coverage;
pub mod data;
pub mod exclusive;
pub mod leases;
pub mod terms;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Violation {
    /// When it happened (wall clock, ms), if it has a time.
    pub at: Option<Ms>,
    /// What happened.
    pub message: String,
}

impl Violation {
    /// A violation at `at`.
    pub fn at(at: Ms, message: impl Into<String>) -> Self {
        Self {
            at: Some(at),
            message: message.into(),
        }
    }

    /// A violation without a time.
    pub fn timeless(message: impl Into<String>) -> Self {
        Self {
            at: None,
            message: message.into(),
        }
    }
}

/// What a checker found.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Checker name.
    pub name: &'static str,
    /// The rule it enforces, with its tolerance.
    pub rule: String,
    /// Broken invariants (empty: passed).
    pub violations: Vec<Violation>,
    /// Figures worth reporting (counts, maxima, tolerances).
    pub stats: serde_json::Map<String, serde_json::Value>,
}

impl Outcome {
    /// An outcome with no violation yet.
    pub fn new(name: &'static str, rule: impl Into<String>) -> Self {
        Self {
            name,
            rule: rule.into(),
            violations: Vec::new(),
            stats: serde_json::Map::new(),
        }
    }

    /// Whether the invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Record a figure.
    pub fn stat(&mut self, key: &str, value: impl Serialize) {
        self.stats.insert(
            key.to_owned(),
            serde_json::to_value(value).unwrap_or(serde_json::Value::Null),
        );
    }
}
