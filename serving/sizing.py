"""CPU and memory sizing of a serving container: what the engine's processes need, from the spec.

The container's requests to Modal (`cpu=`, `memory=`) are derived from the processes the
rendered command line starts (API servers or tokenizer workers, the engine core and its GPU
workers, SGLang's detokenizer, the proxy), each figure measured on a GPU (the comments below
cite the runs). `sizing(spec)` gives them all; serving/render renders them into the Modal
function definition, and the spec's own validation (serving/spec.py) uses the same figures to
refuse an explicit `cpu` or `memory_gib` below what the processes need. This module reads the
spec's fields only, so the spec can import it without importing the renderers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from serving.spec import ServingSpec

# CPUs: vLLM's OpenAI server is one Python process (tokenising, detokenising, SSE framing);
# the engine core is another. On one H100 with a 1B-shaped model at 256 streams the API
# server sat at 95-106 % of one core and bounded throughput (docs/gpu.md, issue 24); with
# `--api-server-count 4` the same card gave 22.3k tokens/s vs 8.9k for a default `vllm serve`
# (../shared/gpu README, the 4 servers ~294 % CPU together). vLLM 0.26.0 and 0.33.0 both
# take `--api-server-count` (serving/engine_flags/): N API-server processes share the port and
# one engine core. So the spec derives N from the container's CPU request, and the request
# from N, each overridable (the spec's `cpu` and `api_server_count`).
DEFAULT_API_SERVERS = 4
# Cores that are not API servers: the engine core (a busy loop: 101-106 % of one core while
# serving, docs/gpu.md) and, with tensor parallelism, one worker process per GPU beside it...
ENGINE_CORE_CPUS_PER_GPU = 1
# ...and one core for the auth proxy (1-32 % at 256 streams), the warm-up and health polls,
# Modal's in-container runtime.
SUPPORT_CPUS = 1
# SGLang's counterpart is `--tokenizer-worker-num N` (0.5.15 and 0.5.23: N uvicorn workers, each
# an HTTP server with its own tokenizer manager, sharing the port; 0.5.15
# sglang/srt/entrypoints/http_server.py `launch_server`, `workers=tokenizer_worker_num`), beside
# one detokenizer process and the scheduler(s). `api_server_count` sets N for SGLang; unset it
# stays at SGLang's default of 1 until a GPU run shows more serve better (docs/gpu.md).
SGLANG_DEFAULT_TOKENIZER_WORKERS = 1
# SGLang's detokenizer: one process beside the tokenizer workers.
SGLANG_DETOKENIZER_CPUS = 1

# Memory (Modal `memory=`, in MiB): derived from the same processes as the CPU request
# (`memory_request_mib`), overridable (the spec's `memory_gib`). The figures are the resident
# memory (psutil RSS, sampled each second under 256-1024 streams) of each process on one H100
# with a 1B-shaped model:
# - vLLM 0.26.0 (docs/gpu.md runs C/D; raw: data/gpu-runs/2026-11-27-h100-api-servers/
#   cpu-c.jsonl, cpu-d.jsonl): the 4 API servers and their parent together 6387-6441 MiB
#   (~1.57 GiB a server); a default single API server 1352-1384 MiB; the engine core
#   1936-2024 MiB; the proxy 33-94 MiB.
# - SGLang 0.5.15 (run K; raw: data/gpu-runs/2026-11-27-h100-sglang/cpu-k.jsonl): the HTTP
#   server with its tokenizer manager 1268-1292 MiB, the detokenizer 1234-1236 MiB, the
#   scheduler 2165-2226 MiB.
# With an 8B-shaped model (runs Q/R; raw: data/gpu-runs/2026-11-27-h100-8b/cpu-q.jsonl,
# cpu-r.jsonl), the same under 1-1024 streams: the 4 API servers and their parent 6424-6435
# MiB, the engine core 2112-2141 MiB, the proxy 66-67 MiB.
# The request is a reservation, not a limit: Modal bills max(request, usage) and lets a container
# use more when its worker has memory free (modal.com/docs/guide/resources, "Billing"; an int
# `memory=` sets no hard limit). The model's weights and KV cache live in GPU memory, not host
# memory, so the request does not grow with the model. One exception, left out on purpose: with
# `snapshot`, vLLM's sleep level 1 (and SGLang's `--enable-weights-cpu-backup`) copies the
# weights to host memory while the engine sleeps for the snapshot (2.3 GiB for the 1B-shaped
# model; a 27B model in bf16 is ~54 GB). The spec does not know the weights' size and that
# usage was not measured here: it is billed as usage for the seconds it lasts; a stack that
# wants it reserved sets `memory_gib` (derived figure + the weights' size).
# Per HTTP-server process (vLLM API server, SGLang tokenizer worker): covers the 1.57 GiB a
# server of vLLM's four, and SGLang's 1.26 GiB.
API_SERVER_MEMORY_GIB = 1.6
# Per engine process (vLLM's engine core; SGLang's scheduler; under tensor parallelism, counted
# like the CPU request, the engine core plus one worker per GPU): SGLang's scheduler reached
# 2.17 GiB, vLLM's engine core 1.98 GiB.
ENGINE_PROCESS_MEMORY_GIB = 2.2
# Under tensor parallelism, per GPU worker on top of the above: NCCL's and the workers'
# shared-memory buffers. Not measured (runs E-H with 2 GPUs sampled no memory): a margin.
TP_WORKER_EXTRA_MEMORY_GIB = 1.0
# SGLang's detokenizer (1234-1236 MiB measured).
SGLANG_DETOKENIZER_MEMORY_GIB = 1.25
# The proxy (<= 94 MiB), serving.engine's supervisor and Modal's in-container runtime (neither
# measured on its own).
SUPPORT_MEMORY_GIB = 1.0
# Headroom on top of the processes' sum (page cache for tokenizer files, bursts, allocator
# growth over days): the derived request is the sum x 1.25, rounded up to a whole GiB.
MEMORY_HEADROOM = 0.25


class Sizing(NamedTuple):
    """A container's size as the spec asks for it."""

    #: HTTP-server processes: vLLM's `--api-server-count`, SGLang's `--tokenizer-worker-num`.
    api_servers: int
    #: The CPU request in cores (Modal `cpu=`).
    cpu: float
    #: The memory request in MiB (Modal `memory=`).
    memory_mib: int
    #: What the processes measured at, no headroom: the least an explicit `memory_gib` may be.
    memory_floor_gib: float


