# Shared by scripts/up.sh and scripts/down.sh (sourced, not run): the local stack's environment.
#
# - The Pulumi CLI, pinned to the SDK's version; installed with Pulumi's official installer
#   when missing. Where get.pulumi.com cannot be reached, stop and say how to get it.
# - The state backend: a file backend inside the repo (.pulumi-state/, gitignored), chosen with
#   PULUMI_BACKEND_URL for these commands only (your global `pulumi login` is left alone).
# - PULUMI_CONFIG_PASSPHRASE: encrypts the local stack's secrets (its generated API keys and
#   proxy token, all emulator-only). Defaults to "local-emulator"; export your own to override.
#   `pulumi stack init` writes a non-secret `encryptionsalt:` line into Pulumi.local.yaml.
# - The Modal emulator on 127.0.0.1:$EMULATOR_PORT, state in .modal-emulator/state.sqlite3, pid
#   in .modal-emulator/emulator.pid. It accepts any token; the providers get throwaway
#   MODAL_TOKEN_ID/MODAL_TOKEN_SECRET values. The port comes from Pulumi.local.yaml's
#   modal:serverUrl (which wins over MODAL_SERVER_URL in the providers): an EMULATOR_PORT that
#   disagrees with it stops here with the command that changes the stack file.

PULUMI_VERSION="3.272.0" # same version as the pulumi Python SDK pinned in pyproject.toml
PULUMI_INSTALL_URL="${PULUMI_INSTALL_URL:-https://get.pulumi.com}" # Pulumi's official installer
# The emulator URL the local stack file points at (modal:serverUrl), and its port.
STACK_SERVER_URL="$(sed -n 's/^ *modal:serverUrl: *//p' Pulumi.local.yaml 2>/dev/null | tr -d "\"'" | head -n 1)"
STACK_EMULATOR_PORT="${STACK_SERVER_URL##*:}"
STACK_EMULATOR_PORT="${STACK_EMULATOR_PORT%%/*}"
EMULATOR_PORT="${EMULATOR_PORT:-${STACK_EMULATOR_PORT:-8790}}"
EMULATOR_DIR=".modal-emulator"
EMULATOR_PID_FILE="$EMULATOR_DIR/emulator.pid"
EMULATOR_LOG="$EMULATOR_DIR/emulator.log"
PY=".venv/bin/python"

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
    if [ -n "$STACK_EMULATOR_PORT" ] && [ "$EMULATOR_PORT" != "$STACK_EMULATOR_PORT" ]; then
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

ensure_pulumi_cli() {
    if command -v pulumi >/dev/null 2>&1; then
        check_pulumi_version
        return 0
    fi
    if [ -x "$HOME/.pulumi/bin/pulumi" ]; then
        export PATH="$HOME/.pulumi/bin:$PATH"
        check_pulumi_version
        return 0
    fi
    echo "Pulumi CLI not found: installing $PULUMI_VERSION with Pulumi's official installer..."
    local installer
    installer="$(mktemp)"
    if curl -fsSL --connect-timeout 10 --max-time 60 -o "$installer" "$PULUMI_INSTALL_URL" \
        && sh "$installer" --version "$PULUMI_VERSION" --no-edit-path; then
        rm -f "$installer"
        export PATH="$HOME/.pulumi/bin:$PATH"
        command -v pulumi >/dev/null 2>&1 && return 0
    fi
    rm -f "$installer"
    cat >&2 <<MSG
error: the Pulumi CLI is missing and could not be installed ($PULUMI_INSTALL_URL is not
reachable from this machine).
What is missing: the \`pulumi\` command, version $PULUMI_VERSION.
How to get it, on a machine with internet access:
    curl -fsSL https://get.pulumi.com | sh -s -- --version $PULUMI_VERSION
  or download pulumi-v$PULUMI_VERSION-linux-x64.tar.gz from
    https://github.com/pulumi/pulumi/releases/tag/v$PULUMI_VERSION
  and put its pulumi/ directory on PATH (or at ~/.pulumi/bin). Then run \`make up\` again.
Without the CLI you can still run the program's tests (make test), or try the local stack
through the offline stand-in (not the Pulumi engine; docs/offline.md): make plan, or
make emulator in one terminal and make offline-up in another.
MSG
    exit 1
}

emulator_running() {
    [ -f "$EMULATOR_PID_FILE" ] && kill -0 "$(cat "$EMULATOR_PID_FILE")" 2>/dev/null
}

start_emulator() {
    mkdir -p "$EMULATOR_DIR"
    if emulator_running; then
        echo "Modal emulator already running (pid $(cat "$EMULATOR_PID_FILE"))."
        return 0
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
        if ! emulator_running; then
            rm -f "$EMULATOR_PID_FILE"
            tail -n 20 "$EMULATOR_LOG" >&2
            die "the Modal emulator exited during start-up (is port $EMULATOR_PORT taken?)"
        fi
        sleep 0.2
    done
    stop_emulator
    die "the Modal emulator did not report ready within 20 s (see $EMULATOR_LOG)"
}

stop_emulator() {
    if ! emulator_running; then
        rm -f "$EMULATOR_PID_FILE"
        echo "Modal emulator not running."
        return 0
    fi
    local pid
    pid="$(cat "$EMULATOR_PID_FILE")"
    kill -TERM "$pid"
    local i
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "Modal emulator (pid $pid) ignored SIGTERM for 10 s; killing it." >&2
        kill -KILL "$pid"
    fi
    rm -f "$EMULATOR_PID_FILE"
    echo "Modal emulator stopped (state kept in $EMULATOR_DIR/state.sqlite3)."
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
