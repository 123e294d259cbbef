# Shared by scripts/up.sh and scripts/down.sh (sourced, not run): the local stack's environment.
#
# - The engine (LOCAL_ENGINE): the Pulumi CLI, pinned to the SDK's version, found on PATH or in
#   ~/.pulumi/bin, else installed with Pulumi's official installer (one quick attempt; where
#   get.pulumi.com cannot be reached it fails within seconds); when there is still no CLI, the
#   Pulumi stand-in (`python -m pulumi_standin`, docs/offline.md), announced in ONE banner line.
#   PULUMI_ENGINE=cli|standin forces one (default auto). `make down` uses whichever holds state.
# - The state: the CLI's file backend in .pulumi-state/ (PULUMI_BACKEND_URL, for these commands
#   only: your global `pulumi login` is left alone), the stand-in's file .pulumi-offline/local.json
#   (STANDIN_STATE).
# - PULUMI_CONFIG_PASSPHRASE: encrypts the local stack's secrets (its generated API keys and
#   proxy token, all emulator-only). Defaults to "local-emulator"; export your own to override.
#   `pulumi stack init` writes a non-secret `encryptionsalt:` line into Pulumi.local.yaml.
# - The Modal emulator on 127.0.0.1:$EMULATOR_PORT, state in $EMULATOR_DIR/state.sqlite3, pid
#   in $EMULATOR_DIR/emulator.pid (also written by `make emulator`; one found listening on the
#   port is reused too). It accepts any token; the providers get throwaway
#   MODAL_TOKEN_ID/MODAL_TOKEN_SECRET values. The port comes from Pulumi.local.yaml's
#   modal:serverUrl, which the CLI's providers use (it wins over MODAL_SERVER_URL there): with
#   the CLI an EMULATOR_PORT that disagrees stops here with the command that changes the stack
#   file. The stand-in passes the emulator URL to the providers itself, so any port works.

PULUMI_VERSION="3.272.0" # same version as the pulumi Python SDK pinned in pyproject.toml
PULUMI_INSTALL_URL="${PULUMI_INSTALL_URL:-https://get.pulumi.com}" # Pulumi's official installer
# The emulator URL the local stack file points at (modal:serverUrl), and its port.
STACK_SERVER_URL="$(sed -n 's/^ *modal:serverUrl: *//p' Pulumi.local.yaml 2>/dev/null | tr -d "\"'" | head -n 1)"
STACK_EMULATOR_PORT="${STACK_SERVER_URL##*:}"
STACK_EMULATOR_PORT="${STACK_EMULATOR_PORT%%/*}"
EMULATOR_PORT="${EMULATOR_PORT:-${STACK_EMULATOR_PORT:-8790}}"
EMULATOR_DIR="${EMULATOR_DIR:-.modal-emulator}"
EMULATOR_PID_FILE="$EMULATOR_DIR/emulator.pid"
EMULATOR_LOG="$EMULATOR_DIR/emulator.log"
PY=".venv/bin/python"
STANDIN_STATE="${STANDIN_STATE:-.pulumi-offline/local.json}"
LOCAL_ENGINE="" # cli | standin, set by choose_engine

export PULUMI_BACKEND_URL="file://$PWD/.pulumi-state"
export PULUMI_CONFIG_PASSPHRASE="${PULUMI_CONFIG_PASSPHRASE-local-emulator}"
export PULUMI_SKIP_UPDATE_CHECK=true
export MODAL_SERVER_URL="http://127.0.0.1:$EMULATOR_PORT"
export MODAL_TOKEN_ID="${MODAL_TOKEN_ID:-ak-local-emulator}"
export MODAL_TOKEN_SECRET="${MODAL_TOKEN_SECRET:-as-local-emulator}"

die() {
    echo "error: $*" >&2
    exit 1
}

# EMULATOR_PORT must be the port Pulumi.local.yaml's modal:serverUrl names: the providers use
# that URL, so an emulator started elsewhere would never be reached.
check_emulator_port() {
    if [ "$LOCAL_ENGINE" != "standin" ] && [ -n "$STACK_EMULATOR_PORT" ] && [ "$EMULATOR_PORT" != "$STACK_EMULATOR_PORT" ]; then
        die "EMULATOR_PORT=$EMULATOR_PORT, but Pulumi.local.yaml's modal:serverUrl is \
$STACK_SERVER_URL and the providers use that URL. Either unset EMULATOR_PORT, or point the \
stack at the new port: pulumi config set modal:serverUrl http://127.0.0.1:$EMULATOR_PORT --stack local"
    fi
}