def sizing(spec: ServingSpec) -> Sizing:
    """The container's CPU and memory requests and the process count they derive from."""
    return Sizing(
        api_servers(spec), cpu_request(spec), memory_request_mib(spec), memory_floor_gib(spec)
    )


def non_api_cpus(spec: ServingSpec) -> int:
    """Cores for the engine core (plus one worker per GPU under TP), SGLang's detokenizer, and
    the proxy."""
    gpus = spec.gpu_count * ENGINE_CORE_CPUS_PER_GPU
    frontend = SGLANG_DETOKENIZER_CPUS if spec.engine == "sglang" else 0
    return (gpus if spec.gpu_count == 1 else gpus + 1) + frontend + SUPPORT_CPUS


def api_servers(spec: ServingSpec) -> int:
    """HTTP-server processes: vLLM's `--api-server-count`, SGLang's `--tokenizer-worker-num`.

    Explicit `api_server_count` wins. SGLang: else SGLANG_DEFAULT_TOKENIZER_WORKERS. vLLM: else,
    with `cpu` set, every core the engine core, its GPU workers and the proxy leave over (at
    least 1); else DEFAULT_API_SERVERS, but 1 with `snapshot`: the snapshot cycle (sleep/wake
    through the dev endpoints, then Modal's memory snapshot of every process) was verified with
    one API server only.
    """
    if spec.api_server_count is not None:
        return spec.api_server_count
    if spec.engine != "vllm":
        return SGLANG_DEFAULT_TOKENIZER_WORKERS
    if spec.cpu is not None:
        return max(1, math.floor(spec.cpu) - non_api_cpus(spec))
    return 1 if spec.snapshot else DEFAULT_API_SERVERS


def cpu_request(spec: ServingSpec) -> float:
    """The container's CPU request in cores (Modal `cpu=`): explicit `cpu`, else one core per
    API server plus the engine core(s) and the proxy (SGLang: its tokenizer and detokenizer
    processes instead of the API servers)."""
    if spec.cpu is not None:
        return spec.cpu
    return float(api_servers(spec) + non_api_cpus(spec))


def memory_parts(spec: ServingSpec) -> list[tuple[str, float, int]]:
    """(what, GiB each, how many) per kind of process, as counted for the CPU request."""
    n = spec.gpu_count
    parts = [
        ("per API server", API_SERVER_MEMORY_GIB, api_servers(spec)),
        ("per engine process", ENGINE_PROCESS_MEMORY_GIB, 1 if n == 1 else n + 1),
    ]
    if n > 1:
        parts.append(("per GPU worker under TP", TP_WORKER_EXTRA_MEMORY_GIB, n))
    if spec.engine == "sglang":
        parts.append(("for SGLang's detokenizer", SGLANG_DETOKENIZER_MEMORY_GIB, 1))
    parts.append(("for the proxy and Modal's runtime", SUPPORT_MEMORY_GIB, 1))
    return parts


def memory_breakdown(spec: ServingSpec) -> str:
    """`memory_parts` as one line: "1.6 GiB per API server x 4, ..."."""
    return ", ".join(
        f"{gib:g} GiB {what}" + (f" x {count}" if count != 1 else "")
        for what, gib, count in memory_parts(spec)
    )


def memory_floor_gib(spec: ServingSpec) -> float:
    """Host memory the engine's processes measured at (no headroom), in GiB: the least an
    explicit `memory_gib` may ask for."""
    return round(sum(gib * count for _, gib, count in memory_parts(spec)), 3)


def derived_memory_gib(spec: ServingSpec) -> int:
    """The memory request when `memory_gib` is unset, in GiB: the floor plus MEMORY_HEADROOM,
    rounded up to a whole GiB."""
    # round() first: 9.6 x 1.25 is 12.000000000000002 in floats, and must stay 12
    return math.ceil(round(memory_floor_gib(spec) * (1 + MEMORY_HEADROOM), 6))


def memory_request_mib(spec: ServingSpec) -> int:
    """The container's memory request in MiB (Modal `memory=`): explicit `memory_gib`, else
    `derived_memory_gib`. A reservation, billed as max(request, usage); the comment above
    API_SERVER_MEMORY_GIB says what it leaves out (the weights' host copy during a snapshot)."""
    if spec.memory_gib is not None:
        return math.ceil(spec.memory_gib * 1024)
    return derived_memory_gib(spec) * 1024
