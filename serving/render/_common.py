"""What the engine renderers share: how a number is written, what the engine loads, and the
`EngineCli` each engine module (vllm.py, sglang.py) declares its spellings in."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from serving.spec import ServingSpec
from serving.weights import WEIGHTS_MOUNT


@dataclass(frozen=True)
class EngineCli:
    """How one engine spells what the spec renders: engine.py renders every engine's command
    line and environment from this, in the same order for each engine."""

    #: The command up to and including the model (`model_source`), e.g. `vllm serve`.
    launch: tuple[str, ...]
    #: Flags of the tensor-parallel size, of the share of GPU memory the engine may take, and
    #: that share when the spec names none.
    tp_flag: str
    memory_flag: str
    memory_default: float
    context_flag: str
    #: What `snapshot` adds to the command line and to the environment.
    snapshot_flags: tuple[str, ...]
    snapshot_env: Mapping[str, str]
    #: HTTP-server processes (serving/sizing.py `api_servers`), given only when more than one.
    api_servers_flag: str
    #: Defaults the command line adds (args -> the spellings, in extra_args, of the flag or of
    #: its negation that replace it, as the spec's release parses them).
    defaults: Mapping[tuple[str, ...], frozenset[str]]
    #: The variable the engine reads its HTTP keep-alive from (render/engine.py
    #: ENGINE_KEEPALIVE_S).
    keepalive_env: str
    #: The engine's own caches under the engine-cache volume (and how it starts processes).
    cache_env: Callable[[str], dict[str, str]]


def fmt_float(value: float) -> str:
    """A float as the command line gets it (`0.92`, `1.0`)."""
    return repr(float(value))


def model_source(spec: ServingSpec) -> str:
    """What the engine loads: the weights directory on the volume, else the hub id."""
    if spec.weights is not None:
        return f"{WEIGHTS_MOUNT}/{spec.weights.path}"
    return spec.model
