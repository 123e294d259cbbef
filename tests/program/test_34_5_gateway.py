"""Issue 34 item 5: the gateway `make gateway` starts is owned like the emulator is.

Before: `make gateway` ran LiteLLM in the foreground with no pid file; `make down` left it
running (it then answered HTTP 500 to a host that was gone), and after a key rotation it kept
the revoked key (403) until restarted by hand. Now (scripts/gateway.sh): `make gateway` starts
it in the background and returns once it answers; `make up` restarts it when it rewrote the
gateway file; `make down` stops it. All on the live local stack, as a user runs it.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.program.gateway_chain import free_port
from tests.program.live_stack import LiveStack, live_stack

pytestmark = [pytest.mark.litellm, pytest.mark.slow]
__all__ = ["live_stack"]


def _chat(base: str, gateway_file: Path, model: str) -> int:
    master_key = yaml.safe_load(gateway_file.read_text())["general_settings"]["master_key"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        f"{base}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {master_key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(900)
def test_34_5_make_gateway_is_restarted_by_make_up_and_stopped_by_make_down(
    live_stack: LiveStack,
) -> None:
    port = free_port()
    env = {**live_stack.env, "GATEWAY_PORT": str(port)}
    gateway_file = Path(env["GATEWAY_FILE"])
    pid_file = gateway_file.with_suffix(".pid")
    base = f"http://127.0.0.1:{port}"
    model = live_stack.outputs()["served_model_name"]
    pid = 0
    try:
        started = live_stack.make("gateway", timeout=240, env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"answers on {base}" in started.stdout
        pid = int(pid_file.read_text().split()[0])
        assert _chat(base, gateway_file, model) == 200

        # A rotation behind the gateway's back: the key it holds is revoked.
        rotated = live_stack.standin("up", "--config", 'apiKeyRotation={"gateway": "2026-12-23"}')
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        assert _chat(base, gateway_file, model) != 200

        # `make up` (the stack file's rotation again: the key changes back) rewrites the file
        # and restarts the running gateway on the port it was started on.
        again = live_stack.up()
        assert again.returncode == 0, again.stdout + again.stderr
        assert "gateway: restarted with the stack's current keys" in again.stdout
        new_pid = int(pid_file.read_text().split()[0])
        assert new_pid != pid
        pid = new_pid
        assert _chat(base, gateway_file, model) == 200
    finally:
        down = live_stack.down()
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"gateway: stopped LiteLLM (pid {pid}" in down.stdout
    assert not Path(f"/proc/{pid}").exists()
    assert not pid_file.exists()
    assert not _listening(port)
