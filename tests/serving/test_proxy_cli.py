"""The command the Modal app runs: ``python -m serving.proxy --upstream URL --port PORT``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.harness.stub_engine import PROJECT_ROOT, StubEngineProcess
from tests.serving.conftest import ALICE, CHAT, KEYS, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proxy_command(upstream: str, port: int) -> list[str]:
    return [sys.executable, "-m", "serving.proxy", "--upstream", upstream, "--port", str(port),
            "--host", "127.0.0.1", "--health-interval-s", "0.1"]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        (None, "not set"),
        ('{"alice": "my-plaintext-secret"}', "not 'sha256:'"),
        ("not json at all", "not valid JSON"),
    ],
)
def test_refuses_to_start_without_valid_keys(value: str | None, expect: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SERVING_API_KEYS"}
    if value is not None:
        env["SERVING_API_KEYS"] = value
    done = subprocess.run(
        proxy_command("http://127.0.0.1:9", free_port()), cwd=PROJECT_ROOT, env=env,
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "refusing to start" in done.stderr and expect in done.stderr
    assert "SERVING_API_KEYS" in done.stderr
    assert "my-plaintext-secret" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (["--max-in-flight", "0"], "max_in_flight=0 is invalid"),
        (["--health-interval-s", "0"], "health_interval_s=0.0 is invalid"),
        (["--health-timeout-s", "-1"], "health_timeout_s=-1.0 is invalid"),
        (["--upstream", "https://127.0.0.1:8001"], "upstream URL"),
    ],
)
def test_refuses_to_start_with_bad_settings(flags: list[str], expect: str) -> None:
    env = {**os.environ, "SERVING_API_KEYS": json.dumps(KEYS)}
    done = subprocess.run(
        [*proxy_command("http://127.0.0.1:9", free_port()), *flags], cwd=PROJECT_ROOT,
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "refusing to start" in done.stderr and expect in done.stderr


@pytest.fixture
def stub_process() -> Iterator[StubEngineProcess]:
    with StubEngineProcess(tokens=3) as engine:
        yield engine


def test_cli_serves_through_a_stub_engine_subprocess(stub_process: StubEngineProcess) -> None:
    port = free_port()
    env = {**os.environ, "SERVING_API_KEYS": json.dumps(KEYS)}
    proc = subprocess.Popen(
        proxy_command(stub_process.url, port), cwd=PROJECT_ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(url + "/ready", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=20, what="the proxy subprocess to be ready")
        auth = {"Authorization": f"Bearer {ALICE}"}
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth, timeout=10)
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 3
        assert httpx.post(url + "/tokenize", json={}, headers=auth).status_code == 404
        assert [h["path"] for h in stub_process.requests()] == ["/v1/chat/completions"]
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=15)
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    access = [e for e in lines if "route" in e]
    assert [(e["route"], e["status"], e["key"]) for e in access if e["route"] != "ready"] == [
        ("chat_completions", 200, "alice"), ("unmatched", 404, "-"),
    ]  # fmt: skip
    assert any(
        e.get("event") == "proxy_starting" and e["key_names"] == ["alice", "bob"] for e in lines
    )
    assert ALICE not in stderr
    assert KEYS["alice"].removeprefix("sha256:") not in stderr
