"""The config of review stack pr-N and its access stack, and the stack files that hold them.

`review_config` derives `Pulumi.pr-N.yaml`'s config from the base stack's (`Pulumi.dev.yaml`):
environment pr-N, every service scaled to zero and capped, the review budget, none of the base
stack's secrets. `write_access_stack_file` writes `access/Pulumi.pr-N.yaml` (environment,
budget, proxy token, the `pr-N-deploy` identity).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .common import ACCESS_DIR, ACCESS_NS, NS, ReviewError, deploy_identity, stack_name

#: Keys of the base stack a review stack never takes: it owns its environment, budget, keys and
#: token, and holds nothing secret of the base stack.
DROPPED_KEYS = (
    "managedByAccessStack",
    "adoptEnvironment",
    "protectCaches",
    "proxyTokenRotation",
    "apiKeyRotation",
    "monthlyBudgetUsd",
    "allowOverBudget",
)


def _scaled_to_zero(service: Mapping[str, Any], max_containers: int) -> dict[str, Any]:
    svc = dict(service)
    scaling = dict(svc.get("scaling") or {})
    scaling["min_containers"] = 0
    scaling["max_containers"] = max(1, min(int(scaling.get("max_containers", 1)), max_containers))
    scaling.pop("buffer_containers", None)
    svc["scaling"] = scaling
    svc.pop("warm_schedule", None)  # pre-warm windows raise min_containers: not here
    svc.pop("adopt", None)  # a review stack takes over nothing
    return svc


def review_config(
    base: Mapping[str, Any],
    pr: int,
    *,
    budget_usd: float,
    max_containers: int,
    managed: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """The config of review stack pr-N from the base stack's `config:` mapping, and the keys
    left out (secrets of the base stack, and settings a review stack never takes). `managed`:
    the access stack owns environment, budget and proxy token (`managedByAccessStack`; the
    token itself is set as the secret `proxyToken` at deploy time, never written here)."""
    config: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in base.items():
        _, _, short = key.partition(":")
        if isinstance(value, dict) and set(value) == {"secure"}:
            dropped.append(key)  # encrypted for the base stack only; never copied
            continue
        if key.startswith(f"{NS}:") and short in DROPPED_KEYS:
            continue
        config[key] = value
    config[f"{NS}:environment"] = stack_name(pr)
    config[f"{NS}:monthlyBudgetUsd"] = (
        int(budget_usd) if float(budget_usd).is_integer() else budget_usd
    )
    # The worst case of even one GPU container is above a review budget; the budget itself is
    # the hard stop (Modal stops the environment's work when usage reaches it).
    config[f"{NS}:allowOverBudget"] = True
    if managed:
        config[f"{NS}:managedByAccessStack"] = True
    services = config.get(f"{NS}:services")
    if isinstance(services, list):
        config[f"{NS}:services"] = [
            _scaled_to_zero(s, max_containers) if isinstance(s, dict) else s for s in services
        ]
    return config, sorted(dropped)


def read_stack_file(project: Path, stack: str) -> dict[str, Any]:
    path = project / f"Pulumi.{stack}.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ReviewError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ReviewError(f"{path}: invalid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("config") or {}, dict):
        raise ReviewError(f"{path}: expected a mapping with config:")
    return raw


def _write_stack_file(path: Path, config: Mapping[str, Any], header: str) -> None:
    """Write a stack file, keeping what the CLI put there (encryptionsalt, secrets provider)."""
    kept: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(OSError, yaml.YAMLError):
            old = yaml.safe_load(path.read_text()) or {}
            if isinstance(old, dict):
                kept = {k: v for k, v in old.items() if k != "config"}
    body = yaml.safe_dump({**kept, "config": dict(config)}, sort_keys=False)
    path.write_text(header + body)


def write_review_stack_file(
    project: Path,
    pr: int,
    base_stack: str,
    *,
    budget_usd: float,
    max_containers: int,
    managed: bool = False,
) -> tuple[Path, list[str]]:
    """Write `Pulumi.pr-N.yaml`; returns it with the base stack's keys that were left out."""
    base = read_stack_file(project, base_stack).get("config") or {}
    config, dropped = review_config(
        base, pr, budget_usd=budget_usd, max_containers=max_containers, managed=managed
    )
    path = project / f"Pulumi.{stack_name(pr)}.yaml"
    _write_stack_file(
        path,
        config,
        f"# Review stack {stack_name(pr)}: written by scripts/review_stack.py from"
        f" Pulumi.{base_stack}.yaml for pull request #{pr}.\n# Do not commit: it is rewritten on"
        " every deploy of the PR (docs/review-stacks.md).\n",
    )
    return path, dropped


def write_access_stack_file(project: Path, pr: int, *, budget_usd: float) -> Path:
    """`access/Pulumi.pr-N.yaml`: the access stack of review stack pr-N (run with an Owner's or
    Manager's token): environment pr-N, its budget, its gateway proxy token and ONE identity,
    `pr-N-deploy`, contributor in pr-N only."""
    stack = stack_name(pr)
    budget = int(budget_usd) if float(budget_usd).is_integer() else budget_usd
    config = {
        f"{ACCESS_NS}:environments": [
            {
                "name": stack,
                "monthly_budget_usd": budget,
                "identities": [{"name": deploy_identity(pr), "role": "contributor"}],
            }
        ]
    }
    path = project / ACCESS_DIR / f"Pulumi.{stack}.yaml"
    _write_stack_file(
        path,
        config,
        f"# Access stack of review stack {stack}: written by scripts/review_stack.py for pull"
        f" request #{pr}.\n# Do not commit (docs/review-stacks.md).\n",
    )
    return path
