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
- `served_sglang` (session): the same for SGLang 0.5.15 (`bench.gpu.device.sglang_spec_dict`,
  SGLang's part ahead on the path); if the start with `snapshot: true` fails (SGLang's memory
  saver), the reason is kept (`Served.snapshot_error`, checks.json) and it starts once more
  without, so that the other checks still run and only the snapshot test fails;
- `results` (session): a dict the tests fill with what they measured, written at the end to
  `$GPU_RESULTS/checks.json` (the runner sets GPU_RESULTS to $OUT).
"""

from __future__ import annotations

import contextlib
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
    config.addinivalue_line(
        "markers", "sglang: SGLang 0.5.15 on the GPU (bench.gpu.remote run --phases sglang)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reasons: dict[bool, str | None] = {}
    for item in gpu_items:
        sglang = item.get_closest_marker("sglang") is not None
        if sglang not in reasons:
            reasons[sglang] = device.why_not_here_sglang() if sglang else device.why_not_here()
        reason = reasons[sglang]
        if reason is not None:
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


@pytest.fixture(scope="session")
def served_sglang(
    tmp_path_factory: pytest.TempPathFactory, results: dict[str, Any]
) -> Iterator[Served]:
    log_file = results_dir(tmp_path_factory) / "checks-sglang-engine.log"
    env = device.run_env("sglang")
    specs = tmp_path_factory.mktemp("sglang-spec")
    spec = device.sglang_spec_dict(snapshot=True)
    snapshot_error = None
    with contextlib.ExitStack() as stack:
        try:
            srv = stack.enter_context(
                Served.start(
                    device.write_spec(specs / "snapshot.json", spec),
                    log_file,
                    snapshot_cycle=True,
                    env=env,
                )
            )
        except AssertionError as exc:  # did not reach SERVING READY: keep why, start plain
            snapshot_error = str(exc)[-4000:]
            with log_file.open("a") as log:
                log.write("\n---- the snapshot start failed; starting without snapshot ----\n")
            spec = device.sglang_spec_dict()
            srv = stack.enter_context(
                Served.start(device.write_spec(specs / "plain.json", spec), log_file, env=env)
            )
        srv.snapshot_error = snapshot_error
        results["served_sglang"] = {
            "spec": spec,
            "ready_s": srv.ready_s,
            "snapshot_error": snapshot_error,
        }
        yield srv
    results["served_sglang"]["exit_code"] = srv.exit_code
