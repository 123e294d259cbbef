#!/usr/bin/env bash
# `make down`: stop the LiteLLM gateway `make gateway` started (scripts/gateway.sh), destroy
# what `make up` made in the emulator (with whichever engine holds it:
# the Pulumi CLI's stack in .pulumi-state/, the stand-in's in .pulumi-offline/local.json), then
# the access stack 'local' if it was deployed with the stand-in ($ACCESS_STATE, docs/program.md
# Access: service stack first, then access stack),
# stop THIS checkout's emulator (started by `make up` or `make emulator`; known by its pid
# file and state file, never by its port: another checkout's emulator keeps serving), and
# remove the emulator's state. The stacks themselves stay (empty); remove .pulumi-state/ and
# .pulumi-offline/ to forget them too.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK="${1:-local}"
# shellcheck source=scripts/local-env.sh
. scripts/local-env.sh

require_local_stack "$STACK"
# The gateway `make gateway` started (issue 34 item 5: it outlived the stack it fronted).
GATEWAY_FILE="$GATEWAY_FILE" scripts/gateway.sh stop "$STACK" | grep -v '^gateway: not running$' || true
read_stack_url
destroyed=0
WATCHER=""
trap '[ -z "$WATCHER" ] || kill "$WATCHER" 2>/dev/null || true' EXIT
# While a destroy talks to the emulator: if it dies, say so and stop the destroy at once
# (the stand-in would retry Modal for minutes; issue 32's fault matrix kills it here). The
# next `make up` starts it again from its state file and heals; `make down` then finishes.
watch_during() {
    [ -n "$WATCHER" ] && return 0
    WATCHED_COMMAND="make down" watch_emulator &
    WATCHER=$!
}
if standin_has_resources; then
    start_emulator # destroy talks to it
    watch_during
    standin destroy
    destroyed=1
fi
if [ -d .pulumi-state ]; then
    if find_pulumi_cli; then
        start_emulator
        watch_during
        if select_existing_stack "$STACK"; then
            cli_config_args
            pulumi destroy --yes --non-interactive --stack "$STACK" "${CLI_CONFIG_ARGS[@]}"
            destroyed=1
        fi
    else
        echo "warning: .pulumi-state/ may hold a '$STACK' stack made with the Pulumi CLI, which" \
            "is $PULUMI_MISSING_WHY; its resources die with the emulator's state below." >&2
    fi
fi
# The access stack 'local', after the service stack that uses its environment and token: the
# emulator's state goes below, and a state file still listing its resources would make its
# next `up` believe they exist (and the next `make up` run in managed mode without them).
if access_has_resources; then
    start_emulator
    watch_during
    echo "The access stack 'local' ($ACCESS_STATE), after the local stack that used it:"
    access_standin destroy
    destroyed=1
fi
[ "$destroyed" = 1 ] || echo "Nothing deployed locally to destroy."
if [ -n "$WATCHER" ]; then
    kill "$WATCHER" 2>/dev/null || true
    WATCHER=""
fi
stop_emulator
# Container processes a killed emulator left behind (only where containers run without their
# own pid namespace: dev/emulator/runtime, `python -m emulator sweep`); one line says what it did.
"$PY" -m emulator sweep
remove_emulator_state
echo "Emulator state removed ($EMULATOR_DIR/state.sqlite3*); its log stays in $EMULATOR_LOG."
