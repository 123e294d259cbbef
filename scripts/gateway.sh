#!/usr/bin/env bash
# The LiteLLM gateway in front of a stack, as a background process this checkout owns:
#   gateway.sh start   [STACK]  write the gateway file from the stack's outputs, (re)start
#                               LiteLLM on 127.0.0.1:$GATEWAY_PORT in the background, wait
#                               until it answers /health/liveliness, print how to call it
#   gateway.sh restart [STACK]  the same, only when this checkout's gateway is running (what
#                               `make up` runs after a rotation rewrote the file)
#   gateway.sh stop    [STACK]  stop it (what `make down` runs); nothing to do is no error
#   gateway.sh status  [STACK]  "running (pid N) on URL" or "not running"; exit 0 / 3
# It is known by its pid file (.gateway/litellm-STACK.pid beside the file it serves), never by
# its port; the pid is trusted only while that process's command line still names the file.
# Issue 34 item 5: `make down` left a foreground `make gateway` running against a host that
# was gone, and after a key rotation the gateway answered 403 until restarted by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
ACTION="${1:-status}"
STACK="${2:-local}"
PY=".venv/bin/python"
LITELLM=".venv/litellm/bin/litellm"
if [ "$STACK" = local ]; then
    GATEWAY_FILE="${GATEWAY_FILE:-.gateway/litellm-local.yaml}"
else
    GATEWAY_FILE=".gateway/litellm-$STACK.yaml" # GATEWAY_FILE is the local stack's (make up)
fi
PID_FILE="${GATEWAY_FILE%.yaml}.pid" # "PID PORT"
LOG_FILE="${GATEWAY_FILE%.yaml}.log"
# The port: GATEWAY_PORT, else the one the running gateway was started on, else 4000.
STARTED_PORT="$(cut -d' ' -f2 -s "$PID_FILE" 2>/dev/null || true)"
GATEWAY_PORT="${GATEWAY_PORT:-${STARTED_PORT:-4000}}"
URL="http://127.0.0.1:$GATEWAY_PORT"

die() {
    echo "error: $*" >&2
    exit 1
}

# The pid of this checkout's gateway for this file, if it is still that process.
running_pid() {
    local pid
    [ -f "$PID_FILE" ] || return 1
    pid="$(cut -d' ' -f1 "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--config $GATEWAY_FILE" || return 1
    echo "$pid"
}

stop() {
    local pid waited=0
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        return 1
    fi
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 100 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    echo "gateway: stopped LiteLLM (pid $pid, $URL)"
}

start() {
    [ -x "$LITELLM" ] || die "LiteLLM is not installed in .venv/litellm: run \`make gateway\` (it installs it)"
    local args=(--stack "$STACK" --out "$GATEWAY_FILE")
    [ "$STACK" != local ] || [ -z "${STANDIN_STATE:-}" ] || args+=(--state "$STANDIN_STATE")
    "$PY" scripts/gateway_config.py "${args[@]}" >/dev/null ||
        die "gateway: could not write $GATEWAY_FILE from stack '$STACK' (the reason is above); nothing was started"
    stop >/dev/null || true
    if (exec 3<>"/dev/tcp/127.0.0.1/$GATEWAY_PORT") 2>/dev/null; then
        die "gateway: port $GATEWAY_PORT is taken by another program: stop it, or run with GATEWAY_PORT=<free port>"
    fi
    echo "gateway: starting LiteLLM 1.106.12 on $URL with $GATEWAY_FILE (5-30 s; log: $LOG_FILE)..."
    # Its own session (setsid), so that stop takes its whole process group; the cost map
    # packaged with LiteLLM, no fetch (docs/program.md, "Starting the gateway").
    LITELLM_LOCAL_MODEL_COST_MAP=True setsid "$LITELLM" --config "$GATEWAY_FILE" \
        --host 127.0.0.1 --port "$GATEWAY_PORT" --telemetry False >"$LOG_FILE" 2>&1 </dev/null &
    local pid=$! waited=0
    echo "$pid $GATEWAY_PORT" >"$PID_FILE"
    until curl -fsS -o /dev/null "$URL/health/liveliness" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PID_FILE"
            tail -n 20 "$LOG_FILE" >&2 || true
            die "gateway: LiteLLM exited before it answered (its last lines are above; full log: $LOG_FILE)"
        fi
        if [ "$waited" -ge 900 ]; then
            stop >/dev/null || true
            die "gateway: LiteLLM did not answer $URL/health/liveliness within 90 s; stopped it (log: $LOG_FILE)"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    echo "gateway: LiteLLM (pid $pid) answers on $URL; clients send \`Authorization: Bearer <master key>\`"
    echo "  (the key: sed -n 's/^ *master_key: //p' $GATEWAY_FILE). \`make down\` stops it."
}

case "$ACTION" in
start) start ;;
restart)
    if running_pid >/dev/null; then
        start
        echo "gateway: restarted with the stack's current keys"
    fi
    ;;
stop) stop || echo "gateway: not running" ;;
status)
    if pid="$(running_pid)"; then
        echo "running (pid $pid) on $URL"
    else
        echo "not running"
        exit 3
    fi
    ;;
*) die "usage: scripts/gateway.sh start|restart|stop|status [STACK]" ;;
esac
