"""ServingSpec: validation names the field and the reason, JSON round-trips, rendering."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from serving import render
from serving.spec import (
    ENGINE_CACHE_PATHS,
    ENGINE_IMAGES,
    ENGINE_VERSIONS,
    GPU_TYPES,
    HF_CACHE_PATH,
    HF_HUB_PATH,
    ServingSpec,
    SpecError,
    format_validation_error,
)

ROOT = Path(__file__).resolve().parents[2]
SHA = "b968826d9c46dd6066d109eabc6255188de91218"
BASE: dict[str, Any] = {"engine": "vllm", "model": "Qwen/Qwen3-8B", "served_model_name": "qwen3-8b"}


def make(**overrides: Any) -> ServingSpec:
    return ServingSpec.model_validate({**BASE, **overrides})


def problems(**overrides: Any) -> dict[str, str]:
    """Validate and return {field path: message} for every error."""
    with pytest.raises(ValidationError) as info:
        make(**overrides)
    lines = format_validation_error(info.value).splitlines()[1:]
    out = {}
    for line in lines:
        loc, msg = line.removeprefix("  - ").split(": ", 1)
        out[loc] = msg
    return out


# ---- defaults and the contract -------------------------------------------------------------------


def test_defaults_match_the_contract_table() -> None:
    s = make()
    assert s.revision is None and s.gpu == "H100" and s.gpu_count == 1
    assert s.context_length is None and s.extra_args == [] and s.snapshot is False
    assert s.warmup_prompts == ["Hello"] and s.region is None
    assert s.require_pinned_revision is False
    assert s.scaling.model_dump() == {
        "min_containers": 0,
        "max_containers": 1,
        "buffer_containers": 0,
        "scaledown_window_s": 300,
        "target_concurrency": 32,
        "max_concurrency": 64,
    }
    assert s.volumes.hf_cache == "huggingface-cache" and s.volumes.engine_cache == "vllm-cache"
    assert s.secrets.hf_token is None and s.secrets.api_keys == "serving-api-keys"
    assert (s.timeouts.startup_s, s.timeouts.request_s) == (1800, 600)
    assert s.proxy.max_in_flight == 256 and s.proxy.max_body_bytes == 4 * 1024 * 1024
    assert s.proxy.keepalive_s == 15


def test_contract_fields_are_all_there() -> None:
    """docs/architecture.md "Serving spec": names other parts are written against."""
    contract = {
        "engine", "model", "revision", "served_model_name", "gpu", "gpu_count",
        "context_length", "extra_args", "scaling", "snapshot", "warmup_prompts", "volumes",
        "secrets", "region", "timeouts", "proxy", "require_pinned_revision",
    }  # fmt: skip
    assert contract <= set(ServingSpec.model_fields)
    for method in ("to_json", "digest", "from_json", "load", "from_env"):
        assert callable(getattr(ServingSpec, method))
    # the spec holds and validates; what it renders is in serving/render and serving/sizing
    rendering = {"engine_command", "engine_env", "launch_command", "standin_command"}
    rendering |= {"modal_gpu", "volume_mounts", "secret_names", "default_app_name"}
    rendering |= {"cpu_request", "memory_request_mib", "api_servers", "proxy_workers"}
    assert not rendering & set(dir(ServingSpec))
    assert render.engine_command(make()) == render.engine_command(make(), 8001)  # default port


def test_pinned_engines_have_images_and_versions() -> None:
    assert set(ENGINE_VERSIONS) == set(ENGINE_IMAGES) == {"vllm", "sglang"}
    for engine, image in ENGINE_IMAGES.items():
        assert ENGINE_VERSIONS[engine] in image  # the image tag is the pinned version
    assert set(render.engine.RENDERERS) == set(ENGINE_VERSIONS)  # a renderer for each engine


def test_the_spec_does_not_import_its_renderers() -> None:
    """serving/spec.py holds and validates; serving/render depends on it, never the reverse
    (serving/sizing.py, whose figures the validation shares, imports nothing of either)."""
    code = (
        "import sys, serving.spec; print(sorted(m for m in sys.modules if m.startswith('serving')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert "'serving.spec'" in loaded and "'serving.sizing'" in loaded
    assert "serving.render" not in loaded


# ---- validation: which field, and why ------------------------------------------------------------


def test_unknown_field_is_rejected() -> None:
    assert "Extra inputs are not permitted" in problems(gpus="H100")["gpus"]
    assert "Extra inputs" in problems(scaling={"max_replicas": 3})["scaling.max_replicas"]


def test_unknown_gpu_names_the_field_and_lists_known_types() -> None:
    msg = problems(gpu="H1000")["gpu"]
    assert "unknown GPU 'H1000'" in msg and "H100" in msg and "L40S" in msg


def test_gpu_names_are_case_insensitive_and_canonical() -> None:
    assert make(gpu="h100").gpu == "H100"
    assert make(gpu=["l40s", "a100-80gb"]).gpu == ["L40S", "A100-80GB"]
    assert make(gpu="b200+").gpu == "B200+"


def test_gpu_with_count_suffix_points_to_gpu_count() -> None:
    msg = problems(gpu="H100:2")["gpu"]
    assert "gpu_count" in msg and "gpu='H100'" in msg and "gpu_count=2" in msg


def test_gpu_preference_list_checks() -> None:
    assert "empty" in problems(gpu=[])["gpu"]
    assert "more than once" in problems(gpu=["H100", "h100"])["gpu"]
    assert "unknown GPU 'X1'" in problems(gpu=["H100", "X1"])["gpu"]


@pytest.mark.parametrize("count", [3, 5, 6, 7])
def test_gpu_count_must_be_a_power_of_two(count: int) -> None:
    msg = problems(gpu_count=count)["gpu_count"]
    assert "power of two" in msg and "tensor parallel" in msg


def test_gpu_count_limited_by_gpu_type() -> None:
    assert "at most 4 x A10G" in problems(gpu=["H100", "A10G"], gpu_count=8)["gpu_count"]
    assert make(gpu="A10G", gpu_count=4).gpu_count == 4
    assert "less than or equal to 8" in problems(gpu_count=16)["gpu_count"]


def test_snapshot_needs_one_gpu_and_a_context_length() -> None:
    found = problems(snapshot=True, gpu_count=2)
    assert "one GPU per container" in found["snapshot"]
    assert "context_length" in found["context_length"]
    assert make(snapshot=True, context_length=8192).snapshot


def test_require_pinned_revision_without_revision() -> None:
    msg = problems(require_pinned_revision=True)["revision"]
    assert "require_pinned_revision" in msg and "commit sha" in msg
    assert make(require_pinned_revision=True, revision=SHA).revision == SHA


@pytest.mark.parametrize("rev", ["main", "Main", "master", "HEAD", "refs/heads/dev", "refs/pr/3"])
def test_moving_revisions_are_rejected(rev: str) -> None:
    assert "moves" in problems(revision=rev)["revision"]


@pytest.mark.parametrize(
    ("rev", "why"),
    [("b968826", "short commit sha"), ("has space", "neither"), ("x" * 200, "neither")],
)
def test_malformed_revisions(rev: str, why: str) -> None:
    assert why in problems(revision=rev)["revision"]


@pytest.mark.parametrize("rev", [SHA, "v1.0", "refs/tags/v2.1.0", "2024-05-01"])
def test_pinned_revisions_accepted(rev: str) -> None:
    assert make(revision=rev).revision == rev


@pytest.mark.parametrize("rev", ["v1.0", "refs/tags/v2.1.0", "2024-05-01"])
def test_require_pinned_revision_refuses_tags(rev: str) -> None:
    """A tag can be moved to another commit; a prod-style spec must name the commit itself."""
    msg = problems(require_pinned_revision=True, revision=rev)["revision"]
    assert repr(rev) in msg and "tag" in msg and "40-character commit sha" in msg


def test_scaling_consistency() -> None:
    assert (
        "above max_containers"
        in problems(scaling={"min_containers": 3, "max_containers": 2})["scaling.min_containers"]
    )
    msg = problems(scaling={"min_containers": 1, "max_containers": 2, "buffer_containers": 2})[
        "scaling.buffer_containers"
    ]
    assert "exceeds max_containers" in msg
    msg = problems(scaling={"target_concurrency": 65, "max_concurrency": 64})[
        "scaling.target_concurrency"
    ]
    assert "above max_concurrency" in msg
    assert (
        "greater than or equal to 2"
        in problems(scaling={"scaledown_window_s": 1})["scaling.scaledown_window_s"]
    )


def test_proxy_cap_must_cover_modal_concurrency() -> None:
    msg = problems(proxy={"max_in_flight": 10})["proxy.max_in_flight"]
    assert "scaling.max_concurrency (64)" in msg


@pytest.mark.parametrize("name", ["has space", "-leading", "a" * 129, "tab\tname", ""])
def test_served_model_name_format(name: str) -> None:
    assert "not a usable model name" in problems(served_model_name=name)["served_model_name"]


@pytest.mark.parametrize("name", ["qwen3-8b", "Qwen/Qwen3-8B", "llama-3.1:8b", "m@v2"])
def test_served_model_name_accepted(name: str) -> None:
    assert make(served_model_name=name).served_model_name == name


@pytest.mark.parametrize("model", ["not a repo", "a/b/c", "org--x/y", "org/..", "/name"])
def test_model_must_be_a_hf_repo_id(model: str) -> None:
    assert "Hugging Face repo id" in problems(model=model)["model"]


@pytest.mark.parametrize(
    ("engine", "args", "field"),
    [
        ("vllm", ["--max-model-len", "4096"], "context_length"),
        ("vllm", ["--max-model-len=4096"], "context_length"),
        ("vllm", ["-tp", "2"], "gpu_count"),
        ("vllm", ["--port", "9000"], "engine port"),
        ("vllm", ["--enable-sleep-mode"], "snapshot"),
        ("vllm", ["--api-key", "x"], "secrets.api_keys"),
        ("vllm", ["--device-memory-utilization", "0.5"], "gpu_memory_fraction"),
        ("sglang", ["--tp-size", "2"], "gpu_count"),
        ("sglang", ["--tensor-parallel-size", "2"], "gpu_count"),
        ("sglang", ["--model", "x/y"], "model"),
        ("sglang", ["--enable-memory-saver"], "snapshot"),
        ("sglang", ["--context-length=8192"], "context_length"),
    ],
)
def test_extra_args_may_not_repeat_rendered_flags(engine: str, args: list[str], field: str) -> None:
    found = problems(engine=engine, extra_args=["--trust-remote-code", *args])
    msg = found["extra_args[1]"]
    assert "already rendered by the spec" in msg and field in msg


def test_extra_args_shape() -> None:
    assert "start with a flag" in problems(extra_args=["4096"])["extra_args"]
    assert "one argv token" in problems(extra_args=["--x", " padded"])["extra_args"]
    # a negative number is a value, not a flag
    assert make(extra_args=["--seed", "-1"]).extra_args == ["--seed", "-1"]


def test_names_of_modal_objects() -> None:
    assert "Modal volume name" in problems(volumes={"hf_cache": "bad name"})["volumes.hf_cache"]
    assert "Modal secret name" in problems(secrets={"api_keys": "x" * 65})["secrets.api_keys"]


def test_strict_types() -> None:
    assert "valid integer" in problems(gpu_count="2")["gpu_count"]
    assert "valid boolean" in problems(snapshot="yes")["snapshot"]


def test_several_problems_are_reported_together() -> None:
    found = problems(gpu_count=3, snapshot=True, require_pinned_revision=True)
    assert {"gpu_count", "snapshot", "context_length", "revision"} <= set(found)


# ---- JSON round trip -----------------------------------------------------------------------------


def spec_matrix() -> list[ServingSpec]:
    """Specs across both engines, snapshot on/off, TP, context length, extra args, lists."""
    specs = []
    for engine, snapshot, count, ctx, extra, gpu in itertools.product(
        ["vllm", "sglang"],
        [False, True],
        [1, 2, 8],
        [None, 8192],
        [[], ["--trust-remote-code"], ["--max-num-seqs", "128"]],
        ["H100", ["H200", "H100", "A100-80GB"]],
    ):
        if snapshot and (count > 1 or ctx is None):
            continue
        if engine == "sglang" and extra == ["--max-num-seqs", "128"]:
            extra = ["--max-running-requests", "128"]
        specs.append(
            make(
                engine=engine,
                snapshot=snapshot,
                gpu_count=count,
                context_length=ctx,
                extra_args=extra,
                gpu=gpu,
                revision=SHA,
            )
        )
    return specs


EXTRA_ARGS_CHOICES = {
    "vllm": [[], ["--seed", "1"], ["--seed=-1", "--max_num_seqs", "8"]],
    "sglang": [[], ["--random-seed", "1"], ["--chunked-prefill-size=-1"]],
}


def random_spec(rng: random.Random) -> ServingSpec:
    """A random valid spec (seeded: the same specs every run)."""
    engine = rng.choice(["vllm", "sglang"])
    snapshot = rng.random() < 0.3
    count = 1 if snapshot else rng.choice([1, 2, 4, 8])
    gpus = [g for g in GPU_TYPES if GPU_TYPES[g].max_count >= count]
    gpu: str | list[str] = (
        rng.choice(gpus) if rng.random() < 0.6 else rng.sample(gpus, rng.randint(1, 4))
    )
    max_c = rng.randint(1, 20)
    min_c = rng.randint(0, max_c)
    max_conc = rng.randint(1, 512)
    return make(
        engine=engine,
        model=rng.choice(["Qwen/Qwen3-8B", "google/gemma-3-27b-it", "gpt2"]),
        served_model_name=rng.choice(["m", "Qwen/Qwen3-8B", "svc-1.2_x"]),
        revision=rng.choice([None, SHA, "v1.0"]),
        gpu=gpu,
        gpu_count=count,
        context_length=rng.choice([None, 4096, 131072]) if not snapshot else 32768,
        extra_args=rng.choice(EXTRA_ARGS_CHOICES[engine]),
        scaling={
            "min_containers": min_c,
            "max_containers": max_c,
            "buffer_containers": rng.randint(0, max_c - min_c),
            "scaledown_window_s": rng.randint(2, 3600),
            "target_concurrency": rng.randint(1, max_conc),
            "max_concurrency": max_conc,
        },
        snapshot=snapshot,
        warmup_prompts=rng.choice([[], ["Hello"], ["a", "ünïcødé ✓", 'quote " and \\']]),
        volumes={"hf_cache": "hf", "engine_cache": rng.choice(["vllm-cache", "sg.cache"])},
        secrets={"hf_token": rng.choice([None, "hf-token"]), "api_keys": "keys"},
        region=rng.choice([None, "us-east", "eu-west"]),
        timeouts={"startup_s": rng.randint(1, 86400), "request_s": rng.randint(1, 3600)},
        proxy={
            "max_in_flight": rng.randint(max_conc, 4096),
            "max_body_bytes": rng.randint(1024, 1 << 26),
            "keepalive_s": rng.choice([15, 0.5, 1e-3, 3600]),
        },
        require_pinned_revision=False,
        gpu_memory_fraction=rng.choice([None, 0.5, 0.9, 1 / 3]),
    )


def test_json_round_trips_exactly() -> None:
    rng = random.Random(20261126)
    specs = spec_matrix() + [random_spec(rng) for _ in range(300)]
    assert len(specs) > 300
    for spec in specs:
        text = spec.to_json()
        back = ServingSpec.model_validate_json(text)
        assert back == spec
        assert back.to_json() == text
        assert back.digest() == spec.digest()
        assert ServingSpec.model_validate(json.loads(text)) == spec


def test_to_json_is_canonical_and_complete() -> None:
    s = make(gpu=["H200", "H100"])
    text = s.to_json()
    assert " " not in text.replace("H200", "")  # compact separators
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert list(data["scaling"]) == sorted(data["scaling"])
    # defaults written out too, but engine_standin and weights when unset and engine_version
    # when it is the default (specs from before those fields keep their text and digest, so
    # existing apps see no change)
    assert set(data) == set(ServingSpec.model_fields) - {
        "engine_standin",
        "weights",
        "engine_version",
        "cpu",  # unset: derived (test_spec_cpu.py)
        "api_server_count",
        "memory_gib",  # unset: derived (test_spec_memory.py)
        "cudagraph_sizes",  # "engine" (the default): test_spec_cudagraph.py
    }
    with_standin = make(engine_standin={"fail": "start"})
    assert json.loads(with_standin.to_json())["engine_standin"] == {
        "fail": "start",
        "startup_delay_s": 0.0,
    }
    # field order in the input does not change the canonical text or the digest
    reordered = ServingSpec.model_validate(dict(reversed(list(data.items()))))
    assert reordered.to_json() == text and reordered.digest() == s.digest()


def test_digest_changes_with_any_field() -> None:
    base = make()
    assert base.digest() == make().digest()
    assert len(base.digest()) == 64
    others = [
        make(gpu="H200"),
        make(warmup_prompts=["Hi"]),
        make(scaling={"scaledown_window_s": 301}),
        make(proxy={"keepalive_s": 14}),
    ]
    assert len({base.digest(), *(o.digest() for o in others)}) == 5


# ---- load / from_env -----------------------------------------------------------------------------


def test_load_and_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "spec.json"
    spec = make(revision=SHA)
    path.write_text(spec.to_json())
    assert ServingSpec.load(path) == spec
    monkeypatch.setenv("SERVING_SPEC", str(path))
    assert ServingSpec.from_env() == spec


def test_from_env_unset_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVING_SPEC", raising=False)
    with pytest.raises(SpecError, match="SERVING_SPEC is not set"):
        ServingSpec.from_env()


def test_load_errors_name_the_file_and_fields(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"cannot read serving spec .*missing\.json"):
        ServingSpec.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**BASE, "gpu": "H1000", "gpu_count": 3}))
    with pytest.raises(SpecError) as info:
        ServingSpec.load(bad)
    text = str(info.value)
    assert str(bad) in text and "- gpu: unknown GPU 'H1000'" in text
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(SpecError, match="Invalid JSON"):
        ServingSpec.load(broken)


# ---- rendering -----------------------------------------------------------------------------------


def test_vllm_command_defaults() -> None:
    cmd = render.engine_command(make(revision=SHA), 8001)
    assert cmd == [
        "vllm", "serve", "Qwen/Qwen3-8B",
        "--revision", SHA,
        "--served-model-name", "qwen3-8b",
        "--host", "127.0.0.1",
        "--port", "8001",
        "--tensor-parallel-size", "1",
        "--gpu-memory-utilization", "0.92",
        "--download-dir", HF_HUB_PATH,
        "--enable-prefix-caching",
        "--async-scheduling",
        "--generation-config", "vllm",
        "--enable-force-include-usage",
        "--api-server-count", "4",  # DEFAULT_API_SERVERS (test_spec_cpu.py)
    ]  # fmt: skip


def test_vllm_command_snapshot_tp_context() -> None:
    cmd = render.engine_command(
        make(snapshot=True, context_length=8192, extra_args=["--seed", "7"]), 9
    )
    assert cmd[-5:] == ["--max-model-len", "8192", "--enable-sleep-mode", "--seed", "7"]
    assert "--revision" not in cmd
    tp = render.engine_command(make(gpu_count=4, gpu_memory_fraction=0.8))
    assert tp[tp.index("--tensor-parallel-size") + 1] == "4"
    assert tp[tp.index("--gpu-memory-utilization") + 1] == "0.8"
    assert "--enable-sleep-mode" not in tp and "--max-model-len" not in tp


def test_sglang_command() -> None:
    cmd = render.engine_command(
        make(engine="sglang", revision=SHA, snapshot=True, context_length=32768), 8001
    )
    assert cmd == [
        "python3", "-m", "sglang.launch_server",
        "--model-path", "Qwen/Qwen3-8B",
        "--revision", SHA,
        "--served-model-name", "qwen3-8b",
        "--host", "127.0.0.1",
        "--port", "8001",
        "--tp-size", "1",
        "--mem-fraction-static", "0.88",
        "--download-dir", HF_HUB_PATH,
        "--enable-metrics",
        "--stream-response-default-include-usage",
        "--context-length", "32768",
        "--enable-memory-saver", "--enable-weights-cpu-backup",
    ]  # fmt: skip
    plain = render.engine_command(make(engine="sglang", gpu_count=2))
    assert "--enable-memory-saver" not in plain and "--context-length" not in plain
    assert plain[plain.index("--tp-size") + 1] == "2"


def test_extra_args_replace_overridable_defaults() -> None:
    cmd = render.engine_command(
        make(extra_args=["--no-async-scheduling", "--generation-config", "auto"])
    )
    assert "--async-scheduling" not in cmd and cmd.count("--generation-config") == 1
    assert cmd[-3:] == ["--no-async-scheduling", "--generation-config", "auto"]
    assert "--enable-prefix-caching" in cmd
    cmd = render.engine_command(make(extra_args=["--disable-prefix-caching"]))
    assert "--enable-prefix-caching" not in cmd


def test_streams_report_usage_by_default_and_that_can_be_turned_off() -> None:
    """The proxy counts stream tokens from the engine's usage chunk: both engines are told to
    send it whatever the client asked; vLLM's default can be switched off, SGLang's flag has
    no negation (passing it only avoids a duplicate)."""
    assert "--enable-force-include-usage" in render.engine_command(make())
    off = render.engine_command(make(extra_args=["--disable-force-include-usage"]))
    assert "--enable-force-include-usage" not in off
    assert off[-1] == "--disable-force-include-usage"
    off = render.engine_command(make(extra_args=["--disable_force_include_usage"]))
    assert "--enable-force-include-usage" not in off
    sglang = render.engine_command(make(engine="sglang"))
    assert sglang.count("--stream-response-default-include-usage") == 1
    again = render.engine_command(
        make(engine="sglang", extra_args=["--stream-response-default-include-usage"])
    )
    assert again.count("--stream-response-default-include-usage") == 1


def test_engine_env() -> None:
    env = render.engine_env(make())
    assert env["HF_HOME"] == HF_CACHE_PATH and env["HF_XET_HIGH_PERFORMANCE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/root/.cache/vllm"
    assert "VLLM_SERVER_DEV_MODE" not in env and "TORCHINDUCTOR_COMPILE_THREADS" not in env
    snap = render.engine_env(make(snapshot=True, context_length=4096))
    assert snap["VLLM_SERVER_DEV_MODE"] == "1" and snap["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    sg = render.engine_env(make(engine="sglang", snapshot=True, context_length=4096))
    assert "VLLM_SERVER_DEV_MODE" not in sg and sg["SGLANG_CACHE_DIR"] == "/root/.cache/sglang"
    # SGLang's /health must not generate while the engine sleeps for a snapshot (docs/gpu.md)
    assert sg["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" not in render.engine_env(
        make(engine="sglang")
    )
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" not in snap
    for e in (env, snap, sg):  # every cache lives on a volume
        cache_root = ENGINE_CACHE_PATHS["sglang" if e is sg else "vllm"]
        for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):
            assert e[key].startswith(cache_root + "/")


def test_vllm_engine_core_and_workers_forked() -> None:
    """vLLM's engine core is forked from the API server and, with tensor parallel, its GPU
    workers from the engine core (no second import: ~20 s of every start, docs/gpu.md runs P,
    S and Z); SGLang has no such variable."""
    for spec in (make(), make(snapshot=True, context_length=4096), make(gpu_count=2)):
        assert render.engine_env(spec)["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in render.engine_env(make(engine="sglang"))


def test_modal_gpu_and_mounts() -> None:
    assert render.modal_gpu(make()) == "H100"
    assert render.modal_gpu(make(gpu_count=2)) == "H100:2"
    assert render.modal_gpu(make(gpu=["H200", "H100"], gpu_count=4)) == ["H200:4", "H100:4"]
    assert render.modal_gpu(make(gpu=["L4"])) == ["L4"]
    s = make(secrets={"hf_token": "hf"}, volumes={"hf_cache": "w", "engine_cache": "c"})
    assert render.secret_names(s) == ["serving-api-keys", "hf"]
    assert render.volume_mounts(s) == {HF_CACHE_PATH: "w", "/root/.cache/vllm": "c"}


@pytest.mark.parametrize(
    ("served", "app"),
    [("qwen3-8b", "qwen3-8b"), ("Qwen/Qwen3-8B", "Qwen-Qwen3-8B"), ("a:b@c", "a-b-c")],
)
def test_default_app_name_is_a_valid_modal_name(served: str, app: str) -> None:
    assert render.default_app_name(make(served_model_name=served)) == app


def test_timeouts_say_what_modal_allows() -> None:
    """request_s covers streams; a non-stream request gets Modal's 303 after 150 s, and the
    schema (what `pulumi preview` users read) says so; startup_s is Modal's startup_timeout."""
    from serving.spec import MODAL_WEB_RESPONSE_LIMIT_S, Timeouts

    assert MODAL_WEB_RESPONSE_LIMIT_S == 150
    fields = Timeouts.model_json_schema()["properties"]
    assert "150 s" in fields["request_s"]["description"]
    assert "streamed" in fields["request_s"]["description"]
    assert "startup_timeout" in fields["startup_s"]["description"]
    assert "150 s" in (Timeouts.__doc__ or "")


