"""The subcommands that build: up, access-up, handoff, plan, dev-export, config, costs, comment.

`up` deploys review stack pr-N (in the access flow as `pr-N-deploy`, after `access-up` or with
a `--handoff`); `plan` writes what the PR comment compares; `comment` renders it with
scripts/review_comment.py. Each `cmd_*` takes the parsed arguments and an `Engine` and returns
the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import review_comment
import yaml

from .common import (
    ACCESS_DIR,
    FILES,
    NS,
    ReviewError,
    deploy_identity,
    is_fork,
    iso,
    now_utc,
    stack_name,
)
from .config import read_stack_file, review_config, write_access_stack_file, write_review_stack_file
from .costs import stack_costs
from .devcopy import cmd_dev_export, preview_against_copy
from .engine import Engine
from .handoff import (
    Handoff,
    derive_passphrase,
    handoff_from_credentials,
    read_handoff,
    write_handoff,
)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _read_json(path: Path) -> Any:
    try:
        return review_comment.read_json(path)
    except ValueError as exc:
        raise ReviewError(str(exc)) from None


def _refuse_fork(args: argparse.Namespace) -> bool:
    if is_fork(args.head_repo, args.base_repo):
        print(
            f"no review stack for forks: PR #{args.pr} comes from {args.head_repo}, not"
            f" {args.base_repo} (a fork's code never runs with this repository's credentials)"
        )
        return True
    return False


def use_access_flow(args: argparse.Namespace, engine: Engine) -> bool:
    """`--flow access` (the access stack owns environment, budget, token and deploy identity),
    `default` (the review stack owns them itself), `auto`: access when access/ exists."""
    if args.flow == "default":
        return False
    present = (engine.project / ACCESS_DIR / "Pulumi.yaml").exists()
    if args.flow == "access" and not present:
        raise ReviewError(f"--flow access, but {engine.project / ACCESS_DIR} is not a project")
    return present


def stack_passphrase(args: argparse.Namespace) -> str:
    """pr-N's own state passphrase when `--state-key-env VAR` names the root key (the admin
    step in CI: REVIEW_STATE_KEY), else "" (the caller's PULUMI_CONFIG_PASSPHRASE is used)."""
    var = getattr(args, "state_key_env", None)
    if not var:
        return ""
    root = os.environ.get(var, "")
    if not root:
        raise ReviewError(
            f"--state-key-env {var}: the variable is not set, so pr-{args.pr}'s passphrase"
            " cannot be derived; set it to the review stacks' root key (REVIEW_STATE_KEY of"
            " the review-admin environment)"
        )
    return derive_passphrase(root, args.pr)


def access_up(args: argparse.Namespace, engine: Engine) -> Handoff:
    """The admin step: access stack pr-N (environment, budget, gateway proxy token, identity
    pr-N-deploy) with the caller's token (an Owner's or Manager's), and its hand-over."""
    stack = stack_name(args.pr)
    engine.select_or_create(stack, access=True)
    path = write_access_stack_file(engine.project, args.pr, budget_usd=args.budget_usd)
    print(
        f"{ACCESS_DIR}/{path.name}: environment {stack}, spend limit ${args.budget_usd:g}/month,"
        f" identity {deploy_identity(args.pr)} (contributor in {stack} only)"
    )
    passphrase = stack_passphrase(args)  # before anything runs: a missing key changes nothing
    engine.deploy(stack, access=True)
    credentials = engine.outputs(stack, access=True, reveal=True).get("credentials")
    return handoff_from_credentials(credentials, args.pr, passphrase)


def existing_handoff(args: argparse.Namespace, engine: Engine) -> Handoff | None:
    stack = stack_name(args.pr)
    passphrase = stack_passphrase(args)
    if not engine.exists(stack, access=True):
        return None
    credentials = engine.outputs(stack, access=True, reveal=True).get("credentials")
    return handoff_from_credentials(credentials, args.pr, passphrase)


def deployer_of(engine: Engine, handoff: Handoff | None) -> Engine:
    """The engine review stack pr-N runs with: the hand-over's deploy token and, when it
    carries one, pr-N's own passphrase (never the caller's)."""
    if handoff is None:
        return engine
    deployer = engine.with_token(handoff.deploy_pair)
    return deployer.with_passphrase(handoff.passphrase) if handoff.passphrase else deployer


def cmd_access_up(args: argparse.Namespace, engine: Engine) -> int:
    if _refuse_fork(args):
        return 0
    handoff = access_up(args, engine)
    write_handoff(args.handoff, handoff, args.seal_key_env)
    sealed = f", sealed with ${args.seal_key_env}" if args.seal_key_env else ""
    print(f"hand-over of {handoff.environment}: {args.handoff} (mode 0600{sealed})")
    return 0


def cmd_handoff(args: argparse.Namespace, engine: Engine) -> int:
    handoff = existing_handoff(args, engine)
    if handoff is None:
        print(f"no access stack {stack_name(args.pr)}: no hand-over written")
        return 0
    write_handoff(args.handoff, handoff, args.seal_key_env)
    print(f"hand-over of {handoff.environment}: {args.handoff}")
    return 0


def cmd_up(args: argparse.Namespace, engine: Engine) -> int:
    stack = stack_name(args.pr)
    if _refuse_fork(args):
        return 0
    handoff: Handoff | None = None
    if args.handoff:
        handoff = read_handoff(args.handoff, args.open_key_env)
    elif use_access_flow(args, engine):
        handoff = access_up(args, engine)  # this process holds an Owner's/Manager's token
    if handoff is not None and handoff.environment != stack:
        raise ReviewError(f"the hand-over is for {handoff.environment}, not {stack}")
    deployer = deployer_of(engine, handoff)
    deployer.select_or_create(stack)
    path, dropped = write_review_stack_file(
        engine.project,
        args.pr,
        args.base_stack,
        budget_usd=args.budget_usd,
        max_containers=args.max_containers,
        managed=handoff is not None,
    )
    who = (
        f"as {deploy_identity(args.pr)} (contributor in {stack} only; the access stack owns"
        " the environment, budget and proxy token)"
        if handoff is not None
        else "owning its environment, budget and proxy token"
    )
    print(
        f"{path.name}: environment {stack}, scaled to zero, spend limit"
        f" ${args.budget_usd:g}/month, {who}"
    )
    if dropped:
        print(
            f"  not taken from Pulumi.{args.base_stack}.yaml (secrets of that stack):"
            f" {', '.join(dropped)}"
        )
    started = now_utc()
    secrets = {"proxyToken": handoff.proxy_token} if handoff is not None else None
    deployer.deploy(stack, secrets=secrets)
    outputs = deployer.outputs(stack)
    meta = {
        "pr": args.pr,
        "stack": stack,
        "engine": engine.kind,
        "flow": "access" if handoff is not None else "default",
        "state": str(engine.state(stack)) if engine.kind == "standin" else "",
        "head_repo": args.head_repo,
        "head_sha": args.head_sha or "",
        "base_stack": args.base_stack,
        "budget_usd": args.budget_usd,
        "sweep_days": args.sweep_days,
        "updated_at": iso(started),
        "key_name": _first_key_name(engine.project, args.base_stack),
    }
    if engine.kind == "standin":
        old = _read_json(engine.meta(stack)) or {}
        meta["created_at"] = old.get("created_at") or meta["updated_at"]
        _write_json(engine.meta(stack), meta)
    if args.out_dir:
        _write_json(args.out_dir / FILES["outputs"], outputs)
        _write_json(args.out_dir / FILES["meta"], meta)
    print(f"review stack {stack}: {outputs.get('endpoint_url', '(no endpoint)')}")
    return 0


def _first_key_name(project: Path, base_stack: str) -> str:
    with contextlib.suppress(ReviewError):
        names = (read_stack_file(project, base_stack).get("config") or {}).get(f"{NS}:apiKeyNames")
        if isinstance(names, list) and names:
            return str(names[0])
    return "gateway"


def cmd_plan(args: argparse.Namespace, engine: Engine) -> int:
    """The PR's code previewed against the base stack: with `--base-copy` (CI), against the
    copy `dev-export` wrote, in a private backend, with no passphrase of the base stack."""
    out: Path = args.out_dir or Path(".")
    base = args.base_stack
    if args.base_copy:
        doc, rc, dev_outputs = preview_against_copy(engine, base, args.base_copy)
    else:
        doc, rc = engine.preview_json(base, args.base_state)
        dev_outputs = engine.outputs(base, args.base_state)
    _write_json(out / FILES["preview"], doc)
    _write_json(out / FILES["dev_outputs"], dev_outputs)
    _write_json(out / FILES["costs"], stack_costs(engine.project, base, engine.server_url or None))
    print(
        f"plan of PR #{args.pr} against {base}: {out / FILES['preview']}"
        + ("" if rc == 0 else f" (the preview failed, exit {rc}: its error is in the document)")
    )
    return 0


def cmd_costs(args: argparse.Namespace, engine: Engine) -> int:
    costs = stack_costs(engine.project, args.base_stack, engine.server_url or None)
    print(json.dumps(costs, indent=2))
    return 0


def cmd_config(args: argparse.Namespace, engine: Engine) -> int:
    base = read_stack_file(engine.project, args.base_stack).get("config") or {}
    config, _ = review_config(
        base,
        args.pr,
        budget_usd=args.budget_usd,
        max_containers=args.max_containers,
        managed=use_access_flow(args, engine),
    )
    sys.stdout.write(yaml.safe_dump({"config": config}, sort_keys=False))
    return 0


def comment_from_files(args: argparse.Namespace) -> str:
    return review_comment.from_files(
        args.in_dir or args.out_dir or Path("."),
        args.pr,
        closed=args.closed,
        reason=args.reason,
        reader_python=args.reader_python,
        base_stack=args.base_stack,
        sweep_days=args.sweep_days,
        head_sha=args.head_sha,
    )


def cmd_comment(args: argparse.Namespace, engine: Engine | None) -> int:
    text = comment_from_files(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"comment for PR #{args.pr}: {args.out}")
    else:
        sys.stdout.write(text)
    return 0


__all__ = [
    "access_up",
    "cmd_access_up",
    "cmd_comment",
    "cmd_config",
    "cmd_costs",
    "cmd_dev_export",
    "cmd_handoff",
    "cmd_plan",
    "cmd_up",
    "deployer_of",
    "existing_handoff",
    "stack_passphrase",
]
