"""The fault matrix of issue 32 ("How we will know"): kill -9 of one process at one step of
`make up`, `make down` or a release, then check that the local stack heals by itself.

Each case runs the real scripts (scripts/up.sh, scripts/down.sh: the stand-in engine, the
emulator they start, the provider server, the deploy runner, the container's proxy and
engine) in a sandbox of its own: its own emulator directory, stand-in state file, gateway
file and ports, and a marker variable (FAULT_MATRIX_RUN) that every process the scripts start
inherits, so the test can find them in /proc and prove none is left behind.

The step is made a window with the emulator's fault injection (dev/emulator/faults.py): the RPC
that step sends is applied, then its answer is held back for a few seconds ("after", status
NONE, delay_s), and the target is killed inside that window: the create (or delete) happened
on Modal, and its answer never reached the engine. For the container's proxy and engine the
window is the release's health gate: the new version's container runs, the release waits.

After the kill, in every case:
1. within a few seconds no process that holds the Modal token (the marker and
   MODAL_TOKEN_SECRET in its environment) is left without its parent: children die with it;
2. the next `make up` succeeds on its own and the endpoint answers HTTP 200;
3. the stack's destroy leaves the emulator with nothing of the stack (environment, app,
   secret, volume, proxy token), and `make down` leaves no process and no listening port.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.program.runner import PROJECT_ROOT

PY = str(PROJECT_ROOT / ".venv/bin/python")
MARKER = "FAULT_MATRIX_RUN"
#: How long a killed process's children may take to go (PR_SET_PDEATHSIG is immediate; the
#: parent-pid watchdogs poll once a second).
ORPHAN_GRACE_S = 5.0
#: The window held open after the step's RPC was applied.
WINDOW_S = 8.0


@dataclass(frozen=True)
class Case:
    phase: str  # "up" | "down" | "release"
    target: str  # "standin" | "emulator" | "runner" | "proxy" | "engine"
    rpc: str = ""  # the step: the RPC whose applied answer is held back ("" for proxy/engine)

    @property
    def id(self) -> str:
        return f"{self.phase}-{self.target}-{self.rpc or 'gate'}"


#: Which process each target is, by its command line.
PATTERNS = {
    "standin": "-m pulumi_standin",
    "runner": "components.modal._deploy_runner",
    "proxy": "serving.proxy",
    "engine": "standin_engine",
}

#: A release: the stack's one service with another request timeout (a new spec digest).
RELEASE_SERVICES = [
    {
        "name": "tiny",
        "engine": "vllm",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "served_model_name": "smollm2-135m",
        "gpu": "T4",
        "context_length": 2048,
        "scaling": {"min_containers": 0, "max_containers": 1, "scaledown_window_s": 60},
        "timeouts": {"startup_s": 600, "request_s": 121},
    }
]


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the emulator's gRPC and control ports), below the
    kernel's ephemeral range: the local port of an outgoing connection (other tests make many)
    is drawn from that range and would make a later bind fail, also on the restart of a
    killed emulator on its same port. Both are bound at once to check."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(10000, max(10002, low - 2))
        with socket.socket() as s, socket.socket() as t:
            try:
                s.bind(("127.0.0.1", port))
                t.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no free port pair")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Proc:
    pid: int
    ppid: int
    cmdline: str
    marked: bool
    holds_token: bool


def processes(marker: str) -> dict[int, Proc]:
    """Every process on the machine, with whether it carries this sandbox's marker."""
    out: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                environ = []
        except (OSError, IndexError, ValueError):
            continue
        marked = f"{MARKER}={marker}".encode() in environ
        holds = any(e.startswith(b"MODAL_TOKEN_SECRET=") for e in environ)
        out[int(entry)] = Proc(int(entry), ppid, cmdline, marked, holds)
    return out


def descendants(procs: dict[int, Proc], root: int) -> set[int]:
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        for p in procs.values():
            if p.ppid == parent and p.pid not in found:
                found.add(p.pid)
                frontier.append(p.pid)
    return found


