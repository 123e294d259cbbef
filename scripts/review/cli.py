"""The command line of scripts/review_stack.py: its arguments, the subcommand table, main.

`main` parses the arguments, builds the `Engine` (the stand-in for the offline `config` and
`costs`), runs the subcommand and turns a `ReviewError` into `error: ...` on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .common import (
    DEFAULT_BASE_STACK,
    DEFAULT_BUDGET_USD,
    DEFAULT_MAX_CONTAINERS,
    DEFAULT_SWEEP_DAYS,
    ROOT,
    ReviewError,
)
from .deploy import (
    cmd_access_up,
    cmd_comment,
    cmd_config,
    cmd_costs,
    cmd_dev_export,
    cmd_handoff,
    cmd_plan,
    cmd_up,
)
from .engine import Engine, choose_engine
from .teardown import cmd_access_destroy, cmd_destroy, cmd_list, cmd_sweep


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise SystemExit(f"error: {name}={raw!r} is not a number") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/review_stack.py",
        description="Review stacks pr-<N> for labelled pull requests (docs/review-stacks.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    state_dir = os.environ.get("REVIEW_STATE_DIR")

    def common(p: argparse.ArgumentParser, *, pr: bool) -> None:
        if pr:
            p.add_argument("--pr", type=int, required=True, help="pull request number")
        p.add_argument(
            "--engine",
            choices=["auto", "cli", "standin"],
            help="default: PULUMI_ENGINE, else auto (the CLI when installed)",
        )
        p.add_argument(
            "--flow",
            choices=["auto", "access", "default"],
            default=os.environ.get("REVIEW_FLOW", "auto"),
            help=(
                "access: the access stack owns environment, budget, proxy token and the"
                " pr-N-deploy identity; default: the review stack owns them; auto (default):"
                " access when access/ exists (env REVIEW_FLOW)"
            ),
        )
        p.add_argument(
            "--project", type=Path, default=ROOT, help="the checkout to deploy (default: this one)"
        )
        p.add_argument(
            "--base-stack",
            default=DEFAULT_BASE_STACK,
            help="the stack a review stack is made from and compared with (default dev)",
        )
        p.add_argument("--out-dir", type=Path, help="where the JSON files for the comment go")
        p.add_argument(
            "--state-dir",
            type=Path,
            default=Path(state_dir) if state_dir else None,
            help=(
                "stand-in: where the review stacks' state files live (default"
                " <project>/.pulumi-offline; env REVIEW_STATE_DIR)"
            ),
        )
        p.add_argument(
            "--server-url",
            default=os.environ.get("MODAL_SERVER_URL", ""),
            help="stand-in: the emulator's URL (default env MODAL_SERVER_URL)",
        )
        p.add_argument(
            "--budget-usd",
            type=float,
            default=_env_number("REVIEW_BUDGET_USD", DEFAULT_BUDGET_USD),
            help="spend limit per review stack and month (default 20; env REVIEW_BUDGET_USD)",
        )
        p.add_argument(
            "--max-containers",
            type=int,
            default=DEFAULT_MAX_CONTAINERS,
            help="cap on every service's max_containers in a review stack (default 1)",
        )
        p.add_argument(
            "--sweep-days",
            type=int,
            default=int(_env_number("REVIEW_MAX_AGE_DAYS", DEFAULT_SWEEP_DAYS)),
            help="the age the nightly sweep destroys at, shown in the comment (default 7)",
        )
        p.add_argument("--keep-config", action="store_true", help="keep Pulumi.pr-N.yaml files")
        p.add_argument(
            "--handoff",
            type=Path,
            help="the hand-over file (deploy identity + proxy token) of the access step",
        )
        p.add_argument(
            "--seal-key-env",
            help="access-up/handoff: encrypt the hand-over with this variable's value (openssl)",
        )
        p.add_argument(
            "--open-key-env", help="up/destroy: the hand-over is sealed with this variable's value"
        )
        p.add_argument(
            "--state-key-env",
            help=(
                "access-up/handoff: derive review stack pr-N's own state passphrase from this"
                " variable's value (the root key REVIEW_STATE_KEY) into the hand-over"
            ),
        )

    def fork_guard(p: argparse.ArgumentParser) -> None:
        p.add_argument("--head-repo", required=True, help="OWNER/REPO the PR's branch lives in")
        p.add_argument("--base-repo", required=True, help="OWNER/REPO of this repository")
        p.add_argument("--head-sha", default="", help="the PR's head commit (for the comment)")

    p = sub.add_parser("up", help="deploy (create or update) the PR's review stack")
    common(p, pr=True)
    fork_guard(p)

    p = sub.add_parser(
        "access-up", help="admin step: the access stack pr-N and its hand-over (--handoff)"
    )
    common(p, pr=True)
    fork_guard(p)

    p = sub.add_parser("handoff", help="admin step: the hand-over of an existing access stack")
    common(p, pr=True)

    p = sub.add_parser("plan", help="preview the PR's code against the base stack; costs")
    common(p, pr=True)
    p.add_argument("--base-state", type=Path, help="stand-in: the base stack's state file")
    p.add_argument(
        "--base-copy",
        type=Path,
        help="preview against this copy of the base stack (dev-export), with none of its secrets",
    )

    p = sub.add_parser(
        "dev-export",
        help="base-branch step: a copy of the base stack's state with every secret replaced",
    )
    common(p, pr=False)
    p.add_argument("--base-state", type=Path, help="stand-in: the base stack's state file")
    p.add_argument("--out", type=Path, required=True, help="the copy (for plan --base-copy)")

    p = sub.add_parser("comment", help="render the PR comment from the files of plan and up")
    common(p, pr=True)
    p.add_argument("--in-dir", type=Path, help="where plan and up wrote (default --out-dir)")
    p.add_argument("--out", type=Path, help="write the Markdown here (default stdout)")
    p.add_argument("--closed", action="store_true", help="the comment of a destroyed stack")
    p.add_argument("--reason", default="", help="with --closed: why it was destroyed")
    p.add_argument("--head-sha", default="")
    p.add_argument(
        "--reader-python",
        default=sys.executable,
        help=(
            "stand-in: the python the comment's commands use (default: this one, by its"
            " absolute path: a PR's checkout has no .venv of its own)"
        ),
    )

    p = sub.add_parser("destroy", help="destroy the PR's review stack (and its access stack)")
    common(p, pr=True)

    p = sub.add_parser("access-destroy", help="admin step: destroy the access stack pr-N")
    common(p, pr=True)

    p = sub.add_parser("sweep", help="destroy review stacks last deployed more than N days ago")
    common(p, pr=False)
    p.add_argument(
        "--older-than-days",
        type=float,
        default=None,
        help="default: REVIEW_MAX_AGE_DAYS, else 7 (docs/review-stacks.md, as review.yml)",
    )
    p.add_argument("--open-prs", help="comma-separated open PR numbers: others' stacks go too")
    p.add_argument("--now", help="the time ages are measured from (ISO 8601; tests)")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument(
        "--list-only", action="store_true", help="print the PRs to destroy as JSON, destroy none"
    )

    p = sub.add_parser("list", help="the review stacks and when each was last deployed (JSON)")
    common(p, pr=False)
    p.add_argument("--now", help="the time ages are measured from (ISO 8601)")

    p = sub.add_parser("config", help="print the review stack's config (Pulumi.pr-N.yaml)")
    common(p, pr=True)

    p = sub.add_parser("costs", help="the base stack's costs with this checkout's cost model")
    common(p, pr=False)
    args = parser.parse_args(argv)
    if args.command in ("access-up", "handoff") and args.handoff is None:
        parser.error(f"{args.command} needs --handoff FILE")
    if args.command == "sweep" and args.older_than_days is None:
        # The documented default (docs/review-stacks.md, "Knobs"), as review.yml computes it.
        args.older_than_days = _env_number("REVIEW_MAX_AGE_DAYS", 7.0)
    return args


COMMANDS = {
    "up": cmd_up,
    "access-up": cmd_access_up,
    "handoff": cmd_handoff,
    "plan": cmd_plan,
    "dev-export": cmd_dev_export,
    "destroy": cmd_destroy,
    "access-destroy": cmd_access_destroy,
    "sweep": cmd_sweep,
    "list": cmd_list,
    "config": cmd_config,
    "costs": cmd_costs,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "comment":
            return cmd_comment(args, None)
        project = args.project.resolve()
        offline = args.command in ("config", "costs")
        engine = Engine(
            kind="standin" if offline else choose_engine(args.engine),
            project=project,
            state_dir=(args.state_dir or project / ".pulumi-offline").resolve(),
            server_url=args.server_url,
        )
        return COMMANDS[args.command](args, engine)
    except ReviewError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
