"""The product's stand-in engine (dev/standin_engine.py), run as the container runs it.

Each test starts `python -m standin_engine -- <the spec's real engine command line>`
as a process on a free loopback port and talks HTTP to it: what the lifecycle and the proxy
rely on (models, completions, streams with usage, errors in each engine's shape, the snapshot
routes) and the failure knobs the deploy health gate is tested with.

Kept (issue 33 item 7): the product's tests run it in vLLM's and SGLang's place
(tests/serving/test_engine_standin.py, test_app_deploy.py; tests/providers/test_app_gate.py,
test_serving_app.py; the local stack), so where it diverged they would pass falsely: the
proxy's token accounting reads the usage chunk (docs/proxy.md: vLLM `should_include_usage`
under `--enable-force-include-usage`, SGLang `--stream-response-default-include-usage`); the
snapshot hooks call the sleep routes (vLLM vllm/entrypoints/serve/dev/sleep/api_router.py,
mounted only with VLLM_SERVER_DEV_MODE; SGLang python/sglang/srt/entrypoints/http_server.py
`release_memory_occupation`); errors keep each engine's shape (vLLM
.../exception_handling/error_response.py, SGLang .../openai/protocol.py `ErrorResponse`); a
flag the pinned parser lacks exits 2 (argparse `ArgumentParser.error`); idle keep-alive
follows vllm/envs.py VLLM_HTTP_TIMEOUT_KEEP_ALIVE and sglang/srt/environ.py
SGLANG_TIMEOUT_KEEP_ALIVE (default 5 s), which the proxy's upstream pool relies on. The
failure knobs have no engine counterpart: the gate's tests use them (docs/serving.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving import render
from serving.spec import ServingSpec
from standin_engine import FAIL_ENV, StandinEngineProcess

ROOT = Path(__file__).resolve().parents[2]


def spec_for(engine: str, **kw: Any) -> ServingSpec:
    return ServingSpec.model_validate(
        {
            "engine": engine,
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "served_model_name": "smollm2-135m",
            "context_length": 2048,
            "engine_standin": {},
            **kw,
        }
    )


@pytest.fixture
def standin() -> Iterator[Any]:
    started: list[StandinEngineProcess] = []

    def start(spec: ServingSpec) -> httpx.Client:
        standin = spec.engine_standin
        assert standin is not None and standin.fail is None  # failures: see run_cli below
        proc = StandinEngineProcess(
            engine_argv=render.engine_command(spec, 0), startup_delay_s=standin.startup_delay_s
        )
        started.append(proc.start())
        return httpx.Client(base_url=proc.url, timeout=10)

    yield start
    for proc in started:
        proc.stop()


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi there"}], **kw}


def sse(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_vllm_standin_answers_like_vllm(standin: Any) -> None:
    c = standin(spec_for("vllm"))
    assert c.get("/health").status_code == 200
    [card] = c.get("/v1/models").json()["data"]
    assert (card["id"], card["owned_by"], card["root"]) == (
        "smollm2-135m", "vllm", "HuggingFaceTB/SmolLM2-135M-Instruct",
    )  # fmt: skip

    answer = c.post("/v1/chat/completions", json=chat()).json()
    text = answer["choices"][0]["message"]["content"]
    assert text.startswith("[stand-in engine] No model ran") and "vllm" in text
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(text.split())
    assert answer["usage"]["prompt_tokens"] == 2
    # deterministic: the same text every time
    assert c.post("/v1/chat/completions", json=chat()).json()["choices"] == answer["choices"]

    short = c.post(
        "/v1/completions", json={"model": "smollm2-135m", "prompt": "a", "max_tokens": 3}
    )
    assert short.json()["choices"][0] == {
        "index": 0, "text": "[stand-in engine] No", "finish_reason": "length",
    }  # fmt: skip
    assert short.json()["usage"]["completion_tokens"] == 3

    # the spec renders --enable-force-include-usage: running usage on every chunk, and the
    # usage-only chunk at the end although the client did not ask for it
    chunks = sse(c.post("/v1/chat/completions", json=chat(stream=True, max_tokens=4)).text)
    assert [ch["choices"][0]["delta"]["content"] for ch in chunks[:-1]] == [
        "[stand-in ", "engine] ", "No ", "model",
    ]  # fmt: skip
    assert [ch["usage"]["completion_tokens"] for ch in chunks[:-1]] == [1, 2, 3, 4]
    assert [ch["choices"][0]["finish_reason"] for ch in chunks[:-1]] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4

    # errors in vLLM's shape; a model name it does not serve is 404
    wrong = c.post("/v1/chat/completions", json=chat(model="gpt-4"))
    assert wrong.status_code == 404
    assert wrong.json() == {"error": {
        "message": "The model `gpt-4` does not exist.", "type": "NotFoundError", "param": None,
        "code": 404,
    }}  # fmt: skip
    bad = c.post("/v1/completions", content=b"[1]", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
    assert c.get("/v1/nothing").status_code == 404


def test_sglang_standin_answers_like_sglang(standin: Any) -> None:
    c = standin(spec_for("sglang"))
    [card] = c.get("/v1/models").json()["data"]
    assert (card["id"], card["owned_by"]) == ("smollm2-135m", "sglang")
    # SGLang does not check the model name; its errors are flat
    assert c.post("/v1/chat/completions", json=chat(model="other")).status_code == 200
    bad = c.post("/v1/chat/completions", content=b"nope")
    assert bad.status_code == 400
    assert bad.json() == {
        "object": "error", "message": "The request body is not a JSON object",
        "type": "BadRequestError", "param": None, "code": 400,
    }  # fmt: skip
    # --stream-response-default-include-usage: the usage chunk at the end, no running usage
    chunks = sse(
        c.post("/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 2}).text
    )
    assert [ch["choices"][0]["text"] for ch in chunks[:-1]] == ["[stand-in ", "engine]"]
    assert all("usage" not in ch for ch in chunks[:-1])
    assert chunks[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    # SGLang says what its model is; serving.engine reads is_generation before its warm-up
    info = c.get("/model_info")
    assert info.status_code == 200 and info.json()["is_generation"] is True
    assert standin(spec_for("vllm")).get("/model_info").status_code == 404  # vLLM has none


def test_a_stream_without_the_usage_flags_reports_usage_only_when_asked(standin: Any) -> None:
    spec = spec_for("vllm", extra_args=["--disable-force-include-usage"])
    c = standin(spec)
    plain = sse(c.post("/v1/chat/completions", json=chat(stream=True, max_tokens=2)).text)
    assert len(plain) == 2 and all("usage" not in ch for ch in plain)
    asked = chat(stream=True, max_tokens=2, stream_options={"include_usage": True})
    chunks = sse(c.post("/v1/chat/completions", json=asked).text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


def test_vllm_sleep_and_wake(standin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # what engine_env() sets with snapshots
    c = standin(spec_for("vllm", snapshot=True))  # renders --enable-sleep-mode
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}
    assert c.post("/sleep", params={"level": "1"}).status_code == 200
    assert c.get("/is_sleeping").json() == {"is_sleeping": True}
    asleep = c.post("/v1/chat/completions", json=chat())
    assert asleep.status_code == 503 and asleep.json()["error"]["code"] == 503
    assert c.get("/health").status_code == 200  # the server itself is alive
    assert c.get("/v1/models").status_code == 200  # needs no weights
    assert c.post("/wake_up").status_code == 200
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}
    assert c.post("/v1/chat/completions", json=chat()).status_code == 200


def test_vllm_sleep_needs_dev_mode_and_sleep_mode(
    standin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    no_dev = standin(spec_for("vllm", snapshot=True))
    assert no_dev.post("/sleep").status_code == 404  # the routes exist only in dev mode
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    no_sleep_mode = standin(spec_for("vllm"))  # no --enable-sleep-mode
    answer = no_sleep_mode.post("/sleep")
    assert answer.status_code == 500 and "--enable-sleep-mode" in answer.json()["error"]["message"]
    assert no_sleep_mode.get("/is_sleeping").json() == {"is_sleeping": False}


def test_sglang_release_and_resume(standin: Any) -> None:
    c = standin(spec_for("sglang", snapshot=True))  # renders --enable-memory-saver
    released = c.post("/release_memory_occupation", json={})
    assert released.status_code == 200 and released.json() is None
    assert c.post("/v1/chat/completions", json=chat()).status_code == 503
    assert c.get("/resume_memory_occupation").status_code == 200  # GET works too
    assert c.post("/v1/chat/completions", json=chat()).status_code == 200
    assert c.post("/sleep").status_code == 404  # vLLM's routes are not SGLang's


def run_cli(spec: ServingSpec, **env: str) -> subprocess.Popen[str]:
    argv = render.standin_command(spec, 0, python=sys.executable)
    return subprocess.Popen(
        argv, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["spec", "env"])
def test_fail_start_exits_before_listening(how: str) -> None:
    if how == "spec":
        proc = run_cli(spec_for("vllm", engine_standin={"fail": "start"}))
    else:
        proc = run_cli(spec_for("vllm"), **{FAIL_ENV: "start"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "failing start-up on purpose" in out and "ready:" not in out


def test_never_ready_listens_but_health_stays_503() -> None:
    proc = run_cli(spec_for("sglang", engine_standin={"fail": "never-ready"}))
    try:
        assert proc.stdout is not None
        line = ""
        while "ready:" not in line:
            line = proc.stdout.readline()
            assert line, "the stand-in exited"
        url = line.split("ready: ", 1)[1].strip()
        for _ in range(3):
            assert httpx.get(url + "/health").status_code == 503
            time.sleep(0.2)
        assert httpx.get(url + "/v1/models").status_code == 200  # it does listen
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_startup_delay_answers_503_then_200(standin: Any) -> None:
    c = standin(spec_for("vllm", engine_standin={"startup_delay_s": 1.0}))
    assert c.get("/health").status_code == 503
    deadline = time.monotonic() + 20
    while c.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "still 503 long after the delay"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["vllm", "serve", "m", "--speculative-model", "x"],
         "unrecognized arguments: --speculative-model"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--enable", "x"],
         "ambiguous option: --enable could match"),
        (["llama-server", "-m", "m"], "not a vLLM or SGLang server command line"),
    ],
)  # fmt: skip
def test_an_engine_command_line_the_pinned_engine_refuses_exits_2(
    argv: list[str], said: str
) -> None:
    """argparse's answers: exit 2 on an unknown flag or an ambiguous prefix (a unique prefix,
    e.g. SGLang's `--tp 2`, is accepted, as the real parser does)."""
    proc = subprocess.run(
        [sys.executable, "-m", "standin_engine", "--", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr


def test_a_unique_prefix_is_accepted_as_argparse_does(standin: Any) -> None:
    c = standin(spec_for("sglang", extra_args=[]))
    assert c.get("/health").status_code == 200
    proc = StandinEngineProcess(engine_argv=[
        "python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2", "--port", "0",
    ]).start()  # fmt: skip
    try:
        assert httpx.get(proc.url + "/v1/models").json()["data"][0]["id"] == "m"
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("engine", "env"),
    [("vllm", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"), ("sglang", "SGLANG_TIMEOUT_KEEP_ALIVE")],
)
def test_idle_keep_alive_follows_the_engines_env(
    monkeypatch: pytest.MonkeyPatch, engine: str, env: str
) -> None:
    """Like the real engines (uvicorn's keep-alive from that env, default 5 s), the stand-in
    closes a connection idle for longer than the env says, and keeps one idle for less: a
    proxy pool that outlives the engine's keep-alive meets closed connections here too."""
    import http.client

    monkeypatch.setenv(env, "1")
    proc = StandinEngineProcess(engine_argv=render.engine_command(spec_for(engine), 0)).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=5)

        def ask() -> int:
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            resp.read()
            return resp.status

        assert ask() == 200
        first = conn.sock
        time.sleep(0.3)  # idle for less than the keep-alive: the same connection answers
        assert ask() == 200 and conn.sock is first
        time.sleep(2.0)  # idle for longer: the engine closed it
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            ask()
    finally:
        proc.stop()
