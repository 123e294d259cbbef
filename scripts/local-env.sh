# shellcheck shell=bash disable=SC2034 # its variables are read by the scripts that source it
# Shared by scripts/up.sh, scripts/down.sh and scripts/emulator.sh (sourced, not run): the local
# stack's environment.
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
# - The Modal emulator: THIS checkout's own, known by its state file ($EMULATOR_DIR/state.sqlite3,
#   an absolute path on its command line) and its pid file ($EMULATOR_DIR/emulator.pid, also
#   written by `make emulator`), never by its port: an emulator of another checkout on the same
#   machine is neither reused nor stopped. Its port: EMULATOR_PORT when exported (that port or a
#   clear stop), else the one Pulumi.local.yaml's modal:serverUrl names (8790) when it and the
#   next one (the emulator's control surface) are free, else a free pair. It accepts any token;
#   the providers get throwaway MODAL_TOKEN_ID/MODAL_TOKEN_SECRET values.
# - The stack file keeps modal:serverUrl (a plain `pulumi up --stack local` must never reach
#   real Modal, so the local stack always names a loopback emulator). When the emulator runs on
#   another port, each run gets the actual URL for that run only: the stand-in with
#   --server-url, the CLI with --config-file $EMULATOR_DIR/Pulumi.local.run.yaml (the stack
#   file with the actual URL, scripts/stack_file.py); Pulumi.local.yaml is never rewritten.

PULUMI_VERSION="3.272.0" # same version as the pulumi Python SDK pinned in pyproject.toml
PULUMI_INSTALL_URL="${PULUMI_INSTALL_URL:-https://get.pulumi.com}" # Pulumi's official installer
# The emulator URL and port the stack file names (modal:serverUrl): read_stack_url sets them.
STACK_SERVER_URL=""
STACK_EMULATOR_PORT=""
EMULATOR_PORT_ASKED="${EMULATOR_PORT:-}" # exported by the user: that port, or a clear stop
EMULATOR_PORT=""                         # the port of this run's emulator (start_emulator)
EMULATOR_URL=""                          # its URL, what the engine gets (start_emulator)
EMULATOR_DIR="${EMULATOR_DIR:-.modal-emulator}"
EMULATOR_PID_FILE="$EMULATOR_DIR/emulator.pid"
EMULATOR_LOG="$EMULATOR_DIR/emulator.log"
# The identity of this checkout's emulator: its state file, as an absolute path.
EMULATOR_STATE="$(realpath -m "$EMULATOR_DIR/state.sqlite3")"
EMULATOR_RUN_CONFIG="$EMULATOR_DIR/Pulumi.local.run.yaml"
CLI_CONFIG_ARGS=() # (--config-file FILE) when the CLI must be told the emulator's actual URL
PY=".venv/bin/python"
STANDIN_STATE="${STANDIN_STATE:-.pulumi-offline/local.json}"
# The access stack 'local' (`python -m pulumi_standin up --cwd access --stack local`): its
# stand-in state. While it holds resources the local stack runs in managed mode (MANAGED=0:
# not; scripts/offline_stack.py) and `make down` destroys it after the local stack.
export ACCESS_STATE="${ACCESS_STATE:-access/.pulumi-offline/local.json}"
# The LiteLLM file `make gateway-config` writes; `make up` rewrites it when it exists.
GATEWAY_FILE="${GATEWAY_FILE:-.gateway/litellm-local.yaml}"
LOCAL_ENGINE="" # cli | standin, set by choose_engine

export PULUMI_BACKEND_URL="file://$PWD/.pulumi-state"
export PULUMI_CONFIG_PASSPHRASE="${PULUMI_CONFIG_PASSPHRASE-local-emulator}"
export PULUMI_SKIP_UPDATE_CHECK=true
# Never a Modal of the user's environment: start_emulator sets the emulator's actual URL.
export MODAL_SERVER_URL="http://127.0.0.1:${EMULATOR_PORT_ASKED:-8790}"
export MODAL_TOKEN_ID="${MODAL_TOKEN_ID:-ak-local-emulator}"
export MODAL_TOKEN_SECRET="${MODAL_TOKEN_SECRET:-as-local-emulator}"