# ---- the stand-in engine ------------------------------------------------------------------


def test_a_spec_written_before_engine_standin_keeps_its_text() -> None:
    old = make().model_dump(mode="json")
    del old["engine_standin"]
    del old["weights"]  # a later optional field, left out the same way
    del old["engine_version"]  # the default release: left out too
    del old["cpu"], old["api_server_count"], old["memory_gib"]  # later optional fields, left out
    del old["cudagraph_sizes"]  # "engine" (the default): left out too (issue 36)
    del old["proxy"]["workers"]  # the same, one level down
    del old["proxy"]["key_max_in_flight"]  # and a later one there (issue 32 item 14)
    text = json.dumps(old, sort_keys=True, separators=(",", ":"))
    assert ServingSpec.from_json(text).to_json() == text


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_standin_command_wraps_the_real_engine_command(engine: str) -> None:
    spec = make(engine=engine, engine_standin={"fail": "never-ready", "startup_delay_s": 2})
    real = render.engine_command(spec, 8001)
    assert render.launch_command(spec, 8001, python="py") == [
        "py", "-m", "standin_engine", "--fail", "never-ready",
        "--startup-delay-s", "2.0", "--", *real,
    ]  # fmt: skip
    assert (
        render.launch_command(make(engine=engine), 8001) == real
    )  # no stand-in: the engine itself
    assert render.launch_command(make(engine=engine, engine_standin={}), 8001, python="py") == [
        "py", "-m", "standin_engine", "--", *real,
    ]  # fmt: skip


def test_engine_standin_fields_are_checked() -> None:
    assert "engine_standin.fail" in problems(engine_standin={"fail": "sometimes"})
    assert "engine_standin.startup_delay_s" in problems(engine_standin={"startup_delay_s": -1})
    assert "engine_standin.nope" in problems(engine_standin={"nope": 1})
