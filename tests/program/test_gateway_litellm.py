"""The generated gateway config, loaded by a real LiteLLM proxy, carries a chat completion.

Live (`test_litellm_answers_through_the_live_local_stack`): the local stack as `make up` leaves
it (tests/program/live_stack.py), the config written by scripts/gateway_config.py (what `make
gateway-config` runs) from its outputs, used as is:
    client -> LiteLLM proxy -> the emulator's edge (Modal proxy auth)
           -> our serving container (serving/app.py: auth proxy + stand-in engine)

Stub chain (`test_litellm_routes_a_chat_completion_through_proxy_auth`), for what the live stack
cannot show quickly: Modal's 303 to a result URL after 150 s, and every header the edge got.
All real processes over loopback (tests/program/gateway_chain.py):
    client -> LiteLLM proxy (config = the program's `gateway_config` output)
           -> "Modal edge" (checks Modal-Key/Modal-Secret as Modal's proxy auth does; can answer
              like Modal's edge does for a request past 150 s: 303 to a result URL)
           -> serving proxy (`python -m serving.proxy`, keys = the program's api-keys secret)
           -> stub engine (tests/harness/stub_engine.py)
Skipped when LiteLLM is not installed (`make .venv/litellm/.installed`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.program.gateway_chain import (
    RESULT_QUERY,
    TOKEN_ID,
    TOKEN_SECRET,
    ModalSide,
    start_litellm,
)
from tests.program.live_stack import LiveStack, live_stack
from tests.program.runner import PROJECT_ROOT
from tests.program.runner import stack_config as load_stack_config

pytestmark = [pytest.mark.litellm, pytest.mark.slow]
__all__ = ["live_stack"]


def test_litellm_answers_through_the_live_local_stack(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], live_stack: LiveStack
) -> None:
    config = tmp_path / "litellm-local.yaml"
    written = subprocess.run(
        [sys.executable, "scripts/gateway_config.py", "--stack", "local", "--engine", "standin",
         "--state", str(live_stack.home / "standin.json"), "--out", str(config)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    outputs = live_stack.outputs()
    assert outputs["api_keys"]["gateway"] not in written.stdout + written.stderr
    served = outputs["served_model_name"]
    base, master_key = start_litellm(config.read_text(), tmp_path, processes)

    with urllib.request.urlopen(_chat(base, master_key, served, "Hello"), timeout=60) as resp:
        status, body = resp.status, json.loads(resp.read())
    streamed = _chat(base, master_key, served, "Stream", stream=True)
    with urllib.request.urlopen(streamed, timeout=60) as resp:
        stream_ctype = resp.headers.get("Content-Type", "")
        events = [line for line in resp.read().decode().splitlines() if line.startswith("data:")]

    assert status == 200, body
    assert body["choices"][0]["message"]["content"].startswith("[stand-in engine]")
    assert stream_ctype.startswith("text/event-stream")
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data:").strip()) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(chunks) >= 3 and text.startswith("[stand-in engine]")


def test_litellm_routes_a_chat_completion_through_proxy_auth(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], modal_side: ModalSide
) -> None:
    edge, stub = modal_side.edge, modal_side.stub
    config, secret_keys = load_stack_config("local")
    run = modal_side.deploy("local", config, secret_keys)
    gateway_yaml = run.output("gateway_config")
    served = run.output("served_model_name")
    base, master_key = start_litellm(gateway_yaml, tmp_path, processes)

    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(
            {"model": served, "messages": [{"role": "user", "content": "Hello"}]}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {master_key}"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        status, body = resp.status, json.loads(resp.read())
    first_seen = [r for r in edge.seen if r[":method"] == "POST"]
    seen_before = len(edge.seen)

    # A long or cold request: Modal's edge answers 303 to a result URL after 150 s.
    edge.redirect_next = True
    with urllib.request.urlopen(_chat(base, master_key, served, "Slow"), timeout=60) as resp:
        slow_status, slow_body = resp.status, json.loads(resp.read())
    redirect_seen = edge.seen[seen_before:]

    # Streaming: the SSE chunks arrive through LiteLLM as chunks.
    streamed = _chat(base, master_key, served, "Stream", stream=True)
    with urllib.request.urlopen(streamed, timeout=60) as resp:
        stream_ctype = resp.headers.get("Content-Type", "")
        events = [line for line in resp.read().decode().splitlines() if line.startswith("data:")]

    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    # LiteLLM sent Modal's proxy-auth headers and the generated key to the edge...
    (seen,) = first_seen
    assert seen["modal-key"] == TOKEN_ID and seen["modal-secret"] == TOKEN_SECRET
    gateway_key = run.output("api_keys")["gateway"]
    assert seen["authorization"] == f"Bearer {gateway_key}"
    # ...the serving proxy accepted that key and the engine got the completion request.
    engine_requests = stub.requests("/v1/chat/completions")
    assert json.loads(engine_requests[0]["body"])["messages"][0]["content"] == "Hello"

    # The 303: LiteLLM followed it with a GET of the result URL, with the proxy-auth headers.
    assert slow_status == 200, slow_body
    assert slow_body["choices"][0]["message"]["content"]
    assert [(r[":method"], r[":path"].partition("?")[2]) for r in redirect_seen] == [
        ("POST", ""),
        ("GET", f"{RESULT_QUERY}=fc-1"),
    ]
    assert redirect_seen[1]["modal-key"] == TOKEN_ID
    assert redirect_seen[1]["modal-secret"] == TOKEN_SECRET

    # Streaming: server-sent events, several content chunks, then [DONE].
    assert stream_ctype.startswith("text/event-stream")
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data:").strip()) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(chunks) >= 3 and text
    assert json.loads(engine_requests[-1]["body"])["stream"] is True


def _chat(
    base: str, master_key: str, model: str, content: str, *, stream: bool = False
) -> urllib.request.Request:
    return urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(
            {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {master_key}"},
    )
