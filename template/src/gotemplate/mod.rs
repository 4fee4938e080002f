//! Go templates: templates written for the Go operators (Go's
//! `text/template` with Sprig v3 and the operator's helpers) render here with
//! Go's semantics, so manifests copied from their documentation work
//! unchanged.
//!
//! The engine picks this module per template, by its syntax (see
//! [`crate::engine`]): `{{ .KEY.Value }}`, `index .`, `$var` are Go.
//!
//! - `parse`: lexer and parser (Go's grammar, trim markers, comments);
//! - `exec`: the evaluator (Go's argument typing, scoping, `range` order);
//! - `value`: Go values (the secret struct, typed ints, shared maps);
//! - `fmt`: Go's `%v` printing and `printf`;
//! - `json`: `encoding/json` as Sprig uses it;
//! - `funcs`: Go's builtins, the registry, the bridge to the operator helpers;
//! - `sprig`: the Sprig functions.
//!
//! Deliberate differences from Go are listed in `docs/templating.md`; the
//! differential test (`tests/gotemplate.rs`) checks everything else against
//! real Go.

mod exec;
mod fmt;
mod funcs;
mod json;
mod parse;
mod sprig;
mod value;

use std::collections::BTreeMap;
use std::rc::Rc;

use minijinja::State;

use crate::data::SecretData;
use crate::error::ErrorKind;
use value::{Elem, Secret, V};

pub(crate) use fmt::quote_bytes;
pub(crate) use funcs::{names, refused};

/// A Go template that failed: where (byte offset), what kind, why.
#[derive(Debug)]
pub(crate) struct GoError {
    /// Byte offset in the template, when known.
    pub pos: Option<usize>,
    /// The error kind.
    pub kind: ErrorKind,
    /// The message (not yet scrubbed of secret values).
    pub message: String,
}

fn parse_error(e: parse::ParseError) -> GoError {
    let kind =
        if e.message.starts_with("function ") || e.message.starts_with("unsupported function") {
            ErrorKind::UnknownFunction
        } else {
            ErrorKind::Syntax
        };
    GoError {
        pos: Some(e.pos),
        kind,
        message: format!("Go template: {}", e.message),
    }
}

/// Parses a Go template (functions and variables are checked).
pub(crate) fn check(source: &str, max_depth: usize) -> Result<(), GoError> {
    parse::parse(source, &funcs::check, max_depth)
        .map(|_| ())
        .map_err(parse_error)
}

/// The data as the Go operators hand it to templates:
/// `map[string]SecretTemplateOptions`.
fn data_value(data: &SecretData) -> V {
    let map: BTreeMap<String, V> = data
        .iter()
        .map(|(key, entry)| {
            (
                key.clone(),
                V::Secret(Rc::new(Secret {
                    value: V::from_bytes(entry.value.clone()),
                    path: entry.secret_path.as_str().into(),
                })),
            )
        })
        .collect();
    V::Map(Rc::new(std::cell::RefCell::new(map)), Elem::Secret)
}

/// Renders a Go template. `state` carries the fuel of the render.
pub(crate) fn render(
    state: &State<'_, '_>,
    source: &str,
    data: &SecretData,
    output_limit: usize,
    max_depth: usize,
) -> Result<Vec<u8>, GoError> {
    let tree = parse::parse(source, &funcs::check, max_depth).map_err(parse_error)?;
    let mut exec = exec::Exec::new(state, source, &tree, output_limit, max_depth);
    match exec.run(data_value(data)) {
        Ok(()) => Ok(std::mem::take(&mut exec.out)),
        Err(e) => Err(GoError {
            pos: e.pos,
            kind: e.kind,
            message: e.message,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::SecretEntry;

    fn run(src: &str) -> Result<String, String> {
        let env = minijinja::Environment::new();
        let state = env.empty_state();
        let mut data = SecretData::new();
        data.insert("A".into(), SecretEntry::new("va", "/"));
        data.insert("my-key".into(), SecretEntry::new("mk", "/x"));
        render(&state, src, &data, 1 << 20, 64)
            .map(|b| String::from_utf8(b).unwrap())
            .map_err(|e| e.message)
    }

    #[test]
    fn basics() {
        assert_eq!(run("{{ .A.Value }}").unwrap(), "va");
        assert_eq!(run("{{ (index . \"my-key\").Value }}").unwrap(), "mk");
        assert_eq!(run("{{ .A }}").unwrap(), "{va /}");
        assert_eq!(run("{{ . }}").unwrap(), "map[A:{va /} my-key:{mk /x}]");
        assert_eq!(
            run("{{- range $k, $v := . }}{{ $k }}={{ $v.Value }};{{ end -}}").unwrap(),
            "A=va;my-key=mk;"
        );
        assert_eq!(
            run("{{ if eq .A.Value \"va\" }}yes{{ else }}no{{ end }}").unwrap(),
            "yes"
        );
        assert_eq!(
            run("{{ .A.Value | upper | printf \"%s!\" }}").unwrap(),
            "VA!"
        );
        assert!(run("{{ .B.Value }}").unwrap_err().contains("no secret"));
        assert!(
            run("{{ randAlphaNum 5 }}")
                .unwrap_err()
                .contains("not deterministic")
        );
        assert!(
            run("{{ env \"HOME\" }}")
                .unwrap_err()
                .contains("environment")
        );
    }

    #[test]
    fn a_missing_secret_says_what_go_would_do_with_the_expression() {
        let said = |t: &str| run(t).unwrap_err();
        let bare = said("{{ .MISSING.Value }}");
        assert!(bare.contains(r#"no secret "MISSING""#), "{bare}");
        assert!(bare.contains("Go prints `<no value>`"), "{bare}");
        let piped = said("{{ .MISSING.Value | upper }}");
        assert!(
            piped.contains("Go fails too where `upper` needs a value"),
            "{piped}"
        );
        assert!(!piped.contains("<no value>"), "{piped}");
        let argument = said("{{ upper .MISSING.Value }}");
        assert!(argument.contains("`upper`"), "{argument}");
        let tested = said("{{ if .MISSING }}x{{ end }}");
        assert!(tested.contains("Go takes it as false"), "{tested}");
        let assigned = said("{{ $v := .MISSING.Value }}");
        assert!(assigned.contains("Go assigns no value"), "{assigned}");
    }
}
