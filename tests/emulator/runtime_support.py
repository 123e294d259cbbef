"""Shared pieces of the runtime tests: an emulator that runs containers, deploys, waits."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.emulator.helpers import APPS_DIR, modal_cli
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for

SERVER_APP = str(APPS_DIR / "rt_server.py")
FUNCS_APP = str(APPS_DIR / "rt_funcs.py")

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> T:
    """Poll until `predicate()` is truthy; its value. AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what or predicate}: {last!r}")


def runtime_emulator(tmp: Path, **kwargs: Any) -> Iterator[EmulatorProcess]:
    """An emulator with a state file under `tmp` (volumes live next to it), stopped after."""
    emu = EmulatorProcess(state_path=tmp / "state.sqlite3", stop_grace=3.0, **kwargs).start()
    try:
        yield emu
    finally:
        emu.close()


@pytest.fixture(scope="module")
def rt_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    yield from runtime_emulator(tmp_path_factory.mktemp("rt"))


@pytest.fixture
def rt(rt_emulator: EmulatorProcess, monkeypatch: pytest.MonkeyPatch) -> EmulatorProcess:
    """The module's runtime emulator, reset (its containers are stopped), SDK pointed at it."""
    if not rt_emulator.alive:
        rt_emulator.start()
    rt_emulator.reset()
    wait_for(lambda: not rt_emulator.live_containers(), 20, what="containers of the last test")
    return modal_env_for(rt_emulator, monkeypatch)


def deploy_server(emu: EmulatorProcess, **knobs: str) -> tuple[str, str]:
    """`modal deploy rt_server.py` with RT_* knobs; (the URL it printed, stdout)."""
    env = {f"RT_{k.upper()}": v for k, v in knobs.items()}
    out = modal_cli(emu, "deploy", SERVER_APP, extra_env=env).stdout
    lines = [line for line in out.splitlines() if "http://127.0.0.1:" in line]
    assert lines, out
    url = "http://" + lines[0].split("http://", 1)[1].split()[0]
    return url, out


def app_id(emu: EmulatorProcess, name: str) -> str:
    apps = [a for a in emu.state()["apps"] if a["name"] == name and a["state"] == "deployed"]
    assert len(apps) == 1, emu.state()["apps"]
    return str(apps[0]["id"])


def proxy_token(environment: str = "main") -> tuple[str, str]:
    """A proxy-auth token allowed in `environment` (the fixtures' emulator runs --rbac)."""
    import modal

    tokens = modal.Workspace.from_context().proxy_tokens
    created = tokens.create("rt-test")
    tokens.allow(created.token_id, environment)
    return created.token_id, created.token_secret


def auth_headers(token: tuple[str, str]) -> dict[str, str]:
    return {"Modal-Key": token[0], "Modal-Secret": token[1]}


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> httpx.Response:
    return httpx.get(url, headers=headers, timeout=timeout)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return sorted(out)


def host_pid(container_pid: int, pid: int) -> int:
    """The machine's pid of process `pid` as the container sees it. A container in its own
    pid namespace (the default as root) numbers its processes from 1; `container_pid` is its
    `pid` in /_emulator/containers (the `unshare` above its pid 1). Without a pid namespace
    the two are the same."""
    # The container's pid 1 (the child of `unshare`) may not be listed yet on a loaded
    # machine: look again for a while rather than guess. Falling back to `pid` itself then
    # named some unrelated process of the machine (a flaky "still alive").
    namespace = ""
    deadline = time.monotonic() + 10.0
    while not namespace:
        try:
            children = Path(f"/proc/{container_pid}/task/{container_pid}/children").read_text()
            if children.split():
                namespace = os.readlink(f"/proc/{int(children.split()[0])}/ns/pid")
        except (OSError, ValueError):
            pass
        if not namespace:
            if not Path(f"/proc/{container_pid}").exists():
                return pid  # no such container process: nothing to map through
            if time.monotonic() > deadline:
                raise AssertionError(f"container pid {container_pid} shows no child process")
            time.sleep(0.05)
    if namespace == os.readlink("/proc/self/ns/pid"):
        return pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == str(pid):
                return int(entry.name)
    raise AssertionError(f"no process {pid} in the pid namespace of container pid {container_pid}")
