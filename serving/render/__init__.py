"""What the spec renders: functions of a validated `ServingSpec` (serving/spec.py), which itself
only holds and validates.

- engine.py: `engine_command`, `engine_env`, `launch_command`, `standin_command`, for every
  engine from its `EngineCli` in vllm.py and sglang.py (each release's flag spellings from
  serving/engine_flags/), and standin.py for the local stack's stand-in engine;
- proxy.py: `proxy_command`, `proxy_workers`;
- _common.py: `model_source` (what the engine loads: the weights directory, else the hub id)
  and `EngineCli` (how one engine spells what the spec renders);
- container.py: `modal_gpu`, `volume_mounts`, `secret_names`, `default_app_name`;
- `sizing` (CPU and memory requests) lives in serving/sizing.py, beside the spec rather than in
  this package, because the spec's own validation uses the same figures and must not import the
  renderers; it is re-exported here.
"""

from serving.render._common import model_source
from serving.render.container import default_app_name, modal_gpu, secret_names, volume_mounts
from serving.render.engine import (
    ENGINE_KEEPALIVE_ENV,
    ENGINE_KEEPALIVE_S,
    OVERRIDABLE_DEFAULTS,
    ReleaseFlags,
    engine_command,
    engine_env,
    launch_command,
    release_flags,
    standin_command,
)
from serving.render.proxy import proxy_command, proxy_workers
from serving.sizing import Sizing, sizing

__all__ = [
    "ENGINE_KEEPALIVE_ENV",
    "ENGINE_KEEPALIVE_S",
    "OVERRIDABLE_DEFAULTS",
    "ReleaseFlags",
    "Sizing",
    "default_app_name",
    "engine_command",
    "engine_env",
    "launch_command",
    "modal_gpu",
    "model_source",
    "proxy_command",
    "proxy_workers",
    "release_flags",
    "secret_names",
    "sizing",
    "standin_command",
    "volume_mounts",
]
