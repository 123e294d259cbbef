"""serving/prefetch.py: the weights read into the page cache from the container's start
(issue 36: 10.5-11 s of weights load became 2.0-2.5 s on an H200, docs/gpu.md runs AK-AM).

What is checked here, without a GPU: every byte of every weight file is read (odd sizes, many
ranges), nothing else is read, the hub cache's snapshot is found, it is skipped (one line
saying why) when off, when there are no files, or when they would not fit in memory, and
serving.engine's Container starts it before the engine.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from serving.engine import Container
from serving.prefetch import PREFETCH_ENV, start_prefetch, weights_dir
from tests.serving.test_engine_lifecycle import KEYS_ENV, Deaths, free_port, make_spec, stub_cmd


def _checkpoint(root: Path) -> int:
    """Two shards of odd sizes, a tokenizer file and a config; the shards' total bytes."""
    root.mkdir(parents=True)
    sizes = {"model-00001-of-00002.safetensors": 3 * 2**20 + 7, "model-00002.bin": 2**20 + 3}
    for name, size in sizes.items():
        (root / name).write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    (root / "tokenizer.json").write_text("{}")
    (root / "config.json").write_text("{}")
    return sum(sizes.values())


def test_every_byte_of_the_weight_files_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    total = _checkpoint(tmp_path / "weights" / "m")
    caplog.set_level(logging.INFO, "serving.engine")
    reader = start_prefetch(str(tmp_path / "weights" / "m"), tmp_path / "hf", available=2**40)
    assert reader is not None
    reader.block = 2**16  # many reads per range: the range arithmetic is what is tested
    reader.join(30)
    assert reader.total == total and reader.bytes == total and reader.error is None
    assert [f.name for f in reader.files] == [
        "model-00001-of-00002.safetensors", "model-00002.bin",
    ]  # fmt: skip
    assert "weights prefetch: reading 0.0 GiB in 2 files" in caplog.text
    assert "weights prefetch: done" in caplog.text


def test_the_hub_cache_snapshot_of_a_hub_model_is_found(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    snap = hf / "hub" / "models--Org--Model-1B" / "snapshots" / "abc123"
    _checkpoint(snap)
    assert weights_dir("Org/Model-1B", hf) == snap
    assert weights_dir("Org/Other", hf) is None
    assert weights_dir("relative/dir", hf) is None


@pytest.mark.parametrize(
    ("env", "available", "why"),
    [
        ("0", 2**40, f"off ({PREFETCH_ENV}=0)"),
        ("", 2**20, "would not stay in the page cache"),
    ],
)
def test_skipped_with_the_reason(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    env: str,
    available: int,
    why: str,
) -> None:
    _checkpoint(tmp_path / "m")
    monkeypatch.setenv(PREFETCH_ENV, env)
    caplog.set_level(logging.INFO, "serving.engine")
    assert start_prefetch(str(tmp_path / "m"), tmp_path / "hf", available=available) is None
    assert why in caplog.text


def test_no_files_yet_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "serving.engine")
    assert start_prefetch("Org/Model", tmp_path / "hf", available=2**40) is None
    assert "skipped, no weight files of Org/Model here yet" in caplog.text


def test_the_container_starts_it_before_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = tmp_path / "hf"
    # make_spec's model, as an earlier container left it in the hub cache Volume
    total = _checkpoint(hf / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "rev")
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.setenv("SERVING_API_KEYS", KEYS_ENV["SERVING_API_KEYS"])
    engine_port = free_port()
    c = Container(
        make_spec(snapshot=False),
        proxy_port=free_port(),
        engine_port=engine_port,
        engine_argv=stub_cmd(engine_port),
        on_death=Deaths(),
    )
    try:
        c.start()
        assert c.prefetch is not None
        c.prefetch.join(30)
        assert c.prefetch.bytes == total
        c.ready()
    finally:
        c.stop()
