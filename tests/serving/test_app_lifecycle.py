"""serving/app.py's own lifecycle methods, run locally with the stub engine as the engine.

The app module is imported exactly as `modal deploy` imports it (SERVING_SPEC set), then its
server class's `@modal.enter` / `@modal.exit` methods are called in the order Modal calls them.
SERVING_ENGINE_CMD swaps the engine command for the stub and SERVING_*_PORT move the ports
(local runs only). Also checks the container-side branch: outside `modal.is_local()` the spec
comes from the file SERVING_SPEC names in the image.
"""

from __future__ import annotations

import importlib.util
import itertools
import shlex
import sys
from pathlib import Path
from types import ModuleType

import modal
import pytest
from modal._partial_function import _find_partial_methods_for_user_cls, _PartialFunctionFlags

from serving.spec import ServingSpec
from tests.serving.test_engine_lifecycle import KEY, KEYS_ENV, free_port, http, stub_cmd, stub_log

ROOT = Path(__file__).resolve().parents[2]
_counter = itertools.count()


def import_app(
    monkeypatch: pytest.MonkeyPatch, spec: ServingSpec, tmp_path: Path, spec_env: str | None = None
) -> ModuleType:
    path = tmp_path / f"spec-{next(_counter)}.json"
    path.write_text(spec.to_json())
    monkeypatch.setenv("SERVING_SPEC", spec_env or str(path))
    monkeypatch.delenv("SERVING_APP_NAME", raising=False)
    name = f"serving_app_under_test_{next(_counter)}"
    module_spec = importlib.util.spec_from_file_location(name, ROOT / "serving" / "app.py")
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def make_spec(engine: str, snapshot: bool) -> ServingSpec:
    return ServingSpec.model_validate(
        {
            "engine": engine,
            "model": "Qwen/Qwen3-8B",
            "served_model_name": "qwen3-8b",
            "snapshot": snapshot,
            "context_length": 4096,
            "warmup_prompts": ["one", "two", "three"],
            "timeouts": {"startup_s": 60, "request_s": 30},
        }
    )


def lifecycle_methods(module: ModuleType) -> dict[str, list[str]]:
    user_cls = module.Serving._get_user_cls()
    flags = {
        "pre_snapshot": _PartialFunctionFlags.ENTER_PRE_SNAPSHOT,
        "post_snapshot": _PartialFunctionFlags.ENTER_POST_SNAPSHOT,
        "exit": _PartialFunctionFlags.EXIT,
    }
    return {k: sorted(_find_partial_methods_for_user_cls(user_cls, f)) for k, f in flags.items()}


@pytest.mark.parametrize(
    ("engine", "snapshot", "routes"),
    [
        ("vllm", True, [("/sleep", "level=1"), ("/wake_up", "")]),
        ("sglang", True, [("/release_memory_occupation", ""), ("/resume_memory_occupation", "")]),
        ("vllm", False, []),
    ],
)
def test_app_lifecycle_with_stub_engine(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    engine: str,
    snapshot: bool,
    routes: list[tuple[str, str]],
) -> None:
    engine_port, proxy_port = free_port(), free_port()
    monkeypatch.setenv("SERVING_ENGINE_CMD", shlex.join(stub_cmd(engine_port)))
    monkeypatch.setenv("SERVING_ENGINE_PORT", str(engine_port))
    monkeypatch.setenv("SERVING_PROXY_PORT", str(proxy_port))
    for key, value in KEYS_ENV.items():
        monkeypatch.setenv(key, value)
    module = import_app(monkeypatch, make_spec(engine, snapshot), tmp_path)

    methods = lifecycle_methods(module)
    if snapshot:  # snap=True starts and sleeps, snap=False wakes
        assert methods == {
            "pre_snapshot": ["start"],
            "post_snapshot": ["restore"],
            "exit": ["stop"],
        }
    else:
        assert methods == {"pre_snapshot": [], "post_snapshot": ["start"], "exit": ["stop"]}

    server = module.Serving._get_user_cls()()
    try:
        server.start()
        if snapshot:
            server.restore()
        log = stub_log(engine_port)
        warmups = [r for r in log["requests"] if r["path"] == "/v1/chat/completions"]
        assert len(warmups) == 3
        calls = [(r["path"], r["query"]) for r in log["requests"] if r["method"] == "POST"]
        assert [c for c in calls if c[0] != "/v1/chat/completions"] == routes
        status, body = http(
            "POST",
            f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
            {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]},
            {"Authorization": f"Bearer {KEY}"},
        )
        assert status == 200 and body["choices"]
    finally:
        server.stop()
    assert server.container.engine.process.poll() is not None
    assert server.container.proxy is not None and server.container.proxy.poll() is not None


def test_container_side_reads_the_spec_the_image_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In the container (not modal.is_local()) the spec comes from SERVING_SPEC in the image."""
    spec = make_spec("sglang", False)
    monkeypatch.setattr(modal, "is_local", lambda: False)
    module = import_app(monkeypatch, spec, tmp_path)
    assert spec == module.SPEC
    assert module.APP_NAME == "qwen3-8b"


def test_deploy_side_resolves_the_spec_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """At deploy time the file SERVING_SPEC names is what gets bundled (absolute path)."""
    monkeypatch.chdir(tmp_path)
    spec = make_spec("vllm", True)
    (tmp_path / "relative.json").write_text(spec.to_json())
    module = import_app(monkeypatch, spec, tmp_path, spec_env="relative.json")
    assert tmp_path.resolve() / "relative.json" == module.SPEC_PATH
    assert spec == module.SPEC
