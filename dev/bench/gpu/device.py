"""What the GPU runs share: where things are on the GPU machine, the specs, env and keys.

Used by ``bench.gpu.remote`` (the runner) and ``tests/gpu`` (the marked tests). Nothing here
needs a GPU or the engine at import time: CI imports it to skip the GPU tests with a reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository: dev/bench/gpu/device.py
SITE = Path(os.environ.get("GPU_SITE", "/tmp/site"))  # the unpacked payload (call 1)
BIN = Path(os.environ.get("GPU_BIN", "/tmp/bin"))  # the `vllm` command the spec renders
MODEL_DIR = Path(os.environ.get("GPU_MODEL_DIR", "/tmp/gpu-model"))  # bench.gpu.mkmodel
# Every module's bytecode, as serving/app.py's image build leaves it (serving/bake.py): the
# machine's image has none for its own packages (torch: 0 of 2141 modules, run AU) and writes
# none, so each start compiled them; prepare compiles them here, PYTHONPYCACHEPREFIX in run_env.
PYCACHE = Path(os.environ.get("GPU_PYCACHE", "/tmp/pycache"))
WEIGHTS_ROOT = Path(os.environ.get("GPU_WEIGHTS_ROOT", "/weights"))  # serving.weights' mount
WEIGHTS_VOLUME = "gpu-weights"
WEIGHTS_PATH = "gpu-model"  # /weights/gpu-model -> MODEL_DIR, as the weights volume would be
SERVED_NAME = "llama"
MODEL_ID = "meta-llama/Llama-3.2-1B-Instruct"  # the shape mkmodel copies (never downloaded)
ENGINE_VERSION = "0.26.0"  # what the image's torch 2.11.0 allows (docs/gpu.md)
CONTEXT_LENGTH = 2048
ENGINE_PORT = 8001  # serving.spec ENGINE_PORT (not imported: the image's python lacks pydantic)
API_KEY = "sk-gpu-check-0123456789abcdef"  # a throwaway key for loopback only
KEY_NAME = "gpu"
# The engine's own metric of requests in its running batch (vLLM v1, Prometheus /metrics).
RUNNING_METRIC = "vllm:num_requests_running"
# Its counter of tokens generated (loggers.py `counter_generation_tokens`, "_total" added by
# prometheus_client): a stream the engine aborted stops adding to it.
GENERATION_METRIC = "vllm:generation_tokens_total"

# ---- SGLang 0.5.15 (bench.gpu.remote prepare-sglang / run --phases sglang) ----
# It pins torch 2.11.0 as the image has; its part unpacks here, ahead of SITE (the vLLM part,
# whose fastapi, uvicorn, orjson, pydantic, ... SGLang uses too) and of the image on the path.
SITE_SGLANG = Path(os.environ.get("GPU_SITE_SGLANG", "/tmp/site-sglang"))
SGLANG_VERSION = "0.5.15"
# Only on this machine, never in the shipped defaults: the FlashAttention ops of sgl-kernel
# (sgl_kernel/flash_ops, 1.7 GB) and flashinfer's cubins do not travel, and xgrammar is left
# out (shared gpu/ recipe: SGLang 0.5.15 served on one H100 with exactly these three).
SGLANG_EXTRA_ARGS = (
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
)  # fmt: skip
# SGLang's own Prometheus gauge of requests in its running batch (sglang 0.5.15
# observability/metrics_collector.py, with --enable-metrics). The scheduler sets it only every
# --decode-log-interval (40) decode steps, and every 30 s when idle (metrics_reporter.py
# _maybe_log_idle_metrics), so it is stale right after a request ends. SGLang's load report,
# GET /v1/loads (num_running_reqs per scheduler), is published by the scheduler after every
# batch and at once when it goes idle (scheduler.py publish_load_snapshot): the tests read that.
SGLANG_RUNNING_METRIC = "sglang:num_running_reqs"
SGLANG_LOADS_PATH = "/v1/loads?include=core"
# Which engine's marked tests `pytest tests/gpu` runs: the SGLang ones only when the runner's
# sglang phase sets this (so `run`'s vLLM checks stay as they were), and vice versa.
ENGINE_SELECT_ENV = "GPU_ENGINE"


def spec_dict(*, snapshot: bool = False, extra_args: list[str] | None = None) -> dict[str, Any]:
    """The serving spec the GPU runs use: the shipped defaults, the model from the volume."""
    spec: dict[str, Any] = {
        "engine": "vllm",
        "engine_version": ENGINE_VERSION,
        "model": MODEL_ID,
        "served_model_name": SERVED_NAME,
        "context_length": CONTEXT_LENGTH,
        "weights": {"volume": WEIGHTS_VOLUME, "path": WEIGHTS_PATH},
    }
    if snapshot:
        spec["snapshot"] = True
    if extra_args:
        spec["extra_args"] = list(extra_args)
    return spec


def sglang_spec_dict(
    *, snapshot: bool = False, extra_args: list[str] | None = None
) -> dict[str, Any]:
    """The SGLang 0.5.15 spec the GPU runs use: the shipped defaults for SGLang, the model from
    the volume, plus this machine's backends (SGLANG_EXTRA_ARGS) in extra_args."""
    spec = spec_dict(snapshot=snapshot, extra_args=[*SGLANG_EXTRA_ARGS, *(extra_args or [])])
    spec.update({"engine": "sglang", "engine_version": SGLANG_VERSION})
    return spec


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


