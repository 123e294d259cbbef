"""ModelWeights: the real weights function run on the emulator's runtime, from a local fake
Hugging Face hub (tests/providers/fake_hub.py, the `huggingface_hub` 2.4.0 client unchanged)
and a local S3 server (moto's server mode, the boto3 client unchanged).

The emulator runs with `--container-network host` here: a container in its own network
namespace reaches nothing of this machine (docs/emulator.md), and the fake hub and moto
listen on this machine's loopback, as a hub mirror or a private store would be reachable from
a Modal container. Volumes then appear at their mount path through a symlink (`/weights`),
which this module removes around each test (only a symlink: a real `/weights` skips): the
emulator keeps an existing link, so a link to the last test's volume would be used instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.modal._base import ModalProviderError
from components.modal.environment import EnvironmentProvider
from components.modal.model_weights import (
    PROVISION_TIMEOUT_S,
    TIMEOUT_ENV,
    ModelWeightsProvider,
    provision_timeout_s,
)
from components.modal.secret import SecretProvider
from components.modal.volume import VolumeProvider
from serving import render
from serving.spec import ServingSpec
from serving.weights import WEIGHTS_MOUNT, manifest_of
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer
from tests.providers.fake_hub import FakeHub
from tests.providers.helpers import rpc_delta, server_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

P = ModelWeightsProvider()
HF_TOKEN = "hf_fake_gated_token_0123456789"
S3_SECRET = "moto-secret-key-abcdef123456"
REPO = "acme/tiny-closed"
REV1, REV2 = "1" * 40, "2" * 40
FILES1 = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 40,  # 10,240 bytes
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}
FILES2 = {**FILES1, "model.safetensors": bytes(range(255, -1, -1)) * 48}  # 12,288 bytes


def _drop_weights_link() -> None:
    link = Path(WEIGHTS_MOUNT)
    if link.is_symlink():
        link.unlink()


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    # `/weights` is one path for the whole machine: a second run of this module at the same
    # time (pytest -n without --dist loadfile splits a module) would swap the link under this
    # one's containers. One module at a time holds it.
    with open(Path(tempfile.gettempdir()) / "modal-llm-tests-weights.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if Path(WEIGHTS_MOUNT).exists() and not Path(WEIGHTS_MOUNT).is_symlink():
            pytest.skip(
                f"{WEIGHTS_MOUNT} exists on this machine: host-network volumes need it free"
            )
        _drop_weights_link()
        state = tmp_path_factory.mktemp("weights-emu") / "state.sqlite3"
        proc = EmulatorProcess(state_path=state, container_network="host").start()
        try:
            yield proc
        finally:
            proc.close()
            _drop_weights_link()


@pytest.fixture(scope="module")
def server(emu: EmulatorProcess) -> Iterator[ProviderServer]:
    srv = ProviderServer(env=server_env(emu)).start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def engine(emu: EmulatorProcess, server: ProviderServer) -> Iterator[Engine]:
    emu.reset()
    # The reset made new volumes: a link left from the last test would point at the old one.
    _drop_weights_link()
    yield Engine(server)
    _drop_weights_link()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    fake = FakeHub(token=HF_TOKEN)
    fake.add(REPO, REV1, FILES1)
    fake.add(REPO, REV2, FILES2)
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    import boto3
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    url = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="AKIAWEIGHTSTEST",
        aws_secret_access_key=S3_SECRET,
    )
    client.create_bucket(Bucket="closed-models")
    for path, data in FILES1.items():
        client.put_object(Bucket="closed-models", Key=f"acme/tiny/v3/{path}", Body=data)
    try:
        yield url
    finally:
        srv.stop()


def expected(files: dict[str, bytes], tmp: Path) -> dict[str, Any]:
    """The manifest of `files` laid out locally (serving/weights.py's own digest rule)."""
    for path, data in files.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_bytes(data)
    return manifest_of(tmp)


def setup_storage(engine: Engine, secrets: dict[str, dict[str, str]]) -> None:
    """The weights volume and the secrets, through their own resources."""
    engine.up("vol", VolumeProvider(), {"name": "tiny-weights", "environment": "main"})
    for name, values in secrets.items():
        engine.up(
            f"secret-{name}",
            SecretProvider(),
            {"name": name, "environment": "main", "values": values},
        )


def hf_inputs(hub: FakeHub, revision: str = REV1, **kw: Any) -> dict[str, Any]:
    return {
        "app_name": "tiny-weights",
        "environment": "main",
        "volume": "tiny-weights",
        "source": {"kind": "hf", "repo": REPO, "revision": revision, "endpoint": hub.url},
        "secrets": ["huggingface-token"],
        **kw,
    }


def volume_dir(emu: EmulatorProcess) -> Path:
    assert emu.state_path is not None
    vol = next(v for v in emu.state()["volumes"] if v["name"] == "tiny-weights")
    return Path(f"{emu.state_path}.d") / "volumes" / vol["id"]


def test_hf_lifecycle_provisions_noop_touches_nothing_revision_reprovisions(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub, server: ProviderServer, tmp_path: Path
) -> None:
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    assert engine.up("w", P, hf_inputs(hub)) == "create"
    out = engine.states["w"].outputs
    want = expected(FILES1, tmp_path / "r1")
    total1 = sum(map(len, FILES1.values()))
    assert out["revision"] == REV1 and out["path"] == REV1
    assert (out["file_count"], out["bytes"], out["digest"]) == (3, total1, want["digest"])
    assert out["downloaded_bytes"] == total1 == hub.bytes_served
    files = volume_dir(emu) / REV1
    assert (files / "model.safetensors").read_bytes() == FILES1["model.safetensors"]
    assert (files / "tokenizer/tokenizer.json").read_bytes() == FILES1["tokenizer/tokenizer.json"]
    assert out["app_id"].startswith("ap-")
    # Progress reached Pulumi's log as it came (pulumi.log.info: the provider's stderr here).
    assert "ModelWeights 'tiny-weights': [2/3] model.safetensors" in server.logs()

    before = emu.rpc_counts()
    assert engine.preview("w", P, hf_inputs(hub)) == "same"
    assert engine.up("w", P, hf_inputs(hub)) == "same"
    assert rpc_delta(before, emu.rpc_counts()) == {}  # a no-op up makes no call at all
    assert hub.bytes_served == total1

    assert engine.preview("w", P, hf_inputs(hub, REV2)) == "update"
    assert engine.up("w", P, hf_inputs(hub, REV2)) == "update"
    out = engine.states["w"].outputs
    want2 = expected(FILES2, tmp_path / "r2")
    assert (out["path"], out["digest"]) == (REV2, want2["digest"]) and want2 != want
    assert hub.bytes_served == total1 + out["bytes"]
    assert engine.refresh("w") == "same"

    engine.destroy("w")
    apps = {a["name"]: a["state"] for a in emu.state()["apps"]}
    assert apps == {"tiny-weights": "stopped"}
    assert (volume_dir(emu) / REV2 / "config.json").is_file()  # the volume keeps its files


def test_cold_start_after_provisioning_downloads_zero_bytes(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    """A container that loads the model as the spec renders it: from the hub without
    weights (the baseline, counted by the same hub), from the volume with them."""
    hub_access = {"HF_TOKEN": HF_TOKEN, "HF_ENDPOINT": hub.url}
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}, "hub-access": hub_access})
    engine.up("w", P, hf_inputs(hub))
    provisioned = hub.bytes_served
    env = emu.subprocess_env()
    subprocess.run(
        [sys.executable, "-m", "modal", "deploy", "tests/providers/apps/weights_consumer.py"],
        env=env,
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )
    base = {"engine": "vllm", "model": REPO, "revision": REV1, "served_model_name": "tiny"}
    with_weights = {**base, "weights": {"volume": "tiny-weights", "path": REV1}}
    loads = {}
    for label, spec in (("hub", base), ("volume", with_weights)):
        before = hub.bytes_served
        call = (
            "import json, modal, sys; f = modal.Function.from_name('weights-consumer', 'load');"
            " print(json.dumps(f.remote(sys.argv[1])))"
        )
        spec_json = ServingSpec.model_validate(spec).to_json()
        proc = subprocess.run(
            [sys.executable, "-c", call, spec_json],
            env=env,
            cwd=PROJECT_ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        loads[label] = {**json.loads(proc.stdout.strip().splitlines()[-1])}
        loads[label]["hub_bytes"] = hub.bytes_served - before
    total = sum(map(len, FILES1.values()))
    assert provisioned == total
    assert loads["hub"]["from_volume"] is False and loads["hub"]["hub_bytes"] == total
    assert loads["volume"]["from_volume"] is True and loads["volume"]["hub_bytes"] == 0
    assert loads["volume"]["model"] == f"{WEIGHTS_MOUNT}/{REV1}"
    assert loads["volume"]["bytes_read"] == total and loads["volume"]["files"] == 3
    print(f"\ncold start: {json.dumps(loads)}")


def test_s3_source_with_credentials_from_a_modal_secret(
    engine: Engine, emu: EmulatorProcess, s3: str, tmp_path: Path
) -> None:
    creds = {"AWS_ACCESS_KEY_ID": "AKIAWEIGHTSTEST", "AWS_SECRET_ACCESS_KEY": S3_SECRET}
    setup_storage(engine, {"weights-store": creds})
    source = {
        "kind": "s3",
        "bucket": "closed-models",
        "prefix": "acme/tiny/v3/",
        "revision": "v3",
        "endpoint_url": s3,
        "region": "us-east-1",
    }
    inputs = {
        "app_name": "tiny-weights",
        "environment": "main",
        "volume": "tiny-weights",
        "source": source,
        "secrets": ["weights-store"],
    }
    assert engine.up("w", P, inputs) == "create"
    out = engine.states["w"].outputs
    assert (out["path"], out["file_count"]) == ("v3", 3)
    assert out["digest"] == expected(FILES1, tmp_path)["digest"]  # same files, same digest
    assert (volume_dir(emu) / "v3/tokenizer/tokenizer.json").is_file()

    bad = {**inputs, "source": {**source, "prefix": "acme/missing/", "revision": "v4"}}
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, bad)
    msg = ei.value.details
    assert "ModelWeights s3://closed-models/acme/missing/ (revision v4)" in msg
    assert "update failed: the weights function failed with" in msg
    assert "no objects under that prefix" in msg and "Modal is unreachable" not in msg
    assert S3_SECRET not in msg and S3_SECRET not in json.dumps(engine.states["w"].outputs)
    assert engine.states["w"].outputs["path"] == "v3"  # the failed update recorded nothing


