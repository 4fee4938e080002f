//! Checker 2 — nothing lost (`docs/chaos.md`, checker 2).
//!
//! *During the run*: the Secret watcher records every state of every
//! managed Secret (label `secrets.hanzo.ai/managed=true`). A deletion, or a
//! state with no data, is a violation unless the runner itself deleted the
//! resource that owns the Secret before that moment (the end of the run
//! deletes the KmsDynamicSecrets, whose cleanup clears their Secrets).
//!
//! *After the faults*: the runner polls every managed object against the
//! KMS until all agree. Each poll is a [`Poll`]; the run converges at the
//! first poll without a mismatch, which must come within the bound.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checkers::{Outcome, Violation};
use crate::history::{Excuse, Ms, SecretObs};

/// Check the recorded Secret states.
pub fn check_secrets(secrets: &[SecretObs], excuses: &[Excuse]) -> Outcome {
    let mut out = Outcome::new(
        "data",
        "no managed Secret emptied or deleted unless the runner deleted its owner first; after \
         the faults every object equals the KMS within the bound",
    );
    let mut owners: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
    let mut excused = 0usize;
    let mut objects = std::collections::BTreeSet::new();
    for s in secrets {
        let key = (s.namespace.clone(), s.name.clone());
        objects.insert(key.clone());
        let owner = s
            .owner
            .clone()
            .or_else(|| owners.get(&key).cloned().flatten());
        if s.owner.is_some() {
            owners.insert(key.clone(), s.owner.clone());
        }
        let bad = if s.deleted {
            Some("deleted")
        } else if s.keys == 0 {
            Some("emptied")
        } else {
            None
        };
        let Some(what) = bad else { continue };
        let excuse = owner
            .as_deref()
            .is_some_and(|o| excuses.iter().any(|e| e.owner == o && e.at <= s.at));
        if excuse {
            excused += 1;
            continue;
        }
        out.violations.push(Violation::at(
            s.at,
            format!(
                "managed Secret {}/{} {what} (owner {})",
                s.namespace,
                s.name,
                owner.as_deref().unwrap_or("unknown")
            ),
        ));
    }
    out.stat("secret_states_seen", secrets.len());
    out.stat("secrets_seen", objects.len());
    out.stat("cleared_after_owner_deleted", excused);
    out
}

/// One convergence poll: the objects that did not match the KMS yet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Poll {
    /// When.
    pub at: Ms,
    /// Objects checked.
    pub checked: usize,
    /// `object: why` for each mismatch.
    pub mismatched: Vec<String>,
}

/// Check convergence: from `since` (the faults stopped), a poll without
/// mismatches must come within `bound` ms. Returns the time it took.
pub fn check_convergence(polls: &[Poll], since: Ms, bound: Ms, out: &mut Outcome) -> Option<Ms> {
    let done = polls
        .iter()
        .find(|p| p.at >= since && p.mismatched.is_empty() && p.checked > 0)
        .map(|p| p.at - since);
    out.stat("convergence_bound_ms", bound);
    out.stat("convergence_ms", done);
    match done {
        Some(t) if t <= bound => {}
        Some(t) => out.violations.push(Violation::at(
            since + t,
            format!(
                "objects matched the KMS only {t} ms after the faults stopped (bound {bound} ms)"
            ),
        )),
        None => {
            let last = polls.iter().rev().find(|p| p.at >= since);
            let what = last
                .map(|p| {
                    let mut m = p.mismatched.clone();
                    let more = m.len().saturating_sub(10);
                    m.truncate(10);
                    format!(
                        "{} of {} objects still differ: {}{}",
                        p.mismatched.len(),
                        p.checked,
                        m.join("; "),
                        if more > 0 {
                            format!("; and {more} more")
                        } else {
                            String::new()
                        }
                    )
                })
                .unwrap_or_else(|| "no poll was made".to_owned());
            out.violations.push(Violation::at(
                since + bound,
                format!("no convergence within {bound} ms after the faults stopped: {what}"),
            ));
        }
    }
    done
}

