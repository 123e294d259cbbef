"""The serving spec: one validated schema shared by the IaC side and the Modal container.

The Pulumi components render a `ServingSpec`, the App provider deploys `serving/app.py` with it,
and the container reads the identical JSON back (its sha256 decides redeploys, so `to_json`
is canonical). This module holds and validates; what the spec renders (the engine's command line
and environment, the proxy's, the Modal GPU, volumes and secrets) is in serving/render/, and the
CPU and memory requests in serving/sizing.py, whose figures the validation here shares. Field
names follow docs/architecture.md ("Serving spec").

Validation errors name the field and say why (pydantic `ValidationError`; `load()` turns it into
a `SpecError` whose message lists every problem, one per line, with the file name).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from serving import sizing
from serving.engine_flags import FlagList, flag_list, parser_name

Engine = Literal["vllm", "sglang"]

# ---- Engine releases -------------------------------------------------------------------------
# The spec names its engine release (`engine_version`; unset: the default below). Flag names
# move between releases, so the rendered command line and extra_args are checked against that
# release's own argument parser (serving/engine_flags/<engine>_<version>.py, recorded by
# scripts/record_engine_flags.py), and the container runs that release's image.


class EngineRelease(NamedTuple):
    """A release the spec may name: its image, and how far the project has verified it."""

    image: str
    #: "gpu": served on a real GPU by this project's GPU harness, through serving/engine.py and
    #: the proxy (docs/gpu.md has the card, date and figures); "parser": only the flags were
    #: checked, against the release's recorded parser (nothing ever ran it).
    verified: Literal["gpu", "parser"]
    #: Where the verification is written down.
    evidence: str


# The images: vLLM's OpenAI server image per release; SGLang's plain release tag (published
# for every release; the "-cuXXX[-runtime]" variants vary between releases).
ENGINE_RELEASES: dict[str, dict[str, EngineRelease]] = {
    "vllm": {
        "0.33.0": EngineRelease(
            "vllm/vllm-openai:v0.33.0",
            "parser",
            "serving/engine_flags/vllm_0_33_0.py (needs torch 2.14; the lent GPU has 2.11)",
        ),
        "0.26.0": EngineRelease(
            "vllm/vllm-openai:v0.26.0",
            "gpu",
            "docs/gpu.md: one H100 80GB HBM3, torch 2.11.0, python -m bench.gpu.remote run",
        ),
    },
    "sglang": {
        "0.5.23": EngineRelease(
            "lmsysorg/sglang:v0.5.23", "parser", "serving/engine_flags/sglang_0_5_23.py"
        ),
        "0.5.15": EngineRelease(
            "lmsysorg/sglang:v0.5.15",
            "gpu",
            "docs/gpu.md: one H100 80GB HBM3, torch 2.11.0, Triton attention backend (what "
            "travels to the lent GPU), python -m bench.gpu.remote run --phases sglang",
        ),
    },
}
# The release a spec gets when it names none (the project's pins).
ENGINE_VERSIONS: dict[str, str] = {"vllm": "0.33.0", "sglang": "0.5.23"}
ENGINE_IMAGES: dict[str, str] = {e: ENGINE_RELEASES[e][v].image for e, v in ENGINE_VERSIONS.items()}

# ---- Ports and paths inside the container ---------------------------------------------------
PROXY_PORT = 8000  # what Modal routes to: the auth proxy, never the engine
ENGINE_PORT = 8001  # the engine listens on 127.0.0.1 only, reachable through the proxy alone
HF_CACHE_PATH = "/root/.cache/huggingface"  # HF volume: HF_HOME, so weights survive containers
HF_HUB_PATH = f"{HF_CACHE_PATH}/hub"  # where the hub client keeps repos (vLLM --download-dir)
# Engine volume: compiled kernels (torch.compile, Triton, CUDA JIT, DeepGEMM JIT) so
# a new container does not recompile for minutes. vLLM's default VLLM_CACHE_ROOT is kept.
ENGINE_CACHE_PATHS: dict[str, str] = {"vllm": "/root/.cache/vllm", "sglang": "/root/.cache/sglang"}
SPEC_IN_IMAGE = "/opt/serving/spec.json"  # the spec bundled into the image (copy=True)
SPEC_ENV = "SERVING_SPEC"  # env var naming the spec file (deploy time; optional in container)
SERVER_NAME = "Serving"  # the @app.server class: modal.Server.from_name(app_name, SERVER_NAME)
# What must reach the container goes into the deployed function definition (image ENV, see
# serving/app.py), so that a change makes Modal replace the containers: the version of the API
# key digests (sha256 of the Secret's SERVING_API_KEYS JSON, set at deploy time by the App
# resource) and the spec's digest.
KEY_VERSION_ENV = "SERVING_API_KEYS_SHA256"
SPEC_DIGEST_ENV = "SERVING_SPEC_SHA256"
# Modal answers a web request whose response has not started after this long with a 303
# redirect (modal.com/docs/guide/webhook-timeouts): non-stream requests must finish sooner.
MODAL_WEB_RESPONSE_LIMIT_S = 150

# Modal bills a container's CPU request per core (https://modal.com/pricing); the largest
# request the spec accepts (Modal's own limit per container is higher).
MAX_CPU = 64.0

# The largest memory request (memory_gib) the spec accepts (Modal checks its own maximum when
# the function is created: modal.com/docs/guide/resources, "How much can I request?").
MAX_MEMORY_GIB = 256.0

# `cudagraph_sizes: max_concurrency` (issue 36): vLLM captures a CUDA graph per batch size in
# cudagraph_capture_sizes; unset, it takes [1, 2, 4] + multiples of 8 below 256 + multiples of
# 16 up to max_cudagraph_capture_size, which is min(max_num_seqs * 2, 512) (0.26.0
# vllm/config/vllm.py `_set_cudagraph_sizes`; vllm/config/compilation.py
# `max_cudagraph_capture_size`): 51 sizes, twice over with FULL_AND_PIECEWISE. A batch larger
# than the largest size runs without a graph (same docstring). A container gets at most
# scaling.max_concurrency requests at once, so no decode batch is larger than that:
# `--max-cudagraph-capture-size N` (a flag of 0.26.0 and 0.33.0) keeps the sizes up to N (11
# for 64). The sizes are part of CompilationConfig.compute_hash, so a change of N misses the
# torch.compile cache once. Measured in docs/gpu.md (2026-11-28, one H200, runs AK-AM:
# capture 3.6-5.2 s -> 0.6-0.9 s for 64); the default stays "engine" until a bench agrees.
CUDAGRAPH_SIZE_FLAGS = frozenset(
    {"--max-cudagraph-capture-size", "--cudagraph-capture-sizes", "--compilation-config"}
)


class GpuType(NamedTuple):
    """A Modal GPU type: memory per GPU and the most GPUs Modal attaches to one container."""

    memory_gb: int
    max_count: int


# Modal's GPU names (modal.com/docs/guide/gpu). "H100!" pins an H100 (no upgrade to H200),
# "B200+" allows B200 or B300 at B200 pricing, "A100" is the 40 GB A100.
GPU_TYPES: dict[str, GpuType] = {
    "T4": GpuType(16, 8),
    "L4": GpuType(24, 8),
    "A10": GpuType(24, 4),
    "A10G": GpuType(24, 4),
    "L40S": GpuType(48, 8),
    "A100": GpuType(40, 8),
    "A100-40GB": GpuType(40, 8),
    "A100-80GB": GpuType(80, 8),
    "RTX-PRO-6000": GpuType(96, 8),
    "H100": GpuType(80, 8),
    "H100!": GpuType(80, 8),
    "H200": GpuType(141, 8),
    "B200": GpuType(180, 8),
    "B200+": GpuType(180, 8),
}
_GPU_BY_UPPER = {name.upper(): name for name in GPU_TYPES}

# Revisions that move: a spec that names one is not pinned.
MOVING_REVISIONS = frozenset({"main", "master", "head", "dev", "develop", "latest", "nightly"})
COMMIT_SHA_RE = re.compile(r"^[0-9a-f]{40}$")  # a pinned revision: a full commit sha
_HEX_RE = re.compile(r"^[0-9a-f]{7,39}$")
_TAG_RE = re.compile(r"^(refs/tags/)?[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
# Hugging Face repo ids: optional "org/" then a name; no "--" or ".." (HF rejects those).
_HF_ID_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# What OpenAI clients send as "model": no spaces or control characters, starts alphanumeric.
_SERVED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
# Modal object names (volumes, secrets, apps): modal/_utils/name_utils.py.
_MODAL_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_REGION_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,31}$")
_NEG_NUMBER_RE = re.compile(r"^-\d")

_FIXED_HOST = "nothing: the engine listens on 127.0.0.1 only, behind the proxy"
_FIXED_PORT = "nothing: the engine port is fixed by the container lifecycle"
_PROXY_KEYS = "secrets.api_keys: the proxy checks keys, an engine key would lock it out"
# Flags the spec renders itself (with their aliases), and the field that controls each one.
# extra_args may not repeat them: a second value would silently win or fail at engine start.
# Spellings the engine's parser maps to one of these (aliases of the same action, unique
# prefixes, vLLM's `_` for `-`) are reserved too: see `extra_args_problems`. The tables hold the
# spellings of every release in ENGINE_RELEASES; serving/render `release_flags` gives one
# release's table.
RESERVED_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--model": "model",
        "--revision": "revision",
        "--served-model-name": "served_model_name",
        "--host": _FIXED_HOST,
        "--port": _FIXED_PORT,
        "--tensor-parallel-size": "gpu_count",
        "-tp": "gpu_count",
        "--gpu-memory-utilization": "gpu_memory_fraction",
        "--device-memory-utilization": "gpu_memory_fraction",
        "--max-model-len": "context_length",
        "--enable-sleep-mode": "snapshot",
        "--disable-sleep-mode": "snapshot",  # 0.33.0's negation
        "--no-enable-sleep-mode": "snapshot",  # 0.26.0's
        "--download-dir": "volumes.hf_cache",
        "--api-key": _PROXY_KEYS,
        "--api-server-count": "api_server_count",
    },
    "sglang": {
        "--model-path": "model",
        "--model": "model",
        "--revision": "revision",
        "--served-model-name": "served_model_name",
        "--host": _FIXED_HOST,
        "--port": _FIXED_PORT,
        "--tp-size": "gpu_count",
        "--tensor-parallel-size": "gpu_count",
        "--context-length": "context_length",
        "--mem-fraction-static": "gpu_memory_fraction",
        "--enable-memory-saver": "snapshot",
        "--enable-weights-cpu-backup": "snapshot",
        "--download-dir": "volumes.hf_cache",
        "--api-key": _PROXY_KEYS,
        "--tokenizer-worker-num": "api_server_count",
    },
}

# Flags extra_args may not use at all, and why.
_NO_CONFIG = "put each option in extra_args instead; options in a config file bypass these checks"
REFUSED_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {"--config": _NO_CONFIG},
    "sglang": {"--config": _NO_CONFIG},
}


class SpecError(ValueError):
    """A spec file could not be read or is invalid; the message lists every problem."""


def _modal_name(kind: str) -> AfterValidator:
    """A Modal object's name (modal/_utils/name_utils.py), never one of its ids."""

    def check(value: str) -> str:
        if not _MODAL_NAME_RE.match(value) or value.startswith(("ap-", "sc-", "vo-", "st-")):
            raise ValueError(
                f"{value!r} is not a valid Modal {kind} name: 1-64 letters, digits, '.', '_' or '-'"
            )
        return value

    return AfterValidator(check)


