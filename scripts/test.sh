#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing (redis-server from
# Debian's packages), then runs formatting, lints, docs and every test against real
# redis-server processes that the tests start on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
echo "== tests"
cargo test --workspace --all-features --no-fail-fast
