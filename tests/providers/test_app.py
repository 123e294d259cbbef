"""App provider: real `modal` deploys (in a subprocess) of a small test app on the emulator."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from components.modal.app import AppProvider, shipped_files, source_digest
from serving.spec import ServingSpec
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, lifecycle
from tests.providers.helpers import mutating_calls, rpc_delta

P = AppProvider()
APP_FILE = "tests/providers/apps/echo_app.py"


def spec(model: str = "qwen", **kw: object) -> str:
    return ServingSpec.model_validate(
        {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": model, **kw}
    ).to_json()


def inputs(
    name: str = "echo", env: str = "main", app_file: str = APP_FILE, **kw: object
) -> dict[str, object]:
    return {"name": name, "environment": env, "app_file": app_file, "spec_json": spec(), **kw}


def apps(emu: EmulatorProcess) -> dict[str, str]:
    """app id → state name, from the emulator's state dump."""
    return {a["id"]: str(a.get("state")) for a in emu.state()["apps"]}


def modal_cli(emu: EmulatorProcess, *args: str) -> None:
    subprocess.run(
        [str(PROJECT_ROOT / ".venv/bin/modal"), *args],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )


def test_shipped_files_cover_the_app_and_its_local_packages() -> None:
    rel = sorted(str(p.relative_to(PROJECT_ROOT)) for p in shipped_files(APP_FILE, PROJECT_ROOT))
    assert rel == [
        "tests/providers/apps/echo_app.py",
        "tests/providers/apps/echo_helpers/__init__.py",
    ]


def test_lifecycle_spec_change_redeploys_in_place(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    new = {**inputs(), "spec_json": spec("qwen-2")}
    steps = lifecycle(engine, "a", P, inputs(), new, destroy=False)
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["a"]
    assert st.id.startswith("ap-") and st.outputs["app_id"] == st.id
    assert st.outputs["web_url"] == "https://emu-workspace--echo-echo.modal.run"
    assert st.outputs["version"] == 2
    assert st.outputs["spec_digest"] == ServingSpec.model_validate_json(spec("qwen-2")).digest()
    assert st.outputs["source_digest"] == source_digest(APP_FILE, PROJECT_ROOT)
    assert apps(emulator) == {st.id: "deployed"}
    engine.destroy("a")
    assert apps(emulator) == {st.id: "stopped"}


def test_noop_makes_no_deploy(engine: Engine, emulator: EmulatorProcess) -> None:
    engine.up("a", P, inputs())
    before = emulator.rpc_counts()
    for _ in range(3):
        assert engine.preview("a", P, inputs()) == "same"
    after = emulator.rpc_counts()
    assert mutating_calls(before, after) == {}
    assert rpc_delta(before, after) == {}


def test_source_change_redeploys_and_unshipped_files_do_not(
    engine: Engine, tmp_path: Path, emulator: EmulatorProcess
) -> None:
    shutil.copytree(PROJECT_ROOT / "tests/providers/apps", tmp_path / "apps")
    app_file = str(tmp_path / "apps/echo_app.py")
    engine.up("a", P, inputs(app_file=app_file))
    (tmp_path / "apps/NOTES.txt").write_text("not shipped")
    assert engine.preview("a", P, inputs(app_file=app_file)) == "same"
    helper = tmp_path / "apps/echo_helpers/__init__.py"
    helper.write_text(helper.read_text().replace("hello from", "hi from"))
    assert engine.preview("a", P, inputs(app_file=app_file)) == "update"
    assert engine.up("a", P, inputs(app_file=app_file)) == "update"
    assert engine.states["a"].outputs["version"] == 2
    assert (
        engine.preview("a", P, inputs(app_file=app_file, extra_env={"ECHO_EXTRA": "1"})) == "update"
    )


def test_name_change_replaces_and_stops_the_old_app(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    engine.up("a", P, inputs())
    old = engine.states["a"].id
    assert engine.preview("a", P, inputs(name="echo-2")) == "replace"
    assert engine.up("a", P, inputs(name="echo-2")) == "replace"
    new = engine.states["a"]
    assert new.id != old
    assert new.outputs["web_url"] == "https://emu-workspace--echo-2-echo.modal.run"
    assert engine.refresh("a") == "same"
    assert apps(emulator) == {old: "stopped", new.id: "deployed"}


def test_drift_stopped_app_reads_as_gone_then_redeploys(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    engine.up("a", P, inputs())
    modal_cli(emulator, "app", "stop", "echo", "-y")
    assert engine.refresh("a") == "delete"
    assert engine.up("a", P, inputs()) == "create"
    assert engine.refresh("a") == "same"


def test_import_by_id(engine: Engine, emulator: EmulatorProcess) -> None:
    modal_cli(emulator, "deploy", APP_FILE, "--name", "echo")
    app_id = next(iter(apps(emulator)))
    st = Engine(engine.server).import_("a", P, app_id, inputs())
    assert st.id == app_id and st.outputs["version"] == 1
    assert st.outputs["web_url"] == "https://emu-workspace--echo-echo.modal.run"


def test_check_failures(srv: ProviderServer) -> None:
    raw = json.loads(spec())
    raw["gpu"] = "H9000"
    bad_gpu = {**inputs(), "spec_json": json.dumps(raw)}
    f = srv.check(P, bad_gpu).failures
    assert f and all(p == "spec_json" for p, _ in f)
    assert any("gpu" in r.lower() for _, r in f)
    f = srv.check(
        P, {**inputs(name="bad name", app_file="nope.py"), "extra_env": {"1X": "v"}}
    ).failures
    assert sorted({p for p, _ in f}) == ["app_file", "extra_env", "name"]
    assert srv.check(P, {**inputs(), "spec_json": "{not json"}).failures
    assert srv.check(P, inputs()).failures == []


def test_broken_app_fails_with_a_clear_error(engine: Engine, tmp_path: Path) -> None:
    broken = tmp_path / "broken_app.py"
    broken.write_text(
        "import modal\napp = modal.App('broken')\nraise RuntimeError('boom at import')\n"
    )
    with pytest.raises(ProviderCallError) as ei:
        engine.up("a", P, inputs(app_file=str(broken)))
    msg = ei.value.details
    assert "App 'echo' in environment 'main': create (deploy of" in msg
    assert "modal deploy" in msg
