//! The template engine of kms-operator.
//!
//! Users shape the data of managed Secrets and ConfigMaps with templates
//! (`template.data` of a target): each entry is a small [minijinja] template
//! rendered on its own against the fetched secrets. This crate is pure logic:
//! no I/O, no clock, no randomness, so the same inputs always render the same
//! bytes and a resync never changes a Secret for nothing.
//!
//! ```
//! use kms_template::{Engine, Limits, SecretData, SecretEntry};
//!
//! let engine = Engine::new(Limits::default());
//! let mut data = SecretData::new();
//! data.insert("DB_PASSWORD".into(), SecretEntry::new("s3cret", "/app"));
//! let out = engine
//!     .render("template.data.DSN", "postgres://app:{{ DB_PASSWORD.Value }}@db/app", &data)
//!     .unwrap();
//! assert_eq!(out, "postgres://app:s3cret@db/app");
//! ```
//!
//! A template in Go `text/template` syntax, as written for the Go
//! operators, renders with Go's semantics (Sprig functions included):
//!
//! ```
//! # use kms_template::{Engine, Limits, SecretData, SecretEntry};
//! # let engine = Engine::new(Limits::default());
//! # let mut data = SecretData::new();
//! # data.insert("DB_PASSWORD".into(), SecretEntry::new("s3cret", "/app"));
//! let out = engine
//!     .render("template.data.DSN", "{{ .DB_PASSWORD.Value | b64enc | quote }}", &data)
//!     .unwrap();
//! assert_eq!(out, "\"czNjcmV0\"");
//! ```
//!
//! The renders of one resource (every entry of every target) share a
//! [`Budget`]: together they may do no more work than
//! [`Limits::resource_fuel`], and a [`Canceller`] stops them when the
//! caller's deadline passes.
//!
//! ```
//! # use kms_template::{Engine, ErrorKind, Limits, SecretData, SecretEntry};
//! # let engine = Engine::new(Limits::default());
//! # let mut data = SecretData::new();
//! # data.insert("DB_PASSWORD".into(), SecretEntry::new("s3cret", "/app"));
//! let mut budget = engine.budget();
//! let canceller = budget.canceller(); // for a watchdog thread
//! for (field, source) in [("data.a", "{{ DB_PASSWORD.Value }}"), ("data.b", "{{ .DB_PASSWORD.Value | upper }}")] {
//!     engine.render_in(field, source, &data, &mut budget).unwrap();
//! }
//! assert!(budget.used() > 0);
//! canceller.cancel();
//! let e = engine.render_in("data.c", "x", &data, &mut budget).unwrap_err();
//! assert_eq!(e.kind, ErrorKind::Cancelled);
//! ```
//!
//! Modules:
//!
//! - `engine`: the [`Engine`] (environment, limits, rendering, error mapping);
//! - `data`: the data model handed to templates ([`SecretData`]);
//! - `error`: [`TemplateError`] and its [`ErrorKind`];
//! - `args`: argument handling shared by every helper (function and filter
//!   forms, undefined values, helper errors that never echo their input);
//! - `strings`, `collections`, `encoding`: the Sprig-style helpers;
//! - `pemutil`, `keys`, `pkcs12`, `jwk`: the certificate and key helpers;
//!   `keystore`: the PKCS#12 reader (key derivations capped and charged);
//! - `budget`: the [`Budget`] of a resource's renders and its [`Canceller`];
//!   `cost`: what the helpers' work costs in fuel;
//! - `gotemplate`: the engine for templates in Go `text/template` syntax
//!   (the syntax of the Go operators), chosen per template by its syntax.
//!
//! The template language, every helper and the limits are described for
//! users in `docs/templating.md`.

mod args;
mod budget;
mod collections;
mod cost;
mod data;
mod encoding;
mod engine;
mod error;
#[cfg(test)]
mod fuzz;
mod gotemplate;
mod jwk;
mod keys;
mod keystore;
mod pemutil;
mod pkcs12;
mod strings;

pub use budget::{Budget, Canceller};
pub use data::{SecretData, SecretEntry};
pub use engine::{Engine, Limits};
pub use error::{ErrorKind, TemplateError};

/// Sprig functions a template in Go syntax cannot call, sorted: those whose
/// output is not deterministic (`randAlphaNum`, `uuidv4`, `now`, …), those
/// that read the environment or the network (`env`, `expandenv`,
/// `getHostByName`), and those not implemented (listed in
/// `docs/templating.md`). Each is refused when the template is parsed.
pub fn go_refused_functions() -> Vec<&'static str> {
    gotemplate::refused()
}

/// Names of every function a template in Go syntax can call (Go's
/// builtins, the Sprig functions, the operator's helpers), sorted.
pub fn go_function_names() -> Vec<&'static str> {
    gotemplate::names()
}

/// Names of every helper function the engine registers (each also exists as a
/// filter where the piped value becomes the last argument), sorted.
pub fn helper_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = engine::HELPERS.iter().map(|(n, _)| *n).collect();
    names.push("dict");
    names.sort_unstable();
    names
}
