//! Argument handling shared by every helper.
//!
//! Each helper is written once, taking its arguments in the reference's
//! (Go template) order. [`register`] exposes it both as a function and as a
//! filter; the filter form moves the piped value to the **last** argument, as
//! a Go pipeline does: `X | f(a)` calls `f(a, X)`.
//!
//! Helper errors are built with [`fail`]: the message names the helper and
//! describes the problem, never the input (which is usually secret).
//!
//! Work and sizes: every call first checks that the render was not
//! cancelled; a helper charges the fuel of its work with [`work`] and
//! reserves the bytes it is about to produce with [`reserve`], both before
//! doing it, so a huge argument fails with out of fuel instead of
//! allocating. Values turned into text go through a bounded writer
//! ([`stringify`]) that stops as soon as the fuel left cannot pay for more.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use minijinja::value::{Rest, StringInput, ValueKind};
use minijinja::{Environment, Error, State, Value};

use crate::{budget, cost};

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

/// Marks the error of a render stopped by its [`Canceller`](crate::Canceller).
#[derive(Debug)]
pub(crate) struct Cancelled;

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the render was cancelled")
    }
}

impl std::error::Error for Cancelled {}

/// Fails when the render was cancelled. The state's fuel is used up too,
/// so the engine stops at its next instruction whatever catches the error.
pub(crate) fn not_cancelled(state: &State) -> Result<(), Error> {
    if budget::cancelled() {
        let _ = state.consume_fuel(u64::MAX);
        return Err(
            Error::new(minijinja::ErrorKind::InvalidOperation, "cancelled").with_source(Cancelled),
        );
    }
    Ok(())
}

/// Calls `helper` once the render is known not to be cancelled.
pub(crate) fn call(helper: Helper, state: &State, args: &[Value]) -> Result<Value, Error> {
    not_cancelled(state)?;
    helper(state, args)
}

/// Registers `helper` as the function and the filter `name`.
pub(crate) fn register(env: &mut Environment<'static>, name: &'static str, helper: Helper) {
    env.add_function(name, move |state: &State, args: Rest<Value>| {
        call(helper, state, &args)
    });
    env.add_filter(
        name,
        move |state: &State, piped: Value, args: Rest<Value>| {
            let mut all = args.0;
            all.push(piped);
            call(helper, state, &all)
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
        _ => Ok(Cow::Owned(stringify(state, value)?)),
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

/// Charges `fuel` for work about to be done (and checks for cancellation).
pub(crate) fn work(state: &State, fuel: u64) -> Result<(), Error> {
    not_cancelled(state)?;
    state.consume_fuel(fuel)
}

/// Charges the fuel of `bytes` bytes about to be produced, before they are
/// allocated: more than the fuel left can pay for fails with out of fuel
/// (the engine charges what a helper returns only afterwards).
pub(crate) fn reserve(state: &State, bytes: u64) -> Result<(), Error> {
    work(state, cost::bytes(bytes))
}

/// [`reserve`] for a `usize` size.
pub(crate) fn reserve_usize(state: &State, bytes: usize) -> Result<(), Error> {
    reserve(state, bytes as u64)
}

/// Bytes of text written per fuel when a value that is not a string is
/// stringified (minijinja's `Display` of nested lists and maps writes
/// about a byte per 40 ns).
const STRINGIFY_BYTES_PER_FUEL: u64 = 1;

/// Most bytes a render without fuel may stringify at once.
const UNMETERED_TEXT_BYTES: u64 = 64 * 1024 * 1024;

/// The fuel left in the render (a large amount when it has no fuel).
pub(crate) fn fuel_left(state: &State) -> u64 {
    state
        .fuel_levels()
        .map_or(UNMETERED_TEXT_BYTES, |(_, remaining)| remaining)
}

/// A `fmt::Write` that fails once more than `limit` bytes were written.
pub(crate) struct Bounded {
    pub text: String,
    limit: usize,
    pub exceeded: bool,
}

impl Bounded {
    /// An empty buffer that takes at most `limit` bytes.
    pub(crate) fn new(limit: u64) -> Bounded {
        Bounded {
            text: String::new(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            exceeded: false,
        }
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if s.len() > self.limit - self.text.len() {
            self.exceeded = true;
            return Err(fmt::Error);
        }
        self.text.push_str(s);
        Ok(())
    }
}

/// `value` as text (`{{ value }}` of minijinja), written through a bounded
/// writer: a value (a list of long strings, a list that holds another many
/// times) whose text the fuel left cannot pay for fails with out of fuel
/// before it is built. The fuel of the text is charged.
pub(crate) fn stringify(state: &State, value: &Value) -> Result<String, Error> {
    not_cancelled(state)?;
    let limit = fuel_left(state).saturating_mul(STRINGIFY_BYTES_PER_FUEL);
    let mut out = Bounded::new(limit);
    if write!(out, "{value}").is_err() || out.exceeded {
        return Err(out_of_fuel(state));
    }
    state.consume_fuel((out.text.len() as u64).div_ceil(STRINGIFY_BYTES_PER_FUEL))?;
    Ok(out.text)
}

/// The out-of-fuel error (the state's fuel is used up, so the engine stops).
pub(crate) fn out_of_fuel(state: &State) -> Error {
    let _ = state.consume_fuel(u64::MAX);
    Error::from(minijinja::ErrorKind::OutOfFuel)
}

/// A string value, or bytes when `data` is not UTF-8.
pub(crate) fn text_or_bytes(data: Vec<u8>) -> Value {
    match String::from_utf8(data) {
        Ok(text) => Value::from(text),
        Err(err) => Value::from_bytes(err.into_bytes()),
    }
}
