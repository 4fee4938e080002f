//! The dev server: an embedded KMS that speaks the Infisical HTTP API
//! (`kms-operator dev-server`). Lands with the dev-server issue.