die() {
    echo "error: $*" >&2
    exit 1
}

# Reads Pulumi.local.yaml's modal:serverUrl (STACK_SERVER_URL, STACK_EMULATOR_PORT), checked at
# once: a YAML error or a URL that is not http(s) on this machine with a numeric port stops here
# with one line, before any emulator starts.
read_stack_url() {
    local found
    found="$("$PY" scripts/stack_file.py server-url --stack "$STACK")" || exit 1
    STACK_SERVER_URL="${found% *}"
    STACK_EMULATOR_PORT="${found##* }"
}

# For the Pulumi CLI: when this checkout's emulator is not where the stack file points, write
# the stack file with the actual URL and pass it with --config-file (CLI_CONFIG_ARGS), for this
# run only. The stand-in needs none of this: it gets --server-url.
cli_config_args() {
    CLI_CONFIG_ARGS=()
    if [ "$EMULATOR_URL" != "$STACK_SERVER_URL" ]; then
        "$PY" scripts/stack_file.py run-config --stack "$STACK" --server-url "$EMULATOR_URL" \
            --out "$EMULATOR_RUN_CONFIG" || exit 1
        CLI_CONFIG_ARGS=(--config-file "$EMULATOR_RUN_CONFIG")
        echo "This checkout's emulator is on $EMULATOR_URL, not Pulumi.local.yaml's \
$STACK_SERVER_URL: pulumi gets the actual URL with --config-file $EMULATOR_RUN_CONFIG for \
this run (Pulumi.local.yaml stays as committed)."
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
        echo "Pulumi CLI not found: installing $PULUMI_VERSION with Pulumi's official installer" \
            "(it downloads the CLI's release archive: under a minute on a fast line, a few min" \
            "on a slow one; PULUMI_ENGINE=standin skips it)..."
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

# The stand-in on the root project's stack, through scripts/offline_stack.py: in managed mode
# (the access stack 'local' deployed, MANAGED unset or 1) every run gets managedByAccessStack
# and the access stack's proxy token, so that up, plan, refresh and down agree.
standin() {
    "$PY" scripts/offline_stack.py "$@" --stack "$STACK" --state "$STANDIN_STATE" \
        --server-url "$MODAL_SERVER_URL"
}

# The access stack 'local' (access/, run by hand: docs/program.md, Access) with the stand-in.
access_standin() {
    "$PY" -m pulumi_standin "$@" --cwd access --stack "$STACK" --state "$ACCESS_STATE" \
        --server-url "$MODAL_SERVER_URL"
}

# Holds the access stack's stand-in state any resource?
access_has_resources() {
    [ -f "$ACCESS_STATE" ] && "$PY" -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("resources") else 1)' "$ACCESS_STATE" 2>/dev/null
}

# Run in the background while a command talks to this checkout's emulator: once the emulator
# dies, say so within a second with its log's last lines, and stop the command (a pulumi run or
# the endpoint check), which would otherwise retry Modal for minutes (issue 22 item 7).
# Usage: watch_emulator & WATCHER=$!; ...; kill "$WATCHER".
watch_emulator() {
    local pid
    pid="$(cat "$EMULATOR_PID_FILE" 2>/dev/null)" || return 0
    [ -n "$pid" ] || return 0
    while kill -0 "$pid" 2>/dev/null; do sleep 1; done
    {
        echo
        echo "error: this checkout's Modal emulator (pid $pid) exited while \`${WATCHED_COMMAND:-make up}\` ran; stopping."
        echo "Its log's last lines ($EMULATOR_LOG):"
        tail -n 15 "$EMULATOR_LOG" 2>/dev/null | sed 's/^/  | /'
        if [ "${WATCHED_COMMAND:-make up}" = "make down" ]; then
            echo "Run \`make down\` again: it starts the emulator anew from its state file and"
            echo "finishes the destroy (what was deleted before stays deleted)."
        else
            echo "Run \`make up\` again: it starts the emulator anew, and the stack's state is kept."
        fi
    } >&2
    # The main shell's children that talk to Modal ($$ stays the main shell's pid here).
    pkill -TERM -P $$ -f 'pulumi|offline_stack\.py|local_stack\.py' 2>/dev/null || true
}

