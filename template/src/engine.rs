//! The engine: one minijinja environment, configured once, shared by every
//! render.
//!
//! - Strict undefined values, no loader (no file access), no auto-escaping.
//! - Every helper of [`HELPERS`] as a function and as a filter.
//! - Limits: template size (checked before parsing), fuel (instructions and
//!   data, so time and memory), recursion depth, output size (checked while
//!   writing).
//! - Budgets: the renders of one resource share a [`Budget`]
//!   ([`Engine::render_in`]); each render may use at most the smaller of its
//!   own fuel and what the budget has left, and what it used (its setup
//!   included: parsing the source, copying the data) is taken from the
//!   budget. A [`Canceller`](crate::Canceller) stops them.
//! - Output: booleans print as `true`/`false` (as in Go), `none` prints
//!   nothing. Binary values (bytes that are not UTF-8, e.g. from
//!   `decodeBase64ToBytes`) are kept byte for byte by
//!   [`Engine::render_bytes`]; [`Engine::render`] refuses them.
//! - Errors: mapped to [`TemplateError`] with the field and line; the
//!   message is scrubbed of secret values.
//! - Engine choice per template, by its syntax: a template in Go
//!   `text/template` syntax (`{{ .KEY.Value }}`, `index .`, `$var`, or any
//!   template minijinja cannot parse and Go can) is rendered by
//!   [`crate::gotemplate`] with Go's semantics, under the same limits (fuel,
//!   nesting, output size, stack).

use std::borrow::Cow;
use std::io;

use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, Output, State, UndefinedBehavior, Value};

use crate::args::{Helper, HelperFailure, register};
use crate::budget::{Budget, Scope};
use crate::data::{self, SecretData};
use crate::error::{ErrorKind, TemplateError};
use crate::{collections, cost, encoding, gotemplate, jwk, pemutil, pkcs12, strings};

/// Every helper registered as both a function and a filter (except `dict`,
/// a function only, which takes keyword arguments too).
pub(crate) const HELPERS: &[(&str, Helper)] = &[
    // Reference custom functions.
    ("decodeBase64ToBytes", encoding::decode_base64_to_bytes),
    ("encodeBase64", encoding::encode_base64_fn),
    ("pkcs12key", pkcs12::pkcs12key),
    ("pkcs12keyPass", pkcs12::pkcs12key_pass),
    ("pkcs12cert", pkcs12::pkcs12cert),
    ("pkcs12certPass", pkcs12::pkcs12cert_pass),
    ("pemToPkcs12", pkcs12::pem_to_pkcs12),
    ("pemToPkcs12Pass", pkcs12::pem_to_pkcs12_pass),
    ("fullPemToPkcs12", pkcs12::full_pem_to_pkcs12),
    ("fullPemToPkcs12Pass", pkcs12::full_pem_to_pkcs12_pass),
    ("filterPEM", pemutil::filter_pem),
    ("filterCertChain", pemutil::filter_cert_chain),
    ("jwkPublicKeyPem", jwk::jwk_public_key_pem),
    ("jwkPrivateKeyPem", jwk::jwk_private_key_pem),
    ("toYaml", encoding::to_yaml),
    ("fromYaml", encoding::from_yaml),
    // Sprig-style helpers.
    ("b64enc", encoding::b64enc),
    ("b64dec", encoding::b64dec),
    ("upper", strings::upper),
    ("lower", strings::lower),
    ("trim", strings::trim),
    ("trimPrefix", strings::trim_prefix),
    ("trimSuffix", strings::trim_suffix),
    ("replace", strings::replace),
    ("quote", strings::quote),
    ("squote", strings::squote),
    ("indent", strings::indent),
    ("nindent", strings::nindent),
    ("default", collections::default),
    ("toJson", encoding::to_json),
    ("toRawJson", encoding::to_raw_json),
    ("fromJson", encoding::from_json),
    ("toPrettyJson", encoding::to_pretty_json),
    ("sha256sum", encoding::sha256sum),
    ("sha1sum", encoding::sha1sum),
    ("contains", strings::contains),
    ("hasPrefix", strings::has_prefix),
    ("hasSuffix", strings::has_suffix),
    ("split", strings::split),
    ("splitList", strings::split),
    ("join", collections::join),
    ("get", collections::get),
    ("hasKey", collections::has_key),
    ("keys", collections::keys),
];

