"""The real container lifecycle (serving/engine.py, serving/app.py's hooks) with the stand-in
engine the spec asks for (`engine_standin`), over real loopback HTTP, without the emulator.

Nothing replaces the engine command here: the Container starts what the spec's
`launch_command` renders (`python -m standin_engine -- vllm serve ...`), the real auth
proxy in front of it with key digests from the environment, as the Modal Secret provides them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving import render
from serving.engine import Container, EngineError, ProcessDied
from serving.proxy.keys import digest_of
from serving.spec import ServingSpec, SpecError
from tests.serving.test_app_lifecycle import import_app
from tests.serving.test_engine_lifecycle import Deaths, free_port, http

ROOT = Path(__file__).resolve().parents[2]
OLD_KEY, NEW_KEY = "sk-standin-old-key", "sk-standin-new-key"


def keys_env(key: str) -> str:
    return json.dumps({"gateway": digest_of(key)})


def make_spec(engine: str, snapshot: bool, **standin: Any) -> ServingSpec:
    return ServingSpec.model_validate(
        {
            "engine": engine,
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "served_model_name": "smollm2-135m",
            "snapshot": snapshot,
            "context_length": 2048,
            "warmup_prompts": ["Hello", "Say something short"],
            "timeouts": {"startup_s": 60, "request_s": 30},
            "engine_standin": standin,
        }
    )


def ask(proxy_port: int, key: str) -> tuple[int, Any]:
    return http(
        "POST",
        f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]},
        {"Authorization": f"Bearer {key}"},
    )


@pytest.fixture
def containers() -> Iterator[Any]:
    made: list[Container] = []

    def make(spec: ServingSpec) -> tuple[Container, int]:
        engine_port, proxy_port = free_port(), free_port()
        c = Container(
            spec,
            proxy_port=proxy_port,
            engine_port=engine_port,
            proxy_env={"SERVING_API_KEYS": keys_env(OLD_KEY)},
            engine_env={"PYTHONPATH": str(ROOT)},  # as serving/app.py gives the stand-in
            on_death=Deaths(),
        )
        made.append(c)
        return c, proxy_port

    yield make
    for c in made:
        c.stop()


@pytest.mark.parametrize(
    ("engine", "snapshot"), [("vllm", True), ("sglang", True), ("vllm", False)]
)
def test_the_lifecycle_runs_the_standin_the_spec_names(
    containers: Any, engine: str, snapshot: bool
) -> None:
    spec = make_spec(engine, snapshot)
    c, proxy_port = containers(spec)
    assert c.engine.process.argv[1:4] == ["-m", "standin_engine", "--"]
    assert c.engine.process.argv[4:] == render.engine_command(spec, c.engine.port)  # the real line
    c.start()
    c.ready()  # health, warm-up prompts, proxy /ready
    if snapshot:
        c.before_snapshot()  # vLLM POST /sleep?level=1 (dev mode from engine_env), SGLang release
        status, body = http("GET", f"{c.engine.base_url}/is_sleeping")
        assert engine != "vllm" or (status, body) == (200, {"is_sleeping": True})
        c.after_restore()
    status, body = ask(proxy_port, OLD_KEY)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].startswith("[stand-in engine] No model ran")
    assert engine in body["choices"][0]["message"]["content"]
    assert ask(proxy_port, NEW_KEY)[0] == 403  # an unknown key, refused by our proxy
    tail = "\n".join(c.engine.process.tail())
    assert "stand-in engine for: " in tail and "stand-in engine ready" in tail
    c.stop()
    assert c.engine.process.poll() is not None


def test_a_standin_told_to_fail_start_up_fails_ready_with_its_last_lines(containers: Any) -> None:
    c, _ = containers(make_spec("vllm", False, fail="start"))
    c.start()
    with pytest.raises(ProcessDied) as info:
        c.ready()
    assert info.value.name == "vllm" and info.value.returncode == 1
    assert any("failing start-up on purpose" in line for line in info.value.tail)


def test_a_standin_that_never_gets_ready_times_out_with_the_health_answer(
    containers: Any,
) -> None:
    # 5 s: long enough that a loaded machine has the stand-in listening (and answering 503)
    # before the budget (90 % of startup_s) runs out, rather than refusing the connection.
    spec = make_spec("sglang", False, fail="never-ready").model_copy(
        update={"timeouts": make_spec("sglang", False).timeouts.model_copy(update={"startup_s": 5})}
    )
    c, _ = containers(spec)
    c.start()
    with pytest.raises(EngineError, match=r"/health after [0-9.]+ s .*startup_s=5 .*HTTP 503"):
        c.ready()


def test_with_snapshots_the_proxy_reads_the_keys_after_restore(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """serving/app.py: snap=True starts the engine only; snap=False starts the proxy, which
    reads SERVING_API_KEYS then (Modal updates the env at restore), so a key rotation is never
    baked into the snapshot."""
    engine_port, proxy_port = free_port(), free_port()
    monkeypatch.setenv("SERVING_ENGINE_PORT", str(engine_port))
    monkeypatch.setenv("SERVING_PROXY_PORT", str(proxy_port))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("SERVING_ENGINE_CMD", raising=False)
    monkeypatch.setenv("MODAL_SERVER_URL", "http://127.0.0.1:9")  # a local Modal: the emulator
    monkeypatch.setenv("SERVING_API_KEYS", keys_env(OLD_KEY))
    module = import_app(monkeypatch, make_spec("vllm", True), tmp_path)
    server = module.Serving._get_user_cls()()
    try:
        server.start()  # snap=True: engine started, warmed up, asleep; no proxy yet
        assert server.container.proxy is None
        assert http("GET", f"http://127.0.0.1:{engine_port}/is_sleeping")[1] == {
            "is_sleeping": True
        }
        with pytest.raises(OSError):
            http("GET", f"http://127.0.0.1:{proxy_port}/health")
        monkeypatch.setenv("SERVING_API_KEYS", keys_env(NEW_KEY))  # rotated before restore
        server.restore()  # snap=False: wake, then the proxy starts and reads the keys now
        assert server.container.proxy is not None
        proxy_env = Path(f"/proc/{server.container.proxy.pid}/environ").read_bytes()
        assert keys_env(NEW_KEY).encode() in proxy_env
        assert ask(proxy_port, NEW_KEY)[0] == 200
        assert ask(proxy_port, OLD_KEY)[0] == 403
    finally:
        server.stop()
    assert server.container.proxy is not None and server.container.proxy.poll() is not None


@pytest.mark.parametrize(
    "server_url", ["https://api.modal.com", "http://127.0.0.1:9,https://api.modal.com"]
)
def test_app_refuses_a_standin_spec_for_a_modal_that_is_not_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server_url: str
) -> None:
    monkeypatch.setenv("MODAL_SERVER_URL", server_url)
    with pytest.raises(SpecError, match=r"stand-in engine .* only runs on a local Modal"):
        import_app(monkeypatch, make_spec("vllm", False), tmp_path)