def test_hub_refusal_fails_with_the_function_log_tail_and_no_token(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": "hf_wrong_token_000000000"}})
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub))
    msg = ei.value.details
    assert f"ModelWeights hf://{REPO}@{REV1} into volume 'tiny-weights'" in msg
    assert "create failed: the weights function failed with HfHubHTTPError" in msg
    assert "401" in msg and "Last lines of the function's log:" in msg
    assert "Modal is unreachable" not in msg
    assert HF_TOKEN not in msg and "hf_wrong_token" not in msg
    assert "w" not in engine.states
    assert not any(p.name.startswith(".incoming") for p in volume_dir(emu).iterdir())


def test_check_rejects_bad_sources(server: ProviderServer) -> None:
    bad = {"app_name": "x", "environment": "main", "volume": "v", "source": {"kind": "gcs"}}
    failures = server.check(P, bad).failures
    assert [prop for prop, _ in failures] == ["source"]
    assert os.path.isfile(PROJECT_ROOT / "serving/weights_app.py")


# ---- the program's wiring, under mocks ---------------------------------------------------------


def test_program_provisions_before_the_app_and_points_the_spec_at_the_volume() -> None:
    from pulumi_standin.values import Secret
    from tests.program.runner import run_program, stack_config

    services = yaml_services(
        {"kind": "s3", "bucket": "closed-models", "prefix": "acme/tiny/v3/", "revision": "v3"}
    )
    creds = json.dumps({"AWS_ACCESS_KEY_ID": "AKIAPROGRAM", "AWS_SECRET_ACCESS_KEY": S3_SECRET})
    config, keys = stack_config(
        "local",
        {
            "modal-llm:services": services,
            "modal-llm:weightsStoreCredentials": Secret(creds),
        },
    )
    run = run_program("local", config, keys)
    (weights,) = run.of_type("modal:ModelWeights")
    (volume,) = [v for v in run.of_type("modal:Volume") if v.inputs["name"] == "tiny-weights"]
    (store,) = [
        s for s in run.of_type("modal:Secret") if s.inputs["name"] == "weights-store-credentials"
    ]
    (app,) = run.of_type("modal:App")
    assert weights.inputs["source"]["revision"] == "v3"
    assert weights.inputs["secrets"] == ["weights-store-credentials"]
    assert {volume.urn, store.urn} <= set(weights.dependencies)
    assert weights.urn in app.dependencies  # provisioned first, then deployed
    spec = ServingSpec.from_json(app.inputs["spec_json"])
    assert spec.weights is not None and (spec.weights.volume, spec.weights.path) == (
        "tiny-weights",
        "v3",
    )
    assert render.engine_command(spec)[2] == f"{WEIGHTS_MOUNT}/v3"
    assert render.volume_mounts(spec)[WEIGHTS_MOUNT] == "tiny-weights"
    assert S3_SECRET not in json.dumps(weights.inputs) + app.inputs["spec_json"]