/// Stack of a render. minijinja drops nested values recursively, and fuel
/// allows a template to nest a list tens of thousands of levels deep
/// (`{% set ns.v = [ns.v] %}` in a loop); the default stack of a worker
/// thread would overflow. The segment is allocated per render and only the
/// pages actually used are committed.
const RENDER_STACK_BYTES: usize = 256 * 1024 * 1024;

/// Marks where a binary value sits in the output: U+10FFFE, the index, U+10FFFF.
const BINARY_START: char = '\u{10FFFE}';
const BINARY_END: char = '\u{10FFFF}';

/// The resource limits of one render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest template source, in bytes (checked before parsing).
    pub template_bytes: usize,
    /// Largest rendered output, in bytes.
    pub output_bytes: usize,
    /// Fuel of one render: about one unit per instruction, per 64 bytes of
    /// data created and per step of a helper's work, so it bounds both time
    /// and memory.
    pub fuel: u64,
    /// Fuel of all the renders of one resource together (its
    /// [`Budget`]): a resource renders many templates, each with its own
    /// [`fuel`](Self::fuel), and together they may use no more than this.
    pub resource_fuel: u64,
    /// Deepest nesting of blocks, loops and macro calls.
    pub recursion: usize,
}

impl Default for Limits {
    /// 64 KiB templates, 1 MiB output (the most a Secret holds), 250,000
    /// fuel per render (about 16 MiB of data, or 5–25 ms of CPU; a
    /// certificate template uses a few thousand), 1,000,000 per resource,
    /// recursion 64.
    fn default() -> Self {
        Limits {
            template_bytes: 64 * 1024,
            output_bytes: 1024 * 1024,
            fuel: 250_000,
            resource_fuel: 1_000_000,
            recursion: 64,
        }
    }
}

/// The template engine. Build it once and share it: it is `Send + Sync`
/// and rendering does no I/O.
pub struct Engine {
    env: Environment<'static>,
    limits: Limits,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(Limits::default())
    }
}

/// Binary values written during a render (a state extension), and their
/// total size.
#[derive(Default)]
struct BinaryParts {
    parts: Vec<Vec<u8>>,
    bytes: usize,
}

/// Marks the error of a render whose binary values outgrew the output
/// limit.
#[derive(Debug)]
struct BinaryTooLarge;

impl std::fmt::Display for BinaryTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("binary output too large")
    }
}

impl std::error::Error for BinaryTooLarge {}

/// Writes rendered output, failing past the output limit.
struct LimitedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for LimitedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes a value as `{{ value }}` does. A binary value is kept aside (a
/// marker goes into the text) and spliced back by
/// [`Engine::render_bytes`]; its bytes are charged and count towards the
/// output limit, `limit`.
fn format_value(
    out: &mut Output,
    state: &mut State,
    value: &Value,
    limit: usize,
) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Bool => out.write_str(if value.is_true() { "true" } else { "false" })?,
        ValueKind::None | ValueKind::Undefined => {}
        ValueKind::Bytes => {
            let bytes = value.as_bytes().unwrap_or_default();
            match std::str::from_utf8(bytes) {
                Ok(text) => out.write_str(text)?,
                Err(_) => {
                    state.consume_fuel(cost::bytes_usize(bytes.len()))?;
                    let parts = state.get_or_insert_extension_with(BinaryParts::default);
                    if bytes.len() > limit.saturating_sub(parts.bytes) {
                        return Err(minijinja::Error::new(
                            minijinja::ErrorKind::InvalidOperation,
                            "binary output too large",
                        )
                        .with_source(BinaryTooLarge));
                    }
                    parts.bytes += bytes.len();
                    parts.parts.push(bytes.to_vec());
                    let index = parts.parts.len() - 1;
                    write!(out, "{BINARY_START}{index}{BINARY_END}")?;
                }
            }
        }
        // Lists and maps are written through a bounded writer, each byte
        // charged (minijinja's printing of nested values is slow per byte).
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            out.write_str(&crate::args::stringify(state, value)?)?;
        }
        _ => minijinja::escape_formatter(out, state, value)?,
    }
    Ok(())
}

