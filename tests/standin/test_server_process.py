"""The provider server process the stand-in starts: it never outlives the stand-in.

It runs in a session of its own (a terminal's Ctrl-C goes to the stand-in, which lets calls
finish), so only PR_SET_PDEATHSIG, set by its launcher after exec, ends it when the stand-in
is killed outright. The launcher is a `python -c` wrapper rather than a `preexec_fn`: with a
preexec_fn Python forks instead of vforking and grpcio's fork handlers can abort the child
before exec (grpc/grpc#43055; seen once in ~10 full runs as "exited with -6").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.harness.emulator import PROJECT_ROOT

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_stand_in_takes_its_provider_server_with_it() -> None:
    code = textwrap.dedent(
        """
        import time
        from pulumi_standin.server import ProviderServer
        srv = ProviderServer().start()
        print(srv._proc.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert b"pulumi.dynamic" in cmdline  # the SDK's own server, through the launcher
        parent.send_signal(signal.SIGKILL)  # no cleanup of its own can run
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the provider server outlived the stand-in that started it"
    finally:
        parent.kill()
        parent.wait()


def test_the_launcher_refuses_to_run_when_its_parent_is_already_gone() -> None:
    from pulumi_standin.server import _CHILD

    env = {**os.environ, "PULUMI_STANDIN_PARENT_PID": "1"}  # not our parent: gone already
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "json.tool", "--help"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 1
    assert "the process that started this provider server is gone" in done.stderr
