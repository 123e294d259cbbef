"""Deploy semantics and hygiene with real containers: no-op redeploy, rolling replace,
rollback, stop, crash and replace, volumes across containers, logs, SIGTERM.

Kept (issue 33 item 7): the release's rolling update, rollback and stop, and serving/app.py's
exit hook, run in these containers in the providers' and program's tests; modal 1.6.4
modal/runner.py `_deploy_app`, modal/cli/app.py `rollback`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from modal_proto import api_pb2

from tests.emulator.helpers import modal_cli, raw_stream
from tests.emulator.runtime_support import (
    app_id,
    deploy_server,
    get,
    group_pids,
    host_pid,
    pid_alive,
    runtime_emulator,
    wait_for,
)
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for


def _ready(emu: EmulatorProcess, aid: str, n: int = 1) -> list[dict[str, object]]:
    def check() -> list[dict[str, object]]:
        ready = [c for c in emu.live_containers(aid) if c["state"] == "ready"]
        return ready if len(ready) == n else []

    return wait_for(check, 30, what=f"{n} ready container(s) of {aid}")


def test_noop_redeploy_rolling_update_rollback_and_stop(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1", min="1")
    aid = app_id(rt, "rt-server")
    (first,) = _ready(rt, aid)
    assert get(url).text == f"hello from {first['task_id']}"

    # Same code again: AppPublish answers deployed_at == 0, the container is kept.
    _, out = deploy_server(rt, unauth="1", min="1")
    assert "Deployment skipped: no changes detected" in out
    time.sleep(1)
    assert [c["task_id"] for c in rt.live_containers(aid)] == [first["task_id"]]
    assert [a["version"] for a in rt.state()["apps"]] == [1]

    # A change replaces the container, rolling: requests sent throughout all succeed.
    statuses: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            statuses.append(get(url, timeout=30).status_code)
            time.sleep(0.02)

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        deploy_server(rt, unauth="1", min="1", message="v2")
        wait_for(lambda: get(url).text.startswith("v2 from "), 30, what="v2 answering")
        wait_for(lambda: len(rt.live_containers(aid)) == 1, 30, what="the old container to go")
    finally:
        stop.set()
        thread.join()
    assert statuses and set(statuses) == {200}, statuses
    by_id = {c["task_id"]: c for c in rt.containers()}
    old = by_id[first["task_id"]]
    (new,) = rt.live_containers(aid)
    assert old["state"] == "stopped"
    assert new["ready_at"] <= old["stopped_at"]  # the new one served before the old one left

    # Rollback runs the previous version again; stop ends everything and the URL.
    modal_cli(rt, "app", "rollback", "rt-server", "v1")
    wait_for(lambda: get(url).text.startswith("hello from "), 30, what="v1 answering again")
    modal_cli(rt, "app", "stop", "rt-server", "-y")
    wait_for(lambda: not rt.live_containers(aid), 20, what="every container to stop")
    gone = get(url)
    assert gone.status_code == 404
    assert "app for invoked web endpoint is stopped" in gone.text


def test_a_killed_container_is_replaced_and_leaves_no_process(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1", min="1")
    aid = app_id(rt, "rt-server")
    (first,) = _ready(rt, aid)
    pid = int(str(first["pid"]))
    members = group_pids(pid)
    assert len(members) >= 2, members  # the entrypoint and the web server it started
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) for p in members), 10, what="the killed group to go")
    (second,) = _ready(rt, aid)
    assert second["task_id"] != first["task_id"]
    assert get(url).text == f"hello from {second['task_id']}"
    crashed = next(c for c in rt.containers() if c["task_id"] == first["task_id"])
    assert crashed["state"] == "failed" and "exited unexpectedly" in str(crashed["failure"])


def test_processes_started_in_a_new_session_die_with_their_container(rt: EmulatorProcess) -> None:
    """A process the container started with `start_new_session=True` (serving/engine.py does
    this for its proxy and engine) is outside the container's process group; it ends with the
    container (its pid namespace, and its network namespace is swept too), after a `kill -9`
    of the container as after `modal app stop`. The container prints its pid as it sees it
    (its own pid namespace): `host_pid` finds the machine's."""

    def detached_pid(task_id: str) -> int:
        def find() -> int | None:
            out = modal_cli(rt, "app", "logs", "rt-server", "--show-container-id").stdout
            for line in out.splitlines():
                if task_id in line and "detached pid " in line:
                    return int(line.rsplit("detached pid ", 1)[1].split()[0])
            return None

        pid = wait_for(find, 30, what=f"the detached pid of {task_id}")
        assert pid is not None
        return pid

    deploy_server(rt, unauth="1", min="1", detached="1")
    aid = app_id(rt, "rt-server")
    (first,) = _ready(rt, aid)
    if not first.get("netns"):
        pytest.skip("containers run on the host network here: nothing to sweep by namespace")
    orphan = host_pid(int(str(first["pid"])), detached_pid(str(first["task_id"])))
    assert pid_alive(orphan) and orphan not in group_pids(int(str(first["pid"])))
    os.kill(int(str(first["pid"])), signal.SIGKILL)
    wait_for(lambda: not pid_alive(orphan), 10, what="the detached process of a killed container")

    # The replacement, not the killed one still listed as ready for a moment (its pid gone,
    # host_pid would have nothing to map through).
    def replacement() -> dict[str, object] | None:
        ready = [c for c in rt.live_containers(aid) if c["state"] == "ready"]
        return next((c for c in ready if c["task_id"] != first["task_id"]), None)

    second = wait_for(replacement, 30, what="the killed container's replacement")
    assert second is not None
    orphan = host_pid(int(str(second["pid"])), detached_pid(str(second["task_id"])))
    modal_cli(rt, "app", "stop", "rt-server", "-y")
    wait_for(lambda: not pid_alive(orphan), 20, what="the detached process of a stopped app")


