//! The shape of `src/`: no import cycles between its files. A file depends
//! on another when it names it through `use`, `crate::`, `super::` or
//! `self::` paths, or a bare path that starts with one of its own child
//! modules (`reload::X` in a `mod.rs`); `mod` lines do not count, nor do test
//! modules. No cluster is needed. There is none today; a new one fails
//! the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

type Module = Vec<String>;

fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The longest prefix of `path` (relative to `current`) that is a module.
fn resolve(modules: &BTreeSet<Module>, current: &Module, path: &[&str]) -> Option<Module> {
    let (mut base, mut rest) = match *path.first()? {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (current.clone(), &path[1..]),
        "super" => {
            let mut base = current.clone();
            let mut rest = path;
            while rest.first() == Some(&"super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        _ => return None,
    };
    let mut best = modules.contains(&base).then(|| base.clone());
    while let Some((first, tail)) = rest.split_first() {
        base.push((*first).to_owned());
        if modules.contains(&base) {
            best = Some(base.clone());
        }
        rest = tail;
    }
    best
}

/// What one file names, as modules.
fn dependencies(modules: &BTreeSet<Module>, current: &Module, text: &str) -> BTreeSet<Module> {
    // Test modules (at the end of a file, by this repository's style) out.
    // (`#[cfg(test)] mod fuzz;`, a file of its own, is not one: only a
    // module with its body here.)
    let tests = Regex::new(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+\w+\s*\{").unwrap();
    let text = tests.split(text).next().unwrap_or(text);
    let path =
        Regex::new(r"(?:^|[^\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::\w+)+)").unwrap();
    let uses = Regex::new(r"\buse\s+([^;]*);").unwrap();
    let mut out = BTreeSet::new();
    let mut add = |segments: Vec<&str>| {
        let segments = if segments
            .first()
            .is_some_and(|s| modules.contains(&[current.clone(), vec![(*s).to_owned()]].concat()))
        {
            [vec!["self"], segments].concat()
        } else {
            segments
        };
        if let Some(m) = resolve(modules, current, &segments)
            && m != *current
        {
            out.insert(m);
        }
    };
    for c in uses.captures_iter(text) {
        for leaf in use_tree(&c[1]) {
            add(leaf.iter().map(String::as_str).collect());
        }
    }
    // Paths outside `use` lines (`crate::x::f()`, `super::X`, `child::g()`).
    let rest = uses.replace_all(text, "");
    for c in path.captures_iter(&rest) {
        add(c[1].split("::").collect());
    }
    out
}

/// The paths a `use` tree names, one per leaf, with its groups expanded
/// (`a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`; `self` in a group
/// is its prefix; `*` and renames are dropped).
fn use_tree(tree: &str) -> Vec<Vec<String>> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
        for (i, ch) in s.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        parts
    }
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            for part in split_top(inner) {
                expand(prefix, part, out);
            }
            return;
        }
        if let Some(at) = tree.find("::{") {
            let mut base = prefix.to_vec();
            base.extend(tree[..at].split("::").map(|s| s.trim().to_owned()));
            expand(&base, &tree[at + 2..], out);
            return;
        }
        let leaf = tree.split(" as ").next().unwrap_or("").trim();
        let mut path = prefix.to_vec();
        path.extend(
            leaf.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty() && *s != "*" && *s != "self")
                .map(str::to_owned),
        );
        if !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    expand(&[], tree, &mut out);
    out
}

