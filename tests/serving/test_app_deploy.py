"""`modal deploy serving/app.py` with the real Modal CLI against the emulator, both engines.

What the emulator received is read back through the same API the SDK uses (FunctionGet returns
the function definition), so these tests check what Modal would be told: the image steps, the
spec file bundled byte for byte, volumes and secrets mounted where the spec says, GPU,
scaling, proxy auth and snapshot settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import modal
import pytest
from modal_proto import api_pb2

from components.modal._source import shipped_files
from serving import bake, render
from serving.spec import (
    ENGINE_IMAGES,
    HF_CACHE_PATH,
    PROXY_PORT,
    SERVER_NAME,
    SPEC_IN_IMAGE,
    ServingSpec,
)
from tests.harness.emulator import EmulatorProcess

ROOT = Path(__file__).resolve().parents[2]
MODAL_CLI = str(Path(sys.executable).parent / "modal")
SHA = "b968826d9c46dd6066d109eabc6255188de91218"

SPECS: dict[str, dict[str, Any]] = {
    # vLLM with GPU snapshots, a GPU preference list and an HF token secret
    "vllm": {
        "engine": "vllm",
        "model": "Qwen/Qwen3-8B",
        "revision": SHA,
        "served_model_name": "qwen3-8b",
        "gpu": ["H100", "A100-80GB"],
        "context_length": 8192,
        "snapshot": True,
        "secrets": {"hf_token": "hf-token", "api_keys": "serving-api-keys"},
        "scaling": {"min_containers": 1, "max_containers": 4, "buffer_containers": 1,
                    "scaledown_window_s": 600, "target_concurrency": 16, "max_concurrency": 48},
        "timeouts": {"startup_s": 1200, "request_s": 300},
        "require_pinned_revision": True,
    },
    # SGLang, tensor parallel over 2 GPUs, its own volumes, a compute region, no snapshot
    "sglang": {
        "engine": "sglang",
        "model": "Qwen/Qwen3-8B-FP8",
        "served_model_name": "Qwen/Qwen3-8B-FP8",
        "gpu": "L40S",
        "gpu_count": 2,
        "volumes": {"hf_cache": "hf-weights", "engine_cache": "sglang-cache"},
        "region": "us-east",
        "routing_region": "us-east",
    },
}  # fmt: skip


def write_spec(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "service.json"
    path.write_text(ServingSpec.model_validate(data).to_json())
    return path


def modal_deploy(
    emu: EmulatorProcess, spec_path: Path | None, **env: str
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **emu.client_env(), **env}
    for key in ("MODAL_ENVIRONMENT", "MODAL_PROFILE", "SERVING_SPEC", "SERVING_APP_NAME"):
        if key not in env:
            full_env.pop(key, None)
    if spec_path is not None:
        full_env["SERVING_SPEC"] = str(spec_path)
    # The CLI prints errors in a rich panel wrapped at COLUMNS: wide enough that a long temp
    # path in a message is never split across lines.
    full_env["COLUMNS"] = env.get("COLUMNS", "400")
    return subprocess.run(
        [MODAL_CLI, "deploy", "serving/app.py"],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def function_get(app_name: str) -> api_pb2.FunctionGetResponse:
    """The server's definition as stored by the control plane (FunctionGet, as the SDK calls it)."""
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client

    async def get() -> api_pb2.FunctionGetResponse:
        client = await _Client.from_env()
        req = api_pb2.FunctionGetRequest(
            app_name=app_name, object_tag=SERVER_NAME, environment_name="main"
        )
        return await client._stub.FunctionGet(req)

    resp: api_pb2.FunctionGetResponse = synchronizer.create_blocking(get)()
    assert resp.function.ranked_functions, "FunctionGet returned no definition"
    return resp


def function_definition(app_name: str) -> api_pb2.Function:
    return function_get(app_name).function.ranked_functions[0].function


def create_secrets(spec: ServingSpec) -> None:
    modal.Secret.objects.create(spec.secrets.api_keys, {"SERVING_API_KEYS": "{}"})
    if spec.secrets.hf_token:
        modal.Secret.objects.create(spec.secrets.hf_token, {"HF_TOKEN": "hf_dummy"})