impl Engine {
    /// Builds the engine with these limits.
    pub fn new(limits: Limits) -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion);
        // Debug mode makes undefined errors name the expression
        // (`FOO.Value` is undefined). Its snapshots of variables are never
        // printed: errors are mapped from their kind and detail only.
        env.set_debug(true);
        let output_limit = limits.output_bytes;
        env.set_formatter(move |out, state, value| format_value(out, state, value, output_limit));
        // `debug()` would print every secret.
        env.remove_global("debug");
        // minijinja's `d` is its `default`; make it ours.
        env.remove_filter("d");
        for (name, helper) in HELPERS {
            register(&mut env, name, *helper);
        }
        env.add_filter(
            "d",
            |state: &State, piped: Value, args: minijinja::value::Rest<Value>| {
                let mut all = args.0;
                all.push(piped);
                crate::args::call(collections::default, state, &all)
            },
        );
        env.add_function("dict", collections::dict);
        Engine { env, limits }
    }

    /// The limits this engine enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A fresh budget for the renders of one resource:
    /// [`Limits::resource_fuel`].
    pub fn budget(&self) -> Budget {
        Budget::new(self.limits.resource_fuel)
    }

    /// Parses a template without rendering it (for admission-time checks).
    pub fn check(&self, field: &str, source: &str) -> Result<(), TemplateError> {
        self.precheck(field, source)?;
        if self.is_go(source) {
            return self
                .go_check(source)
                .map_err(|e| go_error(field, source, e, &SecretData::new()));
        }
        self.env
            .template_from_named_str(field, source)
            .map(|_| ())
            .map_err(|err| translate(field, source, &err, &SecretData::new(), false))
    }

    /// Renders a template to text, with a budget of its own. Binary output
    /// (bytes that are not UTF-8) is an error here; use
    /// [`render_bytes`](Self::render_bytes) for targets that can hold binary
    /// data (Secret data).
    pub fn render(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
    ) -> Result<String, TemplateError> {
        self.render_in(field, source, data, &mut self.budget())
    }

    /// Renders a template to bytes, with a budget of its own. A binary value
    /// in the output (e.g. `{{ P12.Value | decodeBase64ToBytes }}`) is
    /// written byte for byte.
    pub fn render_bytes(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
    ) -> Result<Vec<u8>, TemplateError> {
        self.render_bytes_in(field, source, data, &mut self.budget())
    }

    /// [`render`](Self::render) within a resource's budget: the render may
    /// use at most the smaller of [`Limits::fuel`] and what `budget` has
    /// left, and what it used is taken from `budget`. A spent budget fails
    /// at once with [`ErrorKind::OutOfFuel`]; a cancelled one (its
    /// [`Canceller`](crate::Canceller)) with [`ErrorKind::Cancelled`], and a
    /// render running when it is cancelled stops promptly with that error.
    pub fn render_in(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
        budget: &mut Budget,
    ) -> Result<String, TemplateError> {
        self.precheck(field, source)?;
        self.begin(field, source, data, budget)?;
        if self.choose(field, source, budget)? {
            let bytes = self.render_go(field, source, data, budget)?;
            return String::from_utf8(bytes).map_err(|_| binary_output(field));
        }
        let (text, parts) = self.render_raw(field, source, data, budget)?;
        if !parts.is_empty() {
            return Err(binary_output(field));
        }
        Ok(text)
    }

    /// [`render_bytes`](Self::render_bytes) within a resource's budget (see
    /// [`render_in`](Self::render_in)).
    pub fn render_bytes_in(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
        budget: &mut Budget,
    ) -> Result<Vec<u8>, TemplateError> {
        self.precheck(field, source)?;
        self.begin(field, source, data, budget)?;
        if self.choose(field, source, budget)? {
            return self.render_go(field, source, data, budget);
        }
        let (text, parts) = self.render_raw(field, source, data, budget)?;
        if parts.is_empty() {
            return Ok(text.into_bytes());
        }
        let mut out = Vec::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(start) = rest.find(BINARY_START) {
            out.extend_from_slice(&rest.as_bytes()[..start]);
            let after = &rest[start + BINARY_START.len_utf8()..];
            let spliced = after.find(BINARY_END).and_then(|end| {
                let index: usize = after[..end].parse().ok()?;
                Some((parts.get(index)?, end))
            });
            match spliced {
                Some((part, end)) => {
                    out.extend_from_slice(part);
                    rest = &after[end + BINARY_END.len_utf8()..];
                }
                None => {
                    out.extend_from_slice(BINARY_START.to_string().as_bytes());
                    rest = after;
                }
            }
        }
        out.extend_from_slice(rest.as_bytes());
        if out.len() > self.limits.output_bytes {
            return Err(output_too_large(field, self.limits.output_bytes));
        }
        Ok(out)
    }

    /// Whether [`render`](Self::render) treats this template as a Go
    /// template (Go `text/template` syntax, as the Go operators use).
    pub fn is_go_template(&self, source: &str) -> bool {
        self.is_go(source)
    }

    /// Renders a template as a Go template whatever its syntax (the engine
    /// choice of [`render_bytes`](Self::render_bytes) skipped), with a
    /// budget of its own.
    pub fn render_go_bytes(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
    ) -> Result<Vec<u8>, TemplateError> {
        self.precheck(field, source)?;
        let mut budget = self.budget();
        self.begin(field, source, data, &mut budget)?;
        self.render_go(field, source, data, &mut budget)
    }

    fn precheck(&self, field: &str, source: &str) -> Result<(), TemplateError> {
        if source.len() > self.limits.template_bytes {
            return Err(TemplateError::new(
                field,
                None,
                ErrorKind::TemplateTooLarge,
                format!(
                    "the template is {} bytes, more than the limit of {} bytes",
                    source.len(),
                    self.limits.template_bytes
                ),
            ));
        }
        if let Some(pos) = source.find([BINARY_START, BINARY_END]) {
            return Err(TemplateError::new(
                field,
                Some(line_of(source, pos)),
                ErrorKind::Syntax,
                "the template contains the reserved characters U+10FFFE/U+10FFFF",
            ));
        }
        Ok(())
    }

    /// Whether a template is in Go `text/template` syntax. Go syntax often
    /// parses as (odd) Jinja (`{{ fn .A }}` is `fn.A`), so it is looked for
    /// before parsing; a template minijinja cannot parse goes to Go when Go
    /// can parse it and it holds no Jinja-only tag (`{%`, `{#`).
    fn is_go(&self, source: &str) -> bool {
        self.syntax_is_go(source, &mut || Ok::<(), ()>(()))
            .unwrap_or(false)
    }

    /// [`is_go`](Self::is_go) within `budget`: each parse the choice needs
    /// (an ambiguous template is parsed as Jinja, then as Go) is charged
    /// before it runs.
    fn choose(
        &self,
        field: &str,
        source: &str,
        budget: &mut Budget,
    ) -> Result<bool, TemplateError> {
        self.syntax_is_go(source, &mut || charge_parse(field, source, budget))
    }

    /// The syntax choice, `before_parse` called before each parse it needs.
    fn syntax_is_go<E>(
        &self,
        source: &str,
        before_parse: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<bool, E> {
        if find_go_syntax(source).is_some() {
            return Ok(true);
        }
        if !source.contains("{{") || source.contains("{%") || source.contains("{#") {
            return Ok(false);
        }
        before_parse()?;
        let jinja_fails = self
            .env
            .template_from_str(source)
            .is_err_and(|e| e.kind() == minijinja::ErrorKind::SyntaxError);
        if !jinja_fails {
            return Ok(false);
        }
        before_parse()?;
        Ok(self.go_check(source).is_ok())
    }

    fn go_check(&self, source: &str) -> Result<(), gotemplate::GoError> {
        stacker::grow(RENDER_STACK_BYTES, || {
            gotemplate::check(source, self.limits.recursion)
        })
    }

    /// Starts a render within `budget`: fails when the budget is cancelled
    /// or spent, and takes the render's setup from it (its source parsed,
    /// its data copied).
    fn begin(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
        budget: &mut Budget,
    ) -> Result<(), TemplateError> {
        if budget.is_cancelled() {
            return Err(cancelled(field));
        }
        let data_bytes = data
            .iter()
            .map(|(k, e)| (k.len() + e.value.len() + e.secret_path.len()) as u64)
            .fold(0u64, u64::saturating_add);
        spend(
            field,
            budget,
            cost::render_setup(source.len(), data.len(), data_bytes),
        )
    }

    /// The fuel the render may use: its own, or what `budget` has left.
    fn allowance(&self, field: &str, budget: &Budget) -> Result<u64, TemplateError> {
        if budget.is_cancelled() {
            return Err(cancelled(field));
        }
        match budget.allowance(self.limits.fuel) {
            0 => Err(resource_out_of_fuel(field)),
            allowance => Ok(allowance),
        }
    }

    /// The error of a render that used `allowance` fuel of `budget`, as the
    /// caller should see it: cancelled when the budget was, out of fuel
    /// for the resource when the budget (not the render's fuel) ran out.
    fn settle(&self, mut err: TemplateError, allowance: u64, budget: &Budget) -> TemplateError {
        if budget.is_cancelled() {
            return cancelled(&err.field);
        }
        if err.kind == ErrorKind::OutOfFuel && allowance < self.limits.fuel {
            err = resource_out_of_fuel(&err.field);
        }
        err
    }

    /// Renders a Go template to bytes within `budget`. The render's state
    /// is the engine's (fuel [`Limits::fuel`]) with the fuel beyond its
    /// allowance used up front, so what it used is known exactly, whether
    /// it succeeds or fails.
    fn render_go(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
        budget: &mut Budget,
    ) -> Result<Vec<u8>, TemplateError> {
        let allowance = self.allowance(field, budget)?;
        let limits = &self.limits;
        let _scope = Scope::enter(&budget.canceller());
        let (result, used) = stacker::grow(RENDER_STACK_BYTES, || {
            let state = self.env.empty_state();
            let unused = limits.fuel.saturating_sub(allowance);
            if unused > 0 {
                let _ = state.consume_fuel(unused);
            }
            let result =
                gotemplate::render(&state, source, data, limits.output_bytes, limits.recursion);
            let consumed = state.fuel_levels().map_or(0, |(consumed, _)| consumed);
            (result, consumed.saturating_sub(unused))
        });
        budget.spend(used);
        result.map_err(|e| self.settle(go_error(field, source, e, data), allowance, budget))
    }

    /// The environment of a render that may use `allowance` fuel: the
    /// engine's, or a copy with less fuel (cheap: its parts are shared).
    fn env_for(&self, allowance: u64) -> Cow<'_, Environment<'static>> {
        if allowance >= self.limits.fuel {
            return Cow::Borrowed(&self.env);
        }
        let mut env = self.env.clone();
        env.set_fuel(Some(allowance));
        Cow::Owned(env)
    }

    /// Renders a minijinja template within `budget`. What a failed render
    /// used is not known (minijinja keeps its state), so it is charged its
    /// whole allowance.
    fn render_raw(
        &self,
        field: &str,
        source: &str,
        data: &SecretData,
        budget: &mut Budget,
    ) -> Result<(String, Vec<Vec<u8>>), TemplateError> {
        let allowance = self.allowance(field, budget)?;
        let env = self.env_for(allowance);
        let template = env
            .template_from_named_str(field, source)
            .map_err(|err| translate(field, source, &err, data, false))?;
        let limit = self.limits.output_bytes;
        let _scope = Scope::enter(&budget.canceller());
        let (result, writer) = stacker::grow(RENDER_STACK_BYTES, || {
            let mut writer = LimitedWriter {
                buf: Vec::new(),
                limit,
                exceeded: false,
            };
            // Everything that may hold template values (the state, an
            // error's debug snapshot) is dropped on the large stack.
            let result = template
                .render_captured_to(data::context(data), &mut writer)
                .map(|captured| {
                    let state = captured.state();
                    let parts = state
                        .get_extension::<BinaryParts>()
                        .map(|p| p.parts.clone())
                        .unwrap_or_default();
                    let used = state.fuel_levels().map_or(0, |(consumed, _)| consumed);
                    (parts, used)
                })
                .map_err(|err| translate(field, source, &err, data, true));
            (result, writer)
        });
        budget.spend(match &result {
            Ok((_, used)) => *used,
            Err(_) => allowance,
        });
        if budget.is_cancelled() && result.is_err() {
            return Err(cancelled(field));
        }
        if writer.exceeded {
            return Err(output_too_large(field, limit));
        }
        let (parts, _) = result.map_err(|e| self.settle(e, allowance, budget))?;
        let text = String::from_utf8(writer.buf).map_err(|_| {
            TemplateError::new(
                field,
                None,
                ErrorKind::Render,
                "the output is not valid UTF-8",
            )
        })?;
        Ok((text, parts))
    }
}

