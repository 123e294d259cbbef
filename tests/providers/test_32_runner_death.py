"""Issue 32 item 11: a deploy runner holding the Modal token dies with its parent.

kill -9 of whatever ran the provider (the engine, the stand-in, the provider server) used to
leave `components.modal._deploy_runner` re-parented to PID 1 for as long as its deploy took,
with MODAL_TOKEN_SECRET in its environment and the spec file in the temp directory. Here a
real App create runs through the SDK's provider server against the emulator; the emulator
holds the deploy's `AppPublish` for 30 s, so the runner is certainly mid-deploy when its
parent (the provider server) is killed with SIGKILL. The emulator has a token secret of its
own, so scanning /proc for it finds only this test's processes (other runs use the default).
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.modal.app import AppProvider
from components.modal.model_weights import ModelWeightsProvider
from components.modal.volume import VolumeProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import ProviderCallError, ProviderServer
from tests.providers.helpers import server_env
from tests.providers.test_app import inputs

pytestmark = pytest.mark.slow


@pytest.fixture
def emulator() -> Iterator[EmulatorProcess]:
    """An emulator whose token secret no other process knows."""
    emu = EmulatorProcess(token_secret=f"runner-death-{secrets.token_hex(12)}").start()
    try:
        yield emu
    finally:
        emu.close()


def _procs() -> dict[int, tuple[int, str, str]]:
    """{pid: (ppid, state, cmdline)} of every process this user can see."""
    out: dict[int, tuple[int, str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (int(fields[1]), fields[0], cmd)
    return out


def _holding(secret: str) -> set[int]:
    """Pids whose environment holds `secret` (those this user may read)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if secret.encode() in environ:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    state = _procs().get(pid)
    return state is not None and state[1] != "Z"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
    return {k: v for k, v in pairs}


def _kill_parent_mid_run(
    emulator: EmulatorProcess,
    provider: object,
    props: dict[str, Any],
    module: str,
    hold_rpc: str,
    file_env: str | None,
    file_arg: str | None,
    volume: str = "",
) -> None:
    secret = emulator.token_secret or ""
    assert secret
    baseline = _holding(secret)
    srv = ProviderServer(env=server_env(emulator)).start()
    if volume:
        srv.create(VolumeProvider(), {"name": volume, "environment": "main"})
    emulator._request(
        "POST",
        "/_emulator/faults",
        {"method": hold_rpc, "when": "before", "status": "NONE", "delay_s": 30, "count": 1},
    )
    errors: list[BaseException] = []

    def create() -> None:
        try:
            srv.create(provider, props)  # type: ignore[arg-type]
        except (ProviderCallError, Exception) as e:  # the server is killed under it
            errors.append(e)

    caller = threading.Thread(target=create, daemon=True)
    caller.start()
    try:
        server_pid = srv._proc.pid  # type: ignore[union-attr]
        runner = 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not runner:
            runner = next(
                (p for p, (pp, _, cmd) in _procs().items() if pp == server_pid and module in cmd),
                0,
            )
            time.sleep(0.05)
        assert runner, f"no {module} process started under the provider server"
        env = _environ(runner)
        assert env.get("MODAL_TOKEN_SECRET") == secret  # what it holds: the reason for item 11
        held = ""
        if file_env:
            held = env[file_env]
        else:
            argv = (Path(f"/proc/{runner}/cmdline").read_bytes()).split(b"\0")
            held = argv[argv.index(str(file_arg).encode()) + 1].decode()
        assert Path(held).exists()
        # Wait until the runner is inside the held RPC (its deploy is under way).
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not emulator.rpc_counts().get(hold_rpc):
            time.sleep(0.1)
        assert emulator.rpc_counts().get(hold_rpc), f"the runner never reached {hold_rpc}"
        time.sleep(0.5)
        assert _alive(runner)
        os.kill(server_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while _alive(runner) and time.monotonic() - killed_at < 2.0:
            time.sleep(0.05)
        assert not _alive(runner), (
            f"{module} (pid {runner}) still runs {time.monotonic() - killed_at:.1f}s after its"
            f" parent was killed, re-parented to {_procs().get(runner, (0,))[0]}"
        )
        while Path(held).exists() and time.monotonic() - killed_at < 2.0:
            time.sleep(0.05)
        assert not Path(held).exists(), f"{held} left behind after the runner's parent died"
        assert not Path(held).parent.exists(), f"{Path(held).parent} left behind"
        leaked = _holding(secret) - baseline - {os.getpid()}
        assert not leaked, {p: _procs().get(p) for p in leaked}
    finally:
        srv.close()
        caller.join(timeout=10)
        emulator._request("POST", "/_emulator/faults", {"clear": True})


def test_32_11_app_deploy_runner_dies_with_its_parent(emulator: EmulatorProcess) -> None:
    _kill_parent_mid_run(
        emulator,
        AppProvider(),
        inputs(),
        "components.modal._deploy_runner",
        "AppPublish",
        "SERVING_SPEC",
        None,
    )


def test_32_11_weights_runner_dies_with_its_parent(emulator: EmulatorProcess) -> None:
    props: dict[str, Any] = {
        "app_name": "tiny-weights",
        "environment": "main",
        "volume": "tiny-weights",
        "source": {
            "kind": "hf",
            "repo": "acme/tiny",
            "revision": "0" * 40,
            "endpoint": "http://127.0.0.1:9",
        },
        "secrets": [],
    }
    _kill_parent_mid_run(
        emulator,
        ModelWeightsProvider(),
        props,
        "components.modal.model_weights",
        "AppPublish",
        None,
        "--source",
        volume="tiny-weights",
    )
