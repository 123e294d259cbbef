"""Issue 35 item 3 on the live local stack: `make up` starts a Pushgateway and a Prometheus
(scripts/monitoring.sh), gives the stack the Pushgateway's URL (the secret metricsPushUrl) and
the emulator `--container-egress` to it; the serving container, in its own network namespace,
pushes its proxy's metrics there; a PromQL query to the local Prometheus then counts our
requests with the service, version and container labels. `make down` stops both.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.program.live_stack import LiveStack, live_stack
from tests.program.test_live_stack import creds, post

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("prometheus-pushgateway")),
        reason="Debian's prometheus and prometheus-pushgateway are not installed (`make "
        "promtool` installs both as root): `make up` starts no local Prometheus without them",
    ),
]
__all__ = ["live_stack"]
NAMES = ("pushgateway", "prometheus")
QUERY = (
    "sum by (service, version, container) "
    '(proxy_requests_total{route="chat_completions", status="200"})'
)


def promql(base: str, query: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as resp:
        answer = json.loads(resp.read())
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def counted(base: str) -> float:
    return sum(float(r["value"][1]) for r in promql(base, QUERY))


@pytest.mark.timeout(600)
def test_35_3_requests_reach_the_local_prometheus_with_their_labels(
    live_stack: LiveStack,
) -> None:
    found = re.search(r"Prometheus on (http://127\.0\.0\.1:\d+);", live_stack.up_output)
    assert found, live_stack.up_output[-3000:]
    prometheus = found.group(1)
    assert "monitoring: Prometheus loaded the stack's alert rules" in live_stack.up_output
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as resp:
        groups = {g["name"] for g in json.loads(resp.read())["data"]["groups"]}
    assert "llm-service-tiny" in groups

    outputs = live_stack.outputs()
    headers = creds(outputs, outputs["api_keys"]["gateway"])
    before = counted(prometheus)  # `make up`'s own check request, once pushed and scraped
    for _ in range(3):
        status, _, body = post(outputs["endpoint_url"], headers)
        assert status == 200, body
    deadline = time.monotonic() + 60  # a push every 10 s, a scrape every 5 s
    while counted(prometheus) < before + 3:
        assert time.monotonic() < deadline, promql(prometheus, QUERY)
        time.sleep(1)
    (series,) = promql(prometheus, QUERY)
    labels = series["metric"]
    assert labels["service"] == "tiny"
    assert re.fullmatch(r"spec\.[0-9a-f]{12}", labels["version"]), labels
    assert labels["container"].startswith("ta-"), labels  # Modal's task id (MODAL_TASK_ID)

    monitoring = live_stack.home / "emulator" / "monitoring"
    pids = [int((monitoring / f"{name}.pid").read_text().split()[0]) for name in NAMES]
    netns = live_stack.container_netns()
    since = live_stack.clock_ticks()
    down = live_stack.down()
    assert down.returncode == 0, down.stdout + down.stderr
    assert "monitoring: stopped prometheus" in down.stdout
    assert "monitoring: stopped pushgateway" in down.stdout
    assert live_stack.processes_left(netns, started_before=since) == []
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert not monitoring.exists()
