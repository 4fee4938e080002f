//! The part of Go's `fmt` package templates use: `%v` printing of every
//! value (what `{{ x }}` writes), `print`, `println`, and `printf` with the
//! common verbs (`%v %+v %s %q %d %x %X %o %O %b %c %U %e %E %f %F %g %G %t
//! %T %%`), flags (`+ - # 0` and space), width and precision, and Go's
//! error notations (`%!d(string=x)`, `%!d(MISSING)`, `%!(EXTRA …)`).
//!
//! Floats are written as Go writes them: `%v` is the shortest
//! representation that round-trips, in exponent form from 1e+21 or below
//! 1e-4 (`1e+06`, `1.5`, `1e-05`).
//!
//! Everything is written into a [`Sink`], which refuses to grow past its
//! limit (the output limit, or the bytes the fuel left can pay for) and
//! counts the nodes of the values it prints, so printing a list that holds
//! a long string many times, or another list many times, stops as soon as
//! the limit is reached instead of building the whole text first.

use super::value::{IntTy, V};

/// Deepest nesting printed (a map that holds itself cannot be built, but a
/// list can be nested very deep).
const MAX_DEPTH: usize = 1000;

/// Printing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrintError {
    /// The value is nested too deep.
    TooDeep,
    /// The text reached the sink's limit (bytes or nodes).
    Full,
}

type R = Result<(), PrintError>;

/// A byte buffer that refuses to grow past a limit, and counts the nodes
/// printed into it.
pub(crate) struct Sink {
    buf: Vec<u8>,
    limit: usize,
    nodes: u64,
    node_limit: u64,
}

impl Sink {
    /// A sink of at most `limit` bytes and `node_limit` nodes.
    pub(crate) fn new(limit: u64, node_limit: u64) -> Sink {
        Sink {
            buf: Vec::new(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            nodes: 0,
            node_limit,
        }
    }

    /// A sink without limits, for text whose size was reserved already.
    pub(crate) fn unbounded() -> Sink {
        Sink::new(u64::MAX, u64::MAX)
    }

    /// Bytes written.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Nodes printed.
    pub(crate) fn nodes(&self) -> u64 {
        self.nodes
    }

    /// The bytes written.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// Whether `n` more bytes fit.
    pub(crate) fn room(&self, n: usize) -> R {
        if n > self.limit - self.buf.len() {
            return Err(PrintError::Full);
        }
        Ok(())
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) -> R {
        self.room(bytes.len())?;
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    pub(crate) fn byte(&mut self, b: u8) -> R {
        self.put(&[b])
    }

    pub(crate) fn fill(&mut self, b: u8, n: usize) -> R {
        self.room(n)?;
        self.buf.extend(std::iter::repeat_n(b, n));
        Ok(())
    }

    /// Inserts `n` bytes `b` at `at` (padding before text already written).
    fn insert_fill(&mut self, at: usize, b: u8, n: usize) -> R {
        self.room(n)?;
        self.buf.splice(at..at, std::iter::repeat_n(b, n));
        Ok(())
    }

    /// Counts one node.
    pub(crate) fn node(&mut self) -> R {
        self.nodes += 1;
        if self.nodes > self.node_limit {
            return Err(PrintError::Full);
        }
        Ok(())
    }
}

/// A parsed `%` directive.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spec {
    minus: bool,
    plus: bool,
    sharp: bool,
    space: bool,
    zero: bool,
    plus_v: bool,
    width: Option<usize>,
    prec: Option<usize>,
    verb: char,
}

impl Spec {
    fn plain(verb: char) -> Spec {
        Spec {
            verb,
            ..Spec::default()
        }
    }
}

/// Writes what `{{ value }}` writes.
pub(crate) fn print_action(out: &mut Sink, value: &V) -> R {
    match value {
        V::Nil => out.put(b"<no value>"),
        v => fmt_value(out, v, Spec::plain('v'), 0),
    }
}

/// `%v` of a value, as a string (for Sprig's `strval`, `toString`, …).
pub(crate) fn sprint_one(out: &mut Sink, value: &V) -> R {
    match value {
        V::Str(s) => out.put(s.as_bytes()),
        V::Bytes(b) => out.put(b),
        V::Nil => out.put(b"<nil>"),
        v => fmt_value(out, v, Spec::plain('v'), 0),
    }
}

/// `fmt.Sprint`: spaces between operands when neither is a string.
pub(crate) fn sprint(out: &mut Sink, args: &[V]) -> R {
    let mut prev_string = false;
    for (i, arg) in args.iter().enumerate() {
        let is_string = arg.is_string();
        if i > 0 && !is_string && !prev_string {
            out.byte(b' ')?;
        }
        fmt_arg(out, arg, Spec::plain('v'))?;
        prev_string = is_string;
    }
    Ok(())
}

/// `fmt.Sprintln`: spaces between all operands, a newline at the end.
pub(crate) fn sprintln(out: &mut Sink, args: &[V]) -> R {
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            out.byte(b' ')?;
        }
        fmt_arg(out, arg, Spec::plain('v'))?;
    }
    out.byte(b'\n')
}

