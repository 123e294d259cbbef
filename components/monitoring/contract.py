"""The metric contract: every series the alert rules and the dashboard read, with its labels.

Two kinds of labels:
- the labels the serving proxy puts on its series today (serving/proxy/metrics.py, `render`);
- ``TARGET_LABELS`` (service, version, container): not in the proxy's text. Modal containers
  cannot be scraped one by one, so each container pushes its /metrics to Prometheus (issue 35
  item 3) and the push adds these to every series it sends, as a pushgateway's grouping key or
  remote write's external labels do. Until then no series has them: docs/monitoring.md, "What
  the proxy must add".

The spend series come from the spend watcher (watchers/spend_alerts.py), which reads the
environment's usage and budget every run; pushing them is the watcher's part of the contract.

tests/monitoring/test_contract.py scrapes a real proxy and checks the names and labels here
against what it exposes, so this file and the proxy cannot drift apart unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serving.proxy.metrics import LATENCY_BUCKETS

TARGET_LABELS = ("service", "version", "container")
"""Added to every proxy series by the container's push; `version` is the release the container
runs (the App's deployed version), `container` Modal's container id."""

ENGINE_ROUTES = ("chat_completions", "completions", "embeddings", "models")
"""The proxy's route names that reach the engine (serving/proxy/app.py ROUTES): the ratios are
over these, not over /health, /ready and /metrics polls."""

TTFT_BUCKETS = LATENCY_BUCKETS
"""`le` bounds of the TTFT histogram: a TTFT objective must be one of them (an SLI read from
a histogram counts the requests under a bucket bound; between bounds it would be a guess)."""


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    labels: tuple[str, ...]  # what the proxy (or the watcher) sets itself
    pushed: bool = True  # True: TARGET_LABELS are added by the push

    def series(self) -> dict[str, frozenset[str]]:
        """The names Prometheus stores, each with its labels: a histogram is its _bucket (with
        `le`), _sum and _count series."""
        labels = (*self.labels, *(TARGET_LABELS if self.pushed else ()))
        if self.kind != "histogram":
            return {self.name: frozenset(labels)}
        return {
            f"{self.name}_bucket": frozenset((*labels, "le")),
            f"{self.name}_sum": frozenset(labels),
            f"{self.name}_count": frozenset(labels),
        }


REQUESTS = Metric("proxy_requests_total", "counter", ("route", "status", "key"))
IN_FLIGHT = Metric("proxy_in_flight", "gauge", ())
WAITING = Metric("proxy_waiting", "gauge", ())
ENGINE_READY = Metric("proxy_engine_ready", "gauge", ())
DURATION = Metric("proxy_request_duration_seconds", "histogram", ("route",))
TTFT = Metric("proxy_time_to_first_token_seconds", "histogram", ("route",))
OVERHEAD = Metric("proxy_overhead_seconds", "histogram", ("route",))
TOKENS = Metric("proxy_tokens_total", "counter", ("key", "kind"))
UPSTREAM_ERRORS = Metric("proxy_upstream_errors_total", "counter", ("kind",))
CONNECT_RETRIES = Metric("proxy_upstream_connect_retries_total", "counter", ())
HEALTH_FAILURES = Metric("proxy_health_check_failures_total", "counter", ())

PROXY_METRICS = (
    REQUESTS, IN_FLIGHT, WAITING, ENGINE_READY, DURATION, TTFT, OVERHEAD, TOKENS,
    UPSTREAM_ERRORS, CONNECT_RETRIES, HEALTH_FAILURES,
)  # fmt: skip

# The spend watcher's gauges, one series per Modal environment (a budget is per environment).
SPEND = Metric("modal_environment_spend_usd", "gauge", ("environment",), pushed=False)
BUDGET = Metric("modal_environment_budget_usd", "gauge", ("environment",), pushed=False)

CONTRACT = (*PROXY_METRICS, SPEND, BUDGET)


def series_labels() -> dict[str, frozenset[str]]:
    """Every stored series name the contract allows, with the labels it may carry."""
    return {name: labels for metric in CONTRACT for name, labels in metric.series().items()}
