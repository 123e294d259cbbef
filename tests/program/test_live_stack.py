"""The path a user (and CI) takes, end to end: `make up`, curl, rotate a key, `make down`.

No Pulumi CLI here, so `make up` takes the stand-in engine (one banner line says so), starts
the emulator, deploys the local stack, and only returns once a chat completion answered 200
through the emulator's edge. The endpoint is our real serving container (serving/app.py:
the auth proxy, the stand-in engine beside it, readiness and warm-up, key digests from the
Modal secret) running in the emulator's runtime. Tests run in file order on one stack.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.program.live_stack import LiveStack, live_stack
from tests.program.runner import PROJECT_ROOT
from tests.providers.helpers import mutating_calls

pytestmark = pytest.mark.slow
__all__ = ["live_stack"]
ROTATION = 'apiKeyRotation={"gateway": "2026-12-01"}'


def post(
    url: str, headers: dict[str, str], body: dict[str, Any] | None = None
) -> tuple[int, str, str]:
    """(status, content type, body text) of a chat completion POST."""
    payload = body or {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 6,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def creds(outputs: dict[str, Any], key: str | None) -> dict[str, str]:
    headers = {
        "Modal-Key": outputs["proxy_token_id"],
        "Modal-Secret": outputs["proxy_token_secret"],
    }
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def test_make_up_prints_a_curl_that_answers(live_stack: LiveStack) -> None:
    out = live_stack.up_output
    banner = [line for line in out.splitlines() if "Pulumi stand-in" in line]
    assert len(banner) == 1 and "NOT the Pulumi engine" in banner[0]
    assert "Resources: + 9 created" in out
    outputs = live_stack.outputs()
    endpoint = outputs["endpoint_url"]
    assert endpoint.startswith("http://127.0.0.1:")
    assert f"Service tiny: {endpoint} answers through the edge" in out
    # The printed curl is copy-paste: run it as printed, it answers 200 with the stand-in text.
    curl = out[out.index("curl -sS") : out.index("-w '\\nHTTP %{http_code}\\n'") + 26]
    again = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
    assert again.stdout.rstrip().endswith("HTTP 200"), again.stdout + again.stderr
    answer = json.loads(again.stdout.rstrip().rsplit("\n", 1)[0])
    assert "[stand-in engine]" in answer["choices"][0]["message"]["content"]
    assert out.rstrip().splitlines()[-3].endswith("HTTP 200")  # make up printed that answer


def test_each_credential_is_checked_where_modal_and_our_proxy_check_it(
    live_stack: LiveStack,
) -> None:
    outputs = live_stack.outputs()
    url, key = outputs["endpoint_url"], outputs["api_keys"]["gateway"]

    # No proxy token: Modal's edge (the emulator's) refuses before any container sees it.
    status, _, text = post(url, {"Authorization": f"Bearer {key}"})
    assert (status, text.strip()) == (
        401,
        "modal-http: missing credentials for proxy authorization",
    )
    # Proxy token right, API key wrong: our proxy (in the container) answers 403.
    status, _, text = post(url, creds(outputs, "sk-not-a-key"))
    assert status == 403 and json.loads(text)["error"]["code"] == "invalid_api_key"
    # Proxy token right, no API key: 401 from our proxy, not the edge.
    status, _, text = post(url, creds(outputs, None))
    assert status == 401 and json.loads(text)["error"]["code"] == "missing_api_key"
    # Both right, not streamed: 200 with a well-formed head (one Content-Length: aiohttp, and
    # so LiteLLM, rejects a response that repeats it, even with the same value).
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(
            {"model": outputs["served_model_name"], "messages": [{"role": "user", "content": "Hi"}]}
        ),
        headers={"Content-Type": "application/json", **creds(outputs, key)},
    )
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    assert resp.status == 200, data
    assert resp.msg.get_all("content-length") == [str(len(data))]
    # Both right, streamed: 200, tokens as server-sent events, usage at the end, then [DONE].
    body = {
        "model": outputs["served_model_name"],
        "messages": [{"role": "user", "content": "Stream please"}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, ctype, text = post(url, creds(outputs, key), body)
    assert status == 200 and ctype.startswith("text/event-stream"), text
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([t for t in tokens if t]) == 5
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_make_up_again_changes_nothing(live_stack: LiveStack) -> None:
    before = live_stack.rpc_counts()
    again = live_stack.up()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reusing it" in again.stdout and "Resources: 9 unchanged" in again.stdout
    assert again.stdout.rstrip().splitlines()[-3].endswith("HTTP 200")
    assert mutating_calls(before, live_stack.rpc_counts()) == {}


def test_rotating_a_key_revokes_the_old_one_live(live_stack: LiveStack) -> None:
    old = live_stack.outputs()
    rotated = live_stack.standin("up", "--config", ROTATION)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    # Issue 22.13: a one-run value says that the next plain `up` undoes it, and how to keep it.
    assert "--config modal-llm:apiKeyRotation is for this run only" in rotated.stdout
    assert "pulumi config set --path apiKeyRotation.gateway 2026-12-01" in rotated.stdout
    assert "Resources: ~ 2 updated, +- 1 replaced, 6 unchanged" in rotated.stdout
    new = live_stack.outputs()
    old_key, new_key = old["api_keys"]["gateway"], new["api_keys"]["gateway"]
    assert new_key != old_key and new["api_keys"]["dev"] == old["api_keys"]["dev"]
    url = new["endpoint_url"]
    assert url == old["endpoint_url"]

    # The changed definition replaces the container (rolling): wait until the old key is out.
    deadline = time.monotonic() + 90
    while (status := post(url, creds(new, old_key))[0]) != 403 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status == 403
    assert post(url, creds(new, new_key))[0] == 200
    assert post(url, creds(new, new["api_keys"]["dev"]))[0] == 200  # the other key still works


def test_22_12_make_up_rewrites_the_gateway_file_with_the_live_keys(live_stack: LiveStack) -> None:
    """The gateway file never keeps a revoked key: `make up` rewrites it when it exists. Also
    what issue 22.13's warning says: the plain `make up` after a one-run rotation rotates back
    (the stack file has no rotation marker), so the key changes again."""
    gateway_file = Path(live_stack.env["GATEWAY_FILE"])
    written = subprocess.run(
        [".venv/bin/python", "scripts/gateway_config.py", "--engine", "standin",
         "--state", str(live_stack.home / "standin.json"), "--out", str(gateway_file)],
        cwd=PROJECT_ROOT, env=live_stack.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    before = yaml.safe_load(gateway_file.read_text())
    old_key = before["model_list"][0]["litellm_params"]["api_key"]
    once = live_stack.standin("up", "--config", 'apiKeyRotation={"gateway": "2026-12-22"}')
    assert once.returncode == 0, once.stdout + once.stderr
    rotated_key = live_stack.outputs()["api_keys"]["gateway"]
    assert rotated_key != old_key

    again = live_stack.up()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "+- 1 replaced" in again.stdout, again.stdout  # the key, rotated back
    assert "rewritten with the stack's current keys" in again.stdout
    after = yaml.safe_load(gateway_file.read_text())
    new_key = live_stack.outputs()["api_keys"]["gateway"]
    assert new_key not in (old_key, rotated_key)
    assert after["model_list"][0]["litellm_params"]["api_key"] == new_key
    assert old_key not in gateway_file.read_text()
    assert rotated_key not in gateway_file.read_text()
    assert after["general_settings"]["master_key"] == before["general_settings"]["master_key"]


def test_make_down_leaves_no_process_and_no_state(live_stack: LiveStack) -> None:
    pid = live_stack.emulator_pid()
    assert pid is not None and Path(f"/proc/{pid}").exists()
    netns = live_stack.container_netns()
    assert netns  # the serving container is running
    since = live_stack.clock_ticks()
    down = live_stack.down()
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Resources: - 9 deleted" in down.stdout
    assert f"Modal emulator (pid {pid}) stopped." in down.stdout
    assert live_stack.processes_left(netns, started_before=since) == []
    emulator_dir = live_stack.home / "emulator"
    assert sorted(p.name for p in emulator_dir.iterdir()) == ["emulator.log"]
    assert '"resources": []' in (live_stack.home / "standin.json").read_text().replace("\n", "")
