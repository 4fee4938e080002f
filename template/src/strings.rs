//! Sprig-style string helpers, with Sprig's argument order (the string being
//! worked on comes last, so it is what a filter pipes in).
//!
//! Where minijinja has a builtin filter of the same name (`upper`, `lower`,
//! `trim`, `replace`, `indent`, `split`), these replace it; the piped forms
//! users know from Jinja (`x | replace("a", "b")`, `x | split(",")`) keep
//! working because the piped value is the last argument. `indent` follows
//! Sprig: every line is indented, the first one too.

use minijinja::{Error, State, Value};

use crate::args::{arity, charge, fail, integer, text};

/// Most spaces `indent`/`nindent` accept.
const MAX_INDENT: i64 = 1024;

pub(crate) fn upper(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("upper", args, 1, 1)?;
    Ok(Value::from(
        text(state, "upper", "the input", &args[0])?.to_uppercase(),
    ))
}

pub(crate) fn lower(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("lower", args, 1, 1)?;
    Ok(Value::from(
        text(state, "lower", "the input", &args[0])?.to_lowercase(),
    ))
}

pub(crate) fn trim(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("trim", args, 1, 1)?;
    Ok(Value::from(
        text(state, "trim", "the input", &args[0])?.trim(),
    ))
}

pub(crate) fn trim_prefix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("trimPrefix", args, 2, 2)?;
    let prefix = text(state, "trimPrefix", "the prefix", &args[0])?;
    let input = text(state, "trimPrefix", "the input", &args[1])?;
    Ok(Value::from(
        input.strip_prefix(prefix.as_ref()).unwrap_or(&input),
    ))
}

pub(crate) fn trim_suffix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("trimSuffix", args, 2, 2)?;
    let suffix = text(state, "trimSuffix", "the suffix", &args[0])?;
    let input = text(state, "trimSuffix", "the input", &args[1])?;
    Ok(Value::from(
        input.strip_suffix(suffix.as_ref()).unwrap_or(&input),
    ))
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
    let count = input.matches(old.as_ref()).count();
    charge(
        state,
        input.len() + count.saturating_mul(new.len().saturating_sub(old.len())),
    )?;
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
        parts.push(quote(&text(state, func, "an argument", arg)?));
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
    let pad = " ".repeat(width as usize);
    let lines = input.matches('\n').count() + 1;
    charge(state, input.len() + lines * pad.len())?;
    let mut out = String::with_capacity(input.len() + lines * pad.len());
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
    Ok(Value::from(input.contains(needle.as_ref())))
}

pub(crate) fn has_prefix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("hasPrefix", args, 2, 2)?;
    let prefix = text(state, "hasPrefix", "the prefix", &args[0])?;
    let input = text(state, "hasPrefix", "the input", &args[1])?;
    Ok(Value::from(input.starts_with(prefix.as_ref())))
}

pub(crate) fn has_suffix(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("hasSuffix", args, 2, 2)?;
    let suffix = text(state, "hasSuffix", "the suffix", &args[0])?;
    let input = text(state, "hasSuffix", "the input", &args[1])?;
    Ok(Value::from(input.ends_with(suffix.as_ref())))
}

/// `split(sep, s)` returns a list (Sprig's `split` returns a map `{_0, _1, …}`;
/// a list indexes the same way, `parts[0]`, and can be looped over).
/// `split(s)` with a single argument splits on runs of whitespace.
pub(crate) fn split(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("split", args, 1, 2)?;
    if args.len() == 1 {
        let input = text(state, "split", "the input", &args[0])?;
        return Ok(Value::from_iter(
            input.split_whitespace().map(str::to_owned),
        ));
    }
    let sep = text(state, "split", "the separator", &args[0])?;
    let input = text(state, "split", "the input", &args[1])?;
    if sep.is_empty() {
        return Ok(Value::from_iter(input.chars().map(String::from)));
    }
    Ok(Value::from_iter(
        input.split(sep.as_ref()).map(str::to_owned),
    ))
}
