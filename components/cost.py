"""Cost model and budget guard: what a stack costs per month idle and at worst, from Modal's
GPU, CPU and memory prices.

Pure helpers, no Pulumi resources. The figures are stack outputs (so every `pulumi preview`
shows them) and the budget guard runs while the config is validated, before anything is
created: a stack whose worst case exceeds its budget fails with the overshoot and the knobs
to turn, unless it sets `allowOverBudget: true`.

Model, per service (one container = `gpu_count` GPUs of the priced type, plus the CPU and
memory the serving spec requests):
- container $/h = (GPU $/h x gpu_count + CPU cores x CPU $/core-h + memory GiB x memory
  $/GiB-h) x region multiplier x (1 + costOverheadPct / 100)
  - GPU $/h: the table below (or the stack's `gpuPricesUsdPerHour` override); a GPU
    preference list is priced at its MOST expensive entry.
  - CPU and memory: the spec's requests (serving/sizing.py `cpu_request`, `memory_request_mib`:
    derived from the engine's processes, or the service's `cpu` / `memory_gib`) at Modal's
    rates below (or the stack's `cpuPriceUsdPerCoreHour` / `memoryPriceUsdPerGibHour`
    overrides). Modal bills max(request, usage); the model prices the request.
  - region multiplier: Modal charges x1.5 for a broad region (`us`, `eu`, ...) and x1.75 for
    a narrow one (`us-east`, `eu-west`, ...) when a container region is pinned; x1 otherwise.
  - costOverheadPct (default 0): an allowance for what the model leaves out: storage,
    egress, and usage above the requests (a burst over the CPU or memory request is billed
    as usage).
- warm     = the scheduled pre-warm windows' container-hours above min_containers a month
  (serving/prewarm.py `extra_container_hours_per_month`) x container $/h
- idle     = min_containers x container $/h x 730 h + warm (kept warm with no traffic at all)
- baseline = (min_containers + buffer_containers) x ... + warm (Modal keeps the buffer warm
  whenever the app has traffic, so a service in steady light use costs at least this)
- worst    = max_containers x container $/h x 730 h (every allowed container busy all month)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

HOURS_PER_MONTH = 730.0
"""Average hours in a month (8760 h / 12), the convention cloud price pages use."""

GPU_PRICES_SOURCE = "https://modal.com/pricing"
GPU_PRICES_AS_OF = "2026-05-07"
"""Date of the newest copy of the price page the confirmed rows were checked against."""

GPU_PRICES_USD_PER_HOUR: dict[str, float] = {
    # Modal bills GPUs per second; hourly = per-second rate x 3600, rounded to the cent.
    # Base rates (no region or non-preemptible multiplier). Where each row comes from:
    # GPU_PRICE_PROVENANCE below. Override per stack with `modal-llm:gpuPricesUsdPerHour`.
    "B200": 6.25,
    "B200+": 6.25,  # B200 or B300, billed at the B200 rate
    "RTX-PRO-6000": 3.03,
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

_CONFIRMED = (
    "confirmed 2026-05-07: techbytes.app 'Serverless GPU Pricing Matrix' quoting modal.com/pricing"
)
_UNCONFIRMED = "UNCONFIRMED: rate as last read by the author, no dated copy found; re-check"
GPU_PRICE_PROVENANCE: dict[str, str] = {
    "H100": _CONFIRMED + " ($0.001097/s = $3.9492/h)",
    "H100!": _CONFIRMED + " (billed as H100)",
    "A100-80GB": _CONFIRMED + " ($2.4984/h)",
    "L40S": _CONFIRMED + " ($1.9512/h)",
    "L4": _CONFIRMED + " ($0.7992/h)",
    "T4": _CONFIRMED + " ($0.5904/h)",
    "B200": _UNCONFIRMED,
    "B200+": _UNCONFIRMED,
    "RTX-PRO-6000": _UNCONFIRMED,
    "H200": _UNCONFIRMED + " ($0.001261/s)",
    "A100-40GB": _UNCONFIRMED + " ($0.000583/s)",
    "A100": _UNCONFIRMED + " (billed as A100-40GB)",
    "A10G": _UNCONFIRMED + " ($0.000306/s)",
    "A10": _UNCONFIRMED + " ($0.000306/s)",
}
"""Per row: whether the rate was checked against a dated copy of the price page, and which."""

# CPU and memory, billed per second on top of the GPU, for the request or the usage, whichever
# is higher (https://modal.com/docs/guide/resources, "Billing"). Modal's `cpu=` counts physical
# cores (1 core = 2 vCPUs), its `memory=` MiB. Override per stack with
# `modal-llm:cpuPriceUsdPerCoreHour` / `modal-llm:memoryPriceUsdPerGibHour` (components/config.py).
CPU_USD_PER_CORE_HOUR = 0.0000131 * 3600  # $0.0000131 per physical core per second = $0.04716
MEMORY_USD_PER_GIB_HOUR = 0.00000222 * 3600  # $0.00000222 per GiB per second = $0.007992
CPU_MEMORY_PRICE_PROVENANCE = (
    "confirmed 2026-06-27: beam.cloud 'Modal Pricing Explained (2026)' quoting "
    "modal.com/pricing (CPU $0.0000131/core/s, memory $0.00000222/GiB/s), the same rates in "
    "finops.apis.io's Modal profile"
)
"""Where the CPU and memory rates come from (like GPU_PRICE_PROVENANCE's rows)."""

REGION_PRICING_SOURCE = "https://modal.com/docs/guide/region-selection (section Pricing)"
REGION_MULTIPLIER_BROAD = 1.5  # e.g. region "us"
REGION_MULTIPLIER_NARROW = 1.75  # e.g. region "us-east"
# costOverheadPct's default: CPU and memory are priced from the spec's requests, so no flat
# allowance is added unless a stack asks for one (storage, egress, usage above the requests).
DEFAULT_OVERHEAD_PCT = 0.0


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
    buffer_containers: int = 0
    region: str | None = None
    overhead_pct: float = DEFAULT_OVERHEAD_PCT
    #: Container-hours a month the pre-warm windows keep warm above min_containers.
    warm_extra_hours: float = 0.0
    #: The container's CPU request in physical cores (serving/sizing.py `cpu_request`).
    cpu_cores: float = 0.0
    #: The container's memory request in GiB (serving/sizing.py `memory_request_mib` / 1024).
    memory_gib: float = 0.0
    #: USD per physical core per hour (the stack's `cpuPriceUsdPerCoreHour`, else Modal's rate).
    cpu_usd_per_core_hour: float = CPU_USD_PER_CORE_HOUR
    #: USD per GiB of memory per hour (the stack's `memoryPriceUsdPerGibHour`, else Modal's).
    memory_usd_per_gib_hour: float = MEMORY_USD_PER_GIB_HOUR


@dataclass(frozen=True)
class ServiceCost(ServiceCostInput):
    """Monthly cost estimate of one service: what it was priced from, and the figures."""

    gpu: str = ""  # the GPU the estimate is priced at
    gpu_price_usd_per_hour: float = 0.0
    region_multiplier: float = 1.0
    idle_usd: float = 0.0
    baseline_usd: float = 0.0
    worst_usd: float = 0.0
    #: What the scheduled pre-warm windows add a month (included in idle and baseline).
    warm_usd: float = 0.0

    @property
    def gpu_usd_per_hour(self) -> float:
        """One container's GPUs, region multiplier included."""
        return self.gpu_price_usd_per_hour * self.gpu_count * self.region_multiplier

    @property
    def cpu_usd_per_hour(self) -> float:
        """One container's CPU request, region multiplier included."""
        return self.cpu_cores * self.cpu_usd_per_core_hour * self.region_multiplier

    @property
    def memory_usd_per_hour(self) -> float:
        """One container's memory request, region multiplier included."""
        return self.memory_gib * self.memory_usd_per_gib_hour * self.region_multiplier

    @property
    def container_usd_per_hour(self) -> float:
        """One container: (GPUs + CPU + memory) x region multiplier x (1 + overhead)."""
        return (self.gpu_usd_per_hour + self.cpu_usd_per_hour + self.memory_usd_per_hour) * (
            1 + self.overhead_pct / 100
        )


@dataclass(frozen=True)
class StackCost:
    """Monthly cost estimate of a stack (sum over its services)."""

    services: tuple[ServiceCost, ...]

    @property
    def idle_usd(self) -> float:
        return round(sum(s.idle_usd for s in self.services), 2)

    @property
    def baseline_usd(self) -> float:
        return round(sum(s.baseline_usd for s in self.services), 2)

    @property
    def worst_usd(self) -> float:
        return round(sum(s.worst_usd for s in self.services), 2)


def gpu_price(gpu: str, table: Mapping[str, float]) -> float:
    """Price of one GPU per hour; raises UnknownGpuPrice naming the known GPUs."""
    if gpu in table:
        return table[gpu]
    known = ", ".join(sorted(table))
    raise UnknownGpuPrice(
        f"no price for GPU {gpu!r}; known: {known}. Use one of those, or add a price with: "
        f"pulumi config set --path 'gpuPricesUsdPerHour.{gpu}' <USD per hour>"
    )


def region_multiplier(region: str | None) -> float:
    """Modal's surcharge for pinning a container region: broad x1.5, narrow x1.75, none x1."""
    if not region:
        return 1.0
    return REGION_MULTIPLIER_NARROW if "-" in region else REGION_MULTIPLIER_BROAD


def service_cost(service: ServiceCostInput, table: Mapping[str, float]) -> ServiceCost:
    """Idle, baseline and worst-case monthly cost of one service (model: module docstring)."""
    if not service.gpus:
        raise UnknownGpuPrice(f"service {service.name!r} names no GPU")
    priced = max(service.gpus, key=lambda g: gpu_price(g, table))
    cost = ServiceCost(
        **{f.name: getattr(service, f.name) for f in fields(ServiceCostInput)},
        gpu=priced,
        gpu_price_usd_per_hour=gpu_price(priced, table),
        region_multiplier=region_multiplier(service.region),
    )
    month = cost.container_usd_per_hour * HOURS_PER_MONTH
    warm = cost.container_usd_per_hour * service.warm_extra_hours
    return replace(
        cost,
        warm_usd=round(warm, 2),
        idle_usd=round(service.min_containers * month + warm, 2),
        baseline_usd=round((service.min_containers + service.buffer_containers) * month + warm, 2),
        worst_usd=round(service.max_containers * month, 2),
    )


def stack_cost(services: Sequence[ServiceCostInput], table: Mapping[str, float]) -> StackCost:
    """Cost estimate of every service of a stack."""
    return StackCost(services=tuple(service_cost(s, table) for s in services))


def _formula(s: ServiceCost) -> str:
    """`max x (GPUs + CPU + memory = $/h) [x region] [x (1 + overhead)] x 730 h`, the figures
    before the region multiplier."""
    terms = [f"{s.gpu_count} x {s.gpu} ${s.gpu_price_usd_per_hour:.2f}/h"]
    if s.cpu_cores:
        terms.append(f"{s.cpu_cores:g} CPU cores x ${s.cpu_usd_per_core_hour:.5f}/h")
    if s.memory_gib:
        terms.append(f"{s.memory_gib:g} GiB x ${s.memory_usd_per_gib_hour:.6f}/h")
    base = (s.gpu_usd_per_hour + s.cpu_usd_per_hour + s.memory_usd_per_hour) / s.region_multiplier
    parts = [f"{s.max_containers} x ({' + '.join(terms)} = ${base:.4f}/h)"]
    if s.region_multiplier != 1.0:
        parts.append(f"region x{s.region_multiplier:g}")
    if s.overhead_pct:
        parts.append(f"(1 + {s.overhead_pct:g}% overhead)")
    return " x ".join([*parts, "730 h"])


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
        "Worst case = max_containers x (gpu_count x GPU $/h + CPU cores x CPU $/h + memory GiB"
        " x memory $/h) [x region] [x (1 + costOverheadPct)] x 730 h, per service:",
    ]
    for i, s in enumerate(cost.services):
        per_container = s.container_usd_per_hour * HOURS_PER_MONTH
        others = worst - s.worst_usd
        fits = math.floor(max(budget_usd - others, 0.0) / per_container) if per_container else 0
        lines.append(
            f"  services[{i}] {s.name!r}: {_formula(s)} = ${s.worst_usd:,.2f}"
            + (
                ""
                if fits >= s.max_containers
                else f"; services[{i}].scaling.max_containers <= {fits} would fit"
                if fits >= 1
                else f"; not even one {s.gpu} container fits: pick a cheaper gpu"
            )
        )
    lines.append(
        "Turn one knob: lower scaling.max_containers, pick a cheaper gpu or a smaller gpu_count "
        "(or fewer CPU cores: a service's cpu / api_server_count), "
        f"raise the budget (pulumi config set {config_ns}:monthlyBudgetUsd {math.ceil(worst)}), "
        f"or accept it explicitly (pulumi config set {config_ns}:allowOverBudget true)."
    )
    message = "\n".join(lines)
    if allow_over_budget:
        return "allowOverBudget is set, deploying anyway: " + message
    raise BudgetExceeded(message)


def gated_deploy_usd(service: ServiceCost, startup_s: float, scaledown_window_s: float) -> float:
    """Upper bound of what one health-gated deploy costs a scale-to-zero service (issue 11.3):
    the gate's smoke request cold-starts one container, billed from its start for at most the
    startup timeout, then kept idle for the scale-down window before Modal stops it. A service
    with `min_containers >= 1` pays nothing extra: a deploy replaces its warm containers anyway.
    """
    if service.min_containers >= 1:
        return 0.0
    hours = (startup_s + scaledown_window_s) / 3600
    return round(service.container_usd_per_hour * hours, 2)