# Warn when the installed CLI is not the pinned version (the SDK in .venv is $PULUMI_VERSION).
check_pulumi_version() {
    local found
    found="$(pulumi version 2>/dev/null | tr -d '[:space:]')"
    found="${found#v}"
    if [ "$found" != "$PULUMI_VERSION" ]; then
        echo "warning: pulumi CLI ${found:-of unknown version} is installed; this project pins \
$PULUMI_VERSION (the Python SDK's version). It usually works; if not, install the pinned one: \
curl -fsSL https://get.pulumi.com | sh -s -- --version $PULUMI_VERSION" >&2
    fi
}

# The Pulumi CLI on PATH (or in ~/.pulumi/bin), else one attempt with Pulumi's official
# installer. Returns 1, quietly, when there is none; PULUMI_MISSING_WHY then says why.
find_pulumi_cli() {
    PULUMI_MISSING_WHY=""
    if command -v pulumi >/dev/null 2>&1; then
        check_pulumi_version
        return 0
    fi
    if [ -x "$HOME/.pulumi/bin/pulumi" ]; then
        export PATH="$HOME/.pulumi/bin:$PATH"
        check_pulumi_version
        return 0
    fi
    local installer err
    installer="$(mktemp)"
    if err="$(curl -fsSL --connect-timeout 5 --max-time 60 -o "$installer" "$PULUMI_INSTALL_URL" 2>&1)"; then
        echo "Pulumi CLI not found: installing $PULUMI_VERSION with Pulumi's official installer..."
        if sh "$installer" --version "$PULUMI_VERSION" --no-edit-path; then
            rm -f "$installer"
            export PATH="$HOME/.pulumi/bin:$PATH"
            command -v pulumi >/dev/null 2>&1 && return 0
        fi
        PULUMI_MISSING_WHY="Pulumi's installer failed"
    else
        err="$(printf '%s\n' "$err" | sed -n '1s/^curl: ([0-9]*) //p')"
        PULUMI_MISSING_WHY="not installed, and $PULUMI_INSTALL_URL is not reachable: ${err:-no answer}"
    fi
    rm -f "$installer"
    return 1
}

# The hint printed where only the CLI will do (e.g. destroying a stack the CLI made).
pulumi_install_hint() {
    cat >&2 <<MSG
How to get the Pulumi CLI $PULUMI_VERSION, on a machine with internet access:
    curl -fsSL https://get.pulumi.com | sh -s -- --version $PULUMI_VERSION
  or download pulumi-v$PULUMI_VERSION-linux-x64.tar.gz from
    https://github.com/pulumi/pulumi/releases/tag/v$PULUMI_VERSION
  and put its pulumi/ directory on PATH (or at ~/.pulumi/bin).
MSG
}

# Sets LOCAL_ENGINE to cli or standin (PULUMI_ENGINE=auto|cli|standin) and says which, once.
choose_engine() {
    case "${PULUMI_ENGINE:-auto}" in
    standin)
        LOCAL_ENGINE=standin
        echo "Engine: the Pulumi stand-in (PULUMI_ENGINE=standin; NOT the Pulumi engine, docs/offline.md)."
        ;;
    cli)
        if ! find_pulumi_cli; then
            echo "error: PULUMI_ENGINE=cli, but the Pulumi CLI is $PULUMI_MISSING_WHY" >&2
            pulumi_install_hint
            exit 1
        fi
        LOCAL_ENGINE=cli
        ;;
    auto)
        if find_pulumi_cli; then
            LOCAL_ENGINE=cli
        else
            LOCAL_ENGINE=standin
            echo "No Pulumi CLI ($PULUMI_MISSING_WHY): using the Pulumi stand-in python -m pulumi_standin instead (NOT the Pulumi engine; docs/offline.md)."
        fi
        ;;
    *) die "PULUMI_ENGINE=${PULUMI_ENGINE} is not one of auto, cli, standin" ;;
    esac
}

standin() {
    "$PY" -m pulumi_standin "$@" --stack "$STACK" --state "$STANDIN_STATE" \
        --server-url "$MODAL_SERVER_URL"
}

# Holds the stand-in's state file any resource (what `make down` must destroy)?
standin_has_resources() {
    [ -f "$STANDIN_STATE" ] && "$PY" -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("resources") else 1)' "$STANDIN_STATE" 2>/dev/null
}