def yaml_services(weights: dict[str, Any]) -> list[dict[str, Any]]:
    import yaml

    raw = yaml.safe_load((PROJECT_ROOT / "Pulumi.local.yaml").read_text())
    services = raw["config"]["modal-llm:services"]
    return [{**services[0], "weights": weights}]


# ---- a failed provisioning is undone (issue 21 item 9) -----------------------------------------
#
# Every failure after the weights app was deployed ends with the app stopped again, checked
# with the real modal client (`modal app list --json`, as an operator would), not the
# provider's word: the function failing (create and update), a lost deploy answer, the
# deadline, the runner dying; and a clean-up that itself fails names the command that ends it.

MISSING = "3" * 40  # a revision the hub does not have


def deployed_apps(emu: EmulatorProcess, env: str) -> set[str]:
    """Names of the apps `modal app list --json -e ENV` shows as not stopped (keys: the
    columns in snake case, modal 1.6.4 cli/utils.py `display_table`; states: cli/app.py
    `APP_STATE_TO_MESSAGE`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "modal", "app", "list", "--json", "-e", env],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    return {r["description"] for r in rows if r["state"] not in ("stopped", "stopping...")}


def modal_cli(emu: EmulatorProcess, command: str) -> subprocess.CompletedProcess[str]:
    """Run a `modal ...` command line (as printed in an error) against the emulator."""
    args = shlex.split(command)
    assert args[0] == "modal", command
    return subprocess.run(
        [sys.executable, "-m", *args],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_no_containers(emu: EmulatorProcess, app_id: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while emu.live_containers(app_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert emu.live_containers(app_id) == [], f"containers of {app_id} left running"


def _arm(emu: EmulatorProcess, rpc: str, when: str, count: int) -> None:
    emu._request(
        "POST",
        "/_emulator/faults",
        {"method": rpc, "when": when, "status": "UNAVAILABLE", "count": count},
    )


@pytest.fixture
def stalled_hub(hub: FakeHub) -> Iterator[FakeHub]:
    """The fake hub, answering its file listing but holding every file download until the
    test ends: a source that never finishes (a huge model over a slow link)."""
    release = threading.Event()
    handle = hub._handle

    def stalled(h: Any, head: bool) -> None:
        if "/resolve/" in h.path:
            release.wait(120)
        handle(h, head)

    hub._handle = stalled  # type: ignore[method-assign]
    try:
        yield hub
    finally:
        release.set()


def runner_pids(app_name: str) -> list[int]:
    """Pids of the ModelWeights runners provisioning `app_name` (this machine's /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"components.modal.model_weights" in argv and app_name.encode() in argv:
            pids.append(int(entry.name))
    return pids


def test_failed_create_stops_its_weights_app_and_the_environment_can_be_destroyed(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    """The issue's case: before, the app stayed deployed and the environment's delete was
    refused ("still holds apps deployed: tiny-weights")."""
    engine.up("env", EnvironmentProvider(), {"name": "wt"})
    engine.up("vol", VolumeProvider(), {"name": "tiny-weights", "environment": "wt"})
    engine.up(
        "secret",
        SecretProvider(),
        {"name": "huggingface-token", "environment": "wt", "values": {"HF_TOKEN": HF_TOKEN}},
    )
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub, MISSING, environment="wt"))
    msg = ei.value.details
    assert f"ModelWeights hf://{REPO}@{MISSING} into volume 'tiny-weights'" in msg
    assert "create failed: the weights function failed with" in msg and "404" in msg
    undone = r"Clean-up: The weights app 'tiny-weights' \(ap-\w+\) this run deployed was stopped"
    assert re.search(undone + r" again\.", msg), msg
    logs = re.search(r"`(modal app logs ap-\w+)`", msg)  # by id: a stopped app has no name
    assert logs is not None, msg
    shown = modal_cli(emu, logs.group(1))  # the hint, as printed, shows the whole log
    assert shown.returncode == 0 and "Revision Not Found" in shown.stdout, shown.stderr[-2000:]
    assert HF_TOKEN not in msg and (emu.token_secret or "-") not in msg
    assert "w" not in engine.states
    assert deployed_apps(emu, "wt") == set()
    (app,) = [a for a in emu.state()["apps"] if a["name"] == "tiny-weights"]
    wait_no_containers(emu, app["id"])
    for name in ("secret", "vol", "env"):  # the rest of the stack goes: nothing refused
        engine.destroy(name)
    assert "wt" not in {e["name"] for e in emu.state()["environments"]}


