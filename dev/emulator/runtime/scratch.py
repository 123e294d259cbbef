"""The runtime's scratch directories in the system temp dir, and sweeping the stale ones.

The runtime keeps container sockets, work dirs and overlay layers in `modal-emu-*`, and an
emulator without a state file keeps its volumes in `modal-emulator-data-*`. A normal stop
removes its own; an emulator killed with `-9` cannot, nor stop its containers: where
containers have their own pid namespace the kernel ends them with the emulator, elsewhere
(no root) the runtime keeps a ledger of its container processes (`processes`: pid and start
time of each container process and its descendants, whatever group or session they moved
to), and the sweep kills those still running before it removes the directory. Each directory
therefore names its owner (pid, the process's start time so that a reused pid is not taken
for the owner, and the pid namespace), and a starting runtime removes the directories whose
owner is gone. A directory without an owner file (another program's, or an older
emulator's), of another user, or owned from another pid namespace (a container sharing /tmp,
where the pid means nothing here) is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

log = logging.getLogger("emulator.runtime")

PREFIXES = ("modal-emu-", "modal-emulator-data-")
OWNER_FILE = ".owner"
#: The container processes of a runtime (`pid start-time` lines), rewritten as they change:
#: what the sweep kills when the runtime's emulator was killed (issue 22 item 7).
PROCESSES_FILE = "processes"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return stat.rsplit(")", 1)[1].split()[19]


def _pid_namespace() -> str:
    """This process's pid namespace, or "?" when /proc does not show it under its own pid
    (a /proc mounted for another pid namespace: pids read there would be someone else's)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return "?"
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _owner_stamp(pid: int) -> str:
    return f"{pid} {start_time(pid) or '?'} {_pid_namespace()}\n"


def make_scratch_dir(prefix: str) -> Path:
    """A new private directory in the temp dir that names this process as its owner."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o700)
    (path / OWNER_FILE).write_text(_owner_stamp(os.getpid()))
    return path


def _owner_alive(stamp: str) -> bool:
    """False only when the owner is known to be gone: same pid namespace, and no process
    with that pid and start time."""
    try:
        pid_text, started, namespace = stamp.split()
        pid = int(pid_text)
    except ValueError:
        return True  # unreadable: not ours to judge
    if namespace == "?" or namespace != _pid_namespace():
        return True
    now = start_time(pid)
    return now is not None and (started == "?" or now == started)


def record_processes(scratch: Path, pids: set[int]) -> None:
    """Write the ledger of a runtime's container processes (atomically)."""
    lines = sorted(f"{pid} {started}" for pid in pids if (started := start_time(pid)))
    tmp = scratch / f".{PROCESSES_FILE}.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(scratch / PROCESSES_FILE)


def kill_recorded(pids: dict[int, str]) -> int:
    """SIGKILL each pid whose start time is still the recorded one (a reused pid is someone
    else's); how many."""
    killed = 0
    for pid, started in pids.items():
        if pid > 1 and start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _reap(path: Path) -> int:
    """Kill the processes a dead runtime recorded in `path` that still run; how many."""
    try:
        text = (path / PROCESSES_FILE).read_text()
    except OSError:
        return 0
    pids: dict[int, str] = {}
    for line in text.splitlines():
        pid_text, _, started = line.partition(" ")
        if pid_text.isdigit() and started:
            pids[int(pid_text)] = started.strip()
    return kill_recorded(pids)


def _remove(path: Path, killed_out: list[int] | None = None) -> bool:
    """Remove a stale scratch dir, its owner stamp last: a removal that fails part way
    leaves a directory the next sweep still recognises. The processes it recorded go first."""
    killed = _reap(path)
    if killed_out is not None:
        killed_out.append(killed)
    if killed:
        log.warning(
            "runtime: killed %d container process(es) left by an emulator that was killed "
            "without stopping them (its scratch dir %s)",
            killed,
            path,
        )
    for child in path.iterdir():
        if child.name == OWNER_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()
    if any(child.name != OWNER_FILE for child in path.iterdir()):
        return False  # something could not be removed: keep the stamp for the next sweep
    with contextlib.suppress(OSError):
        (path / OWNER_FILE).unlink()
        path.rmdir()
    return not path.exists()


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories (of this user) whose owning emulator is gone."""
    return sweep(root)[0]


def sweep(root: Path | None = None) -> tuple[list[Path], int]:
    """`sweep_stale`, and how many recorded container processes it killed."""
    root = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    killed: list[int] = []
    uid = os.getuid()
    for prefix in PREFIXES:
        for path in root.glob(prefix + "*"):
            try:
                if path.is_symlink() or not path.is_dir() or path.stat().st_uid != uid:
                    continue
                stamp = (path / OWNER_FILE).read_text()
            except OSError:
                continue  # no owner file: not ours to judge
            if _owner_alive(stamp):
                continue
            if _remove(path, killed):
                removed.append(path)
    if removed:
        log.info("runtime: removed %d scratch dir(s) of emulators that were killed", len(removed))
    return removed, sum(killed)
