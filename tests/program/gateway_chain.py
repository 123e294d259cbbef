"""The Modal side of the gateway tests, behind one fixture (`modal_side`), and a LiteLLM starter.

Chain, all real processes over loopback:
    LiteLLM proxy (config = the program's `gateway_config` output)
      -> "Modal edge" (`ModalEdge`: answers 401 unless Modal-Key/Modal-Secret match, as Modal's
         proxy auth does, then forwards; in `redirect` mode it answers like Modal's edge does
         for a request that runs past 150 s: 303 to a result URL (same path plus a query
         parameter) that a GET then reads, https://modal.com/docs/guide/webhook-timeouts)
      -> serving proxy (`python -m serving.proxy`, keys = the program's api-keys secret)
      -> stub engine (tests/harness/stub_engine.py)
`ModalSide.deploy()` runs the program under mocks whose App output points at the edge, whose
proxy token is the one the edge checks and whose API keys are made by the real ApiKey provider,
then starts the serving proxy with the program's own digests, so the key LiteLLM sends is one
the serving proxy accepts. The live local stack (tests/program/live_stack.py: `make up`, the
emulator running our serving container) now carries the main LiteLLM test; this chain stays for
what the live stack cannot show quickly or configure: Modal's 303 after 150 s, a stub engine
whose speed and answers a test sets (the spillover tests), every header the edge received.

LiteLLM is not a project dependency (its proxy extra would move shared pins): it is looked up
as `$LITELLM_BIN`, `.venv/litellm/bin/litellm` or `litellm` on PATH, and the tests are skipped
when none exists. Install: `make .venv/litellm/.installed` (python3.11 -m venv .venv/litellm &&
.venv/litellm/bin/pip install 'litellm[proxy]==1.106.12'; about 1 min, 750 MB).
"""

from __future__ import annotations

import http.client
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
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pulumi.runtime import rpc

from components.api_keys import ApiKeyProvider
from tests.harness.stub_engine import StubEngine
from tests.program.runner import PROJECT_ROOT, ProgramMocks, ProgramRun, fake_outputs, run_program

TOKEN_ID = "wk-gatewaytest"
TOKEN_SECRET = "ws-gatewaytest-secret"
RESULT_QUERY = "__modal_function_call_id"