def test_failed_update_stops_the_app_of_the_last_run_yet_refresh_and_destroy_work(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    """After a failed update no weights app stays deployed (a one-shot app: nothing needs it
    between runs); the state keeps the last good run, which still reads, the next `up`
    deploys the app again, and a delete after a failed update finds nothing to stop."""
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    engine.up("w", P, hf_inputs(hub))
    before = dict(engine.states["w"].outputs)
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub, MISSING))
    msg = ei.value.details
    assert "update failed: the weights function failed with" in msg
    assert "Clean-up: The weights app 'tiny-weights' (ap-" in msg and "stopped again" in msg
    assert deployed_apps(emu, "main") == set()
    assert engine.states["w"].outputs == before  # the last good run, still on the volume
    assert (volume_dir(emu) / REV1 / "config.json").is_file()
    assert engine.refresh("w") == "same"
    assert engine.up("w", P, hf_inputs(hub, REV2)) == "update"  # the fixed source
    assert engine.states["w"].outputs["path"] == REV2
    assert [a["name"] for a in emu.state()["apps"] if a["state"] == "deployed"] == ["tiny-weights"]
    with pytest.raises(ProviderCallError):
        engine.up("w", P, hf_inputs(hub, MISSING))
    engine.destroy("w")
    assert "w" not in engine.states and deployed_apps(emu, "main") == set()