# The pid of an emulator serving $EMULATOR_PORT: ours (pid file, also written by `make
# emulator`), else whatever `python -m emulator serve` listens on the port. Empty if none.
emulator_pid() {
    local pid=""
    if [ -f "$EMULATOR_PID_FILE" ] && kill -0 "$(cat "$EMULATOR_PID_FILE")" 2>/dev/null; then
        pid="$(cat "$EMULATOR_PID_FILE")"
    elif command -v ss >/dev/null 2>&1; then
        pid="$(ss -ltnpH "sport = :$EMULATOR_PORT" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n 1)"
    fi
    if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "-m emulator serve"; then
        echo "$pid"
    fi
}

port_taken() {
    (exec 3<>"/dev/tcp/127.0.0.1/$EMULATOR_PORT") 2>/dev/null
}

start_emulator() {
    mkdir -p "$EMULATOR_DIR"
    local pid
    pid="$(emulator_pid)"
    if [ -n "$pid" ]; then
        echo "Modal emulator already running on 127.0.0.1:$EMULATOR_PORT (pid $pid): reusing it."
        return 0
    fi
    if port_taken; then
        die "127.0.0.1:$EMULATOR_PORT is taken by something that is not the Modal emulator; \
free it, or use another port (see check_emulator_port in scripts/local-env.sh)"
    fi
    echo "Starting the Modal emulator on 127.0.0.1:$EMULATOR_PORT (log: $EMULATOR_LOG)..."
    nohup "$PY" -m emulator serve --port "$EMULATOR_PORT" \
        --state "$EMULATOR_DIR/state.sqlite3" >"$EMULATOR_LOG" 2>&1 &
    echo $! >"$EMULATOR_PID_FILE"
    local i
    for i in $(seq 1 100); do
        if grep -q "MODAL EMULATOR READY" "$EMULATOR_LOG" 2>/dev/null; then
            grep "MODAL EMULATOR READY" "$EMULATOR_LOG"
            return 0
        fi
        if ! kill -0 "$(cat "$EMULATOR_PID_FILE")" 2>/dev/null; then
            rm -f "$EMULATOR_PID_FILE"
            tail -n 20 "$EMULATOR_LOG" >&2
            die "the Modal emulator exited during start-up (is port $EMULATOR_PORT taken?)"
        fi
        sleep 0.2
    done
    stop_emulator
    die "the Modal emulator did not report ready within 20 s (see $EMULATOR_LOG)"
}

# Stops the emulator on $EMULATOR_PORT (ours, or one `make emulator` started) and waits until
# it is gone (it stops its containers first).
stop_emulator() {
    local pid
    pid="$(emulator_pid)"
    if [ -z "$pid" ]; then
        echo "Modal emulator not running."
    else
        kill -TERM "$pid" # it stops every container before it exits
        local i
        for i in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "Modal emulator (pid $pid) ignored SIGTERM for 20 s; killing it." >&2
            kill -KILL "$pid"
        fi
        echo "Modal emulator (pid $pid) stopped."
    fi
    rm -f "$EMULATOR_PID_FILE"
}

# The emulator's state in $EMULATOR_DIR (SQLite file, volumes, edge ports); its log is kept.
remove_emulator_state() {
    rm -rf "$EMULATOR_DIR/state.sqlite3" "$EMULATOR_DIR/state.sqlite3-wal" \
        "$EMULATOR_DIR/state.sqlite3-shm" "$EMULATOR_DIR/state.sqlite3-journal" \
        "$EMULATOR_DIR/state.sqlite3.d"
}

# `pulumi stack select` of an existing stack; returns 1 (quietly) only when the stack does
# not exist, and stops with the CLI's own message on any other failure.
select_existing_stack() {
    local out
    if out="$(pulumi stack select --non-interactive "$1" 2>&1)"; then
        return 0
    fi
    if printf '%s' "$out" | grep -qi "no stack named"; then
        return 1
    fi
    printf '%s\n' "$out" >&2
    die "\`pulumi stack select $1\` failed (above); fix that first (backend: $PULUMI_BACKEND_URL)"
}

require_local_stack() {
    if [ "$1" != "local" ]; then
        die "scripts/$(basename "$0") drives the emulator-backed 'local' stack only; for '$1' \
use the Pulumi CLI against your own backend: pulumi up --stack $1 (CI does this on main)"
    fi
}
