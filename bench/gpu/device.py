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

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("GPU_SITE", "/tmp/site"))  # the unpacked payload (call 1)
BIN = Path(os.environ.get("GPU_BIN", "/tmp/bin"))  # the `vllm` command the spec renders
MODEL_DIR = Path(os.environ.get("GPU_MODEL_DIR", "/tmp/gpu-model"))  # bench.gpu.mkmodel
WEIGHTS_ROOT = Path(os.environ.get("GPU_WEIGHTS_ROOT", "/weights"))  # serving.weights' mount
WEIGHTS_VOLUME = "gpu-weights"
WEIGHTS_PATH = "gpu-model"  # /weights/gpu-model -> MODEL_DIR, as the weights volume would be
SERVED_NAME = "llama"
MODEL_ID = "meta-llama/Llama-3.2-1B-Instruct"  # the shape mkmodel copies (never downloaded)
ENGINE_VERSION = "0.26.0"  # what the image's torch 2.11.0 allows (docs/gpu.md)
CONTEXT_LENGTH = 2048
API_KEY = "sk-gpu-check-0123456789abcdef"  # a throwaway key for loopback only
KEY_NAME = "gpu"
# The engine's own metric of requests in its running batch (vLLM v1, Prometheus /metrics).
RUNNING_METRIC = "vllm:num_requests_running"


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


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


def keys_env() -> dict[str, str]:
    digest = "sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()
    return {"SERVING_API_KEYS": json.dumps({KEY_NAME: digest})}


def run_env() -> dict[str, str]:
    """The environment serving.engine runs with on the GPU machine (payload on the path)."""
    env = dict(os.environ)
    path = [str(ROOT), str(SITE)] + [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env.update(
        {
            "PYTHONPATH": ":".join(dict.fromkeys(path)),
            "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
            "PYTHONUNBUFFERED": "1",
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


def python() -> str:
    return sys.executable
