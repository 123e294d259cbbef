"""The stack config model's errors (issue 33 item 2, issue 34 item 7): each one names the real
stack file, the `file:line:col` of the offending key, its path, the value, what is allowed,
and a "did you mean" for an unknown key at any depth, drawn from that level's keys only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import cost
from components.config import ConfigError, StackConfig, parse_access_config, parse_stack_config
from components.config_errors import StackFile

NS = "modal-llm:"
STACK = """\
config:
  modal-llm:environment: mine
  modal-llm:monthlyBudgetUsd: 100000
  modal-llm:services:
    - name: tiny
      engine: vllm
      model: HuggingFaceTB/SmolLM2-135M-Instruct
      gpu: T4
      health_gate: auto
      scaling:
        max_containers: 1
      timeouts:
        startup_s: 600
"""


def _parse(tmp_path: Path, text: str, stack: str = "mine") -> StackConfig:
    """Write the stack file, hand its values over as the CLI does (strings, JSON for
    structures), and parse them with the file's positions."""
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(text)
    config: dict[str, Any] = yaml.safe_load(text)["config"]
    values = {
        k.removeprefix(NS): v if isinstance(v, str) else json.dumps(v)
        for k, v in config.items()
        if k.startswith(NS)
    }
    return parse_stack_config(values, stack=stack, stack_file=StackFile(path.name, path))


def _error(tmp_path: Path, old: str, new: str, stack: str = "mine") -> tuple[str, str]:
    """The error of the stack file with `old` replaced by `new`, and the `file:line:col` the
    replacement's first key sits at."""
    assert old in STACK
    text = STACK.replace(old, new, 1)
    at = text.index(new) + len(new) - len(new.lstrip(" -"))
    line, col = text[:at].count("\n") + 1, at - text.rfind("\n", 0, at)
    with pytest.raises(ConfigError) as info:
        _parse(tmp_path, text, stack)
    return str(info.value), f"Pulumi.{stack}.yaml:{line}:{col}: "


def test_the_committed_shape_parses(tmp_path: Path) -> None:
    cfg = _parse(tmp_path, STACK)
    (svc,) = cfg.services
    assert svc.spec.timeouts.startup_s == 600 and svc.health_gate == "auto"


def test_unknown_top_level_key_suggests_the_close_one_only(tmp_path: Path) -> None:
    message, where = _error(
        tmp_path, "  modal-llm:monthlyBudgetUsd:", "  modal-llm:monthlyBudgetUSD:"
    )
    assert message.startswith(where + f"{NS}monthlyBudgetUSD is not a known key; did you mean")
    assert "did you mean 'monthlyBudgetUsd'?" in message
    assert "pulumi config rm modal-llm:monthlyBudgetUSD --stack mine" in message
    assert "engineStandin" not in message  # not every key of the model listed
    # The file's real name, never the literal `Pulumi.<stack>.yaml`.
    assert "Pulumi.<stack>.yaml" not in message


def test_unknown_top_level_key_without_a_close_one_points_to_the_reference(
    tmp_path: Path,
) -> None:
    message, where = _error(
        tmp_path, "  modal-llm:monthlyBudgetUsd: 100000\n", "  modal-llm:zz: 1\n"
    )
    assert message.startswith(where + f"{NS}zz is not a known key (docs/program.md lists")
    assert "appFile" not in message


def test_unknown_service_key_depth_1(tmp_path: Path) -> None:
    message, where = _error(tmp_path, "      scaling:", "      scalling:")
    assert message.startswith(where + f"{NS}services[0].scalling is not a known key;")
    assert "did you mean 'scaling'?" in message


def test_unknown_key_depth_2(tmp_path: Path) -> None:
    message, where = _error(tmp_path, "        max_containers: 1", "        max_contaners: 1")
    assert message.startswith(where + f"{NS}services[0].scaling.max_contaners is not a known")
    assert "did you mean 'max_containers'" in message
    assert "'startup_s'" not in message  # only the keys of `scaling`


def test_a_literal_violation_names_the_allowed_values(tmp_path: Path) -> None:
    message, where = _error(tmp_path, "health_gate: auto", "health_gate: sometimes")
    assert message.startswith(
        where + f"{NS}services[0].health_gate = 'sometimes' must be one of 'auto', 'always' or"
        " 'never'"
    )
    assert "pulumi config set --path 'services[0].health_gate' <value> --stack mine" in message
    assert "did you mean" not in message  # nothing close to 'sometimes'
    message, where = _error(tmp_path, "health_gate: auto", "health_gate: alwys")
    assert message.startswith(where) and "; did you mean 'always'?" in message