VolumeName = Annotated[str, _modal_name("volume")]
SecretName = Annotated[str, _modal_name("secret")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Scaling(_Model):
    """Container autoscaling, passed to `@app.server` as is."""

    min_containers: Annotated[int, Field(ge=0, le=1000)] = 0
    max_containers: Annotated[int, Field(ge=1, le=1000)] = 1
    buffer_containers: Annotated[int, Field(ge=0, le=1000)] = 0
    # Modal accepts 2..3600 s (modal/_functions.py).
    scaledown_window_s: Annotated[int, Field(ge=2, le=3600)] = 300
    target_concurrency: Annotated[int, Field(ge=1, le=100_000)] = 32
    max_concurrency: Annotated[int, Field(ge=1, le=100_000)] = 64

    @model_validator(mode="after")
    def _consistent(self) -> Scaling:
        _raise_problems("Scaling", self._problems(), self)
        return self

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.min_containers > self.max_containers:
            yield (
                "min_containers",
                f"min_containers ({self.min_containers}) is above max_containers "
                f"({self.max_containers}); raise max_containers or lower min_containers",
            )
        elif self.min_containers + self.buffer_containers > self.max_containers:
            yield (
                "buffer_containers",
                f"min_containers + buffer_containers ({self.min_containers} + "
                f"{self.buffer_containers}) exceeds max_containers ({self.max_containers}): "
                "the buffer could never be kept",
            )
        if self.target_concurrency > self.max_concurrency:
            yield (
                "target_concurrency",
                f"target_concurrency ({self.target_concurrency}) is above max_concurrency "
                f"({self.max_concurrency}); Modal rejects that",
            )


class Volumes(_Model):
    """Names of the Modal volumes mounted in the container (they must exist: the Pulumi
    component's Volume resources create them; serving/app.py only looks them up)."""

    hf_cache: VolumeName = "huggingface-cache"
    engine_cache: VolumeName = "vllm-cache"


def _revision_dir(value: str) -> str:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", value):
        raise ValueError(
            f"{value!r} is not a revision directory: 1-64 letters, digits, '.', '_', '-'"
        )
    return value


class WeightsVolume(_Model):
    """The model's files on a Modal volume, filled at `pulumi up` by the ModelWeights resource
    (serving/weights.py): the engine loads `WEIGHTS_MOUNT/<path>` and never downloads, so a
    cold start reads only the volume, and the model needs no Hugging Face id (a closed model
    from a private store)."""

    volume: VolumeName
    #: The revision's directory on the volume (the ModelWeights output `path`).
    path: Annotated[str, AfterValidator(_revision_dir)]


class Secrets(_Model):
    """Names of the Modal secrets mounted as environment variables."""

    # Holds HF_TOKEN for gated models; None for public models.
    hf_token: SecretName | None = None
    # Holds SERVING_API_KEYS = JSON {name: "sha256:<hex>"}, what the proxy checks keys against.
    api_keys: SecretName = "serving-api-keys"


class Timeouts(_Model):
    """How long a container may take to become ready, and one request upstream.

    `request_s` is the longest one request may run, which in practice means a streamed
    completion: Modal answers a web request that has not started its response after
    MODAL_WEB_RESPONSE_LIMIT_S (150 s) with a 303 redirect, so non-stream requests must finish
    within 150 s whatever request_s says; streams start answering at once and may run request_s.
    It is also the proxy's wait for the engine's response head and its longest silence
    mid-stream, and the gateway's timeout is startup_s + request_s (a cold start, then the
    longest completion).
    """

    startup_s: Annotated[
        int,
        Field(
            ge=1,
            le=86_400,
            description="Modal's startup_timeout; the container gives up 10 % (at most 60 s) "
            "earlier so it can print the engine's last log lines",
        ),
    ] = 1800
    request_s: Annotated[
        int,
        Field(
            ge=1,
            le=86_400,
            description="longest streamed request; non-stream requests must finish within "
            "150 s (Modal answers 303 after that)",
        ),
    ] = 600


class EngineStandin(_Model):
    """Run dev/standin_engine.py in the engine's place (the local stack: no GPU there).

    The real engine's command line is still rendered and checked (serving/render
    `engine_command`); the stand-in is started with it (`standin_command`) and serves on its
    host, port and model name. Chosen by the stack config (`modal-llm:engineStandin: true`),
    which refuses it for a stack whose Modal server is not local.
    """

    # Fail on purpose, to test what a bad release does: "start" exits 1 before listening,
    # "never-ready" listens but /health answers 503 for ever.
    fail: Literal["start", "never-ready"] | None = None
    # /health answers 503 this long after start (a model loading its weights).
    startup_delay_s: Annotated[float, Field(ge=0, le=3600)] = 0.0


class ProxySettings(_Model):
    """Settings of the auth proxy in front of the engine (serving/proxy.py)."""

    max_in_flight: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    max_body_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 4 * 1024 * 1024
    keepalive_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    # Proxy processes (`python -m serving.proxy --workers N`, one port via SO_REUSEPORT);
    # None = 1 (serving/render/proxy.py `proxy_workers` says why). Left out of to_json() when
    # None, so specs from before the field keep their digest.
    workers: Annotated[int, Field(ge=1, le=64)] | None = None
    # An API key's own limit on its requests in flight (key name as in SERVING_API_KEYS ->
    # N <= max_in_flight; `--key-max-in-flight NAME=N`); keys not named share max_in_flight
    # fairly (docs/proxy.md, "Fair share between keys"). None: no key has one. Left out of
    # to_json() when None, so specs from before the field keep their digest.
    key_max_in_flight: dict[str, Annotated[int, Field(ge=1, le=1_000_000)]] | None = None

    @model_validator(mode="after")
    def _key_limits(self) -> ProxySettings:
        for name, limit in (self.key_max_in_flight or {}).items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
                raise ValueError(
                    f"proxy.key_max_in_flight: {name!r} is not an API key name (1-64 letters, "
                    "digits, '.', '_', '-')"
                )
            if limit > self.max_in_flight:
                raise ValueError(
                    f"proxy.key_max_in_flight.{name} ({limit}) is above proxy.max_in_flight "
                    f"({self.max_in_flight}): a key cannot hold more than the whole pool; "
                    "lower it or raise max_in_flight"
                )
        return self


#: Fields added after the first specs were deployed: to_json() leaves each out while it is at its
#: default, so a spec from before the field keeps its digest (and its containers).
_LATER_FIELDS = (
    "engine_standin",
    "weights",
    "cpu",
    "api_server_count",
    "memory_gib",
    "cudagraph_sizes",
)
_LATER_PROXY_FIELDS = ("workers", "key_max_in_flight")


# ---- field rules (ServingSpec's fields declare them as Annotated types) ----------------------


def _hf_repo_id(value: str) -> str:
    if not _HF_ID_RE.match(value) or "--" in value or ".." in value:
        raise ValueError(
            f"{value!r} is not a Hugging Face repo id; expected 'org/name' "
            "(letters, digits, '.', '_', '-'), e.g. 'Qwen/Qwen3-8B'"
        )
    return value


def _pinnable_revision(value: str) -> str:
    if value.lower() in MOVING_REVISIONS or value.startswith(("refs/heads/", "refs/pr/")):
        raise ValueError(
            f"{value!r} is a branch that moves, not a pinned revision; use the full "
            "40-character commit sha (or a release tag)"
        )
    if COMMIT_SHA_RE.match(value):
        return value
    if _HEX_RE.match(value):
        raise ValueError(f"{value!r} looks like a short commit sha; use the full 40-character sha")
    if not _TAG_RE.match(value):
        raise ValueError(
            f"{value!r} is neither a 40-character commit sha nor a tag "
            "(letters, digits, '.', '_', '+', '-')"
        )
    return value


def _served_name(value: str) -> str:
    if not _SERVED_NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a usable model name: 1-128 characters, start with a letter "
            "or digit, then letters, digits or . _ : / @ + - (no spaces)"
        )
    return value


