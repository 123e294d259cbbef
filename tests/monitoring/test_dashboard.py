"""The dashboard output against grafana-foundation-sdk's own model (generated from Grafana's
dashboard schema): it decodes into the typed model, panels and queries included, and encodes
back to the same JSON; and it has the per-version panels the issue asks for."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import common, prometheus
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

from components.monitoring import monitoring_outputs
from tests.monitoring.conftest import ENVIRONMENT


def decoded(text: str) -> Dashboard:
    # The panel and query variants (timeseries, prometheus, ...): without them the model
    # keeps options and queries as untyped dicts and checks nothing about them.
    register_default_plugins()
    return Dashboard.from_json(json.loads(text))


def graph_panels(board: Dashboard) -> list[Panel]:
    return [p for p in board.panels or [] if isinstance(p, Panel)]


def test_dashboard_round_trips_through_the_library_model(outputs: dict[str, str]) -> None:
    text = outputs["grafana_dashboard_json"]
    board = decoded(text)
    again = json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True)
    assert json.loads(again) == json.loads(text)  # nothing dropped or added by the model
    panels = graph_panels(board)
    assert panels
    for panel in panels:
        assert panel.type_val == "timeseries"
        assert panel.field_config is not None
        assert isinstance(panel.field_config.defaults.custom, common.GraphFieldConfig)
        assert panel.targets, panel.title
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery), (panel.title, target)
            assert target.datasource is not None and target.datasource.uid == "${datasource}"


def test_panels_draw_one_line_per_version(outputs: dict[str, str]) -> None:
    board = decoded(outputs["grafana_dashboard_json"])
    rows = [p.title for p in board.panels or [] if isinstance(p, RowPanel)]
    assert rows == ["Latency and throughput", "Answers", "Capacity"]
    titles = [p.title or "" for p in graph_panels(board)]
    for wanted in ("Time to first token, p50 and p99", "tokens per second", "by status class",
                   "5xx ratio", "Admission", "Containers", "Spend"):  # fmt: skip
        assert any(wanted in t for t in titles), (wanted, titles)
    for panel in graph_panels(board):
        for target in panel.targets or []:
            assert isinstance(target, prometheus.Dataquery)
            if "Spend" in (panel.title or ""):  # one series per environment, not per version
                assert f'environment="{ENVIRONMENT}"' in (target.expr or "")
                continue
            assert (target.legend_format or "").startswith("{{version}}"), panel.title
            assert "by (version" in (target.expr or ""), (panel.title, target.expr)
            assert 'version=~"$version"' in (target.expr or "")


def test_service_picker_lists_the_stack_services_and_the_uid_is_stable() -> None:
    def variables(text: str) -> dict[str, Any]:
        return {v["name"]: v for v in json.loads(text)["templating"]["list"]}

    first = monitoring_outputs(["chat", "embed"], "prod", "llm-prod")["grafana_dashboard_json"]
    again = monitoring_outputs(["chat", "embed"], "prod", "llm-prod")["grafana_dashboard_json"]
    other = monitoring_outputs(["chat"], "dev", "llm-dev")["grafana_dashboard_json"]
    assert first == again  # the same stack gives the same text: no diff on every `pulumi up`
    assert variables(first)["service"]["regex"] == "^(chat|embed)$"
    assert variables(first)["version"]["multi"] is True
    assert json.loads(first)["uid"] != json.loads(other)["uid"]
    assert len(json.loads(first)["uid"]) <= 40  # Grafana's limit
