//! The evaluator: walks a parsed template over the data with Go's rules
//! (`text/template/exec.go` semantics): pipelines pass their value as the
//! last argument of the next command, arguments are converted to the
//! parameter types of the function (a function that wants a `string` refuses
//! an `int`), variables are scoped to the control structure that declares
//! them, `range` visits map keys in sorted order, `and`/`or` short-circuit.
//!
//! Deliberate difference: reading a key that does not exist (a secret that
//! was not fetched, `.MISSING.Value`, `index . "MISSING"`, a missing key of
//! a map) is an error; Go would print `<no value>` or a zero value.
//!
//! Every step burns fuel from the render's minijinja state, so a hostile
//! template runs out of fuel instead of looping; nesting is bounded by the
//! recursion limit, the output by the output limit (checked while a value
//! is printed, not after). Every step also checks the render's canceller.
//! Functions charge their own work through [`Ctx`] before doing it.

use std::cell::RefCell;
use std::rc::Rc;

use minijinja::State;

use super::fmt::{PrintError, Sink, print_action};
use super::funcs::{self, Call, Func, Ty};
use super::parse::{Arg, Cmd, Control, Node, Number, Pipe, Tree};
use super::value::{Elem, V};
use crate::error::ErrorKind;
use crate::{budget, cost};

/// An execution error: where, what kind, and a message without secrets.
#[derive(Debug)]
pub(crate) struct ExecError {
    pub pos: Option<usize>,
    pub kind: ErrorKind,
    pub message: String,
}

impl ExecError {
    pub(crate) fn render(pos: usize, message: impl Into<String>) -> ExecError {
        ExecError {
            pos: Some(pos),
            kind: ErrorKind::Render,
            message: message.into(),
        }
    }
}

/// What a function returns when it fails.
#[derive(Debug)]
pub(crate) enum FnError {
    /// A Go-style error message (safe: no argument values).
    Msg(String),
    /// The render ran out of fuel.
    Fuel,
    /// A helper refused its input (message safe to show).
    Helper(String),
    /// The template called `fail` (its message is not shown: it is
    /// usually built from a secret).
    Fail,
    /// The render was cancelled.
    Cancelled,
}

impl From<PrintError> for FnError {
    fn from(e: PrintError) -> FnError {
        match e {
            PrintError::TooDeep => FnError::Msg("a value is nested too deep".into()),
            PrintError::Full => FnError::Fuel,
        }
    }
}

/// Most regular expressions a render keeps compiled.
const REGEX_CACHE: usize = 8;

/// What functions get besides their arguments: fuel accounting, the
/// minijinja state the operator helpers are written against, the template
/// source (to tell a key the template wrote from one it computed) and the
/// regular expressions compiled so far.
pub(crate) struct Ctx<'a, 'env> {
    /// The render's state (fuel).
    pub state: &'a State<'env, 'env>,
    /// The template's source.
    source: &'a str,
    /// Compiled regular expressions, by pattern.
    regexes: RefCell<Vec<(String, Rc<regex::Regex>)>>,
}

impl<'a, 'env> Ctx<'a, 'env> {
    /// The context of a render of `source`.
    pub fn new(state: &'a State<'env, 'env>, source: &'a str) -> Self {
        Ctx {
            state,
            source,
            regexes: RefCell::new(Vec::new()),
        }
    }

    /// Charges `fuel` for work about to be done; fails when the render was
    /// cancelled.
    pub fn work(&self, fuel: u64) -> Result<(), FnError> {
        if budget::cancelled() {
            return Err(FnError::Cancelled);
        }
        self.state.consume_fuel(fuel).map_err(|_| FnError::Fuel)
    }

    /// Charges the fuel of `bytes` bytes about to be produced, before they
    /// are allocated: more than the fuel left can pay for fails.
    pub fn reserve(&self, bytes: u64) -> Result<(), FnError> {
        self.work(cost::bytes(bytes))
    }

    /// [`reserve`](Self::reserve) for a `usize` size.
    pub fn reserve_usize(&self, bytes: usize) -> Result<(), FnError> {
        self.reserve(bytes as u64)
    }

    /// The fuel left.
    pub fn fuel_left(&self) -> u64 {
        crate::args::fuel_left(self.state)
    }

    /// A sink for text a function builds: as many bytes and nodes as the
    /// fuel left can pay for.
    pub fn sink(&self) -> Sink {
        let fuel = self.fuel_left();
        Sink::new(cost::bytes_for(fuel), fuel / cost::NODE.max(1))
    }