def create_mounted_objects(spec: ServingSpec) -> None:
    """What the Pulumi component creates before the App: the secrets and the cache volumes."""
    create_secrets(spec)
    for name in render.volume_mounts(spec).values():
        modal.Volume.objects.create(name)


def image_commands(image: dict[str, Any]) -> list[str]:
    """An image's Dockerfile lines from the emulator's state dump (its spec holds the commands,
    the base image ids and the context mount)."""
    spec = json.loads(image["spec"])
    return list(spec["commands"] if isinstance(spec, dict) else spec)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_deploy_both_engines(modal_env: EmulatorProcess, tmp_path: Path, engine: str) -> None:
    spec = ServingSpec.model_validate(SPECS[engine])
    spec_path = write_spec(tmp_path, SPECS[engine])
    create_mounted_objects(spec)
    volumes_before = {v["name"]: v["id"] for v in modal_env.state()["volumes"]}

    result = modal_deploy(modal_env, spec_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    app_name = render.default_app_name(spec)

    url = modal.Server.from_name(app_name, SERVER_NAME).get_url()
    assert url is not None
    # the emulator's edge: the endpoint Modal names https://<label>.modal.run, on loopback
    labels = [label for label, port in modal_env.edge_ports().items() if url.endswith(f":{port}")]
    assert url.startswith("http://127.0.0.1:") and len(labels) == 1
    assert app_name.lower() in labels[0]

    state = modal_env.state()
    # the image: pinned engine base, no entrypoint, proxy deps, spec env, then the spec file
    steps = [image_commands(img) for img in state["images"]]
    assert all(img["built"] for img in state["images"])
    flat = [line for s in steps for line in s]
    assert f"FROM {ENGINE_IMAGES[engine]}" in flat
    assert "ENTRYPOINT []" in flat
    assert any("uvicorn==0.54.0" in line and "--target" in line for line in flat)
    assert "COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /.uv/uv" in flat  # pinned, not latest
    assert f"ENV SERVING_SPEC={SPEC_IN_IMAGE}" in flat
    for key, value in render.engine_env(spec).items():
        assert f"ENV {key}={value}" in flat
    # the build step of serving/bake.py, on the engine's base image: the script copied in
    # byte for byte, then run (bytecode; vLLM's model-inspection files for a vLLM spec)
    vllm_part = f" --vllm-cache {bake.BAKED_VLLM_CACHE}" if engine == "vllm" else ""
    assert f"RUN python3 {bake.IN_IMAGE}{vllm_part}" in flat, flat
    bake_sha = hashlib.sha256((ROOT / "serving" / "bake.py").read_bytes()).hexdigest()
    in_image = [f for m in state["mounts"] for f in json.loads(m["files"]) if f[0] == bake.IN_IMAGE]
    assert [f[1] for f in in_image] == [bake_sha]
    # the spec file is bundled byte for byte at SPEC_IN_IMAGE
    want = hashlib.sha256(spec_path.read_bytes()).hexdigest()
    bundled = [f for m in state["mounts"] for f in json.loads(m["files"]) if f[0] == SPEC_IN_IMAGE]
    assert [f[1] for f in bundled] == [want]
    # the app's manifest ships (proxy + lifecycle), the app file too, and nothing else of
    # serving/: exactly what the App's source_digest covers for this spec
    shipped = {f[0] for m in state["mounts"] for f in json.loads(m["files"])}
    digested = shipped_files("serving/app.py", ROOT, spec_json=spec_path.read_text())
    assert {f for f in shipped if f.startswith("/root/")} == {"/root/app.py"} | {
        f"/root/{p.relative_to(ROOT)}" for p in digested if p != ROOT / "serving/app.py"
    }
    assert "/root/standin_engine.py" not in shipped  # a real engine: no stand-in
    assert {"/root/serving/engine.py", "/root/serving/spec.py"} <= shipped
    assert "/root/serving/proxy/__main__.py" in shipped
    # the recorded flag lists the spec checks extra_args against, read again in the container
    assert "/root/serving/engine_flags/__init__.py" in shipped
    assert f"/root/serving/engine_flags/{engine}_{spec.engine_version.replace('.', '_')}.py" in (
        shipped
    )

    fn = function_definition(app_name)
    # volumes created by name and mounted where the spec says
    volume_ids = {v["name"]: v["id"] for v in state["volumes"]}
    assert volume_ids == volumes_before  # mounted the existing ones, created none
    mounts = {vm.mount_path: vm.volume_id for vm in fn.volume_mounts}
    assert mounts == {
        path: volume_ids[name] for path, name in render.volume_mounts(spec).items()
    }, (
        mounts,
        volume_ids,
    )
    assert HF_CACHE_PATH in mounts
    # secrets by name (API keys, and HF token when set)
    secret_ids = {s["name"]: s["id"] for s in state["secrets"]}
    for name in render.secret_names(spec):
        assert secret_ids[name] in fn.secret_ids
    # GPU, scaling, proxy auth, port, timeouts
    gpu_types = [
        rf.function.resources.gpu_config.gpu_type
        for rf in function_get(app_name).function.ranked_functions
        if rf.function.resources.gpu_config.gpu_type
    ]
    assert gpu_types == [g.upper() for g in spec.gpu_types]
    assert fn.resources.gpu_config.count == spec.gpu_count
    # The CPU request the command line needs (one core per API server + engine + proxy).
    assert fn.resources.milli_cpu == int(render.sizing(spec).cpu * 1000)
    # ...and the memory request for the same processes, in MiB (no hard limit: memory_mb_max 0).
    assert fn.resources.memory_mb == render.sizing(spec).memory_mib
    assert fn.resources.memory_mb_max == 0
    assert fn.http_config.port == PROXY_PORT and fn.http_config.unauthenticated is False
    assert fn.http_config.startup_timeout == spec.timeouts.startup_s
    assert list(fn.http_config.proxy_regions) == [spec.routing_region]
    auto = fn.autoscaler_settings
    assert (auto.min_containers, auto.max_containers, auto.buffer_containers) == (
        spec.scaling.min_containers,
        spec.scaling.max_containers,
        spec.scaling.buffer_containers,
    )
    assert auto.scaledown_window == spec.scaling.scaledown_window_s
    assert fn.max_concurrent_inputs == spec.scaling.max_concurrency
    assert auto.target_concurrency_float == spec.scaling.target_concurrency
    # snapshots: CPU + GPU memory snapshot only when the spec asks
    assert fn.checkpointing_enabled is spec.snapshot
    assert (dict(fn.experimental_options).get("enable_gpu_snapshot") == "True") is spec.snapshot


@pytest.mark.slow
def test_app_name_from_env_and_redeploy(modal_env: EmulatorProcess, tmp_path: Path) -> None:
    data = SPECS["sglang"]
    spec = ServingSpec.model_validate(data)
    create_mounted_objects(spec)
    spec_path = write_spec(tmp_path, data)
    first = modal_deploy(modal_env, spec_path, SERVING_APP_NAME="team-llm")
    assert first.returncode == 0, first.stderr[-3000:]
    assert modal.Server.from_name("team-llm", SERVER_NAME).get_url()
    # a changed spec redeploys the same app with the new settings
    spec_path = write_spec(tmp_path, {**data, "scaling": {"max_containers": 3}})
    second = modal_deploy(modal_env, spec_path, SERVING_APP_NAME="team-llm")
    assert second.returncode == 0, second.stderr[-3000:]
    apps = [a for a in modal_env.state()["apps"] if a["name"] == "team-llm"]
    assert len(apps) == 1 and apps[0]["version"] == 2
    assert function_definition("team-llm").autoscaler_settings.max_containers == 3


@pytest.mark.slow
def test_deploy_without_the_volumes_fails_and_creates_none(
    modal_env: EmulatorProcess, tmp_path: Path
) -> None:
    """The App never creates volumes: they belong to the Volume resources it depends on. Had
    it created them, a later Volume create would fail with AlreadyExists."""
    spec = ServingSpec.model_validate(SPECS["sglang"])
    create_secrets(spec)
    modal.Volume.objects.create(spec.volumes.hf_cache)  # the engine cache volume is missing
    result = modal_deploy(modal_env, write_spec(tmp_path, SPECS["sglang"]))
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert spec.volumes.engine_cache in out and "not found" in out.lower(), out[-3000:]
    assert [v["name"] for v in modal_env.state()["volumes"]] == [spec.volumes.hf_cache]
    assert [a for a in modal_env.state()["apps"] if a.get("state") == "deployed"] == []


def test_deploy_without_serving_spec_says_what_to_set(emulator: EmulatorProcess) -> None:
    result = modal_deploy(emulator, None)
    assert result.returncode != 0
    assert "SERVING_SPEC is not set" in result.stdout + result.stderr


def test_deploy_with_invalid_spec_names_the_field(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**SPECS["sglang"], "gpu": "H1000"}))
    result = modal_deploy(emulator, bad)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "gpu: unknown GPU 'H1000'" in out and str(bad) in out
    assert emulator.state()["apps"] == []  # nothing was deployed


