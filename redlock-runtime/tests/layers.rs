//! The runtime's modules are layers that point one way (issue 25): a module imports from
//! the layers below its own, and from a module of its own layer only if that one does not
//! import it back. This test reads the sources (`use crate::…` and `crate::…` paths, the
//! crate root's re-exports resolved to the module that defines them; comments and
//! `#[cfg(test)] mod` blocks left out) and fails on any other import, naming it, and on a
//! module placed in no layer.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module (a file or directory under `src/`) belongs to one.
const LAYERS: &[&[&str]] = &[
    // The vocabulary: what a lock, a key, a token, an option, an error, a figure is.
    &[
        "error", "key", "token", "kind", "options", "info", "stats", "tls", "node",
    ],
    // What crosses the network, and what a process keeps of a lock and its waiters.
    &["scripts", "wire", "notify", "waiters", "lease"],
    // The stores: memory, one server, Sentinel, Cluster, Redlock.
    &["backend"],
    // The engine: the state the API's handles share, and the background task that
    // renews, releases and tidies up.
    &["engine"],
    // The API.
    &["manager"],
    // Built on the API.
    &["layer", "macro_support"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`None` for `lib.rs`).
fn module_of(file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src()).expect("a file under src/");
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(name) => Some(name.to_owned()),
        None => Some(first.to_owned()),
    }
}

/// The code of `text` without comments and without the `#[cfg(test)] mod` blocks (which
/// this crate keeps at the end of a file).
fn code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let next_is_mod = lines[i + 1..]
            .iter()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.trim_start().starts_with("mod "));
        if trimmed.starts_with("#[cfg(test)]") && next_is_mod {
            break;
        }
        let without_comment = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(without_comment);
        out.push('\n');
    }
    out
}

/// The names the crate root re-exports (`pub use module::{A, B}`), by the module that
/// defines them.
fn reexports() -> BTreeMap<String, String> {
    let lib = fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let lib = code(&lib);
    let mut map = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        for item in items
            .trim_matches(|c| c == '{' || c == '}' || char::is_whitespace(c))
            .split(',')
        {
            let item = item.trim();
            if !item.is_empty() {
                map.insert(item.to_owned(), module.trim().to_owned());
            }
        }
    }
    map
}

/// The modules a path after `crate::` names: `name…` (a module), `Name` (a re-export) or
/// a group `{a, B, c::d}`.
fn targets(after: &str, reexports: &BTreeMap<String, String>) -> Vec<String> {
    let group = after
        .strip_prefix('{')
        .map(|g| g.split('}').next().unwrap_or(""));
    let heads: Vec<&str> = match group {
        Some(g) => g.split(',').map(str::trim).collect(),
        None => vec![after],
    };
    heads
        .into_iter()
        .filter_map(|head| {
            let name: String = head
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() || name == "self" {
                None
            } else if name.starts_with(char::is_uppercase) {
                reexports.get(&name).cloned()
            } else {
                Some(name)
            }
        })
        .collect()
}

/// Every `from -> to` import between two different modules.
fn imports() -> BTreeSet<(String, String)> {
    let reexports = reexports();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut edges = BTreeSet::new();
    for file in files {
        let Some(from) = module_of(&file) else {
            continue;
        };
        let text = fs::read_to_string(&file).expect("a source file");
        let code = code(&text);
        for (at, _) in code.match_indices("crate::") {
            let after = &code[at + "crate::".len()..];
            for to in targets(after, &reexports) {
                if to != from {
                    edges.insert((from.clone(), to));
                }
            }
        }
    }
    edges
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

#[test]
fn every_module_has_a_layer() {
    let mut modules = BTreeSet::new();
    for (from, to) in imports() {
        modules.insert(from);
        modules.insert(to);
    }
    let unplaced: Vec<_> = modules.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules in no layer of LAYERS: {unplaced:?}"
    );
}

#[test]
fn imports_point_down_the_layers() {
    let edges = imports();
    assert!(
        edges.len() > 20,
        "only {} imports found: is the parser reading the sources?",
        edges.len()
    );
    let breaks_order = |(from, to): &(String, String)| match (layer_of(from), layer_of(to)) {
        (Some(f), Some(t)) if t < f => false,
        (Some(f), Some(t)) if t == f => edges.contains(&(to.clone(), from.clone())),
        _ => true,
    };
    let against: Vec<_> = edges.iter().filter(|e| breaks_order(e)).collect();
    assert!(
        against.is_empty(),
        "imports against the layer order: {against:?}"
    );
}
