//! The project's text speaks only of itself: no document, README, help text,
//! chart value or code comment cites a document a user does not have (the
//! design notes the project started from, section numbers of outside
//! references, "the reference chart"). The Go operators are named as such.
//! No cluster is needed.

use std::path::{Path, PathBuf};

use regex::Regex;

/// Phrases that cite documents outside the repository.
const CITATIONS: &str =
    r"\bSPEC\b|\bDESIGN\b|§|reference chart|operator-reference|reference operator";

/// Every text file the repository tracks (by `git ls-files`, or by walking
/// the tree where there is no git), binaries and recorded data left out.
fn tracked_text_files(root: &Path) -> Vec<PathBuf> {
    let listed = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            o.stdout
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
                .collect::<Vec<_>>()
        });
    let files = listed.unwrap_or_else(|| {
        let mut out = Vec::new();
        walk(root, &mut out);
        out
    });
    files
        .into_iter()
        .filter(|p| {
            let name = p.to_string_lossy();
            !name.contains("/.git/")
                && !name.contains("/target/")
                && ![".png", ".tar.gz", ".tar.xz", ".svg"]
                    .iter()
                    .any(|ext| name.ends_with(ext))
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == ".git" || name == "target" {
            continue;
        }
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn nothing_cites_documents_users_do_not_have() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pattern = Regex::new(CITATIONS).unwrap();
    let files = tracked_text_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "the file list is empty"
    );
    let mut found = Vec::new();
    // This file names the phrases it looks for.
    for file in files.iter().filter(|f| !f.ends_with(file!())) {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if pattern.is_match(line) {
                let rel = file.strip_prefix(root).unwrap_or(file).display();
                found.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "outside documents cited (say what is meant, or name the Go operators):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_citation_pattern_sees_what_it_looks_for() {
    let pattern = Regex::new(CITATIONS).unwrap();
    for cited in [
        "as DESIGN §4 says",
        "SPEC §2",
        "the reference chart's key",
        "operator-reference.md",
        "see §3.1",
    ] {
        assert!(pattern.is_match(cited), "{cited}");
    }
    for fine in ["KmsSecretSpec", "spec.design", "the Go operator's chart"] {
        assert!(!pattern.is_match(fine), "{fine}");
    }
}
