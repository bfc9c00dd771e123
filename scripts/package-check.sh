#!/usr/bin/env bash
# What crates.io would get, checked before anyone publishes: each published package's file
# list (licences in; tests, fault suite, scripts, CI and the unpublished redlock-cli out),
# then `cargo publish --dry-run` for
# all of them in dependency order (redlock-macros, redlock-runtime, then the facade
# redlock-guard, which cargo verifies against the first two through a local registry).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package-check: $*" >&2; exit 1; }

for pkg in redlock-macros redlock-runtime redlock-guard; do
  list=$(cargo package --list --allow-dirty -p "$pkg" 2>/dev/null) || fail "cargo package --list -p $pkg failed"
  echo "== $pkg: $(echo "$list" | wc -l) files"
  for must in LICENSE-MIT LICENSE-APACHE Cargo.toml src/lib.rs; do
    grep -qx "$must" <<<"$list" || fail "$pkg does not ship $must"
  done
  if grep -E '^(tests|scripts|\.ci|bench|redlock-testkit|redlock-faults|redlock-cli|target)/' <<<"$list"; then
    fail "$pkg ships files that belong to the repository only (above)"
  fi
done
cargo package --list --allow-dirty -p redlock-guard 2>/dev/null | grep -qx README.md \
  || fail "redlock-guard does not ship README.md (its doctests and crates.io page)"

echo "== cargo publish --dry-run --workspace"
cargo publish --dry-run --workspace --allow-dirty 2>&1 | grep -v '^warning: ignoring \(example\|test\) '
