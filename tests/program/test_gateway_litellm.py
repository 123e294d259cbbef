"""The generated gateway config, loaded by a real LiteLLM proxy, carries a chat completion.

Chain, all real processes over loopback:
    client -> LiteLLM proxy (config = the program's `gateway_config` output)
           -> "Modal edge" (below: answers 401 unless Modal-Key/Modal-Secret match, as Modal's
              proxy auth does, then forwards)
           -> serving proxy (`python -m serving.proxy`, keys = the program's api-keys secret)
           -> stub engine (tests/harness/stub_engine.py)
The program runs under mocks whose App output points at the edge and whose API keys are made
by the real ApiKey provider, so the key LiteLLM sends is one the serving proxy's digests accept.

LiteLLM is not a project dependency (its proxy extra would move shared pins): it is looked up
as `$LITELLM_BIN`, `.venv/litellm/bin/litellm` or `litellm` on PATH, and the test is skipped
when none exists. Install: python3.11 -m venv .venv/litellm &&
.venv/litellm/bin/pip install 'litellm[proxy]==1.106.12'   (about 1 min, 750 MB).
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from pulumi.runtime import rpc

from components.api_keys import ApiKeyProvider
from tests.harness.stub_engine import StubEngine
from tests.program.runner import PROJECT_ROOT, ProgramMocks, fake_outputs, run_program
from tests.program.runner import stack_config as load_stack_config

pytestmark = [pytest.mark.litellm, pytest.mark.slow]
TOKEN_ID = "wk-gatewaytest"
TOKEN_SECRET = "ws-gatewaytest-secret"


def _litellm_bin() -> str:
    candidates = [
        os.environ.get("LITELLM_BIN", ""),
        str(PROJECT_ROOT / ".venv/litellm/bin/litellm"),
    ]
    for c in candidates:
        if c and Path(c).exists():
            return c
    found = shutil.which("litellm")
    if found is None:
        pytest.skip("LiteLLM proxy not installed (see this module's docstring)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"{url}: process exited {proc.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"{url} not ready after {timeout:.0f}s: {log.read_text()[-2000:]}")


class ModalEdge:
    """Loopback stand-in for Modal's web edge: proxy auth checked, then a plain forward."""

    def __init__(self, upstream: str) -> None:
        self.seen: list[dict[str, str]] = []
        edge = self
        target = urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                edge.seen.append(headers)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if (headers.get("modal-key"), headers.get("modal-secret")) != (
                    TOKEN_ID,
                    TOKEN_SECRET,
                ):
                    self.send_response(401)
                    self.end_headers()
                    self.wfile.write(b"modal-http: invalid credentials for proxy authorization")
                    return
                fwd = {k: v for k, v in headers.items() if not k.startswith("modal-")}
                fwd.pop("host", None)
                conn = http.client.HTTPConnection(
                    target.hostname or "127.0.0.1", target.port, timeout=60
                )
                conn.request("POST", self.path, body=body, headers=fwd)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type", "text/plain"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def test_litellm_routes_a_chat_completion_through_proxy_auth(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    litellm = _litellm_bin()
    stub = StubEngine(tokens=6).start()
    serving_port = _free_port()
    edge = ModalEdge(f"http://127.0.0.1:{serving_port}")
    try:
        # The program, with real API keys and the App's URL pointing at the edge.
        key_provider = ApiKeyProvider()

        def outputs(typ: str, name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
            outs = fake_outputs(typ, name, inputs)
            if typ.endswith("llm:ApiKey"):
                outs.update(key_provider.create(dict(inputs)).outs or {})
            elif typ.endswith("modal:App"):
                outs["web_url"] = edge.url
            elif typ.endswith("modal:ProxyAuthToken"):
                outs.update(token_id=TOKEN_ID, token_secret=rpc.wrap_rpc_secret(TOKEN_SECRET))
            return outs

        config, secret_keys = load_stack_config("local")
        run = run_program("local", config, secret_keys, mocks=ProgramMocks(outputs))
        (keys_secret,) = [r for r in run.of_type("modal:Secret") if "api-keys" in r.name]
        digests = rpc.unwrap_rpc_secret(keys_secret.inputs["values"])["SERVING_API_KEYS"]
        gateway_yaml = run.output("gateway_config")
        served = run.output("served_model_name")

        serving_log = tmp_path / "serving.log"
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "serving.proxy", "--upstream", stub.url,
                 "--port", str(serving_port), "--host", "127.0.0.1", "--no-access-log"],
                cwd=PROJECT_ROOT, env={**os.environ, "SERVING_API_KEYS": digests},
                stdout=serving_log.open("wb"), stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{serving_port}/health", processes[-1], 30, serving_log)

        config_file = tmp_path / "litellm.yaml"
        config_file.write_text(gateway_yaml)
        litellm_port = _free_port()
        master_key = "sk-" + secrets.token_hex(16)
        litellm_log = tmp_path / "litellm.log"
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch at start-up
            "LITELLM_TELEMETRY": "False",
            "LITELLM_MASTER_KEY": master_key,  # the gateway's own client auth
        }
        processes.append(
            subprocess.Popen(
                [litellm, "--config", str(config_file), "--host", "127.0.0.1",
                 "--port", str(litellm_port), "--telemetry", "False"],
                cwd=tmp_path, env=env, stdout=litellm_log.open("wb"), stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        base = f"http://127.0.0.1:{litellm_port}"
        _wait_http(f"{base}/health/liveliness", processes[-1], 90, litellm_log)

        request = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(
                {"model": served, "messages": [{"role": "user", "content": "Hello"}]}
            ).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {master_key}"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            status, body = resp.status, json.loads(resp.read())
    finally:
        edge.close()
        stub.stop()

    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    # LiteLLM sent Modal's proxy-auth headers and the generated key to the edge...
    (seen,) = edge.seen
    assert seen["modal-key"] == TOKEN_ID and seen["modal-secret"] == TOKEN_SECRET
    gateway_key = run.output("api_keys")["gateway"]
    assert seen["authorization"] == f"Bearer {gateway_key}"
    # ...the serving proxy accepted that key and the engine got the completion request.
    (engine_request,) = stub.requests("/v1/chat/completions")
    assert json.loads(engine_request["body"])["messages"][0]["content"] == "Hello"
