#!/usr/bin/env bash
# `make up`: the local stack end to end on this machine, against the Modal emulator, ending
# with a live, authenticated endpoint.
#   1. the engine: the Pulumi CLI (pinned; Pulumi's installer tried once if it is missing),
#      else the Pulumi stand-in (python -m pulumi_standin), said in one banner line
#   2. the Modal emulator in the background (pid file; waits for its ready line), or the one
#      already running on the stack's port (`make emulator`, an earlier `make up`)
#   3. `pulumi up --yes` of the `local` stack (file backend in .pulumi-state/, stack created on
#      first run), or `python -m pulumi_standin up --stack local`
#   4. waits until the endpoint answers a chat completion through the emulator's edge with the
#      stack's proxy token and an API key, then prints the endpoint, a curl that works, and
#      that curl's real answer (scripts/local_stack.py).
# Re-running it changes nothing (both engines diff against their state; the emulator skips a
# deploy whose definition did not change). The venv is set up by `make setup` before this
# runs. Environment (backend, passphrase, emulator credentials): scripts/local-env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK="${1:-local}"
# shellcheck source=scripts/local-env.sh
. scripts/local-env.sh

require_local_stack "$STACK"
[ -x "$PY" ] || die "$PY is missing: run \`make setup\` first"
choose_engine
check_emulator_port
start_emulator

if [ "$LOCAL_ENGINE" = cli ]; then
    mkdir -p .pulumi-state
    pulumi stack select --create --non-interactive "$STACK"
    pulumi up --yes --non-interactive --stack "$STACK"
else
    standin up
fi
echo
"$PY" scripts/local_stack.py check --engine "$LOCAL_ENGINE" --stack "$STACK" \
    --state "$STANDIN_STATE"
echo
echo "Gateway config (LiteLLM): make gateway-config    Tear down: make down"
if [ "$LOCAL_ENGINE" = cli ]; then
    pass_hint="'local-emulator'"
    [ "$PULUMI_CONFIG_PASSPHRASE" = "local-emulator" ] || pass_hint="<the passphrase you exported>"
    echo "To run pulumi commands on this stack yourself, use the same backend and passphrase:"
    echo "  export PULUMI_BACKEND_URL='$PULUMI_BACKEND_URL' PULUMI_CONFIG_PASSPHRASE=$pass_hint"
    echo "  export MODAL_TOKEN_ID=ak-local-emulator MODAL_TOKEN_SECRET=as-local-emulator"
    echo "(The 'encryptionsalt:' line stack creation added to Pulumi.local.yaml is expected and"
    echo " not secret: Pulumi uses it to check the passphrase.)"
fi
