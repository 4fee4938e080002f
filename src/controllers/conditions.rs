//! Setting status conditions: `lastTransitionTime` moves only when the
//! status flips, every condition carries `observedGeneration`, and comparing
//! two condition lists ignores timestamps. An Event is due when `Ready`
//! changes its status, reason or cause ([`ready_changed`]), not at every resync
//! and not for a first success.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Good.
    True,
    /// Bad.
    False,
    /// Not known.
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// The reason of a resource that waits for the KMS's budget (a `429`).
const WAITING_FOR_BUDGET: &str = "KMSRateLimited";

/// Reasons of failures that pass by themselves, whose messages change from
/// one attempt to the next (a rate limit's wait, a connection's error): a
/// new message of theirs is no new cause.
const PASSING_REASONS: [&str; 4] = [
    "KMSRateLimited",
    "KMSUnavailable",
    "KMSUnreachable",
    "FolderCheckFailed",
];

/// The `Ready` condition of `new` when its status or reason differs from
/// the one in `old`, or, while it is not `True`, its message (a new cause
/// of the same reason: another missing folder); or when it appeared not
/// `True`: what an Event announces. A first successful sync has no Event
/// (the status says it, and at scale one Event per resource doubles the API
/// writes); a first failure, a recovery and every later change have one.
pub fn ready_changed<'a>(old: &[Condition], new: &'a [Condition]) -> Option<&'a Condition> {
    let key = |c: Option<&Condition>| {
        c.map(|c| {
            let cause = (c.status != Status::True.as_str()
                && !PASSING_REASONS.contains(&c.reason.as_str()))
            .then(|| c.message.clone());
            (c.status.clone(), c.reason.clone(), cause)
        })
    };
    let before = get(old, crate::api::conditions::READY);
    let after = get(new, crate::api::conditions::READY)?;
    if before.is_none() && after.status == Status::True.as_str() {
        return None;
    }
    // Waiting for the KMS's budget is no failure: no Warning for it (one a
    // resource, when a hosted KMS's limit binds), and the recovery from it
    // is no news either.
    if after.reason == WAITING_FOR_BUDGET
        || (before.is_some_and(|b| b.reason == WAITING_FOR_BUDGET)
            && after.status == Status::True.as_str())
    {
        return None;
    }
    (key(before) != key(Some(after))).then_some(after)
}

/// `Endpoint` true: where the endpoint's host and CA came from (the three
/// kinds say it the same way).
pub fn endpoint_resolved(
    conditions: &mut Vec<Condition>,
    source: &str,
    generation: Option<i64>,
    now: &Time,
) {
    set(
        conditions,
        crate::api::conditions::ENDPOINT,
        Status::True,
        "Resolved",
        &bounded(source),
        generation,
        now,
    );
}

/// A login that worked, in the condition `type_` of the kind
/// (`LoadedKmsToken` or `Authenticated`).
pub fn logged_in(
    conditions: &mut Vec<Condition>,
    type_: &str,
    strategy: &str,
    generation: Option<i64>,
    now: &Time,
) {
    set(
        conditions,
        type_,
        Status::True,
        "OK",
        &format!("Logged in to the KMS using the {strategy} authentication strategy"),
        generation,
        now,
    );
}

/// Set (or add) the condition `type_` in `conditions`.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = status.as_str();
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = now.clone();
        }
        c.status = status.to_owned();
        c.reason = reason.to_owned();
        c.message = message.to_owned();
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation: generation,
            last_transition_time: now.clone(),
        });
    }
}

/// The condition `type_`, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `Ready` is `True` for `generation` (the current spec synced).
pub fn ready_for(conditions: &[Condition], generation: Option<i64>) -> bool {
    get(conditions, crate::api::conditions::READY)
        .is_some_and(|r| r.status == "True" && r.observed_generation == generation)
}

