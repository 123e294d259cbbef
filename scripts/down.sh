#!/usr/bin/env bash
# `make down`: destroy what `make up` made in the emulator (with whichever engine holds it:
# the Pulumi CLI's stack in .pulumi-state/, the stand-in's in .pulumi-offline/local.json),
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
read_stack_url
destroyed=0
if standin_has_resources; then
    start_emulator # destroy talks to it
    standin destroy
    destroyed=1
fi
if [ -d .pulumi-state ]; then
    if find_pulumi_cli; then
        start_emulator
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
[ "$destroyed" = 1 ] || echo "Nothing deployed locally to destroy."
stop_emulator
# Container processes a killed emulator left behind (only where containers run without their
# own pid namespace: emulator/runtime, `python -m emulator sweep`); one line says what it did.
"$PY" -m emulator sweep
remove_emulator_state
echo "Emulator state removed ($EMULATOR_DIR/state.sqlite3*); its log stays in $EMULATOR_LOG."
