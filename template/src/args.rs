//! Argument handling shared by every helper.
//!
//! Each helper is written once, taking its arguments in the reference's
//! (Go template) order. [`register`] exposes it both as a function and as a
//! filter; the filter form moves the piped value to the **last** argument, as
//! a Go pipeline does: `X | f(a)` calls `f(a, X)`.
//!
//! Helper errors are built with [`fail`]: the message names the helper and
//! describes the problem, never the input (which is usually secret).

use std::borrow::Cow;
use std::fmt;

use minijinja::value::{Rest, StringInput, ValueKind};
use minijinja::{Environment, Error, State, Value};

/// A helper: Go argument order, all arguments positional.
pub(crate) type Helper = fn(&State, &[Value]) -> Result<Value, Error>;

/// Marks an error as coming from a helper (its message is safe to show).
#[derive(Debug)]
pub(crate) struct HelperFailure;

impl fmt::Display for HelperFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("helper failure")
    }
}

impl std::error::Error for HelperFailure {}

/// A helper error. `message` must not contain any part of the input.
pub(crate) fn fail(func: &str, message: impl fmt::Display) -> Error {
    Error::new(
        minijinja::ErrorKind::InvalidOperation,
        format!("{func}: {message}"),
    )
    .with_source(HelperFailure)
}

/// Registers `helper` as the function and the filter `name`.
pub(crate) fn register(env: &mut Environment<'static>, name: &'static str, helper: Helper) {
    env.add_function(name, move |state: &State, args: Rest<Value>| {
        helper(state, &args)
    });
    env.add_filter(
        name,
        move |state: &State, piped: Value, args: Rest<Value>| {
            let mut all = args.0;
            all.push(piped);
            helper(state, &all)
        },
    );
}

/// Checks the number of arguments.
pub(crate) fn arity(func: &str, args: &[Value], min: usize, max: usize) -> Result<(), Error> {
    let n = args.len();
    if n < min || n > max {
        let expected = if min == max {
            format!("{min}")
        } else if max == usize::MAX {
            format!("at least {min}")
        } else {
            format!("{min} to {max}")
        };
        let plural = if expected == "1" { "" } else { "s" };
        return Err(fail(
            func,
            format!("expects {expected} argument{plural}, got {n}"),
        ));
    }
    Ok(())
}

/// Fails with minijinja's own undefined error (it names the expression) when
/// `value` is undefined.
pub(crate) fn defined(state: &State, value: &Value) -> Result<(), Error> {
    if value.is_undefined() {
        StringInput::new(state, value)?;
        return Err(Error::from(minijinja::ErrorKind::UndefinedError));
    }
    Ok(())
}

/// A text argument. Numbers and booleans are written as Go would (`true`),
/// `none` is empty, binary data that is not UTF-8 is refused.
pub(crate) fn text<'a>(
    state: &State,
    func: &str,
    what: &str,
    value: &'a Value,
) -> Result<Cow<'a, str>, Error> {
    defined(state, value)?;
    match value.kind() {
        ValueKind::String => Ok(Cow::Borrowed(value.as_str().unwrap_or_default())),
        ValueKind::Bytes => match std::str::from_utf8(value.as_bytes().unwrap_or_default()) {
            Ok(text) => Ok(Cow::Borrowed(text)),
            Err(_) => Err(fail(func, format!("{what} is binary data, not text"))),
        },
        ValueKind::None | ValueKind::Undefined => Ok(Cow::Borrowed("")),
        ValueKind::Bool => Ok(Cow::Borrowed(if value.is_true() {
            "true"
        } else {
            "false"
        })),
        ValueKind::Plain | ValueKind::Invalid => Err(fail(func, format!("{what} is not text"))),
        _ => Ok(Cow::Owned(value.to_string())),
    }
}

/// A binary argument: bytes as they are, text as its UTF-8 bytes.
pub(crate) fn binary<'a>(
    state: &State,
    func: &str,
    what: &str,
    value: &'a Value,
) -> Result<&'a [u8], Error> {
    defined(state, value)?;
    match value.kind() {
        ValueKind::String | ValueKind::Bytes => Ok(value.as_bytes().unwrap_or_default()),
        ValueKind::None => Ok(&[]),
        _ => Err(fail(
            func,
            format!("{what} must be a string or bytes, got {}", value.kind()),
        )),
    }
}

/// An integer argument.
pub(crate) fn integer(state: &State, func: &str, what: &str, value: &Value) -> Result<i64, Error> {
    defined(state, value)?;
    if let Some(n) = value.as_i64() {
        return Ok(n);
    }
    if let Some(s) = value.as_str()
        && let Ok(n) = s.trim().parse::<i64>()
    {
        return Ok(n);
    }
    Err(fail(func, format!("{what} must be an integer")))
}

/// Charges the fuel for building a value of about `bytes` bytes, before
/// building it (the engine charges only what a helper returns, afterwards).
pub(crate) fn charge(state: &State, bytes: usize) -> Result<(), Error> {
    state.consume_fuel((bytes / 64) as u64 + 1)
}

/// A string value, or bytes when `data` is not UTF-8.
pub(crate) fn text_or_bytes(data: Vec<u8>) -> Value {
    match String::from_utf8(data) {
        Ok(text) => Value::from(text),
        Err(err) => Value::from_bytes(err.into_bytes()),
    }
}
