"""The container's CPUs and vLLM's API-server processes (issue 24 item 5): derived from each
other, each overridable, rendered as `--api-server-count`, left out of the digest when unset."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from serving import render
from serving.sizing import DEFAULT_API_SERVERS
from serving.spec import ServingSpec


def make(**kw: Any) -> ServingSpec:
    base: dict[str, Any] = {"engine": "vllm", "model": "Qwen/Qwen3-8B", "served_model_name": "q"}
    return ServingSpec.model_validate({**base, **kw})


def asc(spec: ServingSpec) -> str | None:
    cmd = render.engine_command(spec)
    return cmd[cmd.index("--api-server-count") + 1] if "--api-server-count" in cmd else None


def test_default_four_api_servers_and_the_cpus_they_need() -> None:
    s = make()
    assert render.sizing(s).api_servers == DEFAULT_API_SERVERS == 4
    assert asc(s) == "4"
    assert render.sizing(s).cpu == 6.0  # 4 API servers + the engine core + the proxy


def test_api_servers_follow_the_cpu_request() -> None:
    assert render.sizing(make(cpu=8)).api_servers == 6
    assert asc(make(cpu=8)) == "6"
    assert render.sizing(make(cpu=2.5)).api_servers == 1  # no core left over: one, and no flag
    assert asc(make(cpu=2.5)) is None
    # tensor parallel: one worker process per GPU beside the engine core
    tp = make(gpu_count=2, cpu=8)
    assert render.sizing(tp).api_servers == 4
    assert render.sizing(make(gpu_count=2)).cpu == 8.0


def test_explicit_count_wins_and_sets_the_cpu_request() -> None:
    s = make(api_server_count=2)
    assert asc(s) == "2" and render.sizing(s).cpu == 4.0
    assert render.engine_command(make(api_server_count=1)).count("--api-server-count") == 0
    assert render.sizing(make(api_server_count=3, cpu=16)).api_servers == 3


def test_too_few_cpus_for_the_count_is_refused() -> None:
    with pytest.raises(ValidationError, match="cpu=4 is below what api_server_count=8 needs: 10"):
        make(cpu=4, api_server_count=8)


def test_snapshot_keeps_one_api_server_unless_asked() -> None:
    s = make(snapshot=True, context_length=2048)
    assert render.sizing(s).api_servers == 1 and asc(s) is None and render.sizing(s).cpu == 3.0
    assert asc(make(snapshot=True, context_length=2048, api_server_count=2)) == "2"


def test_flag_in_extra_args_is_refused_for_the_field() -> None:
    for flag in ("--api-server-count", "-asc", "--api_server_count"):
        with pytest.raises(ValidationError, match="set api_server_count"):
            make(extra_args=[flag, "2"])


def test_sglang_tokenizer_workers_are_its_api_servers() -> None:
    s = make(engine="sglang")
    assert (
        render.sizing(s).api_servers == 1 and render.sizing(s).cpu == 4.0
    )  # tokenizer + detokenizer + core + proxy
    assert "--tokenizer-worker-num" not in render.engine_command(s)
    four = make(engine="sglang", api_server_count=4)
    cmd = render.engine_command(four)
    assert cmd[cmd.index("--tokenizer-worker-num") + 1] == "4"
    assert render.sizing(four).cpu == 7.0  # 4 tokenizer workers + detokenizer + core + proxy
    assert "--api-server-count" not in cmd
    with pytest.raises(ValidationError, match="cpu=4 is below what api_server_count=4 needs: 7"):
        make(engine="sglang", cpu=4, api_server_count=4)
    with pytest.raises(ValidationError, match="set api_server_count"):
        make(engine="sglang", extra_args=["--tokenizer-worker-num", "2"])


def test_unset_fields_keep_the_digest_set_fields_change_it() -> None:
    assert '"cpu"' not in make().to_json() and "api_server_count" not in make().to_json()
    assert make(cpu=8).digest() != make().digest()
    assert make(api_server_count=4).digest() != make().digest()
