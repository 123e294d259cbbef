"""Gateway spillover: in-house servers first, Modal when they saturate, back in-house after.

The end-to-end test loads the program's `gateway_config` (overflow form) into a real LiteLLM
proxy (1.106.12) in front of:
- two in-house stand-ins (`InHouseServer`, real HTTP servers on loopback) that serve
  `capacity` requests at once and answer 429 to any request above that, as an overloaded
  OpenAI-compatible server does (Hugging Face TGI: `--max-concurrent-requests`, a semaphore
  whose `Overloaded` error is `StatusCode::TOO_MANY_REQUESTS` in router/src/server.rs; Modal
  itself answers 429 above `max_concurrency`, serving/app.py). rack-a is declared with its
  true capacity (LiteLLM's own in-flight cap keeps it below saturation); rack-b is declared
  with twice its capacity (as when other gateways share it), so its own 429s are the signal;
- the Modal side (`modal_side`, tests/program/gateway_chain.py: proxy-auth edge -> serving
  proxy -> stub engine).
Half the requests are streamed. Three phases, each counted on both ends (the servers' own
counts, and the `x-litellm-model-id` response header LiteLLM sets to the deployment that
answered): quiet (sequential), burst (12 concurrent clients), drain (sequential again, after
the cooldown).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from components.config import InHouseInput, OverflowInput
from components.gateway import GatewayTarget
from components.overflow import OverflowPlan, ServiceOverflow, overflow_document
from tests.program.gateway_chain import (
    TOKEN_ID,
    TOKEN_SECRET,
    ModalSide,
    litellm_bin,
    start_litellm,
)
from tests.program.runner import PROJECT, run_program, stack_config

NS = PROJECT + ":"
IN_HOUSE_KEYS = {"rack-a": "ihk-rack-a-0123456789", "rack-b": "ihk-rack-b-9876543210"}
SERVICE_S = 0.3  # how long an in-house request takes
COOLDOWN_S = 1
TIMEOUT_S = 1  # the gateway's timeout for an in-house request (end-to-end test)
HANG_S = 2.5  # a hung in-house server answers after this


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class InHouseServer:
    """An in-house OpenAI-compatible server: `capacity` requests at once, 429 above that."""

    def __init__(self, name: str, api_key: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.fault: str | None = None  # "503": answer 503; "hang": answer after HANG_S
        self.faulted = 0
        self.in_flight = 0
        self.peak = 0
        self.served = 0
        self.rejected = 0
        self.unauthorized = 0
        self.requests: list[dict[str, Any]] = []
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, model: str) -> None:
                """Server-sent events as vLLM sends them: content chunks, then [DONE]."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                words = ["from ", server.name, "."]
                for word in words:
                    time.sleep(SERVICE_S / len(words))
                    chunk = {
                        "id": "chatcmpl-inhouse",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [{"index": 0, "delta": {"content": word}}],
                    }
                    self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with lock:
                    server.requests.append({"path": self.path, "headers": headers, "body": body})
                    if headers.get("authorization") != f"Bearer {api_key}":
                        server.unauthorized += 1
                        self._send(401, {"error": {"message": "invalid API key"}})
                        return
                    fault = server.fault
                    if fault is None and server.in_flight >= server.capacity:
                        server.rejected += 1
                        self._send(
                            429,
                            {"error": {"message": "Model is overloaded", "type": "overloaded"}},
                        )
                        return
                    if fault is None:
                        server.in_flight += 1
                        server.peak = max(server.peak, server.in_flight)
                    else:
                        server.faulted += 1
                if fault == "503":
                    self._send(503, {"error": {"message": "upstream engine unavailable"}})
                    return
                if fault == "hang":  # answers past the gateway's timeout for this endpoint
                    time.sleep(HANG_S)  # (not counted in flight: the next phase must not see it)
                    with contextlib.suppress(OSError):  # the gateway has gone by now
                        self._send(200, _completion(body.get("model", ""), "too late"))
                    return
                try:
                    if body.get("stream"):
                        self._stream(body.get("model", ""))
                    else:
                        time.sleep(SERVICE_S)
                        self._send(200, _completion(body.get("model", ""), f"from {server.name}"))
                finally:
                    with lock:
                        server.in_flight -= 1
                        server.served += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-inhouse",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    }


