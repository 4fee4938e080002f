//! The values a Go template works with, modelled on what Go's reflection
//! sees in the Go operators: the data map (`map[string]SecretTemplateOptions`),
//! the secret struct (`Value`, `SecretPath`), strings, the integer and float
//! types Sprig returns, `[]interface{}`, `[]string`, `map[string]interface{}`.
//!
//! Maps are shared and mutable (Sprig's `set`, `unset` and `merge` change
//! them in place, as Go maps are references); lists are copied when changed,
//! as Sprig does.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;

/// Go integer types a template meets. They print alike but are not
/// interchangeable as function arguments (`int` is not assignable to `int64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntTy {
    /// `int` (literals, `len`, `atoi`, `int`, `until`).
    Int,
    /// `int64` (`add`, `sub`, `max`, `int64`, …).
    Int64,
    /// `uint8` (a byte of a string, from `index`).
    Uint8,
}

/// Element type of a list or a map, for Go's type names and assignability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    /// `interface{}`.
    Any,
    /// `string`.
    Str,
    /// `int` (lists of `until`).
    Int,
    /// The secret struct (the data map only).
    Secret,
}

/// One secret as the Go operators hand it to templates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Secret {
    /// `Value` (a Go string: may hold bytes that are not UTF-8).
    pub value: V,
    /// `SecretPath`.
    pub path: Rc<str>,
}

/// A shared Go map.
pub(crate) type MapRef = Rc<RefCell<BTreeMap<String, V>>>;

/// A Go value.
#[derive(Debug, Clone)]
pub(crate) enum V {
    /// `nil` (and Go's invalid value: a missing result).
    Nil,
    /// `bool`.
    Bool(bool),
    /// A signed integer (or `uint8`).
    Int(i64, IntTy),
    /// `float64`.
    Float(f64),
    /// A `string` that is valid UTF-8.
    Str(Rc<str>),
    /// A `string` holding bytes that are not UTF-8 (e.g. a decoded keystore).
    Bytes(Rc<[u8]>),
    /// A slice.
    List(Rc<Vec<V>>, Elem),
    /// A map with string keys.
    Map(MapRef, Elem),
    /// The secret struct.
    Secret(Rc<Secret>),
}

impl PartialEq for V {
    fn eq(&self, other: &V) -> bool {
        deep_equal(self, other)
    }
}

impl V {
    /// A string value.
    pub fn str(s: impl Into<Rc<str>>) -> V {
        V::Str(s.into())
    }

    /// A Go string from bytes: text when valid UTF-8.
    pub fn from_bytes(bytes: Vec<u8>) -> V {
        match String::from_utf8(bytes) {
            Ok(s) => V::Str(s.into()),
            Err(e) => V::Bytes(e.into_bytes().into()),
        }
    }

    /// An `int`.
    pub fn int(n: i64) -> V {
        V::Int(n, IntTy::Int)
    }

    /// An `int64`.
    pub fn int64(n: i64) -> V {
        V::Int(n, IntTy::Int64)
    }

    /// A `[]interface{}`.
    pub fn list(items: Vec<V>) -> V {
        V::List(Rc::new(items), Elem::Any)
    }

    /// A `[]string`.
    pub fn str_list(items: Vec<String>) -> V {
        V::List(Rc::new(items.into_iter().map(V::str).collect()), Elem::Str)
    }

    /// A new `map[string]interface{}`.
    pub fn map(map: BTreeMap<String, V>) -> V {
        V::Map(Rc::new(RefCell::new(map)), Elem::Any)
    }

    /// The bytes of a string value.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            V::Str(s) => Some(s.as_bytes()),
            V::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// Whether this is a Go string.
    pub fn is_string(&self) -> bool {
        matches!(self, V::Str(_) | V::Bytes(_))
    }

