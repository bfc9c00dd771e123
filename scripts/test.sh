#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing (redis-server from
# Debian's packages), then runs formatting, lints, docs and every test against real
# redis-server processes that the tests start on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tests need redis-server 7.0 or later (the cluster tests use sharded pub/sub, new in
# 7.0); Debian 11 and Ubuntu 22.04 and older install 6.x.
need_redis() {
  echo "scripts/test.sh: $1" >&2
  echo "  The tests need redis-server >= 7.0 on PATH (or REDLOCK_REDIS_SERVER naming it)." >&2
  echo "  Debian 12+/Ubuntu 24.04+: apt-get install redis-server; older releases: the" >&2
  echo "  packages.redis.io repository; elsewhere: brew install redis, dnf install redis," >&2
  echo "  or build it from https://redis.io/download." >&2
  exit 1
}
REDIS_SERVER="${REDLOCK_REDIS_SERVER:-redis-server}"
if ! command -v "$REDIS_SERVER" >/dev/null 2>&1; then
  [ -z "${REDLOCK_REDIS_SERVER:-}" ] || need_redis "REDLOCK_REDIS_SERVER=$REDIS_SERVER not found"
  command -v apt-get >/dev/null 2>&1 || need_redis "$REDIS_SERVER not found, and no apt-get to install it"
  echo "== installing redis-server"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
version=$("$REDIS_SERVER" --version | sed -n 's/.* v=\([0-9][0-9]*\)\..*/\1/p')
[ -n "$version" ] || need_redis "cannot read the version of $REDIS_SERVER: $("$REDIS_SERVER" --version)"
[ "$version" -ge 7 ] || need_redis "$("$REDIS_SERVER" --version) is too old"
"$REDIS_SERVER" --version

# One pass over a clean tree gains nothing from incremental caches (7 GB of the suite's
# target/ when on); a developer who wants them sets CARGO_INCREMENTAL=1.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
echo "== packages (file lists, cargo publish --dry-run)"
scripts/package-check.sh
echo "== tests"
cargo test --workspace --all-features --no-fail-fast

# The backend conformance suites again against Valkey, which several clouds and
# distributions ship instead of Redis: the build in ../shared/bin (beside the clone, see
# its README), or REDLOCK_VALKEY_BIN naming a directory with valkey-server and valkey-cli.
# `--workspace` selects the packages of the run above, so cargo reuses its test binaries
# instead of building a second set with other features (half a GB more on the disk);
# the testkit's own `cluster` and `sentinel` tests test the testkit, not the backends.
VALKEY_BIN="${REDLOCK_VALKEY_BIN:-../shared/bin}"
echo "== the backend suites against Valkey"
if [ -x "$VALKEY_BIN/valkey-server" ] && [ -x "$VALKEY_BIN/valkey-cli" ]; then
  VALKEY_BIN="$(cd "$VALKEY_BIN" && pwd)"
  "$VALKEY_BIN/valkey-server" --version
  REDLOCK_REDIS_SERVER="$VALKEY_BIN/valkey-server" REDLOCK_REDIS_CLI="$VALKEY_BIN/valkey-cli" \
    cargo test --workspace --exclude redlock-testkit --all-features --no-fail-fast \
      --test single --test cluster --test sentinel --test redlock --test replicas \
      --test redlock_kinds --test redlock_lock_all --test safety_regressions
else
  echo "skipped: no valkey-server and valkey-cli in $VALKEY_BIN (set REDLOCK_VALKEY_BIN)"
fi
