"""Cost model and budget guard: what a stack costs per month idle and at worst, from GPU prices.

Pure helpers, no Pulumi resources. The figures are stack outputs (so every `pulumi preview`
shows them) and the budget guard runs while the config is validated, before anything is
created: a stack whose worst case exceeds its budget fails with the overshoot and the knobs
to turn, unless it sets `allowOverBudget: true`.

Model (deliberately simple and conservative):
- GPU time only (CPU, memory, storage and egress are small next to GPUs and left out).
- A service with a GPU preference list is priced at the MOST expensive GPU in the list.
- idle  = min_containers x gpu_count x price x 730 h (containers Modal keeps warm at zero load)
- worst = max_containers x gpu_count x price x 730 h (every allowed container busy all month)
- Modal's region and non-preemptible multipliers are not applied: a stack pinning a region
  should raise its prices through the `gpuPricesUsdPerHour` override.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HOURS_PER_MONTH = 730.0
"""Average hours in a month (8760 h / 12), the convention cloud price pages use."""

GPU_PRICES_SOURCE = "https://modal.com/pricing"
GPU_PRICES_AS_OF = "2026-11-26"

GPU_PRICES_USD_PER_HOUR: dict[str, float] = {
    # Modal bills GPUs per second; hourly = per-second rate x 3600, rounded to the cent.
    # Source: https://modal.com/pricing, read 2026-11-26 (our machines cannot reach it, so the
    # figures were checked against copies of that page: H100 $0.001097/s, A100-80GB
    # $0.000694/s, L40S $0.000542/s, L4 $0.000222/s, T4 $0.000164/s and B200 $6.25/h are
    # confirmed by 2026 copies; H200 $0.001261/s, A10 $0.000306/s and A100-40GB $0.000583/s
    # are the page's rates as last read and must be re-checked before relying on them).
    # Base rates: region pinning (x1.5 to x1.75) and non-preemptible (x3) multipliers are not
    # included. Override per stack with `modal-llm:gpuPricesUsdPerHour`.
    "B200": 6.25,
    "B200+": 6.25,  # B200 or B300, billed at the B200 rate
    "RTX-PRO-6000": 3.03,  # re-check: rate as last read
    "H200": 4.54,
    "H100": 3.95,
    "H100!": 3.95,  # an H100 that Modal may not upgrade to an H200: same rate
    "A100-80GB": 2.50,
    "A100-40GB": 2.10,
    "A100": 2.10,  # Modal's "A100" means the 40 GB card unless "-80GB" is asked for
    "L40S": 1.95,
    "A10G": 1.10,
    "A10": 1.10,
    "L4": 0.80,
    "T4": 0.59,
}


class UnknownGpuPrice(ValueError):
    """A service asks for a GPU the price table (with the stack's overrides) does not know."""


class BudgetExceeded(ValueError):
    """The stack's worst-case monthly cost is above its budget and over-budget is not allowed."""


@dataclass(frozen=True)
class ServiceCostInput:
    """What the cost model needs to know about one service."""

    name: str
    gpus: tuple[str, ...]  # ordered preference; priced at the most expensive
    gpu_count: int
    min_containers: int
    max_containers: int


@dataclass(frozen=True)
class ServiceCost:
    """Monthly cost estimate of one service."""

    name: str
    gpu: str  # the GPU the estimate is priced at
    gpu_price_usd_per_hour: float
    gpu_count: int
    min_containers: int
    max_containers: int
    idle_usd: float
    worst_usd: float


@dataclass(frozen=True)
class StackCost:
    """Monthly cost estimate of a stack (sum over its services)."""

    services: tuple[ServiceCost, ...]

    @property
    def idle_usd(self) -> float:
        return round(sum(s.idle_usd for s in self.services), 2)

    @property
    def worst_usd(self) -> float:
        return round(sum(s.worst_usd for s in self.services), 2)


def price_table(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """The built-in table with the stack's overrides applied (overrides win, new GPUs allowed)."""
    table = dict(GPU_PRICES_USD_PER_HOUR)
    for gpu, price in (overrides or {}).items():
        if not isinstance(price, int | float) or isinstance(price, bool) or price < 0:
            raise UnknownGpuPrice(
                f"gpuPricesUsdPerHour[{gpu!r}] = {price!r}: a price must be a number >= 0 "
                f"(USD per GPU per hour). Fix it with: pulumi config set --path "
                f"'gpuPricesUsdPerHour.{gpu}' 4.54"
            )
        table[gpu] = float(price)
    return table


def gpu_price(gpu: str, table: Mapping[str, float]) -> float:
    """Price of one GPU per hour; raises UnknownGpuPrice naming the known GPUs."""
    if gpu in table:
        return table[gpu]
    known = ", ".join(sorted(table))
    raise UnknownGpuPrice(
        f"no price for GPU {gpu!r}; known: {known}. Use one of those, or add a price with: "
        f"pulumi config set --path 'gpuPricesUsdPerHour.{gpu}' <USD per hour>"
    )


def service_cost(service: ServiceCostInput, table: Mapping[str, float]) -> ServiceCost:
    """Idle and worst-case monthly cost of one service, priced at its dearest GPU choice."""
    if not service.gpus:
        raise UnknownGpuPrice(f"service {service.name!r} names no GPU")
    priced = max(service.gpus, key=lambda g: gpu_price(g, table))
    price = gpu_price(priced, table)
    per_container_month = price * service.gpu_count * HOURS_PER_MONTH
    return ServiceCost(
        name=service.name,
        gpu=priced,
        gpu_price_usd_per_hour=price,
        gpu_count=service.gpu_count,
        min_containers=service.min_containers,
        max_containers=service.max_containers,
        idle_usd=round(service.min_containers * per_container_month, 2),
        worst_usd=round(service.max_containers * per_container_month, 2),
    )


def stack_cost(services: Sequence[ServiceCostInput], table: Mapping[str, float]) -> StackCost:
    """Cost estimate of every service of a stack."""
    return StackCost(services=tuple(service_cost(s, table) for s in services))


def check_budget(
    cost: StackCost, budget_usd: float, *, allow_over_budget: bool, config_ns: str
) -> str | None:
    """Budget guard. Returns None when the worst case fits, a warning text when it does not but
    `allowOverBudget` is set, and raises BudgetExceeded otherwise.

    The message says by how much the worst case is over, and which knob to turn: per service
    the largest `max_containers` that would fit, a cheaper GPU, or the budget / the override.
    """
    worst = cost.worst_usd
    if worst <= budget_usd:
        return None
    over = worst - budget_usd
    lines = [
        f"worst-case monthly cost ${worst:,.2f} exceeds {config_ns}:monthlyBudgetUsd "
        f"${budget_usd:,.2f} by ${over:,.2f} ({over / budget_usd * 100 if budget_usd else 100:.0f}%"
        f" over).",
        "Worst case = max_containers x gpu_count x GPU $/h x 730 h, per service:",
    ]
    for i, s in enumerate(cost.services):
        per_container = s.gpu_price_usd_per_hour * s.gpu_count * HOURS_PER_MONTH
        others = worst - s.worst_usd
        fits = math.floor(max(budget_usd - others, 0.0) / per_container) if per_container else 0
        lines.append(
            f"  services[{i}] {s.name!r}: {s.max_containers} x {s.gpu_count} x {s.gpu} "
            f"${s.gpu_price_usd_per_hour:.2f}/h x 730 h = ${s.worst_usd:,.2f}"
            + (
                ""
                if fits >= s.max_containers
                else f"; services[{i}].scaling.max_containers <= {fits} would fit"
                if fits >= 1
                else f"; not even one {s.gpu} container fits: pick a cheaper gpu"
            )
        )
    lines.append(
        "Turn one knob: lower scaling.max_containers, pick a cheaper gpu or a smaller gpu_count, "
        f"raise the budget (pulumi config set {config_ns}:monthlyBudgetUsd {math.ceil(worst)}), "
        f"or accept it explicitly (pulumi config set {config_ns}:allowOverBudget true)."
    )
    message = "\n".join(lines)
    if allow_over_budget:
        return "allowOverBudget is set, deploying anyway: " + message
    raise BudgetExceeded(message)
