"""The metric contract (components/monitoring/contract.py) against the real proxy: the command
the container runs (`python -m serving.proxy`) in front of the stub engine, driven over
loopback, then its /metrics read back. Every contract series must be there with the labels the
contract says the proxy sets; nothing else may be; the route names and the TTFT bucket bound
the rules select on must be the proxy's own spelling."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import promql_parser as promql
import pytest

from components.monitoring.contract import ENGINE_ROUTES, PROXY_METRICS, TARGET_LABELS
from tests.harness.stub_engine import PROJECT_ROOT, StubEngine
from tests.monitoring.conftest import SERVICE

KEY = "sk-monitoring-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def proxy_url() -> Iterator[str]:
    engine = StubEngine(tokens=3, force_include_usage=True).start()
    port = free_port()
    digest = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()
    env = {**os.environ, "SERVING_API_KEYS": json.dumps({"alice": digest})}
    command = [sys.executable, "-m", "serving.proxy", "--upstream", engine.url, "--port",
               str(port), "--host", "127.0.0.1", "--health-interval-s", "0.1"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the proxy did not answer /ready 200 within 20 s"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        engine.stop()


def scrape(url: str) -> dict[str, list[dict[str, str]]]:
    """The proxy's /metrics after traffic on every engine route: series name -> the label sets
    of its samples (each sample's `name{labels}` read as a PromQL selector)."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as client:
        assert client.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        client.post("/v1/completions", json={"model": "stub-model", "prompt": "hi"})
        client.post("/v1/embeddings", json={"model": "stub-model", "input": "hi"})
        client.get("/v1/models")
        # An engine that drops a stream half-way: an upstream error of some kind.
        broken = {**CHAT, "stream": True, "stub": {"fail": "die_mid_stream"}}
        client.post("/v1/chat/completions", json=broken)
        text = client.get("/metrics").text
    samples: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            selector = promql.parse(line.rsplit(" ", 1)[0])
            assert isinstance(selector, promql.VectorSelector) and selector.name, line
            labels = {m.name: m.value for m in selector.matchers.matchers}
            samples.setdefault(selector.name, []).append(labels)
    return samples


def test_proxy_exposes_the_contract_and_nothing_else(proxy_url: str) -> None:
    samples = scrape(proxy_url)
    contract = {name: labels for m in PROXY_METRICS for name, labels in m.series().items()}
    assert set(samples) == set(contract)
    for name, label_sets in samples.items():
        for labels in label_sets:
            # Today: exactly the proxy's own labels. Once the proxy adds service, version and
            # container itself (instead of the push), those too.
            assert set(labels) in (contract[name] - set(TARGET_LABELS), contract[name]), (
                name,
                labels,
            )


def test_rules_select_on_the_proxys_own_spelling(proxy_url: str) -> None:
    samples = scrape(proxy_url)
    routes = {labels["route"] for labels in samples["proxy_requests_total"]}
    assert set(ENGINE_ROUTES) <= routes
    assert {"health", "ready", "metrics"}.isdisjoint(ENGINE_ROUTES)
    bounds = {labels["le"] for labels in samples["proxy_time_to_first_token_seconds_bucket"]}
    assert f"{SERVICE.slo.ttft_s:g}" in bounds  # the `le` value the TTFT rules select
    kinds = {labels["kind"] for labels in samples["proxy_tokens_total"]}
    assert "completion" in kinds  # tokens/s reads kind="completion"
    statuses = {labels["status"] for labels in samples["proxy_requests_total"]}
    assert "200" in statuses  # status is the bare code: the rules' "5.." and "429" match it
