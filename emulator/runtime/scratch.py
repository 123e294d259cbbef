"""The runtime's scratch directories in the system temp dir, and sweeping the stale ones.

The runtime keeps container sockets, work dirs and overlay layers in `modal-emu-*`, and an
emulator without a state file keeps its volumes in `modal-emulator-data-*`. A normal stop
removes its own; an emulator killed with `-9` cannot. Each directory therefore names its
owner (pid, the process's start time so that a reused pid is not taken for the owner, and the
pid namespace), and a starting runtime removes the directories whose owner is gone. A
directory without an owner file (another program's, or an older emulator's), of another user,
or owned from another pid namespace (a container sharing /tmp, where the pid means nothing
here) is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("emulator.runtime")

PREFIXES = ("modal-emu-", "modal-emulator-data-")
OWNER_FILE = ".owner"


def _start_time(pid: int) -> str | None:
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
    return f"{pid} {_start_time(pid) or '?'} {_pid_namespace()}\n"


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
    now = _start_time(pid)
    return now is not None and (started == "?" or now == started)


def _remove(path: Path) -> bool:
    """Remove a stale scratch dir, its owner stamp last: a removal that fails part way
    leaves a directory the next sweep still recognises."""
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
    root = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
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
            if _remove(path):
                removed.append(path)
    if removed:
        log.info("runtime: removed %d scratch dir(s) of emulators that were killed", len(removed))
    return removed