def test_deploy_with_bad_app_name(emulator: EmulatorProcess, tmp_path: Path) -> None:
    result = modal_deploy(emulator, write_spec(tmp_path, SPECS["vllm"]), SERVING_APP_NAME="a b")
    assert result.returncode != 0
    assert "not a valid Modal app name" in result.stdout + result.stderr


@pytest.mark.slow
def test_a_key_rotation_changes_the_function_definition(
    modal_env: EmulatorProcess, tmp_path: Path
) -> None:
    """The key digests' version (SERVING_API_KEYS_SHA256, set by the App resource) reaches the
    container through the image ENV, so it is part of the deployed definition: the same keys
    give the same definition (modal's no-op deploy), other keys another one (Modal replaces
    the containers). The API key Secret keeps its id across a rotation, so without this the
    definition would not change. Deployed with the stand-in engine, as the local stack is."""
    data = {**SPECS["sglang"], "engine_standin": {}}
    spec = ServingSpec.model_validate(data)
    create_mounted_objects(spec)
    path = write_spec(tmp_path, data)
    versions = [hashlib.sha256(keys.encode()).hexdigest() for keys in ("{a}", "{b}")]

    def deploy(version: str) -> api_pb2.Function:
        result = modal_deploy(
            modal_env, path, SERVING_APP_NAME="rotating", SERVING_API_KEYS_SHA256=version
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return function_definition("rotating")

    def canonical(fn: api_pb2.Function, image_id: str | None = None) -> api_pb2.Function:
        out = api_pb2.Function()
        out.CopyFrom(fn)
        # the client lists mounts and dependencies in no fixed order (gathered concurrently)
        out.ClearField("mount_ids")
        out.mount_ids.extend(sorted(fn.mount_ids))
        out.image_id = image_id or fn.image_id
        deps = sorted(out.image_id if d.object_id == fn.image_id else d.object_id
                      for d in fn.object_dependencies)  # fmt: skip
        out.ClearField("object_dependencies")
        out.object_dependencies.extend(api_pb2.ObjectDependency(object_id=d) for d in deps)
        return out

    first, same, rotated = deploy(versions[0]), deploy(versions[0]), deploy(versions[1])
    assert canonical(same) == canonical(first)
    assert rotated.image_id != first.image_id
    # the image ENV is the only difference: same secrets (by id), volumes, scaling, ...
    changed = [
        f.name
        for f in api_pb2.Function.DESCRIPTOR.fields
        if getattr(canonical(rotated, image_id=first.image_id), f.name)
        != getattr(canonical(first), f.name)
    ]
    assert changed == []
    flat = [line for img in modal_env.state()["images"] for line in image_commands(img)]
    for version in versions:
        assert f"ENV SERVING_API_KEYS_SHA256={version}" in flat
    assert f"ENV SERVING_SPEC_SHA256={spec.digest()}" in flat


def test_a_malformed_key_version_fails_the_deploy(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    result = modal_deploy(
        emulator, write_spec(tmp_path, SPECS["sglang"]), SERVING_API_KEYS_SHA256="not-a-digest"
    )
    assert result.returncode != 0
    assert "SERVING_API_KEYS_SHA256 must be a sha256 hex digest" in result.stdout + result.stderr
    assert emulator.state()["apps"] == []


def test_a_standin_spec_is_refused_for_real_modal(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    """Before anything is sent: serving/app.py checks the Modal server the CLI would use."""
    path = write_spec(tmp_path, {**SPECS["sglang"], "engine_standin": {}})
    result = modal_deploy(emulator, path, MODAL_SERVER_URL="https://api.modal.com")
    out = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines
    assert result.returncode != 0
    assert "only runs on a local Modal" in out and "https://api.modal.com" in out
    assert emulator.state()["apps"] == []
