#!/usr/bin/env bash
# Makes a PostgreSQL server reachable for the Postgres checkpointer tests: reuses
# $PEREGRINE_TEST_POSTGRES_URL when it answers, else runs a throwaway loopback cluster.
#
# Usage:
#   eval "$(scripts/postgres.sh start [--url-file FILE] [STATE_DIR])"
#       Prints `export PEREGRINE_TEST_POSTGRES_URL=...` (and, for a cluster this script runs,
#       `export PEREGRINE_TEST_POSTGRES_STATE=...`) on stdout; everything else goes to stderr.
#       With --url-file, the URL is also written to FILE. On failure it prints `false`, so the
#       eval fails too (and stops a `set -e` script).
#   scripts/postgres.sh stop [STATE_DIR]
#       Stops the throwaway cluster and deletes its state directory.
#   scripts/postgres.sh status [STATE_DIR]
#       Exits 0 and prints the URL when the throwaway cluster is running.
#
# STATE_DIR defaults to $PEREGRINE_TEST_POSTGRES_STATE, else ${TMPDIR:-/tmp}/peregrine-postgres.
# A second `start` while the cluster runs reuses it. Port: $PEREGRINE_TEST_POSTGRES_PORT, else the
# first free port from 54329. The cluster trusts every local connection: it is for tests only.
# Binaries come from /usr/lib/postgresql/<newest>/bin; when none exist and we are root, the
# script runs `apt-get install -y postgresql` first.
set -euo pipefail

readonly DATABASE=peregrine_test
readonly SUPERUSER=postgres

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
# Set by `start`, whose stdout is eval'ed: on failure it also prints `false`, so that
# `eval "$(scripts/postgres.sh start)"` fails (and stops a `set -e` script) instead of
# evaluating nothing and carrying on.
EVAL_FAILURE=0

die() {
    printf 'postgres.sh: error: %s\n' "$*" >&2
    if [ "$EVAL_FAILURE" = 1 ]; then
        printf 'false\n'
    fi
    exit 1
}

