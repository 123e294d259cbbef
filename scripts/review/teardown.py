"""The subcommands that tear down or look: destroy, access-destroy, list, sweep.

`destroy` removes review stack pr-N (and, unless given a `--handoff`, its access stack);
`list` shows every review stack with its last deploy; `sweep` destroys those older than N
days or whose PR is no longer open.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import replace

from .common import ACCESS_DIR, ReviewError, iso, now_utc, parse_time, stack_name
from .config import write_access_stack_file, write_review_stack_file
from .deploy import deployer_of, existing_handoff
from .engine import Engine, StackInfo
from .handoff import read_handoff


def _destroy_service(args: argparse.Namespace, engine: Engine, *, managed: bool) -> bool:
    stack = stack_name(args.pr)
    config_file = engine.project / f"Pulumi.{stack}.yaml"
    if not config_file.exists():  # destroy reads the stack's config (provider settings)
        write_review_stack_file(
            engine.project,
            args.pr,
            args.base_stack,
            budget_usd=args.budget_usd,
            max_containers=args.max_containers,
            managed=managed,
        )
    try:
        return engine.destroy(stack)
    finally:
        if not args.keep_config:
            config_file.unlink(missing_ok=True)


def _destroy_access(args: argparse.Namespace, engine: Engine) -> bool:
    stack = stack_name(args.pr)
    path = engine.project / ACCESS_DIR / f"Pulumi.{stack}.yaml"
    if not path.exists():
        write_access_stack_file(engine.project, args.pr, budget_usd=args.budget_usd)
    try:
        return engine.destroy(stack, access=True)
    finally:
        if not args.keep_config:
            path.unlink(missing_ok=True)


def cmd_destroy(args: argparse.Namespace, engine: Engine) -> int:
    """The review stack (with `--handoff`: with that deploy token, the service stack only, as
    the workflow's teardown job); without it, and an access stack pr-N there: the whole
    teardown in order, service stack as pr-N-deploy, then the access stack with the caller's
    token (environment, budget, proxy token, service user)."""
    stack = stack_name(args.pr)
    if args.handoff:
        given = read_handoff(args.handoff, args.open_key_env)
        existed = _destroy_service(args, deployer_of(engine, given), managed=True)
        print(f"review stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
        return 0
    handoff = existing_handoff(args, engine) if args.flow != "default" else None
    service = deployer_of(engine, handoff)
    existed = _destroy_service(args, service, managed=handoff is not None)
    print(f"review stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
    if handoff is not None:
        _destroy_access(args, engine)
        print(f"access stack {stack}: destroyed (environment, budget, proxy token, identity)")
    return 0


def cmd_access_destroy(args: argparse.Namespace, engine: Engine) -> int:
    existed = _destroy_access(args, engine)
    stack = stack_name(args.pr)
    print(f"access stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
    return 0


def review_stacks(engine: Engine) -> list[StackInfo]:
    """Every PR with a review stack or an access stack (or both), last deployed when the
    later of the two was."""
    merged: dict[int, StackInfo] = {}
    sources = [engine.list_stacks()]
    if (engine.project / ACCESS_DIR / "Pulumi.yaml").exists():
        sources.append(engine.list_stacks(access=True))
    for source in sources:
        for s in source:
            have = merged.get(s.pr)
            if have is None:
                merged[s.pr] = replace(s)
                continue
            times = [t for t in (have.last_update, s.last_update) if t is not None]
            have.last_update = max(times) if times else None
            have.in_progress = have.in_progress or s.in_progress
    return [merged[pr] for pr in sorted(merged)]


def cmd_list(args: argparse.Namespace, engine: Engine) -> int:
    now = parse_time(args.now) if args.now else now_utc()
    if now is None:
        raise ReviewError(f"--now {args.now!r} is not an ISO 8601 time")
    rows = [
        {
            "stack": s.name,
            "pr": s.pr,
            "last_update": iso(s.last_update) if s.last_update else None,
            "age_days": round((now - s.last_update).total_seconds() / 86400, 2)
            if s.last_update
            else None,
            "update_in_progress": s.in_progress,
        }
        for s in review_stacks(engine)
    ]
    print(json.dumps(rows, indent=2))
    return 0


def stale(
    stacks: Sequence[StackInfo], now: dt.datetime, days: float, open_prs: set[int] | None
) -> list[tuple[StackInfo, str]]:
    """The review stacks the sweep destroys, each with why: last deployed more than `days` ago
    (or never), or (with `open_prs`) its PR is no longer open. One being updated is left."""
    found = []
    for s in stacks:
        if s.in_progress:
            continue
        if open_prs is not None and s.pr not in open_prs:
            found.append((s, f"PR #{s.pr} is not open"))
        elif s.last_update is None:
            found.append((s, "never deployed"))
        elif (now - s.last_update).total_seconds() > days * 86400:
            age = (now - s.last_update).total_seconds() / 86400
            found.append((s, f"last deployed {age:.1f} days ago (> {days:g})"))
    return found


def cmd_sweep(args: argparse.Namespace, engine: Engine) -> int:
    now = parse_time(args.now) if args.now else now_utc()
    if now is None:
        raise ReviewError(f"--now {args.now!r} is not an ISO 8601 time")
    open_prs = None
    if args.open_prs is not None:
        open_prs = {int(x) for x in re.split(r"[,\s]+", args.open_prs.strip()) if x}
    stacks = review_stacks(engine)
    doomed = stale(stacks, now, args.older_than_days, open_prs)
    if args.list_only:  # the workflow's sweep: which PRs its teardown jobs destroy
        print(json.dumps([{"pr": s.pr, "stack": s.name, "why": why} for s, why in doomed]))
        return 0
    print(
        f"sweep: {len(stacks)} review stack(s), {len(doomed)} to destroy"
        f" (last deploy older than {args.older_than_days:g} days"
        + ("" if open_prs is None else ", or PR not open")
        + ")"
    )
    failed = []
    for s, why in doomed:
        print(f"  {s.name}: {why}" + (" (dry run: kept)" if args.dry_run else ""))
        if args.dry_run:
            continue
        sub = argparse.Namespace(**{**vars(args), "pr": s.pr, "keep_config": False})
        try:
            cmd_destroy(sub, engine)
        except ReviewError as exc:
            print(f"error: {s.name}: {exc}", file=sys.stderr)
            failed.append(s.name)
    if failed:
        print(f"sweep: {len(failed)} failed: {', '.join(failed)} (rerun to retry)", file=sys.stderr)
        return 1
    return 0