/// An argument of print/printf (nil prints as `<nil>`, not `<no value>`).
fn fmt_arg(out: &mut Sink, arg: &V, spec: Spec) -> R {
    match arg {
        V::Nil => match spec.verb {
            'v' | 'T' => padded(out, spec, false, |out| out.put(b"<nil>")),
            verb => out.put(format!("%!{verb}(<nil>)").as_bytes()),
        },
        v => fmt_value(out, v, spec, 0),
    }
}

/// `fmt.Sprintf`.
pub(crate) fn sprintf(out: &mut Sink, format: &[u8], args: &[V]) -> R {
    let mut next = 0;
    let mut i = 0;
    while i < format.len() {
        let c = format[i];
        if c != b'%' {
            let start = i;
            while i < format.len() && format[i] != b'%' {
                i += 1;
            }
            out.put(&format[start..i])?;
            continue;
        }
        i += 1;
        let mut spec = Spec::default();
        while i < format.len() {
            match format[i] {
                b'-' => {
                    spec.minus = true;
                    spec.zero = false;
                }
                b'+' => spec.plus = true,
                b'#' => spec.sharp = true,
                b' ' => spec.space = true,
                b'0' => spec.zero = !spec.minus,
                _ => break,
            }
            i += 1;
        }
        let mut width = None;
        while i < format.len() && format[i].is_ascii_digit() {
            width = Some(
                width
                    .unwrap_or(0usize)
                    .saturating_mul(10)
                    .saturating_add((format[i] - b'0') as usize),
            );
            i += 1;
        }
        spec.width = width.map(|w| w.min(1 << 20));
        if i < format.len() && format[i] == b'.' {
            i += 1;
            let mut prec = 0usize;
            while i < format.len() && format[i].is_ascii_digit() {
                prec = prec
                    .saturating_mul(10)
                    .saturating_add((format[i] - b'0') as usize);
                i += 1;
            }
            spec.prec = Some(prec.min(1 << 20));
        }
        if i >= format.len() {
            out.put(b"%!(NOVERB)")?;
            break;
        }
        let verb = match std::str::from_utf8(&format[i..]) {
            Ok(rest) => rest.chars().next().unwrap_or('?'),
            Err(e) => std::str::from_utf8(&format[i..i + e.valid_up_to()])
                .ok()
                .and_then(|s| s.chars().next())
                .unwrap_or('\u{FFFD}'),
        };
        i += verb.len_utf8().max(1);
        if verb == '%' {
            out.byte(b'%')?;
            continue;
        }
        spec.verb = verb;
        if verb == 'v' && spec.plus {
            // `%+v`: field names, not a sign.
            spec.plus = false;
            spec.plus_v = true;
        }
        match args.get(next) {
            None => out.put(format!("%!{verb}(MISSING)").as_bytes())?,
            Some(arg) => {
                next += 1;
                if verb == 'T' {
                    padded(out, spec, false, |out| out.put(arg.type_name().as_bytes()))?;
                } else {
                    fmt_arg(out, arg, spec)?;
                }
            }
        }
    }
    if next < args.len() {
        out.put(b"%!(EXTRA ")?;
        for (n, arg) in args[next..].iter().enumerate() {
            if n > 0 {
                out.put(b", ")?;
            }
            if let V::Nil = arg {
                out.put(b"<nil>")?;
            } else {
                out.put(arg.type_name().as_bytes())?;
                out.byte(b'=')?;
                fmt_value(out, arg, Spec::plain('v'), 0)?;
            }
        }
        out.byte(b')')?;
    }
    Ok(())
}

