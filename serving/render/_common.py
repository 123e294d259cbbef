"""What the engine renderers share: how a number is written, what the engine loads, and whether
a default the renderer adds is left to extra_args."""

from __future__ import annotations

from serving.spec import HF_HUB_PATH, ServingSpec, flag_set_in
from serving.weights import WEIGHTS_MOUNT


def fmt_float(value: float) -> str:
    """A float as the command line gets it (`0.92`, `1.0`)."""
    return repr(float(value))


def model_source(spec: ServingSpec) -> str:
    """What the engine loads: the weights directory on the volume, else the hub id."""
    if spec.weights is not None:
        return f"{WEIGHTS_MOUNT}/{spec.weights.path}"
    return spec.model


def revision(spec: ServingSpec) -> str | None:
    """The revision the engine is given: none with weights on a volume (the engine loads that
    directory, a local path, and never contacts the hub for it)."""
    return spec.revision if spec.weights is None else None


def gpu_memory_fraction(spec: ServingSpec, default: float) -> float:
    """The share of GPU memory the engine may take: the spec's, else the engine's default."""
    return spec.gpu_memory_fraction if spec.gpu_memory_fraction is not None else default


def default_wanted(spec: ServingSpec, overrides: frozenset[str]) -> bool:
    """False when extra_args set a default the renderer would add: any spelling in `overrides`
    of it (or of its negation), as the spec's engine release parses the flag."""
    return flag_set_in(spec.engine, spec.engine_version, spec.extra_args, overrides) is None


def serve_args(
    spec: ServingSpec, port: int, *, tp_flag: str, memory_flag: str, memory_default: float
) -> list[str]:
    """The arguments every engine takes, each engine spelling the tensor-parallel size
    (`tp_flag`) and the GPU memory share (`memory_flag`) its own way: the revision (when one
    is given), the served name, 127.0.0.1:port, the GPUs, the memory share (the spec's, else
    `memory_default`) and the hub download directory."""
    rev = revision(spec)
    return [*([] if rev is None else ["--revision", rev]),
        "--served-model-name", spec.served_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        tp_flag, str(spec.gpu_count),
        memory_flag, fmt_float(gpu_memory_fraction(spec, memory_default)),
        "--download-dir", HF_HUB_PATH,
    ]  # fmt: skip
