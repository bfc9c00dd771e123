//! What docs.rs and GitHub show: checked on the sources, so a slip fails `cargo test`.
//! (That the code in the docs compiles and runs is the doctests' job.)

use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn runtime_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&Path::new(ROOT).join("redlock-runtime/src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(ROOT).unwrap().display().to_string();
            (name, fs::read_to_string(&p).unwrap())
        })
        .collect()
}

fn is_doc(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("///") || t.starts_with("//!")
}

/// Rust code blocks of a markdown file must not use rustdoc's hidden `# ` lines: GitHub
/// renders them as they are.
#[test]
fn markdown_rust_blocks_have_no_hidden_lines() {
    let mut files = vec![Path::new(ROOT).join("README.md")];
    for entry in fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut bad = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        let mut in_rust = false;
        for (n, line) in text.lines().enumerate() {
            if let Some(info) = line.trim_start().strip_prefix("```") {
                in_rust = !in_rust && info.starts_with("rust");
                continue;
            }
            let t = line.trim_start();
            if in_rust && (t == "#" || t.starts_with("# ")) {
                bad.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "hidden lines in markdown:\n{}",
        bad.join("\n")
    );
}

/// docs.rs shows redlock-runtime's examples: they name the facade, as users do.
#[test]
fn runtime_doc_examples_use_redlock_paths() {
    let mut bad = Vec::new();
    for (name, text) in runtime_sources() {
        for (n, line) in text.lines().enumerate() {
            if is_doc(line) && line.contains("redlock_runtime") {
                bad.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "use redlock:: in docs:\n{}", bad.join("\n"));
}

/// Every public async method of the runtime has an `# Examples` section, like
/// `tokio::sync::Mutex::lock` (the hidden macro support excepted).
#[test]
fn public_async_methods_have_examples() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for (name, text) in runtime_sources() {
        if name.ends_with("macro_support.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("pub async fn ") {
                continue;
            }
            seen += 1;
            let doc = lines[..i]
                .iter()
                .rev()
                .take_while(|l| is_doc(l) || l.trim_start().starts_with("#["))
                .any(|l| l.trim() == "/// # Examples");
            if !doc {
                bad.push(format!("{name}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        seen >= 25,
        "found only {seen} public async methods: the scan is broken"
    );
    assert!(bad.is_empty(), "no # Examples:\n{}", bad.join("\n"));
}

/// Issue 24, item 7: 36 of 81 public methods had an example. Every public function of the
/// runtime (the facade re-exports them) shows one, unless it is hidden from the docs.
#[test]
fn public_functions_have_examples() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for (name, text) in runtime_sources() {
        if name.ends_with("macro_support.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if !(t.starts_with("pub fn ") || t.starts_with("pub async fn ")) {
                continue;
            }
            let doc: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .take_while(|l| is_doc(l) || l.trim_start().starts_with("#["))
                .map(|l| l.trim())
                .collect();
            if doc.contains(&"#[doc(hidden)]") {
                continue;
            }
            seen += 1;
            if !doc.iter().any(|l| l.starts_with("/// ```")) {
                bad.push(format!("{name}:{}: {}", i + 1, t));
            }
        }
    }
    assert!(
        seen >= 80,
        "found only {seen} public functions: the scan is broken"
    );
    assert!(bad.is_empty(), "no example:\n{}", bad.join("\n"));
}

/// Issue 24, item 7: 7 of 32 public `async fn`s said what dropping their future does.
/// Every one has a `# Cancel safety` section.
#[test]
fn public_async_methods_say_what_cancelling_does() {
    let mut bad = Vec::new();
    for (name, text) in runtime_sources() {
        if name.ends_with("macro_support.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("pub async fn ") {
                continue;
            }
            let said = lines[..i]
                .iter()
                .rev()
                .take_while(|l| is_doc(l) || l.trim_start().starts_with("#["))
                .any(|l| l.trim() == "/// # Cancel safety");
            if !said {
                bad.push(format!("{name}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "no # Cancel safety:\n{}", bad.join("\n"));
}

/// The macros' documentation is written once, on the macros in redlock-macros; the
/// facade's re-export adds none (rustdoc would show both texts, one after the other, on docs.rs).
#[test]
fn macro_docs_written_once() {
    let facade = fs::read_to_string(Path::new(ROOT).join("src/lib.rs")).unwrap();
    let lines: Vec<&str> = facade.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == "pub use redlock_macros::{distributed_lock, key};")
        .expect("the facade re-exports the macros");
    let added: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with("#[") || is_doc(l))
        .filter(|l| is_doc(l) || l.contains("doc =") || l.contains("doc="))
        .copied()
        .collect();
    assert!(added.is_empty(), "docs on the re-export: {added:?}");
    let macros = fs::read_to_string(Path::new(ROOT).join("redlock-macros/src/lib.rs")).unwrap();
    assert!(macros.contains("#[doc = include_str!(\"distributed_lock.md\")]"));
}

/// The public methods of `impl LockManager` in `file` and, in place of each `mod x;`,
/// those of `manager/x.rs` (rustdoc lists them module by module, in that order).
fn manager_methods(dir: &Path, file: &str, out: &mut Vec<String>) {
    let text = fs::read_to_string(dir.join(file)).unwrap();
    let mut in_manager = false;
    for line in text.lines() {
        if let Some(module) = line.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
            manager_methods(dir, &format!("{module}.rs"), out);
        }
        if line.starts_with("impl ") {
            in_manager = line == "impl LockManager {";
        }
        let t = line.trim_start();
        let name = t
            .strip_prefix("pub fn ")
            .or_else(|| t.strip_prefix("pub async fn "));
        if let (true, Some(name)) = (in_manager, name) {
            let end = name.find(['(', '<']).unwrap_or(name.len());
            out.push(name[..end].to_owned());
        }
    }
}

/// Issue 24, item 7: the manager's page listed the read/write, permit and several-key
/// methods before `builder` and `lock`. It reads in the order a user learns: getting a
/// manager, the exclusive lock, the other kinds, then the operators' methods.
#[test]
fn the_manager_page_reads_in_the_order_a_user_learns() {
    let groups: [&[&str]; 5] = [
        &[
            "builder",
            "connect",
            "install_global",
            "global",
            "prefix",
            "backend_name",
        ],
        &["lock", "try_lock", "try_lock_with", "lock_with"],
        &[
            "fair",
            "try_fair",
            "try_fair_with",
            "fair_with",
            "read",
            "try_read",
            "try_read_with",
            "read_with",
            "write",
            "try_write",
            "try_write_with",
            "write_with",
            "permit",
            "try_permit",
            "try_permit_with",
            "permit_with",
            "lock_all",
            "try_lock_all",
            "try_lock_all_with",
            "lock_all_with",
        ],
        &[
            "leader",
            "leader_with",
            "lead",
            "lead_with",
            "leader_info",
            "watch_leader",
        ],
        &[
            "is_locked",
            "inspect",
            "list",
            "force_unlock",
            "force_unlock_if_unchanged",
            "watched_locks",
            "subscription_interests",
            "shutdown",
        ],
    ];
    let mut methods = Vec::new();
    manager_methods(
        &Path::new(ROOT).join("redlock-runtime/src/manager"),
        "mod.rs",
        &mut methods,
    );
    let group_of = |m: &str| groups.iter().position(|g| g.contains(&m));
    let unplaced: Vec<&String> = methods.iter().filter(|m| group_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "new methods: put them in a group (and a module) of their own: {unplaced:?}"
    );
    let order: Vec<usize> = methods.iter().filter_map(|m| group_of(m)).collect();
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "out of order: {methods:?}"
    );
    let all: usize = groups.iter().map(|g| g.len()).sum();
    assert_eq!(methods.len(), all, "every method found once: {methods:?}");
}
