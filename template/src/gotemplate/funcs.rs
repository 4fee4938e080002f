//! The functions a Go template can call: Go's builtins (`and`, `or`, `not`,
//! `len`, `index`, `print`, `printf`, `println`, `html`, `js`, `urlquery`,
//! `eq`, `ne`, `lt`, `le`, `gt`, `ge`), the Sprig v3 functions of
//! [`super::sprig`], and the operator's own helpers (the minijinja helpers of
//! this crate, called through a value bridge so each is written once).
//!
//! Each function has Go's parameter types ([`Ty`]): the evaluator converts
//! and checks arguments as Go's `text/template` does. Functions that are not
//! deterministic or that reach the environment or the network are refused
//! when the template is parsed, with a message naming the function; so are
//! the Sprig functions this engine does not implement.
//!
//! Every function charges its work and reserves its result before building
//! it (see [`Ctx`]); error messages describe arguments (their type, their
//! length), never their value.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use super::exec::{Ctx, FnError};
use super::fmt::{is_print, sprint, sprintf, sprintln};
use super::sprig;
use super::value::{Elem, IntTy, V};
use crate::args::Helper;
use crate::cost;
use crate::engine::HELPERS;

/// A parameter type of a Go function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    /// `interface{}`.
    Any,
    /// `reflect.Value` (Go's builtins).
    Rv,
    /// `string`.
    Str,
    /// `int`.
    Int,
    /// `float64`.
    Float,
    /// `bool`.
    Bool,
    /// `map[string]interface{}`.
    MapAny,
}

impl Ty {
    /// Go's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Ty::Any => "interface {}",
            Ty::Rv => "reflect.Value",
            Ty::Str => "string",
            Ty::Int => "int",
            Ty::Float => "float64",
            Ty::Bool => "bool",
            Ty::MapAny => "map[string]interface {}",
        }
    }
}

/// A function implemented here.
pub(crate) type Plain = fn(&Ctx, Vec<V>) -> Result<V, FnError>;

/// How a function is called.
#[derive(Clone, Copy)]
pub(crate) enum Call {
    /// A Rust function over Go values.
    Plain(Plain),
    /// An operator helper (minijinja values, Go argument order).
    Helper(Helper),
    /// Go's short-circuit `and`.
    And,
    /// Go's short-circuit `or`.
    Or,
}

/// A function: its Go signature and its implementation.
#[derive(Clone, Copy)]
pub(crate) struct Func {
    /// Fixed parameters.
    pub params: &'static [Ty],
    /// Type of the variadic parameters, if any.
    pub variadic: Option<Ty>,
    /// The implementation.
    pub call: Call,
}

/// Functions that are refused, with the reason.
const NOT_DETERMINISTIC: &[&str] = &[
    "now",
    "ago",
    "randAlphaNum",
    "randAlpha",
    "randAscii",
    "randNumeric",
    "randBytes",
    "randInt",
    "uuidv4",
    "shuffle",
    "genPrivateKey",
    "genCA",
    "genCAWithKey",
    "genSelfSignedCert",
    "genSelfSignedCertWithKey",
    "genSignedCert",
    "genSignedCertWithKey",
    "bcrypt",
    "htpasswd",
    "encryptAES",
];

const ENVIRONMENT: &[&str] = &["env", "expandenv", "getHostByName"];

/// Sprig v3 functions this engine does not implement.
const NOT_IMPLEMENTED: &[&str] = &[
    "date",
    "date_in_zone",
    "dateInZone",
    "date_modify",
    "dateModify",
    "must_date_modify",
    "mustDateModify",
    "duration",
    "durationRound",
    "htmlDate",
    "htmlDateInZone",
    "toDate",
    "mustToDate",
    "unixEpoch",
    "snakecase",
    "camelcase",
    "kebabcase",
    "wrap",
    "wrapWith",
    "buildCustomCert",
    "derivePassword",
    "decryptAES",
    "semver",
    "semverCompare",
    "urlParse",
    "urlJoin",
];

/// Every Sprig function a Go template cannot call (not deterministic,
/// environment or network access, not implemented), sorted.
pub(crate) fn refused() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = NOT_DETERMINISTIC
        .iter()
        .chain(ENVIRONMENT)
        .chain(NOT_IMPLEMENTED)
        .copied()
        .collect();
    all.sort_unstable();
    all
}