class Sandbox:
    """One local stack, as a checkout of its own would run it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.marker = uuid.uuid4().hex
        self.port = free_port_pair()
        self.emulator_dir = tmp / "emu"
        self.log: list[str] = []
        self.seen: set[int] = set()  # pids that ran before the faulted command started

    # ---- running the scripts -------------------------------------------------------------
    def env(self) -> dict[str, str]:
        keep = ("PATH", "HOME", "LANG", "TMPDIR", "USER")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(
            {
                MARKER: self.marker,
                "PULUMI_ENGINE": "standin",
                "EMULATOR_DIR": str(self.emulator_dir),
                "EMULATOR_PORT": str(self.port),
                "STANDIN_STATE": str(self.tmp / "local.json"),
                "GATEWAY_FILE": str(self.tmp / "gateway.yaml"),
                "PATH": "/usr/bin:/bin",  # no Pulumi CLI: the stand-in engine
                "PULUMI_INSTALL_URL": "http://127.0.0.1:9/unreachable",
                "LANG": "C.UTF-8",
            }
        )
        return env

    def start(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            list(argv),
            cwd=PROJECT_ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, *argv: str, timeout: float = 240) -> tuple[int, str]:
        proc = self.start(*argv)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n[timed out after {timeout:g}s]"
        self.log.append(f"$ {' '.join(argv)}  (rc {proc.returncode})\n{out}")
        return proc.returncode, out

    def bash(self, script: str, timeout: float = 120) -> tuple[int, str]:
        return self.run("bash", "-c", f"set -e\nSTACK=local\n. scripts/local-env.sh\n{script}")

    def up(self) -> tuple[int, str]:
        return self.run("bash", "scripts/up.sh", "local")

    def down(self) -> tuple[int, str]:
        return self.run("bash", "scripts/down.sh", "local")

    def standin_argv(self, *args: str) -> list[str]:
        return [
            PY, "-m", "pulumi_standin", *args, "--stack", "local",
            "--state", str(self.tmp / "local.json"),
            "--server-url", f"http://127.0.0.1:{self.port}",
        ]  # fmt: skip

    def release_argv(self) -> list[str]:
        return self.standin_argv("up", "--config", f"services={json.dumps(RELEASE_SERVICES)}")

    def start_emulator(self) -> None:
        """This sandbox's emulator, on a port pair of its own: another test may take a port
        between the pick and the bind (tests run in parallel), then another pair is picked."""
        for _ in range(5):
            rc, out = self.bash("start_emulator")
            if rc == 0 or "cannot listen" not in out:
                break
            self.port = free_port_pair()
        assert rc == 0, self.transcript()

    # ---- the emulator's control surface --------------------------------------------------
    def control(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port + 1}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def arm_window(self, rpc: str) -> None:
        self.control(
            "POST",
            "/_emulator/faults",
            {"method": rpc, "when": "after", "status": "NONE", "delay_s": WINDOW_S, "count": 1},
        )

    def clear_faults(self) -> None:
        if listening(self.port + 1):
            self.control("POST", "/_emulator/faults", {"clear": True})

    def rpc_count(self, rpc: str) -> int:
        counts = self.control("GET", "/_emulator/rpc-counts")
        return int(counts.get(rpc, 0))

    def emulator_pid(self) -> int | None:
        try:
            return int((self.emulator_dir / "emulator.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self.control("GET", "/_emulator/state")
        return result

    # ---- the kill ------------------------------------------------------------------------
    def find(self, target: str) -> int | None:
        """The pid of the target process of this sandbox, if it runs."""
        if target == "emulator":
            return self.emulator_pid()
        procs = processes(self.marker)
        pattern = PATTERNS[target]
        pool = {p.pid for p in procs.values() if p.marked}
        if target in ("proxy", "engine"):  # the container's processes: under the emulator
            emu = self.emulator_pid()
            pool = descendants(procs, emu) if emu else set()
        found = [pid for pid in pool - self.seen if pattern in procs[pid].cmdline]
        return max(found) if found else None

    def kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def leftovers(self, exclude_emulator: bool = True) -> list[Proc]:
        """This sandbox's processes holding the Modal token whose parent is gone (re-parented
        to pid 1 or a subreaper that is not ours)."""
        procs = processes(self.marker)
        emu = self.emulator_pid() if exclude_emulator else None
        keep = ({emu} | descendants(procs, emu)) if emu else set()
        marked = {p.pid for p in procs.values() if p.marked}
        return [
            p
            for p in procs.values()
            if p.marked and p.holds_token and p.pid not in keep and p.ppid not in marked
        ]

    def wait_no_orphans(self) -> None:
        deadline = time.monotonic() + ORPHAN_GRACE_S
        left = self.leftovers()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.leftovers()
        assert not left, "processes outlived their parent holding the Modal token:\n" + "\n".join(
            f"  pid {p.pid} (parent {p.ppid}): {p.cmdline[:160]}" for p in left
        )

    # ---- the checks after a case ---------------------------------------------------------
    def heal_and_clean(self) -> None:
        """The next `make up` works alone; destroy leaves nothing; `make down` leaves no process."""
        self.clear_faults()
        rc, out = self.up()
        assert rc == 0 and "HTTP 200" in out, self.transcript()
        rc, out = self.run(*self.standin_argv("destroy"))
        assert rc == 0, self.transcript()
        state = self.state()
        assert [e["name"] for e in state["environments"]] == ["main"], state["environments"]
        assert state["secrets"] == [] and state["volumes"] == [], state
        assert state["proxy_tokens"] == [], state["proxy_tokens"]
        assert not [a for a in state["apps"] if a["state"] != "stopped"], state["apps"]
        emulator = self.emulator_pid()
        rc, out = self.down()
        assert rc == 0, self.transcript()
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while time.monotonic() < deadline:
            left = [p for p in processes(self.marker).values() if p.marked]
            if not left and not listening(self.port) and not listening(self.port + 1):
                break
            time.sleep(0.2)
        left = [p for p in processes(self.marker).values() if p.marked]
        assert not left, f"left running after make down: {[p.cmdline[:120] for p in left]}"
        assert emulator is None or not os.path.exists(f"/proc/{emulator}")
        assert not listening(self.port) and not listening(self.port + 1)

    def transcript(self) -> str:
        emu_log = self.emulator_dir / "emulator.log"
        tail = emu_log.read_text(errors="replace")[-3000:] if emu_log.exists() else ""
        return "\n\n".join(self.log)[-12000:] + f"\n--- emulator log tail ---\n{tail}"

    def cleanup(self) -> None:
        """Whatever a failed case left: stop it (never another sandbox's processes)."""
        for p in processes(self.marker).values():
            if p.marked:
                self.kill(p.pid)
        pid = self.emulator_pid()
        if pid is not None:
            self.kill(pid)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Sandbox]:
    """A sandbox for one case; whatever the case left running is stopped after it."""
    sandbox = Sandbox(tmp_path)
    try:
        yield sandbox
    finally:
        sandbox.cleanup()


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def run_case(box: Sandbox, case: Case) -> None:
    """One cell of the matrix: prepare, open the window, kill, then the checks."""
    box.start_emulator()
    if case.phase in ("down", "release"):
        rc, _ = box.up()
        assert rc == 0, box.transcript()
    if case.rpc:
        box.arm_window(case.rpc)
    argv = {
        "up": ["bash", "scripts/up.sh", "local"],
        "down": ["bash", "scripts/down.sh", "local"],
        "release": box.release_argv(),
    }[case.phase]
    box.seen = set(processes(box.marker))
    started = box.start(*argv)
    try:
        if case.rpc:
            wait_until(lambda: box.rpc_count(case.rpc) >= 1, 120, f"{case.rpc} to be sent")
            time.sleep(0.3)  # applied; its answer is held back for WINDOW_S
        pid = wait_until(lambda: box.find(case.target), 120, f"the {case.target} process")
        procs = processes(box.marker)
        under = descendants(procs, pid) if case.target == "emulator" else set()
        box.kill(pid)
        # The emulator's containers (not marked: they get a clean environment) die with it.
        wait_until(
            lambda: all(_zombie_or_gone(q) for q in under),
            ORPHAN_GRACE_S,
            "the killed emulator's containers to stop",
        )
        out, _ = started.communicate(timeout=240)
        box.log.append(f"$ {' '.join(argv)}  (killed {case.target} {pid}; rc {started.returncode})"
                       f"\n{out}")  # fmt: skip
    finally:
        if started.poll() is None:
            started.kill()
            started.communicate()
    box.wait_no_orphans()
    box.heal_and_clean()
