"""scripts/: `make up` stops clearly without the Pulumi CLI; the gateway file is written safely."""

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


def test_up_without_pulumi_cli_says_what_is_missing(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",  # no pulumi here
        "HOME": str(tmp_path),  # no ~/.pulumi/bin either
        "PULUMI_INSTALL_URL": "http://127.0.0.1:9/unreachable",  # installer cannot be fetched
    }
    result = subprocess.run(
        ["bash", "scripts/up.sh", "local"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "the Pulumi CLI is missing and could not be installed" in result.stderr
    assert "curl -fsSL https://get.pulumi.com | sh -s -- --version 3.272.0" in result.stderr
    # It stopped before starting anything.
    assert "Starting the Modal emulator" not in result.stdout


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
