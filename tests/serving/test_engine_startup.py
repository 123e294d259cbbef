"""Start-up details of serving/engine.py: what each process may see, the startup budget, and
warm-up for models that are not chat models.

Real processes over loopback HTTP: the stub engine (tests/harness/stub_engine.py) or a small
route-answering engine written below, and the real proxy (`python -m serving.proxy`).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from serving.engine import Container, Engine, EngineError, startup_budget_s
from tests.serving.test_engine_lifecycle import (
    KEY,
    KEYS_ENV,
    Deaths,
    free_port,
    make_spec,
    stub_cmd,
)

HF_TOKEN = "hf_do-not-leak-0123456789"  # a fake token


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_proxy_sees_only_what_it_needs_and_the_engine_no_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the container env after Modal mounted both secrets, plus something unrelated
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("SERVING_API_KEYS", KEYS_ENV["SERVING_API_KEYS"])
    monkeypatch.setenv("SOME_OTHER_SETTING", "x")
    engine_port, proxy_port = free_port(), free_port()
    c = Container(
        make_spec(snapshot=False),
        proxy_port=proxy_port,
        engine_port=engine_port,
        engine_argv=stub_cmd(engine_port),
        on_death=Deaths(),
    )
    try:
        c.start()
        c.ready()  # the proxy works with its reduced env: it answered /ready
        assert c.proxy is not None and c.proxy.pid is not None
        assert c.engine.process.pid is not None
        proxy_env = environ_of(c.proxy.pid)
        engine_env = environ_of(c.engine.process.pid)
        assert proxy_env["SERVING_API_KEYS"] == KEYS_ENV["SERVING_API_KEYS"]
        assert "PATH" in proxy_env
        assert "HF_TOKEN" not in proxy_env and "SOME_OTHER_SETTING" not in proxy_env
        assert HF_TOKEN not in "\n".join(proxy_env.values())
        # the mirror image: the engine gets HF_TOKEN (gated downloads) but not the key digests
        assert engine_env["HF_TOKEN"] == HF_TOKEN and "SERVING_API_KEYS" not in engine_env
        # and a client request with a key still goes through
        req = urllib.request.Request(
            f"http://127.0.0.1:{proxy_port}/v1/models", headers={"Authorization": f"Bearer {KEY}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
    finally:
        c.stop()


# ---- the startup budget ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("startup_s", "budget"), [(1800, 1740.0), (600, 540.0), (300, 270.0), (10, 9.0), (3, 2.7)]
)
def test_startup_budget_ends_before_modals_startup_timeout(startup_s: int, budget: float) -> None:
    assert startup_budget_s(startup_s) == pytest.approx(budget)


def test_wait_ready_gives_up_within_the_budget_not_at_startup_s() -> None:
    """Modal's startup_timeout is timeouts.startup_s: waiting that long means Modal kills the
    container first and the report with the engine's last lines is never printed."""
    port = free_port()
    spec = make_spec(snapshot=False, timeouts={"startup_s": 3, "request_s": 30})
    engine = Engine(spec, port=port, argv=stub_cmd(port, "--health-status", "503"))
    engine.start()
    try:
        with pytest.raises(EngineError) as info:
            engine.wait_ready(interval_s=0.1)
    finally:
        engine.process.stop()
    text = str(info.value)
    assert "after 2.7 s" in text  # startup_s=3 minus a 0.3 s margin
    assert "timeouts.startup_s=3 minus a 0.3 s margin" in text and "HTTP 503" in text
    assert "stub engine" in text  # the engine's last lines are in the report


def test_container_ready_reports_the_budget_with_the_last_lines() -> None:
    engine_port, proxy_port = free_port(), free_port()
    spec = make_spec(snapshot=False, timeouts={"startup_s": 2, "request_s": 30})
    c = Container(
        spec,
        proxy_port=proxy_port,
        engine_port=engine_port,
        engine_argv=stub_cmd(engine_port, "--health-status", "503"),
        proxy_env=KEYS_ENV,
        on_death=Deaths(),
    )
    try:
        c.start()
        with pytest.raises(EngineError) as info:
            c.ready()
    finally:
        c.stop()
    assert "timeouts.startup_s=2 minus a 0.2 s margin" in str(info.value)


# ---- warm-up routes --------------------------------------------------------------------------

# A minimal engine: /health 200, each OpenAI route answers the status its mode gives, and
# GET /_log lists the POSTs it received. Run as the engine process, like the real engines.
ROUTE_ENGINE = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, mode = int(sys.argv[1]), sys.argv[2]
STATUS = {
    "base": {"/v1/chat/completions": 400, "/v1/completions": 200, "/v1/embeddings": 404},
    "embed": {"/v1/chat/completions": 404, "/v1/completions": 404, "/v1/embeddings": 200},
    "unknown-model": {"/v1/chat/completions": 404, "/v1/completions": 404,
                      "/v1/embeddings": 404},
    # SGLang serving an embedding model: nothing there refuses chat up front
    # (serving/engine.py MODEL_KIND_ROUTES); this engine answers it 500, a status the route
    # order cannot move past
    "sglang-embed": {"/v1/chat/completions": 500, "/v1/completions": 500,
                     "/v1/embeddings": 200},
    "sglang-generate": {"/v1/chat/completions": 200, "/v1/completions": 200,
                        "/v1/embeddings": 400},
}[mode]
# SGLang's GET /model_info (0.5.15 sglang/srt/entrypoints/http_server.py), in its modes only
MODEL_INFO = {"sglang-embed": {"is_generation": False}, "sglang-generate": {"is_generation": True}}
seen = []

