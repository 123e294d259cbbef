"""Issue 22 item 8: the emulator created `/weights` and `/vol` on the machine.

A volume (or an image file) at a path the machine does not have needs a mount point. The
emulator made it with `mkdir -p` inside the container's mount namespace, which shares the
machine's directories (so `/vol` appeared at the machine's root), and on the host network it
linked the path (`/weights -> <state>.d/volumes/...`). Now each container has its own root (a
tmpfs with the machine's top-level entries bound in): a new top-level mount point is made on
that tmpfs, a deeper one in an overlay of its deepest existing parent. Checked on both
networks, with paths unique to the test run: nothing appears on the machine, and the
container still sees its volumes and files at their paths, and writes reach the volumes.

Kept (issue 33 item 7): the serving container reads ModelWeights' volume at its mount path
(components/modal/model_weights.py); `make up` and CI must leave the machine untouched, and
`make up` may start the emulator without /usr/sbin on PATH.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import modal
import pytest

from emulator.runtime.netns import namespaces_supported
from tests.emulator.helpers import APPS_DIR, modal_cli
from tests.emulator.runtime_support import deploy_server, get
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for

PATHS_APP = str(APPS_DIR / "rt_paths.py")


def _existing_parent() -> Path:
    """A directory of the machine outside the temp dir and /root, for a nested mount point."""
    for candidate in ("/opt", "/srv", "/usr/local", "/usr"):
        if Path(candidate).is_dir():
            return Path(candidate)
    pytest.skip("no /opt, /srv or /usr here")


@pytest.mark.parametrize("network", ["netns", "host"])
def test_22_8_mount_points_are_made_in_the_container_not_on_the_machine(
    tmp_path: Path, network: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not namespaces_supported():
        pytest.skip("needs root and unshare: without a mount namespace volumes are not shown")
    tag = uuid.uuid4().hex[:10]
    top = Path(f"/rt22-{tag}-vol")
    nested_dir = _existing_parent() / f"rt22-{tag}"
    nested = nested_dir / "data"
    image_dir = Path(f"/rt22-{tag}-img")
    state = tmp_path / "state.sqlite3"
    emu = EmulatorProcess(state_path=state, container_network=network, stop_grace=3.0).start()
    try:
        modal_cli(
            emu,
            "deploy",
            PATHS_APP,
            extra_env={
                "RT_VOL_TOP": str(top),
                "RT_VOL_NESTED": str(nested),
                "RT_IMG_PATH": str(image_dir / "hello.txt"),
            },
        )
        modal_env_for(emu, monkeypatch)
        seen = modal.Function.from_name("rt-paths", "probe").remote(tag)
        # The container saw its paths...
        assert json.loads(seen["image_file"]) == {"model": "tiny", "max_tokens": 128}
        assert seen["cwd"] == "/root"
        # ...its writes reached the volumes, in the emulator's state dir...
        written = sorted(state.parent.glob("state.sqlite3.d/volumes/*/token.txt"))
        assert [p.read_text() for p in written] == [tag, tag], written
        # ...and the machine has none of them.
        for path in (top, nested_dir, image_dir):
            assert not path.exists() and not path.is_symlink(), f"{path} was made on the machine"
    finally:
        emu.close()
    for path in (top, nested_dir, image_dir):
        assert not path.exists() and not path.is_symlink(), f"{path} was left on the machine"


def test_22_8_containers_start_where_path_lacks_sbin(tmp_path: Path) -> None:
    """The container's setup runs with the container's PATH (the emulator's, as a script may
    start it: without /usr/sbin, where `chroot` and `ip` live); `make up` met `chroot: not
    found` there. The tools are resolved by absolute path."""
    if not namespaces_supported():
        pytest.skip("needs root and unshare (mount and pid namespaces)")
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    with EmulatorProcess(
        state_path=tmp_path / "state.sqlite3", stop_grace=3.0, env={"PATH": path}
    ) as emu:
        url, _ = deploy_server(emu, unauth="1")
        assert get(url).status_code == 200
