"""Image files outside /root: which mounts show them at their paths in a container.

The plan is computed against a stand-in machine root (`host_root`), so every case is set up
here; the real mounts are exercised by tests/program/test_live_stack.py, whose serving
container reads its spec from /opt/serving/spec.json (an `add_local_file(..., copy=True)`).
"""

from __future__ import annotations

from pathlib import Path

from emulator.runtime.materialize import PathMount, outside_root_mounts


def _files(base: Path, *paths: str) -> None:
    for rel in paths:
        target = base / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rel)


def test_each_kind_of_path_gets_the_mount_that_keeps_the_machine_intact(tmp_path: Path) -> None:
    laid, host = tmp_path / "laid", tmp_path / "host"
    _files(
        laid,
        "root/app.py",  # /root has its own overlay: never here
        "opt/serving/spec.json",  # /opt exists, /opt/serving does not: overlay at /opt
        "opt/serving/more/x.txt",  # under the same overlay
        "etc/app.conf",  # replaces the machine's own file: a file bind
        "newtop/data/y.bin",  # no /newtop on the machine: bind of the directory
        "proc/evil",  # the kernel's filesystems are never covered
    )
    _files(host, "opt/other/keep.txt", "etc/app.conf", "etc/passwd")
    (host / "proc").mkdir()

    mounts = outside_root_mounts(laid, host_root=host)

    assert mounts == [
        PathMount("bind-dir", laid / "newtop", "/newtop"),
        PathMount("overlay", laid / "opt", "/opt"),
        PathMount("bind-file", laid / "etc/app.conf", "/etc/app.conf"),
    ]


def test_the_deepest_existing_directory_is_overlaid_and_covers_the_ones_below(
    tmp_path: Path,
) -> None:
    laid, host = tmp_path / "laid", tmp_path / "host"
    _files(laid, "usr/local/share/a/one.txt", "usr/local/share/b/two.txt", "usr/local/x")
    (host / "usr/local/share").mkdir(parents=True)

    # one.txt and two.txt want an overlay at /usr/local/share, x one at /usr/local: the
    # overlay at /usr/local shows all three, so it is the only mount.
    assert outside_root_mounts(laid, host_root=host) == [
        PathMount("overlay", laid / "usr/local", "/usr/local")
    ]


def test_nothing_outside_root_means_no_mount(tmp_path: Path) -> None:
    _files(tmp_path / "laid", "root/app.py")
    (tmp_path / "laid/.complete").write_text("ok\n")
    assert outside_root_mounts(tmp_path / "laid", host_root=tmp_path) == []
