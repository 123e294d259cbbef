"""Web endpoints that run as inputs (fastapi_endpoint, asgi_app, web_server, a class web
method) through the edge, with the real CLI deploying apps/rt_endpoints.py."""

from __future__ import annotations

import time

import httpx
import modal

from tests.emulator.helpers import APPS_DIR, modal_cli
from tests.emulator.runtime_support import auth_headers, proxy_token
from tests.harness.emulator import EmulatorProcess


def test_web_endpoints_answer_through_the_edge(rt: EmulatorProcess) -> None:
    out = modal_cli(rt, "deploy", str(APPS_DIR / "rt_endpoints.py")).stdout
    url = {
        name: rt.edge_url(f"emu-workspace--rt-endpoints-{name}")
        for name in ("add", "hello", "api", "files", "greeter-greet")
    }
    assert f"{url['add']} 🔑" in out and f"{url['hello']} (unauthenticated)" in out
    assert modal.Function.from_name("rt-endpoints", "hello").get_web_url() == url["hello"]

    hello = httpx.get(url["hello"], params={"name": "emu"}, timeout=60)
    assert hello.status_code == 200 and hello.json() == "hello emu"

    assert httpx.get(url["api"] + "/items/21", timeout=60).json() == {"n": 21, "double": 42}
    streamed = httpx.get(url["api"] + "/stream", timeout=60)
    assert streamed.text == "a\nb\nc\n"
    body = b"x" * 300_000
    assert httpx.post(url["api"] + "/upload", content=body, timeout=60).json() == {
        "size": len(body)
    }
    chunks = iter([b"y" * 70_000, b"z" * 5])  # a chunked request body
    assert httpx.post(url["api"] + "/upload", content=chunks, timeout=60).json() == {"size": 70_005}
    missing = httpx.get(url["api"] + "/nope", timeout=60)
    assert missing.status_code == 404  # the app's own 404, not the edge's

    greet = httpx.get(url["greeter-greet"], params={"who": "bob"}, timeout=60)
    assert greet.json() == "greetings, bob"

    listing = httpx.get(url["files"] + "/", timeout=60)  # web_server: a proxy to its port
    assert listing.status_code == 200 and "Directory listing" in listing.text

    # requires_proxy_auth=True: 401 without a token, and no input reaches a container.
    before = {c["function_id"] for c in rt.containers()}
    denied = httpx.post(url["add"], json={"a": 1, "b": 2}, timeout=60)
    assert denied.status_code == 401
    assert {c["function_id"] for c in rt.containers()} == before
    token = proxy_token()
    added = httpx.post(url["add"], json={"a": 1, "b": 2}, headers=auth_headers(token), timeout=60)
    assert added.json() == {"sum": 3}


def test_a_failing_endpoint_answers_500(rt: EmulatorProcess) -> None:
    modal_cli(rt, "deploy", str(APPS_DIR / "rt_endpoints.py"))
    url = rt.edge_url("emu-workspace--rt-endpoints-add")
    token = proxy_token()
    bad = httpx.post(url, json={"a": 1}, headers=auth_headers(token), timeout=60)  # KeyError
    assert (bad.status_code, bad.text) == (500, "Internal Server Error")
    # The traceback reaches the app's logs. The emulator reads the container's stderr pipe line
    # by line on its own task (dev/emulator/runtime/containers.py), independently of the 500 the
    # edge relays, so on a busy machine the lines may land a moment later: ask for up to 30 s.
    deadline = time.monotonic() + 30
    logs = modal_cli(rt, "app", "logs", "rt-endpoints").stdout
    while "KeyError: 'b'" not in logs and time.monotonic() < deadline:
        time.sleep(0.5)
        logs = modal_cli(rt, "app", "logs", "rt-endpoints").stdout
    assert "KeyError: 'b'" in logs