def test_volume_writes_persist_into_the_next_container(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1")
    assert get(url).status_code == 200
    import httpx

    assert httpx.post(url + "/write?name=note", content=b"kept", timeout=30).status_code == 200
    modal_cli(rt, "app", "stop", "rt-server", "-y")
    url2, _ = deploy_server(rt, unauth="1")  # a new app, a new container, the same volume
    assert url2 == url  # the endpoint keeps its URL across apps of the same name
    assert get(url + "/read?name=note").text == "kept"


def test_logs_carry_app_function_and_container_ids(rt: EmulatorProcess) -> None:
    url, _ = deploy_server(rt, unauth="1")
    aid = app_id(rt, "rt-server")
    assert get(url).status_code == 200
    (container,) = rt.live_containers(aid)
    out = modal_cli(
        rt, "app", "logs", "rt-server", "--show-container-id", "--show-function-id"
    ).stdout
    line = next(line for line in out.splitlines() if "starting web server in /root" in line)
    assert container["task_id"] in line and container["function_id"] in line
    batches = raw_stream(
        "AppGetLogs", api_pb2.AppGetLogsRequest(app_id=aid, timeout=1, last_entry_id="")
    )
    texts = [(b.task_id, b.function_id, i.data) for b in batches for i in b.items]
    assert (container["task_id"], container["function_id"], 'web: "GET / HTTP/1.1" 200 -\n') in (
        texts
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_runs_exit_hooks_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    for emu in runtime_emulator(tmp_path):
        modal_env_for(emu, monkeypatch)
        deploy_server(emu, unauth="1", min="2", exit_marker="1")
        aid = app_id(emu, "rt-server")
        ready = _ready(emu, aid, 2)
        members = [p for c in ready for p in group_pids(int(str(c["pid"])))]
        assert len(members) >= 4
        assert emu.pid is not None
        os.kill(emu.pid, sig)
        deadline = time.monotonic() + 30
        while emu.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert emu.stop() == 0  # already exited: its exit code
        assert not [p for p in members if pid_alive(p)]
        (volume_dir,) = (tmp_path / "state.sqlite3.d" / "volumes").iterdir()
        markers = sorted(p.name for p in volume_dir.glob("exit-*"))
        assert markers == sorted(f"exit-{c['task_id']}" for c in ready)  # @modal.exit ran


def test_a_restart_keeps_urls_and_brings_min_containers_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for emu in runtime_emulator(tmp_path):
        modal_env_for(emu, monkeypatch)
        url, _ = deploy_server(emu, unauth="1", min="1")
        aid = app_id(emu, "rt-server")
        (before,) = _ready(emu, aid)
        listed = json.loads(modal_cli(emu, "app", "list", "--json").stdout)
        assert [(a["app_id"], a["tasks"]) for a in listed] == [(aid, "1")]
        emu.restart()
        (after,) = _ready(emu, aid)  # min_containers is honoured again after the restart
        assert after["task_id"] != before["task_id"]
        assert emu.edge_url("emu-workspace--rt-server-web") == url  # the same port
        assert get(url).text == f"hello from {after['task_id']}"