    /// Go's type name (`string`, `[]interface {}`, …).
    pub fn type_name(&self) -> &'static str {
        match self {
            V::Nil => "<nil>",
            V::Bool(_) => "bool",
            V::Int(_, IntTy::Int) => "int",
            V::Int(_, IntTy::Int64) => "int64",
            V::Int(_, IntTy::Uint8) => "uint8",
            V::Float(_) => "float64",
            V::Str(_) | V::Bytes(_) => "string",
            V::List(_, Elem::Any) => "[]interface {}",
            V::List(_, Elem::Str) => "[]string",
            V::List(_, Elem::Int) => "[]int",
            V::List(_, Elem::Secret) => "[]model.SecretTemplateOptions",
            V::Map(_, Elem::Any) => "map[string]interface {}",
            V::Map(_, Elem::Str) => "map[string]string",
            V::Map(_, Elem::Int) => "map[string]int",
            V::Map(_, Elem::Secret) => "map[string]model.SecretTemplateOptions",
            V::Secret(_) => "model.SecretTemplateOptions",
        }
    }

    /// Go's kind name (`reflect.Kind.String()`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            V::Nil => "invalid",
            V::Bool(_) => "bool",
            V::Int(_, IntTy::Int) => "int",
            V::Int(_, IntTy::Int64) => "int64",
            V::Int(_, IntTy::Uint8) => "uint8",
            V::Float(_) => "float64",
            V::Str(_) | V::Bytes(_) => "string",
            V::List(..) => "slice",
            V::Map(..) => "map",
            V::Secret(_) => "struct",
        }
    }

    /// Length for `len`: bytes of a string, items of a list or map.
    pub fn len(&self) -> Option<usize> {
        match self {
            V::Str(s) => Some(s.len()),
            V::Bytes(b) => Some(b.len()),
            V::List(l, _) => Some(l.len()),
            V::Map(m, _) => Some(m.borrow().len()),
            _ => None,
        }
    }

    /// Go template truth (`if`, `with`, `and`, `or`, `not`).
    pub fn truth(&self) -> bool {
        match self {
            V::Nil => false,
            V::Bool(b) => *b,
            V::Int(n, _) => *n != 0,
            V::Float(f) => *f != 0.0,
            V::Str(_) | V::Bytes(_) | V::List(..) | V::Map(..) => self.len() != Some(0),
            V::Secret(_) => true,
        }
    }

    /// Sprig's `empty`: like the template truth, negated (a struct is never
    /// empty).
    pub fn is_empty(&self) -> bool {
        !self.truth()
    }
}

/// Deepest nesting a walk of a value goes (a list can be nested very deep).
const MAX_WALK_DEPTH: usize = 10_000;

/// A walk of a value stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkError {
    /// The value is nested deeper than [`MAX_WALK_DEPTH`].
    TooDeep,
    /// The meter refused to pay for another node.
    Stopped,
}

/// Pays for one node of a walk: `false` stops the walk.
pub(crate) type Meter<'a> = &'a mut dyn FnMut() -> bool;

/// The address of a shared list or map, to remember it was seen.
fn list_addr(list: &Rc<Vec<V>>) -> usize {
    Rc::as_ptr(list) as usize
}

fn map_addr(map: &MapRef) -> usize {
    Rc::as_ptr(map) as usize
}

/// Go's `reflect.DeepEqual` on template values (types must match), every
/// node visited paid to `meter`. Pairs of shared lists or maps already
/// found equal are not compared again, so a list that holds another many
/// times costs what its distinct parts cost, not what its expansion would.
pub(crate) fn deep_equal_with(a: &V, b: &V, meter: Meter) -> Result<bool, WalkError> {
    Equal {
        meter,
        equal: HashSet::new(),
    }
    .eq(a, b, 0)
}

struct Equal<'a> {
    meter: Meter<'a>,
    equal: HashSet<(usize, usize)>,
}

