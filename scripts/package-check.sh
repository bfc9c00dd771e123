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

# Cargo unpacks the local registry's crates under $CARGO_HOME/registry/src/-<hash of the
# registry's path>/ and never unpacks a name-version there again. A machine that ran this
# check before at the same path (CI does) would verify the facade against that older
# source of the same version, so drop those copies first. crates.io's own sources are left.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for stale in "$cargo_home"/registry/src/-*/redlock-{macros,runtime}-*; do
  if [[ -e $stale ]]; then rm -rf -- "$stale"; fi
done

echo "== cargo publish --dry-run --workspace"
cargo publish --dry-run --workspace --allow-dirty 2>&1 | grep -v '^warning: ignoring \(example\|test\) '