def _known_gpus(value: Any) -> Any:
    """Modal's spelling of each GPU name (before the type check: other types fail it)."""
    if isinstance(value, str):
        return _canonical_gpu(value)
    if isinstance(value, list):
        if not value:
            raise ValueError("the GPU preference list is empty; name at least one GPU type")
        names = [_canonical_gpu(v) if isinstance(v, str) else v for v in value]
        dupes = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
        if dupes:
            raise ValueError(f"GPU preference list names {', '.join(dupes)} more than once")
        return names
    return value


def _extra_args_shape(value: list[str]) -> list[str]:
    for i, arg in enumerate(value):
        if not arg or arg != arg.strip() or "\n" in arg or "\x00" in arg:
            raise ValueError(
                f"extra_args[{i}] = {arg!r}: empty, padded or multi-line arguments are not "
                "allowed (one argv token per list item)"
            )
    if value and not value[0].startswith("-"):
        raise ValueError(
            f"extra_args must start with a flag (got {value[0]!r}); the model and the "
            "rest of the command line come from the spec"
        )
    return value


def _prompts(value: list[str]) -> list[str]:
    for i, prompt in enumerate(value):
        if not prompt.strip():
            raise ValueError(f"warmup_prompts[{i}] is blank; drop it or write a prompt")
    return value