/// Whether the parser should accept a function name.
pub(crate) fn check(name: &str) -> Result<(), String> {
    if lookup(name).is_some() {
        return Ok(());
    }
    if NOT_DETERMINISTIC.contains(&name) {
        return Err(format!(
            "function {name:?} is refused: its output is not deterministic, so every resync would change the Secret"
        ));
    }
    if ENVIRONMENT.contains(&name) {
        return Err(format!(
            "function {name:?} is refused: templates cannot read the operator's environment or the network"
        ));
    }
    if NOT_IMPLEMENTED.contains(&name) {
        return Err(format!(
            "unsupported function {name:?}: this Sprig function is not implemented (see docs/templating.md)"
        ));
    }
    Err(format!("function {name:?} not defined"))
}

/// The function of that name.
pub(crate) fn lookup(name: &str) -> Option<&'static Func> {
    table().get(name)
}

/// The name of every function a Go template can call, sorted.
pub(crate) fn names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = table().keys().copied().collect();
    names.sort_unstable();
    names
}

/// Every function, by name.
fn table() -> &'static HashMap<&'static str, Func> {
    static TABLE: OnceLock<HashMap<&'static str, Func>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = HashMap::new();
        for (name, params, variadic, f) in builtins().into_iter().chain(sprig::functions()) {
            table.insert(
                name,
                Func {
                    params,
                    variadic,
                    call: Call::Plain(f),
                },
            );
        }
        let mut and_or = |name, call| {
            table.insert(
                name,
                Func {
                    params: &[Ty::Rv],
                    variadic: Some(Ty::Rv),
                    call,
                },
            )
        };
        and_or("and", Call::And);
        and_or("or", Call::Or);
        // The operator's helpers win over Sprig functions of the same name.
        for (name, helper) in HELPERS {
            if is_operator_helper(name) {
                table.insert(
                    name,
                    Func {
                        params: &[],
                        variadic: Some(Ty::Any),
                        call: Call::Helper(*helper),
                    },
                );
            }
        }
        table
    })
}

/// The custom functions of the reference (not the Sprig look-alikes the
/// minijinja engine also registers).
const OPERATOR_HELPERS: &[&str] = &[
    "decodeBase64ToBytes",
    "encodeBase64",
    "pkcs12key",
    "pkcs12keyPass",
    "pkcs12cert",
    "pkcs12certPass",
    "pemToPkcs12",
    "pemToPkcs12Pass",
    "fullPemToPkcs12",
    "fullPemToPkcs12Pass",
    "filterPEM",
    "filterCertChain",
    "jwkPublicKeyPem",
    "jwkPrivateKeyPem",
    "toYaml",
    "fromYaml",
];

fn is_operator_helper(name: &str) -> bool {
    OPERATOR_HELPERS.contains(&name)
}

/// A table row: name, fixed parameters, variadic type, implementation.
pub(crate) type Row = (&'static str, &'static [Ty], Option<Ty>, Plain);

fn msg<T>(m: impl Into<String>) -> Result<T, FnError> {
    Err(FnError::Msg(m.into()))
}