/// Writes the text `body` writes, padded to the width. `number` puts zero
/// padding after the sign. The text is written first and the padding
/// inserted before it, so no copy of the text is made.
fn padded(out: &mut Sink, spec: Spec, number: bool, body: impl FnOnce(&mut Sink) -> R) -> R {
    let start = out.len();
    body(out)?;
    let width = spec.width.unwrap_or(0);
    if width == 0 {
        return Ok(());
    }
    let len = String::from_utf8_lossy(&out.buf[start..]).chars().count();
    if len >= width {
        return Ok(());
    }
    let fill = width - len;
    if spec.minus {
        out.fill(b' ', fill)
    } else if spec.zero {
        let signed = number && matches!(out.buf.get(start), Some(b'+' | b'-' | b' '));
        out.insert_fill(start + usize::from(signed), b'0', fill)
    } else {
        out.insert_fill(start, b' ', fill)
    }
}

/// `%!d(string=x)`: the value printed with `%v` and the directive's flags.
fn bad_verb(out: &mut Sink, value: &V, spec: Spec, depth: usize) -> R {
    out.put(format!("%!{}(", spec.verb).as_bytes())?;
    out.put(value.type_name().as_bytes())?;
    out.byte(b'=')?;
    fmt_value(out, value, Spec { verb: 'v', ..spec }, depth + 1)?;
    out.byte(b')')
}

/// Formats one value with a verb.
pub(crate) fn fmt_value(out: &mut Sink, value: &V, spec: Spec, depth: usize) -> R {
    if depth > MAX_DEPTH {
        return Err(PrintError::TooDeep);
    }
    out.node()?;
    match value {
        // Inside a list or map: `<nil>` whatever the verb.
        V::Nil => padded(out, spec, false, |out| out.put(b"<nil>"))?,
        V::Bool(b) => match spec.verb {
            'v' | 't' => padded(out, spec, false, |out| {
                out.put(if *b { b"true" } else { b"false" })
            })?,
            _ => bad_verb(out, value, spec, depth)?,
        },
        V::Int(n, ty) => fmt_int(out, value, *n, *ty, spec, depth)?,
        V::Float(f) => fmt_float(out, value, *f, spec, depth)?,
        V::Str(_) | V::Bytes(_) => {
            let bytes = value.as_bytes().unwrap_or_default();
            fmt_string(out, value, bytes, spec, depth)?;
        }
        V::List(items, _) => {
            out.byte(b'[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.byte(b' ')?;
                }
                fmt_value(out, item, spec, depth + 1)?;
            }
            out.byte(b']')?;
        }
        V::Map(map, _) => {
            out.put(b"map[")?;
            let map = map.borrow();
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.byte(b' ')?;
                }
                fmt_value(out, &V::str(k.as_str()), spec, depth + 1)?;
                out.byte(b':')?;
                fmt_value(out, v, spec, depth + 1)?;
            }
            out.byte(b']')?;
        }
        V::Secret(s) => {
            out.byte(b'{')?;
            if spec.plus_v && spec.verb == 'v' {
                out.put(b"Value:")?;
            }
            fmt_value(out, &s.value, spec, depth + 1)?;
            out.byte(b' ')?;
            if spec.plus_v && spec.verb == 'v' {
                out.put(b"SecretPath:")?;
            }
            fmt_value(out, &V::Str(s.path.clone()), spec, depth + 1)?;
            out.byte(b'}')?;
        }
    }
    Ok(())
}

fn fmt_string(out: &mut Sink, value: &V, bytes: &[u8], spec: Spec, depth: usize) -> R {
    let text = match spec.prec {
        Some(p) => truncate_runes(bytes, p),
        None => bytes,
    };
    match spec.verb {
        'v' | 's' => padded(out, spec, false, |out| out.put(text)),
        'q' => padded(out, spec, false, |out| {
            if spec.sharp && can_backquote(text) {
                out.byte(b'`')?;
                out.put(text)?;
                out.byte(b'`')
            } else {
                quote_into(out, text, spec.plus)
            }
        }),
        'x' | 'X' => padded(out, spec, false, |out| hex_into(out, bytes, spec)),
        _ => bad_verb(out, value, spec, depth),
    }
}