def test_failed_update_under_a_new_app_name_stops_both_apps(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    engine.up("w", P, hf_inputs(hub))
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub, MISSING, app_name="tiny-weights-2"))
    msg = ei.value.details
    assert re.search(
        r"Clean-up: The weights app 'tiny-weights-2' \(ap-\w+\) this run deployed was stopped"
        r" again\. The weights app 'tiny-weights' \(ap-\w+\) of the last successful run was"
        r" stopped \(a one-shot app\)\.",
        msg,
    ), msg
    assert deployed_apps(emu, "main") == set()
    assert engine.states["w"].outputs["app_name"] == "tiny-weights"
    engine.destroy("w")  # finds nothing to stop


def test_lost_deploy_answer_is_undone(engine: Engine, emu: EmulatorProcess, hub: FakeHub) -> None:
    """Modal deployed the app but the answer never came back: the runner failed without an
    app id, and the app is found by name and stopped."""
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    _arm(emu, "AppPublish", "after", 1000)
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub))
    emu._request("POST", "/_emulator/faults", {"clear": True})
    msg = ei.value.details
    assert f"create failed: Modal at {emu.url} answered" in msg
    assert "Clean-up: The weights app 'tiny-weights' (ap-" in msg
    assert [a["state"] for a in emu.state()["apps"] if a["name"] == "tiny-weights"] == [
        "stopped"
    ]  # it was deployed (the fault came after AppPublish ran), and is stopped again
    assert deployed_apps(emu, "main") == set() and "w" not in engine.states


def test_deadline_kills_the_runner_cancels_the_call_and_stops_the_app(
    emu: EmulatorProcess, stalled_hub: FakeHub
) -> None:
    deadline = 6.0
    env = server_env(emu, **{TIMEOUT_ENV: f"{deadline:g}"})  # a server of its own: the env
    emu.reset()
    _drop_weights_link()  # as the `engine` fixture does
    try:
        with ProviderServer(env=env) as srv:
            engine = Engine(srv)
            setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
            started = time.monotonic()
            with pytest.raises(ProviderCallError) as ei:
                engine.up("w", P, hf_inputs(stalled_hub))
            took = time.monotonic() - started
            logs = srv.logs()
    finally:
        _drop_weights_link()
    msg = ei.value.details
    for secret in (HF_TOKEN, emu.token_secret or "-"):
        assert secret not in msg and secret not in logs
    assert deadline <= took < deadline + 6, took
    assert f"it did not finish within its deadline of {deadline:g}s ({TIMEOUT_ENV}" in msg
    assert f"set {TIMEOUT_ENV} (seconds)" in msg and "rerun `pulumi up`" in msg
    undone = (
        r"Clean-up: The function call fc-\w+ was cancelled\. The weights app 'tiny-weights'"
        r" \(ap-\w+\) this run deployed was stopped again\."
    )
    assert re.search(undone, msg), msg
    # Progress kept flowing while the provider waited, and is the error's log tail.
    listing = f"hf://{REPO}@{REV1}: 3 files, 10297 bytes to download"
    assert f"ModelWeights 'tiny-weights': {listing}" in logs
    assert f"  | {listing}" in msg
    assert emu.rpc_counts().get("FunctionCallCancel") == 1
    assert deployed_apps(emu, "main") == set() and runner_pids("tiny-weights") == []
    (app,) = [a for a in emu.state()["apps"] if a["name"] == "tiny-weights"]
    wait_no_containers(emu, app["id"])


