"""The GPU harness's own logic, on this machine (no GPU): what it reads from vLLM's real start
lines and from a real run's files (data/gpu-runs/), the page-cache eviction before a cold
start, the model's shape, and the refusal of an unknown engine-core start method."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import remote

RUNS = Path(__file__).resolve().parents[2] / "data" / "gpu-runs"
RUN_8B = RUNS / "2026-11-27-h100-8b"
LINE = re.compile(r"^\s*([\d.]+) (.*)$")


def start_lines(log: Path) -> list[tuple[float, str]]:
    """(seconds, line) of an engine log as serving() keeps them (its START_LINES filter)."""
    out = []
    for raw in log.read_text(errors="replace").splitlines():
        m = LINE.match(raw)
        if m and remote.ENGINE_START_LINES.search(m.group(2)) and '"path"' not in m.group(2):
            out.append((float(m.group(1)), m.group(2)[:300]))
    return out


@pytest.mark.parametrize(
    ("log", "run", "key"),
    [
        ("coldstart-cold-p.log", "run-p-coldstart.json", "cold"),
        ("coldstart-warm-fork-p.log", "run-p-coldstart.json", "warm-fork"),
        ("coldstart-warm-fork-s.log", "run-s-coldstart.json", "warm-fork"),
    ],
)
def test_phases_from_vllm_start_lines_as_the_run_recorded(log: str, run: str, key: str) -> None:
    """phases() on vLLM 0.26.0's own start lines (a kept log) gives what the run recorded."""
    found = remote.phases(start_lines(RUN_8B / log))
    recorded = json.loads((RUN_8B / run).read_text())["coldstart"][key]
    for name in ("architecture_at_s", "engine_core_at_s", "torch_compile_s", "ready_at_s"):
        assert found[name] == pytest.approx(recorded[name], abs=0.01), name
    # forked, the engine core is up within seconds of the model's architecture; spawned,
    # ~20 s later (its second import): what the spec's VLLM_MULTIPROC_METHOD rests on
    gap = found["engine_core_at_s"] - found["architecture_at_s"]
    assert gap < 5 if "fork" in key else gap > 15


def test_cpu_by_round_from_a_real_run_matches_its_log() -> None:
    """cpu_by_round on run Q's samples and rounds gives the table its log printed."""
    rows = remote.cpu_by_round(RUN_8B / "cpu-q.jsonl", RUN_8B / "bench-q.json")
    logged = (RUN_8B / "run-q.log").read_text()
    assert len(rows) >= 25, "rounds without CPU samples around them"
    assert remote.cpu_table(rows) in logged


def test_drop_page_cache_covers_every_file_once(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.safetensors").write_bytes(b"x" * 3 * 2**20)
    (tmp_path / "sub" / "b.json").write_bytes(b"y" * 2**20)
    os.symlink(tmp_path / "a.safetensors", tmp_path / "link.safetensors")  # not counted twice
    assert remote.drop_page_cache(tmp_path) == 4.0


def test_model_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote.device, "MODEL_DIR", tmp_path)
    assert "error" in remote.model_shape()  # no model made yet
    config = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 8}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 2**20)
    shape = remote.model_shape()
    assert shape == {**config, "num_key_value_heads": 8, "weights_gib": 0.0}


def test_unknown_coldstart_method_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["run", "--phases", "coldstart", "--start-methods", "default,forkk"]
    assert remote.main(argv) == 2
    assert "--start-methods 'default,forkk'" in capsys.readouterr().out
    assert not (tmp_path / "run.json").exists()


