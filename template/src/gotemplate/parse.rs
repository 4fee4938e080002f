//! Lexer and parser of Go's `text/template` language, following the
//! grammar of Go's `text/template/parse` package: text and `{{ }}` actions,
//! trim markers (`{{- ` and ` -}}`), comments (`{{/* */}}`), pipelines,
//! variables (`$x := …`, `$x = …`), `if`/`else if`/`with`/`else with`/
//! `range` (with `break`/`continue`)/`define`/`template`/`block`, and
//! literals (strings, raw strings, characters, numbers in every Go base,
//! booleans, `nil`).
//!
//! As in Go, every function name is checked when the template is parsed, and
//! variables must be declared before use.

use std::collections::BTreeMap;

use super::value::V;

/// A parse error: byte offset and message.
#[derive(Debug)]
pub(crate) struct ParseError {
    pub pos: usize,
    pub message: String,
}

type PResult<T> = Result<T, ParseError>;

fn err<T>(pos: usize, message: impl Into<String>) -> PResult<T> {
    Err(ParseError {
        pos,
        message: message.into(),
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Text(String),
    Left,
    Right,
    Space,
    Pipe,
    Assign,
    Declare,
    Char(char),
    LParen,
    RParen,
    Str(V),
    CharConst(String),
    Number(String),
    Bool(bool),
    Nil,
    Dot,
    Field(String),
    Var(String),
    Ident(String),
    Kw(&'static str),
    Eof,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    pos: usize,
}

const KEYWORDS: &[&str] = &[
    "block", "break", "continue", "define", "else", "end", "if", "range", "template", "with",
];

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_alnum(c: char) -> bool {
    c == '_' || c.is_alphabetic() || c.is_numeric()
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    tokens: Vec<Token>,
}

impl Lexer<'_> {
    fn rest(&self) -> &str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn push(&mut self, tok: Tok, pos: usize) {
        self.tokens.push(Token { tok, pos });
    }

    /// At a right delimiter: `Some(trim)`.
    fn at_right(&self) -> Option<bool> {
        let r = self.rest().as_bytes();
        if r.len() >= 4 && is_space(r[0]) && r[1] == b'-' && &r[2..4] == b"}}" {
            return Some(true);
        }
        r.starts_with(b"}}").then_some(false)
    }

    fn after_right(&mut self, trim: bool) {
        self.pos += if trim { 4 } else { 2 };
        if trim {
            let skip = self.rest().bytes().take_while(|b| is_space(*b)).count();
            self.pos += skip;
        }
    }

    fn at_terminator(&self) -> bool {
        match self.peek() {
            None => true,
            Some(c) if c.is_ascii() && is_space(c as u8) => true,
            Some('.' | ',' | '|' | ':' | ')' | '(') => true,
            _ => self.rest().starts_with("}}"),
        }
    }

    fn lex(mut self) -> PResult<Vec<Token>> {
        loop {
            let Some(open) = self.rest().find("{{") else {
                if !self.rest().is_empty() {
                    let text = self.rest().to_owned();
                    self.push(Tok::Text(text), self.pos);
                }
                let end = self.src.len();
                self.push(Tok::Eof, end);
                return Ok(self.tokens);
            };
            let at = self.pos + open;
            let after = at + 2;
            let a = self.src.as_bytes();
            let trim = a.len() > after + 1 && a[after] == b'-' && is_space(a[after + 1]);
            let mut text = &self.src[self.pos..at];
            if trim {
                text = text.trim_end_matches([' ', '\t', '\r', '\n']);
            }
            if !text.is_empty() {
                self.push(Tok::Text(text.to_owned()), self.pos);
            }
            self.pos = after + if trim { 2 } else { 0 };
            if self.rest().starts_with("/*") {
                let Some(end) = self.rest()[2..].find("*/") else {
                    return err(at, "unclosed comment");
                };
                self.pos += 2 + end + 2;
                let Some(trim) = self.at_right() else {
                    return err(at, "comment ends before closing delimiter");
                };
                self.after_right(trim);
                continue;
            }
            self.push(Tok::Left, at);
            self.inside(at)?;
        }
    }

    fn inside(&mut self, open: usize) -> PResult<()> {
        let mut parens = 0i32;
        loop {
            if let Some(trim) = self.at_right() {
                if parens > 0 {
                    return err(self.pos, "unclosed left paren");
                }
                let at = self.pos;
                self.push(Tok::Right, at);
                self.after_right(trim);
                return Ok(());
            }
            let start = self.pos;
            let Some(c) = self.peek() else {
                return err(open, "unclosed action");
            };
            match c {
                ' ' | '\t' | '\r' | '\n' => {
                    let n = self.rest().bytes().take_while(|b| is_space(*b)).count();
                    self.pos += n;
                    // A space before ` -}}` belongs to the delimiter.
                    if self.rest().starts_with("-}}") {
                        self.pos -= 1;
                        if n == 1 {
                            continue;
                        }
                    }
                    self.push(Tok::Space, start);
                }
                '=' => {
                    self.pos += 1;
                    self.push(Tok::Assign, start);
                }
                ':' => {
                    if !self.rest().starts_with(":=") {
                        return err(start, "expected :=");
                    }
                    self.pos += 2;
                    self.push(Tok::Declare, start);
                }
                '|' => {
                    self.pos += 1;
                    self.push(Tok::Pipe, start);
                }
                '"' => {
                    let end = self.scan_quoted('"', "unterminated quoted string")?;
                    let raw = &self.src[start..end];
                    let value = unquote(raw).ok_or(ParseError {
                        pos: start,
                        message: "invalid syntax in quoted string".into(),
                    })?;
                    self.pos = end;
                    self.push(Tok::Str(V::from_bytes(value)), start);
                }
                '`' => {
                    let Some(end) = self.rest()[1..].find('`') else {
                        return err(start, "unterminated raw quoted string");
                    };
                    let text = self.rest()[1..1 + end].replace('\r', "");
                    self.pos += end + 2;
                    self.push(Tok::Str(V::str(text)), start);
                }
                '\'' => {
                    let end = self.scan_quoted('\'', "unterminated character constant")?;
                    let text = self.src[start..end].to_owned();
                    self.pos = end;
                    self.push(Tok::CharConst(text), start);
                }
                '$' => {
                    self.pos += 1;
                    let name = self.field_or_var()?;
                    self.push(Tok::Var(format!("${name}")), start);
                }
                '.' => {
                    let next = self.rest().as_bytes().get(1).copied();
                    if next.is_some_and(|b| b.is_ascii_digit()) {
                        self.number()?;
                    } else {
                        self.pos += 1;
                        let name = self.field_or_var()?;
                        if name.is_empty() {
                            self.push(Tok::Dot, start);
                        } else {
                            self.push(Tok::Field(name), start);
                        }
                    }
                }
                '+' | '-' | '0'..='9' => self.number()?,
                '(' => {
                    self.pos += 1;
                    parens += 1;
                    self.push(Tok::LParen, start);
                }
                ')' => {
                    self.pos += 1;
                    parens -= 1;
                    if parens < 0 {
                        return err(start, "unexpected right paren");
                    }
                    self.push(Tok::RParen, start);
                }
                c if is_alnum(c) => {
                    let word: String = self.rest().chars().take_while(|c| is_alnum(*c)).collect();
                    self.pos += word.len();
                    if !self.at_terminator() {
                        let bad = self.peek().unwrap_or(' ');
                        return err(self.pos, format!("bad character {bad:?}"));
                    }
                    let tok = match word.as_str() {
                        "true" => Tok::Bool(true),
                        "false" => Tok::Bool(false),
                        "nil" => Tok::Nil,
                        w => match KEYWORDS.iter().find(|k| **k == w) {
                            Some(k) => Tok::Kw(k),
                            None => Tok::Ident(word),
                        },
                    };
                    self.push(tok, start);
                }
                c if c.is_ascii() && !c.is_ascii_control() => {
                    self.pos += 1;
                    self.push(Tok::Char(c), start);
                }
                c => return err(start, format!("unrecognized character in action: {c:?}")),
            }
        }
    }

    fn field_or_var(&mut self) -> PResult<String> {
        if self.at_terminator() {
            return Ok(String::new());
        }
        let word: String = self.rest().chars().take_while(|c| is_alnum(*c)).collect();
        self.pos += word.len();
        if !self.at_terminator() {
            let bad = self.peek().unwrap_or(' ');
            return err(self.pos, format!("bad character {bad:?}"));
        }
        Ok(word)
    }

    /// Scans a quoted literal starting at `self.pos`; returns the end offset.
    fn scan_quoted(&self, quote: char, unterminated: &str) -> PResult<usize> {
        let bytes = self.src.as_bytes();
        let mut i = self.pos + 1;
        loop {
            match bytes.get(i) {
                None | Some(b'\n') => return err(self.pos, unterminated),
                Some(b'\\') => {
                    if matches!(bytes.get(i + 1), None | Some(b'\n')) {
                        return err(self.pos, unterminated);
                    }
                    i += 2;
                }
                Some(b) if *b as char == quote => return Ok(i + 1),
                Some(_) => i += 1,
            }
        }
    }

    fn number(&mut self) -> PResult<()> {
        let start = self.pos;
        let b = self.src.as_bytes();
        let mut i = self.pos;
        let accept = |i: &mut usize, set: &[u8]| {
            if b.get(*i).is_some_and(|c| set.contains(c)) {
                *i += 1;
                true
            } else {
                false
            }
        };
        let run = |i: &mut usize, set: &[u8]| {
            while b.get(*i).is_some_and(|c| set.contains(c)) {
                *i += 1;
            }
        };
        accept(&mut i, b"+-");
        let mut digits: &[u8] = b"0123456789_";
        if accept(&mut i, b"0") {
            if accept(&mut i, b"xX") {
                digits = b"0123456789abcdefABCDEF_";
            } else if accept(&mut i, b"oO") {
                digits = b"01234567_";
            } else if accept(&mut i, b"bB") {
                digits = b"01_";
            }
        }
        run(&mut i, digits);
        if accept(&mut i, b".") {
            run(&mut i, digits);
        }
        if digits.len() == 11 && accept(&mut i, b"eE") {
            accept(&mut i, b"+-");
            run(&mut i, b"0123456789_");
        }
        if digits.len() == 23 && accept(&mut i, b"pP") {
            accept(&mut i, b"+-");
            run(&mut i, b"0123456789_");
        }
        accept(&mut i, b"i");
        let text = &self.src[start..i];
        if self.src[i..].chars().next().is_some_and(is_alnum) {
            let end = i + self.src[i..].chars().next().map_or(1, char::len_utf8);
            return err(
                start,
                format!("bad number syntax: {:?}", &self.src[start..end]),
            );
        }
        self.pos = i;
        self.push(Tok::Number(text.to_owned()), start);
        Ok(())
    }
}

/// Go's `strconv.Unquote` for a double-quoted literal.
fn unquote(raw: &str) -> Option<Vec<u8>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    unescape(inner, '"')
}

fn unescape(inner: &str, quote: char) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c == quote {
            return None;
        }
        if c != '\\' {
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        let e = chars.next()?;
        let simple = match e {
            'a' => Some(7u8),
            'b' => Some(8),
            'f' => Some(12),
            'n' => Some(b'\n'),
            'r' => Some(b'\r'),
            't' => Some(b'\t'),
            'v' => Some(11),
            '\\' => Some(b'\\'),
            c if c == quote => Some(c as u8),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            continue;
        }
        let hex = |chars: &mut std::iter::Peekable<std::str::Chars>, n: usize| -> Option<u32> {
            let mut v = 0u32;
            for _ in 0..n {
                v = v * 16 + chars.next()?.to_digit(16)?;
            }
            Some(v)
        };
        match e {
            'x' => out.push(hex(&mut chars, 2)? as u8),
            'u' | 'U' => {
                let c = char::from_u32(hex(&mut chars, if e == 'u' { 4 } else { 8 })?)?;
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
            '0'..='7' => {
                let mut v = e.to_digit(8)?;
                for _ in 0..2 {
                    v = v * 8 + chars.next()?.to_digit(8)?;
                }
                if v > 255 {
                    return None;
                }
                out.push(v as u8);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The value of a character constant (`'a'`, `'\n'`).
fn char_value(text: &str) -> Option<i64> {
    let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
    let bytes = unescape(inner, '\'')?;
    let s = String::from_utf8(bytes.clone()).ok();
    match s {
        Some(s) if s.chars().count() == 1 => Some(s.chars().next()? as i64),
        _ if bytes.len() == 1 => Some(bytes[0] as i64),
        _ => None,
    }
}

/// A number literal, with the types it can take.
#[derive(Debug, Clone)]
pub(crate) struct Number {
    pub text: String,
    pub int: Option<i64>,
    pub uint: bool,
    pub float: Option<f64>,
}

impl Number {
    fn parse(text: &str, pos: usize) -> PResult<Number> {
        if text.starts_with('\'') {
            let v = char_value(text).ok_or_else(|| ParseError {
                pos,
                message: format!("malformed character constant: {text}"),
            })?;
            return Ok(Number {
                text: text.to_owned(),
                int: Some(v),
                uint: v >= 0,
                float: Some(v as f64),
            });
        }
        if text.ends_with('i') {
            return err(pos, format!("complex number {text} is not supported"));
        }
        let int = parse_int(text);
        let uint = int.is_some_and(|n| n >= 0) || parse_uint(text).is_some();
        let mut number = Number {
            text: text.to_owned(),
            int,
            uint,
            float: None,
        };
        if let Some(n) = int {
            number.float = Some(n as f64);
        } else if let Some(u) = parse_uint(text) {
            number.float = Some(u as f64);
        } else if let Some(f) = parse_float(text) {
            if !text.contains(['.', 'e', 'E', 'p', 'P']) {
                return err(pos, format!("integer overflow: {text:?}"));
            }
            number.float = Some(f);
            if f.fract() == 0.0 && f.abs() < 9.2e18 {
                number.int = Some(f as i64);
                number.uint = f >= 0.0;
            }
        }
        if number.int.is_none() && !number.uint && number.float.is_none() {
            return err(pos, format!("illegal number syntax: {text:?}"));
        }
        Ok(number)
    }

    /// Whether Go would make a float64 of it where any type goes.
    pub fn is_float_literal(&self) -> bool {
        let lower = self.text.to_ascii_lowercase();
        let hex_int =
            (lower.starts_with("0x") || lower.starts_with("-0x") || lower.starts_with("+0x"))
                && !lower.contains('p');
        self.float.is_some()
            && !hex_int
            && !self.text.starts_with('\'')
            && self.text.contains(['.', 'e', 'E', 'p', 'P'])
    }
}

fn split_sign(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

/// Go's `strconv.ParseUint(s, 0, 64)` (base prefixes, underscores only
/// with a prefix… or between digits).
fn parse_uint(text: &str) -> Option<u64> {
    if text.starts_with(['+', '-']) {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d, true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d, true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    if digits.is_empty() || !underscores_ok(digits, prefixed) {
        return None;
    }
    u64::from_str_radix(&digits.replace('_', ""), radix).ok()
}

fn underscores_ok(digits: &str, prefixed: bool) -> bool {
    if !digits.contains('_') {
        return true;
    }
    // An underscore must separate digits (or follow the base prefix).
    let b = digits.as_bytes();
    if b.last() == Some(&b'_') || (!prefixed && b.first() == Some(&b'_')) {
        return false;
    }
    !digits.contains("__")
}

fn parse_int(text: &str) -> Option<i64> {
    let (neg, rest) = split_sign(text);
    let u = parse_uint(rest)?;
    if neg {
        if u <= i64::MAX as u64 + 1 {
            Some((u as i128).wrapping_neg() as i64)
        } else {
            None
        }
    } else {
        i64::try_from(u).ok()
    }
}

fn parse_float(text: &str) -> Option<f64> {
    let (neg, rest) = split_sign(text);
    let lower = rest.to_ascii_lowercase();
    if let Some(hex) = lower.strip_prefix("0x") {
        // Hex float: 0xMANT.FRACpEXP.
        let body = hex.replace('_', "");
        let (mant, exp) = body.split_once('p')?;
        let exp: i32 = exp.parse().ok()?;
        let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
        let mut v = 0f64;
        for d in int.chars().chain(frac.chars()) {
            v = v * 16.0 + d.to_digit(16)? as f64;
        }
        v *= 2f64.powi(exp - 4 * frac.len() as i32);
        return Some(if neg { -v } else { v });
    }
    if !underscores_ok(&lower, false) || lower.contains(['x', 'o', 'b']) {
        return None;
    }
    let cleaned = lower.replace('_', "");
    if cleaned.is_empty()
        || cleaned == "."
        || cleaned.starts_with("inf")
        || cleaned.starts_with("nan")
    {
        return None;
    }
    let v: f64 = cleaned.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// An operand of a command.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    /// `.`
    Dot,
    /// `nil`
    Nil,
    /// `true`, `false`
    Bool(bool),
    /// A number or character constant.
    Number(Number),
    /// A string literal.
    Str(V),
    /// `.A.B`
    Field(Vec<String>),
    /// `$x.A.B` (name with its `$`, then fields)
    Var(String, Vec<String>),
    /// A function name.
    Ident(String),
    /// `( pipeline )`
    Pipe(Box<Pipe>),
    /// `(…).A.B`, `fn.A`
    Chain(Box<Arg>, Vec<String>),
}

impl Arg {
    /// How the operand reads in the template (for messages).
    pub fn describe(&self) -> String {
        match self {
            Arg::Dot => ".".into(),
            Arg::Nil => "nil".into(),
            Arg::Bool(b) => b.to_string(),
            Arg::Number(n) => n.text.clone(),
            Arg::Str(_) => "a string".into(),
            Arg::Field(f) => format!(".{}", f.join(".")),
            Arg::Var(v, f) if f.is_empty() => v.clone(),
            Arg::Var(v, f) => format!("{v}.{}", f.join(".")),
            Arg::Ident(i) => i.clone(),
            Arg::Pipe(_) => "(…)".into(),
            Arg::Chain(a, f) => format!("{}.{}", a.describe(), f.join(".")),
        }
    }
}

/// One command of a pipeline: a function and its arguments, or a value.
#[derive(Debug, Clone)]
pub(crate) struct Cmd {
    pub pos: usize,
    pub args: Vec<Arg>,
}

/// A pipeline with its variable declarations.
#[derive(Debug, Clone)]
pub(crate) struct Pipe {
    pub pos: usize,
    pub is_assign: bool,
    pub decl: Vec<String>,
    pub cmds: Vec<Cmd>,
}

/// A node of the template tree.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// Literal text.
    Text(String),
    /// `{{ pipeline }}`
    Action(Pipe),
    /// `{{ if }}`, `{{ with }}`, `{{ range }}`.
    Control {
        kind: Control,
        pipe: Pipe,
        list: Vec<Node>,
        else_list: Option<Vec<Node>>,
    },
    /// `{{ template "name" pipeline }}`
    Template {
        pos: usize,
        name: String,
        pipe: Option<Pipe>,
    },
    /// `{{ break }}`
    Break,
    /// `{{ continue }}`
    Continue,
}

/// Which control structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// `if`
    If,
    /// `with`
    With,
    /// `range`
    Range,
}

impl Control {
    fn name(self) -> &'static str {
        match self {
            Control::If => "if",
            Control::With => "with",
            Control::Range => "range",
        }
    }
}

/// A parsed template: the main tree and the `define`d ones.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub root: Vec<Node>,
    pub defines: BTreeMap<String, Vec<Node>>,
}

/// How the parser knows whether a function exists.
pub(crate) type FuncCheck<'a> = &'a dyn Fn(&str) -> Result<(), String>;

enum ListEnd {
    End(usize),
    Else(usize),
    Eof,
}

struct Parser<'a> {
    tokens: Vec<Token>,
    i: usize,
    vars: Vec<String>,
    range_depth: usize,
    depth: usize,
    max_depth: usize,
    funcs: FuncCheck<'a>,
    defines: BTreeMap<String, Vec<Node>>,
}

/// Parses a template.
pub(crate) fn parse(src: &str, funcs: FuncCheck<'_>, max_depth: usize) -> PResult<Tree> {
    let tokens = Lexer {
        src,
        pos: 0,
        tokens: Vec::new(),
    }
    .lex()?;
    let mut p = Parser {
        tokens,
        i: 0,
        vars: vec!["$".into()],
        range_depth: 0,
        depth: 0,
        max_depth,
        funcs,
        defines: BTreeMap::new(),
    };
    let (root, end) = p.list(true)?;
    match end {
        ListEnd::Eof => {}
        ListEnd::End(pos) => return err(pos, "unexpected {{end}}"),
        ListEnd::Else(pos) => return err(pos, "unexpected {{else}}"),
    }
    Ok(Tree {
        root,
        defines: p.defines,
    })
}

impl Parser<'_> {
    fn next(&mut self) -> Token {
        let t = self.tokens[self.i.min(self.tokens.len() - 1)].clone();
        if self.i < self.tokens.len() {
            self.i += 1;
        }
        t
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.i.min(self.tokens.len() - 1)]
    }

    fn next_non_space(&mut self) -> Token {
        loop {
            let t = self.next();
            if t.tok != Tok::Space {
                return t;
            }
        }
    }

    fn peek_non_space(&mut self) -> Token {
        let save = self.i;
        let t = self.next_non_space();
        self.i = save;
        t
    }

    fn deeper(&mut self, pos: usize) -> PResult<()> {
        self.depth += 1;
        if self.depth > self.max_depth {
            return err(
                pos,
                format!(
                    "the template nests more than {} levels deep",
                    self.max_depth
                ),
            );
        }
        Ok(())
    }

    fn expect_right(&mut self, context: &str) -> PResult<()> {
        let t = self.next_non_space();
        if t.tok != Tok::Right {
            return err(
                t.pos,
                format!("unexpected {} in {context}", describe(&t.tok)),
            );
        }
        Ok(())
    }

    /// Parses nodes up to `{{end}}`, `{{else}}` or the end of input.
    fn list(&mut self, top: bool) -> PResult<(Vec<Node>, ListEnd)> {
        let mut nodes = Vec::new();
        loop {
            let t = self.next();
            match t.tok {
                Tok::Eof => {
                    if !top {
                        return err(t.pos, "unexpected EOF");
                    }
                    return Ok((nodes, ListEnd::Eof));
                }
                Tok::Text(s) => nodes.push(Node::Text(s)),
                Tok::Left => {
                    let kw = self.peek_non_space();
                    match kw.tok {
                        Tok::Kw("end") => {
                            self.next_non_space();
                            self.expect_right("end")?;
                            return Ok((nodes, ListEnd::End(kw.pos)));
                        }
                        Tok::Kw("else") => {
                            self.next_non_space();
                            // `else if`/`else with` leave the keyword for the caller.
                            let after = self.peek_non_space();
                            if !matches!(after.tok, Tok::Kw("if") | Tok::Kw("with")) {
                                self.expect_right("else")?;
                            }
                            return Ok((nodes, ListEnd::Else(kw.pos)));
                        }
                        Tok::Kw("define") => {
                            self.next_non_space();
                            if !top || self.depth > 0 {
                                return err(kw.pos, "unexpected <define> in command");
                            }
                            self.define(kw.pos)?;
                        }
                        _ => {
                            if let Some(node) = self.action()? {
                                nodes.push(node);
                            }
                        }
                    }
                }
                other => return err(t.pos, format!("unexpected {}", describe(&other))),
            }
        }
    }

    fn define(&mut self, pos: usize) -> PResult<()> {
        let name = self.template_name("define clause")?;
        self.expect_right("define clause")?;
        let saved_vars = std::mem::replace(&mut self.vars, vec!["$".into()]);
        self.deeper(pos)?;
        let (body, end) = self.list(false)?;
        self.depth -= 1;
        self.vars = saved_vars;
        if !matches!(end, ListEnd::End(_)) {
            return err(pos, "unexpected {{else}} in define clause");
        }
        let empty = |n: &[Node]| {
            n.iter()
                .all(|n| matches!(n, Node::Text(t) if t.trim().is_empty()))
        };
        if let Some(existing) = self.defines.get(&name)
            && !empty(existing)
            && !empty(&body)
        {
            return err(
                pos,
                format!("template: multiple definition of template {name:?}"),
            );
        }
        if !self
            .defines
            .get(&name)
            .is_some_and(|e| empty(&body) && !empty(e))
        {
            self.defines.insert(name, body);
        }
        Ok(())
    }

    fn template_name(&mut self, context: &str) -> PResult<String> {
        let t = self.next_non_space();
        match t.tok {
            Tok::Str(V::Str(s)) => Ok(s.to_string()),
            other => err(
                t.pos,
                format!("unexpected {} in {context}", describe(&other)),
            ),
        }
    }

    fn action(&mut self) -> PResult<Option<Node>> {
        let t = self.next_non_space();
        match t.tok {
            Tok::Kw("block") => {
                let name = self.template_name("block clause")?;
                let pipe = self.pipeline("block", true)?;
                let saved_vars = std::mem::replace(&mut self.vars, vec!["$".into()]);
                self.deeper(t.pos)?;
                let (body, end) = self.list(false)?;
                self.depth -= 1;
                self.vars = saved_vars;
                if !matches!(end, ListEnd::End(_)) {
                    return err(t.pos, "unexpected {{else}} in block clause");
                }
                self.defines.insert(name.clone(), body);
                Ok(Some(Node::Template {
                    pos: t.pos,
                    name,
                    pipe: Some(pipe),
                }))
            }
            Tok::Kw("break") | Tok::Kw("continue") => {
                let is_break = t.tok == Tok::Kw("break");
                let what = if is_break { "break" } else { "continue" };
                if self.range_depth == 0 {
                    return err(t.pos, format!("{{{{{what}}}}} outside {{{{range}}}}"));
                }
                self.expect_right(what)?;
                Ok(Some(if is_break {
                    Node::Break
                } else {
                    Node::Continue
                }))
            }
            Tok::Kw("if") => self.control(Control::If, t.pos).map(Some),
            Tok::Kw("with") => self.control(Control::With, t.pos).map(Some),
            Tok::Kw("range") => self.control(Control::Range, t.pos).map(Some),
            Tok::Kw("template") => {
                let name = self.template_name("template clause")?;
                let next = self.peek_non_space();
                let pipe = if next.tok == Tok::Right {
                    self.next_non_space();
                    None
                } else {
                    Some(self.pipeline("template clause", true)?)
                };
                Ok(Some(Node::Template {
                    pos: t.pos,
                    name,
                    pipe,
                }))
            }
            Tok::Kw(k) => err(t.pos, format!("unexpected <{k}> in command")),
            _ => {
                self.i -= 1;
                let pipe = self.pipeline("command", true)?;
                Ok(Some(Node::Action(pipe)))
            }
        }
    }

    fn control(&mut self, kind: Control, pos: usize) -> PResult<Node> {
        let mark = self.vars.len();
        self.deeper(pos)?;
        let pipe = self.pipeline(kind.name(), true)?;
        if kind == Control::Range {
            self.range_depth += 1;
        }
        let (list, end) = self.list(false)?;
        if kind == Control::Range {
            self.range_depth -= 1;
        }
        let else_list = match end {
            ListEnd::End(_) => None,
            ListEnd::Else(else_pos) => {
                let next = self.peek_non_space();
                let chained = match (kind, &next.tok) {
                    (Control::If, Tok::Kw("if")) => Some(Control::If),
                    (Control::With, Tok::Kw("with")) => Some(Control::With),
                    _ => None,
                };
                if let Some(inner) = chained {
                    let t = self.next_non_space();
                    let node = self.control(inner, t.pos)?;
                    Some(vec![node])
                } else {
                    if matches!(next.tok, Tok::Kw("if") | Tok::Kw("with")) {
                        return err(
                            next.pos,
                            format!("unexpected {} in else", describe(&next.tok)),
                        );
                    }
                    let (else_list, end) = self.list(false)?;
                    match end {
                        ListEnd::End(_) => {}
                        _ => return err(else_pos, "expected end; found {{else}}"),
                    }
                    Some(else_list)
                }
            }
            ListEnd::Eof => return err(pos, "unexpected EOF"),
        };
        self.vars.truncate(mark);
        self.depth -= 1;
        Ok(Node::Control {
            kind,
            pipe,
            list,
            else_list,
        })
    }

    /// Parses a pipeline up to `}}` (`action`) or `)`.
    fn pipeline(&mut self, context: &str, action: bool) -> PResult<Pipe> {
        let start = self.peek_non_space().pos;
        let mut pipe = Pipe {
            pos: start,
            is_assign: false,
            decl: Vec::new(),
            cmds: Vec::new(),
        };
        // Declarations.
        'decls: loop {
            let v = self.peek_non_space();
            let Tok::Var(name) = v.tok else { break };
            let save = self.i;
            self.next_non_space();
            let next = self.peek_non_space();
            match next.tok {
                Tok::Assign | Tok::Declare => {
                    self.next_non_space();
                    // As in Go, assigning an undeclared variable fails
                    // when the template runs.
                    pipe.is_assign = next.tok == Tok::Assign;
                    pipe.decl.push(name.clone());
                    self.vars.push(name);
                    break 'decls;
                }
                Tok::Char(',') => {
                    self.next_non_space();
                    pipe.decl.push(name.clone());
                    self.vars.push(name);
                    if context == "range" && pipe.decl.len() < 2 {
                        let after = self.peek_non_space();
                        if matches!(after.tok, Tok::Var(_) | Tok::Right | Tok::RParen) {
                            continue 'decls;
                        }
                        return err(after.pos, "range can only initialize variables");
                    }
                    return err(v.pos, format!("too many declarations in {context}"));
                }
                _ => {
                    self.i = save;
                    break;
                }
            }
        }
        let end_tok = if action { Tok::Right } else { Tok::RParen };
        loop {
            let t = self.next_non_space();
            if t.tok == end_tok {
                self.check_pipeline(&pipe, context, t.pos)?;
                return Ok(pipe);
            }
            match t.tok {
                Tok::Bool(_)
                | Tok::CharConst(_)
                | Tok::Dot
                | Tok::Field(_)
                | Tok::Ident(_)
                | Tok::Number(_)
                | Tok::Nil
                | Tok::Str(_)
                | Tok::Var(_)
                | Tok::LParen => {
                    self.i -= 1;
                    let cmd = self.command()?;
                    pipe.cmds.push(cmd);
                }
                other => {
                    return err(
                        t.pos,
                        format!("unexpected {} in {context}", describe(&other)),
                    );
                }
            }
        }
    }

    fn check_pipeline(&self, pipe: &Pipe, context: &str, pos: usize) -> PResult<()> {
        if pipe.cmds.is_empty() {
            return err(pos, format!("missing value for {context}"));
        }
        for (i, cmd) in pipe.cmds.iter().enumerate().skip(1) {
            if matches!(
                cmd.args[0],
                Arg::Bool(_) | Arg::Dot | Arg::Nil | Arg::Number(_) | Arg::Str(_)
            ) {
                return err(
                    cmd.pos,
                    format!("non executable command in pipeline stage {}", i + 1),
                );
            }
        }
        Ok(())
    }

    fn command(&mut self) -> PResult<Cmd> {
        let pos = self.peek_non_space().pos;
        let mut cmd = Cmd {
            pos,
            args: Vec::new(),
        };
        loop {
            self.skip_spaces();
            if let Some(operand) = self.operand()? {
                cmd.args.push(operand);
            }
            let t = self.next();
            match t.tok {
                Tok::Space => continue,
                Tok::Right | Tok::RParen => {
                    self.i -= 1;
                }
                Tok::Pipe => {}
                other => return err(t.pos, format!("unexpected {} in operand", describe(&other))),
            }
            break;
        }
        if cmd.args.is_empty() {
            return err(pos, "empty command");
        }
        Ok(cmd)
    }

    fn skip_spaces(&mut self) {
        while self.peek().tok == Tok::Space {
            self.i += 1;
        }
    }

    fn operand(&mut self) -> PResult<Option<Arg>> {
        let Some(term) = self.term()? else {
            return Ok(None);
        };
        if let Tok::Field(_) = self.peek().tok {
            let mut fields = Vec::new();
            while let Tok::Field(f) = &self.peek().tok {
                fields.push(f.clone());
                self.i += 1;
            }
            let pos = self.peek().pos;
            return Ok(Some(match term {
                Arg::Field(mut base) => {
                    base.extend(fields);
                    Arg::Field(base)
                }
                Arg::Var(name, mut base) => {
                    base.extend(fields);
                    Arg::Var(name, base)
                }
                Arg::Bool(_) | Arg::Str(_) | Arg::Number(_) | Arg::Nil | Arg::Dot => {
                    return err(
                        pos,
                        format!("unexpected . after term {:?}", term.describe()),
                    );
                }
                other => Arg::Chain(Box::new(other), fields),
            }));
        }
        Ok(Some(term))
    }

    fn term(&mut self) -> PResult<Option<Arg>> {
        let t = self.next_non_space();
        Ok(Some(match t.tok {
            Tok::Ident(name) => {
                if let Err(message) = (self.funcs)(&name) {
                    return err(t.pos, message);
                }
                Arg::Ident(name)
            }
            Tok::Dot => Arg::Dot,
            Tok::Nil => Arg::Nil,
            Tok::Var(name) => {
                if !self.vars.contains(&name) {
                    return err(t.pos, format!("undefined variable {name:?}"));
                }
                Arg::Var(name, Vec::new())
            }
            Tok::Field(f) => Arg::Field(vec![f]),
            Tok::Bool(b) => Arg::Bool(b),
            Tok::CharConst(text) | Tok::Number(text) => Arg::Number(Number::parse(&text, t.pos)?),
            Tok::LParen => {
                self.deeper(t.pos)?;
                let pipe = self.pipeline("parenthesized pipeline", false)?;
                self.depth -= 1;
                Arg::Pipe(Box::new(pipe))
            }
            Tok::Str(v) => Arg::Str(v),
            _ => {
                self.i -= 1;
                return Ok(None);
            }
        }))
    }
}

fn describe(tok: &Tok) -> String {
    match tok {
        Tok::Text(_) => "text".into(),
        Tok::Left => "\"{{\"".into(),
        Tok::Right => "\"}}\"".into(),
        Tok::Space => "space".into(),
        Tok::Pipe => "\"|\"".into(),
        Tok::Assign => "\"=\"".into(),
        Tok::Declare => "\":=\"".into(),
        Tok::Char(c) => format!("{c:?}"),
        Tok::LParen => "\"(\"".into(),
        Tok::RParen => "\")\"".into(),
        Tok::Str(_) => "quoted string".into(),
        Tok::CharConst(c) | Tok::Number(c) => format!("number {c}"),
        Tok::Bool(b) => b.to_string(),
        Tok::Nil => "nil".into(),
        Tok::Dot => "\".\"".into(),
        Tok::Field(f) => format!("field .{f}"),
        Tok::Var(v) => format!("variable {v}"),
        Tok::Ident(i) => format!("identifier {i}"),
        Tok::Kw(k) => format!("<{k}>"),
        Tok::Eof => "EOF".into(),
    }
}
