"""The proxy's metrics push (serving/proxy/push.py) against a real Prometheus Pushgateway
(Debian's `prometheus-pushgateway`, 1.5.1 here), over loopback: `python -m serving.proxy` as
the container runs it, in front of the stub engine, with the push settings in its env.

- the pushed series carry `service`, `version`, `container` (the grouping key) and count the
  requests the proxy answered;
- SIGTERM deletes the container's group (a gone container's series stop);
- `--workers 2` pushes one group, the workers' sum;
- a push URL that does not answer changes nothing for clients, and is logged once;
- credentials in the URL go into an Authorization header and never into a log line.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser as promql
import pytest

from tests.harness.stub_engine import PROJECT_ROOT, StubEngine
from tests.monitoring.test_contract import free_port

KEY = "sk-push-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
SPEC_DIGEST = "ab" * 32
LABELS = {"service": "chat", "version": "spec." + "ab" * 6, "container": "ta-push-01"}


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.1)


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        pytest.skip(
            "the Pushgateway is not installed: `apt-get install -y --no-install-recommends "
            "prometheus-pushgateway` (Debian's package; `make promtool` installs it as root)"
        )
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "pushgateway.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(url + "/-/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for("the Pushgateway answering /-/ready", answers)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Proxy:
    """`python -m serving.proxy` with the push env, in front of a stub engine."""

    def __init__(self, push_url: str, tmp_path: Path, *extra: str) -> None:
        self.engine = StubEngine(tokens=3, force_include_usage=True).start()
        self.url = f"http://127.0.0.1:{free_port()}"
        digest = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()
        env = {
            **os.environ,
            "SERVING_API_KEYS": json.dumps({"alice": digest}),
            "SERVING_METRICS_PUSH_URL": push_url,
            "SERVING_METRICS_PUSH_INTERVAL_S": "0.3",
            "SERVING_APP_NAME": LABELS["service"],
            "SERVING_SPEC_SHA256": SPEC_DIGEST,
            "MODAL_TASK_ID": LABELS["container"],
        }
        self.log = tmp_path / "proxy.log"
        command = [sys.executable, "-m", "serving.proxy", "--upstream", self.engine.url,
                   "--port", self.url.rsplit(":", 1)[1], "--host", "127.0.0.1",
                   "--health-interval-s", "0.1", *extra]  # fmt: skip
        self.proc = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stderr=self.log.open("w"))
        wait_for("the proxy answering /ready 200", self.ready)

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def chat(self, n: int) -> None:
        with httpx.Client(base_url=self.url, headers=AUTH, timeout=10) as client:
            for _ in range(n):
                assert client.post("/v1/chat/completions", json=CHAT).status_code == 200

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=45)
        self.engine.stop()
        return code


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    started: list[Proxy] = []

    def start(push_url: str, *extra: str) -> Proxy:
        started.append(Proxy(push_url, tmp_path, *extra))
        return started[-1]

    yield start
    for proxy in started:
        proxy.stop()


def samples(pushgateway: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The Pushgateway's /metrics samples of series `name`: (labels, value)."""
    out = []
    for line in httpx.get(pushgateway + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            selector = promql.parse(head)
            assert isinstance(selector, promql.VectorSelector)
            out.append(({m.name: m.value for m in selector.matchers.matchers}, float(value)))
    return out


def chat_count(pushgateway: str) -> float | None:
    for labels, value in samples(pushgateway, "proxy_requests_total"):
        if labels.get("route") == "chat_completions" and labels.get("status") == "200":
            return value
    return None


def test_pushed_series_carry_service_version_container(
    pushgateway: str, start_proxy: Callable[..., Proxy]
) -> None:
    proxy = start_proxy(pushgateway)
    proxy.chat(3)
    wait_for("3 chat requests counted at the Pushgateway", lambda: chat_count(pushgateway) == 3)
    series = samples(pushgateway, "proxy_requests_total")
    assert series
    for labels, _ in series:
        assert {k: labels[k] for k in LABELS} == LABELS
        assert labels["job"] == "serving-proxy"
    # every proxy series of the text is there, under the same key
    ready = samples(pushgateway, "proxy_engine_ready")
    assert [value for _, value in ready] == [1.0]
    assert {k: ready[0][0][k] for k in LABELS} == LABELS


def test_shutdown_deletes_the_group(pushgateway: str, start_proxy: Callable[..., Proxy]) -> None:
    proxy = start_proxy(pushgateway)
    proxy.chat(1)
    wait_for("the chat request counted", lambda: chat_count(pushgateway) == 1)
    assert proxy.stop() == 0
    assert samples(pushgateway, "proxy_requests_total") == []
    groups = httpx.get(pushgateway + "/api/v1/metrics", timeout=5).json()["data"]
    assert groups == []


def test_workers_push_one_merged_group(pushgateway: str, start_proxy: Callable[..., Proxy]) -> None:
    proxy = start_proxy(pushgateway, "--workers", "2")
    proxy.chat(8)  # new connections each: the kernel spreads them over both workers
    wait_for("8 chat requests counted, both workers summed", lambda: chat_count(pushgateway) == 8)
    groups = httpx.get(pushgateway + "/api/v1/metrics", timeout=5).json()["data"]
    assert [g["labels"]["container"] for g in groups] == [LABELS["container"]]
    assert proxy.stop() == 0
    assert httpx.get(pushgateway + "/api/v1/metrics", timeout=5).json()["data"] == []


def failure_lines(log: Path) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        if '"metrics_push_failed"' in line:
            events.append(json.loads(line[line.index("{") :]))
    return events


def test_a_dead_push_url_never_affects_serving(
    tmp_path: Path, start_proxy: Callable[..., Proxy]
) -> None:
    proxy = start_proxy(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    proxy.chat(5)
    time.sleep(1.0)  # three push intervals: three failures, one log line
    proxy.chat(5)
    assert proxy.stop() == 0
    events = failure_lines(proxy.log)
    # the first PUT's failure, then the DELETE at shutdown (always logged): the pushes
    # between them within the minute are not
    assert [e["method"] for e in events] == ["PUT", "DELETE"], events
    assert "Connection refused" in events[0]["error"]


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._record()

    def do_DELETE(self) -> None:
        self._record()

    def _record(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(401)  # as a Pushgateway with basic auth and a wrong password
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_credentials_go_into_a_header_never_a_log_line(
    start_proxy: Callable[..., Proxy],
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        proxy = start_proxy(f"http://pusher:s3cret-pw@127.0.0.1:{port}/base/")
        wait_for("a PUT received", lambda: bool(_Recorder.seen))
        assert proxy.stop() == 0
    finally:
        server.shutdown()
        server.server_close()
    method, path, authorization = _Recorder.seen[0]
    assert method == "PUT"
    assert path.startswith("/base/metrics/job@base64/")
    assert authorization == "Basic cHVzaGVyOnMzY3JldC1wdw=="  # base64 of pusher:s3cret-pw
    assert _Recorder.seen[-1][0] == "DELETE"
    log = proxy.log.read_text()
    assert "s3cret-pw" not in log
    events = failure_lines(proxy.log)
    assert events and "HTTP 401" in events[0]["error"]
    assert events[0]["url"] == f"http://127.0.0.1:{port}/base"