/// Whether two condition lists say the same, ignoring transition times and
/// order.
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                x.type_ == y.type_
                    && x.status == y.status
                    && x.reason == y.reason
                    && x.message == y.message
                    && x.observed_generation == y.observed_generation
            })
        })
}

/// A condition message kept within the API's 32 KiB limit (and readable).
pub fn bounded(message: &str) -> String {
    const MAX: usize = 1024;
    if message.len() <= MAX {
        return message.to_owned();
    }
    let mut end = MAX;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Add `note` to the message of the condition `type_`, if it is there.
pub fn append_note(conditions: &mut [Condition], type_: &str, note: &str) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        c.message = bounded(&format!("{}; {note}", c.message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set the Ready condition at generation `generation`, at `t(at)`.
    fn ready(
        c: &mut Vec<Condition>,
        status: Status,
        reason: &str,
        message: &str,
        generation: i64,
        at: i64,
    ) {
        set(
            c,
            "Ready",
            status,
            reason,
            message,
            Some(generation),
            &t(at),
        );
    }

    #[test]
    fn an_event_is_due_when_ready_changes_status_reason_or_cause() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let with = |status, reason: &str, message: &str| {
            let mut c = Vec::new();
            set(&mut c, "Ready", status, reason, message, Some(1), &now);
            c
        };
        let synced = with(Status::True, "Synced", "Synced 3 secrets");
        // A first success: the status says it, no Event.
        assert!(ready_changed(&[], &synced).is_none());
        // A resync that only changed the message: no Event.
        assert!(
            ready_changed(&synced, &with(Status::True, "Synced", "Synced 4 secrets")).is_none()
        );
        let failed = with(Status::False, "KmsUnavailable", "the KMS answered 503");
        assert_eq!(
            ready_changed(&synced, &failed).map(|c| c.status.as_str()),
            Some("False")
        );
        assert!(ready_changed(&failed, &with(Status::False, "Forbidden", "403")).is_some());
        // A new cause of the same reason has one; a passing failure's new
        // wording does not.
        let missing = with(Status::False, "FolderNotFound", "folder /a does not exist");
        assert!(ready_changed(&missing, &missing).is_none());
        assert!(
            ready_changed(
                &missing,
                &with(Status::False, "FolderNotFound", "folder /b does not exist")
            )
            .is_some()
        );
        let limited = |s: &str| with(Status::False, "KMSRateLimited", s);
        assert!(ready_changed(&limited("wait 3s"), &limited("wait 5s")).is_none());
        // Waiting for the budget, and its end, are no news.
        assert!(ready_changed(&[], &limited("wait")).is_none());
        assert!(ready_changed(&synced, &limited("wait")).is_none());
        assert!(ready_changed(&limited("wait"), &synced).is_none());
        assert!(ready_changed(&synced, &[]).is_none());
        // A first failure and a recovery have one.
        assert!(ready_changed(&[], &failed).is_some());
        assert_eq!(
            ready_changed(&failed, &synced).map(|c| c.reason.as_str()),
            Some("Synced")
        );
    }

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_flips() {
        let mut c = Vec::new();
        ready(&mut c, Status::True, "Synced", "ok", 1, 10);
        ready(&mut c, Status::True, "Synced", "still ok", 2, 20);
        assert_eq!(c[0].last_transition_time, t(10));
        assert_eq!(c[0].observed_generation, Some(2));
        ready(&mut c, Status::False, "KMSUnavailable", "down", 2, 30);
        assert_eq!(c[0].last_transition_time, t(30));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn comparison_ignores_times() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        ready(&mut a, Status::True, "Synced", "ok", 1, 10);
        ready(&mut b, Status::True, "Synced", "ok", 1, 99);
        assert!(same(&a, &b));
        set(&mut b, "X", Status::True, "r", "m", Some(1), &t(99));
        assert!(!same(&a, &b));
    }

    #[test]
    fn long_messages_are_cut() {
        let m = "é".repeat(2000);
        let b = bounded(&m);
        assert!(b.len() <= 1024 + 3);
    }
}