def test_runner_killed_mid_call_is_undone(
    engine: Engine, emu: EmulatorProcess, server: ProviderServer, stalled_hub: FakeHub
) -> None:
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    name = f"crash-weights-{os.getpid()}"
    errors: list[str] = []

    def up() -> None:
        try:
            engine.up("w", P, hf_inputs(stalled_hub, app_name=name))
        except ProviderCallError as e:
            errors.append(e.details)

    worker = threading.Thread(target=up)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        listing = f"ModelWeights '{name}': hf://{REPO}@{REV1}: 3 files, 10297 bytes to download"
        while listing not in server.logs() and time.monotonic() < deadline:
            time.sleep(0.2)  # the call runs (the module's server logs every test: by app name)
        (pid,) = runner_pids(name)
        os.kill(pid, signal.SIGKILL)  # the runner this test's `up` started, by its pid
    finally:
        for left in runner_pids(name):  # a failed step above: never leave it to the next test
            os.kill(left, signal.SIGKILL)
        worker.join(60)
    (msg,) = errors
    assert "its runner (`python -m components.modal.model_weights`) exited with -9" in msg
    assert HF_TOKEN not in msg and (emu.token_secret or "-") not in msg
    assert re.search(r"The function call fc-\w+ was cancelled", msg), msg
    assert f"The weights app '{name}' (ap-" in msg and "stopped again" in msg
    assert deployed_apps(emu, "main") == set()


def test_failed_cleanup_names_the_modal_app_stop_command_that_finishes_it(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    _arm(emu, "AppStop", "before", 1000)  # Modal keeps failing the clean-up's stop
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub, MISSING))
    emu._request("POST", "/_emulator/faults", {"clear": True})
    msg = ei.value.details
    assert "create failed: the weights function failed with" in msg  # the cause comes first
    assert "Clean-up FAILED: Stopping the weights app 'tiny-weights' this run deployed" in msg
    assert f"failed: Modal at {emu.url} answered" in msg and "before AppStop" in msg
    command = re.search(r"`(modal app stop [^`]+)`", msg)
    assert command is not None, msg
    assert command.group(1) == "modal app stop tiny-weights -e main --yes"
    assert HF_TOKEN not in msg and (emu.token_secret or "-") not in msg
    assert deployed_apps(emu, "main") == {"tiny-weights"}  # it did fail
    done = modal_cli(emu, command.group(1))  # the command, exactly as printed, finishes it
    assert done.returncode == 0, done.stderr[-2000:]
    assert deployed_apps(emu, "main") == set()


def test_a_lost_stop_answer_in_the_cleanup_is_ridden_out(
    engine: Engine, emu: EmulatorProcess, hub: FakeHub
) -> None:
    setup_storage(engine, {"huggingface-token": {"HF_TOKEN": HF_TOKEN}})
    _arm(emu, "AppStop", "after", 1)  # the stop applied, its answer lost once
    with pytest.raises(ProviderCallError) as ei:
        engine.up("w", P, hf_inputs(hub, MISSING))
    msg = ei.value.details
    assert "Clean-up FAILED" not in msg and "modal app stop" not in msg
    assert deployed_apps(emu, "main") == set()


def test_provision_timeout_must_be_a_positive_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert provision_timeout_s() == PROVISION_TIMEOUT_S == 5 * 3600
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert provision_timeout_s() == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ModalProviderError, match=f"{TIMEOUT_ENV}='{bad}' is not a positive"):
            provision_timeout_s()
