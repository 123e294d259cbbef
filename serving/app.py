"""The Modal app that serves one model: the auth proxy in front, vLLM or SGLang behind it.

Deploy (the App resource does the same):

    SERVING_SPEC=service.json [SERVING_APP_NAME=my-llm] modal deploy serving/app.py

The volumes and secrets the spec names must exist first: the Pulumi component creates them
(Volume and Secret resources, which the App depends on); by hand, `modal volume create NAME`
and `modal secret create NAME ...`. The app never creates them itself, so a typo fails the
deploy instead of mounting a new, empty cache.

Everything the app does comes from the serving spec (serving/spec.py), rendered by
serving/render and serving/sizing.py; the lifecycle in the container lives in
serving/engine.py. Read top to bottom: spec, image, volumes and secrets, then the server class
with its lifecycle.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import modal

import serving
from serving import bake, render
from serving.engine import Container
from serving.spec import (
    ENGINE_PORT,
    KEY_VERSION_ENV,
    PROXY_PORT,
    SERVER_NAME,
    SPEC_DIGEST_ENV,
    SPEC_ENV,
    SPEC_IN_IMAGE,
    ServingSpec,
    SpecError,
    check_app_name,
)

# ---- The spec --------------------------------------------------------------------------------
# At deploy time the spec is the JSON file that SERVING_SPEC names. The same file is copied into
# the image (copy=True below), so the container reads the identical spec from SPEC_IN_IMAGE.
if modal.is_local():
    if not os.environ.get(SPEC_ENV):
        raise SpecError(
            f"env {SPEC_ENV} is not set: point it at the serving spec JSON, e.g. "
            f"{SPEC_ENV}=service.json modal deploy serving/app.py"
        )
    SPEC_PATH = Path(os.environ[SPEC_ENV]).resolve()
else:
    SPEC_PATH = Path(os.environ.get(SPEC_ENV) or SPEC_IN_IMAGE)
SPEC = ServingSpec.load(SPEC_PATH)
APP_NAME = check_app_name(os.environ.get("SERVING_APP_NAME") or render.default_app_name(SPEC))
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
if modal.is_local() and SPEC.engine_standin is not None:
    # The stand-in engine answers with fixed text: never on real Modal (the stack config
    # refuses it too; this catches a hand-made spec).
    servers = str(modal.config.config.get("server_url") or "").split(",")
    if not all(urlsplit(u.strip()).hostname in LOOPBACK_HOSTS for u in servers):
        raise SpecError(
            f"the spec asks for the stand-in engine (engine_standin), which only runs on a "
            f"local Modal (the emulator), but the Modal server is {','.join(servers)}; remove "
            "engine_standin from the spec to deploy the real engine"
        )

# What must reach the container is part of the function definition, so that a change makes
# Modal replace the containers: modal 1.6.4's deploy is a no-op when the definition is
# unchanged (modal/runner.py: a falsy `deployed_at`, "Deployment skipped: no changes"), and
# the API key Secret keeps its id across a rotation. The image is content-addressed, so its
# ENV is that place: the key digests' version (set by the App resource at deploy time) and the
# spec digest. Not Secret.from_dict (`env=`): an ephemeral secret with a new id every deploy
# would make every deploy a change. The keys themselves stay in the Secret.
DEFINITION_ENV = {SPEC_DIGEST_ENV: SPEC.digest()}
if os.environ.get(KEY_VERSION_ENV):
    if not re.fullmatch(r"[0-9a-f]{64}", os.environ[KEY_VERSION_ENV]):
        raise SpecError(f"env {KEY_VERSION_ENV} must be a sha256 hex digest (64 hex characters)")
    DEFINITION_ENV[KEY_VERSION_ENV] = os.environ[KEY_VERSION_ENV]

EXIT_GRACE_S = 30  # in-flight requests may finish when Modal scales a container down
# The proxy's own dependencies go into a separate directory so they never change the packages
# the engine was released with (same versions as the project's venv, tested there).
PROXY_DEPS = "/opt/serving/proxy-deps"
PROXY_REQUIREMENTS = [
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "httptools==0.9.0",
    "orjson==3.13.0",
    "pysimdjson==7.0.2",  # bodies of 16 KiB and more checked without building objects
]
UV_VERSION = "0.13.8"  # the uv binary Modal copies in to install them

# ---- What the container gets -----------------------------------------------------------------
# Modal runs this file as /root/app.py; beside it ship these modules and nothing else of
# serving/, so a test double or another app's file never reaches the container nor changes its
# source digest. A module name ships its file, a package name its .py files, "pkg.__init__" a
# package's own __init__.py (modal 1.6.4 modal/_utils/package_utils.py get_module_mount_info:
# a package's directory, else the module's file). SHIPPED_IF_SPEC adds modules by the spec's
# top-level keys: "key" when the spec has the key with a non-null value, "key=value" when it
# holds that string. Literals only: components/modal/_source.py reads both without importing
# this file and digests exactly what ships (tests/providers/test_shipped_source.py imports
# each case from the shipped files alone).
SHIPPED_MODULES = (
    "serving.__init__",
    "serving.engine",  # the lifecycle (Container)
    "serving.bake",  # engine.py: the model-inspection files baked at build, copied at the start
    "serving.prefetch",  # engine.py: the weights read into the page cache at the start
    "serving.spec",  # the spec, validated again here
    "serving.sizing",  # spec.py: the CPU and memory figures its validation shares
    "serving.render",  # the engine and proxy command lines and env, rendered from the spec
    "serving.weights",  # spec.py: WEIGHTS_MOUNT
    "serving.engine_flags.__init__",
    "serving.proxy",  # the auth proxy, run as `python -m serving.proxy`
)
SHIPPED_IF_SPEC = {
    "engine_standin": ("standin_engine",),  # the local stack's engine, no GPU (dev tools)
    # the pinned release's recorded flags (serving/engine_flags/), read by spec validation
    "engine=vllm": ("serving.engine_flags.vllm_0_33_0",),
    "engine=sglang": ("serving.engine_flags.sglang_0_5_23",),
    "engine_version=0.26.0": ("serving.engine_flags.vllm_0_26_0",),  # a vLLM the spec may name
    "engine_version=0.5.15": ("serving.engine_flags.sglang_0_5_15",),  # an SGLang it may name
}


def shipped_modules(spec_fields: dict[str, object]) -> tuple[str, ...]:
    """SHIPPED_MODULES plus the SHIPPED_IF_SPEC entries whose condition holds for the spec as
    written (the raw JSON object): the rule components/modal/_source.py `condition_holds`
    applies to the same JSON."""
    modules = list(SHIPPED_MODULES)
    for condition, more in SHIPPED_IF_SPEC.items():
        key, eq, value = condition.partition("=")
        have = spec_fields.get(key)
        if (have == value) if eq else (have is not None):
            modules += more
    return tuple(modules)


def bake_command(spec: ServingSpec) -> str:
    """The build step of serving/bake.py: bytecode for the image's packages, and for vLLM its
    model-inspection files (copied into the engine cache at the start by serving/engine.py)."""
    cmd = ["python3", bake.IN_IMAGE]
    if spec.engine == "vllm":
        cmd += ["--vllm-cache", str(bake.BAKED_VLLM_CACHE)]
    return shlex.join(cmd)


# ---- The image -------------------------------------------------------------------------------
image = (
    modal.Image.from_registry(SPEC.engine_release.image)  # pinned engine release (serving/spec.py)
    .entrypoint([])  # the engine images start a server by default; Modal runs our class instead
    # What a start would otherwise do in every container (serving/bake.py), before the layers
    # that depend on the spec: one build serves every spec of the same engine release.
    .add_local_file(Path(bake.__file__), bake.IN_IMAGE, copy=True)
    .run_commands(bake_command(SPEC))
    .uv_pip_install(
        *PROXY_REQUIREMENTS, extra_options=f"--target {PROXY_DEPS}", uv_version=UV_VERSION
    )
    .env({**render.engine_env(SPEC), SPEC_ENV: SPEC_IN_IMAGE, "SERVING_APP_NAME": APP_NAME})
    .add_local_file(SPEC_PATH, SPEC_IN_IMAGE, copy=True)  # the identical spec, baked in
    .env(DEFINITION_ENV)  # last of the built layers: a key rotation rebuilds only this
    # proxy + lifecycle code (mounted at container start, so it comes last)
    .add_local_python_source(*shipped_modules(json.loads(SPEC_PATH.read_text())))
)

# ---- Volumes and secrets ---------------------------------------------------------------------
# Weights on the HF volume, compiled kernels on the engine volume: a new container neither
# downloads nor recompiles. Secrets: SERVING_API_KEYS (key digests) and optionally HF_TOKEN.
# All looked up by name, never created here: the Volume/Secret resources own them.
volumes: dict[str | PurePosixPath, modal.Volume | modal.CloudBucketMount] = {
    path: modal.Volume.from_name(name) for path, name in render.volume_mounts(SPEC).items()
}
secrets = [modal.Secret.from_name(name) for name in render.secret_names(SPEC)]

app = modal.App(APP_NAME)


def _container() -> Container:
    logging.basicConfig(level=logging.INFO, format="[serving] %(message)s")
    # The proxy runs with the image's python and its own dependency directory.
    source_root = str(Path(serving.__file__).resolve().parent.parent)  # where `serving` lives
    proxy_env = {"PYTHONPATH": os.pathsep.join([PROXY_DEPS, source_root])}
    # The stand-in engine (local stack) is our code too: same packages as the proxy.
    engine_env = proxy_env if SPEC.engine_standin is not None else None
    # Local runs only (tests, debugging): another engine command and other ports.
    engine_cmd = os.environ.get("SERVING_ENGINE_CMD")
    proxy_port = int(os.environ.get("SERVING_PROXY_PORT", PROXY_PORT))
    engine_port = int(os.environ.get("SERVING_ENGINE_PORT", ENGINE_PORT))
    return Container(
        SPEC,
        proxy_port=proxy_port,
        engine_port=engine_port,
        engine_argv=shlex.split(engine_cmd) if engine_cmd else None,
        proxy_argv=render.proxy_command(SPEC, port=proxy_port, engine_port=engine_port),
        proxy_env=proxy_env,
        engine_env=engine_env,
    )


@app.server(
    name=SERVER_NAME,
    image=image,
    gpu=render.modal_gpu(SPEC),
    # What the engine's command line needs: one core per vLLM API server, the engine core(s)
    # and the proxy (serving/sizing.py `cpu_request`; measured in docs/gpu.md).
    cpu=render.sizing(SPEC).cpu,
    # Host memory (MiB) for the same processes (serving/sizing.py `memory_request_mib`: measured
    # RSS + 25 %): a reservation billed as max(request, usage), not a limit; the weights go to
    # the GPU, so it does not grow with the model.
    memory=render.sizing(SPEC).memory_mib,
    volumes=volumes,
    secrets=secrets,
    port=PROXY_PORT,  # Modal routes to the proxy; the engine listens on 127.0.0.1 only
    unauthenticated=False,  # Modal proxy auth: Modal-Key/Modal-Secret checked at the edge
    # The container gives up a little earlier (serving/engine.py: startup_budget_s), so a
    # start that takes too long ends with the engine's last log lines, not a silent kill.
    startup_timeout=SPEC.timeouts.startup_s,
    min_containers=SPEC.scaling.min_containers,
    max_containers=SPEC.scaling.max_containers,
    buffer_containers=SPEC.scaling.buffer_containers,
    scaledown_window=SPEC.scaling.scaledown_window_s,
    target_concurrency=SPEC.scaling.target_concurrency,
    max_concurrency=SPEC.scaling.max_concurrency,  # Modal answers 429 above this
    routing_region=SPEC.routing_region,
    compute_region=SPEC.region,
    exit_grace_period=EXIT_GRACE_S,
    enable_memory_snapshot=SPEC.snapshot,
    experimental_options={"enable_gpu_snapshot": True} if SPEC.snapshot else None,
)
class Serving:
    """One container: proxy on PROXY_PORT at once, engine beside it, snapshot-aware."""

    container: Container

    if SPEC.snapshot:

        @modal.enter(snap=True)
        def start(self) -> None:
            """Before the snapshot: start the engine, wait healthy, warm up, free the GPU.

            The proxy is not started yet: it would keep the API key digests it read here in
            the snapshot, and a key rotation would not reach restored containers.
            """
            self.container = _container()
            self.container.start(proxy=False)
            self.container.ready()
            self.container.before_snapshot()

        @modal.enter(snap=False)
        def restore(self) -> None:
            """After restore: take the GPU memory back, start the proxy (it reads the keys now,
            from the env Modal updated at restore), check health and readiness."""
            self.container.after_restore()

    else:

        @modal.enter()
        def start(self) -> None:
            """Start the proxy and the engine, wait until healthy, warm up."""
            self.container = _container()
            self.container.start()
            self.container.ready()

    @modal.exit()
    def stop(self) -> None:
        if hasattr(self, "container"):  # absent if start() failed before creating it
            self.container.stop()
