//! The key of a namespaced object, as queues, indexes and streams hold it.

use std::sync::Arc;

/// A namespaced object's key. Its parts are shared, not copied, by its
/// clones: the work queue alone holds each key three times, and a resync
/// clones it a few times more.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl ObjectKey {
    /// A key.
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            namespace: namespace.as_ref().into(),
            name: name.as_ref().into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
