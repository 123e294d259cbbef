#!/usr/bin/env bash
# `make up`: the local stack end to end on this machine, against the Modal emulator, ending
# with a live, authenticated endpoint.
#   1. the engine: the Pulumi CLI (pinned; Pulumi's installer tried once if it is missing),
#      else the Pulumi stand-in (python -m pulumi_standin), said in one banner line
#   2. this checkout's Modal emulator in the background (pid file; waits for its ready line), or
#      this checkout's one already running (`make emulator`, an earlier `make up`); on the
#      stack file's port (8790) unless someone else holds it, then on a free one
#   3. `pulumi up --yes` of the `local` stack (file backend in .pulumi-state/, stack created on
#      first run; --config-file with the emulator's actual URL when it is not the stack
#      file's), or `python -m pulumi_standin up --stack local --server-url <actual URL>`
#   4. waits until the endpoint answers a chat completion through the emulator's edge with the
#      stack's proxy token and an API key, then prints the endpoint, a curl that works, and
#      that curl's real answer (scripts/local_stack.py); the curl it runs reads the secret
#      headers from a private file, never from its command line
#   5. rewrites the LiteLLM gateway file ($GATEWAY_FILE, .gateway/litellm-local.yaml) when it
#      exists, so it never keeps a rotated (revoked) key, and restarts the gateway `make
#      gateway` started if it runs (scripts/gateway.sh), so that it serves the new keys
# Managed mode: while the access stack 'local' is deployed (access/, with the stand-in), the
# stand-in runs the stack with managedByAccessStack and its proxy token (scripts/offline_stack.py;
# MANAGED=0 turns that off, MANAGED=1 insists).
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
read_stack_url
choose_engine
start_emulator
watch_emulator &
WATCHER=$!
trap 'kill "$WATCHER" 2>/dev/null || true' EXIT

if [ "$LOCAL_ENGINE" = cli ] && access_has_resources && [ "${MANAGED:-auto}" != 0 ]; then
    echo "warning: the access stack 'local' is deployed with the stand-in ($ACCESS_STATE), but" \
        "the Pulumi CLI keeps managed mode in the stack's config: pulumi config set" \
        "modal-llm:managedByAccessStack true --stack local, and the access stack's proxy token" \
        "with pulumi config set --secret modal-llm:proxyToken (docs/program.md, Access)." >&2
fi
if [ "$LOCAL_ENGINE" = cli ]; then
    mkdir -p .pulumi-state
    pulumi stack select --create --non-interactive "$STACK"
    cli_config_args
    pulumi up --yes --non-interactive --stack "$STACK" "${CLI_CONFIG_ARGS[@]}"
else
    standin up
fi
echo
"$PY" scripts/local_stack.py check --engine "$LOCAL_ENGINE" --stack "$STACK" \
    --state "$STANDIN_STATE"
kill "$WATCHER" 2>/dev/null || true
if [ -f "$GATEWAY_FILE" ]; then
    echo
    "$PY" scripts/gateway_config.py --stack "$STACK" --engine "$LOCAL_ENGINE" \
        --state "$STANDIN_STATE" --out "$GATEWAY_FILE"
    echo "(rewritten with the stack's current keys)"
    GATEWAY_FILE="$GATEWAY_FILE" STANDIN_STATE="$STANDIN_STATE" scripts/gateway.sh restart "$STACK"
fi
echo
echo "Gateway config (LiteLLM): make gateway-config    Tear down: make down"
if [ "$LOCAL_ENGINE" = cli ]; then
    pass_hint="'local-emulator'"
    [ "$PULUMI_CONFIG_PASSPHRASE" = "local-emulator" ] || pass_hint="<the passphrase you exported>"
    echo "To run pulumi commands on this stack yourself, use the same backend and passphrase:"
    echo "  export PULUMI_BACKEND_URL='$PULUMI_BACKEND_URL' PULUMI_CONFIG_PASSPHRASE=$pass_hint"
    echo "  export MODAL_TOKEN_ID=ak-local-emulator MODAL_TOKEN_SECRET=as-local-emulator"
    if [ "${#CLI_CONFIG_ARGS[@]}" -gt 0 ]; then
        echo "  and add ${CLI_CONFIG_ARGS[*]} to up/preview/destroy while this checkout's emulator"
        echo "  is on $EMULATOR_URL (not Pulumi.local.yaml's $STACK_SERVER_URL)"
    fi
    echo "(The 'encryptionsalt:' line stack creation added to Pulumi.local.yaml is expected and"
    echo " not secret: Pulumi uses it to check the passphrase.)"
fi
