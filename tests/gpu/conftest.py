"""The GPU tests: marker `gpu`, skipped with the reason where they cannot run, and fixtures.

They need the lent GPU machine prepared by `python3 -m bench.gpu.remote prepare` (vLLM 0.26.0
unpacked in /tmp/site, the model in /tmp/gpu-model) and are run there by
`python3 -m bench.gpu.remote run`, with `--confcutdir tests/gpu` (the root conftest's
emulator fixtures need packages the GPU image lacks). Anywhere else (CI, a laptop) every test
here is skipped with the reason `bench.gpu.device.why_not_here()` gives; nothing is started.

Fixtures:
- `served` (session): `python -m serving.engine --spec <snapshot spec> --snapshot-cycle`, the
  container's own lifecycle with the proxy in front, until it prints SERVING READY; every line
  it prints is kept with the second it came, and it is stopped (SIGTERM) at the end;
- `results` (session): a dict the tests fill with what they measured, written at the end to
  `$GPU_RESULTS/checks.json` (the runner sets GPU_RESULTS to $OUT).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import device
from tests.gpu.support import Served


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a GPU and the payload (skipped without)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = device.why_not_here()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("GPU_RESULTS")
    return Path(given) if given else tmp_path_factory.getbasetemp()


@pytest.fixture(scope="session")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    found: dict[str, Any] = {}
    yield found
    path = results_dir(tmp_path_factory) / "checks.json"
    path.write_text(json.dumps(found, indent=1, default=str) + "\n")


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory, results: dict[str, Any]) -> Iterator[Served]:
    spec = device.spec_dict(snapshot=True)
    spec_file = device.write_spec(tmp_path_factory.mktemp("spec") / "spec.json", spec)
    log_file = results_dir(tmp_path_factory) / "checks-engine.log"
    with Served.start(spec_file, log_file, snapshot_cycle=True) as srv:
        results["served"] = {"spec": spec, "ready_s": srv.ready_s}
        yield srv
    results["served"]["exit_code"] = srv.exit_code
