"""SGLang's command line and environment (`python3 -m sglang.launch_server`), for the releases
in ENGINE_RELEASES; defaults are left out when extra_args set them, as the spec's release parses
the flag (serving/engine_flags/)."""

from __future__ import annotations

from serving.render._common import EngineCli

# The engine default the seeds' learnings call for (docs/serving.md explains it).
DEFAULT_GPU_MEMORY_FRACTION = 0.88

# The variable SGLang reads its HTTP keep-alive from (ENGINE_KEEPALIVE_S in render/engine.py):
# sglang/srt/environ.py SGLANG_TIMEOUT_KEEP_ALIVE (EnvInt, default 5), passed as uvicorn's
# timeout_keep_alive by sglang/srt/entrypoints/http_server.py (0.5.15 and 0.5.23; releases
# before it hard-coded timeout_keep_alive=5).
KEEPALIVE_ENV = "SGLANG_TIMEOUT_KEEP_ALIVE"

# With `snapshot`: SGLang's /health runs a one-token generation (0.5.15
# sglang/srt/entrypoints/http_server.py `health_generate`, unless
# SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, default true in environ.py, is false). Our proxy
# keeps polling /health while the engine sleeps for the snapshot: on the H100 such a generation
# on released memory crashed 0.5.15's scheduler right after /release_memory_occupation
# (docs/gpu.md, run I). Off, /health answers 200 without generating; readiness still waits for
# our warm-up.
SNAPSHOT_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}


def cache_env(cache: str) -> dict[str, str]:
    """SGLang derives DeepGEMM, FlashInfer and TileLang JIT caches from this root."""
    return {"SGLANG_CACHE_DIR": cache}


CLI = EngineCli(
    launch=("python3", "-m", "sglang.launch_server", "--model-path"),
    tp_flag="--tp-size",
    memory_flag="--mem-fraction-static",
    memory_default=DEFAULT_GPU_MEMORY_FRACTION,
    context_flag="--context-length",
    snapshot_flags=("--enable-memory-saver", "--enable-weights-cpu-backup"),
    snapshot_env=SNAPSHOT_ENV,
    # HTTP servers, each with its own tokenizer (serving/sizing.py
    # SGLANG_DEFAULT_TOKENIZER_WORKERS)
    api_servers_flag="--tokenizer-worker-num",
    defaults={
        # Prometheus /metrics (the proxy guards it)
        ("--enable-metrics",): frozenset({"--enable-metrics"}),
        # every stream ends with a usage chunk, so the proxy counts stream tokens; a
        # store_true without a negation: passing it only avoids a duplicate
        ("--stream-response-default-include-usage",): frozenset(
            {"--stream-response-default-include-usage"}
        ),
    },
    keepalive_env=KEEPALIVE_ENV,
    cache_env=cache_env,
)
