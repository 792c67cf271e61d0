//! The binary's house (issue #25, docs/architecture.md): every `crate::` path in `crates/vigil/src` names a
//! module by its folder (no crate-root aliases), and goes down the stack, never back up:
//!
//! ```text
//! main.rs
//!   -> commands (commands/, cli.rs, settings.rs, help.rs)
//!   -> supervise/                                         sinks/ beside the stack: any layer may
//!   -> node/                                              tell them; they import only sinks/, the
//!   -> check (check.rs, check/)                           base and the core
//!   -> sources/
//!   -> base (error.rs, exit.rs, signals.rs)
//!   -> vigil_core
//! ```
//!
//! The test prints the arrows between layers with their counts (the drawing in docs/architecture.md is
//! made from it) and fails on an arrow that runs back up, an alias, or a module it does not know.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The stack, top first; `sinks` is beside it.
const STACK: [&str; 7] = ["main", "commands", "supervise", "node", "check", "sources", "base"];

fn layer_of_module(m: &str) -> Option<&'static str> {
    Some(match m {
        "main" => "main",
        "commands" | "cli" | "settings" | "help" => "commands",
        "supervise" => "supervise",
        "node" => "node",
        "check" => "check",
        "sources" => "sources",
        "error" | "exit" | "signals" | "state" => "base",
        "sinks" => "sinks",
        _ => return None,
    })
}

/// The top-level module a file belongs to: its folder, or its own name for a file at the root.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.strip_suffix(".rs").map(String::from).unwrap_or(first)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The first segment of every `crate::` path in `code` (comments removed), grouped imports included:
/// `use crate::{a::b, c};` names `a` and `c`.
fn crate_refs(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let text: String = code
        .lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(k) = text[i..].find("crate::") {
        let start = i + k;
        let preceded =
            start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_' || b[start - 1] == b'$');
        let mut j = start + "crate::".len();
        i = j;
        if preceded {
            continue;
        }
        if b.get(j) == Some(&b'{') {
            // a group: its top-level items, up to the matching brace
            let mut depth = 0;
            let mut item_start = true;
            while j < b.len() {
                match b[j] {
                    b'{' => {
                        depth += 1;
                        if depth == 1 {
                            item_start = true;
                        }
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => item_start = true,
                    c if depth == 1 && item_start && (c.is_ascii_alphabetic() || c == b'_') => {
                        let e = j + text[j..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(0);
                        out.push(text[j..e].to_string());
                        item_start = false;
                        j = e;
                        continue;
                    }
                    _ => {}
                }
                j += 1;
            }
            i = j;
        } else {
            let e = j + text[j..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(text.len() - j);
            if e > j {
                out.push(text[j..e].to_string());
            }
        }
    }
    out
}

/// May layer `from` import layer `to`?
fn allowed(from: &str, to: &str) -> bool {
    if from == to || to == "sinks" && from != "base" {
        return true;
    }
    if from == "sinks" {
        return to == "base";
    }
    let rank = |l: &str| STACK.iter().position(|x| *x == l);
    matches!((rank(from), rank(to)), (Some(a), Some(b)) if a < b)
}

#[test]
fn imports_follow_the_layers_and_name_folders() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut arrows: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut bad = BTreeSet::new();
    for f in &files {
        let module = module_of(&src, f);
        let from = layer_of_module(&module).unwrap_or_else(|| panic!("{}: a module no layer holds", f.display()));
        let code = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        for r in crate_refs(&code) {
            let Some(to) = layer_of_module(&r) else {
                bad.insert(format!("{rel}: crate::{r} is not a module of the crate root (an alias?)"));
                continue;
            };
            if to != from {
                *arrows.entry((from.to_string(), to.to_string())).or_default() += 1;
            }
            if !allowed(from, to) {
                bad.insert(format!("{rel}: {from} -> {to} (crate::{r}) runs back up"));
            }
        }
    }
    // no crate-root aliases: main.rs brings no module of a folder in by its short name (`use node::keeper;`)
    let main = std::fs::read_to_string(src.join("main.rs")).unwrap();
    for l in main.lines().map(str::trim) {
        let Some(rest) = l.strip_prefix("use ").or_else(|| l.strip_prefix("pub use ")) else { continue };
        let rest = rest.trim_end_matches(';');
        let Some((head, tail)) = rest.split_once("::") else { continue };
        let items: Vec<&str> = tail.trim_matches(|c| c == '{' || c == '}').split(',').map(str::trim).collect();
        for it in items {
            // the name the `use` brings in: a module of the folder is an alias
            let path: Vec<&str> = it.split("::").map(str::trim).collect();
            let dir = path[..path.len() - 1].iter().fold(src.join(head), |d, p| d.join(p));
            let last = path[path.len() - 1];
            if dir.join(format!("{last}.rs")).exists() || dir.join(last).is_dir() {
                bad.insert(format!("main.rs: `{l}` aliases the module {head}::{it} at the crate root"));
            }
        }
    }
    println!("arrows between the binary's layers (from -> to: paths)");
    for ((a, b), n) in &arrows {
        println!("  {a:>9} -> {b:<9} {n:>4}");
    }
    assert!(bad.is_empty(), "imports against the layers:\n{}", bad.into_iter().collect::<Vec<_>>().join("\n"));
}

#[test]
fn the_parser_sees_groups_and_skips_comments() {
    let code = "use crate::{a::b, c, d::{e, f}};\n// crate::x in a comment\nlet y = crate::g::h();\nmacro $crate::z";
    assert_eq!(crate_refs(code), vec!["a", "c", "d", "g"]);
    assert!(allowed("commands", "node"));
    assert!(!allowed("node", "supervise"));
    assert!(allowed("node", "sinks"));
    assert!(!allowed("sinks", "node"));
    assert!(allowed("sinks", "base"));
    assert!(!allowed("base", "sources"));
}
