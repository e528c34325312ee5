#!/usr/bin/env bash
# Installs what the `local` feature of peregrine-llm needs to build llama.cpp from source:
# cmake (llama-cpp-sys-2 drives llama.cpp's CMake build) and libclang (bindgen generates the
# Rust bindings). Quiet when both are already present; uses apt-get (Debian/Ubuntu), with sudo
# when not root.
#
# Usage: scripts/install-build-deps.sh
set -euo pipefail

log() { printf 'install-build-deps.sh: %s\n' "$*" >&2; }

# libclang-cpp.so is a different library (the C++ API); bindgen loads libclang.so / libclang-N.so.
have_libclang() {
    local candidate
    for candidate in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
        /usr/lib/*-linux-gnu/libclang.so* /usr/lib/*-linux-gnu/libclang-[0-9]*.so*; do
        [[ -e "$candidate" ]] && return 0
    done
    [[ -n "${LIBCLANG_PATH:-}" && -d "${LIBCLANG_PATH}" ]]
}

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
have_libclang || missing+=(libclang-dev)
if ((${#missing[@]} == 0)); then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${missing[*]} and apt-get is not available: install them with your package manager"
    exit 1
fi
sudo_cmd=()
if [[ "$(id -u)" -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        log "missing ${missing[*]}: run as root, or install them: apt-get install -y ${missing[*]}"
        exit 1
    fi
    sudo_cmd=(sudo)
fi

log "installing ${missing[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null; then
    # A fresh image may have no package lists yet.
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v cmake >/dev/null 2>&1 || { log "cmake is still missing after apt-get"; exit 1; }
have_libclang || { log "libclang is still missing after apt-get"; exit 1; }