def test_wait_http_ok_then_stop_group(tmp_path: Path) -> None:
    """The harness's start/stop of a process group: ready once the URL answers 200; a process
    that exits first is reported at once; SIGTERM to the group stops it."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert remote.wait_http_ok(server, f"http://127.0.0.1:{port}/", 30, "server", log) < 30
    finally:
        assert remote.stop_group(server, 10) is not None
    assert server.poll() is not None
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    with pytest.raises(RuntimeError, match=r"dead one exited 3; see .*server\.log"):
        remote.wait_http_ok(dead, f"http://127.0.0.1:{port}/", 30, "dead one", log)


def test_every_bench_spec_caps_the_proxy_above_its_streams() -> None:
    """Run X: the SGLang bench without --plain left the proxy at its default cap (256 in
    flight), and 1024 streams got 429s. Every bench's spec must let the plan's streams in."""
    from serving import render
    from serving.spec import ServingSpec

    most = 1024  # issue 24 item 4's most streams, the largest level of any plan in docs/gpu.md
    specs = [
        remote.bench_spec(plain=False),
        remote.bench_spec(plain=True, proxy_workers=4),
        remote.sglang_bench_spec(plain=False),
        remote.sglang_bench_spec(plain=True, workers=4, proxy_workers=4),
    ]
    for raw in specs:
        spec = ServingSpec.model_validate(raw)
        assert spec.proxy.max_in_flight >= most, raw
    sglang = ServingSpec.model_validate(remote.sglang_bench_spec(False, 4, 4))
    assert render.sizing(sglang).api_servers == 4 and render.proxy_workers(sglang) == 4
    assert "gpu_memory_fraction" not in remote.sglang_bench_spec(plain=False)
    assert "gpu_memory_fraction" not in remote.bench_spec(plain=False)
    assert render.proxy_workers(ServingSpec.model_validate(remote.bench_spec(True, 4))) == 4


def test_start_method_is_set_for_the_starts_inside_and_cleared_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    monkeypatch.delenv(remote.MP_METHOD_ENV, raising=False)
    with remote.start_method("fork"):
        assert os.environ[remote.MP_METHOD_ENV] == "fork"
    assert remote.MP_METHOD_ENV not in os.environ
    monkeypatch.setenv(remote.MP_METHOD_ENV, "spawn")  # left by an earlier method
    with remote.start_method("default"):
        assert remote.MP_METHOD_ENV not in os.environ
    with pytest.raises(RuntimeError), remote.start_method("spawn"):
        raise RuntimeError("a start that fails")
    assert remote.MP_METHOD_ENV not in os.environ


# ---- issue 36: the cold-start plan ---------------------------------------------------------


def test_coldstart_plan_steps_and_a_bad_step_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = remote.parse_plan("cold, warm+graphs,baked+prefetch+graphs,")
    assert plan == [
        ("cold", frozenset()),
        ("warm", frozenset({"graphs"})),
        ("baked", frozenset({"graphs", "prefetch"})),
    ]
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["run", "--phases", "coldstart", "--coldstart-plan", "cold,warm+grahps"]
    assert remote.main(argv) == 2
    assert "'warm+grahps'" in capsys.readouterr().out
    assert not (tmp_path / "run.json").exists()


def test_graph_sizes_from_vllm_capture_lines() -> None:
    """vLLM 0.26.0's capture progress bars as the 8B-shaped runs logged them: 51 sizes each."""
    lines = start_lines(RUN_8B / "coldstart-warm-fork-s.log")
    assert remote.graph_sizes(lines) == [51, 51]


def test_plan_table_shows_each_step_and_the_skipped(tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [
        {"step": "cold-1", "cache": "empty", "ready_at_s": 101.5, "graph_sizes": [11, 11]},
        {"step": "warm-1", "skipped": "40 s left"},
    ]
    table = remote.plan_table(steps).splitlines()
    assert table[0].startswith("| step | cache |") and len(table) == 4
    assert "| cold-1 | empty |" in table[2] and "101.5" in table[2] and "[11, 11]" in table[2]
    assert table[3] == "| warm-1 | skipped (40 s left) |"


def test_prefetch_done_at_reads_serving_engines_line() -> None:
    """The +prefetch lever is serving.engine's own reader now (serving/prefetch.py, tested in
    tests/serving/test_prefetch.py); the harness reads when it said it was done."""
    lines = [
        (0.4, "[serving] weights prefetch: reading 15.0 GiB in 4 files under /weights/m"),
        (8.91, "[serving] weights prefetch: done, 15.0 GiB in 8.5 s (1.76 GiB/s)"),
    ]
    assert remote.prefetch_done_at(lines) == 8.91
    assert remote.prefetch_done_at(lines[:1]) is None


def test_parse_importtime_sums_own_time_by_package() -> None:
    stderr = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:    100000 |     100000 |     torch._C",
            "import time:   2000000 |    2100000 |   torch",
            "import time:    500000 |     500000 |   regex",
            "import time:   1000000 |    3600000 | vllm",
            "import time:     50000 |      50000 | site",
        ]
    )
    found = remote.parse_importtime(stderr)
    assert found["imports_total_s"] == 3.65  # the top-level entries' cumulative times
    assert found["modules"] == 5
    assert found["self_by_package"][:3] == [["torch", 2.1], ["vllm", 1.0], ["regex", 0.5]]
    assert found["cumulative_to_depth_3"][:2] == [["vllm", 0, 3.6], ["torch", 1, 2.1]]
    assert found["top_level"] == [["vllm", 3.6], ["site", 0.05]]
