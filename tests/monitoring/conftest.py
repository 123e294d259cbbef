"""promtool (Prometheus' own rule checker and unit-test runner) for the monitoring tests.

It comes from Debian's `prometheus` package (2.42.0 on this machine:
`apt-get install -y --no-install-recommends prometheus`). Without it the tests that need it
skip and say how to install it; nothing else stands in for it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.monitoring import MonitoredService, Slo, monitoring_outputs

SERVICE = MonitoredService("chat", Slo(ttft_s=2.5, ttft_objective=0.99))
ENVIRONMENT = "llm-test"
STACK = "test"


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(
            "promtool is not installed: `apt-get install -y --no-install-recommends prometheus` "
            "(Debian's package ships it)"
        )
    return path


@pytest.fixture(scope="session")
def outputs() -> dict[str, str]:
    return monitoring_outputs([SERVICE, "embed"], STACK, ENVIRONMENT)


@pytest.fixture
def run_promtool(promtool: str, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`promtool ARGS...` in tmp_path, after writing FILES (name -> text, or data to dump as
    YAML) there."""

    def run(*args: str, files: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        for name, content in files.items():
            text = content if isinstance(content, str) else yaml.safe_dump(content)
            (tmp_path / name).write_text(text)
        return subprocess.run(
            [promtool, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )

    return run
