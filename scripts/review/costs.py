"""The cost figures of a stack file, computed with this checkout's own config parser and model.

`plan` writes them for the PR's code (`pulumi preview --json` does not carry new stack
outputs); `costs` prints them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import NS, ROOT, ReviewError


def stack_costs(project: Path, stack: str, server_url: str | None) -> dict[str, Any]:
    """The idle / baseline / worst-case figures of `Pulumi.<stack>.yaml` with this checkout's
    own config parser and cost model (what the stack outputs would be after `up`)."""
    if project.resolve() != ROOT.resolve():
        raise ReviewError(
            f"costs of {project} must be computed by that checkout's own scripts/review_stack.py"
        )
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