# Holds the stand-in's state file any resource (what `make down` must destroy)?
standin_has_resources() {
    [ -f "$STANDIN_STATE" ] && "$PY" -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("resources") else 1)' "$STANDIN_STATE" 2>/dev/null
}

# The absolute --state file of process $1 if it is a `python -m emulator serve`, else nothing.
emulator_state_of() {
    local pid="$1" arg prev="" state="" cwd
    local -a args
    mapfile -t args < <(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)
    case " ${args[*]:-} " in *" -m emulator serve "*) ;; *) return 0 ;; esac
    for arg in "${args[@]}"; do
        [ "$prev" = "--state" ] && state="$arg"
        case "$arg" in --state=*) state="${arg#--state=}" ;; esac
        prev="$arg"
    done
    [ -n "$state" ] || return 0
    if [ "${state#/}" = "$state" ]; then
        cwd="$(readlink "/proc/$pid/cwd" 2>/dev/null)" || return 0
        state="$cwd/$state"
    fi
    realpath -m "$state"
}

# The --port of process $1's command line (the emulator this checkout started), else nothing.
emulator_port_of() {
    local arg prev=""
    local -a args
    mapfile -t args < <(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null)
    for arg in "${args[@]}"; do
        [ "$prev" = "--port" ] && echo "$arg" && return 0
        case "$arg" in --port=*) echo "${arg#--port=}" && return 0 ;; esac
        prev="$arg"
    done
}

# The pid of THIS checkout's emulator: the pid file's process, if it is alive and is an
# emulator serving this checkout's state file (a pid reused by another process, or another
# checkout's emulator on the same port, is not ours). Empty if none.
emulator_pid() {
    local pid
    [ -f "$EMULATOR_PID_FILE" ] || return 0
    pid="$(cat "$EMULATOR_PID_FILE" 2>/dev/null)"
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    kill -0 "$pid" 2>/dev/null || return 0
    if [ "$(emulator_state_of "$pid")" = "$EMULATOR_STATE" ]; then
        echo "$pid"
    fi
}

