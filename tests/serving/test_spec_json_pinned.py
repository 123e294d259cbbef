"""The spec's JSON text is a contract: the deploy side writes it, the container reads it back, and
its sha256 decides whether an App is redeployed. These texts and digests are pinned byte for
byte, so that a change to the model (a field moved, a default, a serialisation option) that
would redeploy every existing service fails here first."""

from __future__ import annotations

from typing import Any

import pytest

from serving.spec import ServingSpec
from tests.serving.test_spec import SHA, make

FULL: dict[str, Any] = {
    "engine_version": "0.26.0",
    "revision": SHA,
    "gpu": ["H200", "H100"],
    "gpu_count": 2,
    "context_length": 32768,
    "extra_args": ["--seed", "1"],
    "scaling": {
        "min_containers": 1,
        "max_containers": 4,
        "buffer_containers": 1,
        "scaledown_window_s": 600,
        "target_concurrency": 16,
        "max_concurrency": 48,
    },
    "warmup_prompts": ["Hi", "ünï ✓"],
    "volumes": {"hf_cache": "hf", "engine_cache": "ec"},
    "secrets": {"hf_token": "hf-token", "api_keys": "keys"},
    "region": "eu-west",
    "timeouts": {"startup_s": 900, "request_s": 300},
    "proxy": {
        "max_in_flight": 64,
        "max_body_bytes": 2048,
        "keepalive_s": 5,
        "workers": 2,
        "key_max_in_flight": {"team-a": 8},
    },
    "require_pinned_revision": True,
    "routing_region": "us-west",
    "gpu_memory_fraction": 0.9,
    "engine_standin": {"fail": "never-ready", "startup_delay_s": 1.5},
    "weights": {"volume": "weights", "path": "rev-1"},
    "cpu": 12,
    "api_server_count": 4,
    "memory_gib": 24,
    "cudagraph_sizes": "max_concurrency",
}

_DEFAULTS = (
    '"proxy":{"keepalive_s":15.0,"max_body_bytes":4194304,"max_in_flight":256},"region":null,'
    '"require_pinned_revision":false,"revision":null,"routing_region":"us-east","scaling":'
    '{"buffer_containers":0,"max_concurrency":64,"max_containers":1,"min_containers":0,'
    '"scaledown_window_s":300,"target_concurrency":32},"secrets":{"api_keys":"serving-api-keys",'
    '"hf_token":null},"served_model_name":"qwen3-8b","snapshot":false,"timeouts":{"request_s":600,'
    '"startup_s":1800},"volumes":{"engine_cache":"vllm-cache","hf_cache":"huggingface-cache"},'
    '"warmup_prompts":["Hello"]}'
)
PINNED: dict[str, tuple[dict[str, Any], str, str]] = {
    # every optional field unset: the text specs had before those fields existed
    "vllm-defaults": (
        {},
        '{"context_length":null,"engine":"vllm","extra_args":[],"gpu":"H100","gpu_count":1,'
        '"gpu_memory_fraction":null,"model":"Qwen/Qwen3-8B",' + _DEFAULTS,
        "69056093c3e367d23401e98c488698e34a0bb1155863e97c5f0b0231064e4c56",
    ),
    "sglang-defaults": (
        {"engine": "sglang"},
        '{"context_length":null,"engine":"sglang","extra_args":[],"gpu":"H100","gpu_count":1,'
        '"gpu_memory_fraction":null,"model":"Qwen/Qwen3-8B",' + _DEFAULTS,
        "967cf3bd59a0f19bc910122ad0b7009935221912f959930a63fa177adf4befa2",
    ),
    # every field set, none at its default
    "every-field": (
        FULL,
        '{"api_server_count":4,"context_length":32768,"cpu":12.0,"cudagraph_sizes":'
        '"max_concurrency","engine":"vllm","engine_standin":{"fail":"never-ready",'
        '"startup_delay_s":1.5},"engine_version":"0.26.0","extra_args":["--seed","1"],"gpu":'
        '["H200","H100"],"gpu_count":2,"gpu_memory_fraction":0.9,"memory_gib":24.0,"model":'
        '"Qwen/Qwen3-8B","proxy":{"keepalive_s":5.0,"key_max_in_flight":{"team-a":8},'
        '"max_body_bytes":2048,"max_in_flight":64,"workers":2},"region":"eu-west",'
        '"require_pinned_revision":true,"revision":"' + SHA + '","routing_region":"us-west",'
        '"scaling":{"buffer_containers":1,"max_concurrency":48,"max_containers":4,'
        '"min_containers":1,"scaledown_window_s":600,"target_concurrency":16},"secrets":'
        '{"api_keys":"keys","hf_token":"hf-token"},"served_model_name":"qwen3-8b","snapshot":'
        'false,"timeouts":{"request_s":300,"startup_s":900},"volumes":{"engine_cache":"ec",'
        '"hf_cache":"hf"},"warmup_prompts":["Hi","\\u00fcn\\u00ef \\u2713"],"weights":'
        '{"path":"rev-1","volume":"weights"}}',
        "ef2d58b31f732e2fe1384923979d89c1e6cb51bd7b7ee3bb7b127b9db2aafed7",
    ),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_the_json_text_and_digest_are_pinned(case: str) -> None:
    overrides, text, digest = PINNED[case]
    spec = make(**overrides)
    assert spec.to_json() == text
    assert spec.digest() == digest
    # the container reads the same text back into the same spec, and writes it out unchanged
    assert ServingSpec.from_json(text) == spec and ServingSpec.from_json(text).to_json() == text
