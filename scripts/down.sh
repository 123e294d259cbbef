#!/usr/bin/env bash
# `make down`: destroy the local stack's resources in the emulator, then stop the emulator.
# The stack itself (its empty state) and the emulator's state file are kept; remove
# .pulumi-state/ and .modal-emulator/ to start from nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK="${1:-local}"
# shellcheck source=scripts/local-env.sh
. scripts/local-env.sh

require_local_stack "$STACK"
check_emulator_port
if [ -d .pulumi-state ]; then
    ensure_pulumi_cli
    start_emulator # destroy talks to it
    if select_existing_stack "$STACK"; then
        pulumi destroy --yes --non-interactive --stack "$STACK"
    else
        echo "No '$STACK' stack in .pulumi-state: nothing to destroy."
    fi
else
    echo "No .pulumi-state/: nothing was deployed locally."
fi
stop_emulator