    /// Charges what was written into `sink`.
    pub fn charge_sink(&self, sink: &Sink) -> Result<(), FnError> {
        self.work(cost::bytes_usize(sink.len()).saturating_add(cost::nodes(sink.nodes())))
    }

    /// Text built by `write` into a sink the fuel left bounds, charged.
    pub fn print(
        &self,
        write: impl FnOnce(&mut Sink) -> Result<(), PrintError>,
    ) -> Result<Vec<u8>, FnError> {
        if budget::cancelled() {
            return Err(FnError::Cancelled);
        }
        let mut sink = self.sink();
        match write(&mut sink) {
            Ok(()) => {}
            Err(PrintError::Full) => {
                // The sink held all the fuel could pay for: the work done
                // uses it up.
                let _ = self.state.consume_fuel(u64::MAX);
                return Err(FnError::Fuel);
            }
            Err(e) => {
                self.charge_sink(&sink)?;
                return Err(e.into());
            }
        }
        self.charge_sink(&sink)?;
        Ok(sink.into_bytes())
    }

    /// A key for an error message: the key itself when the template's
    /// source holds it (the template wrote it), else only its length (it
    /// may have been computed from a secret value).
    pub fn shown_key(&self, key: &str) -> String {
        if !key.is_empty() && self.source.contains(key) {
            format!("{key:?}")
        } else {
            format!("computed by the template ({} bytes)", key.len())
        }
    }

    /// The compiled regular expression of `pattern`: from this render's
    /// cache, or compiled (and charged) now. A pattern whose program is
    /// larger than [`cost::REGEX_PROGRAM_BYTES`] is refused.
    pub fn regex(&self, pattern: &str) -> Result<Rc<regex::Regex>, FnError> {
        if let Some((_, re)) = self.regexes.borrow().iter().find(|(p, _)| p == pattern) {
            return Ok(re.clone());
        }
        self.work(cost::REGEX_COMPILE.saturating_add(cost::bytes_usize(pattern.len())))?;
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(cost::REGEX_PROGRAM_BYTES)
            .dfa_size_limit(cost::REGEX_DFA_BYTES)
            .build()
            .map_err(|_| {
                FnError::Msg(format!(
                    "error parsing regexp: invalid pattern, or its program is larger than {} KiB",
                    cost::REGEX_PROGRAM_BYTES / 1024
                ))
            })?;
        let re = Rc::new(re);
        let mut cache = self.regexes.borrow_mut();
        if cache.len() >= REGEX_CACHE {
            cache.remove(0);
        }
        cache.push((pattern.to_owned(), re.clone()));
        Ok(re)
    }
}

enum Flow {
    Normal,
    Break,
    Continue,
}

/// One execution of a template.
pub(crate) struct Exec<'a, 'env> {
    ctx: Ctx<'a, 'env>,
    tree: &'a Tree,
    pub out: Vec<u8>,
    out_limit: usize,
    vars: Vec<(String, V)>,
    depth: usize,
    max_depth: usize,
}

type R<T> = Result<T, ExecError>;

fn out_of_fuel() -> ExecError {
    ExecError {
        pos: None,
        kind: ErrorKind::OutOfFuel,
        message: "the template does too much work or builds too much data (out of fuel)".into(),
    }
}

fn cancelled() -> ExecError {
    ExecError {
        pos: None,
        kind: ErrorKind::Cancelled,
        message: "the render was cancelled".into(),
    }
}

fn output_too_large(limit: usize) -> ExecError {
    ExecError {
        pos: None,
        kind: ErrorKind::OutputTooLarge,
        message: format!("the output is larger than the limit of {limit} bytes"),
    }
}

impl<'a, 'env> Exec<'a, 'env> {
    /// A new execution of `tree`, parsed from `source`.
    pub fn new(
        state: &'a State<'env, 'env>,
        source: &'a str,
        tree: &'a Tree,
        out_limit: usize,
        max_depth: usize,
    ) -> Self {
        Exec {
            ctx: Ctx::new(state, source),
            tree,
            out: Vec::new(),
            out_limit,
            vars: Vec::new(),
            depth: 0,
            max_depth,
        }
    }

    /// Runs the main template with `data` as the dot.
    pub fn run(&mut self, data: V) -> R<()> {
        self.vars.push(("$".into(), data.clone()));
        let tree = self.tree;
        self.walk(&data, &tree.root)?;
        Ok(())
    }

