"""Per-stack CPU and memory rates: `modal-llm:cpuPriceUsdPerCoreHour` and
`modal-llm:memoryPriceUsdPerGibHour` override components/cost.py's constants the way
`gpuPricesUsdPerHour` overrides a GPU's row (docs/program.md, "Cost guard")."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
import yaml

from components import config as config_mod
from components import cost
from components.config import ConfigError, parse_stack_config
from tests.program.runner import PROJECT_ROOT, run_program, stack_config

NS = "modal-llm:"
# The formula as docs/program.md documents it: container $/h = (GPU $/h x gpu_count + cores x
# CPU $/core-h + GiB x memory $/GiB-h) x region x (1 + costOverheadPct / 100); x 730 h a month.
# The documented defaults: Modal's $0.0000131 per core-second and $0.00000222 per GiB-second.
DOC_CPU_RATE = 0.0000131 * 3600
DOC_MEMORY_RATE = 0.00000222 * 3600
T4 = 0.59
VLLM_DEFAULT = (6, 12)  # the spec's derived requests for vLLM's defaults (docs/serving.md)

SERVICE = {"name": "tiny", "engine": "vllm", "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
           "gpu": "T4", "scaling": {"min_containers": 1, "max_containers": 2}}  # fmt: skip


def hourly(gpu: float, cores: float, gib: float, cpu: float, mem: float, *, region: float = 1.0,
           overhead_pct: float = 0.0) -> float:  # fmt: skip
    return (gpu + cores * cpu + gib * mem) * region * (1 + overhead_pct / 100)


def parse(**keys: str) -> config_mod.StackConfig:
    values = {
        "environment": "mine",
        "services": json.dumps([SERVICE]),
        "monthlyBudgetUsd": "100000",
        **keys,
    }
    return parse_stack_config(values, stack="mine")


def test_the_defaults_are_cost_py_constants() -> None:
    assert abs(cost.CPU_USD_PER_CORE_HOUR - DOC_CPU_RATE) < 1e-12
    assert abs(cost.MEMORY_USD_PER_GIB_HOUR - DOC_MEMORY_RATE) < 1e-12
    assert config_mod.RATE_KEYS["cpuPriceUsdPerCoreHour"][0] == cost.CPU_USD_PER_CORE_HOUR
    assert config_mod.RATE_KEYS["memoryPriceUsdPerGibHour"][0] == cost.MEMORY_USD_PER_GIB_HOUR
    assert set(config_mod.RATE_KEYS) <= config_mod.KNOWN_KEYS
    # ServiceCostInput's defaults: existing callers price at the constants, as before.
    svc = cost.ServiceCostInput("m", ("T4",), 1, 1, 1, cpu_cores=6, memory_gib=12)
    assert svc.cpu_usd_per_core_hour == cost.CPU_USD_PER_CORE_HOUR
    assert svc.memory_usd_per_gib_hour == cost.MEMORY_USD_PER_GIB_HOUR
    # An unset key is the constant, exactly (figures elsewhere do not move).
    cfg = parse()
    assert cfg.cpu_usd_per_core_hour == cost.CPU_USD_PER_CORE_HOUR
    assert cfg.memory_usd_per_gib_hour == cost.MEMORY_USD_PER_GIB_HOUR
    (s,) = cfg.services
    assert (s.cost.cpu_usd_per_core_hour, s.cost.memory_usd_per_gib_hour) == (
        cost.CPU_USD_PER_CORE_HOUR,
        cost.MEMORY_USD_PER_GIB_HOUR,
    )
    assert (s.cost.cpu_cores, s.cost.memory_gib) == VLLM_DEFAULT
    per_h = hourly(T4, *VLLM_DEFAULT, DOC_CPU_RATE, DOC_MEMORY_RATE)
    assert s.cost.container_usd_per_hour == pytest.approx(per_h)
    assert s.cost.idle_usd == round(per_h * 730, 2)
    assert s.cost.worst_usd == round(2 * per_h * 730, 2)
    # The rates are not declared in Pulumi.yaml (no number type there), so no default of
    # Pulumi.yaml fills them in: unset reaches the program as unset.
    project = yaml.safe_load((PROJECT_ROOT / "Pulumi.yaml").read_text())
    assert not set(config_mod.RATE_KEYS) & set(project["config"])


@pytest.mark.parametrize(
    ("cpu", "mem"),
    [("0.05", "0.01"), ("0", "0"), ("0.1", None), (None, "0.02"), ("1", "1")],
)
def test_an_override_changes_the_container_rate_and_the_monthly_figures(
    cpu: str | None, mem: str | None
) -> None:
    keys = {k: v for k, v in (("cpuPriceUsdPerCoreHour", cpu), ("memoryPriceUsdPerGibHour", mem))}
    cfg = parse(**{k: v for k, v in keys.items() if v is not None})
    cpu_rate = float(cpu) if cpu is not None else DOC_CPU_RATE
    mem_rate = float(mem) if mem is not None else DOC_MEMORY_RATE
    assert cfg.cpu_usd_per_core_hour == pytest.approx(cpu_rate)
    assert cfg.memory_usd_per_gib_hour == pytest.approx(mem_rate)
    (s,) = cfg.services
    cores, gib = VLLM_DEFAULT
    per_h = hourly(T4, cores, gib, cpu_rate, mem_rate)
    assert s.cost.cpu_usd_per_hour == pytest.approx(cores * cpu_rate)
    assert s.cost.memory_usd_per_hour == pytest.approx(gib * mem_rate)
    assert s.cost.container_usd_per_hour == pytest.approx(per_h)
    assert s.cost.idle_usd == pytest.approx(round(1 * per_h * 730, 2), abs=0.005)
    assert s.cost.baseline_usd == pytest.approx(round(1 * per_h * 730, 2), abs=0.005)
    assert s.cost.worst_usd == pytest.approx(round(2 * per_h * 730, 2), abs=0.005)
    assert cfg.cost.worst_usd == pytest.approx(s.cost.worst_usd)


def test_the_override_goes_through_region_overhead_and_the_budget_message() -> None:
    svc = cost.ServiceCostInput(
        "m", ("H100",), 1, 1, 3, region="us", overhead_pct=10, cpu_cores=6, memory_gib=12,
        cpu_usd_per_core_hour=0.05, memory_usd_per_gib_hour=0.01,
    )  # fmt: skip
    c = cost.service_cost(svc, cost.GPU_PRICES_USD_PER_HOUR)
    per_h = hourly(3.95, 6, 12, 0.05, 0.01, region=1.5, overhead_pct=10)
    assert c.container_usd_per_hour == pytest.approx(per_h)
    assert c.idle_usd == round(per_h * 730, 2)
    assert c.worst_usd == round(3 * per_h * 730, 2)
    with pytest.raises(cost.BudgetExceeded) as info:
        cost.check_budget(
            cost.StackCost(services=(c,)), 100, allow_over_budget=False, config_ns="p"
        )
    # The budget message prices the terms at the stack's rates, not the constants.
    assert "6 CPU cores x $0.05000/h" in str(info.value)
    assert "12 GiB x $0.010000/h" in str(info.value)
    assert f"= ${3.95 + 6 * 0.05 + 12 * 0.01:.4f}/h" in str(info.value)


@pytest.mark.parametrize("key", ["cpuPriceUsdPerCoreHour", "memoryPriceUsdPerGibHour"])
@pytest.mark.parametrize("bad", ["-0.05", "cheap", "true", "False", "", "nan", "inf", "-inf"])
def test_a_bad_rate_is_refused_with_the_fix(key: str, bad: str) -> None:
    default = config_mod.RATE_KEYS[key][0]
    with pytest.raises(ConfigError) as info:
        parse(**{key: bad})
    message = str(info.value)
    assert message.startswith(f"Pulumi.mine.yaml: {NS}{key} = {bad!r} must be a number >= 0")
    assert f"{default:g}" in message and "components/cost.py" in message
    assert "USD per" in message
    assert "Pulumi.mine.yaml" in message
    assert f"pulumi config set {NS}{key} {default:g} --stack mine" in message
    assert f"pulumi config rm {NS}{key} --stack mine" in message
    if bad.lower() in ("true", "false"):
        assert "not a boolean" in message


def _config(**overrides: Any) -> tuple[dict[str, str], list[str]]:
    extra: dict[str, Any] = {
        f"{NS}hfToken": {"secure": "x"},
        f"{NS}alertWebhookUrl": {"secure": "x"},
    }
    extra.update({NS + k: v for k, v in overrides.items()})
    return stack_config("dev", extra)


def test_the_stack_output_shows_the_rates_and_the_overridden_figures() -> None:
    """Under mocks, with Pulumi.dev.yaml (one L4, max 1 container): the YAML numbers reach the
    program as the CLI hands them over (strings), and the `services` output shows the rates."""
    base = run_program("dev", *_config())
    summary = base.output("services")["qwen-small"]
    assert summary["prices_usd_per_hour"] == {
        "gpu": 0.8,
        "cpu_core": round(DOC_CPU_RATE, 6),
        "memory_gib": round(DOC_MEMORY_RATE, 6),
    }
    run = run_program(
        "dev",
        *_config(
            cpuPriceUsdPerCoreHour=0.06, memoryPriceUsdPerGibHour=0.012, monthlyBudgetUsd=3000
        ),
    )
    summary = run.output("services")["qwen-small"]
    assert summary["prices_usd_per_hour"] == {"gpu": 0.8, "cpu_core": 0.06, "memory_gib": 0.012}
    cores, gib = VLLM_DEFAULT
    per_h = hourly(0.8, cores, gib, 0.06, 0.012)
    assert summary["container_usd_per_hour"] == {
        "gpu": 0.8,
        "cpu": round(cores * 0.06, 4),
        "memory": round(gib * 0.012, 4),
        "total": round(per_h, 4),
    }
    assert run.output("monthly_cost_worst_usd") == pytest.approx(round(per_h * 730, 2), abs=0.01)
    assert run.output("monthly_cost_worst_usd") > base.output("monthly_cost_worst_usd")
    with pytest.raises(pulumi.RunError) as info:
        run_program("dev", *_config(cpuPriceUsdPerCoreHour=True))
    assert f"{NS}cpuPriceUsdPerCoreHour = 'true' must be a number >= 0, not a boolean" in str(
        info.value
    )
    assert f"pulumi config set {NS}cpuPriceUsdPerCoreHour 0.04716 --stack dev" in str(info.value)
