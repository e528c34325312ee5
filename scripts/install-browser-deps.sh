#!/usr/bin/env bash
# Installs what the web UI test (crates/peregrine-server/tests/web_ui.rs) drives: Debian's
# Chromium at /usr/bin/chromium (apt-get, only when it is missing) and the Python Playwright
# client, pinned. Playwright's own browser download (`playwright install`) is never run: the
# test launches the system Chromium. Quiet (prints only errors) and a no-op when both are
# already there. Installs with `python3 -m pip`; on a Python whose environment is marked
# externally managed (PEP 668) it retries with --break-system-packages.
#
# Usage: scripts/install-browser-deps.sh
set -euo pipefail

readonly PLAYWRIGHT_VERSION="1.65.2"
readonly CHROMIUM="/usr/bin/chromium"

log() { printf 'install-browser-deps.sh: %s\n' "$*" >&2; }

# --- Chromium -------------------------------------------------------------------------------
if [[ ! -x "$CHROMIUM" ]]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "$CHROMIUM is missing and there is no apt-get: install Chromium so that $CHROMIUM runs, then run this again"
        exit 1
    fi
    sudo_cmd=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if ! command -v sudo >/dev/null 2>&1; then
            log "$CHROMIUM is missing and installing it needs root: run this as root or install sudo"
            exit 1
        fi
        sudo_cmd=(sudo)
    fi
    apt_log=$(mktemp)
    if ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$apt_log" 2>&1 \
        || ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >"$apt_log" 2>&1; then
        cat "$apt_log" >&2
        rm -f "$apt_log"
        log "apt-get could not install chromium"
        exit 1
    fi
    rm -f "$apt_log"
    if [[ ! -x "$CHROMIUM" ]]; then
        log "apt-get installed chromium but $CHROMIUM is still missing"
        exit 1
    fi
fi

# --- Python Playwright ----------------------------------------------------------------------
if ! command -v python3 >/dev/null 2>&1; then
    log "python3 is missing: install it (apt-get install -y python3 python3-pip) and run this again"
    exit 1
fi

installed_version() {
    python3 -c 'from importlib.metadata import version; import playwright.sync_api; print(version("playwright"))' 2>/dev/null || true
}

if [[ "$(installed_version)" == "$PLAYWRIGHT_VERSION" ]]; then
    exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
    log "pip is missing for python3: install it (apt-get install -y python3-pip) and run this again"
    exit 1
fi

pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check --no-input "$@" "playwright==${PLAYWRIGHT_VERSION}"
}

errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
if ! pip_install 2>"$errors" >/dev/null; then
    if ! grep -q 'externally-managed-environment' "$errors" || ! pip_install --break-system-packages 2>"$errors" >/dev/null; then
        cat "$errors" >&2
        log "pip could not install playwright==${PLAYWRIGHT_VERSION}"
        exit 1
    fi
fi

found=$(installed_version)
if [[ "$found" != "$PLAYWRIGHT_VERSION" ]]; then
    log "after pip install, python3 imports playwright '${found:-none}', not ${PLAYWRIGHT_VERSION}"
    exit 1
fi