def test_a_constrained_number_names_its_bound(tmp_path: Path) -> None:
    message, where = _error(tmp_path, "startup_s: 600", "startup_s: 0")
    assert message.startswith(
        where + f"{NS}services[0].timeouts.startup_s = 0 must be a whole number >= 1"
    )
    message, where = _error(
        tmp_path, "modal-llm:monthlyBudgetUsd: 100000", "modal-llm:monthlyBudgetUsd: x"
    )
    assert message.startswith(where + f"{NS}monthlyBudgetUsd = 'x' must be a number >= 0")


def test_a_negative_budget_suggests_one_that_passes_the_budget_guard(tmp_path: Path) -> None:
    """Issue 34.7: the fix of a bad budget names a value the budget guard accepts, not the
    default $50 (the one T4 of this stack costs more than that at worst)."""
    message, where = _error(
        tmp_path, "modal-llm:monthlyBudgetUsd: 100000", "modal-llm:monthlyBudgetUsd: -5"
    )
    assert message.startswith(where + f"{NS}monthlyBudgetUsd = '-5' must be a number >= 0")
    suggested = message.split(f"pulumi config set {NS}monthlyBudgetUsd ")[1].split()[0]
    assert float(suggested) > 50
    cfg = _parse(tmp_path, STACK.replace("100000", suggested))  # the guard accepts it
    assert cfg.cost.worst_usd <= float(suggested) < cfg.cost.worst_usd + 1


def test_every_problem_found_at_once_and_nothing_applied(tmp_path: Path) -> None:
    text = STACK.replace("scaling:", "scalling:").replace("health_gate: auto", "health_gate: x")
    with pytest.raises(ConfigError) as info:
        _parse(tmp_path, text)
    lines = str(info.value).splitlines()
    assert len(lines) == 3 and len(info.value.problems) == 2
    assert lines[-1].startswith("Nothing was applied")


def test_gpu_price_overrides(tmp_path: Path) -> None:
    cfg = _parse(tmp_path, STACK + "  modal-llm:gpuPricesUsdPerHour:\n    h200: 9.5\n")
    assert cfg.gpu_prices["H200"] == 9.5  # Modal's spelling, case-insensitive
    assert cfg.gpu_prices["T4"] == cost.GPU_PRICES_USD_PER_HOUR["T4"]
    for bad, expected in (
        ("H2OO: 9.0", "gpuPricesUsdPerHour.H2OO = 'H2OO' is not a Modal GPU type"),
        ("H200: -1", "gpuPricesUsdPerHour.H200 = -1 must be a number >= 0"),
        ("H200: true", "gpuPricesUsdPerHour.H200 = True must be a number, not a boolean"),
    ):
        with pytest.raises(ConfigError) as info:
            _parse(tmp_path, STACK + f"  modal-llm:gpuPricesUsdPerHour:\n    {bad}\n")
        assert str(info.value).startswith("Pulumi.mine.yaml:15:5: "), str(info.value)
        assert expected in str(info.value)


def test_access_stack_typo_gets_its_level_suggestion(tmp_path: Path) -> None:
    text = "config:\n  modal-llm-access:environments:\n    - name: dev\n      monthly_budget: 5\n"
    path = tmp_path / "Pulumi.ws.yaml"
    path.write_text(text)
    raw = json.dumps(yaml.safe_load(text)["config"]["modal-llm-access:environments"])
    with pytest.raises(ConfigError) as info:
        parse_access_config(raw, stack="ws", stack_file=path)
    message = str(info.value)
    assert (
        "Pulumi.ws.yaml:4:7: modal-llm-access:environments[0].monthly_budget is not a known"
        " key; did you mean 'monthly_budget_usd'?"
    ) in message.splitlines()
    # and the key it was meant to be is missing, where the environment starts
    assert (
        "Pulumi.ws.yaml:3:7: modal-llm-access:environments[0].monthly_budget_usd is not set"
        in message
    )


def test_the_service_task_is_the_gate_s_tasks_with_its_default() -> None:
    """One list of tasks and one default (components/modal/defaults.py); the model's Literal
    spells them out for mypy."""
    from typing import get_args

    from components.config import ServiceInput
    from components.modal.defaults import GATE_TASK, GATE_TASKS

    field = ServiceInput.model_fields["task"]
    assert get_args(field.annotation) == tuple(GATE_TASKS)
    assert field.default == GATE_TASK