fn binary_output(field: &str) -> TemplateError {
    TemplateError::new(
        field,
        None,
        ErrorKind::BinaryOutput,
        "the output holds binary data (not UTF-8 text), which this target cannot store",
    )
}

/// Maps a Go-template error (message scrubbed of secret values).
fn go_error(
    field: &str,
    source: &str,
    err: gotemplate::GoError,
    data: &SecretData,
) -> TemplateError {
    TemplateError::new(field, None, err.kind, scrub(&err.message, data)).at(source, err.pos)
}

/// Takes `fuel` from `budget`, or fails (the budget spent) when it has less.
fn spend(field: &str, budget: &mut Budget, fuel: u64) -> Result<(), TemplateError> {
    if fuel >= budget.remaining() {
        budget.spend(fuel);
        return Err(resource_out_of_fuel(field));
    }
    budget.spend(fuel);
    Ok(())
}

/// Charges parsing `source` once more (deciding its syntax).
fn charge_parse(field: &str, source: &str, budget: &mut Budget) -> Result<(), TemplateError> {
    spend(field, budget, cost::parse(source.len()))
}

/// The error of a render stopped by its canceller.
fn cancelled(field: &str) -> TemplateError {
    TemplateError::new(
        field,
        None,
        ErrorKind::Cancelled,
        "the templates took too long to render and were stopped (too expensive)",
    )
}