impl Equal<'_> {
    fn eq(&mut self, a: &V, b: &V, depth: usize) -> Result<bool, WalkError> {
        if depth > MAX_WALK_DEPTH {
            return Err(WalkError::TooDeep);
        }
        if !(self.meter)() {
            return Err(WalkError::Stopped);
        }
        Ok(match (a, b) {
            (V::Nil, V::Nil) => true,
            (V::Bool(x), V::Bool(y)) => x == y,
            (V::Int(x, tx), V::Int(y, ty)) => tx == ty && x == y,
            (V::Float(x), V::Float(y)) => x == y,
            (V::Str(_) | V::Bytes(_), V::Str(_) | V::Bytes(_)) => a.as_bytes() == b.as_bytes(),
            (V::List(x, ex), V::List(y, ey)) => {
                if ex != ey || x.len() != y.len() {
                    return Ok(false);
                }
                // Go: the same slice is equal to itself.
                let pair = (list_addr(x), list_addr(y));
                if Rc::ptr_eq(x, y) || self.equal.contains(&pair) {
                    return Ok(true);
                }
                for (p, q) in x.iter().zip(y.iter()) {
                    if !self.eq(p, q, depth + 1)? {
                        return Ok(false);
                    }
                }
                self.equal.insert(pair);
                true
            }
            (V::Map(x, ex), V::Map(y, ey)) => {
                let pair = (map_addr(x), map_addr(y));
                if Rc::ptr_eq(x, y) || self.equal.contains(&pair) {
                    return Ok(true);
                }
                let (xm, ym) = (x.borrow(), y.borrow());
                if ex != ey || xm.len() != ym.len() {
                    return Ok(false);
                }
                for ((k1, v1), (k2, v2)) in xm.iter().zip(ym.iter()) {
                    if k1 != k2 || !self.eq(v1, v2, depth + 1)? {
                        return Ok(false);
                    }
                }
                self.equal.insert(pair);
                true
            }
            (V::Secret(x), V::Secret(y)) => x == y,
            _ => false,
        })
    }
}

/// Go's `reflect.DeepEqual`, unmetered (values too deep are unequal).
pub(crate) fn deep_equal(a: &V, b: &V) -> bool {
    deep_equal_with(a, b, &mut || true).unwrap_or(false)
}

/// Whether `value` holds the map `target` (so storing it there would make a
/// cycle), every node visited paid to `meter`. Each shared list or map is
/// visited once.
pub(crate) fn holds_map(value: &V, target: &MapRef, meter: Meter) -> Result<bool, WalkError> {
    Holds {
        meter,
        seen: HashSet::new(),
        target,
    }
    .holds(value, 0)
}

struct Holds<'a, 't> {
    meter: Meter<'a>,
    seen: HashSet<usize>,
    target: &'t MapRef,
}

impl Holds<'_, '_> {
    fn holds(&mut self, value: &V, depth: usize) -> Result<bool, WalkError> {
        if depth > MAX_WALK_DEPTH {
            return Err(WalkError::TooDeep);
        }
        if !(self.meter)() {
            return Err(WalkError::Stopped);
        }
        match value {
            V::Map(m, _) => {
                if Rc::ptr_eq(m, self.target) {
                    return Ok(true);
                }
                if !self.seen.insert(map_addr(m)) {
                    return Ok(false);
                }
                for v in m.borrow().values() {
                    if self.holds(v, depth + 1)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            V::List(l, _) => {
                if !self.seen.insert(list_addr(l)) {
                    return Ok(false);
                }
                for v in l.iter() {
                    if self.holds(v, depth + 1)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list that holds the one before twice, `depth` times: 2^depth
    /// nodes when expanded, `depth` distinct lists.
    fn doubling(depth: usize) -> V {
        let mut v = V::list(vec![V::str("x")]);
        for _ in 0..depth {
            v = V::list(vec![v.clone(), v]);
        }
        v
    }

    #[test]
    fn shared_lists_are_walked_once() {
        let a = doubling(60);
        let b = doubling(60);
        let mut nodes = 0u64;
        let mut meter = || {
            nodes += 1;
            true
        };
        assert_eq!(deep_equal_with(&a, &b, &mut meter), Ok(true));
        assert!(nodes < 1_000, "{nodes} nodes");
        let map = Rc::new(RefCell::new(BTreeMap::new()));
        let mut nodes = 0u64;
        let mut meter = || {
            nodes += 1;
            true
        };
        assert_eq!(holds_map(&a, &map, &mut meter), Ok(false));
        assert!(nodes < 1_000, "{nodes} nodes");
    }

    #[test]
    fn a_meter_stops_the_walk() {
        let a = doubling(10);
        let mut left = 5;
        let mut meter = || {
            left -= 1;
            left > 0
        };
        assert_eq!(
            deep_equal_with(&a, &doubling(10), &mut meter),
            Err(WalkError::Stopped)
        );
        assert!(!deep_equal(&a, &doubling(9)));
        assert!(deep_equal(
            &V::list(vec![V::int(1)]),
            &V::list(vec![V::int(1)])
        ));
    }
}