usage() {
    sed -n '5,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

is_root() { [ "$(id -u)" = 0 ]; }

# Runs a command as the cluster owner: the postgres user when we are root (initdb refuses root),
# else ourselves.
as_owner() {
    if is_root; then
        runuser -u "$SUPERUSER" -- "$@"
    else
        "$@"
    fi
}

pg_bin_dir() {
    local dir
    dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -type d -name bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
        printf '%s\n' "$dir"
    fi
}

ensure_binaries() {
    local dir
    dir=$(pg_bin_dir)
    if [ -z "$dir" ]; then
        is_root || die "no PostgreSQL binaries under /usr/lib/postgresql/*/bin; install them (apt-get install -y postgresql) or set PEREGRINE_TEST_POSTGRES_URL to a reachable server"
        log "no PostgreSQL binaries found; installing the postgresql package"
        (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql) >&2 ||
            die "apt-get install -y postgresql failed; install PostgreSQL by hand or set PEREGRINE_TEST_POSTGRES_URL"
        dir=$(pg_bin_dir)
        [ -n "$dir" ] || die "postgresql was installed but no initdb/pg_ctl under /usr/lib/postgresql/*/bin"
    fi
    if is_root && ! id "$SUPERUSER" >/dev/null 2>&1; then
        die "running as root but there is no '$SUPERUSER' user to own the cluster (initdb refuses root); create it or run as a normal user"
    fi
    printf '%s\n' "$dir"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
    local port=${PEREGRINE_TEST_POSTGRES_PORT:-54329} last
    last=$((port + 100))
    while [ "$port" -lt "$last" ]; do
        if ! port_in_use "$port"; then
            printf '%s\n' "$port"
            return 0
        fi
        port=$((port + 1))
    done
    die "no free loopback port in ${PEREGRINE_TEST_POSTGRES_PORT:-54329}..$((last - 1)); set PEREGRINE_TEST_POSTGRES_PORT"
}

url_for_port() { printf 'postgresql://%s@127.0.0.1:%s/%s\n' "$SUPERUSER" "$1" "$DATABASE"; }

default_state_dir() { printf '%s\n' "${PEREGRINE_TEST_POSTGRES_STATE:-${TMPDIR:-/tmp}/peregrine-postgres}"; }

emit() {
    local url=$1 state=${2:-} url_file=${3:-}
    if [ -n "$url_file" ]; then
        printf '%s\n' "$url" >"$url_file" || die "cannot write the URL to $url_file"
    fi
    printf 'export PEREGRINE_TEST_POSTGRES_URL=%q\n' "$url"
    if [ -n "$state" ]; then
        printf 'export PEREGRINE_TEST_POSTGRES_STATE=%q\n' "$state"
    fi
}

# Whether the cluster in $1 runs and answers on the port recorded there.
cluster_running() {
    local state=$1 bin=$2
    [ -f "$state/data/postmaster.pid" ] && [ -f "$state/port" ] || return 1
    as_owner "$bin/pg_ctl" -D "$state/data" status >/dev/null 2>&1 || return 1
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$(cat "$state/port")" -U "$SUPERUSER" -t 5
}

ensure_database() {
    local bin=$1 port=$2 exists
    exists=$("$bin/psql" -h 127.0.0.1 -p "$port" -U "$SUPERUSER" -d postgres -tAXc \
        "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'") || die "cannot query the cluster on port $port"
    if [ "$exists" != 1 ]; then
        "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$SUPERUSER" "$DATABASE" || die "createdb $DATABASE failed"
    fi
}

cmd_start() {
    EVAL_FAILURE=1
    local url_file="" state=""
    while [ $# -gt 0 ]; do
        case $1 in
            --url-file) [ $# -ge 2 ] || usage; url_file=$2; shift 2 ;;
            -h | --help) usage ;;
            -*) die "unknown option $1" ;;
            *) [ -z "$state" ] || usage; state=$1; shift ;;
        esac
    done

    if [ -n "${PEREGRINE_TEST_POSTGRES_URL:-}" ]; then
        if command -v pg_isready >/dev/null 2>&1 && pg_isready -q -d "$PEREGRINE_TEST_POSTGRES_URL" -t 5; then
            log "using the server already named by PEREGRINE_TEST_POSTGRES_URL"
            emit "$PEREGRINE_TEST_POSTGRES_URL" "" "$url_file"
            return 0
        fi
        log "PEREGRINE_TEST_POSTGRES_URL is set but does not answer (or pg_isready is missing); starting a throwaway cluster instead"
    fi

    state=${state:-$(default_state_dir)}
    local bin port
    bin=$(ensure_binaries)

    if cluster_running "$state" "$bin"; then
        port=$(cat "$state/port")
        log "reusing the cluster already running in $state on port $port"
        ensure_database "$bin" "$port"
        emit "$(url_for_port "$port")" "$state" "$url_file"
        return 0
    fi

    # Unix socket paths are limited to 107 bytes; the socket is $state/.s.PGSQL.<port>.
    [ ${#state} -le 80 ] || die "state directory path is too long for a Unix socket (${#state} > 80 characters): $state"
    mkdir -p "$state" || die "cannot create $state"
    state=$(cd "$state" && pwd)
    if is_root; then
        chown "$SUPERUSER:" "$state"
    fi
    chmod 700 "$state"
    as_owner test -w "$state" || die "$state is not writable by the cluster owner '$SUPERUSER' (is a parent directory private?); pass another STATE_DIR"

    if [ ! -f "$state/data/PG_VERSION" ]; then
        log "creating a throwaway cluster in $state/data"
        as_owner "$bin/initdb" -D "$state/data" -A trust -U "$SUPERUSER" -E UTF8 --no-locale --no-sync >"$state/initdb.log" 2>&1 ||
            {
                cat "$state/initdb.log" >&2
                die "initdb failed (log above)"
            }
    fi

    port=$(free_port)
    printf '%s\n' "$port" >"$state/port"
    log "starting PostgreSQL on 127.0.0.1:$port"
    if ! as_owner "$bin/pg_ctl" -D "$state/data" -l "$state/pg.log" -w -t 60 \
        -o "-p $port -k $state -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null; then
        tail -n 30 "$state/pg.log" >&2 || true
        die "pg_ctl start failed (server log above, in $state/pg.log)"
    fi
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U "$SUPERUSER" -t 30 || die "the server started but does not answer on port $port"
    ensure_database "$bin" "$port"
    log "ready: $(url_for_port "$port") (stop with: scripts/postgres.sh stop $state)"
    emit "$(url_for_port "$port")" "$state" "$url_file"
}

cmd_stop() {
    [ $# -le 1 ] || usage
    local state=${1:-$(default_state_dir)} bin
    if [ ! -d "$state" ]; then
        log "nothing to stop: $state does not exist"
        return 0
    fi
    [ -f "$state/data/PG_VERSION" ] || die "$state does not hold a cluster made by this script; refusing to delete it"
    bin=$(pg_bin_dir)
    if [ -n "$bin" ] && [ -f "$state/data/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$state/data" -m fast -w -t 60 stop >/dev/null 2>&1 ||
            log "pg_ctl stop reported an error (the server may already be gone)"
    fi
    rm -rf -- "$state/data" "$state/port" "$state/pg.log" "$state/initdb.log" "$state"/.s.PGSQL.*
    rmdir -- "$state" 2>/dev/null || log "left $state in place: it holds other files"
    log "stopped and removed the cluster in $state"
}

cmd_status() {
    [ $# -le 1 ] || usage
    local state=${1:-$(default_state_dir)} bin
    bin=$(pg_bin_dir)
    [ -n "$bin" ] || die "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"
    if cluster_running "$state" "$bin"; then
        url_for_port "$(cat "$state/port")"
    else
        log "no cluster running in $state"
        return 1
    fi
}

main() {
    [ $# -ge 1 ] || usage
    local command=$1
    shift
    case $command in
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        -h | --help | help) usage ;;
        *) die "unknown command '$command' (expected start, stop or status)" ;;
    esac
}

main "$@"
