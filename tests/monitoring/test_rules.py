"""The generated rule file under Prometheus' own tools: `promtool check rules` on it, and
`promtool test rules` with a firing and a non-firing case for every alert it holds.

Each case feeds promtool series shaped as the container's push will send them (the contract's
names and labels: components/monitoring/contract.py) at one sample a minute, evaluates the
rules and compares the alerts that fire, with their labels and rendered annotations.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from components.monitoring.rules import PERCENT, VERSION
from tests.monitoring.conftest import ENVIRONMENT, SERVICE

Run = Callable[..., subprocess.CompletedProcess[str]]
TARGET = f'service="{SERVICE.name}",container="ta-1"'


def counter(*segments: tuple[float, int]) -> str:
    """A counter sampled once a minute from 0: segments of (increase per minute, minutes)."""
    values = [0.0]
    for per_minute, minutes in segments:
        values += [values[-1] + per_minute * (i + 1) for i in range(minutes)]
    return " ".join(f"{v:.0f}" for v in values)


def streams(version: str, *segments: tuple[int, float, int]) -> list[dict[str, str]]:
    """TTFT histogram series: segments of (streams a minute, share slower than the SLO's
    ttft_s, minutes)."""
    labels = f'{TARGET},version="{version}",route="chat_completions"'
    le = f"{SERVICE.slo.ttft_s:g}"
    fast = counter(*((n * (1 - miss), minutes) for n, miss, minutes in segments))
    total = counter(*((n, minutes) for n, _, minutes in segments))
    return [
        {
            "series": f'proxy_time_to_first_token_seconds_bucket{{{labels},le="{le}"}}',
            "values": fast,
        },
        {"series": f"proxy_time_to_first_token_seconds_count{{{labels}}}", "values": total},
    ]


def answers(
    version: str, per_minute: dict[str, int], minutes: int = 20, route: str = "chat_completions"
) -> list[dict[str, str]]:
    """proxy_requests_total series: requests a minute per status, steady for `minutes`."""
    labels = f'{TARGET},version="{version}",route="{route}",key="alice"'
    return [
        {
            "series": f'proxy_requests_total{{{labels},status="{status}"}}',
            "values": counter((n, minutes)),
        }
        for status, n in per_minute.items()
    ]


def gauge(series: str, values: str) -> list[dict[str, str]]:
    return [{"series": series, "values": values}]


def ready(version: str, container: str, values: str) -> list[dict[str, str]]:
    labels = f'service="{SERVICE.name}",version="{version}",container="{container}"'
    return gauge(f"proxy_engine_ready{{{labels}}}", values)


def spend(usd: str, budget: str, environment: str = ENVIRONMENT) -> list[dict[str, str]]:
    return gauge(f'modal_environment_spend_usd{{environment="{environment}"}}', usd) + gauge(
        f'modal_environment_budget_usd{{environment="{environment}"}}', budget
    )


def rules_of(outputs: dict[str, str]) -> list[dict[str, Any]]:
    document = yaml.safe_load(outputs["monitoring_rules_yaml"])
    return [rule for group in document["groups"] for rule in group["rules"]]


def expected(
    outputs: dict[str, str], alert: str, labels: dict[str, str], value: str
) -> dict[str, Any]:
    """The alert as promtool should report it: its labels, and its annotations rendered with
    this version and this $value (humanizePercentage: Go's "%.4g%%" of value x 100)."""
    (rule,) = [  # the one rule of that name whose static labels the alert has
        r
        for r in rules_of(outputs)
        if r.get("alert") == alert and all(labels.get(k) == v for k, v in r["labels"].items())
    ]
    rendered = {
        name: text.replace(VERSION, labels.get("version", "")).replace(PERCENT, value)
        for name, text in rule["annotations"].items()
    }
    return {"exp_labels": labels, "exp_annotations": rendered}


CHAT = {"service": SERVICE.name, "severity": "critical"}
FAST = {**CHAT, "version": "v2", "window": "1h/5m"}
SLOW = {**CHAT, "version": "v2", "window": "6h/30m"}
BUDGET = {"environment": ENVIRONMENT}

# (alert, case, firing?, input series, eval time, expected alerts as (labels, rendered $value))
CASES: list[tuple[str, str, bool, list[dict[str, str]], str, list[tuple[dict[str, str], str]]]] = [
    # 1h/5m at 14.4x: 6 h healthy, then every stream slow for 10 min: 1/6 of the last hour's
    # streams missed (> 14.4 % of the 1 % budget), all of the last 5 min; the 6 h window is
    # at 2.8 % (< 6 %), so the slow pair stays quiet.
    ("LLMTTFTBudgetBurn", "fast burn", True,
     streams("v2", (100, 0.0, 360), (100, 1.0, 10)), "370m", [(FAST, "16.67%")]),
    # 6h/30m at 6x: 10 % of streams slow for over 6 h: above 6 % on both slow windows, under
    # 14.4 % on the fast ones.
    ("LLMTTFTBudgetBurn", "slow burn", True,
     streams("v2", (100, 0.1, 370)), "370m", [(SLOW, "10%")]),
    # Within the SLO: 0.5 % slow streams.
    ("LLMTTFTBudgetBurn", "within the SLO", False,
     streams("v2", (100, 0.005, 370)), "370m", []),
    # The burn stopped 10 min ago: the hour still holds it, the 5 min window does not, so the
    # alert resolves (the short window's job in the workbook).
    ("LLMTTFTBudgetBurn", "burn stopped", False,
     streams("v2", (100, 0.0, 360), (100, 1.0, 10), (100, 0.0, 10)), "380m", []),
    # 10 % of v2's answers are 503 for 15 min (the alert holds 5 min first).
    ("LLMHigh5xxRatio", "10 % 5xx", True,
     answers("v2", {"200": 540, "503": 60}), "15m", [({**CHAT, "version": "v2"}, "10%")]),
    # 2 % 5xx on the engine routes; /health answering 503 does not count.
    ("LLMHigh5xxRatio", "2 % 5xx, failing health polls", False,
     answers("v2", {"200": 588, "503": 12}) + answers("v2", {"503": 600}, route="health"),
     "15m", []),
    # Half of v3's answers fail, but it has 2 requests a minute: under the traffic floor.
    ("LLMHigh5xxRatio", "too little traffic", False,
     answers("v3", {"200": 1, "500": 1}), "15m", []),
    ("LLMHigh429Ratio", "20 % 429", True,
     answers("v2", {"200": 480, "429": 120}), "15m",
     [({"service": SERVICE.name, "severity": "warning", "version": "v2"}, "20%")]),
    ("LLMHigh429Ratio", "5 % 429", False,
     answers("v2", {"200": 570, "429": 30}), "15m", []),
    # Both of v2's containers not ready for 10 min.
    ("LLMEngineDown", "every container down", True,
     ready("v2", "ta-1", "0x20") + ready("v2", "ta-2", "0x20"), "10m",
     [({**CHAT, "version": "v2"}, "")]),
    # One container of two ready; and a start shorter than `for` (3 min not ready).
    ("LLMEngineDown", "one container ready", False,
     ready("v2", "ta-1", "0x20") + ready("v2", "ta-2", "1x20"), "10m", []),
    ("LLMEngineDown", "short start", False,
     ready("v3", "ta-3", "0 0 0 1x20"), "10m", []),
    # 85 % spent: the 80 % threshold, not the 100 % one.
    ("ModalSpendAgainstBudget", "85 % spent", True, spend("85", "100"), "1m",
     [({**BUDGET, "severity": "warning", "threshold": "80%"}, "85%")]),
    # A budget of 0 with anything spent: every threshold (as the spend watcher says).
    ("ModalSpendAgainstBudget", "budget 0, 1 USD spent", True, spend("1", "0"), "1m",
     [({**BUDGET, "severity": "warning", "threshold": "80%"}, "+Inf%"),
      ({**BUDGET, "severity": "critical", "threshold": "100%"}, "+Inf%")]),
    # 50 % spent; nothing spent of a 0 budget; another environment over its budget.
    ("ModalSpendAgainstBudget", "under the thresholds", False,
     spend("50", "100"), "1m", []),
    ("ModalSpendAgainstBudget", "nothing spent of 0", False, spend("0", "0"), "1m", []),
    ("ModalSpendAgainstBudget", "another environment", False,
     spend("200", "100", environment="other"), "1m", []),
]  # fmt: skip


def test_promtool_check_rules_accepts_the_generated_file(
    run_promtool: Run, outputs: dict[str, str]
) -> None:
    result = run_promtool(
        "check", "rules", "rules.yaml", files={"rules.yaml": outputs["monitoring_rules_yaml"]}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rule_count = len(rules_of(outputs))
    assert f"SUCCESS: {rule_count} rules found" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_case(outputs: dict[str, str]) -> None:
    alerts = {r["alert"] for r in rules_of(outputs) if "alert" in r}
    covered = {(alert, firing) for alert, _, firing, *_ in CASES}
    assert {(a, f) for a in alerts for f in (True, False)} == covered


@pytest.mark.parametrize(
    ("alert", "series", "eval_time", "fired"),
    [pytest.param(a, s, t, f, id=f"{a}: {case}") for a, case, _, s, t, f in CASES],
)
def test_promtool_test_rules(
    run_promtool: Run,
    outputs: dict[str, str],
    alert: str,
    series: list[dict[str, str]],
    eval_time: str,
    fired: list[tuple[dict[str, str], str]],
) -> None:
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": alert,
                        "exp_alerts": [
                            expected(outputs, alert, labels, value) for labels, value in fired
                        ],
                    }
                ],
            }
        ],
    }
    result = run_promtool(
        "test", "rules", "tests.yaml",
        files={"rules.yaml": outputs["monitoring_rules_yaml"], "tests.yaml": tests},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_recorded_ratios_are_the_figures_fed_in(run_promtool: Run, outputs: dict[str, str]) -> None:
    """The recording rules a canary analysis will read: per version, the TTFT miss ratio and
    the 5xx ratio equal the shares fed in, and the request rate is per second. (promtool 2.42
    compares values exactly: shares with an exact binary form.)"""

    def sample(record: str, eval_time: str, value: float) -> dict[str, Any]:
        series = f'{record}{{service="chat",version="v2"}}'
        return {
            "expr": series,
            "eval_time": eval_time,
            "exp_samples": [{"labels": series, "value": value}],
        }

    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": streams("v2", (100, 0.25, 70))
                + answers("v2", {"200": 450, "503": 150}),
                "promql_expr_test": [
                    sample("service_version:proxy_ttft_slo_miss:ratio_rate1h", "65m", 0.25),
                    sample("service_version:proxy_ttft_slo_miss:ratio_rate5m", "65m", 0.25),
                    sample("service_version:proxy_requests_5xx:ratio_rate5m", "15m", 0.25),
                    sample("service_version:proxy_requests:rate5m", "15m", 10),
                ],
            }
        ],
    }
    result = run_promtool(
        "test", "rules", "tests.yaml",
        files={"rules.yaml": outputs["monitoring_rules_yaml"], "tests.yaml": tests},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