/// `%x` of a string: two digits per byte, with the flags' spaces and
/// prefixes.
fn hex_into(out: &mut Sink, bytes: &[u8], spec: Spec) -> R {
    const LOWER: &[u8; 16] = b"0123456789abcdef";
    const UPPER: &[u8; 16] = b"0123456789ABCDEF";
    let upper = spec.verb == 'X';
    let digits = if upper { UPPER } else { LOWER };
    for (i, b) in bytes.iter().enumerate() {
        if spec.space && i > 0 {
            out.byte(b' ')?;
        }
        if spec.sharp && (spec.space || i == 0) {
            out.put(if upper { b"0X" } else { b"0x" })?;
        }
        out.put(&[digits[(b >> 4) as usize], digits[(b & 15) as usize]])?;
    }
    Ok(())
}

fn truncate_runes(bytes: &[u8], n: usize) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Ok(s) => match s.char_indices().nth(n) {
            Some((at, _)) => &bytes[..at],
            None => bytes,
        },
        Err(_) => &bytes[..n.min(bytes.len())],
    }
}

fn can_backquote(bytes: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(bytes) else {
        return false;
    };
    s.chars()
        .all(|c| c != '`' && c != '\u{FEFF}' && (c == '\t' || !(c as u32 <= 0x1f || c == '\u{7f}')))
}

/// Whether Go's `strconv.IsPrint` holds (approximated for the format
/// characters; letters, marks, numbers, punctuation and symbols print).
pub(crate) fn is_print(c: char) -> bool {
    let n = c as u32;
    if n < 0x20 || (0x7f..0xa0).contains(&n) {
        return false;
    }
    if c == ' ' {
        return true;
    }
    if c.is_whitespace() {
        return false;
    }
    !matches!(n,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x180E | 0x200B..=0x200F
        | 0x2028..=0x202E | 0x2060..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB
        | 0xE000..=0xF8FF | 0xFFFE | 0xFFFF | 0xF0000..)
}

/// Most bytes one byte of input becomes in [`quote_bytes`] (`\x01`).
pub(crate) const QUOTE_GROWTH: u64 = 4;

/// Go's `strconv.Quote` (`ascii`: `QuoteToASCII`). The caller reserves
/// [`QUOTE_GROWTH`] bytes per input byte (and 2) first.
pub(crate) fn quote_bytes(bytes: &[u8], ascii: bool) -> String {
    let mut out = Sink::unbounded();
    // An unbounded sink never refuses bytes.
    let _ = quote_into(&mut out, bytes, ascii);
    String::from_utf8(out.into_bytes()).unwrap_or_default()
}

/// [`quote_bytes`] into a sink. Runs of characters that need no escape
/// are copied at once.
fn quote_into(out: &mut Sink, bytes: &[u8], ascii: bool) -> R {
    out.byte(b'"')?;
    let plain = |c: char| {
        c != '"'
            && c != '\\'
            && if ascii {
                c.is_ascii() && is_print(c)
            } else {
                is_print(c)
            }
    };
    let mut esc = String::new();
    for chunk in bytes.utf8_chunks() {
        let text = chunk.valid();
        let mut run = 0;
        for (at, c) in text.char_indices() {
            if plain(c) {
                continue;
            }
            out.put(&text.as_bytes()[run..at])?;
            run = at + c.len_utf8();
            esc.clear();
            quote_char(&mut esc, c, '"', ascii);
            out.put(esc.as_bytes())?;
        }
        out.put(&text.as_bytes()[run..])?;
        for b in chunk.invalid() {
            out.put(format!("\\x{b:02x}").as_bytes())?;
        }
    }
    out.byte(b'"')
}

fn quote_char(out: &mut String, c: char, quote: char, ascii: bool) {
    match c {
        c if c == quote || c == '\\' => {
            out.push('\\');
            out.push(c);
        }
        '\u{07}' => out.push_str("\\a"),
        '\u{08}' => out.push_str("\\b"),
        '\u{0C}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{0B}' => out.push_str("\\v"),
        c if (ascii && c.is_ascii() && is_print(c)) || (!ascii && is_print(c)) => out.push(c),
        c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push_str(&format!("\\U{:08x}", c as u32)),
    }
}

