//! Sprig-style string helpers, with Sprig's argument order (the string being
//! worked on comes last, so it is what a filter pipes in).
//!
//! Where minijinja has a builtin filter of the same name (`upper`, `lower`,
//! `trim`, `replace`, `indent`, `split`), these replace it; the piped forms
//! users know from Jinja (`x | replace("a", "b")`, `x | split(",")`) keep
//! working because the piped value is the last argument. `indent` follows
//! Sprig: every line is indented, the first one too.
//!
//! Each helper reserves the bytes of its result before building it, and
//! charges the scan of its input.

use minijinja::{Error, State, Value};

use crate::args::{arity, fail, integer, reserve, reserve_usize, text, work};
use crate::cost;

/// Most bytes a character grows to when its case changes (`ΐ`, 2 bytes,
/// upper-cases to 6).
const CASE_GROWTH: u64 = 3;

/// Most bytes one input byte becomes when quoted (`\x01`).
const QUOTE_GROWTH: u64 = 4;

/// Bytes a list slot costs besides its text (the value and its share of
/// the list).
const SLOT_BYTES: u64 = 32;

/// Most spaces `indent`/`nindent` accept.
const MAX_INDENT: i64 = 1024;

/// A case change of the input, its largest size reserved first.
fn change_case(
    state: &State,
    func: &str,
    args: &[Value],
    change: fn(&str) -> String,
) -> Result<Value, Error> {
    arity(func, args, 1, 1)?;
    let input = text(state, func, "the input", &args[0])?;
    reserve(state, (input.len() as u64).saturating_mul(CASE_GROWTH))?;
    Ok(Value::from(change(&input)))
}

pub(crate) fn upper(state: &State, args: &[Value]) -> Result<Value, Error> {
    change_case(state, "upper", args, str::to_uppercase)
}

pub(crate) fn lower(state: &State, args: &[Value]) -> Result<Value, Error> {
    change_case(state, "lower", args, str::to_lowercase)
}

/// A part of the input as a new value (its bytes reserved first).
fn part_of(state: &State, part: &str) -> Result<Value, Error> {
    reserve_usize(state, part.len())?;
    Ok(Value::from(part))
}

pub(crate) fn trim(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("trim", args, 1, 1)?;
    let input = text(state, "trim", "the input", &args[0])?;
    part_of(state, input.trim())
}

pub(crate) fn trim_prefix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("trimPrefix", args, 2, 2)?;
    let prefix = text(state, "trimPrefix", "the prefix", &args[0])?;
    let input = text(state, "trimPrefix", "the input", &args[1])?;
    part_of(state, input.strip_prefix(prefix.as_ref()).unwrap_or(&input))
}

pub(crate) fn trim_suffix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("trimSuffix", args, 2, 2)?;
    let suffix = text(state, "trimSuffix", "the suffix", &args[0])?;
    let input = text(state, "trimSuffix", "the input", &args[1])?;
    part_of(state, input.strip_suffix(suffix.as_ref()).unwrap_or(&input))
}

pub(crate) fn replace(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("replace", args, 3, 3)?;
    let old = text(state, "replace", "the old text", &args[0])?;
    let new = text(state, "replace", "the new text", &args[1])?;
    let input = text(state, "replace", "the input", &args[2])?;
    if old.is_empty() {
        // Go inserts `new` between every character; nobody means that.
        return Err(fail("replace", "the text to replace is empty"));
    }
    work(state, cost::bytes_usize(input.len()))?;
    let count = input.matches(old.as_ref()).count() as u64;
    let size = (input.len() as u64)
        .saturating_add(count.saturating_mul((new.len() as u64).saturating_sub(old.len() as u64)));
    reserve(state, size)?;
    Ok(Value::from(input.replace(old.as_ref(), &new)))
}

/// Go's `%q`: a double-quoted string with Go escapes (the Go-template
/// engine's own, so both syntaxes quote alike).
fn go_quote(s: &str) -> String {
    crate::gotemplate::quote_bytes(s.as_bytes(), false)
}

fn quote_with(
    state: &State,
    func: &str,
    args: &[Value],
    quote: fn(&str) -> String,
) -> Result<Value, Error> {
    let mut parts = Vec::with_capacity(args.len());
    for arg in args {
        if arg.is_none() {
            continue;
        }
        let part = text(state, func, "an argument", arg)?;
        // Escaping goes character by character.
        work(state, cost::hash(part.len(), true))?;
        reserve(
            state,
            (part.len() as u64)
                .saturating_mul(QUOTE_GROWTH)
                .saturating_add(3),
        )?;
        parts.push(quote(&part));
    }
    Ok(Value::from(parts.join(" ")))
}

