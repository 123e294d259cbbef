"""Every PromQL expression the stack emits (rules, dashboard queries, dashboard variables)
parses in Prometheus itself (`promtool check rules` on a file holding each one as a recording
rule) and reads only series of the metric contract, or series the rules record, with labels
those series carry (walked with promql-parser: promtool parses but does not list names)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable

import promql_parser as promql
import pytest
import yaml

from components.monitoring.contract import series_labels

Run = Callable[..., subprocess.CompletedProcess[str]]
# What Grafana puts in place of the dashboard's variables before it sends a query.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$service": "chat", "$version": ".*"}
LABEL_VALUES = re.compile(r"label_values\((?P<selector>.+), (?P<label>\w+)\)")


def rule_expressions(outputs: dict[str, str]) -> list[str]:
    document = yaml.safe_load(outputs["monitoring_rules_yaml"])
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def recorded(outputs: dict[str, str]) -> dict[str, frozenset[str]]:
    """The recording rules' series: each keeps `service` and `version` (sum by them)."""
    document = yaml.safe_load(outputs["monitoring_rules_yaml"])
    names = {r["record"] for g in document["groups"] for r in g["rules"] if "record" in r}
    return dict.fromkeys(names, frozenset({"service", "version"}))


def grafana(text: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        text = text.replace(variable, value)
    return text


def dashboard_expressions(outputs: dict[str, str]) -> list[str]:
    board = json.loads(outputs["grafana_dashboard_json"])
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert queries
    return [grafana(q) for q in queries]


def variable_queries(outputs: dict[str, str]) -> list[tuple[str, str]]:
    """(selector, label) of each `label_values(selector, label)` variable query."""
    board = json.loads(outputs["grafana_dashboard_json"])
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.fullmatch(variable["query"])
            assert match, variable["query"]
            found.append((grafana(match["selector"]), match["label"]))
    assert found
    return found


def unknown_names(expr: str, allowed: dict[str, frozenset[str]]) -> list[str]:
    """What `expr` reads that `allowed` (series name -> labels) does not have."""
    problems: list[str] = []
    made: set[str] = set()  # labels label_replace writes (the dashboard's status "class")

    def visit(node: object) -> None:
        if isinstance(node, promql.VectorSelector):
            labels = allowed.get(node.name or "")
            if labels is None:
                problems.append(f"series {node.name!r}")
                return
            problems.extend(
                f"label {m.name!r} on {node.name}"
                for m in node.matchers.matchers
                if m.name not in labels
            )
        elif isinstance(node, promql.Call) and node.func.name == "label_replace":
            made.add(node.args[1].val)

    tree = promql.parse(expr)
    promql.walk(tree, visit)
    every_label = set().union(*allowed.values(), made)

    def grouping(node: object) -> None:
        if isinstance(node, promql.AggregateExpr) and node.modifier is not None:
            problems.extend(
                f"grouping label {name!r}"
                for name in node.modifier.labels
                if name not in every_label
            )

    promql.walk(tree, grouping)
    return problems


def test_every_expression_parses_in_prometheus(run_promtool: Run, outputs: dict[str, str]) -> None:
    expressions = (
        rule_expressions(outputs)
        + dashboard_expressions(outputs)
        + [s for s, _ in variable_queries(outputs)]
    )
    document = {
        "groups": [
            {
                "name": "parse",
                "rules": [
                    {"record": f"check:expr:{i}", "expr": e} for i, e in enumerate(expressions)
                ],
            }
        ]
    }
    result = run_promtool("check", "rules", "exprs.yaml", files={"exprs.yaml": document})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_expressions_read_only_contract_series(outputs: dict[str, str], source: str) -> None:
    allowed = {**series_labels(), **recorded(outputs)}
    expressions = rule_expressions(outputs) if source == "rules" else dashboard_expressions(outputs)
    problems = {e: unknown_names(e, allowed) for e in expressions}
    assert not {e: p for e, p in problems.items() if p}


def test_dashboard_variables_read_contract_labels(outputs: dict[str, str]) -> None:
    contract = series_labels()
    for selector, label in variable_queries(outputs):
        assert not unknown_names(selector, contract), selector
        parsed = promql.parse(selector)
        assert isinstance(parsed, promql.VectorSelector) and parsed.name, selector
        name = parsed.name
        assert label in contract[name], (selector, label)


def test_the_check_sees_a_name_outside_the_contract() -> None:
    """The check itself: an unknown series, an unknown label and an unknown grouping label."""
    contract = series_labels()
    assert (
        unknown_names('sum by (version) (rate(proxy_requests_total{version="a"}[5m]))', contract)
        == []
    )
    assert unknown_names("rate(vllm:num_requests_running[5m])", contract) == [
        "series 'vllm:num_requests_running'"
    ]
    assert unknown_names('proxy_in_flight{route="x"}', contract) == [
        "label 'route' on proxy_in_flight"
    ]
    assert unknown_names("sum by (pod) (proxy_in_flight)", contract) == ["grouping label 'pod'"]
