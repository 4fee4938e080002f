//! "Sync this now": a new value of the annotation
//! `secrets.hanzo.ai/force-sync` on a KmsSecret, KmsPushSecret or
//! KmsDynamicSecret queues it in the lane of changes and makes its next sync
//! a full one (no not-due check, no conditional request; a dynamic secret's
//! lease is renewed). The status records the value once its sync has run,
//! so a GitOps tool that applies the same value again asks for nothing. A
//! sync the KMS holds back (its 429 pause) leaves the value pending, and the
//! condition says that the forced sync waits for the KMS.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The annotation that asks for a sync now (any new value).
pub const ANNOTATION: &str = "secrets.hanzo.ai/force-sync";

pub use crate::api::kinds::Forceable;

/// The force-sync value not handled yet, if any (an empty value asks for
/// nothing).
pub fn pending<K: Forceable>(o: &K) -> Option<&str> {
    let asked = o.meta().annotations.as_ref()?.get(ANNOTATION)?.as_str();
    (!asked.is_empty() && Some(asked) != o.handled()).then_some(asked)
}

/// What `status.forceSync` holds after a sync of `o`: the pending value once
/// its sync ran (succeeded or failed), unless the KMS held the sync back
/// (`throttled`); else what it held.
pub fn after_sync<K: Forceable>(o: &K, throttled: bool) -> Option<String> {
    match pending(o) {
        Some(v) if !throttled => Some(v.to_owned()),
        _ => o.handled().map(str::to_owned),
    }
}

/// `status.forceSync` after a sync of `o` ([`after_sync`]), with a note on
/// the condition `type_` while the KMS's budget holds the forced sync back.
pub fn settle<K: Forceable>(
    o: &K,
    throttled: bool,
    conditions: &mut [Condition],
    type_: &str,
) -> Option<String> {
    if let (true, Some(value)) = (throttled, pending(o)) {
        crate::controllers::conditions::append_note(conditions, type_, &waiting(value));
    }
    after_sync(o, throttled)
}

/// The note a condition carries while a forced sync waits for the KMS.
pub fn waiting(value: &str) -> String {
    format!("the forced sync ({ANNOTATION}: {value}) runs once the KMS takes requests again")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KmsSecret;

    fn secret(asked: Option<&str>, handled: Option<&str>) -> KmsSecret {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": "a", "namespace": "n",
                         "annotations": asked.map(|v| serde_json::json!({ANNOTATION: v}))},
            "spec": {},
            "status": {"forceSync": handled}
        }))
        .unwrap()
    }

    #[test]
    fn a_value_is_pending_until_the_status_records_it() {
        assert_eq!(pending(&secret(Some("1"), None)), Some("1"));
        assert_eq!(pending(&secret(Some("2"), Some("1"))), Some("2"));
        assert_eq!(pending(&secret(Some("1"), Some("1"))), None);
        assert_eq!(pending(&secret(Some(""), None)), None);
        assert_eq!(pending(&secret(None, Some("1"))), None);
    }

    #[test]
    fn a_throttled_sync_leaves_the_value_pending() {
        let o = secret(Some("2"), Some("1"));
        assert_eq!(after_sync(&o, false).as_deref(), Some("2"));
        assert_eq!(after_sync(&o, true).as_deref(), Some("1"));
        assert_eq!(after_sync(&secret(None, None), false), None);
    }
}