def keys_env() -> dict[str, str]:
    digest = "sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()
    return {"SERVING_API_KEYS": json.dumps({KEY_NAME: digest})}


def run_env(engine: str = "vllm") -> dict[str, str]:
    """The environment serving.engine runs with on the GPU machine (payload on the path).

    For SGLang its part comes first (SITE_SGLANG: transformers 5.12.1, openai 2.6.1, ... ahead
    of the vLLM part's and the image's), then the vLLM part for the packages both need."""
    env = dict(os.environ)
    sites = [str(SITE_SGLANG), str(SITE)] if engine == "sglang" else [str(SITE)]
    # The repository (serving/) and its dev tools (dev/: bench, standin_engine), as the runner has.
    path = [str(ROOT), str(ROOT / "dev"), *sites]
    path += [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env.update(
        {
            "PYTHONPATH": ":".join(dict.fromkeys(path)),
            "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPYCACHEPREFIX": str(PYCACHE),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            # flashinfer does not travel; its sampler would be imported on sm_90 otherwise
            "VLLM_USE_FLASHINFER_SAMPLER": "0",
            **keys_env(),
        }
    )
    return env


def why_not_here() -> str | None:
    """Why the GPU tests cannot run on this machine (None: they can)."""
    if shutil.which("nvidia-smi") is None:
        return (
            "no NVIDIA GPU here (nvidia-smi not found): these tests run on the lent GPU "
            "machine through `python3 -m bench.gpu.remote run` (docs/gpu.md)"
        )
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"nvidia-smi sees no GPU ({listed.stderr.strip()[:200] or listed.stdout[:200]})"
    if not (SITE / "vllm" / "__init__.py").exists():
        return (
            f"vLLM {ENGINE_VERSION} is not unpacked in {SITE}: run "
            "`python3 -m bench.gpu.remote prepare` first (docs/gpu.md)"
        )
    if not (SITE / "vllm" / "_C_stable_libtorch.abi3.so").exists():
        return f"vLLM's kernel library is not placed in {SITE}: `bench.gpu.remote run` does it"
    if not (BIN / "vllm").exists() or not (MODEL_DIR / "config.json").exists():
        return f"{BIN / 'vllm'} or the model in {MODEL_DIR} is missing: run prepare first"
    if not (WEIGHTS_ROOT / WEIGHTS_PATH).exists():
        return f"{WEIGHTS_ROOT / WEIGHTS_PATH} (-> {MODEL_DIR}) is missing: run prepare first"
    return None


def why_not_here_sglang() -> str | None:
    """Why the SGLang GPU tests cannot run here (None: they can)."""
    if shutil.which("nvidia-smi") is None:
        return (
            "no NVIDIA GPU here (nvidia-smi not found): the SGLang tests run on the lent GPU "
            "machine through `python3 -m bench.gpu.remote run --phases sglang` (docs/gpu.md)"
        )
    if os.environ.get(ENGINE_SELECT_ENV) != "sglang":
        return (
            f"SGLang {SGLANG_VERSION}'s tests run only in `bench.gpu.remote run --phases sglang` "
            f"({ENGINE_SELECT_ENV}=sglang), not beside the vLLM checks"
        )
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"nvidia-smi sees no GPU ({listed.stderr.strip()[:200] or listed.stdout[:200]})"
    if not (SITE_SGLANG / "sglang" / "__init__.py").exists():
        return (
            f"SGLang {SGLANG_VERSION} is not unpacked in {SITE_SGLANG}: run "
            "`python3 -m bench.gpu.remote prepare-sglang` first (docs/gpu.md)"
        )
    if not (SITE / "fastapi" / "__init__.py").exists():
        return f"the vLLM part (its fastapi, uvicorn, ...) is not in {SITE}: run prepare first"
    if not (MODEL_DIR / "config.json").exists() or not (WEIGHTS_ROOT / WEIGHTS_PATH).exists():
        return f"the model in {MODEL_DIR} (or its link in {WEIGHTS_ROOT}) is missing: run prepare"
    return None


def python() -> str:
    return sys.executable