def litellm_bin() -> str:
    candidates = [
        os.environ.get("LITELLM_BIN", ""),
        str(PROJECT_ROOT / ".venv/litellm/bin/litellm"),
    ]
    for c in candidates:
        if c and Path(c).exists():
            return c
    found = shutil.which("litellm")
    if found is None:
        pytest.skip("LiteLLM proxy not installed (see tests/program/gateway_chain.py)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
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
    """Loopback stand-in for Modal's web edge: proxy auth checked, then a forward.

    With `redirect_next` set, the next POST is answered the way Modal's edge answers a request
    still running after 150 s: the request goes on upstream, the client gets `303 See Other`
    to `<same path>?__modal_function_call_id=<id>`, and a GET of that URL returns the result.
    """

    def __init__(self, upstream: str) -> None:
        self.seen: list[dict[str, str]] = []
        self.redirect_next = False
        self.results: dict[str, tuple[int, str, bytes]] = {}
        edge = self
        target = urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _authorized(self, headers: dict[str, str]) -> bool:
                if (headers.get("modal-key"), headers.get("modal-secret")) == (
                    TOKEN_ID,
                    TOKEN_SECRET,
                ):
                    return True
                self._send(401, "text/plain", b"modal-http: invalid credentials")
                return False

            def _send(self, status: int, ctype: str, data: bytes, **extra: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                edge.seen.append({**headers, ":method": "GET", ":path": self.path})
                if not self._authorized(headers):
                    return
                call_id = self.path.partition(f"{RESULT_QUERY}=")[2]
                if not call_id:  # e.g. LiteLLM's GET /v1/models: a plain forward
                    conn = http.client.HTTPConnection(
                        target.hostname or "127.0.0.1", target.port, timeout=60
                    )
                    fwd = {k: v for k, v in headers.items() if not k.startswith("modal-")}
                    fwd.pop("host", None)
                    conn.request("GET", self.path, headers=fwd)
                    resp = conn.getresponse()
                    ctype = resp.getheader("Content-Type", "text/plain")
                    self._send(resp.status, ctype, resp.read())
                    conn.close()
                    return
                if call_id not in edge.results:
                    self._send(404, "text/plain", b"unknown result URL")
                    return
                self._send(*edge.results[call_id][:2], edge.results[call_id][2])

            def do_POST(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                edge.seen.append({**headers, ":method": "POST", ":path": self.path})
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if not self._authorized(headers):
                    return
                fwd = {k: v for k, v in headers.items() if not k.startswith("modal-")}
                fwd.pop("host", None)
                conn = http.client.HTTPConnection(
                    target.hostname or "127.0.0.1", target.port, timeout=60
                )
                conn.request("POST", self.path, body=body, headers=fwd)
                resp = conn.getresponse()
                ctype = resp.getheader("Content-Type", "text/plain")
                if edge.redirect_next:
                    edge.redirect_next = False
                    data = resp.read()
                    conn.close()
                    call_id = f"fc-{len(edge.results) + 1}"
                    edge.results[call_id] = (resp.status, ctype, data)
                    location = f"{self.path}?{RESULT_QUERY}={call_id}"
                    self._send(303, "text/plain", b"", Location=location)
                    return
                if ctype.startswith("text/event-stream"):  # relay chunk by chunk
                    self.send_response(resp.status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while chunk := resp.read1(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    conn.close()
                    return
                data = resp.read()
                conn.close()
                self._send(resp.status, ctype, data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@dataclass
class ModalSide:
    """The Modal half of a gateway test: edge -> serving proxy -> stub engine."""

    tmp_path: Path
    processes: list[subprocess.Popen[bytes]]
    stub: StubEngine
    edge: ModalEdge
    serving_port: int

    def chat_requests(self) -> list[dict[str, Any]]:
        """Chat completions that reached the engine (= served on the Modal side)."""
        return self.stub.requests("/v1/chat/completions")

    def deploy(self, stack: str, config: Mapping[str, str], secret_keys: list[str]) -> ProgramRun:
        """Run the program with App/token/keys answered for this chain; start serving."""
        key_provider = ApiKeyProvider()
        edge_url = self.edge.url

        def outputs(typ: str, name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
            outs = fake_outputs(typ, name, inputs)
            if typ.endswith("llm:ApiKey"):
                outs.update(key_provider.create(dict(inputs)).outs or {})
            elif typ.endswith("modal:App"):
                outs["web_url"] = edge_url
            elif typ.endswith("modal:ProxyAuthToken"):
                outs.update(token_id=TOKEN_ID, token_secret=rpc.wrap_rpc_secret(TOKEN_SECRET))
            return outs

        run = run_program(stack, config, secret_keys, mocks=ProgramMocks(outputs))
        (keys_secret,) = [r for r in run.of_type("modal:Secret") if "api-keys" in r.name]
        digests = rpc.unwrap_rpc_secret(keys_secret.inputs["values"])["SERVING_API_KEYS"]
        serving_log = self.tmp_path / "serving.log"
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "serving.proxy", "--upstream", self.stub.url,
                 "--port", str(self.serving_port), "--host", "127.0.0.1", "--no-access-log"],
                cwd=PROJECT_ROOT, env={**os.environ, "SERVING_API_KEYS": digests},
                stdout=serving_log.open("wb"), stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        wait_http(
            f"http://127.0.0.1:{self.serving_port}/health", self.processes[-1], 30, serving_log
        )
        return run


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; terminated (then killed) when it ends."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture
def modal_side(tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> Iterator[ModalSide]:
    """The Modal side (stub engine: 6 tokens; change it with `modal_side.stub.configure`)."""
    stub = StubEngine(tokens=6).start()
    serving_port = free_port()
    edge = ModalEdge(f"http://127.0.0.1:{serving_port}")
    try:
        yield ModalSide(tmp_path, processes, stub, edge, serving_port)
    finally:
        edge.close()
        stub.stop()


def start_litellm(
    config_yaml: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> tuple[str, str]:
    """A LiteLLM proxy on a free loopback port with this config: (base URL, master key).

    The master key is the config's own (`general_settings.master_key`, what `make
    gateway-config` writes into the file) or, for a bare program output, a fresh one."""
    litellm = litellm_bin()
    config_file = tmp_path / "litellm.yaml"
    config_file.write_text(config_yaml)
    config_file.chmod(0o600)
    port = free_port()
    settings = (yaml.safe_load(config_yaml) or {}).get("general_settings") or {}
    master_key = str(settings.get("master_key") or "sk-" + secrets.token_hex(16))
    log = tmp_path / "litellm.log"
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch at start-up
        "LITELLM_TELEMETRY": "False",
        "LITELLM_MASTER_KEY": master_key,  # the gateway's own client auth
    }
    processes.append(
        subprocess.Popen(
            [litellm, "--config", str(config_file), "--host", "127.0.0.1",
             "--port", str(port), "--telemetry", "False"],
            cwd=tmp_path, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health/liveliness", processes[-1], 90, log)
    return base, master_key
