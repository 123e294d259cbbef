"""Write the LiteLLM gateway config of a stack to a file (`make gateway-config STACK=...`).

Reads `pulumi stack output --json --show-secrets --stack STACK`, or, where there is no Pulumi
CLI (or with `--engine standin`), the outputs of the Pulumi stand-in's last `up` from its state
file (`.pulumi-offline/<stack>.json`, `--state`), or a saved copy of that JSON with
`--outputs-json FILE`; takes the `gateway_config` output (LiteLLM YAML) or, with
`--format json`, `gateway_config_json`, and writes it with mode 0600 to
`.gateway/litellm-<stack>.yaml` (or `--out`). The file holds API keys and the Modal proxy
token: keep it out of git (`.gateway/` carries its own `.gitignore`, and the root .gitignore
lists `.gateway/` too) and out of logs.

The YAML file starts LiteLLM as it is (`make gateway`, or the command this prints):
- `general_settings.master_key`, the key the gateway's own clients send (LiteLLM 1.106.12
  refuses to start without one: proxy/auth/master_key_boot_check.py). Generated here once
  (`sk-` + 64 hex digits) and kept across rewrites: a key already in the file stays, so a
  master key you put there yourself is kept too.
- LiteLLM fetches its model cost map from the internet at import time unless
  LITELLM_LOCAL_MODEL_COST_MAP=True (litellm_core_utils/get_model_cost_map.py); it has to be an
  environment variable (read before any config), so the printed command sets it.
Rerun it after every `pulumi up` that rotates or revokes a key: the file holds the keys of the
outputs it was written from (`make up` rewrites the local stack's file itself when it exists).

For the `local` stack the file backend and passphrase of scripts/local-env.sh are used unless
PULUMI_BACKEND_URL / PULUMI_CONFIG_PASSPHRASE are already set.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_KEYS = {"yaml": "gateway_config", "json": "gateway_config_json"}
LITELLM = ".venv/litellm/bin/litellm"  # `make gateway` / `make test` install it there


class GatewayConfigError(RuntimeError):
    """The stack outputs could not be read or hold no gateway config."""


def pulumi_cli() -> str | None:
    home_cli = Path.home() / ".pulumi/bin/pulumi"
    return shutil.which("pulumi") or (str(home_cli) if home_cli.exists() else None)


def stack_outputs(stack: str) -> dict[str, Any]:
    """The stack's outputs with secrets revealed, from the Pulumi CLI."""
    pulumi = pulumi_cli()
    if pulumi is None:
        raise GatewayConfigError(
            "the Pulumi CLI is not installed, and the Pulumi stand-in has no state for stack "
            f"{stack!r} (`make up` deploys the local stack with one or the other). "
            "Alternatively save `pulumi stack output --json --show-secrets` elsewhere and pass "
            "it with --outputs-json FILE."
        )
    env = dict(os.environ)
    if stack == "local":
        env.setdefault("PULUMI_BACKEND_URL", f"file://{ROOT}/.pulumi-state")
        env.setdefault("PULUMI_CONFIG_PASSPHRASE", "local-emulator")
    result = subprocess.run(
        [pulumi, "stack", "output", "--json", "--show-secrets", "--stack", stack],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise GatewayConfigError(
            f"`pulumi stack output --stack {stack}` failed (exit {result.returncode}): "
            f"{result.stderr.strip()[:500]}. Has the stack been deployed (`make up`)?"
        )
    outputs = json.loads(result.stdout)
    if not isinstance(outputs, dict):
        raise GatewayConfigError("`pulumi stack output --json` did not return an object")
    return outputs


def render(outputs: dict[str, Any], fmt: str) -> str:
    """The gateway file's content from the stack outputs."""
    key = OUTPUT_KEYS[fmt]
    value = outputs.get(key)
    if not isinstance(value, str) or not value.strip() or value == "[secret]":
        shown = "[secret]" if value == "[secret]" else type(value).__name__
        raise GatewayConfigError(
            f"stack output {key!r} is missing or empty (got {shown}); deploy the stack with "
            "this program first, and read outputs with --show-secrets"
        )
    return value if value.endswith("\n") else value + "\n"


def existing_master_key(path: Path) -> str | None:
    """The master key of a gateway file written before (kept across rewrites), if any."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    settings = doc.get("general_settings") if isinstance(doc, dict) else None
    key = settings.get("master_key") if isinstance(settings, dict) else None
    return key if isinstance(key, str) and key.strip() else None


def with_master_key(content: str, master_key: str) -> str:
    """The LiteLLM YAML with `general_settings.master_key` set (unless the document has one)."""
    doc = yaml.safe_load(content)
    if not isinstance(doc, dict):
        raise GatewayConfigError("the gateway_config output is not a YAML mapping")
    settings = doc.setdefault("general_settings", {})
    if not isinstance(settings, dict):
        raise GatewayConfigError("the gateway_config output's general_settings is not a mapping")
    settings.setdefault("master_key", master_key)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def start_command(path: Path, port: int = 4000) -> str:
    """The command that starts LiteLLM on this file, offline (the packaged cost map)."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return (
        f"LITELLM_LOCAL_MODEL_COST_MAP=True {LITELLM} --config {shlex.quote(str(shown))}"
        f" --host 127.0.0.1 --port {port} --telemetry False"
    )


