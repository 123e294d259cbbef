"""Offline stand-in for `pulumi preview --diff` / `up` / `refresh` / `destroy` / `stack output`.

A thin command over the `pulumi_standin` package (`python -m pulumi_standin` does the same):
NOT the Pulumi engine, for machines without the Pulumi CLI, against the Modal emulator only.
See docs/offline.md and docs/standin.md.

    .venv/bin/python scripts/offline_stack.py preview --stack local [--state FILE]
    .venv/bin/python scripts/offline_stack.py up      --stack local [--show-secrets]
    .venv/bin/python scripts/offline_stack.py destroy --stack local

Managed mode of the local stack (docs/program.md, "Access"): the stand-in's `--config` and
`--secret` last one run (the real CLI keeps config in the stack file, `pulumi config set`), so
once the access stack `local` is deployed (its state, $ACCESS_STATE, default
access/.pulumi-offline/local.json, holds resources) every preview/up/refresh/destroy of the
root project's `local` stack here gets `--config managedByAccessStack=true` and the access
stack's proxy token for `local` (`--secret-from-env`, never on a command line), and says so in
one line on stderr. MANAGED=0 turns this off, MANAGED=1 insists (an error without the access
stack). `make up`, `make plan`, `make refresh` and `make down` all come through here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:  # run as `python scripts/offline_stack.py`
    sys.path.insert(0, str(PROJECT_ROOT))

ACCESS_DIR = PROJECT_ROOT / "access"
MANAGED_COMMANDS = ("preview", "up", "refresh", "destroy")
# The name of the variable (set in this process only) that --secret-from-env reads.
TOKEN_VAR = "MODAL_LLM_LOCAL_PROXY_TOKEN"  # noqa: S105


class ManagedModeError(Exception):
    """MANAGED=1 (or MANAGED=<junk>) that cannot be honoured; the text says what to do."""


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def access_state() -> Path:
    raw = os.environ.get("ACCESS_STATE") or str(ACCESS_DIR / ".pulumi-offline" / "local.json")
    path = Path(raw)
    return path if path.is_absolute() else PROJECT_ROOT / path


def access_stack_deployed(state: Path) -> bool:
    """Does the access stack's stand-in state hold any resource?"""
    try:
        return bool(json.loads(state.read_text()).get("resources"))
    except (OSError, ValueError, AttributeError):
        return False


def access_proxy_token(state: Path) -> str:
    """The access stack's proxy token for environment `local` ("wk-...:ws-..."), read from its
    secret output `credentials` (never printed)."""
    done = subprocess.run(
        [sys.executable, "-m", "pulumi_standin", "output", "credentials", "--cwd", str(ACCESS_DIR),
         "--stack", "local", "--state", str(state), "--show-secrets", "--json"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    where = f"the access stack's output `credentials` ({state})"
    if done.returncode != 0:
        raise ManagedModeError(
            f"managed mode: reading {where} failed: {done.stderr.strip()[-400:]}; "
            "check it with `python -m pulumi_standin output --cwd access --stack local`, or "
            "run with MANAGED=0"
        )
    try:
        token = json.loads(done.stdout)["local"]["proxy_token"]
    except (ValueError, KeyError, TypeError):
        raise ManagedModeError(
            f"managed mode: {where} has no proxy token for environment 'local' (its "
            "`environments` has no `local` entry?); add one to access/Pulumi.local.yaml and "
            "run `python -m pulumi_standin up --cwd access --stack local`, or run with MANAGED=0"
        ) from None
    return str(token)


def managed_args(argv: list[str]) -> list[str]:
    """The extra arguments that put the root project's `local` stack in managed mode for this
    run, or [] (another command, stack or project, MANAGED=0, no access stack)."""
    if not argv or argv[0] not in MANAGED_COMMANDS:
        return []
    if _option(argv, "--stack") != "local" or _option(argv, "--cwd", "-C") is not None:
        return []
    if any("managedByAccessStack" in a for a in argv):  # the caller said it itself
        return []
    mode = os.environ.get("MANAGED", "").strip().lower() or "auto"
    if mode not in ("0", "1", "auto"):
        raise ManagedModeError(f"MANAGED={mode!r} is not one of 0, 1 or auto (the default)")
    state = access_state()
    if mode == "0":
        return []
    if not access_stack_deployed(state):
        if mode == "1":
            raise ManagedModeError(
                f"MANAGED=1, but the access stack 'local' is not deployed ({state} holds no "
                "resource): run `python -m pulumi_standin up --cwd access --stack local "
                "--server-url <emulator URL>` first (docs/program.md, Access)"
            )
        return []
    os.environ[TOKEN_VAR] = access_proxy_token(state)
    # passed on every run of this stack here: not the stand-in's "for this run only" warning
    os.environ["PULUMI_STANDIN_EVERY_RUN"] = "managedByAccessStack,proxyToken"
    shown = state.relative_to(PROJECT_ROOT) if state.is_relative_to(PROJECT_ROOT) else state
    print(
        "Managed mode: the access stack 'local' owns environment 'local', its budget and proxy "
        f"token ({shown});"
        " this run adds --config managedByAccessStack=true and its proxy token (MANAGED=0: off).",
        file=sys.stderr,
    )
    return ["--config", "managedByAccessStack=true", "--secret-from-env", f"proxyToken={TOKEN_VAR}"]


if __name__ == "__main__":
    try:
        extra = managed_args(sys.argv[1:])
    except ManagedModeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    # exec, not runpy: the same process becomes `python -m pulumi_standin ...`, as the scripts
    # and the fault matrix know it (scripts/local-env.sh's watcher stops it by that name)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "pulumi_standin", *sys.argv[1:], *extra]
    os.execv(sys.executable, argv)  # noqa: S606 (our own interpreter, no shell)
