#!/usr/bin/env bash
# Fuzzes every parser that takes outside input (fuzz/: config, slash_commands, openai_request,
# native_request, edited_plan) with cargo-fuzz (libFuzzer) for a fixed time each; not part of CI.
# Installs what it needs: rustup's nightly toolchain (minimal profile) and cargo-fuzz, when
# missing. Corpora grow in fuzz/corpus/<target> (seeded from fuzz/seeds/<target> and, for
# config, the project's real config.yml files); crashes are written to fuzz/artifacts/<target>.
# Writes a summary (executions, execs/s, crashes, corpus size per target) to
# bench-results/fuzz.md and bench-results/fuzz.json and each target's log beside them; exits
# non-zero when any target crashed, naming the input that crashed it (turn it into a regression
# test in the crate at fault: `cargo +nightly fuzz run TARGET ARTIFACT` reproduces it).
#
# Usage: bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 600 s, every target)
# Environment: FUZZ_SANITIZER (address, the default, or none; none runs about twice as fast).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

invocation="bash scripts/fuzz.sh${*:+ $*}"
seconds=${1:-600}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1)); then
    echo "usage: bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
    exit 2
fi
shift || true
all_targets=(config slash_commands openai_request native_request edited_plan)
if (($# > 0)); then
    targets=("$@")
else
    targets=("${all_targets[@]}")
fi
sanitizer=${FUZZ_SANITIZER:-address}

log() { printf 'fuzz.sh: %s\n' "$*" >&2; }

# The nightly toolchain (libFuzzer needs -Z flags) and cargo-fuzz.
if ! rustup toolchain list | grep -q '^nightly'; then
    log "installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo +nightly install cargo-fuzz --locked
fi

# Debug assertions on: an arithmetic overflow is a crash too.
fuzz_flags=(--debug-assertions --sanitizer "$sanitizer")
log "building the fuzz targets (nightly, sanitizer $sanitizer)"
cargo +nightly fuzz build "${fuzz_flags[@]}" >&2

results="$root/bench-results"
mkdir -p "$results/fuzz-logs"

# Seeds: the examples checked in under fuzz/seeds, and the real config.yml files for config.
seed_corpus() {
    local target=$1 corpus="$root/fuzz/corpus/$1"
    mkdir -p "$corpus" "$root/fuzz/artifacts/$target"
    if [[ -d "$root/fuzz/seeds/$target" ]]; then
        cp -n "$root/fuzz/seeds/$target"/* "$corpus/"
    fi
    if [[ "$target" == config ]]; then
        local file name
        for file in examples/*/config.yml crates/peregrine/tests/fixtures/*/config.yml crates/peregrine/templates/*/config.yml; do
            [[ -f "$file" ]] || continue
            name="seed-$(printf '%s' "$file" | tr '/' '_')"
            cp -n "$file" "$corpus/$name"
        done
    fi
}

# The last value of a libFuzzer statistic in a log (0 when absent).
stat() {
    local value
    value=$(grep -E "^stat::$2:" "$1" | tail -n 1 | awk '{print $2}')
    printf '%s' "${value:-0}"
}

rows=()
json_rows=()
crashed=()
for target in "${targets[@]}"; do
    seed_corpus "$target"
    corpus="$root/fuzz/corpus/$target"
    log_file="$results/fuzz-logs/$target.log"
    dict_args=()
    [[ -f "$root/fuzz/dicts/$target.dict" ]] && dict_args=("-dict=$root/fuzz/dicts/$target.dict")
    log "fuzzing $target for ${seconds}s (log: ${log_file#"$root"/})"
    status=0
    cargo +nightly fuzz run "${fuzz_flags[@]}" "$target" "$corpus" -- \
        -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 "${dict_args[@]}" \
        >"$log_file" 2>&1 || status=$?

    runs=$(stat "$log_file" number_of_executed_runs)
    if [[ "$runs" == 0 ]]; then
        # No final statistics (a crash before them): the last status line's count.
        runs=$(grep -oE '^#[0-9]+' "$log_file" | tail -n 1 | tr -d '#')
        runs=${runs:-0}
    fi
    per_second=$(stat "$log_file" average_exec_per_sec)
    artifacts=$(grep -oE 'Test unit written to [^ ]+' "$log_file" | awk '{print $5}' | sort -u || true)
    crashes=0
    [[ -n "$artifacts" ]] && crashes=$(printf '%s\n' "$artifacts" | wc -l)
    if ((status != 0 && crashes == 0)); then
        # Failed without writing an input (a build or start-up failure): count it, show the log.
        crashes=1
        artifacts="(no input written; see ${log_file#"$root"/})"
        tail -n 20 "$log_file" >&2
    fi
    corpus_files=$(find "$corpus" -type f | wc -l)
    corpus_bytes=$(du -sb "$corpus" | awk '{print $1}')
    log "$target: $runs executions, $per_second/s, $crashes crash(es), corpus $corpus_files files"
    if ((crashes > 0)); then
        while IFS= read -r artifact; do
            crashed+=("$target: ${artifact#"$root"/}")
        done <<<"$artifacts"
    fi
    rows+=("| \`$target\` | $runs | $per_second | $crashes | $corpus_files ($corpus_bytes bytes) |")
    first_artifact=$(printf '%s\n' "$artifacts" | head -n 1)
    json_rows+=("{\"target\": \"$target\", \"seconds\": $seconds, \"executions\": $runs, \"execs_per_second\": $per_second, \"crashes\": $crashes, \"artifact\": \"${first_artifact#"$root"/}\", \"corpus_files\": $corpus_files, \"corpus_bytes\": $corpus_bytes}")
done

nightly=$(rustc +nightly --version)
{
    echo "# Fuzzing"
    echo
    echo "\`$invocation\` on $(date -u +%Y-%m-%dT%H:%M:%SZ): ${seconds}s per target, $nightly, sanitizer $sanitizer, debug assertions on."
    echo
    echo "| target | executions | execs/s | crashes | corpus |"
    echo "| --- | ---: | ---: | ---: | --- |"
    printf '%s\n' "${rows[@]}"
    if ((${#crashed[@]} > 0)); then
        echo
        echo "Crashes (reproduce with \`cargo +nightly fuzz run TARGET ARTIFACT\`):"
        printf -- '- %s\n' "${crashed[@]}"
    fi
} >"$results/fuzz.md"
{
    echo "{\"seconds_per_target\": $seconds, \"toolchain\": \"$nightly\", \"sanitizer\": \"$sanitizer\", \"targets\": ["
    last=$((${#json_rows[@]} - 1))
    for index in "${!json_rows[@]}"; do
        separator=","
        ((index == last)) && separator=""
        echo "  ${json_rows[$index]}$separator"
    done
    echo "]}"
} >"$results/fuzz.json"
cat "$results/fuzz.md"

if ((${#crashed[@]} > 0)); then
    log "crashes found:"
    printf '  %s\n' "${crashed[@]}" >&2
    exit 1
fi