    fn fuel(&self, n: u64) -> R<()> {
        if budget::cancelled() {
            return Err(cancelled());
        }
        self.ctx.state.consume_fuel(n).map_err(|_| out_of_fuel())
    }

    fn write(&mut self, bytes: &[u8]) -> R<()> {
        self.fuel(bytes.len() as u64 / cost::BYTES_PER_FUEL)?;
        if bytes.len() > self.out_limit - self.out.len() {
            return Err(output_too_large(self.out_limit));
        }
        self.out.extend_from_slice(bytes);
        Ok(())
    }

    /// Prints `value` (`{{ value }}`) into the output, through a sink that
    /// stops at the output limit or when the fuel left cannot pay for more.
    fn print(&mut self, value: &V) -> R<()> {
        let room = (self.out_limit - self.out.len()) as u64;
        let fuel = self.ctx.fuel_left();
        let fuel_bytes = cost::bytes_for(fuel);
        let mut sink = Sink::new(room.min(fuel_bytes), fuel / cost::NODE.max(1));
        match print_action(&mut sink, value) {
            Ok(()) => {}
            Err(PrintError::TooDeep) => {
                return Err(ExecError {
                    pos: None,
                    kind: ErrorKind::Render,
                    message: "a value is nested too deep to print".into(),
                });
            }
            Err(PrintError::Full) if room <= fuel_bytes && sink.nodes() <= fuel => {
                // What was printed up to the limit is charged.
                let _ = self
                    .fuel(cost::nodes(sink.nodes()).saturating_add(cost::bytes_usize(sink.len())));
                return Err(output_too_large(self.out_limit));
            }
            Err(PrintError::Full) => {
                let _ = self.ctx.state.consume_fuel(u64::MAX);
                return Err(out_of_fuel());
            }
        }
        self.fuel(cost::nodes(sink.nodes()))?;
        self.write(&sink.into_bytes())
    }

