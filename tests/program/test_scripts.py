"""scripts/: `make up` picks its engine (CLI or stand-in) clearly; the gateway file is written
safely. The emulator's port and ownership: tests/program/test_local_loop.py (issue 22.9). The
live path (up, curl, rotate, down): tests/program/test_live_stack.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml
from pulumi.runtime import rpc

from tests.program.runner import PROJECT_ROOT, run_program, stack_config


def test_without_pulumi_cli_the_standin_is_chosen_in_one_banner_line(tmp_path: Path) -> None:
    env = {
        "PULUMI_INSTALL_URL": "http://127.0.0.1:9/unreachable",  # installer cannot be fetched
    }
    result = _bash('choose_engine; echo "ENGINE=$LOCAL_ENGINE"', tmp_path, **env)
    assert result.returncode == 0, result.stderr
    banner, engine = result.stdout.splitlines()
    assert engine == "ENGINE=standin"
    assert banner.startswith("No Pulumi CLI (not installed, and http://127.0.0.1:9/unreachable")
    assert "using the Pulumi stand-in python -m pulumi_standin" in banner
    assert "NOT the Pulumi engine" in banner

    # PULUMI_ENGINE=cli insists on the CLI: a clear stop, with how to get it.
    forced = _bash("choose_engine; echo STARTED", tmp_path, PULUMI_ENGINE="cli", **env)
    assert forced.returncode == 1 and "STARTED" not in forced.stdout
    assert "PULUMI_ENGINE=cli, but the Pulumi CLI is not installed" in forced.stderr
    assert "curl -fsSL https://get.pulumi.com | sh -s -- --version 3.272.0" in forced.stderr


def test_up_refuses_other_stacks() -> None:
    result = subprocess.run(
        ["bash", "scripts/up.sh", "prod"], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "drives the emulator-backed 'local' stack only" in result.stderr


def test_gateway_config_written_from_stack_outputs(tmp_path: Path) -> None:
    config, secret_keys = stack_config("local")
    run = run_program("local", config, secret_keys)
    # What `pulumi stack output --json --show-secrets` prints: plain values.
    outputs = {k: rpc.unwrap_rpc_secret(v) for k, v in run.outputs.items()}
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps(outputs))
    out = tmp_path / "gw" / "litellm.yaml"
    result = subprocess.run(
        [sys.executable, "scripts/gateway_config.py", "--stack", "local",
         "--outputs-json", str(saved), "--out", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    doc = yaml.safe_load(out.read_text())
    # The stack's document, plus the gateway's own master key (test_local_loop: issue 22.12).
    master_key = doc["general_settings"].pop("master_key")
    assert master_key.startswith("sk-") and master_key not in result.stdout
    assert doc == yaml.safe_load(outputs["gateway_config"])
    assert doc["model_list"][0]["litellm_params"]["api_key"] == outputs["api_keys"]["gateway"]
    assert outputs["api_keys"]["gateway"] not in result.stdout + result.stderr


def test_gateway_config_reports_missing_output(tmp_path: Path) -> None:
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps({"gateway_config": "[secret]"}))
    result = subprocess.run(
        [sys.executable, "scripts/gateway_config.py", "--outputs-json", str(saved),
         "--out", str(tmp_path / "x.yaml")],
        cwd=PROJECT_ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1
    assert "'gateway_config' is missing or empty (got [secret])" in result.stderr
    assert "--show-secrets" in result.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_gateway_file_that_existed_world_readable_ends_private(tmp_path: Path) -> None:
    config, secret_keys = stack_config("local")
    run = run_program("local", config, secret_keys)
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps({k: rpc.unwrap_rpc_secret(v) for k, v in run.outputs.items()}))
    out = tmp_path / ".gateway" / "litellm-local.yaml"
    out.parent.mkdir()
    out.write_text("old\n")
    out.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "scripts/gateway_config.py", "--outputs-json", str(saved),
         "--out", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert out.read_text() != "old\n"
    assert (out.parent / ".gitignore").read_text() == "*\n"


def _bash(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `script` with scripts/local-env.sh sourced, in the project root."""
    return subprocess.run(
        ["bash", "-c", f". scripts/local-env.sh\n{script}"],
        cwd=PROJECT_ROOT,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fake_cli(tmp_path: Path, body: str) -> None:
    """A `pulumi` executable printing what the real CLI prints in the case under test."""
    cli = tmp_path / "pulumi"
    cli.write_text(f"#!/bin/sh\n{body}\n")
    cli.chmod(0o755)


def test_other_pulumi_version_is_named_in_a_warning(tmp_path: Path) -> None:
    _fake_cli(tmp_path, 'echo "v3.100.0"')
    result = _bash("find_pulumi_cli && echo READY", tmp_path)
    assert result.returncode == 0 and "READY" in result.stdout
    assert "pulumi CLI 3.100.0 is installed; this project pins 3.272.0" in result.stderr
    _fake_cli(tmp_path, 'echo "v3.272.0"')
    assert "warning" not in _bash("find_pulumi_cli", tmp_path).stderr


def test_34_the_pulumi_installer_says_first_what_it_does_and_how_long(tmp_path: Path) -> None:
    """Issue 34 (progress lines for every step over ~10 s): where Pulumi's installer can be
    fetched, `make up` runs it (it downloads the CLI's release archive: seconds to minutes); the
    line before it said what, not how long. The installer here is a fake one (a file:// URL, as
    curl fetches it) that puts a `pulumi` printing the pinned version into ~/.pulumi/bin."""
    installer = tmp_path / "install.sh"
    installer.write_text(
        'mkdir -p "$HOME/.pulumi/bin"\n'
        "printf '#!/bin/sh\\necho v3.272.0\\n' > \"$HOME/.pulumi/bin/pulumi\"\n"
        'chmod +x "$HOME/.pulumi/bin/pulumi"\n'
    )
    result = _bash(
        'choose_engine; echo "ENGINE=$LOCAL_ENGINE"', tmp_path,
        PULUMI_INSTALL_URL=installer.as_uri(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "ENGINE=cli", result.stdout
    (said,) = [line for line in result.stdout.splitlines() if "official installer" in line]
    assert said.startswith("Pulumi CLI not found: installing 3.272.0"), said
    assert "min" in said, f"no estimate of how long: {said!r}"


def test_down_distinguishes_a_missing_stack_from_a_failure(tmp_path: Path) -> None:
    script = 'if select_existing_stack local; then echo SELECTED; else echo "NO STACK"; fi'
    _fake_cli(tmp_path, "echo \"error: no stack named 'local' found\" >&2; exit 255")
    missing = _bash(script, tmp_path)
    assert (missing.returncode, missing.stdout.strip(), missing.stderr) == (0, "NO STACK", "")
    _fake_cli(tmp_path, 'echo "error: failed to decrypt: incorrect passphrase" >&2; exit 255')
    broken = _bash(script, tmp_path)
    assert broken.returncode == 1 and "NO STACK" not in broken.stdout
    assert "failed to decrypt: incorrect passphrase" in broken.stderr
    assert "`pulumi stack select local` failed" in broken.stderr


def test_34_8_every_quiet_install_says_first_what_it_does_and_how_long() -> None:
    """Issue 34 item 8: `make up` on a fresh machine ran pip quietly for minutes with no line.
    Every `pip install` of the setup recipes (what make would run from nothing: -n -B) comes
    after a `setup: installing ... (... min ...)` line."""
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", ".venv/litellm/.installed"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=True,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")},
    ).stdout.splitlines()  # fmt: skip
    installs = [i for i, line in enumerate(planned) if " install " in line and "pip" in line]
    assert len(installs) >= 3, planned  # pip itself, the project, LiteLLM
    for i in installs:
        said = [line for line in planned[:i] if line.startswith('echo "setup: installing')]
        assert said and "min" in said[-1], (planned[i], planned[:i])
    assert planned[-1].startswith('echo "setup:') and planned[-1].endswith('ready."')