@pytest.fixture
def racks() -> Iterator[dict[str, InHouseServer]]:
    servers = {
        "rack-a": InHouseServer("rack-a", IN_HOUSE_KEYS["rack-a"], capacity=2),
        "rack-b": InHouseServer("rack-b", IN_HOUSE_KEYS["rack-b"], capacity=2),
    }
    yield servers
    for s in servers.values():
        s.close()


def overflow_config(
    racks: dict[str, InHouseServer] | None = None, **extra: Any
) -> tuple[dict[str, str], list[str]]:
    """The local stack with an in-house tier for `tiny` (rack-b declared at twice its size).

    With `racks` (the end-to-end test) the endpoints are those servers, with a 1 s timeout.
    """
    urls = {n: s.url for n, s in (racks or {}).items()}
    timeout = {"timeout_s": TIMEOUT_S} if racks else {}
    entry = {
        "in_house": [
            {"name": "rack-a", "api_base": urls.get("rack-a", "http://10.0.0.5:8000/v1"),
             "capacity": 2, **timeout},
            {"name": "rack-b", "api_base": urls.get("rack-b", "http://10.0.0.6:8000"),
             "capacity": 4, **timeout},
        ],
        "cooldown_s": COOLDOWN_S,
        **extra,
    }  # fmt: skip
    config, secret_keys = stack_config("local", {NS + "gatewayOverflow": {"tiny": entry}})
    config[NS + "inHouseApiKeys"] = json.dumps(IN_HOUSE_KEYS)
    return config, [*secret_keys, NS + "inHouseApiKeys"]


# ---- end to end with a real LiteLLM proxy ------------------------------------------------------


