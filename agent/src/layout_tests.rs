//! The tree's structure as policy: the pipeline's import rule (data flows down: capture →
//! enrich → correlate → export, over a ground floor of `model` and `telemetry`) and the size
//! of every source file. Read from the sources themselves, so a violation fails `cargo test`.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

/// Most lines a source file may have before its `#[cfg(test)]` module.
const MAX_LINES: usize = 500;

/// What each stage must not import (top-level modules of the agent crate).
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "model",
        &[
            "capture",
            "enrich",
            "correlate",
            "export",
            "telemetry",
            "pipeline",
            "agent",
        ],
    ),
    (
        "telemetry",
        &[
            "capture",
            "enrich",
            "correlate",
            "export",
            "pipeline",
            "agent",
        ],
    ),
    (
        "capture",
        &["enrich", "correlate", "export", "pipeline", "agent"],
    ),
    ("enrich", &["correlate", "export", "pipeline", "agent"]),
    (
        "correlate",
        &["capture", "enrich", "export", "pipeline", "agent"],
    ),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("agent/ has a parent")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file that is a test module as a whole (`mod tests;` / `mod x_tests;` under `cfg(test)`).
fn is_test_file(path: &Path) -> bool {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    stem == "tests" || stem.ends_with("_tests")
}

/// The part of a file before its `#[cfg(test)]` module.
fn non_test(text: &str) -> &str {
    text.find("\n#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// The module path of a file under `agent/src` (`enrich/attribute/mod.rs` → enrich, attribute).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level names inside a `{ ... }` group at the start of `s`.
fn group_names(s: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0;
    let mut expect_name = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                depth += 1;
                expect_name = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_name = true,
            c if depth == 1 && expect_name && (c.is_alphabetic() || c == '_') => {
                names.push(ident(&s[i..]).to_string());
                expect_name = false;
            }
            _ => {}
        }
    }
    names
}

/// The crate's top-level modules a file's code refers to: `crate::x`, `crate::{x, y}`, and
/// `super::…` paths that climb to the crate root.
fn imported_top_modules(module: &[String], code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut names_after = |rest: &str| {
        if rest.starts_with('{') {
            out.extend(group_names(rest));
        } else {
            out.insert(ident(rest).to_string());
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `drainwatch_crate::`
        }
        names_after(&code[i + "crate::".len()..]);
    }
    for (i, _) in code.match_indices("super::") {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // counted from the first `super` of a chain
        }
        let mut rest = &code[i..];
        let mut supers = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            supers += 1;
            rest = r;
        }
        if supers >= module.len() {
            names_after(rest);
        }
    }
    out
}

#[test]
fn every_source_file_stays_under_the_line_limit() {
    let root = workspace();
    let mut files = Vec::new();
    for dir in ["agent/src", "common/src", "agent-ebpf/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut over = Vec::new();
    for f in files.iter().filter(|f| !is_test_file(f)) {
        let text = fs::read_to_string(f).expect("readable source");
        let lines = non_test(&text).lines().count();
        if lines > MAX_LINES {
            over.push(format!("{} has {lines} lines", f.display()));
        }
    }
    assert!(
        over.is_empty(),
        "over {MAX_LINES} non-test lines: {over:#?}"
    );
}

#[test]
fn stages_import_only_what_flows_into_them() {
    let src = workspace().join("agent/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for f in files.iter().filter(|f| !is_test_file(f)) {
        let rel = f.strip_prefix(&src).expect("under agent/src");
        let module = module_path(rel);
        let Some(stage) = module.first() else {
            continue;
        };
        let Some((_, forbidden)) = FORBIDDEN.iter().find(|(s, _)| s == stage) else {
            continue;
        };
        let text = fs::read_to_string(f).expect("readable source");
        for m in imported_top_modules(&module, non_test(&text)) {
            if forbidden.contains(&m.as_str()) {
                violations.push(format!("{} imports {m}", rel.display()));
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn the_import_scanner_sees_every_form_of_path() {
    let m = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let code = "use crate::{\n    capture::{event::Event, watch},\n    model::Mono,\n};\n\
                use super::super::export::api;\nfn f() { crate::enrich::x(); }";
    let found = imported_top_modules(&m(&["correlate", "stops"]), code);
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["capture", "enrich", "export", "model"]
    );
    // One `super` from a nested module stays inside its stage.
    assert!(imported_top_modules(&m(&["correlate", "stops"]), "use super::Tracker;").is_empty());
}