    fn walk(&mut self, dot: &V, nodes: &[Node]) -> R<Flow> {
        for node in nodes {
            self.fuel(1)?;
            match node {
                Node::Text(text) => self.write(text.as_bytes())?,
                Node::Action(pipe) => {
                    let value = self
                        .eval_pipeline(dot, pipe)
                        .map_err(|e| in_go_terms(e, pipe, Place::Print))?;
                    if pipe.decl.is_empty() {
                        self.print(&value)?;
                    }
                }
                Node::Control {
                    kind,
                    pipe,
                    list,
                    else_list,
                } => {
                    let flow = match kind {
                        Control::Range => self.walk_range(dot, pipe, list, else_list.as_deref())?,
                        _ => {
                            let mark = self.vars.len();
                            let value = self
                                .eval_pipeline(dot, pipe)
                                .map_err(|e| in_go_terms(e, pipe, Place::Condition))?;
                            let flow = if value.truth() {
                                if *kind == Control::With {
                                    self.walk(&value, list)?
                                } else {
                                    self.walk(dot, list)?
                                }
                            } else if let Some(else_list) = else_list {
                                self.walk(dot, else_list)?
                            } else {
                                Flow::Normal
                            };
                            self.vars.truncate(mark);
                            flow
                        }
                    };
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Template { pos, name, pipe } => {
                    let Some(body) = self.tree.defines.get(name) else {
                        return Err(ExecError::render(
                            *pos,
                            format!("template {name:?} not defined"),
                        ));
                    };
                    let new_dot = match pipe {
                        Some(pipe) => self.eval_pipeline(dot, pipe)?,
                        None => V::Nil,
                    };
                    if self.depth >= self.max_depth {
                        return Err(ExecError::render(
                            *pos,
                            format!("exceeded maximum template depth ({})", self.max_depth),
                        ));
                    }
                    self.depth += 1;
                    let saved =
                        std::mem::replace(&mut self.vars, vec![("$".into(), new_dot.clone())]);
                    let result = self.walk(&new_dot, body);
                    self.vars = saved;
                    self.depth -= 1;
                    result?;
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    fn set_var(&mut self, name: &str, value: V) -> bool {
        match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
            Some(slot) => {
                slot.1 = value;
                true
            }
            None => false,
        }
    }

    fn set_top_var(&mut self, n: usize, value: V) {
        let len = self.vars.len();
        if let Some(slot) = self.vars.get_mut(len.wrapping_sub(n)) {
            slot.1 = value;
        }
    }

    fn walk_range(
        &mut self,
        dot: &V,
        pipe: &Pipe,
        list: &[Node],
        else_list: Option<&[Node]>,
    ) -> R<Flow> {
        let outer = self.vars.len();
        let value = self.eval_pipeline(dot, pipe)?;
        let mark = self.vars.len();
        let items: Vec<(V, V)> = match &value {
            V::Int(n, _) => {
                if pipe.decl.len() > 1 {
                    return Err(ExecError::render(
                        pipe.pos,
                        "can't use an integer to iterate over more than one variable",
                    ));
                }
                self.fuel((*n).max(0) as u64)?;
                (0..*n).map(|i| (V::Nil, V::int(i))).collect()
            }
            V::List(items, _) => {
                self.fuel(items.len() as u64)?;
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (V::int(i as i64), v.clone()))
                    .collect()
            }
            V::Map(map, _) => {
                let map = map.borrow();
                let key_bytes = map
                    .keys()
                    .map(|k| k.len() as u64)
                    .fold(0, u64::saturating_add);
                self.fuel((map.len() as u64).saturating_add(key_bytes / cost::BYTES_PER_FUEL))?;
                map.iter()
                    .map(|(k, v)| (V::str(k.as_str()), v.clone()))
                    .collect()
            }
            V::Nil => Vec::new(),
            other => {
                return Err(ExecError::render(
                    pipe.pos,
                    format!(
                        "range can't iterate over a value of type {}",
                        other.type_name()
                    ),
                ));
            }
        };
        let mut result = Flow::Normal;
        if items.is_empty() {
            if let Some(else_list) = else_list {
                result = self.walk(dot, else_list)?;
            }
            self.vars.truncate(outer);
            return Ok(result);
        }
        for (index, elem) in items {
            self.fuel(1)?;
            if !pipe.decl.is_empty() {
                if pipe.is_assign {
                    if pipe.decl.len() > 1 {
                        let _ = self.set_var(&pipe.decl[0], index.clone());
                    } else {
                        let _ = self.set_var(&pipe.decl[0], elem.clone());
                    }
                } else {
                    self.set_top_var(1, elem.clone());
                }
            }
            if pipe.decl.len() > 1 {
                if pipe.is_assign {
                    let _ = self.set_var(&pipe.decl[1], elem.clone());
                } else {
                    self.set_top_var(2, index.clone());
                }
            }
            let flow = self.walk(&elem, list);
            self.vars.truncate(mark);
            match flow? {
                Flow::Break => break,
                Flow::Continue | Flow::Normal => {}
            }
        }
        self.vars.truncate(outer);
        let _ = &mut result;
        Ok(Flow::Normal)
    }

    fn eval_pipeline(&mut self, dot: &V, pipe: &Pipe) -> R<V> {
        let mut value: Option<V> = None;
        for cmd in &pipe.cmds {
            value = Some(self.eval_command(dot, cmd, value)?);
        }
        let value = value.unwrap_or(V::Nil);
        for name in &pipe.decl {
            if pipe.is_assign {
                if !self.set_var(name, value.clone()) {
                    return Err(ExecError::render(
                        pipe.pos,
                        format!("undefined variable: {name}"),
                    ));
                }
            } else {
                self.vars.push((name.clone(), value.clone()));
            }
        }
        Ok(value)
    }

    fn not_a_function(&self, cmd: &Cmd, final_: &Option<V>) -> R<()> {
        if cmd.args.len() > 1 || final_.is_some() {
            return Err(ExecError::render(
                cmd.pos,
                format!(
                    "can't give argument to non-function {}",
                    cmd.args[0].describe()
                ),
            ));
        }
        Ok(())
    }

    fn eval_command(&mut self, dot: &V, cmd: &Cmd, final_: Option<V>) -> R<V> {
        self.fuel(1)?;
        let has_args = cmd.args.len() > 1 || final_.is_some();
        match &cmd.args[0] {
            Arg::Field(names) => self.eval_field_chain(dot.clone(), names, has_args, cmd.pos),
            Arg::Chain(node, names) => {
                if matches!(**node, Arg::Nil) {
                    return Err(ExecError::render(
                        cmd.pos,
                        "indirection through explicit nil",
                    ));
                }
                let receiver = self.eval_arg(dot, node, Ty::Any, cmd.pos)?;
                self.eval_field_chain(receiver, names, has_args, cmd.pos)
            }
            Arg::Ident(name) => self.eval_function(dot, name, &cmd.args[1..], final_, cmd.pos),
            Arg::Pipe(pipe) => {
                self.not_a_function(cmd, &final_)?;
                self.eval_pipeline(dot, pipe)
            }
            Arg::Var(name, fields) => {
                let value = self.var(name, cmd.pos)?;
                if fields.is_empty() {
                    self.not_a_function(cmd, &final_)?;
                    Ok(value)
                } else {
                    self.eval_field_chain(value, fields, has_args, cmd.pos)
                }
            }
            Arg::Bool(b) => {
                self.not_a_function(cmd, &final_)?;
                Ok(V::Bool(*b))
            }
            Arg::Dot => {
                self.not_a_function(cmd, &final_)?;
                Ok(dot.clone())
            }
            Arg::Nil => Err(ExecError::render(cmd.pos, "nil is not a command")),
            Arg::Number(n) => {
                self.not_a_function(cmd, &final_)?;
                ideal_constant(n, cmd.pos)
            }
            Arg::Str(s) => {
                self.not_a_function(cmd, &final_)?;
                Ok(s.clone())
            }
        }
    }

    fn var(&self, name: &str, pos: usize) -> R<V> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| ExecError::render(pos, format!("undefined variable: {name}")))
    }

    fn eval_field_chain(
        &mut self,
        mut receiver: V,
        names: &[String],
        has_args: bool,
        pos: usize,
    ) -> R<V> {
        for (i, name) in names.iter().enumerate() {
            receiver = eval_field(&receiver, name, pos)?;
            if i == names.len() - 1 && has_args {
                return Err(ExecError::render(
                    pos,
                    format!("{name} has arguments but cannot be invoked as function"),
                ));
            }
        }
        Ok(receiver)
    }

    /// Evaluates an argument for a parameter of type `ty` (Go's `evalArg`).
    fn eval_arg(&mut self, dot: &V, arg: &Arg, ty: Ty, pos: usize) -> R<V> {
        let value = match arg {
            Arg::Dot => dot.clone(),
            Arg::Nil => {
                return match ty {
                    Ty::Any | Ty::Rv => Ok(V::Nil),
                    Ty::MapAny => Ok(V::map(Default::default())),
                    _ => Err(ExecError::render(
                        pos,
                        format!("cannot assign nil to {}", ty.name()),
                    )),
                };
            }
            Arg::Field(names) => self.eval_field_chain(dot.clone(), names, false, pos)?,
            Arg::Var(name, fields) => {
                let v = self.var(name, pos)?;
                self.eval_field_chain(v, fields, false, pos)?
            }
            Arg::Pipe(pipe) => self.eval_pipeline(dot, pipe)?,
            Arg::Ident(name) => self.eval_function(dot, name, &[], None, pos)?,
            Arg::Chain(node, names) => {
                if matches!(**node, Arg::Nil) {
                    return Err(ExecError::render(pos, "indirection through explicit nil"));
                }
                let receiver = self.eval_arg(dot, node, Ty::Any, pos)?;
                self.eval_field_chain(receiver, names, false, pos)?
            }
            Arg::Bool(b) => {
                return match ty {
                    Ty::Bool | Ty::Any | Ty::Rv => Ok(V::Bool(*b)),
                    _ => Err(literal_mismatch(ty, arg, pos)),
                };
            }
            Arg::Number(n) => {
                return match ty {
                    Ty::Int => n.int.map(V::int).ok_or_else(|| {
                        ExecError::render(pos, format!("expected integer; found {}", n.text))
                    }),
                    Ty::Float => n.float.map(V::Float).ok_or_else(|| {
                        ExecError::render(pos, format!("expected float; found {}", n.text))
                    }),
                    Ty::Any | Ty::Rv => ideal_constant(n, pos),
                    _ => Err(literal_mismatch(ty, arg, pos)),
                };
            }
            Arg::Str(s) => {
                return match ty {
                    Ty::Str | Ty::Any | Ty::Rv => Ok(s.clone()),
                    _ => Err(literal_mismatch(ty, arg, pos)),
                };
            }
        };
        validate(value, ty, pos)
    }

    fn eval_function(
        &mut self,
        dot: &V,
        name: &str,
        args: &[Arg],
        final_: Option<V>,
        pos: usize,
    ) -> R<V> {
        let Some(func) = funcs::lookup(name) else {
            return Err(ExecError {
                pos: Some(pos),
                kind: ErrorKind::UnknownFunction,
                message: format!("function {name:?} not defined"),
            });
        };
        self.call(dot, name, func, args, final_, pos)
    }

    fn call(
        &mut self,
        dot: &V,
        name: &str,
        func: &Func,
        args: &[Arg],
        final_: Option<V>,
        pos: usize,
    ) -> R<V> {
        let num_in = args.len() + usize::from(final_.is_some());
        let fixed = func.params.len();
        if func.variadic.is_some() {
            if num_in < fixed {
                return Err(ExecError::render(
                    pos,
                    format!("wrong number of args for {name}: want at least {fixed} got {num_in}"),
                ));
            }
        } else if num_in != fixed {
            return Err(ExecError::render(
                pos,
                format!("wrong number of args for {name}: want {fixed} got {num_in}"),
            ));
        }
        let ty_at = |i: usize| -> Ty {
            if i < fixed {
                func.params[i]
            } else {
                func.variadic.unwrap_or(Ty::Any)
            }
        };
        // `and` and `or` evaluate their arguments only as far as needed.
        if let Call::And | Call::Or = func.call {
            let is_or = matches!(func.call, Call::Or);
            let mut value = V::Nil;
            for arg in args {
                value = self.eval_arg(dot, arg, Ty::Rv, pos)?;
                if value.truth() == is_or {
                    return Ok(value);
                }
            }
            if let Some(f) = final_ {
                value = f;
            }
            return Ok(value);
        }
        let mut argv = Vec::with_capacity(num_in);
        for (i, arg) in args.iter().enumerate() {
            argv.push(self.eval_arg(dot, arg, ty_at(i), pos)?);
        }
        if let Some(f) = final_ {
            argv.push(validate(f, ty_at(num_in - 1), pos)?);
        }
        // A call pays for reading its string arguments.
        let read = argv
            .iter()
            .map(|a| a.as_bytes().map_or(0, <[u8]>::len) as u64)
            .fold(0, u64::saturating_add);
        self.fuel(1 + read / cost::BYTES_PER_FUEL)?;
        let result = match func.call {
            Call::Plain(f) => f(&self.ctx, argv),
            Call::Helper(helper) => funcs::call_helper(&self.ctx, helper, argv),
            Call::And | Call::Or => unreachable!("handled above"),
        };
        // Charge what the function built (a list copy by `append` in a loop
        // would otherwise be quadratic work for linear fuel).
        if let Ok(value) = &result {
            let size = match value {
                V::Str(s) => s.len() / 8,
                V::Bytes(b) => b.len() / 8,
                V::List(items, _) => items.len(),
                V::Map(map, _) => map.borrow().len(),
                _ => 0,
            };
            self.fuel(size as u64 / 8)?;
        }
        result.map_err(|e| match e {
            FnError::Fuel => out_of_fuel(),
            FnError::Cancelled => cancelled(),
            FnError::Fail => ExecError {
                pos: Some(pos),
                kind: ErrorKind::Function,
                message: format!(
                    "the template called fail at line {}",
                    crate::engine::line_of(self.ctx.source, pos)
                ),
            },
            FnError::Helper(message) => ExecError {
                pos: Some(pos),
                kind: ErrorKind::Function,
                message,
            },
            FnError::Msg(message) => ExecError {
                pos: Some(pos),
                kind: ErrorKind::Function,
                message: format!("error calling {name}: {message}"),
            },
        })
    }
}

fn literal_mismatch(ty: Ty, arg: &Arg, pos: usize) -> ExecError {
    let message = match ty {
        Ty::Bool => format!("expected bool; found {}", arg.describe()),
        Ty::Int => format!("expected integer; found {}", arg.describe()),
        Ty::Float => format!("expected float; found {}", arg.describe()),
        Ty::Str => format!("expected string; found {}", arg.describe()),
        _ => format!(
            "can't handle {} for arg of type {}",
            arg.describe(),
            ty.name()
        ),
    };
    ExecError::render(pos, message)
}

/// Go's `validateType`: a value for a parameter of type `ty`.
fn validate(value: V, ty: Ty, pos: usize) -> R<V> {
    let ok = match (&value, ty) {
        (_, Ty::Any | Ty::Rv) => true,
        (V::Nil, Ty::MapAny) => return Ok(V::map(Default::default())),
        (V::Nil, _) => {
            return Err(ExecError::render(
                pos,
                format!("invalid value; expected {}", ty.name()),
            ));
        }
        (V::Str(_) | V::Bytes(_), Ty::Str) => true,
        (V::Int(_, super::value::IntTy::Int), Ty::Int) => true,
        (V::Float(_), Ty::Float) => true,
        (V::Bool(_), Ty::Bool) => true,
        (V::Map(_, Elem::Any), Ty::MapAny) => true,
        _ => false,
    };
    if !ok {
        return Err(ExecError::render(
            pos,
            format!(
                "wrong type for value; expected {}; got {}",
                ty.name(),
                value.type_name()
            ),
        ));
    }
    Ok(value)
}

/// The value of a number literal where any type goes (Go's `idealConstant`).
fn ideal_constant(n: &Number, pos: usize) -> R<V> {
    if n.is_float_literal() {
        return Ok(V::Float(n.float.unwrap_or_default()));
    }
    match n.int {
        Some(i) => Ok(V::int(i)),
        None => Err(ExecError::render(pos, format!("{} overflows int", n.text))),
    }
}

/// `.name` of a value.
fn eval_field(receiver: &V, name: &str, pos: usize) -> R<V> {
    match receiver {
        V::Nil => Ok(V::Nil),
        V::Secret(s) => match name {
            "Value" => Ok(s.value.clone()),
            "SecretPath" => Ok(V::Str(s.path.clone())),
            _ => Err(ExecError {
                pos: Some(pos),
                kind: ErrorKind::Undefined,
                message: format!(
                    "can't evaluate field {name} of a secret; the fields of a secret are `Value` and `SecretPath`"
                ),
            }),
        },
        V::Map(map, elem) => match map.borrow().get(name) {
            Some(v) => Ok(v.clone()),
            None if *elem == Elem::Secret => Err(missing_secret(name, pos)),
            // Go's missing key of a map the template built: no value.
            None => Ok(V::Nil),
        },
        other => Err(ExecError::render(
            pos,
            format!("can't evaluate field {name} in type {}", other.type_name()),
        )),
    }
}

/// How a missing-secret message ends until the action around it says what
/// Go would have done ([`what_go_does`]).
const MISSING_SECRET_NOTE: &str = " (a missing key is an error here)";

/// The error for a secret key that is not in the data.
pub(crate) fn missing_secret(name: &str, pos: usize) -> ExecError {
    ExecError {
        pos: Some(pos),
        kind: ErrorKind::Undefined,
        message: format!("no secret {name:?}{MISSING_SECRET_NOTE}"),
    }
}

/// Where a pipeline's value goes: printed (or assigned), or tested by
/// `if`/`with`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Print,
    Condition,
}

