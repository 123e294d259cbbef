"""The stack's Grafana dashboard, built with grafana-foundation-sdk (Grafana's own typed
builders, generated from its dashboard schema) rather than hand-written JSON.

One dashboard per stack; pick a service, then one or more versions: every panel draws one line
per version, so a new version sits beside the one it replaces. The queries read the raw proxy
series of the metric contract (components/monitoring/contract.py), so the dashboard works
without the recording rules loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
)

from components.monitoring.contract import (
    BUDGET,
    ENGINE_READY,
    ENGINE_ROUTES,
    IN_FLIGHT,
    REQUESTS,
    SPEND,
    TOKENS,
    TTFT,
    UPSTREAM_ERRORS,
    WAITING,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every panel's series: the chosen service, the chosen versions.
PICKED = 'service="$service",version=~"$version"'
ENGINE = f'{PICKED},route=~"{"|".join(ENGINE_ROUTES)}"'


def _rate(metric: str, matchers: str, by: str = "version") -> str:
    return f"sum by ({by}) (rate({metric}{{{matchers}}}[$__rate_interval]))"


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def _panel(title: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .fill_opacity(10)
    )
    for query in queries:
        panel = panel.with_target(query)
    return panel


def _ttft_quantile(q: float) -> prometheus.Dataquery:
    buckets = _rate(f"{TTFT.name}_bucket", PICKED, by="version, le")
    return _query(f"histogram_quantile({q:g}, {buckets})", f"{{{{version}}}} p{q * 100:g}")


def panels(environment_name: str) -> list[tuple[str, list[timeseries.Panel]]]:
    """The rows and their panels (title, unit, queries), in the order Grafana shows them."""
    requests = _rate(REQUESTS.name, ENGINE)
    # The status class ("2xx", "4xx", "5xx") from the status code, to keep the legend short.
    by_class = (
        "sum by (version, class) (label_replace(rate("
        f'{REQUESTS.name}{{{ENGINE}}}[$__rate_interval]), "class", "${{1}}xx", "status", "(.).."))'
    )
    environment = f'environment="{environment_name}"'
    failed = _rate(REQUESTS.name, f'{ENGINE},status=~"5.."')
    return [
        ("Latency and throughput", [
            _panel("Time to first token, p50 and p99 (streams)", "s",
                   _ttft_quantile(0.5), _ttft_quantile(0.99)),
            _panel("Completion tokens per second", "short",
                   _query(_rate(TOKENS.name, f'{PICKED},kind="completion"'), "{{version}}")),
        ]),
        ("Answers", [
            _panel("Requests per second by status class", "reqps",
                   _query(by_class, "{{version}} {{class}}")),
            _panel("5xx ratio (engine routes)", "percentunit",
                   _query(f"{failed} / {requests}", "{{version}}")),
            _panel("Engine errors per second by kind", "reqps",
                   _query(_rate(UPSTREAM_ERRORS.name, PICKED, by="version, kind"),
                          "{{version}} {{kind}}")),
        ]),
        ("Capacity", [
            _panel("Admission: in flight, waiting for a slot, refused (429/s)", "short",
                   _query(f"sum by (version) ({IN_FLIGHT.name}{{{PICKED}}})",
                          "{{version}} in flight"),
                   _query(f"sum by (version) ({WAITING.name}{{{PICKED}}})",
                          "{{version}} waiting"),
                   _query(_rate(REQUESTS.name, f'{ENGINE},status="429"'), "{{version}} 429/s")),
            _panel("Containers: pushing, engine ready", "short",
                   _query(f"count by (version) ({ENGINE_READY.name}{{{PICKED}}})",
                          "{{version}} containers"),
                   _query(f"sum by (version) ({ENGINE_READY.name}{{{PICKED}}})",
                          "{{version}} ready")),
            _panel(f"Spend against the monthly budget ({environment_name})", "percentunit",
                   _query(f"{SPEND.name}{{{environment}}} / {BUDGET.name}{{{environment}}}",
                          "spent")),
        ]),
    ]  # fmt: skip


def build_dashboard(services: Sequence[str], stack: str, environment: str) -> model.Dashboard:
    # A stable uid per stack (at most 40 characters), so re-imports replace the dashboard.
    uid = "modal-llm-" + hashlib.sha256(stack.encode()).hexdigest()[:12]
    board = (
        dashboard.Dashboard(f"LLM services: {stack}")
        .uid(uid)
        .tags(["modal-llm", stack])
        .refresh("30s")
        .time("now-3h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("service")
            .label("Service")
            .datasource(DATASOURCE)
            .query(f"label_values({REQUESTS.name}, service)")
            .regex("^(" + "|".join(services) + ")$")  # this stack's services only
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
        .with_variable(
            dashboard.QueryVariable("version")
            .label("Version")
            .datasource(DATASOURCE)
            .query(f'label_values({REQUESTS.name}{{service="$service"}}, version)')
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    )
    for title, row_panels in panels(environment):
        board = board.with_row(dashboard.Row(title))
        for panel in row_panels:
            board = board.with_panel(panel)
    return board.build()


def dashboard_json(services: Sequence[str], stack: str, environment: str) -> str:
    """The dashboard as Grafana imports it (Dashboards > New > Import, or the HTTP API)."""
    built = build_dashboard(services, stack, environment)
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True)