@pytest.mark.litellm
@pytest.mark.slow
def test_spillover_to_modal_under_load_and_drain_back(
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    modal_side: ModalSide,
    racks: dict[str, InHouseServer],
) -> None:
    modal_side.stub.configure(tokens=6, token_delay_ms=50)  # ~0.3 s, like the in-house side
    config, secret_keys = overflow_config(racks)
    run = modal_side.deploy("local", config, secret_keys)
    assert run.is_secret("gateway_config")
    served = run.output("served_model_name")
    base, master_key = start_litellm(run.output("gateway_config"), tmp_path, processes)

    def chat(i: int) -> str:
        """One client request (every other one streamed); the deployment that answered it."""
        stream = i % 2 == 1
        request = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(
                {
                    "model": served,
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                    "stream": stream,
                }
            ).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {master_key}"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200
            if stream:
                events = [x for x in resp.read().decode().splitlines() if x.startswith("data:")]
                assert events[-1] == "data: [DONE]", events
                chunks = [json.loads(e.removeprefix("data:")) for e in events[:-1]]
                assert "".join(
                    c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
                )
            else:
                assert json.loads(resp.read())["choices"][0]["message"]["content"]
            return str(resp.headers.get("x-litellm-model-id", "?"))

    def counts() -> dict[str, int]:
        return {
            "rack-a": racks["rack-a"].served,
            "rack-b": racks["rack-b"].served,
            "modal": len(modal_side.chat_requests()),
            "in-house 429": racks["rack-a"].rejected + racks["rack-b"].rejected,
            "in-house faults": racks["rack-a"].faulted + racks["rack-b"].faulted,
        }

    rows: list[tuple[str, int, dict[str, int], Counter[str]]] = []

    def phase(name: str, clients: int, per_client: int) -> None:
        before, started = counts(), time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            ids = list(pool.map(chat, range(clients * per_client)))
        after = counts()
        delta = {k: after[k] - before[k] for k in after}
        delta["ms"] = round((time.monotonic() - started) * 1000)
        rows.append((name, clients * per_client, delta, Counter(ids)))

    phase("quiet", 1, 6)
    modal_hits_when_quiet = list(modal_side.edge.seen)
    phase("burst", 12, 4)
    for fault in ("503", "hang"):  # the whole in-house tier fails, then recovers
        time.sleep(COOLDOWN_S + 0.5)  # any cooldown is over: the next request tries in-house
        for rack in racks.values():
            rack.fault = fault
        phase(fault, 1, 4)
        for rack in racks.values():
            rack.fault = None
    time.sleep(COOLDOWN_S + 0.5)  # the cooldowns are over: traffic drains back
    phase("drain", 1, 6)

    print(
        "\nphase  requests    took  served: rack-a  rack-b  Modal   in-house: 429s  "
        "503s/timeouts   x-litellm-model-id (client side)"
    )
    for name, total, d, ids in rows:
        short = {k.rpartition("/")[2]: v for k, v in sorted(ids.items())}
        print(
            f"{name:<6} {total:>8}  {d['ms']:>4} ms  {d['rack-a']:>13}  {d['rack-b']:>6}  "
            f"{d['modal']:>5}  "
            f"{d['in-house 429']:>14}  {d['in-house faults']:>13}   {short}"
        )

    quiet, burst, errors, hangs, drain = (r[2] for r in rows)
    # Quiet: everything in-house, Modal untouched (no health check, no probe, no request).
    assert quiet["modal"] == 0 and quiet["rack-a"] + quiet["rack-b"] == 6
    assert [(r[":method"], r[":path"]) for r in modal_hits_when_quiet] == []
    # Burst: the in-house tier is full, the rest spills to Modal; every client got a 200.
    assert burst["rack-a"] + burst["rack-b"] + burst["modal"] == 48
    assert burst["modal"] > 0
    assert burst["rack-a"] > 0 and burst["rack-b"] > 0
    # rack-a is declared at its true size: LiteLLM never sends it more than it takes.
    assert racks["rack-a"].peak <= 2 and racks["rack-a"].rejected == 0
    # rack-b is declared too big: its own 429s are the saturation signal, and they spill too.
    assert racks["rack-b"].rejected > 0 and racks["rack-b"].peak <= 2
    # 5xx and timeouts: every request still answered, by Modal, after the in-house tier failed.
    for failed in (errors, hangs):
        assert failed["modal"] == 4 and failed["rack-a"] + failed["rack-b"] == 0
        assert failed["in-house faults"] > 0
    # Drain: load is gone, the cooldown is over: back in-house, Modal serves nothing more.
    assert drain["modal"] == 0 and drain["rack-a"] + drain["rack-b"] == 6
    # LiteLLM's own view (the deployment id it answered from) matches the servers' counts.
    for _, _, d, ids in rows:
        assert ids[f"{served}/modal"] == d["modal"]
        assert ids[f"{served}/in-house/rack-a"] == d["rack-a"]
        assert ids[f"{served}/in-house/rack-b"] == d["rack-b"]

    # Keys and headers: each side got its own credentials and nothing of the other's.
    for name, rack in racks.items():
        assert rack.unauthorized == 0
        for r in rack.requests:
            assert r["headers"]["authorization"] == f"Bearer {IN_HOUSE_KEYS[name]}"
            assert "modal-key" not in r["headers"] and "modal-secret" not in r["headers"]
            assert not {"order", "max_parallel_requests"} & set(r["body"])
    modal_posts = [r for r in modal_side.edge.seen if r[":method"] == "POST"]
    assert modal_posts and all(
        (r["modal-key"], r["modal-secret"]) == (TOKEN_ID, TOKEN_SECRET) for r in modal_posts
    )
    assert not any(
        k in r.get("authorization", "") for r in modal_posts for k in IN_HOUSE_KEYS.values()
    )


# ---- the program's overflow document (under mocks, no LiteLLM) -----------------------------------


def _error(config: dict[str, str], secret_keys: list[str]) -> str:
    with pytest.raises(pulumi.RunError) as info:
        run_program("local", config, secret_keys)
    return str(info.value)