fn builtins() -> Vec<Row> {
    vec![
        ("not", &[Ty::Rv], None, |_, a| Ok(V::Bool(!a[0].truth()))),
        // No template value is a function, so `call` always fails, as in Go.
        ("call", &[Ty::Rv], Some(Ty::Rv), |_, a| {
            msg(format!("non-function of type {}", a[0].type_name()))
        }),
        ("len", &[Ty::Rv], None, |_, a| match a[0].len() {
            Some(n) => Ok(V::int(n as i64)),
            None if matches!(a[0], V::Nil) => msg("len of nil pointer"),
            None => msg(format!("len of type {}", a[0].type_name())),
        }),
        ("index", &[Ty::Rv], Some(Ty::Rv), index),
        ("print", &[], Some(Ty::Any), |c, a| {
            Ok(V::from_bytes(c.print(|out| sprint(out, &a))?))
        }),
        ("println", &[], Some(Ty::Any), |c, a| {
            Ok(V::from_bytes(c.print(|out| sprintln(out, &a))?))
        }),
        ("printf", &[Ty::Str], Some(Ty::Any), |c, a| {
            let format = a[0].as_bytes().unwrap_or_default();
            c.work(cost::bytes_usize(format.len()))?;
            Ok(V::from_bytes(c.print(|out| sprintf(out, format, &a[1..]))?))
        }),
        ("html", &[], Some(Ty::Any), |c, a| {
            let text = eval_args(c, &a, 5)?;
            let mut out = String::with_capacity(text.len());
            for ch in text.chars() {
                match ch {
                    '<' => out.push_str("&lt;"),
                    '>' => out.push_str("&gt;"),
                    '&' => out.push_str("&amp;"),
                    '\'' => out.push_str("&#39;"),
                    '"' => out.push_str("&#34;"),
                    '\0' => out.push('\u{FFFD}'),
                    c => out.push(c),
                }
            }
            Ok(V::str(out))
        }),
        ("js", &[], Some(Ty::Any), |c, a| {
            let text = eval_args(c, &a, 6)?;
            let mut out = String::with_capacity(text.len());
            for ch in text.chars() {
                match ch {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("\\'"),
                    '"' => out.push_str("\\\""),
                    '<' => out.push_str("\\u003C"),
                    '>' => out.push_str("\\u003E"),
                    '&' => out.push_str("\\u0026"),
                    '=' => out.push_str("\\u003D"),
                    c if is_print(c) => out.push(c),
                    c => out.push_str(&format!("\\u{:04X}", c as u32)),
                }
            }
            Ok(V::str(out))
        }),
        ("urlquery", &[], Some(Ty::Any), |c, a| {
            let text = eval_args(c, &a, 3)?;
            Ok(V::str(query_escape(text.as_bytes())))
        }),
        ("eq", &[Ty::Rv], Some(Ty::Rv), |c, a| {
            if a.len() < 2 {
                return msg("missing argument for comparison");
            }
            for b in &a[1..] {
                compare_work(c, &a[0], b)?;
                if eq(&a[0], b)? {
                    return Ok(V::Bool(true));
                }
            }
            Ok(V::Bool(false))
        }),
        ("ne", &[Ty::Rv, Ty::Rv], None, |c, a| {
            compare_work(c, &a[0], &a[1])?;
            Ok(V::Bool(!eq(&a[0], &a[1])?))
        }),
        ("lt", &[Ty::Rv, Ty::Rv], None, |c, a| {
            compare_work(c, &a[0], &a[1])?;
            Ok(V::Bool(lt(&a[0], &a[1])?))
        }),
        ("le", &[Ty::Rv, Ty::Rv], None, |c, a| {
            compare_work(c, &a[0], &a[1])?;
            Ok(V::Bool(lt(&a[0], &a[1])? || eq(&a[0], &a[1])?))
        }),
        ("gt", &[Ty::Rv, Ty::Rv], None, |c, a| {
            compare_work(c, &a[0], &a[1])?;
            Ok(V::Bool(!(lt(&a[0], &a[1])? || eq(&a[0], &a[1])?)))
        }),
        ("ge", &[Ty::Rv, Ty::Rv], None, |c, a| {
            compare_work(c, &a[0], &a[1])?;
            Ok(V::Bool(!lt(&a[0], &a[1])?))
        }),
    ]
}

/// Charges comparing two values (the bytes of two strings).
fn compare_work(c: &Ctx, a: &V, b: &V) -> Result<(), FnError> {
    let len = a
        .as_bytes()
        .map_or(0, <[u8]>::len)
        .min(b.as_bytes().map_or(0, <[u8]>::len));
    c.work(cost::bytes_usize(len))
}

/// Go's `evalArgs` of the escaping builtins: one string as is, else Sprint.
/// The escaped text (at most `growth` bytes per byte) is reserved.
fn eval_args(c: &Ctx, args: &[V], growth: u64) -> Result<String, FnError> {
    let text = if let [V::Str(s)] = args {
        s.to_string()
    } else {
        String::from_utf8_lossy(&c.print(|out| sprint(out, args))?).into_owned()
    };
    c.reserve((text.len() as u64).saturating_mul(growth))?;
    Ok(text)
}

/// Go's `url.QueryEscape`.
pub(crate) fn query_escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[derive(PartialEq)]
enum Basic {
    Bool,
    Int,
    Uint,
    Float,
    Str,
    Other,
}

fn basic(v: &V) -> Basic {
    match v {
        V::Bool(_) => Basic::Bool,
        V::Int(_, IntTy::Uint8) => Basic::Uint,
        V::Int(..) => Basic::Int,
        V::Float(_) => Basic::Float,
        V::Str(_) | V::Bytes(_) => Basic::Str,
        _ => Basic::Other,
    }
}

