"""The App provider deploying the real serving app (serving/app.py) with the secret it needs."""

from __future__ import annotations

import json

from components.modal import AppProvider, SecretProvider, VolumeProvider
from components.modal._source import shipped_files
from serving.spec import SERVER_NAME, ServingSpec
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, Secret
from tests.providers.helpers import rpc_delta


def spec(max_containers: int = 1) -> str:
    return ServingSpec.model_validate(
        {
            "engine": "vllm",
            "model": "Qwen/Qwen3-0.6B",
            "served_model_name": "qwen",
            "scaling": {"max_containers": max_containers},
        }
    ).to_json()


def test_serving_app_ships_its_modules_not_the_whole_package() -> None:
    """The app's manifest (tests/providers/test_shipped_source.py checks it against modal's
    mounts): the proxy and lifecycle code, not the stand-in engine for a real-engine spec nor
    the other apps' files."""
    shipped = shipped_files("serving/app.py", PROJECT_ROOT, spec_json=spec())
    rel = {str(p.relative_to(PROJECT_ROOT)) for p in shipped}
    assert {"serving/app.py", "serving/spec.py", "serving/__init__.py"} <= rel
    assert {"serving/engine.py", "serving/proxy/__main__.py"} <= rel
    assert all(r.startswith("serving/") and r.endswith(".py") for r in rel)
    assert not {"dev/standin_engine.py", "serving/weights_app.py", "serving/prewarm_app.py"} & rel


def test_deploy_update_and_stop_serving_app(engine: Engine, emulator: EmulatorProcess) -> None:
    keys = {"SERVING_API_KEYS": json.dumps({"ci": "sha256:" + "1" * 64})}
    engine.up(
        "keys",
        SecretProvider(),
        {"name": "serving-api-keys", "environment": "main", "values": Secret(keys)},
    )
    # serving/app.py looks its volumes up by name (the Volume resources own them), so they
    # exist before the App, as the component orders it.
    vols = ServingSpec.model_validate_json(spec()).volumes
    for name in (vols.hf_cache, vols.engine_cache):
        engine.up(f"vol-{name}", VolumeProvider(), {"name": name, "environment": "main"})
    app = AppProvider()
    inputs = {
        "name": "llm",
        "environment": "main",
        "app_file": "serving/app.py",
        "spec_json": spec(),
    }
    assert engine.up("app", app, inputs) == "create"
    out = engine.states["app"].outputs
    # @app.server: the URL is the server's flash URL, named after the server class.
    assert out["web_url"] == emulator.edge_url(f"emu-workspace--llm-{SERVER_NAME.lower()}")
    assert out["spec_digest"] == ServingSpec.model_validate_json(spec()).digest()
    before = emulator.rpc_counts()
    assert engine.preview("app", app, inputs) == "same"
    assert rpc_delta(before, emulator.rpc_counts()) == {}
    assert engine.up("app", app, {**inputs, "spec_json": spec(max_containers=2)}) == "update"
    assert engine.states["app"].outputs["version"] == 2
    engine.destroy("app")
    assert {a["state"] for a in emulator.state()["apps"]} == {"stopped"}