port_taken() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A loopback port P with P+1 free too (the emulator's control surface is PORT+1).
free_port_pair() {
    "$PY" -c 'import socket
for _ in range(50):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s2:
        try:
            s2.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
    print(port)
    break'
}

# Sets EMULATOR_PORT for a new emulator: EMULATOR_PORT as exported (taken: stop), else the stack
# file's port when it and the next one are free, else a free pair (said in one line).
pick_emulator_port() {
    if [ -n "$EMULATOR_PORT_ASKED" ]; then
        EMULATOR_PORT="$EMULATOR_PORT_ASKED"
        if port_taken "$EMULATOR_PORT"; then
            die "127.0.0.1:$EMULATOR_PORT (EMULATOR_PORT) is in use by another program or \
another checkout's emulator; unset EMULATOR_PORT to let this checkout pick a free port"
        fi
        return 0
    fi
    if ! port_taken "$STACK_EMULATOR_PORT" && ! port_taken "$((STACK_EMULATOR_PORT + 1))"; then
        EMULATOR_PORT="$STACK_EMULATOR_PORT"
        return 0
    fi
    EMULATOR_PORT="$(free_port_pair)"
    [ -n "$EMULATOR_PORT" ] || die "no free pair of loopback ports for the Modal emulator"
    echo "127.0.0.1:$STACK_EMULATOR_PORT (Pulumi.local.yaml's port) is in use by another program \
or another checkout's emulator: this checkout's emulator takes 127.0.0.1:$EMULATOR_PORT."
}

# Starts this checkout's emulator in the background, or reuses it when it runs already; sets
# EMULATOR_PORT, EMULATOR_URL and MODAL_SERVER_URL to where it listens. A free port taken by
# someone else between the check and the start (another checkout's `make up` at the same time)
# is retried on another free pair.
start_emulator() {
    mkdir -p "$EMULATOR_DIR"
    local pid attempt
    pid="$(emulator_pid)"
    if [ -n "$pid" ]; then
        EMULATOR_PORT="$(emulator_port_of "$pid")"
        if [ -n "$EMULATOR_PORT_ASKED" ] && [ "$EMULATOR_PORT_ASKED" != "$EMULATOR_PORT" ]; then
            die "this checkout's Modal emulator (pid $pid) runs on 127.0.0.1:$EMULATOR_PORT, \
not EMULATOR_PORT=$EMULATOR_PORT_ASKED: unset EMULATOR_PORT, or \`make down\` first"
        fi
        set_emulator_url
        echo "Modal emulator already running on 127.0.0.1:$EMULATOR_PORT (pid $pid, this \
checkout's: $EMULATOR_DIR): reusing it."
        return 0
    fi
    for attempt in 1 2 3; do
        if [ "$attempt" = 1 ]; then
            pick_emulator_port
        else
            EMULATOR_PORT="$(free_port_pair)"
            echo "Port taken meanwhile: trying 127.0.0.1:$EMULATOR_PORT instead."
        fi
        if launch_emulator; then
            set_emulator_url
            return 0
        fi
        # Retried only when the port was ours to pick and someone took it meanwhile.
        if [ -n "$EMULATOR_PORT_ASKED" ] || ! grep -q "cannot listen on" "$EMULATOR_LOG"; then
            break
        fi
    done
    tail -n 20 "$EMULATOR_LOG" >&2
    die "the Modal emulator exited during start-up (see $EMULATOR_LOG)"
}

set_emulator_url() {
    EMULATOR_URL="http://127.0.0.1:$EMULATOR_PORT"
    export MODAL_SERVER_URL="$EMULATOR_URL"
}

# One start on $EMULATOR_PORT, waiting for the ready line: 0 when ready, 1 when it exited.
launch_emulator() {
    echo "Starting the Modal emulator on 127.0.0.1:$EMULATOR_PORT (log: $EMULATOR_LOG)..."
    nohup "$PY" -m emulator serve --port "$EMULATOR_PORT" --state "$EMULATOR_STATE" \
        >"$EMULATOR_LOG" 2>&1 &
    echo $! >"$EMULATOR_PID_FILE"
    local _
    for _ in $(seq 1 100); do
        if grep -q "MODAL EMULATOR READY" "$EMULATOR_LOG" 2>/dev/null; then
            grep "MODAL EMULATOR READY" "$EMULATOR_LOG"
            return 0
        fi
        if ! kill -0 "$(cat "$EMULATOR_PID_FILE")" 2>/dev/null; then
            rm -f "$EMULATOR_PID_FILE"
            return 1
        fi
        sleep 0.2
    done
    stop_emulator
    die "the Modal emulator did not report ready within 20 s (see $EMULATOR_LOG)"
}

# Stops THIS checkout's emulator (started by `make up` or `make emulator`) and waits until it is
# gone (it stops its containers first). Another checkout's emulator is never touched.
stop_emulator() {
    local pid
    pid="$(emulator_pid)"
    if [ -z "$pid" ]; then
        echo "Modal emulator not running (this checkout's: $EMULATOR_DIR)."
    else
        kill -TERM "$pid" # it stops every container before it exits
        local _
        for _ in $(seq 1 100); do
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
    rm -rf "$EMULATOR_RUN_CONFIG" "$EMULATOR_DIR/state.sqlite3" "$EMULATOR_DIR/state.sqlite3-wal" \
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
