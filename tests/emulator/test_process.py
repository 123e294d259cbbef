"""The emulator as a process: auth, persistence across kill -9, clean SIGTERM, defaults."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import modal
import pytest
from modal.exception import AuthError
from modal_proto import api_pb2

from tests.emulator.helpers import modal_cli, raw_rpc
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.fixtures import modal_env_for


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
        before = emu.state()
        pid = emu.pid

        emu.kill()  # SIGKILL: no shutdown code runs
        assert not emu.alive
        emu.start()
        assert emu.pid != pid
        modal_env_for(emu, monkeypatch)  # drop the client connected to the dead process

        after = emu.state()
        for table in ("environments", "secrets", "volumes", "proxy_tokens", "apps"):
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
        assert emu.stop() == 0
    finally:
        emu.close()


def test_sigterm_stops_cleanly_with_default_state_file(tmp_path: Path) -> None:
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
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == ""  # exactly one line on stdout: the ready line
    assert "stopped cleanly" in err


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
