"""The container's memory request (issue 24 item 5): derived from the engine's processes (their
measured RSS, serving/spec.py), overridable with `memory_gib`, refused below what the processes
need, left out of the digest when unset.

Expected figures are computed here from the documented rule, not read from the code: per HTTP
server 1.6 GiB, per engine process 2.2 GiB (under TP n: the engine core + n workers, each GPU
worker +1 GiB), SGLang's detokenizer 1.25 GiB, the proxy and Modal's runtime 1 GiB; request =
sum x 1.25 rounded up to a whole GiB, in MiB.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from serving import render
from serving.spec import ServingSpec


def make(**kw: Any) -> ServingSpec:
    base: dict[str, Any] = {"engine": "vllm", "model": "Qwen/Qwen3-8B", "served_model_name": "q"}
    return ServingSpec.model_validate({**base, **kw})


def request_mib(floor_gib: float) -> int:
    return math.ceil(round(floor_gib * 1.25, 6)) * 1024


def test_vllm_default_four_api_servers() -> None:
    s = make()
    floor = 4 * 1.6 + 2.2 + 1.0  # 4 API servers, the engine core, proxy + runtime = 9.6 GiB
    assert render.sizing(s).memory_floor_gib == pytest.approx(floor)
    assert render.sizing(s).memory_mib == request_mib(floor) == 12 * 1024


def test_vllm_snapshot_one_api_server() -> None:
    s = make(snapshot=True, context_length=2048)
    floor = 1 * 1.6 + 2.2 + 1.0  # 4.8 GiB
    assert render.sizing(s).memory_mib == request_mib(floor) == 6 * 1024


def test_vllm_tensor_parallel_two_gpus() -> None:
    s = make(gpu_count=2)
    floor = 4 * 1.6 + 3 * 2.2 + 2 * 1.0 + 1.0  # engine core + 2 workers, +1 GiB per worker
    assert render.sizing(s).memory_mib == request_mib(floor) == 20 * 1024


def test_sglang_default_and_more_tokenizer_workers() -> None:
    floor = 1 * 1.6 + 2.2 + 1.25 + 1.0  # tokenizer worker, scheduler, detokenizer, proxy
    assert render.sizing(make(engine="sglang")).memory_mib == request_mib(floor) == 8 * 1024
    four = 4 * 1.6 + 2.2 + 1.25 + 1.0
    assert render.sizing(make(engine="sglang", api_server_count=4)).memory_mib == request_mib(four)


def test_api_servers_from_the_cpu_request_set_the_memory_too() -> None:
    assert render.sizing(make(cpu=8)).memory_mib == request_mib(6 * 1.6 + 2.2 + 1.0)
    assert render.sizing(make(api_server_count=2)).memory_mib == request_mib(2 * 1.6 + 2.2 + 1.0)


def test_the_request_does_not_follow_the_gpu_or_the_model() -> None:
    # the weights and KV cache are GPU memory: same processes, same host memory
    assert render.sizing(make(gpu="T4")).memory_mib == render.sizing(make(gpu="H200")).memory_mib
    other = make(model="google/gemma-3-27b-it", gpu="H200")
    assert render.sizing(other).memory_mib == render.sizing(make()).memory_mib


def test_explicit_memory_wins() -> None:
    assert render.sizing(make(memory_gib=32)).memory_mib == 32 * 1024
    assert render.sizing(make(memory_gib=12.5)).memory_mib == 12800
    # at the processes' own figure (no headroom) is allowed
    assert render.sizing(make(memory_gib=9.6)).memory_mib == math.ceil(9.6 * 1024)


def test_too_little_memory_is_refused_with_the_figure_and_the_fix() -> None:
    with pytest.raises(ValidationError) as info:
        make(memory_gib=8)
    text = str(info.value)
    assert "memory_gib\n" in text  # the field it names
    assert "memory_gib=8 is below what the engine's processes need: 9.6 GiB" in text
    assert "1.6 GiB per API server x 4" in text
    assert "Raise memory_gib to at least 10, or leave it unset (derived: 12 GiB" in text
    # SGLang with 4 tokenizer workers: 4 x 1.6 + 2.2 + 1.25 + 1 = 10.85 GiB
    with pytest.raises(ValidationError, match=r"need: 10\.85 GiB"):
        make(engine="sglang", api_server_count=4, memory_gib=10)


def test_bounds() -> None:
    with pytest.raises(ValidationError, match="memory_gib"):
        make(memory_gib=0.5)
    with pytest.raises(ValidationError, match="memory_gib"):
        make(memory_gib=257)


def test_unset_memory_keeps_the_digest_set_memory_changes_it() -> None:
    text = make().to_json()
    assert "memory_gib" not in json.loads(text)
    assert make(memory_gib=None).to_json() == text
    assert make(memory_gib=16).digest() != make().digest()
    assert json.loads(make(memory_gib=16).to_json())["memory_gib"] == 16.0
    back = ServingSpec.model_validate_json(make(memory_gib=16).to_json())
    assert render.sizing(back).memory_mib == 16 * 1024
