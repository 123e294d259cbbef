"""With the real Pulumi CLI (marker `pulumi_cli`, skipped where `pulumi` is not installed):
preview, up, a no-change preview and destroy of the local stack against the emulator.

The project is copied to a temporary directory (the CLI writes an `encryptionsalt` into the
stack file) with the repo's .venv linked in; state goes to a temporary file backend.
Not run on our build machines, where the CLI cannot be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.emulator import EmulatorProcess
from tests.program.runner import PROJECT_ROOT

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow]
COPIED = ("Pulumi.yaml", "Pulumi.local.yaml", "__main__.py", "components", "serving")


def test_preview_up_noop_destroy_with_the_cli(tmp_path: Path, emulator: EmulatorProcess) -> None:
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        pytest.skip("the Pulumi CLI is not installed")
    work = tmp_path / "project"
    work.mkdir()
    for name in COPIED:
        src = PROJECT_ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, work / name)
    (work / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    env = {
        **emulator.subprocess_env(),
        "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
        "PULUMI_CONFIG_PASSPHRASE": "test-only",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_HOME": str(tmp_path / "pulumi-home"),
    }
    (tmp_path / "state").mkdir()

    def cli(*args: str) -> str:
        result = subprocess.run(
            [pulumi, *args, "--non-interactive"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"pulumi {args}: {result.stdout}\n{result.stderr}"
        return result.stdout

    cli("stack", "init", "local")
    cli("config", "set", "modal:serverUrl", emulator.url, "--stack", "local")
    preview = cli("preview", "--diff", "--stack", "local")
    assert "monthly_cost_worst_usd" in preview
    cli("up", "--yes", "--stack", "local")
    cli("preview", "--expect-no-changes", "--stack", "local")
    outputs = cli("stack", "output", "--json", "--stack", "local")
    assert '"environment": "local"' in outputs
    # Secrets stay hidden without --show-secrets: API keys (sk-...), proxy token secret (ws-...).
    assert "sk-" not in outputs and "ws-" not in outputs
    assert '"proxy_token_secret": "[secret]"' in outputs
    cli("destroy", "--yes", "--stack", "local")
    state = emulator.state()
    assert sorted(e["name"] for e in state["environments"]) == ["main"]
    assert os.listdir(tmp_path / "state")