fn fmt_int(out: &mut Sink, value: &V, n: i64, ty: IntTy, spec: Spec, depth: usize) -> R {
    let unsigned = ty == IntTy::Uint8;
    let negative = n < 0 && !unsigned;
    let magnitude = n.unsigned_abs();
    let digits = match spec.verb {
        'v' | 'd' => magnitude.to_string(),
        'b' => format!("{magnitude:b}"),
        'o' | 'O' => format!("{magnitude:o}"),
        'x' => format!("{magnitude:x}"),
        'X' => format!("{magnitude:X}"),
        'c' => {
            let c = u32::try_from(n)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            return padded(out, spec, false, |out| out.put(c.to_string().as_bytes()));
        }
        'q' => {
            let c = u32::try_from(n)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            let mut q = String::from("'");
            quote_char(&mut q, c, '\'', spec.plus);
            q.push('\'');
            return padded(out, spec, false, |out| out.put(q.as_bytes()));
        }
        'U' => {
            let mut s = format!("U+{:04X}", n as u64);
            if spec.sharp
                && let Some(c) = u32::try_from(n).ok().and_then(char::from_u32)
                && is_print(c)
            {
                s.push_str(&format!(" '{c}'"));
            }
            return padded(out, spec, false, |out| out.put(s.as_bytes()));
        }
        _ => return bad_verb(out, value, spec, depth),
    };
    // Precision: at least that many digits (zeros in front), none for 0
    // with a precision of 0.
    let (digits, zeros) = match spec.prec {
        Some(0) if magnitude == 0 => (String::new(), 0),
        Some(p) if digits.len() < p => {
            let zeros = p - digits.len();
            (digits, zeros)
        }
        _ => (digits, 0),
    };
    let mut prefix = String::new();
    if negative {
        prefix.push('-');
    } else if spec.plus {
        prefix.push('+');
    } else if spec.space {
        prefix.push(' ');
    }
    if spec.sharp {
        match spec.verb {
            'b' => prefix.push_str("0b"),
            'o' if zeros == 0 && !digits.starts_with('0') => prefix.push('0'),
            'x' => prefix.push_str("0x"),
            'X' => prefix.push_str("0X"),
            _ => {}
        }
    }
    if spec.verb == 'O' {
        prefix.push_str("0o");
    }
    let spec = if spec.prec.is_some() {
        Spec {
            zero: false,
            ..spec
        }
    } else {
        spec
    };
    padded(out, spec, true, |out| {
        out.put(prefix.as_bytes())?;
        out.fill(b'0', zeros)?;
        out.put(digits.as_bytes())
    })
}

/// Shortest decimal digits of `f` (positive, finite, non-zero) and the
/// position of the decimal point: `f = 0.DIGITS × 10^dp`.
fn shortest_digits(f: f64) -> (String, i32) {
    let s = format!("{f:e}");
    digits_of(&s)
}

/// Digits rounded to `n` significant digits, trailing zeros removed.
fn rounded_digits(f: f64, n: usize) -> (String, i32) {
    let s = format!("{:.*e}", n.saturating_sub(1), f);
    let (d, dp) = digits_of(&s);
    let trimmed = d.trim_end_matches('0');
    let trimmed = if trimmed.is_empty() { "0" } else { trimmed };
    (trimmed.to_owned(), dp)
}

fn digits_of(sci: &str) -> (String, i32) {
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    (digits, exp + 1)
}

/// `%e` from digits: `d.ddde±XX` with `prec` digits after the point.
fn format_e(digits: &str, dp: i32, prec: usize, upper: bool) -> String {
    let mut s = String::new();
    let mut chars = digits.chars();
    s.push(chars.next().unwrap_or('0'));
    if prec > 0 {
        s.push('.');
        let rest: String = chars.collect();
        s.push_str(&rest);
        for _ in rest.len()..prec {
            s.push('0');
        }
    }
    let exp = if digits == "0" { 0 } else { dp - 1 };
    s.push(if upper { 'E' } else { 'e' });
    s.push(if exp < 0 { '-' } else { '+' });
    let e = exp.unsigned_abs();
    if e < 10 {
        s.push('0');
    }
    s.push_str(&e.to_string());
    s
}

/// `%f` from digits with `prec` digits after the point.
fn format_f(digits: &str, dp: i32, prec: usize) -> String {
    let mut s = String::new();
    if dp <= 0 {
        s.push('0');
    } else {
        let dp = dp as usize;
        for i in 0..dp {
            s.push(digits.as_bytes().get(i).map_or('0', |b| *b as char));
        }
    }
    if prec > 0 {
        s.push('.');
        for i in 0..prec {
            let pos = dp + i as i32;
            let c = if pos < 0 {
                '0'
            } else {
                digits
                    .as_bytes()
                    .get(pos as usize)
                    .map_or('0', |b| *b as char)
            };
            s.push(c);
        }
    }
    s
}

