"""Pure parts of the program: the cost model, gateway rendering and the ApiKey provider."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pulumi.runtime import rpc

from components import cost, gateway
from components.api_keys import ApiKeyProvider, digest_of
from serving.proxy.keys import KeyRing
from serving.spec import GPU_TYPES


def test_every_modal_gpu_has_a_price_with_provenance() -> None:
    # Exactly Modal's GPU types (an extra row could never be used), each with a source note.
    assert set(cost.GPU_PRICES_USD_PER_HOUR) == set(GPU_TYPES)
    assert set(cost.GPU_PRICE_PROVENANCE) == set(GPU_TYPES)
    assert all(p > 0 for p in cost.GPU_PRICES_USD_PER_HOUR.values())
    for gpu, note in cost.GPU_PRICE_PROVENANCE.items():
        assert note.startswith(("confirmed 20", "UNCONFIRMED")), gpu
    # The date is a real calendar date, and the confirmed rows say they were checked on it.
    # (How old it may get is for people to judge, in docs/program.md "Cost guard", not for a
    # test that starts failing on a date: issue 22.15.)
    dt.date.fromisoformat(cost.GPU_PRICES_AS_OF)
    confirmed = [n for n in cost.GPU_PRICE_PROVENANCE.values() if n.startswith("confirmed")]
    assert confirmed and all(n.startswith(f"confirmed {cost.GPU_PRICES_AS_OF}") for n in confirmed)


def test_cost_idle_baseline_and_worst_case() -> None:
    table = {**cost.GPU_PRICES_USD_PER_HOUR, "H200": 5.0}
    svc = cost.ServiceCostInput(
        "m", ("L4", "H200"), gpu_count=2, min_containers=1, max_containers=3,
        buffer_containers=1, overhead_pct=0,
    )  # fmt: skip
    c = cost.service_cost(svc, table)
    assert c.gpu == "H200"  # priced at the dearer choice
    assert c.idle_usd == 1 * 2 * 5.0 * 730
    assert c.baseline_usd == 2 * 2 * 5.0 * 730
    assert c.worst_usd == 3 * 2 * 5.0 * 730
    plain = cost.service_cost(cost.ServiceCostInput("m", ("T4",), 1, 1, 1), table)
    assert plain.idle_usd == pytest.approx(0.59 * 730, abs=0.01)  # default overhead 0, no CPU
    svc15 = cost.ServiceCostInput("m", ("T4",), 1, 1, 1, overhead_pct=15)
    assert cost.service_cost(svc15, table).idle_usd == pytest.approx(0.59 * 1.15 * 730, abs=0.01)
    with pytest.raises(cost.UnknownGpuPrice, match="no price for GPU 'X1'"):
        cost.gpu_price("X1", table)
    # The overrides (gpuPricesUsdPerHour) are checked by the config model: test_config_model.py.


def test_cpu_and_memory_are_priced_from_the_requests() -> None:
    # Modal's rates (modal.com/pricing, CPU_MEMORY_PRICE_PROVENANCE): $0.0000131 per physical
    # core per second, $0.00000222 per GiB per second.
    cpu_h, mem_h = 0.0000131 * 3600, 0.00000222 * 3600
    assert (round(cpu_h, 5), round(mem_h, 6)) == (0.04716, 0.007992)
    assert abs(cost.CPU_USD_PER_CORE_HOUR - cpu_h) < 1e-12
    assert abs(cost.MEMORY_USD_PER_GIB_HOUR - mem_h) < 1e-12
    assert cost.CPU_MEMORY_PRICE_PROVENANCE.startswith("confirmed 20")
    # One H100 with the default vLLM spec's requests: 6 cores, 12 GiB.
    svc = cost.ServiceCostInput("m", ("H100",), 1, 1, 2, cpu_cores=6, memory_gib=12)
    c = cost.service_cost(svc, cost.GPU_PRICES_USD_PER_HOUR)
    hourly = 3.95 + 6 * 0.04716 + 12 * 0.007992  # $4.328864/h
    assert c.container_usd_per_hour == pytest.approx(hourly)
    assert (c.gpu_usd_per_hour, c.cpu_usd_per_hour) == (3.95, pytest.approx(6 * 0.04716))
    assert c.memory_usd_per_hour == pytest.approx(12 * 0.007992)
    assert c.idle_usd == round(hourly * 730, 2) == 3160.07
    assert c.worst_usd == round(2 * hourly * 730, 2)
    # the region multiplier applies to the CPU and memory too, the overhead to the whole
    pinned = cost.ServiceCostInput(
        "m", ("H100",), 1, 1, 1, region="us", overhead_pct=10, cpu_cores=6, memory_gib=12
    )
    c = cost.service_cost(pinned, cost.GPU_PRICES_USD_PER_HOUR)
    assert c.idle_usd == round(hourly * 1.5 * 1.10 * 730, 2)
    # the budget message shows the terms
    stack = cost.StackCost(services=(c,))
    with pytest.raises(cost.BudgetExceeded) as info:
        cost.check_budget(stack, 100, allow_over_budget=False, config_ns="p")
    assert (
        "1 x (1 x H100 $3.95/h + 6 CPU cores x $0.04716/h + 12 GiB x $0.007992/h = $4.3289/h)"
        " x region x1.5 x (1 + 10% overhead) x 730 h"
    ) in str(info.value)


def test_region_pinning_multiplier() -> None:
    assert cost.region_multiplier(None) == 1.0
    assert cost.region_multiplier("us") == 1.5  # broad
    assert cost.region_multiplier("us-east") == 1.75  # narrow
    svc = cost.ServiceCostInput("m", ("T4",), 1, 0, 1, region="eu-west", overhead_pct=0)
    c = cost.service_cost(svc, cost.GPU_PRICES_USD_PER_HOUR)
    assert c.worst_usd == pytest.approx(0.59 * 1.75 * 730, abs=0.01)


def test_budget_guard() -> None:
    stack = cost.stack_cost(
        [cost.ServiceCostInput("a", ("T4",), 1, 0, 2, overhead_pct=0)],
        cost.GPU_PRICES_USD_PER_HOUR,
    )
    assert cost.check_budget(stack, 1000, allow_over_budget=False, config_ns="p") is None
    with pytest.raises(cost.BudgetExceeded, match=r"by \$361\.40") as info:
        cost.check_budget(stack, 500, allow_over_budget=False, config_ns="p")
    assert "services[0].scaling.max_containers <= 1 would fit" in str(info.value)
    warning = cost.check_budget(stack, 500, allow_over_budget=True, config_ns="p")
    assert warning is not None and warning.startswith("allowOverBudget is set")
    with pytest.raises(cost.BudgetExceeded, match="not even one T4 container fits"):
        cost.check_budget(stack, 100, allow_over_budget=False, config_ns="p")


def test_gateway_entry() -> None:
    target = gateway.GatewayTarget("m", "https://w--m.modal.run/", "sk-1", "wk-1", "ws-1", 900, 60)
    entry = gateway.litellm_entry(target)
    assert entry["litellm_params"]["api_base"] == "https://w--m.modal.run/v1"
    assert entry["litellm_params"]["timeout"] == 960
    assert gateway.api_base("https://x/v1/") == "https://x/v1"


def test_api_key_provider() -> None:
    p = ApiKeyProvider()
    a = p.create({"name": "gateway", "rotation": ""}).outs or {}
    b = p.create({"name": "gateway", "rotation": ""}).outs or {}
    key = rpc.unwrap_rpc_secret(a["key"])
    assert rpc.is_rpc_secret(a["key"]) and key.startswith("sk-") and len(key) > 40
    assert key != rpc.unwrap_rpc_secret(b["key"])
    assert a["digest"] == digest_of(key)
    # The serving proxy accepts the key against the digest the program stores.
    ring = KeyRing.from_json(json.dumps({"gateway": a["digest"]}))
    assert ring.match(key.encode()) == "gateway"
    same = p.diff("id", a, {"name": "gateway", "rotation": ""})
    assert same.changes is False
    rotated = p.diff("id", a, {"name": "gateway", "rotation": "2026-12"})
    assert rotated.changes is True and rotated.replaces == ["rotation"]
    assert p.check({}, {"name": "Bad Name"}).failures[0].property == "name"
