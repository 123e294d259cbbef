"""Prometheus recording and alerting rules, generated from a typed description of the services.

`rule_file(services, environment)` returns the rule file as a dict (yaml.safe_dump it); each
service gets its own group, with its own SLO, and every series is kept apart per `service` and
`version` (the labels the container's push adds: components/monitoring/contract.py).

The alerts:
- LLMTTFTBudgetBurn: the time-to-first-token SLO's error budget burns too fast, judged over
  two windows at once (multiwindow, multi-burn-rate alerts: Google's SRE workbook, chapter
  "Alerting on SLOs", section 6, https://sre.google/workbook/alerting-on-slos/). The long
  window says enough budget has gone to matter; the short one says it is still going, so the
  alert stops soon after the cause does. `BURN_WINDOWS` holds the workbook's two paging rows.
- LLMHigh5xxRatio / LLMHigh429Ratio: the share of engine-route answers that are 5xx (the
  service failed) or 429 (keys over their share or limit: capacity), over `ratio_window`,
  with a floor of traffic under which a ratio says nothing.
- LLMEngineDown: no container of a version has its engine ready (`proxy_engine_ready`).
- ModalSpendAgainstBudget: the environment's spend crossed a share of its budget (the spend
  watcher's thresholds, as gauges).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.monitoring.contract import (
    BUDGET,
    ENGINE_READY,
    ENGINE_ROUTES,
    REQUESTS,
    SPEND,
    TOKENS,
    TTFT,
    TTFT_BUCKETS,
)

BY = "service, version"
RUNBOOK = "docs/monitoring.md#alerts"
# Alert templates Prometheus fills in when an alert fires.
VERSION = "{{ $labels.version }}"
PERCENT = "{{ $value | humanizePercentage }}"


@dataclass(frozen=True)
class BurnWindow:
    """One row of the workbook's table: fire when both windows burn faster than `burn_rate`
    (1 = the error budget lasts exactly the SLO period, 30 days)."""

    long: str
    short: str
    burn_rate: float
    severity: str


BURN_WINDOWS = (
    BurnWindow("1h", "5m", 14.4, "critical"),  # 2 % of a 30-day budget gone in one hour
    BurnWindow("6h", "30m", 6.0, "critical"),  # 5 % gone in six hours
)


@dataclass(frozen=True)
class Slo:
    """What one service promises, and the alert thresholds around it."""

    ttft_s: float = 2.5  # a stream's first token within this (one of TTFT_BUCKETS)
    ttft_objective: float = 0.99  # the share of streams that must meet it
    max_5xx_ratio: float = 0.05
    max_429_ratio: float = 0.10
    ratio_window: str = "5m"
    ratio_for: str = "5m"
    min_requests_per_s: float = 0.1  # below this a ratio is noise (30 requests in 5 min)
    engine_down_for: str = "5m"  # longer than a container's normal start before it is ready

    def __post_init__(self) -> None:
        if self.ttft_s not in TTFT_BUCKETS:
            raise ValueError(
                f"TTFT objective {self.ttft_s} s is not a bucket bound of the proxy's TTFT "
                f"histogram; pick one of {', '.join(f'{b:g}' for b in TTFT_BUCKETS)} s"
            )
        if not 0 < self.ttft_objective < 1:
            raise ValueError(
                f"TTFT objective share {self.ttft_objective} must be between 0 and 1 "
                "(e.g. 0.99: 99 % of streams within ttft_s)"
            )


@dataclass(frozen=True)
class MonitoredService:
    name: str  # the service name (components/config.py), the `service` label
    slo: Slo = field(default_factory=Slo)


def _selector(metric: str, service: str, *matchers: str) -> str:
    return metric + "{" + ",".join((f'service="{service}"', *matchers)) + "}"


def _engine(service: str, *matchers: str) -> str:
    return _selector(REQUESTS.name, service, f'route=~"{"|".join(ENGINE_ROUTES)}"', *matchers)


def _rate(selector: str, window: str) -> str:
    return f"sum by ({BY}) (rate({selector}[{window}]))"


def record(series: str, operation: str) -> str:
    """A recorded series' name, as Prometheus' naming practice has it: level:metric:operations
    (https://prometheus.io/docs/practices/rules/)."""
    return f"service_version:{series}:{operation}"


def recording_rules(service: MonitoredService) -> list[dict[str, Any]]:
    """The per-version series the alerts, the dashboard and (later) the canary analysis read."""
    name, slo, window = service.name, service.slo, service.slo.ratio_window
    requests = record("proxy_requests", f"rate{window}")
    failed = _rate(_engine(name, 'status=~"5.."'), window)
    refused = _rate(_engine(name, 'status="429"'), window)
    tokens = _rate(_selector(TOKENS.name, name, 'kind="completion"'), window)
    rules = [
        {"record": requests, "expr": _rate(_engine(name), window)},
        {
            "record": record("proxy_requests_5xx", f"ratio_rate{window}"),
            "expr": f"{failed} / {requests}",
        },
        {
            "record": record("proxy_requests_429", f"ratio_rate{window}"),
            "expr": f"{refused} / {requests}",
        },
        {"record": record("proxy_completion_tokens", f"rate{window}"), "expr": tokens},
    ]
    # The TTFT SLI: the share of streams whose first token came after ttft_s, per window the
    # burn-rate alerts use. Every stream counts in `_count`; `le` is the bound as the proxy
    # prints it ("{:g}").
    for burn_window in sorted({w for b in BURN_WINDOWS for w in (b.long, b.short)}):
        fast = _rate(_selector(f"{TTFT.name}_bucket", name, f'le="{slo.ttft_s:g}"'), burn_window)
        total = _rate(_selector(f"{TTFT.name}_count", name), burn_window)
        miss = record("proxy_ttft_slo_miss", f"ratio_rate{burn_window}")
        rules.append({"record": miss, "expr": f"1 - {fast} / {total}"})
    return rules


def alerting_rules(service: MonitoredService) -> list[dict[str, Any]]:
    name, slo, window = service.name, service.slo, service.slo.ratio_window
    budget = 1 - slo.ttft_objective
    only = f'{{service="{name}"}}'
    enough_traffic = (
        f"{record('proxy_requests', f'rate{window}')}{only} > {slo.min_requests_per_s:g}"
    )
    alerts = []
    for burn in BURN_WINDOWS:
        threshold = f"{burn.burn_rate:g} * {budget:g}"
        long, short = (
            record("proxy_ttft_slo_miss", f"ratio_rate{w}") for w in (burn.long, burn.short)
        )
        alerts.append(
            {
                "alert": "LLMTTFTBudgetBurn",
                "expr": f"{long}{only} > ({threshold}) and {short}{only} > ({threshold})",
                "labels": {"severity": burn.severity, "window": f"{burn.long}/{burn.short}"},
                "annotations": {
                    "summary": f"{name} {VERSION}: the TTFT error budget burns "
                    f"{burn.burn_rate:g}x too fast over {burn.long} and {burn.short}",
                    "description": f"{PERCENT} of streams waited "
                    f"more than {slo.ttft_s:g} s for their first token over the last "
                    f"{burn.long} (SLO: {slo.ttft_objective:.2%} within {slo.ttft_s:g} s). "
                    "Compare the versions' TTFT panels; a new version burning alone is the "
                    "release's doing (roll it back), all versions burning is load or the engine.",
                    "runbook": RUNBOOK,
                },
            }
        )
    for status, limit, severity, what, next_step in (
        ("5xx", slo.max_5xx_ratio, "critical", "answers failed (5xx)",
         "Read the proxy's access log and the engine errors by kind on the dashboard; a new "
         "version failing alone is the release's doing (roll it back)."),
        ("429", slo.max_429_ratio, "warning", "requests were refused for capacity (429)",
         "Keys are at their share or limit: more containers (max_containers), a larger "
         "in-flight pool, or higher key limits."),
    ):  # fmt: skip
        ratio = record(f"proxy_requests_{status}", f"ratio_rate{window}")
        alerts.append(
            {
                "alert": f"LLMHigh{status}Ratio",
                "expr": f"{ratio}{only} > {limit:g} and {enough_traffic}",
                "for": slo.ratio_for,
                "labels": {"severity": severity},
                "annotations": {
                    "summary": f"{name} {VERSION}: {PERCENT} of {what} over {window} "
                    f"(limit {limit:.0%})",
                    "description": next_step,
                    "runbook": RUNBOOK,
                },
            }
        )
    alerts.append(
        {
            "alert": "LLMEngineDown",
            "expr": f"max by ({BY}) ({ENGINE_READY.name}{only}) == 0",
            "for": slo.engine_down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"{name} {VERSION}: no container has its engine "
                f"ready for {slo.engine_down_for}",
                "description": "Every container of this version answers 503 'engine not "
                "ready'. Read the containers' logs (modal app logs) for the engine's exit or "
                "its load error.",
                "runbook": RUNBOOK,
            },
        }
    )
    return alerts


