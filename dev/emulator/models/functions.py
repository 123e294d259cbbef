"""Rules for function definitions that FunctionCreate checks: GPUs, scaling, web labels.

Plain values only (the handlers extract them from the protobuf definition). What Modal's own
documentation states (modal.com/docs/guide/gpu): the GPU types below, at most 8 GPUs a
container (4 for A10/A10G); the client refuses `min_containers > max_containers` itself, and
the emulator refuses the same for callers that bypass it. Custom web labels must be valid DNS
labels (the client's `modal._utils.name_utils.is_valid_subdomain_label`): the emulator refuses
them instead of rewriting them, so two different labels can never map to one URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from emulator.errors import InvalidArgument

#: GPU type (as the client sends it: upper case) -> most GPUs one container may have.
GPU_MAX_COUNT: dict[str, int] = {
    "ANY": 8,
    "T4": 8,
    "L4": 8,
    "A10": 4,
    "A10G": 4,
    "L40S": 8,
    "A100": 8,
    "A100-40GB": 8,
    "A100-80GB": 8,
    "RTX-PRO-6000": 8,
    "H100": 8,
    "H100!": 8,
    "H200": 8,
    "B200": 8,
    "B200+": 8,
}

#: RFC 1035 label, not all digits, as the client checks `label=`.
_LABEL_RE = re.compile(r"^(?![0-9]+$)(?!-)[a-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class FunctionSpec:
    """The checked parts of one function definition (0 / "" mean 'not set')."""

    name: str
    gpu_type: str = ""
    gpu_count: int = 0
    min_containers: int | None = None
    max_containers: int | None = None
    max_concurrent_inputs: int = 0
    target_concurrent_inputs: float = 0.0


def check_function_spec(spec: FunctionSpec) -> None:
    """Raise InvalidArgument naming the function and the field when `spec` breaks a rule."""
    where = f"Function {spec.name!r}"
    if spec.gpu_type:
        limit = GPU_MAX_COUNT.get(spec.gpu_type.upper())
        if limit is None:
            raise InvalidArgument(
                f"{where}: unknown GPU type {spec.gpu_type!r}; use one of "
                f"{', '.join(sorted(GPU_MAX_COUNT))}."
            )
        if not 1 <= spec.gpu_count <= limit:
            raise InvalidArgument(
                f"{where}: {spec.gpu_count} x {spec.gpu_type} is not available; a container "
                f"gets 1 to {limit} {spec.gpu_type} GPUs."
            )
    elif spec.gpu_count:
        raise InvalidArgument(f"{where}: GPU count {spec.gpu_count} without a GPU type.")
    for field, value in (
        ("min_containers", spec.min_containers),
        ("max_containers", spec.max_containers),
    ):
        if value is not None and value < 0:
            raise InvalidArgument(f"{where}: {field} must be >= 0, got {value}.")
    if (
        spec.min_containers is not None
        and spec.max_containers is not None
        and spec.max_containers < spec.min_containers
    ):
        raise InvalidArgument(
            f"{where}: min_containers ({spec.min_containers}) cannot be greater than "
            f"max_containers ({spec.max_containers})."
        )
    if spec.max_concurrent_inputs < 0 or spec.target_concurrent_inputs < 0:
        raise InvalidArgument(f"{where}: concurrency limits must be >= 0.")
    if (
        spec.max_concurrent_inputs
        and spec.target_concurrent_inputs
        and spec.target_concurrent_inputs > spec.max_concurrent_inputs
    ):
        raise InvalidArgument(
            f"{where}: target concurrent inputs ({spec.target_concurrent_inputs:g}) cannot "
            f"exceed max concurrent inputs ({spec.max_concurrent_inputs})."
        )


def check_web_label(label: str) -> str:
    """A custom web endpoint label (`label=`): a DNS label of [a-z0-9-], else InvalidArgument."""
    if not _LABEL_RE.fullmatch(label):
        raise InvalidArgument(
            f"Invalid web endpoint label {label[:80]!r}: use 1-63 lowercase letters, digits "
            "and '-' (not first or last, not digits only)."
        )
    return label
