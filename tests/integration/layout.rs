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
    let tests = Regex::new(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s").unwrap();
    let text = tests.split(text).next().unwrap_or(text);
    let path =
        Regex::new(r"(?:^|[^\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::\w+)+)").unwrap();
    let group = Regex::new(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^;]*)\}\s*;").unwrap();
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
    for c in group.captures_iter(text) {
        let base: Vec<&str> = c[1].split("::").collect();
        for item in c[2].split(',') {
            let item = item.split(" as ").next().unwrap_or("");
            let item: Vec<&str> = item
                .split("::")
                .map(|s| s.trim_matches(|ch: char| ch == '{' || ch == '}' || ch.is_whitespace()))
                .filter(|s| !s.is_empty() && *s != "*" && *s != "self")
                .collect();
            add([base.clone(), item].concat());
        }
    }
    for c in path.captures_iter(text) {
        add(c[1].split("::").collect());
    }
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeSet<Module> = all.iter().map(|f| module_of(&src, f)).collect();
    let graph: BTreeMap<Module, BTreeSet<Module>> = all
        .iter()
        .map(|f| {
            let m = module_of(&src, f);
            let deps = dependencies(&modules, &m, &std::fs::read_to_string(f).unwrap());
            (m, deps)
        })
        .collect();
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