/// The error of a render whose resource's budget is spent.
fn resource_out_of_fuel(field: &str) -> TemplateError {
    TemplateError::new(
        field,
        None,
        ErrorKind::OutOfFuel,
        "out of fuel for this resource: its templates together do too much work",
    )
}

fn output_too_large(field: &str, limit: usize) -> TemplateError {
    TemplateError::new(
        field,
        None,
        ErrorKind::OutputTooLarge,
        format!("the output is larger than the limit of {limit} bytes"),
    )
}

/// The 1-based line of a byte offset.
pub(crate) fn line_of(source: &str, pos: usize) -> usize {
    source[..pos.min(source.len())].matches('\n').count() + 1
}

/// Position just after a `{% NAME` tag opening (`{%-` and blanks allowed)
/// at `at`, when the tag is `name`.
fn tag_named(bytes: &[u8], at: usize, name: &[u8]) -> Option<usize> {
    let mut i = at + 2;
    if bytes.get(i) == Some(&b'-') {
        i += 1;
    }
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    let end = i + name.len();
    (bytes.get(i..end) == Some(name)
        && bytes
            .get(end)
            .is_some_and(|b| b.is_ascii_whitespace() || matches!(b, b'-' | b'%')))
    .then_some(end)
}

/// The source with comments (`{# … #}`) and raw blocks
/// (`{% raw %}…{% endraw %}`) blanked out, byte offsets kept.
fn mask_comments_and_raw(source: &str) -> Vec<u8> {
    let mut bytes = source.as_bytes().to_vec();
    let mut i = 0;
    while i + 1 < bytes.len() {
        let end = if bytes[i] == b'{' && bytes[i + 1] == b'#' {
            source[i..].find("#}").map(|e| i + e + 2)
        } else if bytes[i] == b'{' && bytes[i + 1] == b'%' && tag_named(&bytes, i, b"raw").is_some()
        {
            let mut j = i + 2;
            let mut found = None;
            while let Some(open) = source[j..].find("{%") {
                let at = j + open;
                if tag_named(&bytes, at, b"endraw").is_some() {
                    found = source[at..].find("%}").map(|e| at + e + 2);
                    break;
                }
                j = at + 2;
            }
            found
        } else {
            None
        };
        match end {
            Some(end) => {
                for b in &mut bytes[i..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            None if bytes[i] == b'{' && bytes[i + 1] == b'#' => {
                // An unclosed comment runs to the end.
                for b in &mut bytes[i..] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                break;
            }
            None => i += 1,
        }
    }
    bytes
}

/// Finds Go-template syntax: inside `{{ … }}` (string literals skipped), a
/// `.` that starts a term (`.KEY`, `.`, `index . "k"`) or a `$` variable.
/// Returns the byte offset of the tag.
pub(crate) fn find_go_syntax(source: &str) -> Option<usize> {
    // Masking replaces whole ASCII-delimited ranges by blanks, so the text
    // stays UTF-8 and offsets stay the same.
    let masked = String::from_utf8(mask_comments_and_raw(source)).unwrap_or_default();
    let source = masked.as_str();
    let bytes = source.as_bytes();
    let mut i = 0;
    while let Some(open) = source[i..].find("{{") {
        let tag = i + open;
        let mut j = tag + 2;
        if bytes.get(j) == Some(&b'-') {
            j += 1;
        }
        let mut prev = b' ';
        while j < bytes.len() {
            let c = bytes[j];
            if c == b'}' && bytes.get(j + 1) == Some(&b'}') {
                break;
            }
            match c {
                b'"' | b'\'' | b'`' => {
                    // Skip a string literal.
                    let quote = c;
                    j += 1;
                    while j < bytes.len() && bytes[j] != quote {
                        if bytes[j] == b'\\' && quote != b'`' {
                            j += 1;
                        }
                        j += 1;
                    }
                    prev = quote;
                }
                b'$' => return Some(tag),
                b'.' if matches!(
                    prev,
                    b' ' | b'\t' | b'\n' | b'\r' | b'(' | b'|' | b',' | b'{'
                ) =>
                {
                    let next = bytes.get(j + 1).copied().unwrap_or(b' ');
                    if next.is_ascii_alphabetic()
                        || next == b'_'
                        || matches!(next, b' ' | b'\t' | b'\n' | b')' | b'}' | b'|')
                    {
                        return Some(tag);
                    }
                }
                _ => {}
            }
            if !matches!(c, b'"' | b'\'' | b'`') {
                prev = c;
            }
            j += 1;
        }
        i = j.min(bytes.len());
        if i >= bytes.len() {
            break;
        }
    }
    None
}

/// Replaces every secret value (and its lines) in an engine message.
fn scrub(message: &str, data: &SecretData) -> String {
    let mut out = message.to_owned();
    for entry in data.values() {
        let Ok(value) = std::str::from_utf8(&entry.value) else {
            continue;
        };
        let mut needles: Vec<&str> = vec![value.trim()];
        needles.extend(value.lines().map(str::trim));
        for needle in needles {
            if needle.chars().count() >= 4 && out.contains(needle) {
                out = out.replace(needle, "<redacted>");
            }
        }
    }
    out
}

/// "undefined value `FOO.Value`", with a hint for the usual mistakes.
fn undefined_message(detail: &str, rendering: bool) -> String {
    // minijinja's detail reads "`EXPR` is undefined" (maybe followed by
    // where the value came from).
    let parsed = detail
        .strip_prefix('`')
        .and_then(|rest| rest.split_once("` is undefined"));
    let (expr, mut message) = match parsed {
        Some((expr, rest)) => (expr, format!("undefined value `{expr}`{rest}")),
        None if detail.is_empty() => ("", "undefined value".to_owned()),
        None => ("", format!("undefined value: {detail}")),
    };
    let last = expr.rsplit('.').next().unwrap_or("");
    if matches!(
        last,
        "value" | "secretPath" | "secret_path" | "VALUE" | "Secretpath"
    ) {
        message.push_str("; the fields of a secret are `Value` and `SecretPath`");
    } else if rendering
        && !expr.is_empty()
        && (!expr.contains(['.', '[']) || expr.starts_with("secrets"))
    {
        message.push_str(
            "; no such secret (use `secrets[\"KEY\"]` for keys that are not identifiers, \
             `is defined` for optional ones)",
        );
    }
    message
}

/// Maps a minijinja error to a [`TemplateError`].
fn translate(
    field: &str,
    source: &str,
    err: &minijinja::Error,
    data: &SecretData,
    rendering: bool,
) -> TemplateError {
    let at = |e: TemplateError| match err.range() {
        Some(range) => e.at(source, Some(range.start)),
        None => e,
    };
    at(translate_kind(field, err, data, rendering))
}

/// [`translate`] without the position.
fn translate_kind(
    field: &str,
    err: &minijinja::Error,
    data: &SecretData,
    rendering: bool,
) -> TemplateError {
    use minijinja::ErrorKind as K;
    let line = err.line();
    let detail = err.detail().unwrap_or("");
    let source = std::error::Error::source(err);
    if source.is_some_and(|s| s.is::<HelperFailure>()) {
        return TemplateError::new(field, line, ErrorKind::Function, detail);
    }
    if source.is_some_and(|s| s.is::<BinaryTooLarge>()) {
        return TemplateError::new(
            field,
            line,
            ErrorKind::OutputTooLarge,
            "the binary values in the output are larger than the output limit",
        );
    }
    let with_detail = |what: &str| {
        if detail.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {detail}")
        }
    };
    let (kind, message) = match err.kind() {
        K::SyntaxError | K::BadEscape | K::InvalidDelimiter => {
            (ErrorKind::Syntax, with_detail("syntax error"))
        }
        K::UndefinedError => (ErrorKind::Undefined, undefined_message(detail, rendering)),
        K::UnknownFilter | K::UnknownFunction | K::UnknownTest | K::UnknownMethod => {
            let what = match err.kind() {
                K::UnknownFilter => "unknown filter",
                K::UnknownTest => "unknown test",
                K::UnknownMethod => "unknown method",
                _ => "unknown function",
            };
            (
                ErrorKind::UnknownFunction,
                format!(
                    "{}; the helpers are listed in docs/templating.md",
                    with_detail(what)
                ),
            )
        }
        K::OutOfFuel => (
            ErrorKind::OutOfFuel,
            "the template does too much work or builds too much data (out of fuel)".to_owned(),
        ),
        K::TemplateNotFound | K::BadInclude => (
            ErrorKind::Render,
            "templates cannot include, import or extend other templates".to_owned(),
        ),
        K::InvalidOperation if detail.starts_with("unable to calculate") => (
            ErrorKind::Render,
            "invalid operation: arithmetic overflow or invalid operands".to_owned(),
        ),
        K::InvalidOperation if detail.starts_with("failed to sort") => (
            ErrorKind::Render,
            "invalid operation: failed to sort".to_owned(),
        ),
        K::InvalidOperation if detail.contains("recursion") => {
            (ErrorKind::Render, with_detail("invalid operation"))
        }
        kind => (ErrorKind::Render, with_detail(&kind.to_string())),
    };
    TemplateError::new(field, line, kind, scrub(&message, data))
}

#[cfg(test)]
mod tests {
    use super::{find_go_syntax, line_of, undefined_message};

    #[test]
    fn go_syntax_detection() {
        for go in [
            "{{ .A }}",
            "{{- .A -}}",
            "x {{ index . \"k\" }}",
            "{{ fn .A .B }}",
            "{{ (index . \"k\").Value }}",
            "{{ .A | b64enc }}",
            "{{ $x := 1 }}",
            "{{ . }}",
            "{% raw %}x{% endraw %}{{ .A }}",
            "{# c #}{{ .A }}",
        ] {
            assert!(find_go_syntax(go).is_some(), "{go}");
        }
        for jinja in [
            "{{ A.Value }}",
            "{{ secrets[\"a.b\"].Value }}",
            "{{ \" .x $y \" }}",
            "{{ '{{ .A }}' }}",
            "{# {{ .A }} #}",
            "{% raw %}{{ .A }}{% endraw %}",
            "{%- raw -%}\n{{ .A }}\n{%- endraw %}",
            "plain . text $ here",
            "{{ A.Value | replace('.', '$') }}",
            "{{ 1.5 }}",
        ] {
            assert!(find_go_syntax(jinja).is_none(), "{jinja}");
        }
        let src = "a\nb\n{{ .X }}";
        assert_eq!(find_go_syntax(src).map(|p| line_of(src, p)), Some(3));
    }

    #[test]
    fn undefined_messages() {
        assert_eq!(
            undefined_message("`FOO.Value` is undefined", false),
            "undefined value `FOO.Value`"
        );
        assert!(
            undefined_message("`A.value` is undefined", true).contains("`Value` and `SecretPath`")
        );
        assert!(undefined_message("`FOO` is undefined", true).contains("no such secret"));
        assert_eq!(undefined_message("", true), "undefined value");
    }
}
