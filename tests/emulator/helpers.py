"""Helpers for the emulator tests: run the real `modal` CLI and raw RPCs against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess

MODAL_BIN = str(Path(sys.executable).with_name("modal"))
APPS_DIR = Path(__file__).resolve().parent / "apps"


def modal_cli(
    emu: EmulatorProcess,
    *args: str,
    extra_env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`modal ARGS...` as a subprocess pointed at `emu`; raises with its output on failure."""
    proc = subprocess.run(
        [MODAL_BIN, *args],
        env=emu.subprocess_env(extra_env),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`modal {' '.join(args)}` exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
            f"stderr:\n{proc.stderr}\nemulator log:\n{emu.stderr_tail()}"
        )
    return proc


def cli_batch(emu: EmulatorProcess, *commands: list[str]) -> list[dict[str, Any]]:
    """Several CLI commands in one subprocess (see cli_batch.py); one result dict each."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.emulator.cli_batch", json.dumps(list(commands))],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"argv"')]
    if proc.returncode != 0 or len(lines) != len(commands):
        raise AssertionError(
            f"cli_batch failed (exit {proc.returncode}, {len(lines)}/{len(commands)} results)\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return [json.loads(line) for line in lines]


def json_out(result: dict[str, Any]) -> Any:
    """The JSON a `--json` command printed."""
    assert result["exit_code"] == 0, result
    return json.loads(result["stdout"])


def raw_rpc(method: str, request: Any) -> Any:
    """Call one RPC through the SDK's client from sync code (the env decides the server)."""
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client

    async def _call() -> Any:
        client = await _Client.from_env()
        return await getattr(client._stub, method)(request)

    return synchronizer.create_blocking(_call)()


def raw_stream(method: str, request: Any) -> list[Any]:
    """Every message of a server-streaming RPC, through the SDK's client from sync code."""
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client

    async def _call() -> list[Any]:
        client = await _Client.from_env()
        return [m async for m in getattr(client._stub, method).unary_stream(request)]

    return synchronizer.create_blocking(_call)()
