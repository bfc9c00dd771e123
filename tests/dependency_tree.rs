//! Regression (issue 14, item 8): what the facade pulls into an application's tree.
//! tokio's `rt-multi-thread` was forced on users (a workspace default), and three
//! `getrandom` versions came in (0.3 here, 0.4 through redis's rand, 0.2 through ring
//! with `tls`). Runs `cargo tree` on the facade's normal dependencies, all features; and
//! on what the quickstart example builds.

use std::process::Command;

/// `cargo tree` of the facade, all features.
fn tree(args: &[&str]) -> String {
    let mut all = vec!["-p", "redlock-guard", "--all-features"];
    all.extend_from_slice(args);
    cargo_tree(&all)
}

fn cargo_tree(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(cargo)
        .args(["tree", "--offline", "--manifest-path", manifest])
        .args(["--prefix", "none"])
        .args(args)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn one_getrandom_version_in_the_tree() {
    let out = tree(&["-e", "normal", "--format", "{p}"]);
    let mut versions: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("getrandom v"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or_default())
        .collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), 1, "getrandom versions: {versions:?}");
}

#[test]
fn tokio_rt_multi_thread_is_not_forced_on_users() {
    let out = tree(&["-e", "features,normal", "-i", "tokio"]);
    assert!(out.contains("tokio feature \"rt\""), "{out}");
    assert!(!out.contains("rt-multi-thread"), "{out}");
}

/// Issue 24, item 8: `cargo run --example quickstart` took 1 min 56 s cold, building
/// every dev-dependency of the test suite. The examples are a package of their own; what
/// the quickstart builds (the package's default features, normal and build
/// dependencies) has none of the suite's heavy crates.
#[test]
fn the_quickstart_builds_none_of_the_test_suites_dependencies() {
    let out = cargo_tree(&[
        "-p",
        "redlock-examples",
        "-e",
        "normal,build",
        "--format",
        "{p}",
    ]);
    assert!(
        out.lines().any(|l| l.starts_with("redlock-guard v")),
        "{out}"
    );
    let heavy = [
        "axum",
        "hyper",
        "rustls",
        "ring",
        "trybuild",
        "metrics-exporter-prometheus",
        "tracing-subscriber",
    ];
    let found: Vec<&str> = out
        .lines()
        .filter(|l| heavy.iter().any(|h| l.starts_with(&format!("{h} v"))))
        .collect();
    assert!(found.is_empty(), "the quickstart builds {found:?}");
}