class H(BaseHTTPRequestHandler):
    def _send(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/model_info":
            seen.append(["GET /model_info", None])
            if mode in MODEL_INFO:
                self._send(200, MODEL_INFO[mode])
            else:
                self._send(404, {"detail": "Not Found"})
            return
        self._send(200, seen if self.path == "/_log" else {"ok": True})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seen.append([self.path, body])
        status = STATUS.get(self.path, 404)
        message = {400: "default chat template is no longer allowed", 404: "not found",
                   500: "internal error"}
        self._send(status, {"ok": True} if status == 200 else {"error": message[status]})

    def log_message(self, *args):
        pass

print("route engine ready", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def route_engine(tmp_path: Path) -> Any:
    script = tmp_path / "route_engine.py"
    script.write_text(ROUTE_ENGINE)
    started: list[Engine] = []

    def start(mode: str, prompts: list[str], engine_name: str = "vllm") -> Engine:
        port = free_port()
        spec = make_spec(engine=engine_name, snapshot=False, warmup_prompts=prompts)
        engine = Engine(spec, port=port, argv=[sys.executable, str(script), str(port), mode])
        started.append(engine.start())
        engine.wait_ready(timeout_s=30, interval_s=0.05)
        return engine

    yield start
    for engine in started:
        engine.process.stop(grace_s=5)


def posts(engine: Engine) -> list[tuple[str, dict[str, Any]]]:
    with urllib.request.urlopen(f"{engine.base_url}/_log", timeout=10) as resp:
        return [(path, body) for path, body in json.loads(resp.read())]


def test_base_model_without_chat_template_warms_up_with_completions(route_engine: Any) -> None:
    engine = route_engine("base", ["Hello", "Once upon a time"])
    assert engine.warm_up() == "/v1/completions"
    seen = posts(engine)
    # chat answered 400 once; the route that worked is kept for the next prompt
    assert [p for p, _ in seen] == [
        "/v1/chat/completions", "/v1/completions", "/v1/completions",
    ]  # fmt: skip
    assert [b["prompt"] for p, b in seen if p == "/v1/completions"] == ["Hello", "Once upon a time"]
    assert all(b["model"] == "qwen3-8b" and b["max_tokens"] == 16 for _, b in seen[1:])


def test_embedding_model_warms_up_with_embeddings(route_engine: Any) -> None:
    engine = route_engine("embed", ["Hello", "World"])
    assert engine.warm_up() == "/v1/embeddings"
    seen = posts(engine)
    assert [p for p, _ in seen] == [
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/embeddings",
    ]  # fmt: skip
    assert [b["input"] for p, b in seen if p == "/v1/embeddings"] == ["Hello", "World"]


def test_sglang_embedding_model_is_asked_first_and_warms_up_with_embeddings(
    route_engine: Any,
) -> None:
    """SGLang says what its model is (`/model_info`): an embedding model is warmed up through
    /v1/embeddings alone, never with a chat request it would not refuse cleanly."""
    engine = route_engine("sglang-embed", ["Hello", "World"], engine_name="sglang")
    assert engine.warm_up() == "/v1/embeddings"
    assert [p for p, _ in posts(engine)] == [
        "GET /model_info", "/v1/embeddings", "/v1/embeddings",
    ]  # fmt: skip


def test_sglang_generation_model_and_vllm_keep_the_route_order(route_engine: Any) -> None:
    sglang = route_engine("sglang-generate", ["Hello"], engine_name="sglang")
    assert sglang.warm_up() == "/v1/chat/completions"
    assert [p for p, _ in posts(sglang)] == ["GET /model_info", "/v1/chat/completions"]
    vllm = route_engine("embed", ["Hello"])  # vLLM has no such route: it is never asked
    assert vllm.warm_up() == "/v1/embeddings"
    assert "GET /model_info" not in [p for p, _ in posts(vllm)]


def test_sglang_without_model_info_keeps_the_route_order(route_engine: Any) -> None:
    engine = route_engine("base", ["Hello"], engine_name="sglang")  # /model_info: 404
    assert engine.warm_up() == "/v1/completions"
    assert [p for p, _ in posts(engine)] == [
        "GET /model_info", "/v1/chat/completions", "/v1/completions",
    ]  # fmt: skip


def test_warm_up_error_lists_every_route_tried(route_engine: Any) -> None:
    engine = route_engine("unknown-model", ["Hello"])
    with pytest.raises(EngineError) as info:
        engine.warm_up()
    text = str(info.value)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        assert f"{path}: HTTP 404" in text
    assert "served_model_name" in text
