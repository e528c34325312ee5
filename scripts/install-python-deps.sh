#!/usr/bin/env bash
# Installs the Python packages the tests use: the official `openai` client, pinned, which
# crates/peregrine-server/tests/openai_python.rs drives against the served API. Quiet (prints
# only errors) and a no-op when the pinned version is already importable. Installs with
# `python3 -m pip`; on a Python whose environment is marked externally managed (PEP 668) it
# retries with --break-system-packages.
#
# Usage: scripts/install-python-deps.sh
set -euo pipefail

readonly OPENAI_VERSION="3.51.0"

log() { printf 'install-python-deps.sh: %s\n' "$*" >&2; }

if ! command -v python3 >/dev/null 2>&1; then
    log "python3 is missing: install it (apt-get install -y python3 python3-pip) and run this again"
    exit 1
fi

installed_version() {
    python3 -c 'import openai; print(openai.__version__)' 2>/dev/null || true
}

if [[ "$(installed_version)" == "$OPENAI_VERSION" ]]; then
    exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
    log "pip is missing for python3: install it (apt-get install -y python3-pip) and run this again"
    exit 1
fi

pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check --no-input "$@" "openai==${OPENAI_VERSION}"
}

errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
if ! pip_install 2>"$errors" >/dev/null; then
    if ! grep -q 'externally-managed-environment' "$errors" || ! pip_install --break-system-packages 2>"$errors" >/dev/null; then
        cat "$errors" >&2
        log "pip could not install openai==${OPENAI_VERSION}"
        exit 1
    fi
fi

found=$(installed_version)
if [[ "$found" != "$OPENAI_VERSION" ]]; then
    log "after pip install, python3 imports openai '${found:-none}', not ${OPENAI_VERSION}"
    exit 1
fi
