"""Scratch directories of killed emulators are removed by the next runtime that starts; live
owners', foreign and unmarked ones are kept (dev/emulator/runtime/scratch.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from emulator.process import EmulatorProcess
from emulator.runtime import scratch


def _dir(root: Path, name: str, stamp: str | None) -> Path:
    path = root / name
    path.mkdir()
    (path / "ta-1").mkdir()
    (path / "ta-1" / "container_arguments.bin").write_bytes(b"x")
    if stamp is not None:
        (path / scratch.OWNER_FILE).write_text(stamp)
    return path


def test_only_directories_of_owners_that_are_gone_are_removed(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child_stamp = scratch._owner_stamp(child.pid)  # taken while it lives
    finally:
        child.kill()
        child.wait()
    ns = scratch._pid_namespace()
    me = scratch._owner_stamp(os.getpid())
    my_pid, my_start, _ = me.split()
    dead = _dir(tmp_path, "modal-emu-dead", child_stamp)
    dead_data = _dir(tmp_path, "modal-emulator-data-dead", child_stamp)
    live = _dir(tmp_path, "modal-emu-live", me)
    reused = _dir(tmp_path, "modal-emu-reused", f"{my_pid} 1 {ns}\n")  # pid now someone else's
    foreign = _dir(tmp_path, "modal-emu-foreign", f"{child.pid} 5 pid:[1]\n")
    unmarked = _dir(tmp_path, "modal-emu-unmarked", None)
    garbled = _dir(tmp_path, "modal-emu-garbled", "not a stamp")
    other = _dir(tmp_path, "something-else", child_stamp)

    removed = scratch.sweep_stale(tmp_path)

    assert sorted(removed) == sorted([dead, dead_data, reused])
    for path in (dead, dead_data, reused):
        assert not path.exists()
    for path in (live, foreign, unmarked, garbled, other):
        assert path.exists()
    assert my_start != "1"  # the "reused" case really differs from this process's start


def test_a_dir_that_cannot_be_emptied_keeps_its_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal that fails part way is not reported, and the next sweep still knows the
    directory (its owner stamp goes last)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stamp = scratch._owner_stamp(child.pid)
    child.wait()
    stuck = _dir(tmp_path, "modal-emu-stuck", stamp)
    # a subdirectory that cannot be removed (as a file of another user would be)
    monkeypatch.setattr(scratch.shutil, "rmtree", lambda *_a, **_k: None)
    assert scratch.sweep_stale(tmp_path) == []
    assert (stuck / scratch.OWNER_FILE).read_text() == stamp
    monkeypatch.undo()
    assert scratch.sweep_stale(tmp_path) == [stuck] and not stuck.exists()


def test_a_new_scratch_dir_names_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = scratch.make_scratch_dir("modal-emu-")
    assert path.parent == tmp_path and oct(path.stat().st_mode & 0o777) == "0o700"
    assert scratch._owner_alive((path / scratch.OWNER_FILE).read_text())
    assert scratch.sweep_stale(tmp_path) == [] and path.exists()


def test_the_next_emulator_removes_what_a_killed_one_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: `kill -9` of an emulator leaves its runtime and data dirs; the next
    emulator's runtime removes them at start, and its own go at a normal stop."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the emulators' temp dir (they inherit the env)

    def scratch_dirs() -> set[str]:
        return {p.name for prefix in scratch.PREFIXES for p in tmp.glob(prefix + "*")}

    first = EmulatorProcess().start()
    try:
        left = scratch_dirs()
        assert {n.split("-")[1] for n in left} >= {"emu", "emulator"}  # runtime + data dirs
    finally:
        first.kill()
        first.close()
    assert scratch_dirs() == left  # killed: nothing removed them

    second = EmulatorProcess().start()
    try:
        now = scratch_dirs()
        assert now and not (now & left)
    finally:
        second.close()
    assert scratch_dirs() == set()
