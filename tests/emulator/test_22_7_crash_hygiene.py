"""Issue 22 item 7: what an emulator crash leaves behind, and a state file whose structure
was changed by hand.

- A state file with a renamed column used to pass the start-up check (it compared table and
  index names only) and then failed every request touching that column (every edge request,
  for `web_urls`). The check now compares each table's and index's columns with the schema
  and refuses the file in one line, untouched.
- After a `kill -9` of the emulator, the processes its containers started in a new session
  (serving/engine.py's proxy and engine) survived with parent 1. Containers now have their own
  pid namespace where allowed (the kernel ends them with the emulator); without one, the
  runtime's ledger lets the next start (or `python -m emulator sweep`) kill them.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from emulator.runtime.containers import children_of
from emulator.runtime.netns import namespaces_supported
from tests.emulator.helpers import modal_cli
from tests.emulator.runtime_support import deploy_server, host_pid, pid_alive, wait_for
from tests.emulator.test_14_12_state_file import _assert_refused, _serve, _valid_state
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess


@pytest.mark.parametrize(
    ("statement", "needle"),
    [
        ("ALTER TABLE web_urls RENAME COLUMN function_id TO fn_id", "table web_urls"),
        ("ALTER TABLE apps RENAME COLUMN state TO app_state", "table apps"),
        ("ALTER TABLE secrets ADD COLUMN note TEXT", "unexpected column(s) note"),
    ],
)
def test_22_7_a_renamed_column_is_refused_at_start(
    tmp_path: Path, statement: str, needle: str
) -> None:
    state = tmp_path / "state.sqlite3"
    _valid_state(state)
    with sqlite3.connect(state) as db:
        db.execute(statement)
    db.close()
    before = state.read_bytes()
    line = _assert_refused(_serve(state, tmp_path), state, "damaged", "backup", needle)
    assert "structure" in line
    assert state.read_bytes() == before


# ---- container processes of a killed emulator ---------------------------------------------


def _tree(pid: int) -> set[int]:
    """`pid` and every process below it, now."""
    out = {pid}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child in children_of(parent):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _detached(emu: EmulatorProcess, task_id: str) -> int:
    """The pid (as the container sees it) of the `sleep` rt_server started in a new session."""

    def find() -> int | None:
        out = modal_cli(emu, "app", "logs", "rt-server", "--show-container-id").stdout
        for line in out.splitlines():
            if task_id in line and "detached pid " in line:
                return int(line.rsplit("detached pid ", 1)[1].split()[0])
        return None

    pid = wait_for(find, 30, what=f"the detached pid of {task_id}")
    assert pid is not None
    return pid


def _free_port() -> str:
    """A free port for rt_server on the host network (its own 8000 may be taken)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.mark.parametrize("network", ["netns", "host"])
def test_22_7_container_processes_die_with_a_killed_emulator(tmp_path: Path, network: str) -> None:
    """kill -9 of the emulator: every process of its containers ends within seconds, also
    the ones started in a new session (as serving/engine.py starts the proxy and the engine),
    which used to stay behind with parent 1, on either network."""
    if not namespaces_supported():
        pytest.skip("needs root and unshare (mount and pid namespaces)")
    emu = EmulatorProcess(
        state_path=tmp_path / "state.sqlite3", container_network=network, stop_grace=3.0
    ).start()
    try:
        deploy_server(emu, unauth="1", min="1", detached="1", port=_free_port())
        (container,) = wait_for(
            lambda: [c for c in emu.live_containers() if c["state"] == "ready"], 60, what="ready"
        )
        pid = int(str(container["pid"]))
        orphan = host_pid(pid, _detached(emu, str(container["task_id"])))
        processes = _tree(pid)
        assert orphan in processes
        emu.kill()
        wait_for(
            lambda: not [p for p in processes if pid_alive(p)],
            10,
            what="the container's processes to end with the emulator",
        )
    finally:
        emu.close()


def test_22_7_without_namespaces_the_next_start_kills_what_a_killed_emulator_left(
    tmp_path: Path,
) -> None:
    """Plain-process containers (no root: no pid namespace) can outlive a `kill -9` of the
    emulator; the runtime's ledger names them, and the next emulator start (or `python -m
    emulator sweep`, for `make down`) kills them."""
    # Its own temp dir (short: the containers' unix sockets live there, 108 bytes at most).
    scratch_root = Path(tempfile.mkdtemp(prefix="e22-"))
    emu = EmulatorProcess(
        state_path=tmp_path / "state.sqlite3",
        container_network="host",
        stop_grace=3.0,
        extra_args=["--no-container-namespaces"],
        env={"TMPDIR": str(scratch_root)},
    ).start()
    try:
        deploy_server(emu, unauth="1", min="1", detached="1", port=_free_port())
        (container,) = wait_for(
            lambda: [c for c in emu.live_containers() if c["state"] == "ready"], 60, what="ready"
        )
        orphan = _detached(emu, str(container["task_id"]))  # no pid namespace: a host pid
        assert pid_alive(orphan)
        ledger = next(scratch_root.glob("modal-emu-*")) / "processes"
        wait_for(lambda: f"{orphan} " in ledger.read_text(), 10, what="the ledger")
        emu.kill()
        time.sleep(1.0)
        assert pid_alive(orphan)  # the known limit without namespaces...
        swept = subprocess.run(
            [sys.executable, "-m", "emulator", "sweep"],
            cwd=PROJECT_ROOT,
            env={**os.environ, "TMPDIR": str(scratch_root), "PYTHONPATH": str(PROJECT_ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert "killed " in swept.stdout and "killed 0 " not in swept.stdout, swept.stdout
        wait_for(lambda: not pid_alive(orphan), 5, what="the orphan to be killed")
        assert not list(scratch_root.glob("modal-emu-*"))
    finally:
        emu.close()
        shutil.rmtree(scratch_root, ignore_errors=True)