/// Go's `strconv.FormatFloat(f, 'g', prec, 64)` for a positive finite `f`
/// (`prec` None = shortest).
fn format_g(f: f64, prec: Option<usize>, upper: bool) -> String {
    if f == 0.0 {
        return match prec {
            Some(p) if p > 1 => "0".to_owned(),
            _ => "0".to_owned(),
        };
    }
    let (digits, dp) = match prec {
        None => shortest_digits(f),
        Some(p) => rounded_digits(f, p.max(1)),
    };
    let nd = digits.len() as i32;
    let mut eprec = prec.map_or(6, |p| p.max(1) as i32);
    if prec.is_some() && eprec > nd && nd >= dp {
        eprec = nd;
    }
    if prec.is_none() {
        eprec = 6;
    }
    let exp = dp - 1;
    if exp < -4 || exp >= eprec {
        format_e(&digits, dp, (nd - 1).max(0) as usize, upper)
    } else {
        format_f(&digits, dp, (nd - dp).max(0) as usize)
    }
}

/// Go's `%v` of a float64.
pub(crate) fn float_v(f: f64) -> String {
    float_text(f, Spec::plain('v')).unwrap_or_default()
}

fn float_text(f: f64, spec: Spec) -> Option<String> {
    let body = if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        "Inf".to_owned()
    } else {
        let a = f.abs();
        match spec.verb {
            'v' | 'g' | 'G' => format_g(a, spec.prec, spec.verb == 'G'),
            'e' | 'E' => {
                let p = spec.prec.unwrap_or(6);
                let (d, dp) = if a == 0.0 {
                    ("0".to_owned(), 1)
                } else {
                    let s = format!("{:.*e}", p, a);
                    digits_of(&s)
                };
                format_e(&d, dp, p, spec.verb == 'E')
            }
            'f' | 'F' => format!("{:.*}", spec.prec.unwrap_or(6), a),
            'x' | 'X' if spec.prec.is_none() => hex_float(a, spec.verb == 'X'),
            'b' if spec.prec.is_none() => binary_float(a),
            _ => return None,
        }
    };
    let body = if spec.sharp && spec.verb != 'b' && f.is_finite() {
        sharp_float(body, spec)
    } else {
        body
    };
    let negative = f.is_sign_negative() && !f.is_nan();
    let mut s = String::new();
    if negative {
        s.push('-');
    } else if spec.plus || f.is_infinite() {
        s.push('+');
    } else if spec.space {
        s.push(' ');
    }
    s.push_str(&body);
    Some(s)
}

/// The `#` flag on a float: keep the decimal point and pad the significant
/// digits to the precision (6 by default) for `%v`, `%g`, `%x`.
fn sharp_float(body: String, spec: Spec) -> String {
    let mut digits: i64 = match spec.verb {
        'v' | 'g' | 'G' | 'x' => spec.prec.map_or(6, |p| p as i64),
        _ => 0,
    };
    let split = body
        .find(|c| {
            matches!(c, 'p' | 'P') || (matches!(c, 'e' | 'E') && !matches!(spec.verb, 'x' | 'X'))
        })
        .unwrap_or(body.len());
    let (num, tail) = body.split_at(split);
    let mut num = num.to_owned();
    let mut has_point = false;
    let mut nonzero = false;
    for c in num.chars() {
        if c == '.' {
            has_point = true;
        } else {
            if c != '0' {
                nonzero = true;
            }
            if nonzero {
                digits -= 1;
            }
        }
    }
    if !has_point {
        if num == "0" {
            digits -= 1;
        }
        num.push('.');
    }
    while digits > 0 {
        num.push('0');
        digits -= 1;
    }
    num.push_str(tail);
    num
}