def spend_rules(environment: str, thresholds: Sequence[float]) -> list[dict[str, Any]]:
    """One alert per threshold, as the spend watcher posts each crossed one. With a budget of
    0 the ratio is +Inf once anything is spent (every threshold crossed, as the watcher says)
    and NaN before (none)."""
    only = f'{{environment="{environment}"}}'
    ratio = f"{SPEND.name}{only} / {BUDGET.name}{only}"
    return [
        {
            "alert": "ModalSpendAgainstBudget",
            "expr": f"{ratio} >= {threshold:g}",
            "labels": {
                "severity": "critical" if threshold >= 1 else "warning",
                "threshold": f"{threshold:.0%}",
            },
            "annotations": {
                "summary": f"{environment}: spend crossed {threshold:.0%} of the monthly budget",
                "description": f"Spent {PERCENT} of the budget. Lower "
                "min_containers / buffer_containers, or raise the budget (the access stack "
                "or monthlyBudgetUsd).",
                "runbook": RUNBOOK,
            },
        }
        for threshold in thresholds
    ]


def rule_file(
    services: Sequence[MonitoredService],
    environment: str,
    budget_thresholds: Sequence[float] = (0.8, 1.0),
) -> dict[str, Any]:
    """The whole rule file (Prometheus `rule_files:` format) for one stack."""
    groups = [
        {
            "name": f"llm-service-{s.name}",
            # The static `service` label (the value the expressions keep anyway) makes each
            # group's rules distinct from the next service's for Prometheus (promtool's
            # duplicate-rule check: same name, same labels).
            "rules": [
                {**rule, "labels": {"service": s.name, **rule.get("labels", {})}}
                for rule in recording_rules(s) + alerting_rules(s)
            ],
        }
        for s in services
    ]
    groups.append(
        {"name": f"modal-spend-{environment}", "rules": spend_rules(environment, budget_thresholds)}
    )
    return {"groups": groups}