def test_overflow_document_from_the_program() -> None:
    run = run_program("local", *overflow_config())
    assert run.is_secret("gateway_config") and run.is_secret("gateway_config_json")
    doc = yaml.safe_load(run.output("gateway_config"))
    assert doc == json.loads(run.output("gateway_config_json"))
    served = run.output("served_model_name")
    entries = doc["model_list"]
    assert [e["model_name"] for e in entries] == [served] * 3  # one group: clients see one model
    rack_a, rack_b, modal = entries
    assert rack_a["litellm_params"] == {
        "model": f"hosted_vllm/{served}",
        "api_base": "http://10.0.0.5:8000/v1",
        "api_key": IN_HOUSE_KEYS["rack-a"],
        "timeout": 120,  # the local stack's timeouts.request_s
        "order": 1,
        "max_parallel_requests": 2,
    }
    assert rack_b["litellm_params"]["api_base"] == "http://10.0.0.6:8000/v1"  # /v1 added
    assert rack_b["litellm_params"]["max_parallel_requests"] == 4
    assert rack_a["model_info"] == {
        "id": f"{served}/in-house/rack-a",
        "cooldown_time": COOLDOWN_S,
        "allowed_fails_policy": {
            "RateLimitErrorAllowedFails": 0,
            "TimeoutErrorAllowedFails": 1,
            "InternalServerErrorAllowedFails": 1,
            "ServiceUnavailableErrorAllowedFails": 1,
            "BadGatewayErrorAllowedFails": 1,
        },
    }
    # Modal: second in line, never cooled down, never probed, cold start covered, proxy auth.
    params = modal["litellm_params"]
    assert params["order"] == 2 and params["timeout"] == 600 + 120
    assert params["extra_headers"] == {
        "Modal-Key": run.output("proxy_token_id"),
        "Modal-Secret": run.output("proxy_token_secret"),
    }
    assert "max_parallel_requests" not in params
    assert modal["model_info"] == {
        "id": f"{served}/modal",
        "disable_background_health_check": True,
        "cooldown_time": 0,
    }
    policy = doc["router_settings"]["model_group_retry_policy"][served]
    assert policy["RateLimitErrorRetries"] == 1 and policy["TimeoutErrorRetries"] == 0
    assert doc["general_settings"] == {
        "disable_model_info_refresh": True,
        "background_health_checks": False,
        "health_check_skip_disabled_background_models": True,
    }
    # The in-house keys exist only inside the secret outputs.
    plain = json.dumps({k: v for k, v in run.outputs.items() if not run.is_secret(k)})
    inputs = json.dumps([r.inputs for r in run.resources], default=str)
    for key in IN_HOUSE_KEYS.values():
        assert key not in plain and key not in inputs


def test_a_stack_without_overflow_keeps_one_entry_per_service_and_never_probes_modal() -> None:
    run = run_program("local", *stack_config("local"))
    doc = yaml.safe_load(run.output("gateway_config"))
    (entry,) = doc["model_list"]
    assert entry["model_info"] == {"disable_background_health_check": True}
    assert "order" not in entry["litellm_params"] and "router_settings" not in doc
    assert doc["general_settings"]["disable_model_info_refresh"] is True


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"in_house": []}, "gatewayOverflow.tiny.in_house = [] must not be empty"),
        ({"cooldown_s": 0}, "gatewayOverflow.tiny.cooldown_s = 0 must be a number >= 1"),
        ({"retries": 3}, "gatewayOverflow.tiny.retries is not a known key; the keys here are"),
        (
            {"allowed_fails": -1},
            "gatewayOverflow.tiny.allowed_fails = -1 must be a whole number >= 0",
        ),
        (
            {"in_house": [{"name": "rack-a", "api_base": "10.0.0.5:8000", "capacity": 2}]},
            "in_house[0].api_base = '10.0.0.5:8000' must match ^https?://[^/\\s]+ (the http(s) URL",
        ),
        (
            {"in_house": [{"name": "rack-a", "api_base": "http://h/v1", "capacity": True}]},
            "in_house[0].capacity = True must be a whole number >= 1",
        ),
        (
            {"in_house": [{"name": "Rack A", "api_base": "http://h/v1", "capacity": 2}]},
            "in_house[0].name = 'Rack A'",
        ),
        (
            {"in_house": [{"name": "rack-a", "api_base": "http://h", "capacity": 2}] * 2},
            "in_house[1].name = 'rack-a' is used twice",
        ),
    ],
)
def test_overflow_config_errors_name_the_key(change: dict[str, Any], expected: str) -> None:
    config, keys = overflow_config(**change)
    message = _error(config, keys)
    assert expected in message, message
    fix = "pulumi config set --path 'gatewayOverflow"
    assert fix in message or "is used twice" in message or "not a known key" in message


