"""App resource on real Modal: deploy the small CPU-only test app the emulator tests deploy
(tests/providers/apps/echo_app.py: one web endpoint, no GPU, no min_containers, never called,
so no container runs), refresh, no-op diff, delete (stop)."""

from __future__ import annotations

from components.modal._source import source_digest
from components.modal.app import AppProvider
from serving.spec import ServingSpec
from tests.harness.provider_server import PROJECT_ROOT, ProviderServer
from tests.real_modal.conftest import ThrowawayEnvironment
from tests.real_modal.support import REAL_MODAL, assert_diff_none, destroying, is_gone

pytestmark = REAL_MODAL
P = AppProvider()
APP_FILE = "tests/providers/apps/echo_app.py"
APP_NAME = "iac-test-echo"
SPEC = ServingSpec.model_validate(
    {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": "qwen"}
)


def inputs(env: str) -> dict[str, object]:
    return {"name": APP_NAME, "environment": env, "app_file": APP_FILE, "spec_json": SPEC.to_json()}


def test_app_deploy_refresh_noop_stop(
    real_server: ProviderServer, throwaway_environment: ThrowawayEnvironment
) -> None:
    env = throwaway_environment.name
    with destroying(real_server) as engine:
        assert engine.up("app", P, inputs(env)) == "create"
        st = engine.states["app"]
        app_id = st.id
        assert app_id.startswith("ap-") and st.outputs["app_id"] == app_id
        assert st.outputs["version"] >= 1
        web_url = st.outputs["web_url"]
        assert web_url.startswith("https://") and web_url.endswith(".modal.run"), web_url
        assert st.outputs["spec_digest"] == SPEC.digest()
        assert st.outputs["source_digest"] == source_digest(APP_FILE, PROJECT_ROOT)
        assert engine.refresh("app") == "same"  # Modal answers the deployed app_id by name
        assert_diff_none(engine, "app", P, inputs(env))  # no redeploy

        last = (st.outputs, st.inputs)
        engine.destroy("app")
        assert is_gone(real_server, P, app_id, *last)  # stopped
