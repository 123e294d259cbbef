"""`cudagraph_sizes` (issue 36): vLLM's CUDA-graph capture sizes fitted to the service.

Unset ("engine"), nothing changes: the command line and the digest are what they were. With
"max_concurrency" the spec renders `--max-cudagraph-capture-size` = scaling.max_concurrency, a
flag both pinned vLLM releases have; the harness measures it (docs/gpu.md, 2026-11-28).
"""

from __future__ import annotations

import pytest

from serving import render
from serving.engine_flags import flag_list
from serving.spec import CUDAGRAPH_SIZE_FLAGS, ENGINE_RELEASES
from tests.serving.test_spec import make, problems


def test_default_leaves_the_command_and_the_digest_alone() -> None:
    spec = make()
    assert spec.cudagraph_sizes == "engine"
    assert "cudagraph_sizes" not in spec.to_json()
    assert not CUDAGRAPH_SIZE_FLAGS & set(render.engine_command(spec))
    assert make(cudagraph_sizes="engine").digest() == spec.digest()


def test_max_concurrency_renders_the_largest_size() -> None:
    spec = make(engine="vllm", cudagraph_sizes="max_concurrency", scaling={"max_concurrency": 48})
    cmd = render.engine_command(spec)
    at = cmd.index("--max-cudagraph-capture-size")
    assert cmd[at + 1] == "48"
    assert spec.digest() != make(engine="vllm", scaling={"max_concurrency": 48}).digest()


@pytest.mark.parametrize("version", sorted(ENGINE_RELEASES["vllm"]))
def test_every_vllm_release_has_the_flag(version: str) -> None:
    assert flag_list("vllm", version).options >= CUDAGRAPH_SIZE_FLAGS


def test_extra_args_that_set_sizes_too_are_refused() -> None:
    for args in (["--cudagraph-capture-sizes", "1", "2"], ["-cc", "{}"]):
        found = problems(engine="vllm", cudagraph_sizes="max_concurrency", extra_args=args)
        assert "sets the CUDA-graph sizes" in found["extra_args[0]"]
    # without the field, extra_args may set them as before
    assert make(engine="vllm", extra_args=["--max-cudagraph-capture-size", "32"])


def test_sglang_is_refused() -> None:
    found = problems(engine="sglang", cudagraph_sizes="max_concurrency")
    assert "is for vLLM" in found["cudagraph_sizes"]