/// Go's `%x` of a float: `0x1.921f9f01b866ep+01` (shortest hex digits).
fn hex_float(a: f64, upper: bool) -> String {
    let bits = a.to_bits();
    let mut exp = ((bits >> 52) & 0x7ff) as i64;
    let mut mant = bits & ((1 << 52) - 1);
    if exp == 0 {
        if mant == 0 {
            return if upper {
                "0X0P+00".into()
            } else {
                "0x0p+00".into()
            };
        }
        exp = -1022;
        while mant & (1 << 52) == 0 {
            mant <<= 1;
            exp -= 1;
        }
        mant &= (1 << 52) - 1;
    } else {
        exp -= 1023;
    }
    let mut digits = format!("{mant:013x}");
    while digits.ends_with('0') {
        digits.pop();
    }
    let mut s = String::from("0x1");
    if !digits.is_empty() {
        s.push('.');
        s.push_str(&digits);
    }
    s.push('p');
    s.push(if exp < 0 { '-' } else { '+' });
    let e = exp.unsigned_abs();
    if e < 10 {
        s.push('0');
    }
    s.push_str(&e.to_string());
    if upper { s.to_uppercase() } else { s }
}

/// Go's `%b` of a float: `7074231776675438p-51`.
fn binary_float(a: f64) -> String {
    let bits = a.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    let mut mant = bits & ((1 << 52) - 1);
    let e = if exp == 0 {
        -1074
    } else {
        mant |= 1 << 52;
        exp - 1075
    };
    format!(
        "{mant}p{}{}",
        if e < 0 { '-' } else { '+' },
        e.unsigned_abs()
    )
}

fn fmt_float(out: &mut Sink, value: &V, f: f64, spec: Spec, depth: usize) -> R {
    // The text holds at least the precision's digits: refuse it before
    // building it when it cannot fit.
    out.room(spec.prec.unwrap_or(0))?;
    match float_text(f, spec) {
        Some(text) => {
            let spec = if f.is_finite() {
                spec
            } else {
                Spec {
                    zero: false,
                    ..spec
                }
            };
            padded(out, spec, true, |out| out.put(text.as_bytes()))
        }
        None => bad_verb(out, value, spec, depth),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(v: f64) -> String {
        float_v(v)
    }

    #[test]
    fn floats_print_like_go() {
        assert_eq!(f(1.0), "1");
        assert_eq!(f(1.5), "1.5");
        assert_eq!(f(1e6), "1e+06");
        assert_eq!(f(123456.0), "123456");
        assert_eq!(f(1e21), "1e+21");
        assert_eq!(f(0.00001), "1e-05");
        assert_eq!(f(0.0001), "0.0001");
        assert_eq!(f(123456789.0), "1.23456789e+08");
        assert_eq!(f(-2.5), "-2.5");
        assert_eq!(f(0.0), "0");
    }

    fn printf(format: &[u8], args: &[V]) -> String {
        let mut out = Sink::unbounded();
        sprintf(&mut out, format, args).unwrap();
        String::from_utf8(out.into_bytes()).unwrap()
    }

    #[test]
    fn printf_verbs() {
        let out = printf(
            b"%v %d %q %x %05d %s %5.2f|%-4d|%+d|%e|%g|%t",
            &[
                V::int(1),
                V::int(2),
                V::str("a"),
                V::str("hi"),
                V::int(3),
                V::str("s"),
                V::Float(1.23456),
                V::int(7),
                V::int(5),
                V::Float(1500.0),
                V::Float(0.5),
                V::Bool(true),
            ],
        );
        assert_eq!(
            out,
            "1 2 \"a\" 6869 00003 s  1.23|7   |+5|1.500000e+03|0.5|true"
        );
        assert_eq!(
            printf(b"%d %d", &[V::str("x")]),
            "%!d(string=x) %!d(MISSING)"
        );
        assert_eq!(
            printf(
                b"%-5d|%05d|%+06d|%.3d|%#o|%x",
                &[
                    V::int(7),
                    V::int(-7),
                    V::int(7),
                    V::int(7),
                    V::int(8),
                    V::str("hi")
                ]
            ),
            "7    |-0007|+00007|007|010|6869"
        );
        assert_eq!(
            printf(
                b"%8.3q|%-6s|%6s",
                &[V::str("abcdef"), V::str("ab"), V::str("ab")]
            ),
            "   \"abc\"|ab    |    ab"
        );
    }

    #[test]
    fn sinks_stop_at_their_limit() {
        let mut out = Sink::new(10, u64::MAX);
        assert_eq!(
            sprintf(&mut out, b"%20d", &[V::int(1)]),
            Err(PrintError::Full)
        );
        let mut out = Sink::new(u64::MAX, 3);
        let list = V::list(vec![V::int(1), V::int(2), V::int(3)]);
        assert_eq!(print_action(&mut out, &list), Err(PrintError::Full));
    }
}
