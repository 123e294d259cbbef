"""The emulator as a process: auth, persistence across kill -9, clean SIGTERM, defaults.

Kept (issue 33 item 7): as the developer flow: `make up` / `make down` start, restart and stop
it on one state file; the product's tests read the control surface's RPC counts and reset
(`rpc_counts()`, `reset()`), e.g. that a no-op `up` makes no mutating call.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import modal
import pytest
from modal.exception import AuthError
from modal_proto import api_pb2

from emulator.store import TABLES
from tests.emulator.helpers import APPS_DIR, modal_cli, raw_rpc
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.fixtures import modal_env_for

SERVER_APP = str(APPS_DIR / "server_app.py")


def test_wrong_token_is_auth_error(
    emulator: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = emulator.client_env(token_secret="as-wrongwrongwrongwrongwr")
    for key, value in bad.items():
        monkeypatch.setenv(key, value)
    from tests.harness.fixtures import reset_modal_client_caches

    reset_modal_client_caches()
    try:
        with pytest.raises(AuthError, match="Invalid or missing token"):
            modal.Secret.objects.list()
    finally:
        reset_modal_client_caches()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("modal")), "secret", "list"],
        env={**emulator.subprocess_env(), **bad},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "Invalid or missing token" in proc.stdout + proc.stderr
    assert emulator.state()["secrets"] == []


def test_state_survives_kill_9_and_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state_file = tmp_path / "state.sqlite3"
    emu = EmulatorProcess(state_path=state_file).start()
    try:
        modal_env_for(emu, monkeypatch)
        modal.Environment.objects.create("prod")
        modal.Secret.objects.create("llm", {"HF_TOKEN": "x"}, environment_name="prod")
        modal.Secret.objects.create("hf-secret", {"HF_TOKEN": "x"})
        modal.Volume.objects.create("models", environment_name="prod")
        token = modal.Workspace.from_context().proxy_tokens.create("edge")
        modal.Workspace.from_context().proxy_tokens.allow(token.token_id, "prod")
        app_id = modal.App.lookup("kept", create_if_missing=True).app_id
        env_id = raw_rpc(
            "EnvironmentGetOrCreate", api_pb2.EnvironmentGetOrCreateRequest(deployment_name="prod")
        ).environment_id
        raw_rpc(
            "EnvironmentSetBudget",
            api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, cycle_budget_dollars=20),
        )
        emu.set_usage("prod", 25.0)
        modal_cli(emu, "deploy", SERVER_APP)  # images, mounts, files, functions, versions
        raw_rpc("ClassCreate", api_pb2.ClassCreateRequest(app_id=app_id or ""))
        raw_rpc("BlobCreate", api_pb2.BlobCreateRequest(content_length=3))
        ws = modal.Workspace.from_context()  # service users, their roles, a retired token
        ws.service_users.create("watcher", expires_in=None)
        ws.service_users.set_role("watcher", "prod", role="viewer")
        ws.service_users.create("rotated", expires_in=None)
        ws.service_users.delete("rotated")
        before = emu.state()
        pid = emu.pid

        emu.kill()  # SIGKILL: no shutdown code runs
        assert not emu.alive
        emu.start()
        assert emu.pid != pid
        modal_env_for(emu, monkeypatch)  # drop the client connected to the dead process

        after = emu.state()
        assert set(after) == set(before) == {"workspace", *TABLES}
        for table in TABLES:
            assert before[table], f"{table} is empty: the test would not show it persists"
            assert after[table] == before[table], table
        assert [s.name for s in modal.Secret.objects.list(environment_name="prod")] == ["llm"]
        assert [v.name for v in modal.Volume.objects.list(environment_name="prod")] == ["models"]
        scoped = modal.Workspace.from_context().proxy_tokens.list(environment_name="prod")
        assert [t.token_id for t in scoped] == [token.token_id]
        assert modal.App.lookup("kept").app_id == app_id
        budget = raw_rpc(
            "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
        )
        assert (budget.cycle_budget_dollars, budget.spend_limit_reached) == (20.0, True)
        # Built images and uploaded files survived too: a redeploy builds and uploads nothing.
        counts = emu.rpc_counts()
        modal_cli(emu, "deploy", SERVER_APP)
        delta = {k: v - counts.get(k, 0) for k, v in emu.rpc_counts().items()}
        assert delta["AppPublish"] == 1
        for method in ("ImageJoinStreaming", "MountPutFile", "BlobCreate", "AppCreate"):
            assert not delta.get(method), (method, delta)
        assert emu.stop() == 0
    finally:
        emu.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_with_default_state_file(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulator", "serve", "--port", "0"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("MODAL EMULATOR READY grpc=http://127.0.0.1:"), ready
        default_state = tmp_path / ".modal-emulator" / "state.sqlite3"
        assert f"state={default_state.relative_to(tmp_path)}" in ready
        assert default_state.exists()
        proc.send_signal(sig)  # SIGINT is what Ctrl-C sends
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == ""  # exactly one line on stdout: the ready line
    assert "stopped cleanly" in err
    assert "Traceback" not in err


def _serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m emulator serve ARGS` expected to exit on its own (a refused start)."""
    return subprocess.run(
        [sys.executable, "-m", "emulator", "serve", *args],
        cwd=cwd,
        env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_taken_port_is_a_clear_error_and_releases_everything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = tmp_path / "s.sqlite3"
        proc = _serve("--port", str(port), "--http-port", "0", "--state", str(state), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1 (gRPC port {port}" in proc.stderr
    assert "Traceback" not in proc.stderr and "Server is not started" not in proc.stderr
    assert proc.stdout == ""  # no ready line
    # The store was closed and its lock released: the same state file starts fine now.
    with EmulatorProcess(state_path=state) as emu:
        assert emu.state()["environments"][0]["name"] == "main"


def test_second_process_on_one_state_file_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "s.sqlite3"
    with EmulatorProcess(state_path=state) as first:
        proc = _serve("--port", "0", "--state", str(state), cwd=tmp_path)
        assert proc.returncode == 1
        assert f"State file {state} is in use by emulator pid {first.pid}" in proc.stderr
        assert "--memory" in proc.stderr
        assert first.state()["environments"]  # the first one still answers


def test_missing_token_is_refused(emulator: EmulatorProcess) -> None:
    assert emulator.client_env(token_id="")["MODAL_TOKEN_ID"] == ""  # "" is handed out as is
    missing = emulator.client_env(token_id=None)
    assert "MODAL_TOKEN_ID" not in missing and missing["MODAL_TOKEN_SECRET"]
    env = {k: v for k, v in emulator.subprocess_env().items() if k != "MODAL_TOKEN_ID"}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("modal")), "secret", "list"],
        env={**env, **missing},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout
    assert "Token missing" in proc.stdout + proc.stderr  # the client refuses before any call
    assert emulator.rpc_counts() == {}
    # The emulator itself refuses a call without credentials (the client never sends one).
    err = raw_grpc_status(emulator, "SecretList", api_pb2.SecretListRequest(), metadata={})
    assert err == "UNAUTHENTICATED"


def test_control_surface_counts_and_reset(emulator: EmulatorProcess) -> None:
    modal_cli(emulator, "environment", "create", "staging")
    counts = emulator.rpc_counts()
    assert counts == {"EnvironmentCreate": 1}
    assert [e["name"] for e in emulator.state()["environments"]] == ["main", "staging"]
    emulator.reset()
    assert emulator.rpc_counts() == {}
    state = emulator.state()
    assert [e["name"] for e in state["environments"]] == ["main"]
    assert state["workspace"] == "emu-workspace"
    assert json.dumps(state)  # JSON-serializable as served
    with pytest.raises(Exception, match="404"):
        emulator._request("GET", "/_emulator/nope")
    with pytest.raises(Exception, match="not found"):
        emulator.set_usage("ghost", 1.0)


def test_restart_keeps_url_and_state(tmp_path: Path) -> None:
    emu = EmulatorProcess(state_path=tmp_path / "s.sqlite3")
    emu.start()
    try:
        url = emu.url
        emu.set_usage("main", 3.0)
        assert emu.restart() is emu
        assert emu.url == url  # auto-picked ports are reused on restart
        (env,) = emu.state()["environments"]
        assert env["usage_usd"] == 3.0
        assert emu.stop() == 0
    finally:
        emu.close()


def raw_grpc_status(
    emu: EmulatorProcess, method: str, request: Any, metadata: dict[str, str]
) -> str:
    """Call `method` over a plain grpclib channel with exactly `metadata`; the status name."""
    from grpclib import GRPCError
    from grpclib.client import Channel
    from modal_proto.api_grpc import ModalClientStub

    async def run() -> str:
        channel = Channel("127.0.0.1", emu.port)
        try:
            await getattr(ModalClientStub(channel), method)(request, metadata=metadata, timeout=10)
        except GRPCError as exc:
            return str(exc.status.name)
        finally:
            channel.close()
        return "OK"

    return asyncio.run(run())


def test_control_surface_requires_the_token(emulator: EmulatorProcess) -> None:
    def call(method: str, path: str, headers: dict[str, str]) -> int:
        req = urllib.request.Request(
            emulator.control_url + path, data=b"{}" if method == "POST" else None, method=method
        )
        for key, value in headers.items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    wrong = {"Authorization": f"Bearer {emulator.token_id}:as-wrong"}
    for headers in ({}, wrong):
        assert call("POST", "/_emulator/reset", headers) == 401
        assert call("GET", "/_emulator/state", headers) == 401
    assert emulator.rpc_counts() == {}  # the harness sends the token
    assert call("GET", "/_emulator/health", {}) == 200
    assert call("GET", "/_emulator/state", emulator.control_headers()) == 200
    with EmulatorProcess(token_id=None, token_secret=None) as open_emu:  # no token: no auth
        assert open_emu.control_headers() == {}
        assert open_emu.state()["environments"]
