//! The data model handed to templates.
//!
//! Every secret key becomes a top-level variable holding a map with the two
//! fields of the Go operators, `Value` and `SecretPath`, so
//! `{{ DB_PASSWORD.Value }}` works. The variable `secrets` holds all of them
//! by key, for keys that are not identifiers (`{{ secrets["my-key"].Value }}`).
//! A secret named `secrets` is therefore reachable only as
//! `secrets["secrets"]`: the map of all secrets takes precedence.

use std::collections::BTreeMap;
use std::fmt;

use minijinja::Value;

/// The secrets a template can read, by secret key.
pub type SecretData = BTreeMap<String, SecretEntry>;

/// One secret as a template sees it: `KEY.Value` and `KEY.SecretPath`.
///
/// The value is raw bytes: secrets fetched from the KMS are text, but the
/// source Secret of a push may hold binary data (a keystore, for instance).
/// In a template, `Value` is a string when the bytes are valid UTF-8 and a
/// bytes value otherwise (which the PKCS#12 readers accept as is).
///
/// `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretEntry {
    /// The secret value.
    pub value: Vec<u8>,
    /// The folder the secret came from (`/`, `/db`, …).
    pub secret_path: String,
}

impl SecretEntry {
    /// A secret with its value and folder.
    pub fn new(value: impl Into<Vec<u8>>, secret_path: impl Into<String>) -> Self {
        SecretEntry {
            value: value.into(),
            secret_path: secret_path.into(),
        }
    }

    fn template_value(&self) -> Value {
        let value = match std::str::from_utf8(&self.value) {
            Ok(text) => Value::from(text),
            Err(_) => Value::from_bytes(self.value.clone()),
        };
        let mut map = BTreeMap::new();
        map.insert("Value", value);
        map.insert("SecretPath", Value::from(self.secret_path.as_str()));
        Value::from(map)
    }
}

impl fmt::Debug for SecretEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretEntry")
            .field(
                "value",
                &format_args!("<redacted, {} bytes>", self.value.len()),
            )
            .field("secret_path", &self.secret_path)
            .finish()
    }
}

/// Name of the variable that holds every secret by key.
pub(crate) const SECRETS_VAR: &str = "secrets";

/// Builds the root context of a render.
pub(crate) fn context(data: &SecretData) -> Value {
    let entries: BTreeMap<&str, Value> = data
        .iter()
        .map(|(key, entry)| (key.as_str(), entry.template_value()))
        .collect();
    let mut root = entries.clone();
    root.insert(SECRETS_VAR, Value::from(entries));
    Value::from(root)
}
