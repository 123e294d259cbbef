"""The engine's command line and environment, rendered the same way for every engine from its
`EngineCli` (vllm.py, sglang.py: how that engine spells each part); defaults are left out where
extra_args set them, as the spec's release's recorded parser reads them (serving/engine_flags/)."""

from __future__ import annotations

from types import MappingProxyType
from typing import NamedTuple

from serving.render import sglang, standin, vllm
from serving.render._common import EngineCli, fmt_float, model_source
from serving.sizing import api_servers
from serving.spec import (
    ENGINE_CACHE_PATHS,
    ENGINE_PORT,
    HF_CACHE_PATH,
    HF_HUB_PATH,
    RESERVED_FLAGS,
    ServingSpec,
    engine_flags,
    flag_set_in,
)

RENDERERS: MappingProxyType[str, EngineCli] = MappingProxyType(
    {"vllm": vllm.CLI, "sglang": sglang.CLI}
)

# How long the engine's HTTP server keeps an idle connection open. The proxy keeps idle engine
# connections in its pool for 60 s (serving/proxy `--upstream-idle-s`); the engine must keep
# them longer, so that it is always the proxy that closes an idle connection. Otherwise the
# engine's close (uvicorn's default: 5 s) races the proxy's next request on that connection,
# and a pool that drops its connections sooner than 5 s reopens them all at once on the next
# burst: on one H100 at 256 streams that doubled the TTFT p99 through the proxy (issue 24).
ENGINE_KEEPALIVE_S = 75
# The variable each engine reads it from (KEEPALIVE_ENV in vllm.py / sglang.py says where).
ENGINE_KEEPALIVE_ENV: dict[str, str] = {e: r.keepalive_env for e, r in RENDERERS.items()}
# Engine defaults the command line adds unless extra_args set them (per engine): flag -> the
# spellings that replace it.
OVERRIDABLE_DEFAULTS: dict[str, dict[str, frozenset[str]]] = {
    e: {args[0]: spellings for args, spellings in r.defaults.items()} for e, r in RENDERERS.items()
}


def engine_command(spec: ServingSpec, port: int = ENGINE_PORT) -> list[str]:
    """The engine's command line, listening on 127.0.0.1:port (only the proxy talks to it),
    the spec's extra_args last."""
    cli = RENDERERS[spec.engine]
    memory_fraction = (
        cli.memory_default if spec.gpu_memory_fraction is None else spec.gpu_memory_fraction
    )
    cmd = [*cli.launch, model_source(spec)]
    # no revision with weights on a volume: the engine loads that directory, a local path,
    # and never contacts the hub for it
    if spec.revision is not None and spec.weights is None:
        cmd += ["--revision", spec.revision]
    cmd += [
        "--served-model-name", spec.served_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        cli.tp_flag, str(spec.gpu_count),
        cli.memory_flag, fmt_float(memory_fraction),
        "--download-dir", HF_HUB_PATH,
    ]  # fmt: skip
    for args, spellings in cli.defaults.items():
        # left out when extra_args set any spelling of it, as the spec's release parses it
        if flag_set_in(spec.engine, spec.engine_version, spec.extra_args, spellings) is None:
            cmd += args
    if spec.context_length is not None:
        cmd += [cli.context_flag, str(spec.context_length)]
    if spec.snapshot:
        cmd += cli.snapshot_flags
    servers = api_servers(spec)
    if servers > 1:
        cmd += [cli.api_servers_flag, str(servers)]
    if spec.cudagraph_sizes == "max_concurrency":  # vLLM only (the spec refuses it elsewhere)
        # graphs only for the batch sizes a container can see (serving/spec.py
        # CUDAGRAPH_SIZE_FLAGS)
        cmd += ["--max-cudagraph-capture-size", str(spec.scaling.max_concurrency)]
    return [*cmd, *spec.extra_args]


def standin_command(
    spec: ServingSpec, port: int = ENGINE_PORT, *, python: str = "python3"
) -> list[str]:
    """The stand-in engine given the real engine's command line (render/standin.py)."""
    return standin.command(spec, engine_command(spec, port), python=python)


def launch_command(
    spec: ServingSpec, port: int = ENGINE_PORT, *, python: str = "python3"
) -> list[str]:
    """What the container starts as its engine: the engine command, or the stand-in's."""
    if spec.engine_standin is None:
        return engine_command(spec, port)
    return standin_command(spec, port, python=python)


def engine_env(spec: ServingSpec) -> dict[str, str]:
    """Environment for the engine process (and the image), caches on the volumes."""
    renderer = RENDERERS[spec.engine]
    cache = ENGINE_CACHE_PATHS[spec.engine]
    env = {
        # idle connections: the proxy's pool closes them, never the engine (see the constant)
        renderer.keepalive_env: str(ENGINE_KEEPALIVE_S),
        "HF_HOME": HF_CACHE_PATH,  # weights and tokenizer files on the HF volume
        "HF_XET_HIGH_PERFORMANCE": "1",  # saturate the network on first download
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",  # torch.compile artifacts
        "TRITON_CACHE_DIR": f"{cache}/triton",  # JIT-compiled Triton kernels
        "CUDA_CACHE_PATH": f"{cache}/nv",  # PTX -> SASS JIT cache of the CUDA driver
        **renderer.cache_env(cache),
    }
    if spec.weights is not None:
        # Weights come from the volume: any hub access (a missing file, a tokenizer
        # lookup by id) fails loudly instead of downloading at a cold start.
        env["HF_HUB_OFFLINE"] = "1"
    if spec.snapshot:
        # torch inductor's compile worker pool does not survive a memory snapshot.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        env.update(renderer.snapshot_env)
    return env


class ReleaseFlags(NamedTuple):
    """One release's flag table: the spellings its parser has of what the spec renders."""

    #: flag -> the spec field that sets it (extra_args may not use any spelling of it)
    reserved: dict[str, str]
    #: default flag the spec adds -> the spellings of it (or its negation) that replace it
    overridable: dict[str, frozenset[str]]


def release_flags(engine: str, version: str | None = None) -> ReleaseFlags:
    """RESERVED_FLAGS and OVERRIDABLE_DEFAULTS as one release spells them (vLLM 0.26.0 negates
    with `--no-enable-...` where 0.33.0 says `--disable-...`)."""
    options = engine_flags(engine, version).options
    return ReleaseFlags(
        {f: field for f, field in RESERVED_FLAGS[engine].items() if f in options},
        {d: alts & options for d, alts in OVERRIDABLE_DEFAULTS[engine].items()},
    )