/// Compare wanted and actual key/value maps of one object; `None` when
/// they agree, else why not.
pub fn diff(
    wanted: &BTreeMap<String, String>,
    actual: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let Some(actual) = actual else {
        return Some("missing".to_owned());
    };
    let mut why = Vec::new();
    for (k, v) in wanted {
        match actual.get(k) {
            None => why.push(format!("{k} missing")),
            Some(a) if a != v => why.push(format!("{k} stale")),
            _ => {}
        }
    }
    for k in actual.keys() {
        if !wanted.contains_key(k) {
            why.push(format!("{k} unexpected"));
        }
    }
    (!why.is_empty()).then(|| why.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(at: Ms, name: &str, keys: usize, deleted: bool) -> SecretObs {
        SecretObs {
            at,
            namespace: "ns".into(),
            name: name.into(),
            owner: Some(format!("KmsSecret/ns/{name}")),
            keys,
            deleted,
        }
    }

    #[test]
    fn changes_with_data_pass() {
        let h = [
            state(1, "a", 3, false),
            state(2, "a", 4, false),
            state(3, "b", 1, false),
        ];
        let o = check_secrets(&h, &[]);
        assert!(o.passed(), "{:?}", o.violations);
        assert_eq!(o.stats["secrets_seen"], 2);
    }

    #[test]
    fn an_emptied_or_deleted_secret_fails() {
        let h = [state(1, "a", 3, false), state(2, "a", 0, false)];
        let o = check_secrets(&h, &[]);
        assert_eq!(o.violations.len(), 1);
        assert!(o.violations[0].message.contains("emptied"));
        let mut gone = state(5, "b", 0, true);
        gone.owner = None;
        let o = check_secrets(&[state(1, "b", 2, false), gone], &[]);
        assert_eq!(o.violations.len(), 1);
        assert!(o.violations[0].message.contains("KmsSecret/ns/b"));
    }

    #[test]
    fn clearing_after_the_runner_deleted_the_owner_is_fine_but_not_before() {
        let h = [state(1, "a", 3, false), state(10, "a", 0, false)];
        let excuse = Excuse {
            at: 8,
            owner: "KmsSecret/ns/a".into(),
        };
        assert!(check_secrets(&h, std::slice::from_ref(&excuse)).passed());
        let late = Excuse { at: 12, ..excuse };
        assert!(!check_secrets(&h, &[late]).passed());
    }

    #[test]
    fn convergence_must_come_within_the_bound() {
        let poll = |at, m: &[&str]| Poll {
            at,
            checked: 5,
            mismatched: m.iter().map(|s| (*s).to_owned()).collect(),
        };
        let polls = [poll(100, &["x: stale"]), poll(200, &[]), poll(300, &[])];
        let mut o = Outcome::new("data", "");
        assert_eq!(check_convergence(&polls, 50, 1000, &mut o), Some(150));
        assert!(o.passed());
        let mut o = Outcome::new("data", "");
        check_convergence(&polls, 50, 100, &mut o);
        assert!(!o.passed());
        let mut o = Outcome::new("data", "");
        assert_eq!(check_convergence(&polls[..1], 50, 1000, &mut o), None);
        assert!(o.violations[0].message.contains("x: stale"));
    }

    #[test]
    fn diff_names_what_differs() {
        let w: BTreeMap<String, String> =
            [("A".into(), "1".into()), ("B".into(), "2".into())].into();
        assert_eq!(diff(&w, Some(&w)), None);
        let a: BTreeMap<String, String> =
            [("A".into(), "0".into()), ("C".into(), "3".into())].into();
        assert_eq!(
            diff(&w, Some(&a)).unwrap(),
            "A stale, B missing, C unexpected"
        );
        assert_eq!(diff(&w, None).unwrap(), "missing");
    }
}
