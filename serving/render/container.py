"""What the Modal function definition gets from the spec beside the command lines: the GPU
request, the volumes and secrets to mount, and the app's default name."""

from __future__ import annotations

import re

from serving.spec import ENGINE_CACHE_PATHS, HF_CACHE_PATH, ServingSpec
from serving.weights import WEIGHTS_MOUNT


def modal_gpu(spec: ServingSpec) -> str | list[str]:
    """The `gpu=` argument for Modal: "H100" / "H100:2", or a preference list of those."""
    rendered = [t if spec.gpu_count == 1 else f"{t}:{spec.gpu_count}" for t in spec.gpu_types]
    return rendered[0] if isinstance(spec.gpu, str) else rendered


def default_app_name(spec: ServingSpec) -> str:
    """A valid Modal app name from served_model_name (used when SERVING_APP_NAME is unset)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.served_model_name).strip("-.") or "serving"
    return name[:64]


def volume_mounts(spec: ServingSpec) -> dict[str, str]:
    """Mount path in the container -> Modal volume name."""
    mounts = {
        HF_CACHE_PATH: spec.volumes.hf_cache,
        ENGINE_CACHE_PATHS[spec.engine]: spec.volumes.engine_cache,
    }
    if spec.weights is not None:
        mounts[WEIGHTS_MOUNT] = spec.weights.volume
    return mounts


def secret_names(spec: ServingSpec) -> list[str]:
    """Modal secrets to mount, API keys first."""
    names = [spec.secrets.api_keys]
    if spec.secrets.hf_token is not None:
        names.append(spec.secrets.hf_token)
    return names
