"""The live local stack, as `make up` makes it, for the tests that need a real endpoint.

`LiveStack.up()` runs `make up` exactly as a user does on a machine without the Pulumi CLI
(PATH without `pulumi`, Pulumi's installer unreachable, so the stand-in engine is chosen),
with its emulator on a free port and its state (emulator dir, stand-in state file) in a
temporary directory, so it never meets a developer's own `make up`. The chain it leaves
running is the product's: emulator edge (Modal proxy auth) -> our serving container
(serving/app.py: proxy + stand-in engine, real lifecycle) in its own network namespace.
`down()` is `make down`; the fixture's teardown runs it too if a test did not, and kills the
emulator as a last resort.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.program.runner import PROJECT_ROOT

PY = str(PROJECT_ROOT / ".venv/bin/python")


def free_port_pair() -> int:
    """A port P with P+1 free too (the emulator's control surface defaults to P+1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of loopback ports")


@dataclass
class LiveStack:
    home: Path
    port: int = field(default_factory=free_port_pair)
    up_output: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/bin:/bin",  # no pulumi here
            "HOME": str(self.home),  # no ~/.pulumi/bin either
            "PULUMI_INSTALL_URL": "http://127.0.0.1:9/unreachable",  # installer not reachable
            "EMULATOR_PORT": str(self.port),
            "EMULATOR_DIR": str(self.home / "emulator"),
            "STANDIN_STATE": str(self.home / "standin.json"),
            "GATEWAY_FILE": str(self.home / "gateway" / "litellm-local.yaml"),
            # the access stack 'local' of this stack only (never the checkout's own, whose
            # presence would put this stack in managed mode: scripts/offline_stack.py)
            "ACCESS_STATE": str(self.home / "access.json"),
            "LANG": "C.UTF-8",
        }

    @property
    def control(self) -> str:
        return f"http://127.0.0.1:{self.port + 1}"

    def make(
        self, target: str, timeout: float = 240, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "--no-print-directory", target],
            cwd=PROJECT_ROOT,
            env=self.env if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def up(self) -> subprocess.CompletedProcess[str]:
        result = self.make("up")
        self.up_output = result.stdout
        return result

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.make("down")

    def outputs(self) -> dict[str, Any]:
        """The stack outputs, secrets revealed (scripts/local_stack.py outputs)."""
        done = subprocess.run(
            [PY, "scripts/local_stack.py", "outputs", "--engine", "standin",
             "--state", str(self.home / "standin.json")],
            cwd=PROJECT_ROOT, env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def standin(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`python -m pulumi_standin ARGS` on this stack (e.g. up with a --config)."""
        return subprocess.run(
            [PY, "-m", "pulumi_standin", *args, "--stack", "local",
             "--state", str(self.home / "standin.json"),
             "--server-url", f"http://127.0.0.1:{self.port}"],
            cwd=PROJECT_ROOT, env={**self.env, "MODAL_TOKEN_ID": "ak-local-emulator",
                                   "MODAL_TOKEN_SECRET": "as-local-emulator"},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def rpc_counts(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.control}/_emulator/rpc-counts", timeout=10) as r:
            return dict(json.loads(r.read()))

    def emulator_pid(self) -> int | None:
        pid_file = self.home / "emulator" / "emulator.pid"
        return int(pid_file.read_text()) if pid_file.exists() else None

    @staticmethod
    def clock_ticks() -> int:
        """Now, in the clock ticks since boot that /proc/PID/stat's start time uses."""
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return int(uptime * os.sysconf("SC_CLK_TCK")) + 1

    def container_netns(self) -> set[str]:
        """The network namespaces of the containers running now (each container has its own)."""
        with urllib.request.urlopen(f"{self.control}/_emulator/containers", timeout=10) as r:
            pids = [c["pid"] for c in json.loads(r.read())["containers"] if c["pid"]]
        found = set()
        for pid in pids:
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/ns/net"))
        return found

    def processes_left(self, netns: Collection[str] = (), started_before: int = 0) -> list[str]:
        """Processes whose command line or environment names this stack's directory (the
        emulator, the containers' own processes), or that live in one of `netns` (whatever
        the containers started, even in a session of its own, e.g. our proxy).

        A namespace's id (`net:[inode]`) is reused once the namespace is gone, and other
        tests start containers at the same time: with `started_before` (clock ticks since
        boot, see `clock_ticks`), a process in one of `netns` that started later is another
        namespace's, not a leftover of ours."""
        mark = str(self.home).encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
                ns = os.readlink(proc / "ns" / "net")
                # field 22 of /proc/PID/stat (after the parenthesised command): start time
                started = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])
            except (OSError, ValueError, IndexError):
                continue
            ours_by_ns = ns in netns and not (started_before and started > started_before)
            if mark in blob or ours_by_ns:
                argv0 = blob.split(b"\x00")[0].decode(errors="replace")
                found.append(f"{proc.name}: {argv0}")
        return found

    def kill_leftovers(self) -> None:
        pid = self.emulator_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.2)


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """The local stack after a successful `make up` (module-wide: `make up` once per module)."""
    stack = LiveStack(tmp_path_factory.mktemp("live"))
    result = stack.up()
    try:
        assert result.returncode == 0, f"make up failed:\n{result.stdout}\n{result.stderr}"
        yield stack
    finally:
        if stack.emulator_pid() is not None:
            stack.down()
        stack.kill_leftovers()
