"""The cost figures of a stack file, computed with this checkout's own config parser and model.

`plan` writes them for the PR's code (`pulumi preview --json` does not carry new stack
outputs); `costs` prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import NS, ROOT, ReviewError


def stack_costs(project: Path, stack: str, server_url: str | None) -> dict[str, Any]:
    """The idle / baseline / worst-case figures of `Pulumi.<stack>.yaml` with `project`'s own
    config parser and cost model (what the stack outputs would be after `up`): this checkout's
    in this process, another checkout's (`--project DIR`) by that checkout's own
    scripts/review_stack.py `costs`, run with this interpreter."""
    if project.resolve() != ROOT.resolve():
        return _costs_of_other_checkout(project.resolve(), stack, server_url)
    from components.config import ConfigError, parse_stack_config
    from components.config_errors import StackFile
    from pulumi_standin.program import stack_config

    config, _ = stack_config(stack, project_dir=project)  # the PR checkout's, not the tools'
    values: dict[str, str | None] = {
        k.removeprefix(f"{NS}:"): v for k, v in config.items() if k.startswith(f"{NS}:")
    }
    values["allowOverBudget"] = "true"  # figures even when the budget guard would refuse
    try:
        cfg = parse_stack_config(
            values,
            stack=stack,
            modal_server_url=server_url,
            stack_file=StackFile.of(stack, project),
        )
    except ConfigError as exc:  # it names the file, the key's line and column
        raise ReviewError(str(exc)) from None
    return {
        "monthly_cost_idle_usd": cfg.cost.idle_usd,
        "monthly_cost_baseline_usd": cfg.cost.baseline_usd,
        "monthly_cost_worst_usd": cfg.cost.worst_usd,
        "monthly_budget_usd": cfg.monthly_budget_usd,
        "services": {
            s.name: {
                "gpu": s.cost.gpu,
                "gpu_count": s.cost.gpu_count,
                "min_containers": s.cost.min_containers,
                "max_containers": s.cost.max_containers,
                "monthly_cost_idle_usd": s.cost.idle_usd,
                "monthly_cost_baseline_usd": s.cost.baseline_usd,
                "monthly_cost_worst_usd": s.cost.worst_usd,
            }
            for s in cfg.services
        },
    }


def _costs_of_other_checkout(project: Path, stack: str, server_url: str | None) -> dict[str, Any]:
    """`costs` of another checkout (a PR's), by its own scripts/review_stack.py: the figures
    must come from that checkout's cost model, not from this one's."""
    script = project / "scripts" / "review_stack.py"
    if not script.is_file():
        raise ReviewError(
            f"costs of {project}: it has no scripts/review_stack.py to compute them with;"
            " pass --project a checkout of this repository"
        )
    cmd = [sys.executable, str(script), "costs", "--base-stack", stack]
    if server_url:
        cmd += ["--server-url", server_url]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its code, not ours
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    shown = f"{project}/scripts/review_stack.py costs --base-stack {stack}"
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ReviewError(
            f"costs of {project}: `{shown}` exited {done.returncode}: {tail or '(no message)'};"
            f" run it in {project} to see why"
        )
    try:
        figures = json.loads(done.stdout)
    except ValueError:
        figures = None
    if not isinstance(figures, dict):
        raise ReviewError(
            f"costs of {project}: `{shown}` printed no JSON object on stdout"
            f" ({done.stdout[:200]!r}); run it in {project} to see why"
        )
    return figures
