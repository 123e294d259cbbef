"""Issue 34 item 3: the access stack on the local stack, as docs/program.md ("Access", "On the
emulator") gives it, in both orders, with the stand-in engine as on a machine without the CLI.

Before: after `make up`, `python -m pulumi_standin up --cwd access --stack local` failed with
`Environment 'local' already exists` (access/Pulumi.local.yaml did not adopt it); after the
access stack, `make up` failed the same way; managed mode (`--config managedByAccessStack=true
--secret proxyToken=...`) lasted one run, so `make plan` then showed the SpendAlert and
ProxyAuthToken to create again; `make down` left the access stack's state listing resources
that the removed emulator state no longer had. Now: the `local` entry adopts (creating it when
missing), every stand-in run of the local stack (`make up`, `plan`, `refresh`, `down`) is in
managed mode while the access stack is deployed (scripts/offline_stack.py), and `make down`
destroys the access stack after the local stack, so `make up` works again afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.program.live_stack import PY, LiveStack
from tests.program.runner import PROJECT_ROOT

MANAGED_LINE = "Managed mode: the access stack 'local' owns environment 'local'"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LiveStack]:
    live = _Stack(tmp_path)
    try:
        yield live
    finally:
        if live.emulator_pid() is not None:
            live.down()
        live.kill_leftovers()


class _Stack(LiveStack):
    """The live local stack (its access stack's state, ACCESS_STATE, in its directory too)."""

    def access(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`python -m pulumi_standin ARGS --cwd access --stack local` (the docs' command), with
        the emulator's Owner token."""
        return subprocess.run(
            [PY, "-m", "pulumi_standin", *args, "--cwd", "access", "--stack", "local",
             "--state", str(self.home / "access.json"),
             "--server-url", f"http://127.0.0.1:{self.port}"],
            cwd=PROJECT_ROOT, env={**self.env, "MODAL_TOKEN_ID": "ak-local-emulator",
                                   "MODAL_TOKEN_SECRET": "as-local-emulator"},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def access_proxy_token(self) -> str:
        done = self.access("output", "credentials", "--show-secrets", "--json")
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["local"]["proxy_token"])


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _printed_proxy_key(up_output: str) -> str:
    (key,) = re.findall(r"-H 'Modal-Key: (wk-[^']+)'", up_output)
    return key


def _teardown_then_up_again(stack: _Stack) -> None:
    """The documented teardown (`make down`: the local stack, then the access stack), after
    which `make up` works in default mode and `make down` again leaves nothing."""
    down = _ok(stack.down())
    assert "Resources: - 7 deleted" in down
    assert "Resources: - 16 deleted" in down
    again = _ok(stack.up())
    assert "Resources: + 9 created" in again and "HTTP 200" in again
    assert MANAGED_LINE not in again
    assert "Resources: - 9 deleted" in _ok(stack.down())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_34_3_access_stack_after_make_up(stack: _Stack) -> None:
    assert "Resources: + 9 created" in _ok(stack.up())
    # the access stack adopts the environment `make up` made (before: "already exists")
    access = _ok(stack.access("up"))
    assert "already exists" not in access and "Resources: + 16 created" in access
    # the next `make up` runs the local stack in managed mode: its own budget and proxy
    # token go, the access stack's token is the one printed and answers (HTTP 200)
    managed = _ok(stack.up())
    assert MANAGED_LINE in managed
    assert "Resources: ~ 1 updated, - 2 deleted, 6 unchanged" in managed, managed
    assert "is for this run only" not in managed
    assert "HTTP 200" in managed
    assert _printed_proxy_key(managed) == stack.access_proxy_token().split(":")[0]
    # and it lasts: `make plan` and `make up` change nothing (before: + SpendAlert, + token)
    plan = _ok(stack.make("plan"))
    assert MANAGED_LINE in plan and "Resources: 7 unchanged" in plan, plan
    assert "Resources: 7 unchanged" in _ok(stack.up())
    _teardown_then_up_again(stack)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_34_3_access_stack_first_then_make_up(stack: _Stack) -> None:
    # `make emulator` (the docs' first step), in the foreground: its log is its stdout
    log = stack.home / "make-emulator.log"
    with log.open("w") as out:
        emulator = subprocess.Popen(
            ["make", "--no-print-directory", "emulator"], cwd=PROJECT_ROOT, env=stack.env,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "MODAL EMULATOR READY" not in log.read_text():
            assert time.monotonic() < deadline and emulator.poll() is None, log.read_text()
            time.sleep(0.3)
        assert "Resources: + 16 created" in _ok(stack.access("up"))
        # `make up` after the access stack (before: "Environment 'local' already exists")
        up = _ok(stack.up())
        assert MANAGED_LINE in up and "Resources: + 7 created" in up, up
        assert "HTTP 200" in up
        assert _printed_proxy_key(up) == stack.access_proxy_token().split(":")[0]
        plan = _ok(stack.make("plan"))
        assert "Resources: 7 unchanged" in plan, plan
        _teardown_then_up_again(stack)
    finally:
        if emulator.poll() is None:  # `make emulator` in the foreground: Ctrl-C's signal
            emulator.terminate()
        emulator.wait(timeout=60)


def test_34_3_local_access_entry_adopts_the_environment() -> None:
    """`make up` may have made `local` first; the Environment's adopt creates it when missing
    (components/modal/environment.py, create: `adopted` only when it exists)."""
    raw = yaml.safe_load((PROJECT_ROOT / "access" / "Pulumi.local.yaml").read_text())
    entries = {e["name"]: e for e in raw["config"]["modal-llm-access:environments"]}
    assert entries["local"].get("adopt") is True


def _offline(tmp_path: Path, managed: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MANAGED": managed,
           "ACCESS_STATE": str(tmp_path / "none.json"), "LANG": "C.UTF-8"}  # fmt: skip
    return subprocess.run(
        [PY, "scripts/offline_stack.py", *args, "--stack", "local",
         "--state", str(tmp_path / "s.json")],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_34_3_managed_mode_errors(tmp_path: Path) -> None:
    """MANAGED=1 without the access stack says what to run; a bad MANAGED is named; MANAGED=0
    (and no access stack) previews in default mode."""
    need = _offline(tmp_path, "1", "preview")
    assert need.returncode == 2 and need.stdout == ""
    assert "MANAGED=1, but the access stack 'local' is not deployed" in need.stderr
    assert "pulumi_standin up --cwd access --stack local" in need.stderr
    bad = _offline(tmp_path, "yes", "preview")
    assert bad.returncode == 2 and "MANAGED='yes' is not one of 0, 1 or auto" in bad.stderr
    plain = _offline(tmp_path, "0", "preview")
    assert plain.returncode == 0, plain.stderr
    assert MANAGED_LINE not in plain.stderr and "local-spend-alert" in plain.stdout


def test_34_3_every_run_config_is_not_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in warns that a --config/--secret lasts one run, except for the keys a wrapper
    passes on every run (scripts/offline_stack.py's managed mode names them)."""
    from pulumi_standin.cli import EVERY_RUN_VAR, one_run_warnings, parse_overrides

    overrides = parse_overrides(["managedByAccessStack=true"], ["proxyToken=wk-a:ws-b"])
    monkeypatch.delenv(EVERY_RUN_VAR, raising=False)
    assert len(one_run_warnings("local", overrides)) == 2
    monkeypatch.setenv(EVERY_RUN_VAR, "managedByAccessStack,proxyToken")
    assert one_run_warnings("local", overrides) == []