/// Go's `eq` for two values.
fn eq(a: &V, b: &V) -> Result<bool, FnError> {
    let (ka, kb) = (basic(a), basic(b));
    if ka != kb {
        if let (V::Int(x, _), V::Int(y, _)) = (a, b) {
            return Ok(x == y);
        }
        if matches!(a, V::Nil) || matches!(b, V::Nil) {
            return Ok(false);
        }
        return msg("incompatible types for comparison");
    }
    Ok(match (a, b) {
        (V::Bool(x), V::Bool(y)) => x == y,
        (V::Int(x, _), V::Int(y, _)) => x == y,
        (V::Float(x), V::Float(y)) => x == y,
        (V::Str(_) | V::Bytes(_), _) => a.as_bytes() == b.as_bytes(),
        (V::Nil, V::Nil) => true,
        (V::Nil, _) | (_, V::Nil) => false,
        (V::Secret(x), V::Secret(y)) => x == y,
        (V::List(..), _) | (V::Map(..), _) | (_, V::List(..)) | (_, V::Map(..)) => {
            return msg(format!("non-comparable type {}", a.type_name()));
        }
        _ => return msg("incompatible types for comparison"),
    })
}

/// Go's `lt`.
fn lt(a: &V, b: &V) -> Result<bool, FnError> {
    let (ka, kb) = (basic(a), basic(b));
    if ka == Basic::Other || kb == Basic::Other {
        return msg("invalid type for comparison");
    }
    if ka != kb {
        if let (V::Int(x, _), V::Int(y, _)) = (a, b) {
            return Ok(x < y);
        }
        return msg("incompatible types for comparison");
    }
    Ok(match (a, b) {
        (V::Int(x, _), V::Int(y, _)) => x < y,
        (V::Float(x), V::Float(y)) => x < y,
        (V::Str(_) | V::Bytes(_), _) => a.as_bytes() < b.as_bytes(),
        _ => return msg("invalid type for comparison"),
    })
}

/// Go's `index`.
fn index(c: &Ctx, a: Vec<V>) -> Result<V, FnError> {
    let mut item = a[0].clone();
    if matches!(item, V::Nil) {
        return msg("index of untyped nil");
    }
    for key in &a[1..] {
        item = match &item {
            V::List(..) | V::Str(_) | V::Bytes(_) => {
                let i = match key {
                    V::Int(n, _) => *n,
                    V::Nil => return msg("cannot index slice/array with nil"),
                    other => {
                        return msg(format!(
                            "cannot index slice/array with type {}",
                            other.type_name()
                        ));
                    }
                };
                let len = item.len().unwrap_or(0) as i64;
                if i < 0 || i >= len {
                    // The index may come from a secret: only the length is shown.
                    return msg(format!("index out of range (length {len})"));
                }
                match &item {
                    V::List(items, _) => items[i as usize].clone(),
                    _ => V::Int(
                        item.as_bytes().unwrap_or_default()[i as usize] as i64,
                        IntTy::Uint8,
                    ),
                }
            }
            V::Map(map, elem) => {
                let k = match key {
                    V::Str(s) => s.to_string(),
                    V::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                    V::Nil => String::new(),
                    other => {
                        return msg(format!(
                            "value has type {}; should be string",
                            other.type_name()
                        ));
                    }
                };
                let found = map.borrow().get(&k).cloned();
                match (found, elem) {
                    (Some(v), _) => v,
                    (None, Elem::Secret) => {
                        return Err(FnError::Helper(format!(
                            "no secret {} (a missing key is an error here, where Go gives an empty secret)",
                            c.shown_key(&k)
                        )));
                    }
                    (None, Elem::Str) => V::str(""),
                    (None, Elem::Int) => V::int(0),
                    (None, Elem::Any) => V::Nil,
                }
            }
            other => return msg(format!("can't index item of type {}", other.type_name())),
        };
    }
    Ok(item)
}

