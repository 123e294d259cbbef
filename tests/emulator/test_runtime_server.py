"""`@app.server` through the real CLI and HTTP: edge URL, proxy auth, autoscaling, failures.

The app (apps/rt_server.py, no project code) starts a stdlib web server on the fixed port
8000 in `@modal.enter`; every container gets its own network namespace, so two containers (and
a service of the machine's own on 8000) never collide.

Kept (issue 33 item 7): the serving container is an `@app.server` (serving/app.py) behind
Modal's proxy auth; modal 1.6.4 modal/app.py `_App.server`.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.emulator.helpers import modal_cli
from tests.emulator.runtime_support import (
    app_id,
    auth_headers,
    deploy_server,
    get,
    proxy_token,
    wait_for,
)
from tests.harness.emulator import EmulatorProcess


def test_deploy_prints_a_working_url_and_proxy_auth_guards_it(rt: EmulatorProcess) -> None:
    url, out = deploy_server(rt)
    assert url == rt.edge_url("emu-workspace--rt-server-web")  # Modal's name, a local port
    assert f"{url} 🔑" in out  # the CLI shows it needs proxy auth (unauthenticated=False)
    token = proxy_token()

    # No credentials, a wrong secret, a token of another environment: 401, no container.
    missing = get(url)
    assert missing.status_code == 401
    assert missing.text.strip() == "modal-http: missing credentials for proxy authorization"
    wrong = get(url, {"Modal-Key": token[0], "Modal-Secret": "ws-" + "x" * 22})
    assert wrong.status_code == 401 and "invalid credentials" in wrong.text
    assert rt.containers() == []

    # Modal-Key/Modal-Secret: a cold start, then the container answers.
    started = time.monotonic()
    first = get(url, auth_headers(token))
    cold = time.monotonic() - started
    assert first.status_code == 200, first.text
    (container,) = rt.live_containers()
    assert first.text == f"hello from {container['task_id']}"
    assert cold < 30

    # Authorization: Bearer <id>.<secret> (and <id>:<secret>) work too.
    for sep in (".", ":"):
        bearer = get(url + "/headers", {"Authorization": f"Bearer {token[0]}{sep}{token[1]}"})
        assert bearer.status_code == 200
        # The credentials never reach the container.
        assert token[1] not in bearer.text and "authorization" not in bearer.text.lower()
    seen = get(url + "/headers", auth_headers(token)).text.lower()
    assert "modal-secret" not in seen and "modal-key" not in seen
    # Hop-by-hop headers are the client's connection's: the container never sees them.
    hop = {"Connection": "close, x-hop", "Keep-Alive": "timeout=5", "X-Hop": "1", "X-End": "2"}
    lines = get(url + "/headers", {**auth_headers(token), **hop}).text.lower().splitlines()
    names = {line.split(":", 1)[0] for line in lines}
    assert "x-end" in names and not names & {"connection", "keep-alive", "x-hop"}, names

    # Streaming (chunked) responses and request bodies pass through.
    stream = httpx.get(url + "/stream", headers=auth_headers(token), timeout=30)
    assert stream.text == "chunk0\nchunk1\nchunk2\n"
    echo = httpx.post(url + "/echo", content=b"x" * 100_000, headers=auth_headers(token))
    assert echo.content == b"x" * 100_000


def test_rbac_scopes_tokens_to_their_environment(rt: EmulatorProcess) -> None:
    import modal

    modal.Environment.objects.create("other")
    url, _ = deploy_server(rt)
    elsewhere = proxy_token("other")
    assert get(url, auth_headers(elsewhere)).status_code == 401
    modal.Workspace.from_context().proxy_tokens.allow(elsewhere[0], "main")
    assert get(url, auth_headers(elsewhere)).status_code == 200


def test_unauthenticated_server_min_containers_and_fixed_port(rt: EmulatorProcess) -> None:
    # Something of the machine's own holds 127.0.0.1:8000 (when free): containers don't care.
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8000))
        holder.listen()
    except OSError:
        pass
    try:
        url, out = deploy_server(rt, unauth="1", min="2")
        assert "(unauthenticated)" in out
        aid = app_id(rt, "rt-server")

        def two_ready() -> list[dict[str, object]]:
            ready = [c for c in rt.live_containers(aid) if c["state"] == "ready"]
            return ready if len(ready) == 2 else []

        ready = wait_for(two_ready, 30, what="two min_containers ready without any request")
        answers = {get(url).text for _ in range(8)}
        assert answers == {f"hello from {c['task_id']}" for c in ready}  # both serve, port 8000
    finally:
        holder.close()


def test_scale_to_zero_and_cold_start_again(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1", scaledown="2")
    assert rt.containers() == []  # min_containers 0: nothing runs before a request
    assert get(url).status_code == 200
    aid = app_id(rt, "rt-server")
    wait_for(lambda: not rt.live_containers(aid), 20, what="the idle container to scale down")
    (stopped,) = [c for c in rt.containers() if c["app_id"] == aid]
    assert stopped["state"] == "stopped"
    again = get(url)
    assert again.status_code == 200 and stopped["task_id"] not in again.text


def test_max_concurrency_answers_429_at_max_containers(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1", conc="1", max="1")
    assert get(url).status_code == 200  # warm
    results: list[int] = []
    slow = threading.Thread(target=lambda: results.append(get(url + "/sleep?s=2").status_code))
    slow.start()
    wait_for(lambda: any(c["in_flight"] for c in rt.live_containers()), 10, what="the slow request")
    busy = get(url)
    slow.join()
    assert busy.status_code == 429 and "too many requests" in busy.text
    assert results == [200]
    assert get(url).status_code == 200  # a slot is free again


def test_startup_timeout_kills_the_container_and_fails_the_request(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1", fail="never-listen", startup="2")
    started = time.monotonic()
    resp = get(url)
    assert resp.status_code == 503
    assert "startup timeout" in resp.text
    assert 1.5 < time.monotonic() - started < 20
    aid = app_id(rt, "rt-server")
    wait_for(lambda: not rt.live_containers(aid), 10, what="the timed-out container to go")
    assert all(c["state"] == "failed" for c in rt.containers() if c["app_id"] == aid)


def test_enter_failure_is_a_503_and_shows_in_the_logs(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1", fail="enter")
    resp = get(url)
    assert resp.status_code == 503, resp.text
    logs = modal_cli(rt, "app", "logs", "rt-server").stdout
    assert "enter failed on purpose" in logs


def test_webhook_timeout_answers_303_then_the_result(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.emulator.runtime_support import runtime_emulator
    from tests.harness.fixtures import modal_env_for

    for emu in runtime_emulator(tmp_path_factory.mktemp("rt303"), webhook_timeout=1.0):
        modal_env_for(emu, monkeypatch)
        url, _ = deploy_server(emu, unauth="1")
        assert get(url).status_code == 200  # warm: the timeout is about the response only
        first = httpx.get(url + "/sleep?s=2.5", timeout=30)
        assert first.status_code == 303
        location = first.headers["location"]
        assert location.startswith("/sleep?s=2.5&__modal_function_call_id=fc-")
        second = httpx.get(url + location, timeout=30)  # waits up to 1 s more: 303 again
        final = second
        while final.status_code == 303:
            final = httpx.get(url + final.headers["location"], timeout=30)
        assert final.status_code == 200 and final.text == "slept"
        followed = httpx.get(url + "/sleep?s=1.5", timeout=30, follow_redirects=True)
        assert followed.status_code == 200 and followed.text == "slept"


def test_host_network_fallback_runs_one_container_per_fixed_port(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without network namespaces (`--container-network host`), port 8000 is the machine's."""
    from tests.emulator.runtime_support import runtime_emulator
    from tests.harness.fixtures import modal_env_for

    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", 8000))
    except OSError:
        pytest.skip("127.0.0.1:8000 is taken on this machine")
    finally:
        probe.close()
    for emu in runtime_emulator(tmp_path_factory.mktemp("rthost"), container_network="host"):
        modal_env_for(emu, monkeypatch)
        first, _ = deploy_server(emu, unauth="1", app="rt-host-a")
        assert get(first).status_code == 200
        (container,) = emu.live_containers()
        assert container["netns"] is False
        second, _ = deploy_server(emu, unauth="1", app="rt-host-b")
        refused = get(second)
        assert refused.status_code == 503 and "port 8000 is held by container" in refused.text
        assert len(emu.live_containers()) == 1
