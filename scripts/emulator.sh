#!/usr/bin/env bash
# `make emulator`: this checkout's Modal emulator in the foreground (Ctrl-C stops it), with the
# same pid file, state file and port choice as `make up` (scripts/local-env.sh), so `make up`
# reuses it and `make down` stops it; another checkout's emulator is neither reused nor stopped.
#   scripts/emulator.sh url    prints this checkout's running emulator's URL (make offline-up)
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=local
# shellcheck source=scripts/local-env.sh
. scripts/local-env.sh

[ -x "$PY" ] || die "$PY is missing: run \`make setup\` first"
pid="$(emulator_pid)"
if [ "${1:-}" = url ]; then
    [ -n "$pid" ] || die "this checkout's Modal emulator is not running ($EMULATOR_DIR): start \
it with \`make emulator\` (or \`make up\`)"
    echo "http://127.0.0.1:$(emulator_port_of "$pid")"
    exit 0
fi
read_stack_url
if [ -n "$pid" ]; then
    die "this checkout's Modal emulator already runs (pid $pid, port \
$(emulator_port_of "$pid")): \`make up\` uses it, \`make down\` stops it"
fi
pick_emulator_port
mkdir -p "$EMULATOR_DIR"
echo $$ >"$EMULATOR_PID_FILE" # exec keeps the pid
exec "$PY" -m emulator serve --port "$EMULATOR_PORT" --state "$EMULATOR_STATE"
