//! Sprig-style helpers on lists and maps: `default`, `join`, `dict`, `get`,
//! `hasKey`, `keys`. Each charges the items it visits and reserves the
//! bytes it builds before building them.

use std::collections::BTreeMap;

use minijinja::value::{Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, State, Value};

use crate::args::{arity, defined, fail, not_cancelled, reserve, text, work};
use crate::cost;

/// Bytes a map entry or list slot costs besides its text.
const SLOT_BYTES: u64 = 32;

/// Sprig's notion of empty: undefined, none, `""`, `0`, `false`, an empty
/// list or map.
fn is_empty(value: &Value) -> bool {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => true,
        ValueKind::Bool | ValueKind::Number => !value.is_true(),
        ValueKind::String | ValueKind::Bytes | ValueKind::Seq | ValueKind::Map => {
            value.len() == Some(0)
        }
        _ => false,
    }
}

/// `default(fallback, given)`: `given` unless it is empty, as in Sprig.
pub(crate) fn default(_state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("default", args, 1, 2)?;
    let fallback = &args[0];
    match args.get(1) {
        Some(given) if !is_empty(given) => Ok(given.clone()),
        _ => Ok(fallback.clone()),
    }
}

/// `join(sep, list)`: the items as text, `none` items skipped. A string is
/// joined as a one-item list (Sprig).
pub(crate) fn join(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("join", args, 2, 2)?;
    let sep = text(state, "join", "the separator", &args[0])?;
    let list = &args[1];
    defined(state, list)?;
    if matches!(list.kind(), ValueKind::String | ValueKind::Bytes) {
        return Ok(Value::from(text(state, "join", "the list", list)?.as_ref()));
    }
    let items = list
        .try_iter()
        .map_err(|_| fail("join", "the second argument must be a list"))?;
    let mut parts = Vec::new();
    for item in items {
        work(state, cost::NODE)?;
        if item.is_none() || item.is_undefined() {
            continue;
        }
        let part = text(state, "join", "a list item", &item)?.into_owned();
        reserve(state, (part.len() as u64).saturating_add(sep.len() as u64))?;
        parts.push(part);
    }
    Ok(Value::from(parts.join(&sep)))
}

fn key_text(state: &State, func: &str, key: &Value) -> Result<String, Error> {
    Ok(text(state, func, "a key", key)?.into_owned())
}

/// `dict("k1", v1, "k2", v2, …)`; keyword arguments (`dict(k1=v1)`) work too.
pub(crate) fn dict(state: &State, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    not_cancelled(state)?;
    let mut positional = Vec::new();
    let mut map = BTreeMap::new();
    for arg in args.0 {
        work(state, cost::NODE)?;
        let value = arg.into_value();
        if value.is_kwargs() {
            for key in value
                .try_iter()
                .map_err(|_| fail("dict", "bad keyword arguments"))?
            {
                let item = value
                    .get_item(&key)
                    .map_err(|_| fail("dict", "bad keyword arguments"))?;
                let key = key_text(state, "dict", &key)?;
                reserve(state, (key.len() as u64).saturating_add(SLOT_BYTES))?;
                map.insert(key, item);
            }
        } else {
            positional.push(value);
        }
    }
    if positional.len() % 2 != 0 {
        return Err(fail(
            "dict",
            "expects key/value pairs (an even number of arguments)",
        ));
    }
    for pair in positional.chunks(2) {
        let key = key_text(state, "dict", &pair[0])?;
        reserve(state, (key.len() as u64).saturating_add(SLOT_BYTES))?;
        map.insert(key, pair[1].clone());
    }
    Ok(Value::from(map))
}

/// The map and the key of `get`/`hasKey`, in either order: the Sprig order
/// `get(map, key)` and the piped `key | get(map)`, but also `map | get(key)`.
fn map_and_key<'a>(
    state: &State,
    func: &str,
    args: &'a [Value],
) -> Result<(&'a Value, String), Error> {
    arity(func, args, 2, 2)?;
    defined(state, &args[0])?;
    defined(state, &args[1])?;
    let (map, key) = if args[0].kind() == ValueKind::Map {
        (&args[0], &args[1])
    } else if args[1].kind() == ValueKind::Map {
        (&args[1], &args[0])
    } else {
        return Err(fail(func, "expects a map and a key"));
    };
    Ok((map, key_text(state, func, key)?))
}

/// `get(map, key)`: the value, or `""` when the key is missing (Sprig).
pub(crate) fn get(state: &State, args: &[Value]) -> Result<Value, Error> {
    let (map, key) = map_and_key(state, "get", args)?;
    match map.get_item(&Value::from(key)) {
        Ok(value) if !value.is_undefined() => Ok(value),
        _ => Ok(Value::from("")),
    }
}

/// `hasKey(map, key)`.
pub(crate) fn has_key(state: &State, args: &[Value]) -> Result<Value, Error> {
    let (map, key) = map_and_key(state, "hasKey", args)?;
    Ok(Value::from(
        map.get_item(&Value::from(key))
            .is_ok_and(|v| !v.is_undefined()),
    ))
}

/// `keys(map, …)`: the keys of every map given, sorted (Sprig leaves them in
/// random order; sorted keeps the output stable).
pub(crate) fn keys(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("keys", args, 1, usize::MAX)?;
    let mut all = Vec::new();
    for map in args {
        defined(state, map)?;
        if map.kind() != ValueKind::Map {
            return Err(fail("keys", "expects maps"));
        }
        for key in map.try_iter().map_err(|_| fail("keys", "expects maps"))? {
            let key = key_text(state, "keys", &key)?;
            reserve(state, (key.len() as u64).saturating_add(SLOT_BYTES))?;
            all.push(key);
        }
    }
    work(state, cost::nodes(all.len() as u64))?;
    all.sort();
    Ok(Value::from_iter(all))
}