/// Converts a Go value for an operator helper, charging every node and
/// the bytes copied (a list that holds another many times is converted,
/// and charged, as often).
pub(crate) fn to_minijinja(c: &Ctx, v: &V, depth: usize) -> Result<minijinja::Value, FnError> {
    use minijinja::Value;
    if depth > 1000 {
        return msg("a value is nested too deep");
    }
    c.work(cost::VALUE_NODE)?;
    Ok(match v {
        V::Nil => Value::from(()),
        V::Bool(b) => Value::from(*b),
        V::Int(n, _) => Value::from(*n),
        V::Float(f) => Value::from(*f),
        V::Str(s) => {
            c.reserve_usize(s.len())?;
            Value::from(s.as_ref())
        }
        V::Bytes(b) => {
            c.reserve_usize(b.len())?;
            Value::from_bytes(b.to_vec())
        }
        V::List(items, _) => Value::from(
            items
                .iter()
                .map(|i| to_minijinja(c, i, depth + 1))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        V::Map(map, _) => {
            let mut out = BTreeMap::new();
            for (k, item) in map.borrow().iter() {
                c.reserve_usize(k.len())?;
                out.insert(k.clone(), to_minijinja(c, item, depth + 1)?);
            }
            Value::from(out)
        }
        V::Secret(s) => {
            let mut out = BTreeMap::new();
            out.insert("Value".to_owned(), to_minijinja(c, &s.value, depth + 1)?);
            out.insert("SecretPath".to_owned(), Value::from(s.path.as_ref()));
            Value::from(out)
        }
    })
}

/// Converts a helper's result back, charging every node and the bytes
/// copied.
pub(crate) fn from_minijinja(c: &Ctx, v: &minijinja::Value, depth: usize) -> Result<V, FnError> {
    use minijinja::value::ValueKind;
    if depth > 1000 {
        return msg("a value is nested too deep");
    }
    c.work(cost::VALUE_NODE)?;
    Ok(match v.kind() {
        ValueKind::Undefined | ValueKind::None => V::Nil,
        ValueKind::Bool => V::Bool(v.is_true()),
        ValueKind::Number => match v.as_i64() {
            Some(n)
                if v.to_string()
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'-') =>
            {
                V::int(n)
            }
            _ => V::Float(f64::try_from(v.clone()).unwrap_or(f64::NAN)),
        },
        ValueKind::String => {
            let text = v.as_str().unwrap_or_default();
            c.reserve_usize(text.len())?;
            V::str(text)
        }
        ValueKind::Bytes => {
            let bytes = v.as_bytes().unwrap_or_default();
            c.reserve_usize(bytes.len())?;
            V::from_bytes(bytes.to_vec())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let mut items = Vec::new();
            for item in v
                .try_iter()
                .map_err(|_| FnError::Msg("a list cannot be read".into()))?
            {
                items.push(from_minijinja(c, &item, depth + 1)?);
            }
            V::list(items)
        }
        ValueKind::Map => {
            let mut map = BTreeMap::new();
            for key in v
                .try_iter()
                .map_err(|_| FnError::Msg("a map cannot be read".into()))?
            {
                let item = v
                    .get_item(&key)
                    .map_err(|_| FnError::Msg("a map cannot be read".into()))?;
                let key = crate::args::stringify(c.state, &key).map_err(|_| FnError::Fuel)?;
                map.insert(key, from_minijinja(c, &item, depth + 1)?);
            }
            V::map(map)
        }
        _ => return msg("a helper returned a value templates cannot use"),
    })
}

/// Calls an operator helper with Go values.
pub(crate) fn call_helper(ctx: &Ctx, helper: Helper, args: Vec<V>) -> Result<V, FnError> {
    let args = args
        .iter()
        .map(|a| to_minijinja(ctx, a, 0))
        .collect::<Result<Vec<_>, _>>()?;
    match crate::args::call(helper, ctx.state, &args) {
        Ok(value) => from_minijinja(ctx, &value, 0),
        Err(err) if err.kind() == minijinja::ErrorKind::OutOfFuel => Err(FnError::Fuel),
        Err(err) => {
            let source = std::error::Error::source(&err);
            if source.is_some_and(|s| s.is::<crate::args::Cancelled>()) {
                return Err(FnError::Cancelled);
            }
            let from_helper = source.is_some_and(|s| s.is::<crate::args::HelperFailure>());
            let detail = err.detail().unwrap_or("the helper failed");
            Err(FnError::Helper(if from_helper {
                detail.to_owned()
            } else {
                format!("helper error: {}", err.kind())
            }))
        }
    }
}
