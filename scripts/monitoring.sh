#!/usr/bin/env bash
# The local stack's monitoring (docs/monitoring.md, "The local Prometheus"): a Prometheus
# Pushgateway the containers push their proxy's metrics to, and a Prometheus that scrapes it
# (honor_labels: the pushed service/version/container labels stay) and loads the stack's
# alert rules, as background processes this checkout owns, on free loopback ports.
#   monitoring.sh start  [STACK]  start both, or keep them when they run already (the push URL
#                                 the containers have stays right); prints where they answer
#   monitoring.sh rules  [STACK]  write the stack's `monitoring_rules_yaml` output into the
#                                 rules file and have Prometheus reload it (after a deploy)
#   monitoring.sh stop            stop both and remove their directory (what `make down` runs);
#                                 nothing to do is no error
#   monitoring.sh push-url        the Pushgateway's URL (exit 3 when it does not run)
#   monitoring.sh status          where both answer, or "not running" (exit 3)
# Each is known by its pid file ($EMULATOR_DIR/monitoring/NAME.pid: "PID PORT"), never by its port; the pid
# is trusted only while that process's command line still names this checkout's directory.
# Debian's packages: prometheus (2.42) and prometheus-pushgateway (1.5.1); without them
# `start` says so and exits 0 (the stack deploys without a push, as before).
set -euo pipefail
cd "$(dirname "$0")/.."
ACTION="${1:-status}"
STACK="${2:-local}"
PY=".venv/bin/python"
# Beside this checkout's emulator (scripts/local-env.sh EMULATOR_DIR): a test's own `make up`
# with its own EMULATOR_DIR gets its own monitoring too.
DIR="$(realpath -m "${MONITORING_DIR:-${EMULATOR_DIR:-.modal-emulator}/monitoring}")"
RULES="$DIR/rules/modal-llm.yml"

die() {
    echo "error: $*" >&2
    exit 1
}

pid_of() { # NAME -> the pid of this checkout's process, if it still is that process
    local pid
    [ -f "$DIR/$1.pid" ] || return 1
    pid="$(cut -d' ' -f1 "$DIR/$1.pid" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR" || return 1
    echo "$pid"
}

port_of() { cut -d' ' -f2 -s "$DIR/$1.pid"; }

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_ready() { # NAME PID URL
    local waited=0
    until curl -fsS -o /dev/null "$3/-/ready" 2>/dev/null; do
        if ! kill -0 "$2" 2>/dev/null; then
            tail -n 20 "$DIR/$1.log" >&2 || true
            die "monitoring: $1 exited before it answered (its last lines are above; log: $DIR/$1.log)"
        fi
        if [ "$waited" -ge 300 ]; then
            stop_one "$1" >/dev/null || true
            die "monitoring: $1 did not answer $3/-/ready within 30 s; stopped it (log: $DIR/$1.log)"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

launch() { # NAME PORT COMMAND... : in its own session (stop takes its whole group), without
    # the Modal credentials `make up` exports (neither needs them; a daemon should not hold them)
    local name="$1" port="$2"
    shift 2
    env -u MODAL_TOKEN_ID -u MODAL_TOKEN_SECRET setsid "$@" >"$DIR/$name.log" 2>&1 </dev/null &
    echo "$! $port" >"$DIR/$name.pid"
    wait_ready "$name" "$!" "http://127.0.0.1:$port"
}

start() {
    local gateway prometheus
    gateway="$(command -v prometheus-pushgateway || true)"
    prometheus="$(command -v prometheus || true)"
    if [ -z "$gateway" ] || [ -z "$prometheus" ]; then
        echo "monitoring: not started: Debian's prometheus and prometheus-pushgateway are not both" \
            "installed (\`apt-get install -y --no-install-recommends prometheus" \
            "prometheus-pushgateway\`, or \`make promtool\` as root); the containers push no metrics."
        return 0
    fi
    mkdir -p "$DIR/rules" "$DIR/data"
    [ -f "$RULES" ] || echo "groups: []" >"$RULES"
    if ! pid_of pushgateway >/dev/null; then
        local port
        port="$(free_port)"
        launch pushgateway "$port" "$gateway" "--web.listen-address=127.0.0.1:$port" \
            "--persistence.file=$DIR/pushgateway.data"
    fi
    if ! pid_of prometheus >/dev/null; then
        local port
        port="$(free_port)"
        cat >"$DIR/prometheus.yml" <<EOF
# Written by scripts/monitoring.sh: the local stack's Prometheus (docs/monitoring.md).
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files: ["$DIR/rules/*.yml"]
scrape_configs:
  - job_name: pushgateway
    honor_labels: true # the pushed job/service/version/container labels, not the target's
    static_configs:
      - targets: ["127.0.0.1:$(port_of pushgateway)"]
EOF
        launch prometheus "$port" "$prometheus" "--config.file=$DIR/prometheus.yml" \
            "--storage.tsdb.path=$DIR/data" "--web.listen-address=127.0.0.1:$port" \
            --web.enable-lifecycle --storage.tsdb.retention.time=1d
    fi
    echo "monitoring: Pushgateway on http://127.0.0.1:$(port_of pushgateway) (the containers push" \
        "there), Prometheus on http://127.0.0.1:$(port_of prometheus) (logs: $DIR/*.log)"
}

rules() {
    pid_of prometheus >/dev/null || return 0
    local engine="standin"
    [ "${LOCAL_ENGINE:-standin}" != cli ] || engine="cli"
    "$PY" scripts/local_stack.py outputs --engine "$engine" --stack "$STACK" \
        --state "${STANDIN_STATE:-.pulumi-offline/$STACK.json}" |
        "$PY" -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["monitoring_rules_yaml"])' \
            >"$RULES.tmp" || die "monitoring: could not read the stack's monitoring_rules_yaml output"
    mv "$RULES.tmp" "$RULES"
    curl -fsS -X POST "http://127.0.0.1:$(port_of prometheus)/-/reload" >/dev/null ||
        die "monitoring: Prometheus did not reload $RULES (its log: $DIR/prometheus.log)"
    echo "monitoring: Prometheus loaded the stack's alert rules ($RULES)"
}

stop_one() { # NAME
    local pid waited=0
    if ! pid="$(pid_of "$1")"; then
        rm -f "$DIR/$1.pid"
        return 1
    fi
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 100 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$DIR/$1.pid"
    echo "monitoring: stopped $1 (pid $pid)"
}

case "$ACTION" in
start) start ;;
rules) rules ;;
stop)
    stopped=0
    stop_one prometheus && stopped=1
    stop_one pushgateway && stopped=1
    [ "$stopped" = 1 ] || echo "monitoring: not running"
    rm -rf "$DIR" # its data, rules and logs: like the emulator's state, gone with the stack
    ;;
push-url)
    pid_of pushgateway >/dev/null || exit 3
    echo "http://127.0.0.1:$(port_of pushgateway)"
    ;;
status)
    if pid_of pushgateway >/dev/null && pid_of prometheus >/dev/null; then
        echo "Pushgateway on http://127.0.0.1:$(port_of pushgateway)," \
            "Prometheus on http://127.0.0.1:$(port_of prometheus)"
    else
        echo "not running"
        exit 3
    fi
    ;;
*) die "usage: scripts/monitoring.sh start|rules|stop|push-url|status [STACK]" ;;
esac
