"""Issue 22 item 6: an emulator killed mid-deploy, restarted on the same state file.

`modal deploy` of a small app is held inside AppPublish (a fault delays it: the app exists,
initializing, its functions created), the emulator is killed with -9 and started again on the
same state file and ports, while the deploying client still runs. Before, the app stayed
"initializing" (for the heartbeat timeout) and the surviving client's retried AppPublish
deployed it on the new process: an interrupted deploy came back as deployed. Now the
restart stops it (as Modal stops an app whose deploying client went away): the client's
deploy fails with a message that says to deploy again, no app is deployed under the name,
and a new deploy under the same name works at once.

What this does not cover (reported, not changed here): a deploy whose AppPublish had been
committed before the kill is a deployed app, on Modal as here; the App provider's create
then refuses it as unmanaged (components/modal/app.py `create`).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.emulator.helpers import MODAL_BIN, modal_cli
from tests.emulator.runtime_support import SERVER_APP, app_id, get, wait_for
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess


def _apps(emu: EmulatorProcess, name: str | None = None) -> list[dict[str, object]]:
    apps = emu.state()["apps"]
    return [a for a in apps if name is None or a["name"] == name or a["description"] == name]


def test_22_6_a_deploy_interrupted_by_a_kill_does_not_come_back_deployed(tmp_path: Path) -> None:
    emu = EmulatorProcess(state_path=tmp_path / "state.sqlite3", stop_grace=3.0).start()
    deploy: subprocess.Popen[str] | None = None
    try:
        emu._request(
            "POST",
            "/_emulator/faults",
            {"method": "AppPublish", "when": "before", "status": "NONE", "delay_s": 30},
        )
        deploy = subprocess.Popen(
            [MODAL_BIN, "deploy", SERVER_APP],
            env=emu.subprocess_env({"RT_UNAUTH": "1"}),
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for(
            lambda: emu.rpc_counts().get("AppPublish", 0) >= 1,
            60,
            what="the deploy to reach AppPublish",
        )
        (interrupted,) = [a for a in _apps(emu) if a["state"] == "initializing"]
        emu.kill()
        emu.start()  # same state file, same ports: the client's retries reach it
        assert deploy.wait(120) != 0  # the deploy failed (it did not come back deployed)
        out = deploy.stdout.read() if deploy.stdout else ""
        if emu.rpc_counts().get("AppPublish", 0):  # its retry reached the new process (a
            assert "deploy again" in out, out  # slow restart can outlast the client's retries)
        (after,) = [a for a in _apps(emu) if a["id"] == interrupted["id"]]
        assert after["state"] == "stopped"
        assert not [a for a in _apps(emu) if a["state"] in ("deployed", "initializing")]
        assert "stopped 1 app(s) whose deploy was in progress" in emu.stderr_tail(200)
        # A new deploy under the same name works at once, and serves.
        out = modal_cli(emu, "deploy", SERVER_APP, extra_env={"RT_UNAUTH": "1"}).stdout
        url = "http://" + out.split("http://", 1)[1].split()[0]
        assert app_id(emu, "rt-server") != interrupted["id"]
        started = time.monotonic()
        assert get(url).status_code == 200
        assert time.monotonic() - started < 60
    finally:
        if deploy is not None and deploy.poll() is None:
            deploy.kill()
            deploy.wait()
        emu.close()