def write_private(path: Path, content: str) -> None:
    """Write `content` readable by the owner only; keep the directory out of git.

    The mode is set on the open descriptor BEFORE anything is written: a file that already
    existed with a looser mode (O_CREAT's mode only applies to new files) never holds the keys
    while readable by others.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent.name == ".gateway":
        (path.parent / ".gitignore").write_text("*\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "w") as f:
        f.write(content)


def standin_outputs(stack: str, state: Path) -> dict[str, Any]:
    """The outputs of the stand-in's last `up`, secrets revealed (its `output --show-secrets`)."""
    from pulumi_standin.display import show_output
    from pulumi_standin.statefile import StandinError, StateFile
    from pulumi_standin.values import to_program

    if not state.exists():
        raise GatewayConfigError(f"no stand-in state at {state}: run `make up` first")
    try:
        outputs = to_program(StateFile.load(state, stack).outputs)
    except StandinError as exc:
        raise GatewayConfigError(str(exc)) from None
    if not outputs:
        raise GatewayConfigError(f"stack '{stack}' in {state} has no outputs: run `make up` first")
    return {k: show_output(v, True) for k, v in outputs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stack", default="local", help="stack name (default: local)")
    parser.add_argument("--format", choices=sorted(OUTPUT_KEYS), default="yaml")
    parser.add_argument("--out", type=Path, help="file to write (default .gateway/...)")
    parser.add_argument(
        "--outputs-json", type=Path, help="read outputs from this file instead of the CLI"
    )
    parser.add_argument(
        "--engine",
        choices=["auto", "cli", "standin"],
        default=os.environ.get("PULUMI_ENGINE") or "auto",
        help="whose outputs: the Pulumi CLI's, the stand-in's, or auto (the CLI if installed, "
        "else the stand-in's state file); default $PULUMI_ENGINE, else auto",
    )
    parser.add_argument("--state", type=Path, help="the stand-in's state file")
    args = parser.parse_args(argv)
    try:
        state = args.state or ROOT / ".pulumi-offline" / f"{args.stack}.json"
        use_standin = args.engine == "standin" or (
            args.engine == "auto" and pulumi_cli() is None and state.exists()
        )
        if args.outputs_json is not None:
            outputs = json.loads(args.outputs_json.read_text())
        elif use_standin:
            outputs = standin_outputs(args.stack, state)
        else:
            outputs = stack_outputs(args.stack)
        content = render(outputs, args.format)
    except (GatewayConfigError, OSError, json.JSONDecodeError) as exc:
        print(f"gateway-config: {exc}", file=sys.stderr)
        return 1
    suffix = "yaml" if args.format == "yaml" else "json"
    out = args.out or ROOT / ".gateway" / f"litellm-{args.stack}.{suffix}"
    if args.format == "json":
        write_private(out, content)
        print(f"wrote {out} (mode 0600; it contains API keys and the Modal proxy token)")
        return 0
    master_key = existing_master_key(out) or "sk-" + secrets.token_hex(32)
    try:
        content = with_master_key(content, master_key)
    except (GatewayConfigError, yaml.YAMLError) as exc:
        print(f"gateway-config: {exc}", file=sys.stderr)
        return 1
    write_private(out, content)
    print(
        f"wrote {out} (mode 0600; it contains API keys, the Modal proxy token and the"
        " gateway's master key, general_settings.master_key)"
    )
    print(f"Start LiteLLM with it (offline; or: make gateway STACK={args.stack}):")
    print(f"  {start_command(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