/// Strongly connected groups of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<BTreeSet<Module>> {
    struct State<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        next: usize,
        found: Vec<BTreeSet<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let Some((w, _)) = s.graph.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.insert(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                s.found.push(group);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn src_has_no_import_cycle() {
    let graph = src_graph();
    let name = |m: &Module| m.join("::");
    let found: Vec<BTreeSet<String>> = cycles(&graph)
        .iter()
        .map(|g| g.iter().map(name).collect())
        .collect();
    assert!(
        found.is_empty(),
        "import cycles in src/ (each a group of modules that reach each other): {found:#?}"
    );
}

/// The three kinds' folders under `controllers/`: none may depend on
/// another's (what they share lives in `controllers/` or `kms/`).
const KINDS: [&str; 3] = ["kms_secret", "kms_push_secret", "kms_dynamic_secret"];

/// The kind folder a module is in, if any.
fn kind_of(m: &Module) -> Option<&str> {
    match m.as_slice() {
        [c, kind, ..] if c == "controllers" => KINDS.iter().find(|k| *k == kind).copied(),
        _ => None,
    }
}

/// Each dependency of a kind's module on another kind's module, as
/// `from -> to`.
fn cross_kind(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    let mut out = Vec::new();
    for (from, deps) in graph {
        let Some(kind) = kind_of(from) else { continue };
        for to in deps {
            if kind_of(to).is_some_and(|k| k != kind) {
                out.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    out
}

fn src_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeSet<Module> = all.iter().map(|f| module_of(&src, f)).collect();
    all.iter()
        .map(|f| {
            let m = module_of(&src, f);
            let deps = dependencies(&modules, &m, &std::fs::read_to_string(f).unwrap());
            (m, deps)
        })
        .collect()
}

#[test]
fn no_kind_imports_another() {
    let found = cross_kind(&src_graph());
    assert!(
        found.is_empty(),
        "a kind's module depends on another kind's (move what they share to controllers/ or kms/): {found:#?}"
    );
}

#[test]
fn the_cross_kind_check_sees_a_path_in_an_expression() {
    let module = |s: &str| -> Module { s.split("::").map(str::to_owned).collect() };
    let modules: BTreeSet<Module> = [
        "controllers",
        "controllers::kms_secret",
        "controllers::kms_secret::plan",
        "controllers::kms_push_secret",
        "controllers::kms_push_secret::status",
        "controllers::queue",
    ]
    .map(module)
    .into();
    let from = module("controllers::kms_push_secret::status");
    let mut graph = BTreeMap::new();
    let text = "use crate::controllers::queue::jittered;\nfn f() { crate::controllers::kms_secret::plan::jittered(i, r) }\n";
    graph.insert(from.clone(), dependencies(&modules, &from, text));
    assert_eq!(
        cross_kind(&graph),
        ["controllers::kms_push_secret::status -> controllers::kms_secret::plan"]
    );
    let clean = "use crate::controllers::queue::jittered;\nuse super::plan;\n";
    graph.insert(from.clone(), dependencies(&modules, &from, clean));
    assert!(cross_kind(&graph).is_empty());
}

#[test]
fn use_trees_are_read_whole() {
    let paths = |t: &str| -> Vec<String> { use_tree(t).iter().map(|p| p.join("::")).collect() };
    assert_eq!(paths("crate::a::B"), ["crate::a::B"]);
    assert_eq!(
        paths("super::{a::{B, c::D}, e, self}"),
        ["super::a::B", "super::a::c::D", "super::e", "super"]
    );
    assert_eq!(paths("child::{A as X, b::*}"), ["child::A", "child::b"]);
    // A parent's re-export of its child is an edge parent → child.
    let modules: BTreeSet<Module> = [vec![], vec!["k".into()], vec!["k".into(), "c".into()]]
        .into_iter()
        .collect();
    let k = vec!["k".to_owned()];
    assert_eq!(
        dependencies(&modules, &k, "pub use c::{Client, Fetch};\n"),
        [vec!["k".to_owned(), "c".to_owned()]].into()
    );
}

#[test]
fn the_cycle_check_sees_a_cycle_through_a_mod_rs_and_its_child() {
    // `a` (a mod.rs) names its child `a::b` by a bare path; `a::b` names
    // `a` through `super::`: a cycle, as the rule above defines it.
    let modules: BTreeSet<Module> = [vec![], vec!["a".into()], vec!["a".into(), "b".into()]]
        .into_iter()
        .collect();
    let a = vec!["a".to_owned()];
    let b = vec!["a".to_owned(), "b".to_owned()];
    let graph: BTreeMap<Module, BTreeSet<Module>> = [
        (
            a.clone(),
            dependencies(&modules, &a, "pub mod b;\nfn f() { b::g(); }"),
        ),
        (
            b.clone(),
            dependencies(&modules, &b, "use super::{X, Y};\n"),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(cycles(&graph), vec![[a.clone(), b.clone()].into()]);
    // Without the child's `super::` there is none.
    let graph: BTreeMap<Module, BTreeSet<Module>> = [
        (a.clone(), dependencies(&modules, &a, "fn f() { b::g(); }")),
        (
            b.clone(),
            dependencies(&modules, &b, "use crate::other::X;\n"),
        ),
    ]
    .into_iter()
    .collect();
    assert!(cycles(&graph).is_empty());
}

// ----- budgets --------------------------------------------------------------

/// The longest a function in `src/` may be, counted from its `fn` line to
/// its closing brace.
const MAX_FUNCTION_LINES: usize = 150;
/// Functions allowed to be longer for now (`path:name`); empty, and to stay
/// so.
const LONG_FUNCTIONS_ALLOWED: &[&str] = &[];
/// The longest `operator::run` may be: the start-up reads as a list of
/// steps.
const MAX_RUN_LINES: usize = 120;
/// The most `sleep(` calls in `tests/`; each says why no event exists to
/// wait on.
const MAX_TEST_SLEEPS: usize = 10;
/// `duplicates` on `src/`: the pairs it finds that are not boilerplate
/// (the tool's mark for runs that share only punctuation, keywords or a
/// shape recurring across a folder, such as the derive and `#[kube(…)]`
/// lists every API type carries: a new type adds those without writing any
/// logic twice), and those that are more than shape. They may only go down
/// (lower these when they do). The five left that are more than shape are
/// declarations, not logic: the three API types' printer columns and common
/// status fields (three pairs), the spec's method names beside the KMS's
/// login methods, and the Go operators' manifests in `migrate`'s tests.
const MAX_DUPLICATE_PAIRS: usize = 6;
const MAX_DUPLICATE_PAIRS_NOT_SHAPE: usize = 5;

/// Source text with comments, strings and character literals blanked
/// (newlines kept), so that braces and `fn` are only code's.
fn code_only(src: &str) -> String {
    let raw_string = Regex::new(r#"^r(#*)""#).unwrap();
    let character = Regex::new(r"^'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'").unwrap();
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |s: &str, out: &mut String| {
        out.extend(s.chars().map(|c| if c == '\n' { '\n' } else { ' ' }))
    };
    while i < b.len() {
        let rest = &src[i..];
        let after_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            blank(&rest[..end], &mut out);
            i += end;
        } else if let Some(body) = rest.strip_prefix("/*") {
            let end = body.find("*/").map_or(rest.len(), |e| e + 4);
            blank(&rest[..end], &mut out);
            i += end;
        } else if let Some(raw) = (b[i] == b'r' && !after_ident)
            .then(|| raw_string.captures(rest))
            .flatten()
        {
            let close = format!("\"{}", &raw[1]);
            let start = raw[0].len();
            let end = rest[start..]
                .find(&close)
                .map_or(rest.len(), |e| start + e + close.len());
            blank(&rest[..end], &mut out);
            i += end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            blank(&src[i..end], &mut out);
            i = end;
        } else if let Some(c) = (b[i] == b'\'').then(|| character.find(rest)).flatten() {
            blank(c.as_str(), &mut out);
            i += c.end();
        } else {
            let ch = rest.chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Every function with a body in `text`: (name, first line, lines).
fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let bytes = code.as_bytes();
    let fun = Regex::new(r"\bfn\s+(\w+)").unwrap();
    let mut out = Vec::new();
    for m in fun.captures_iter(&code) {
        let whole = m.get(0).unwrap();
        let Some(open) = code[whole.end()..]
            .find(['{', ';'])
            .map(|o| whole.end() + o)
        else {
            continue;
        };
        if bytes[open] == b';' {
            continue;
        }
        let mut depth = 0;
        let mut close = open;
        for (k, &c) in bytes.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let first = code[..whole.start()].matches('\n').count() + 1;
        let last = code[..close].matches('\n').count() + 1;
        out.push((m[1].to_owned(), first, last - first + 1));
    }
    out
}

fn src_files() -> (PathBuf, Vec<PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    all.sort();
    (src, all)
}

#[test]
fn no_function_in_src_is_longer_than_the_budget() {
    let (src, all) = src_files();
    let mut long = Vec::new();
    let mut run = None;
    for f in &all {
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        for (name, line, lines) in function_lengths(&std::fs::read_to_string(f).unwrap()) {
            if rel == "operator/mod.rs" && name == "run" {
                run = Some(lines);
            }
            let id = format!("{rel}:{name}");
            if lines > MAX_FUNCTION_LINES && !LONG_FUNCTIONS_ALLOWED.contains(&id.as_str()) {
                long.push(format!("src/{rel}:{line} {name}: {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions longer than {MAX_FUNCTION_LINES} lines (split them into the steps they are): {long:#?}"
    );
    let run = run.expect("operator::run in src/operator/mod.rs");
    assert!(
        run < MAX_RUN_LINES,
        "operator::run is {run} lines, the budget {MAX_RUN_LINES}: move a step into a function"
    );
}

#[test]
fn the_length_count_reads_code_not_text() {
    let text = "fn a() {\n    let s = \"}\";\n    // }\n    let c = '}';\n}\nfn b();\nfn c() { r#\"{\"# }\n";
    assert_eq!(
        function_lengths(text),
        [("a".to_owned(), 1, 5), ("c".to_owned(), 7, 1)]
    );
}

#[test]
fn tests_sleep_rarely_and_say_why() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut all = Vec::new();
    files(&tests, &mut all);
    let this = Path::new(file!()).file_name().unwrap();
    let sleep = Regex::new(r"\bsleep\(").unwrap();
    let (mut count, mut unexplained) = (0, Vec::new());
    for f in all.iter().filter(|f| f.file_name() != Some(this)) {
        let code = code_only(&std::fs::read_to_string(f).unwrap());
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for m in sleep.find_iter(&code) {
            count += 1;
            let line = code[..m.start()].matches('\n').count();
            let said = lines[line.saturating_sub(3)..line]
                .iter()
                .any(|l| l.trim_start().starts_with("//"));
            if !said {
                unexplained.push(format!("{}:{}", f.display(), line + 1));
            }
        }
    }
    assert!(
        count <= MAX_TEST_SLEEPS,
        "{count} sleep( calls in tests/, the budget {MAX_TEST_SLEEPS}: wait on what the sleep waits for \
         (wait_for, holds_for), or pace periodic actions with kms_testkit::wait::every"
    );
    assert!(
        unexplained.is_empty(),
        "sleeps without a comment saying why no event exists to wait on: {unexplained:#?}"
    );
}

#[test]
fn duplicates_in_src_only_go_down() {
    let Ok(out) = std::process::Command::new("duplicates")
        .args(["--repo", "src", "--most", "1", "--seconds", "120"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    else {
        println!("skipped: the duplicates tool is not on this machine");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    let numbers: Vec<usize> = Regex::new(
        r"(\d+) pairs of places.*?\((\d+) by shape alone(?:, (\d+) of those marked boilerplate)?",
    )
    .unwrap()
    .captures(first)
    .map(|c| {
        (1..=3)
            .map(|i| c.get(i).map_or(0, |m| m.as_str().parse().unwrap()))
            .collect()
    })
    .unwrap_or_else(|| {
        if first.starts_with("no duplicates") {
            vec![0, 0, 0]
        } else {
            panic!("unexpected duplicates output: {text}")
        }
    });
    let (pairs, not_shape) = (numbers[0] - numbers[2], numbers[0] - numbers[1]);
    println!(
        "duplicates in src/: {} pairs, {pairs} not boilerplate, {not_shape} more than shape",
        numbers[0]
    );
    assert!(
        pairs <= MAX_DUPLICATE_PAIRS && not_shape <= MAX_DUPLICATE_PAIRS_NOT_SHAPE,
        "duplicates in src/ went up: {pairs} pairs not boilerplate (budget {MAX_DUPLICATE_PAIRS}), {not_shape} more than \
         shape (budget {MAX_DUPLICATE_PAIRS_NOT_SHAPE}); `duplicates --repo src` lists them"
    );
}
