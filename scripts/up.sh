#!/usr/bin/env bash
# `make up`: the local stack end to end on this machine, against the Modal emulator.
#   1. the Pulumi CLI (pinned; installed with Pulumi's installer if missing, else a clear stop)
#   2. the Modal emulator in the background (pid file; waits for its ready line)
#   3. the file state backend in .pulumi-state/ and the `local` stack (created on first run)
#   4. `pulumi up --yes`, then the outputs (secrets hidden; `make gateway-config` writes the
#      LiteLLM file with them).
# The venv is set up by `make setup` before this runs. See scripts/local-env.sh for the
# environment (backend, passphrase, emulator credentials).
set -euo pipefail
cd "$(dirname "$0")/.."
STACK="${1:-local}"
# shellcheck source=scripts/local-env.sh
. scripts/local-env.sh

require_local_stack "$STACK"
check_emulator_port
[ -x "$PY" ] || die "$PY is missing: run \`make setup\` first"
ensure_pulumi_cli
start_emulator

mkdir -p .pulumi-state
pulumi stack select --create --non-interactive "$STACK"
pulumi up --yes --non-interactive --stack "$STACK"
echo
echo "Stack outputs ($STACK; secrets hidden, reveal with: pulumi stack output --show-secrets):"
pulumi stack output --stack "$STACK"
echo
echo "Gateway config: make gateway-config STACK=$STACK    Tear down: make down"
echo
pass_hint="'local-emulator'"
[ "$PULUMI_CONFIG_PASSPHRASE" = "local-emulator" ] || pass_hint="<the passphrase you exported>"
echo "To run pulumi commands on this stack yourself, use the same backend and passphrase:"
echo "  export PULUMI_BACKEND_URL='$PULUMI_BACKEND_URL' PULUMI_CONFIG_PASSPHRASE=$pass_hint"
echo "  export MODAL_TOKEN_ID=ak-local-emulator MODAL_TOKEN_SECRET=as-local-emulator"
echo "(The 'encryptionsalt:' line stack creation added to Pulumi.local.yaml is expected and not"
echo " secret: Pulumi uses it to check the passphrase.)"