def _region(value: str) -> str:
    if not _REGION_RE.match(value):
        raise ValueError(
            f"{value!r} is not a Modal region name (lowercase, e.g. 'us-east', 'eu-west')"
        )
    return value


Region = Annotated[str, AfterValidator(_region)]


class ServingSpec(_Model):
    """What to serve, on which GPUs, how it scales, and where its caches and secrets live."""

    engine: Engine
    # The engine release (ENGINE_RELEASES): its image and its recorded parser. A spec that
    # names none gets ENGINE_VERSIONS' (filled in on validation); to_json() leaves the default
    # out, so specs from before the field keep their digest.
    engine_version: str = ""
    model: Annotated[str, AfterValidator(_hf_repo_id)]
    revision: Annotated[str, AfterValidator(_pinnable_revision)] | None = None
    served_model_name: Annotated[str, AfterValidator(_served_name)]
    gpu: Annotated[str | list[str], BeforeValidator(_known_gpus)] = "H100"
    gpu_count: Annotated[int, Field(ge=1, le=8)] = 1
    context_length: Annotated[int, Field(ge=16, le=10_000_000)] | None = None
    extra_args: Annotated[list[str], AfterValidator(_extra_args_shape)] = Field(
        default_factory=list
    )
    scaling: Scaling = Field(default_factory=Scaling)
    snapshot: bool = False
    warmup_prompts: Annotated[list[str], Field(max_length=32), AfterValidator(_prompts)] = Field(
        default_factory=lambda: ["Hello"]
    )
    volumes: Volumes = Field(default_factory=Volumes)
    secrets: Secrets = Field(default_factory=Secrets)
    region: Region | None = None
    timeouts: Timeouts = Field(default_factory=Timeouts)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    require_pinned_revision: bool = False
    # Added beyond the contract table (all optional):
    # Where Modal's edge proxies route requests from (`@app.server(routing_region=...)`).
    routing_region: Region = "us-east"
    # Share of GPU memory the engine may take; None = the engine's default (serving/render/vllm.py,
    # sglang.py: DEFAULT_GPU_MEMORY_FRACTION).
    gpu_memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # The stand-in engine instead of vLLM/SGLang (local stack only); None = the real engine.
    # Left out of to_json() when None, so specs from before the field keep their digest.
    engine_standin: EngineStandin | None = None
    # The weights on a volume instead of a download from the hub (None: the engine downloads
    # `model` into the HF cache volume on first start). Left out of to_json() when None.
    weights: WeightsVolume | None = None
    # CPU cores the container requests (Modal `cpu=`); None = what the engine's processes need
    # (serving/sizing.py `cpu_request`). Left out of to_json() when None, like api_server_count.
    cpu: Annotated[float, Field(ge=1.0, le=MAX_CPU)] | None = None
    # vLLM's `--api-server-count` / SGLang's `--tokenizer-worker-num`: HTTP-server processes
    # in front of the engine core; None = derived (serving/sizing.py `api_servers`).
    api_server_count: Annotated[int, Field(ge=1, le=64)] | None = None
    # Host memory the container requests, in GiB (Modal `memory=`, sent in MiB); None = what the
    # engine's processes need (serving/sizing.py `memory_request_mib`). Left out of to_json()
    # when None, like cpu.
    memory_gib: Annotated[float, Field(ge=1.0, le=MAX_MEMORY_GIB)] | None = None
    # vLLM's CUDA-graph capture sizes: "engine" (its default, 1-512: 51 sizes) or
    # "max_concurrency" (`--max-cudagraph-capture-size` = scaling.max_concurrency: no decode
    # batch is larger, since Modal sends a container at most that many requests at once). See
    # CUDAGRAPH_SIZE_FLAGS. Left out of to_json() when "engine", so specs keep their digest.
    cudagraph_sizes: Literal["engine", "max_concurrency"] = "engine"

    # ---- field checks ----------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _default_engine_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("engine_version") is None:
            default = ENGINE_VERSIONS.get(str(data.get("engine")))
            if default is not None:
                data = {**data, "engine_version": default}
        return data

    # ---- cross-field checks ----------------------------------------------------------------

    @model_validator(mode="after")
    def _consistent(self) -> ServingSpec:
        _raise_problems("ServingSpec", self._problems(), self)
        return self

    def _problems(self) -> Iterator[tuple[str, str]]:
        releases = ENGINE_RELEASES[self.engine]
        if self.engine_version not in releases:
            known = ", ".join(
                f"{v} ({'verified on a GPU' if r.verified == 'gpu' else 'parser only'})"
                for v, r in sorted(releases.items())
            )
            yield (
                "engine_version",
                f"{self.engine} {self.engine_version!r} is not a release the project knows; "
                f"known: {known}. A new one needs its parser recorded "
                "(scripts/record_engine_flags.py) and an entry in ENGINE_RELEASES",
            )
            return  # nothing else can be checked without the release's parser
        n = self.gpu_count
        if n & (n - 1):
            yield (
                "gpu_count",
                f"gpu_count={n} is not a power of two; tensor parallelism splits attention "
                "heads evenly, so use 1, 2, 4 or 8",
            )
        for name in self.gpu_types:
            limit = GPU_TYPES[name].max_count
            if n > limit:
                yield "gpu_count", f"gpu_count={n} but Modal attaches at most {limit} x {name}"
        if self.snapshot and n > 1:
            yield (
                "snapshot",
                f"GPU memory snapshots support one GPU per container; gpu_count={n}. "
                "Set snapshot=false or gpu_count=1",
            )
        if self.snapshot and self.context_length is None:
            yield (
                "context_length",
                "snapshot=true needs an explicit context_length so the engine's memory "
                "plan is identical at snapshot and restore",
            )
        if self.require_pinned_revision and self.revision is None:
            yield (
                "revision",
                "require_pinned_revision=true but no revision is set; pin the model to a "
                "40-character commit sha from its Hugging Face page",
            )
        elif self.require_pinned_revision and not COMMIT_SHA_RE.match(self.revision or ""):
            yield (
                "revision",
                f"require_pinned_revision=true but revision {self.revision!r} is a tag, and "
                "tags can be moved; use the 40-character commit sha it points to (Hugging "
                "Face: Files and versions -> History)",
            )
        yield from extra_args_problems(self.engine, self.extra_args, self.engine_version)
        yield from self._cudagraph_sizes_problems()
        non_api = sizing.non_api_cpus(self)
        if (
            self.cpu is not None
            and self.api_server_count is not None
            and self.cpu < self.api_server_count + non_api
        ):
            yield (
                "cpu",
                f"cpu={self.cpu:g} is below what api_server_count={self.api_server_count} "
                f"needs: {self.api_server_count + non_api} (one core per API "
                f"server, {non_api} for the engine core, its GPU workers"
                + (", SGLang's detokenizer" if self.engine == "sglang" else "")
                + " and the proxy). Raise cpu, lower api_server_count, or leave one unset",
            )
        floor = sizing.memory_floor_gib(self)
        if self.memory_gib is not None and self.memory_gib < floor:
            yield (
                "memory_gib",
                f"memory_gib={self.memory_gib:g} is below what the engine's processes "
                f"need: {floor:g} GiB ({sizing.memory_breakdown(self)}; measured "
                f"RSS, serving/sizing.py). Raise memory_gib to at least "
                f"{math.ceil(floor)}, or leave it unset (derived: "
                f"{sizing.derived_memory_gib(self)} GiB, with "
                f"{sizing.MEMORY_HEADROOM:.0%} headroom)",
            )
        if self.proxy.max_in_flight < self.scaling.max_concurrency:
            yield (
                "proxy.max_in_flight",
                f"proxy.max_in_flight ({self.proxy.max_in_flight}) is below "
                f"scaling.max_concurrency ({self.scaling.max_concurrency}): Modal would "
                "send requests the proxy must refuse",
            )

    def _cudagraph_sizes_problems(self) -> Iterator[tuple[str, str]]:
        if self.cudagraph_sizes == "engine":
            return
        if self.engine != "vllm":
            yield "cudagraph_sizes", f'{self.cudagraph_sizes!r} is for vLLM; use "engine"'
            return
        found = flag_set_in(self.engine, self.engine_version, self.extra_args, CUDAGRAPH_SIZE_FLAGS)
        if found is not None:
            i, token = found
            yield (
                f"extra_args[{i}]",
                f"{token} sets the CUDA-graph sizes, and so does cudagraph_sizes="
                f'{self.cudagraph_sizes!r}; keep one (cudagraph_sizes: "engine")',
            )

    # ---- derived values --------------------------------------------------------------------

    @property
    def gpu_types(self) -> list[str]:
        """The GPU types in preference order (one element for a single type)."""
        return [self.gpu] if isinstance(self.gpu, str) else list(self.gpu)

    @property
    def engine_release(self) -> EngineRelease:
        return ENGINE_RELEASES[self.engine][self.engine_version]

    # ---- serialization ---------------------------------------------------------------------

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, compact separators, every field written out but the
        fields added since the first specs (`_LATER_FIELDS`) while at their default, and
        `engine_version` when it is the engine's default: older specs keep their digest."""
        exclude: dict[str, Any] = {
            name: True
            for name in _LATER_FIELDS
            if getattr(self, name) == type(self).model_fields[name].default
        }
        if self.engine_version == ENGINE_VERSIONS[self.engine]:
            exclude["engine_version"] = True
        proxy_unset = {f: True for f in _LATER_PROXY_FIELDS if getattr(self.proxy, f) is None}
        if proxy_unset:
            exclude["proxy"] = proxy_unset
        data = self.model_dump(mode="json", exclude=exclude)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 hex of `to_json()`: equal specs have equal digests."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str, *, source: str = "spec") -> ServingSpec:
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc, source)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServingSpec:
        """Read and validate a spec file; SpecError names the file and every bad field."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(
                f"cannot read serving spec {p}: {exc.strerror or exc}; check the path "
                f"(env {SPEC_ENV} names it at deploy time)"
            ) from None
        return cls.from_json(text, source=str(p))

    @classmethod
    def from_env(cls) -> ServingSpec:
        """Read the spec file named by env SERVING_SPEC."""
        path = os.environ.get(SPEC_ENV)
        if not path:
            raise SpecError(
                f"env {SPEC_ENV} is not set; set it to the serving spec JSON file, e.g. "
                f"{SPEC_ENV}=service.json modal deploy serving/app.py"
            )
        return cls.load(path)


def check_app_name(name: str) -> str:
    """A Modal app name (SERVING_APP_NAME or derived), or SpecError saying what is allowed."""
    if not _MODAL_NAME_RE.match(name) or name.startswith("ap-"):
        raise SpecError(
            f"app name {name!r} is not a valid Modal app name: 1-64 letters, digits, '.', '_' "
            "or '-', not starting with 'ap-'; set SERVING_APP_NAME to one"
        )
    return name


def format_validation_error(exc: ValidationError, source: str = "spec") -> str:
    """One line per problem: `field.path: why`."""
    lines = [f"serving spec {source} is invalid ({exc.error_count()} problem(s)):"]
    for err in exc.errors(include_url=False):
        loc = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in err["loc"]
        ).lstrip(".")
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  - {loc or '(spec)'}: {msg}")
    return "\n".join(lines)


# ---- helpers ----------------------------------------------------------------------------------


def canonical_gpu(name: str) -> str | None:
    """Modal's spelling of a GPU name (case-insensitive), or None when Modal has no such GPU."""
    return _GPU_BY_UPPER.get(name.strip().upper())