pub(crate) fn quote(state: &State, args: &[Value]) -> Result<Value, Error> {
    quote_with(state, "quote", args, go_quote)
}

pub(crate) fn squote(state: &State, args: &[Value]) -> Result<Value, Error> {
    quote_with(state, "squote", args, |s| format!("'{s}'"))
}

fn indent_text(state: &State, func: &str, args: &[Value]) -> Result<String, Error> {
    arity(func, args, 2, 2)?;
    let width = integer(state, func, "the width", &args[0])?;
    if !(0..=MAX_INDENT).contains(&width) {
        return Err(fail(
            func,
            format!("the width must be between 0 and {MAX_INDENT}"),
        ));
    }
    let input = text(state, func, "the input", &args[1])?;
    work(state, cost::bytes_usize(input.len()))?;
    let lines = input.matches('\n').count() as u64 + 1;
    let size = (input.len() as u64)
        .saturating_add(lines.saturating_mul(width as u64))
        .saturating_add(1);
    reserve(state, size)?;
    let pad = " ".repeat(width as usize);
    let mut out = String::with_capacity(size as usize);
    out.push_str(&pad);
    out.push_str(&input.replace('\n', &format!("\n{pad}")));
    Ok(out)
}

pub(crate) fn indent(state: &State, args: &[Value]) -> Result<Value, Error> {
    Ok(Value::from(indent_text(state, "indent", args)?))
}

pub(crate) fn nindent(state: &State, args: &[Value]) -> Result<Value, Error> {
    Ok(Value::from(format!(
        "\n{}",
        indent_text(state, "nindent", args)?
    )))
}

pub(crate) fn contains(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("contains", args, 2, 2)?;
    let needle = text(state, "contains", "the substring", &args[0])?;
    let input = text(state, "contains", "the input", &args[1])?;
    work(state, cost::bytes_usize(input.len()))?;
    Ok(Value::from(input.contains(needle.as_ref())))
}

pub(crate) fn has_prefix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("hasPrefix", args, 2, 2)?;
    let prefix = text(state, "hasPrefix", "the prefix", &args[0])?;
    let input = text(state, "hasPrefix", "the input", &args[1])?;
    work(state, cost::bytes_usize(prefix.len()))?;
    Ok(Value::from(input.starts_with(prefix.as_ref())))
}

pub(crate) fn has_suffix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("hasSuffix", args, 2, 2)?;
    let suffix = text(state, "hasSuffix", "the suffix", &args[0])?;
    let input = text(state, "hasSuffix", "the input", &args[1])?;
    work(state, cost::bytes_usize(suffix.len()))?;
    Ok(Value::from(input.ends_with(suffix.as_ref())))
}

/// `split(sep, s)` returns a list (Sprig's `split` returns a map `{_0, _1, …}`;
/// a list indexes the same way, `parts[0]`, and can be looped over).
/// `split(s)` with a single argument splits on runs of whitespace.
pub(crate) fn split(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("split", args, 1, 2)?;
    if args.len() == 1 {
        let input = text(state, "split", "the input", &args[0])?;
        reserve_parts(state, &input, input.split_whitespace().count())?;
        return Ok(Value::from_iter(
            input.split_whitespace().map(str::to_owned),
        ));
    }
    let sep = text(state, "split", "the separator", &args[0])?;
    let input = text(state, "split", "the input", &args[1])?;
    if sep.is_empty() {
        reserve_parts(state, &input, input.chars().count())?;
        return Ok(Value::from_iter(input.chars().map(String::from)));
    }
    reserve_parts(state, &input, input.matches(sep.as_ref()).count() + 1)?;
    Ok(Value::from_iter(
        input.split(sep.as_ref()).map(str::to_owned),
    ))
}

/// Charges the scan of `input` and reserves a list of `parts` parts of it.
fn reserve_parts(state: &State, input: &str, parts: usize) -> Result<(), Error> {
    work(
        state,
        cost::bytes_usize(input.len())
            .saturating_add((parts as u64).saturating_mul(cost::VALUE_NODE)),
    )?;
    reserve(
        state,
        (input.len() as u64).saturating_add((parts as u64).saturating_mul(SLOT_BYTES)),
    )
}