def test_in_house_keys_must_match_the_endpoints_and_be_secret() -> None:
    config, keys = overflow_config()
    config[NS + "inHouseApiKeys"] = json.dumps({"rack-a": IN_HOUSE_KEYS["rack-a"]})
    message = _error(config, keys)
    assert "in-house endpoint 'rack-b' of modal-llm:gatewayOverflow has no API key" in message
    assert "pulumi config set --secret --path 'inHouseApiKeys.rack-b' <key>" in message

    config[NS + "inHouseApiKeys"] = json.dumps({**IN_HOUSE_KEYS, "rack-c": "ihk-c"})
    message = _error(config, keys)
    assert "holds a key for 'rack-c', which no in-house endpoint" in message

    config, keys = overflow_config()
    message = _error(config, [k for k in keys if not k.endswith("inHouseApiKeys")])
    assert "modal-llm:inHouseApiKeys is stored in clear" in message
    for key in IN_HOUSE_KEYS.values():
        assert key not in message

    config, keys = overflow_config()
    del config[NS + "gatewayOverflow"]
    message = _error(config, keys)
    assert "modal-llm:inHouseApiKeys is set but modal-llm:gatewayOverflow declares no" in message

    config, keys = overflow_config()
    config[NS + "gatewayOverflow"] = json.dumps([{"tiny": {}}])
    assert "modal-llm:gatewayOverflow = [{'tiny': {}}] must be a map" in _error(config, keys)

    config, keys = overflow_config()
    rack = {"name": "rack-a", "api_base": "http://h/v1", "capacity": 2}
    config[NS + "gatewayOverflow"] = json.dumps({"tin": {"in_house": [rack]}})
    message = _error(config, keys)
    assert "gatewayOverflow.tin: no service named 'tin' in modal-llm:services" in message
    assert "did you mean 'tiny'?" in message


ROUTER_CHECK = """
import asyncio, json, sys
from litellm import Router
from litellm.router_utils.cooldown_handlers import async_get_cooldown_deployments

doc = json.loads(sys.stdin.read())
router = Router(model_list=doc["model_list"], **doc["router_settings"])
model = doc["model_list"][0]["model_name"]

async def one():
    r = await router.acompletion(model=model, messages=[{"role": "user", "content": "x"}])
    return r._hidden_params["model_id"]

async def main():
    burst = await asyncio.gather(*(one() for _ in range(3)))
    cooldowns = await async_get_cooldown_deployments(router, None)
    after = [await one() for _ in range(2)]
    print(json.dumps({"burst": burst, "cooldowns": cooldowns, "after": after}))

asyncio.run(main())
"""


@pytest.mark.litellm
@pytest.mark.slow
def test_litellm_cap_spills_without_resting_the_in_house_endpoint() -> None:
    """LiteLLM's own `max_parallel_requests` 429 sends the excess to Modal at once and does not
    cool the in-house endpoint down: the next request goes in-house again (instant drain-back).
    Checked on litellm's Router itself, in its venv, with the rendered entries."""
    python = Path(litellm_bin()).with_name("python")
    inhouse = InHouseServer("rack-a", IN_HOUSE_KEYS["rack-a"], capacity=10)
    modal = InHouseServer("modal", "sk-modal", capacity=10)
    try:
        endpoint = InHouseInput(
            name="rack-a", api_base=inhouse.url, capacity=1, model="m", timeout_s=30
        )
        tier = OverflowInput(in_house=[endpoint], cooldown_s=5.0, allowed_fails=1)
        overflow = ServiceOverflow("tiny", "m", tier)
        target = GatewayTarget("m", modal.url, "sk-modal", "wk-1", "ws-1", 30, 30)
        plan = OverflowPlan(services={"m": overflow})
        doc = overflow_document([target], plan, {"rack-a": IN_HOUSE_KEYS["rack-a"]})
        done = subprocess.run(
            [str(python), "-c", ROUTER_CHECK], input=json.dumps(doc), capture_output=True,
            text=True, timeout=90, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )  # fmt: skip
    finally:
        inhouse.close()
        modal.close()
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(result["burst"]) == ["m/in-house/rack-a", "m/modal", "m/modal"]
    assert result["cooldowns"] == []
    assert result["after"] == ["m/in-house/rack-a"] * 2
    assert inhouse.rejected == 0 and inhouse.peak == 1
