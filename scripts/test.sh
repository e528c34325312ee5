#!/usr/bin/env bash
# The test command: starts what the tests need (a throwaway PostgreSQL server), then runs
# formatting, lint and the whole test suite. Used by `.ci/run` and by developers alike.
set -euo pipefail
cd "$(dirname "$0")/.."

state_dir=$(mktemp -d /tmp/peregrine-test.XXXXXX)
cleanup() {
  bash scripts/postgres.sh stop "$state_dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== PostgreSQL for the checkpoint tests"
eval "$(bash scripts/postgres.sh start "$state_dir")"
echo "using ${PEREGRINE_TEST_POSTGRES_URL}"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked
