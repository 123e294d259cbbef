"""vLLM's command line and environment (`vllm serve`), for the releases in ENGINE_RELEASES.

The flags are spelled as every release the project knows spells them; where releases differ
(0.26.0 negates with `--no-enable-...`, 0.33.0 with `--disable-...`), the defaults below are
left out when extra_args set any spelling the spec's release parses (serving/engine_flags/).
"""

from __future__ import annotations

from serving.render._common import EngineCli

# The engine default the seeds' learnings call for (docs/serving.md explains it).
DEFAULT_GPU_MEMORY_FRACTION = 0.92

# The variable vLLM reads its HTTP keep-alive from (ENGINE_KEEPALIVE_S in render/engine.py):
# vllm/envs.py VLLM_HTTP_TIMEOUT_KEEP_ALIVE (int, default 5), passed as uvicorn's
# timeout_keep_alive by vllm/entrypoints/openai/api_server.py (0.26.0).
KEEPALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"

# How vLLM starts its engine-core process and, with tensor parallel, the engine core its GPU
# workers. Unset, `vllm serve` sets "spawn" (0.26.0 vllm/entrypoints/serve/utils/api_utils.py,
# 0.33.0 vllm/entrypoints/common/startup.py: only when VLLM_WORKER_MULTIPROC_METHOD is not in
# the environment), and a spawned process imports vLLM and torch all over again. "fork"
# starts it from its parent with the imports done. One GPU, one API server (snapshot specs,
# `api_server_count: 1`): 17-26 s off each start of an 8B-shaped model on one H100, cold or
# warm cache (docs/gpu.md runs P and S: the engine core came up 20.8-23.7 s after the model
# was resolved spawned, 2.3-3.3 s forked). With several API servers vLLM always spawns those
# (0.26.0 vllm/v1/utils.py), and the engine core waits for them, so a one-GPU start is as
# long either way (run T). Two GPUs (runs Z, AG, AH, two H100s, empty engine cache): the two
# workers came up ~1 s after the engine core instead of after a second import, 140.7 / 142.3 s
# spawned -> 117.8 / 113.3 s forked to SERVING READY, and it served the same load through the
# proxy. vLLM switches back to spawn
# itself, with a warning, where fork is unsafe: CUDA already initialised in the parent, a Ray
# actor, NUMA binding (0.26.0 vllm/utils/system_utils.py `_maybe_force_spawn`).
VLLM_MULTIPROC_METHOD = "fork"

# With `snapshot`: /sleep and /wake_up exist only in dev mode; the proxy never forwards them.
SNAPSHOT_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def cache_env(cache: str) -> dict[str, str]:
    """vLLM's own state under the engine-cache volume, and how it starts its processes."""
    return {
        "VLLM_CACHE_ROOT": cache,  # vLLM's torch.compile cache and other state
        # the engine core (and its TP workers) forked, not spawned (see the constant)
        "VLLM_WORKER_MULTIPROC_METHOD": VLLM_MULTIPROC_METHOD,
    }


CLI = EngineCli(
    launch=("vllm", "serve"),
    tp_flag="--tensor-parallel-size",
    memory_flag="--gpu-memory-utilization",
    memory_default=DEFAULT_GPU_MEMORY_FRACTION,
    context_flag="--max-model-len",
    snapshot_flags=("--enable-sleep-mode",),
    snapshot_env=SNAPSHOT_ENV,
    # more OpenAI-server processes when the CPUs allow (serving/sizing.py DEFAULT_API_SERVERS)
    api_servers_flag="--api-server-count",
    # Any of these spellings in extra_args replaces the default (e.g. "--no-async-scheduling",
    # "--generation-config auto"); 0.33.0 negates with --disable-..., 0.26.0 with --no-enable-...
    defaults={
        # shared system prompts skip prefill
        ("--enable-prefix-caching",): frozenset(
            {"--enable-prefix-caching", "--disable-prefix-caching", "--no-enable-prefix-caching"}
        ),
        # overlap scheduling with the GPU step
        ("--async-scheduling",): frozenset({"--async-scheduling", "--no-async-scheduling"}),
        # vLLM's own sampling defaults, not the checkpoint's generation_config.json
        ("--generation-config", "vllm"): frozenset({"--generation-config"}),
        # every stream ends with a usage chunk (and carries running usage on each chunk), so
        # the proxy counts stream tokens without clients asking for them
        ("--enable-force-include-usage",): frozenset(
            {
                "--enable-force-include-usage",
                "--disable-force-include-usage",
                "--no-enable-force-include-usage",
            }
        ),
    },
    keepalive_env=KEEPALIVE_ENV,
    cache_env=cache_env,
)