/// What Go's text/template does with a missing key in `pipe`, for the
/// missing-secret message: a bare `{{ .X.Value }}` prints `<no value>`, a
/// bare `{{ if .X }}` is false, a value piped or passed to a function that
/// needs one fails in Go too.
fn what_go_does(pipe: &Pipe, place: Place) -> String {
    let bare = pipe.cmds.len() == 1
        && matches!(
            pipe.cmds[0].args.as_slice(),
            [Arg::Field(_) | Arg::Var(..) | Arg::Chain(..)]
        );
    let function = pipe.cmds.iter().find_map(|c| match c.args.first() {
        Some(Arg::Ident(name)) => Some(name.as_str()),
        _ => None,
    });
    let go = match (bare, place, function) {
        (true, Place::Print, _) if pipe.decl.is_empty() => "Go prints `<no value>`".to_owned(),
        (true, Place::Print, _) => "Go assigns no value".to_owned(),
        (true, Place::Condition, _) => "Go takes it as false".to_owned(),
        (false, _, Some(f)) => format!("Go fails too where `{f}` needs a value"),
        (false, _, None) => return MISSING_SECRET_NOTE.to_owned(),
    };
    format!(" (a missing key is an error here; {go})")
}

/// `e`, its missing-secret note replaced by what Go does in `pipe`.
fn in_go_terms(mut e: ExecError, pipe: &Pipe, place: Place) -> ExecError {
    if let Some(head) = e.message.strip_suffix(MISSING_SECRET_NOTE) {
        e.message = format!("{head}{}", what_go_does(pipe, place));
    }
    e
}