def _canonical_gpu(value: str) -> str:
    if ":" in value:
        base, count = value.split(":", 1)
        raise ValueError(
            f"{value!r}: put the count in gpu_count, not in the GPU name "
            f"(gpu={base!r}, gpu_count={count})"
        )
    name = canonical_gpu(value)
    if name is None:
        raise ValueError(f"unknown GPU {value!r}; Modal's GPU types are: {', '.join(GPU_TYPES)}")
    return name


def _flags_in(args: list[str]) -> list[tuple[int, str]]:
    """(index, flag name) in an argv fragment (`--x=1` -> `--x`; negative numbers are values)."""
    return [
        (i, a.split("=", 1)[0])
        for i, a in enumerate(args)
        if a.startswith("-") and a != "-" and not _NEG_NUMBER_RE.match(a)
    ]


def engine_flags(engine: str, version: str | None = None) -> FlagList:
    """A release's recorded flag list (serving/engine_flags/); the default release's if None."""
    return flag_list(engine, version or ENGINE_VERSIONS[engine])


def extra_args_problems(
    engine: str, args: list[str], version: str | None = None
) -> Iterator[tuple[str, str]]:
    """(field, why) for each flag in `args` that engine release (default: the pinned one)
    would reject or that the spec renders itself, however it is spelled: aliases of the same
    parser action, vLLM's `_` for `-` and `--flag.key` forms, and argparse's unique-prefix
    abbreviations (`--max-model`). Abbreviations are refused even for harmless flags: write
    the flag out.
    """
    flags = engine_flags(engine, version)
    reserved = RESERVED_FLAGS[engine]
    refused = REFUSED_FLAGS[engine]

    def reserved_by(option: str) -> str | None:
        field = next((f for f in flags.aliases(option) if f in reserved), None)
        return None if field is None else reserved[field]

    for i, token in _flags_in(args):
        where = f"extra_args[{i}]"
        name = parser_name(engine, token)
        option, matches = flags.resolve(name)
        said = token if token == name else f"{token} (read by {engine} as {name})"
        if option is not None:
            field = reserved_by(option)
            if option in refused:
                yield where, f"{said} is not allowed in extra_args: {refused[option]}"
            elif field is not None:
                alias = "" if option in reserved else f", an alias of {flags.aliases(option)[0]}"
                yield where, f"{said}{alias} is already rendered by the spec; set {field}"
            continue
        actions = {flags.aliases(m) for m in matches}
        field = reserved_by(matches[0]) if len(actions) == 1 else None
        if field is not None:  # a unique prefix: the engine would take it as the full flag
            yield (
                where,
                f"{said} abbreviates {matches[0]} (argparse accepts unique prefixes), "
                f"which the spec renders; set {field}",
            )
        elif not name.startswith("--") and matches == [name[:2]]:
            yield where, f"{said} is {name[:2]} with its value attached; write them as two items"
        elif matches:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            yield where, f"{said} is an abbreviation of {shown}; write the full flag name"
        else:
            close = difflib.get_close_matches(name, sorted(flags.options), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            yield (
                where,
                f"{said} is not a flag of {engine}=={flags.version}; {hint}"
                f"the pinned parser's flags are listed in {flags.source}",
            )


def flag_set_in(
    engine: str, version: str, args: list[str], spellings: frozenset[str]
) -> tuple[int, str] | None:
    """(index, flag) of the first flag in `args` that sets any of `spellings` as that engine
    release's parser reads it (an alias of the same action, vLLM's `_` for `-`), else None."""
    flags = engine_flags(engine, version)
    for i, token in _flags_in(args):
        option, _ = flags.resolve(parser_name(engine, token))
        if option is not None and spellings & set(flags.aliases(option)):
            return i, token
    return None


def flags_in(args: list[str]) -> list[str]:
    """The flag names an argv fragment uses, in order (shared with the flag-fixture tests)."""
    return [flag for _, flag in _flags_in(args)]


def _raise_problems(title: str, problems: Iterable[tuple[str, str]], model: BaseModel) -> None:
    details: list[InitErrorDetails] = [
        InitErrorDetails(
            type=PydanticCustomError("spec_consistency", "{reason}", {"reason": message}),
            loc=tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", field) if p),
            input=model.model_dump(mode="json"),
        )
        for field, message in problems
    ]
    if details:
        raise ValidationError.from_exception_data(title, details)
