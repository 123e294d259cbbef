"""The subcommands that build: up, access-up, handoff, plan, config, costs, comment.

`up` deploys review stack pr-N (in the access flow as `pr-N-deploy`, after `access-up` or with
a `--handoff`); `plan` writes what the PR comment compares; `comment` renders it with
scripts/review_comment.py. Each `cmd_*` takes the parsed arguments and an `Engine` and returns
the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from .engine import Engine
from .handoff import Handoff, handoff_from_credentials, read_handoff, write_handoff


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
    engine.deploy(stack, access=True)
    credentials = engine.outputs(stack, access=True, reveal=True).get("credentials")
    return handoff_from_credentials(credentials, args.pr)


def existing_handoff(args: argparse.Namespace, engine: Engine) -> Handoff | None:
    stack = stack_name(args.pr)
    if not engine.exists(stack, access=True):
        return None
    credentials = engine.outputs(stack, access=True, reveal=True).get("credentials")
    return handoff_from_credentials(credentials, args.pr)


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
    deployer = engine.with_token(handoff.deploy_pair) if handoff is not None else engine
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
    out: Path = args.out_dir or Path(".")
    base = args.base_stack
    doc, rc = engine.preview_json(base, args.base_state)
    _write_json(out / FILES["preview"], doc)
    _write_json(out / FILES["dev_outputs"], engine.outputs(base, args.base_state))
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
