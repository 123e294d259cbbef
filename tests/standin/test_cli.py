"""`python -m pulumi_standin` as an operator runs it (scripts/offline_stack.py and the Makefile
targets run the same `main`): one clear message per failure, never asyncio noise.

Kept (issue 33 item 7) as the developer flow: README's quick start (`make up` / `make down`
without the Pulumi CLI, `make offline-up`) and scripts that read `output` run this `main`.

- The issue's repro: `make offline-up STACK=dev` without a passphrase created `dev` in the
  emulator and wrote no state. Now the passphrase is resolved before anything runs.
- A clear-text `modal-llm:hfToken` is refused where the CLI refuses it (the program's own
  config check: secret-ness comes from the stack file / `--secret`, never from the key name).
- A failing step and a Ctrl-C during a step: exit 1 / 130, one message, the state keeps what
  was applied (the step in flight finishes, as on the engine's first Ctrl-C), a rerun
  continues.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pulumi_standin.program import PROJECT_ROOT
from pulumi_standin.stack import FAULT_ENV
from tests.harness.emulator import EmulatorProcess
from tests.providers.helpers import mutating_calls

pytestmark = pytest.mark.slow
NOISE = ("Traceback", "Task was destroyed", "never retrieved", "Exception ignored")


def _cli(
    emu: EmulatorProcess, *args: str, rc: int, passphrase: str | None = "cli-test", **env: str
) -> subprocess.CompletedProcess[str]:
    full = emu.subprocess_env(env)
    full.pop("PYTHONPATH", None)  # `python -m pulumi_standin` must work from the project root
    for var in ("OFFLINE_STACK_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE"):
        full.pop(var, None)
    if passphrase is not None:
        full["OFFLINE_STACK_PASSPHRASE"] = passphrase
    proc = subprocess.run(
        [sys.executable, "-m", "pulumi_standin", *args, "--server-url", emu.url],
        cwd=PROJECT_ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == rc, f"{args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    for noise in NOISE:
        assert noise not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def test_no_passphrase_changes_nothing(emulator: EmulatorProcess, tmp_path: Path) -> None:
    state = tmp_path / "dev.json"
    before = emulator.rpc_counts()
    proc = _cli(emulator, "up", "--stack", "dev", "--state", str(state), rc=1, passphrase=None)
    assert "stack 'dev': no passphrase" in proc.stderr and "nothing was run" in proc.stderr
    assert mutating_calls(before, emulator.rpc_counts()) == {}
    assert [e["name"] for e in emulator.state()["environments"]] == ["main"]
    assert not state.exists()


def test_clear_text_hf_token_is_refused_like_the_cli(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    token = "hf_clear_text_0123456789"
    proc = _cli(
        emulator,
        "preview",
        "--stack",
        "dev",
        "--state",
        str(tmp_path / "dev.json"),
        "--config",
        f"hfToken={token}",
        rc=1,
    )
    assert "modal-llm:hfToken is stored in clear" in proc.stdout
    assert "pulumi config set --secret modal-llm:hfToken" in proc.stdout
    assert token not in proc.stdout + proc.stderr
    assert proc.stdout.count("error: ") == 1
    # The same key set as a secret (`pulumi config set --secret`) is accepted and never shown.
    ok = _cli(
        emulator,
        "preview",
        "--stack",
        "dev",
        "--state",
        str(tmp_path / "dev.json"),
        "--secret",
        f"hfToken={token}",
        rc=0,
    )
    assert "dev-hf-token" in ok.stdout and "Resources: + 10 to create" in ok.stdout
    assert token not in ok.stdout + ok.stderr


def test_failed_and_interrupted_up_one_message_and_a_rerun_continues(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    state = tmp_path / "local.json"
    args = ("up", "--stack", "local", "--state", str(state))
    failed = _cli(emulator, *args, rc=1, **{FAULT_ENV: "create:tiny-app"})
    assert failed.stdout.count("error: ") == 1
    assert "injected failure" in failed.stdout and "before create of 'tiny-app'" in failed.stdout
    assert "The state file keeps what was applied (8 resources)" in failed.stdout
    assert not [a for a in emulator.state()["apps"] if a.get("state") != "stopped"]

    # Ctrl-C while the App is being created: that step finishes and is saved, then it stops.
    stopped = _cli(emulator, *args, rc=130, **{FAULT_ENV: "interrupt:create:tiny-app"})
    assert stopped.stdout.count("interrupted (Ctrl-C)") == 1, stopped.stdout
    assert "error: " not in stopped.stdout
    names = [r["name"] for r in json.loads(state.read_text())["resources"]]
    assert len(names) == 9 and "tiny-app" in names

    # A config error stops the program before its first resource: nothing was applied, and
    # the message says so (issue 34.7: it said "keeps what was applied (9 resources)").
    bad = _cli(emulator, *args, "--config", "modal-llm:monthlyBudgetUsd=-5", rc=1)
    assert "modal-llm:monthlyBudgetUsd = '-5' must be a number >= 0" in bad.stdout
    assert "Nothing was applied; the state file is as it was (9 resources)." in bad.stdout
    assert "keeps what was applied" not in bad.stdout

    again = _cli(emulator, *args, rc=0)
    assert "Resources: 9 unchanged" in again.stdout
    assert len([a for a in emulator.state()["apps"] if a.get("state") != "stopped"]) == 1
    assert os.stat(state).st_mode & 0o077 == 0


def test_errors_go_to_stderr_and_output_json_is_a_document(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    """Issue 34 item 2: `$(... output proxy_token_secret 2>/dev/null)` must hold the value or
    nothing, never an error line; `output --json` prints what `pulumi stack output --json`
    prints."""
    state = str(tmp_path / "local.json")
    missing = _cli(emulator, "output", "proxy_token_secret", "--stack", "pr-42", rc=1)
    assert missing.stdout == "", missing.stdout
    assert "error: no stack file Pulumi.pr-42.yaml" in missing.stderr
    _cli(emulator, "up", "--stack", "local", "--state", state, rc=0, passphrase="cli-test")
    one = _cli(emulator, "output", "endpoint_url", "--json", "--stack", "local", "--state", state,
               rc=0)  # fmt: skip
    assert json.loads(one.stdout).startswith("http://127.0.0.1:")
    every = json.loads(
        _cli(emulator, "output", "--json", "--stack", "local", "--state", state, rc=0).stdout
    )
    assert every["proxy_token_secret"] == "[secret]" and every["environment"] == "local"
    shown = _cli(emulator, "output", "proxy_token_secret", "--json", "--show-secrets",
                 "--stack", "local", "--state", state, rc=0)  # fmt: skip
    assert json.loads(shown.stdout).startswith("ws-")
    unknown = _cli(emulator, "output", "nope", "--stack", "local", "--state", state, rc=1)
    assert unknown.stdout == "" and "has no output 'nope'" in unknown.stderr
    _cli(emulator, "destroy", "--stack", "local", "--state", state, rc=0)
