"""Issue 32, items 1-6: the emulator's environment and identity boundaries, tried from the
wrong side with the real `modal` client and CLI over real sockets.

A workspace with RBAC and two environments, `dev` and `prod`; prod holds a Secret and a
Volume. `dev-deployer` is a service user with the contributor role in dev only (what a
review stack's identity or a developer's CI token gets). Each test is one item of the issue:
the attack as the security review ran it, and what must come back instead.

Kept (issue 33 item 7): review stacks run a PR's code in CI against the emulator
(tests/ci/test_review_isolation.py); each boundary is Modal's, with its source in
docs/emulator.md's boundary table.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import modal
import pytest
from google.protobuf.empty_pb2 import Empty
from grpclib.client import Channel
from modal_proto import api_pb2
from modal_proto.api_grpc import ModalClientStub

from tests.emulator.helpers import APPS_DIR, modal_cli
from tests.emulator.runtime_support import runtime_emulator, wait_for
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for

XE_APP = str(APPS_DIR / "cross_env.py")
PROD_SECRET_VALUE = "prod-pass-0123456789"


@dataclass
class Token:
    token_id: str
    token_secret: str

    def env(self, **extra: str) -> dict[str, str]:
        return {"MODAL_TOKEN_ID": self.token_id, "MODAL_TOKEN_SECRET": self.token_secret} | extra


@dataclass
class World:
    emu: EmulatorProcess
    env_ids: dict[str, str]
    prod_secret_id: str
    prod_volume_id: str
    deployer: Token  # contributor in dev only
    viewer: Token  # viewer in dev only


@pytest.fixture(scope="module")
def xe_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    yield from runtime_emulator(tmp_path_factory.mktemp("xe"))


def _service_user(name: str, env: str, role: str) -> Token:
    ws = modal.Workspace.from_context()
    token = ws.service_users.create(name, expires_in=None)
    ws.service_users.set_role(name, env, role=role)
    return Token(token.token_id, token.token_secret)


@pytest.fixture
def world(xe_emulator: EmulatorProcess, monkeypatch: pytest.MonkeyPatch) -> World:
    emu = xe_emulator
    if not emu.alive:
        emu.start()
    emu.reset()
    wait_for(lambda: not emu.live_containers(), 20, what="containers of the last test")
    modal_env_for(emu, monkeypatch)  # the in-process SDK acts as the workspace Owner
    for env in ("dev", "prod"):
        modal.Environment.objects.create(env)
    modal.Secret.objects.create("prod-db", {"DB_PASS": PROD_SECRET_VALUE}, environment_name="prod")
    modal.Volume.objects.create("prod-vol", environment_name="prod")
    state = emu.state()
    env_ids = {e["name"]: e["id"] for e in state["environments"]}
    secret_id = next(s["id"] for s in state["secrets"] if s["name"] == "prod-db")
    volume_id = next(v["id"] for v in state["volumes"] if v["name"] == "prod-vol")
    return World(
        emu=emu,
        env_ids=env_ids,
        prod_secret_id=secret_id,
        prod_volume_id=volume_id,
        deployer=_service_user("dev-deployer", "dev", "contributor"),
        viewer=_service_user("dev-viewer", "dev", "viewer"),
    )


def _deploy_as(w: World, who: Token, **env: str) -> subprocess.CompletedProcess[str]:
    return modal_cli(w.emu, "deploy", "-e", "dev", XE_APP, extra_env=who.env(**env), check=False)


def _fn(w: World, who: Token, name: str, app: str = "xe") -> modal.Function:
    client = modal.Client.from_credentials(who.token_id, who.token_secret)
    return modal.Function.from_name(app, name, environment_name="dev", client=client)


async def _raw(emu: EmulatorProcess, who: Token, method: str, request: object, **md: str) -> object:
    channel = Channel("127.0.0.1", emu.port)
    try:
        metadata = {
            "x-modal-token-id": who.token_id,
            "x-modal-token-secret": who.token_secret,
            "x-modal-client-type": str(api_pb2.CLIENT_TYPE_CLIENT),
            **md,
        }
        return await getattr(ModalClientStub(channel), method)(request, metadata=metadata)
    finally:
        channel.close()


def raw(emu: EmulatorProcess, who: Token, method: str, request: object, **md: str) -> object:
    from modal._utils.async_utils import synchronizer

    return synchronizer.create_blocking(_raw)(emu, who, method, request, **md)


def owner(emu: EmulatorProcess) -> Token:
    return Token(str(emu.token_id), str(emu.token_secret))


# ---- item 1: another environment's Secret and Volume by object id -------------------------
def test_1_attaching_another_environments_objects_by_id_is_refused(world: World) -> None:
    w = world
    out = _deploy_as(w, w.deployer, XE_SECRET_ID=w.prod_secret_id, XE_VOLUME_ID=w.prod_volume_id)
    text = out.stdout + out.stderr
    assert out.returncode != 0, f"the deploy was accepted:\n{text}"
    assert "prod" in text and "dev-deployer" in text, text
    assert PROD_SECRET_VALUE not in text
    # Only the Volume: refused the same way.
    out = _deploy_as(w, w.deployer, XE_VOLUME_ID=w.prod_volume_id)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "volume" in (out.stdout + out.stderr).lower()
    # An id that does not exist is refused, not ignored.
    out = _deploy_as(w, w.deployer, XE_SECRET_ID="st-doesnotexist000000000")
    assert out.returncode != 0, out.stdout + out.stderr
    # The same app with dev's own Secret deploys (the container cannot be shown running it:
    # the id reaches the app file through the deploying shell's environment only).
    modal.Secret.objects.create("dev-db", {"DB_PASS": "dev-pass"}, environment_name="dev")
    dev_secret = next(s["id"] for s in w.emu.state()["secrets"] if s["name"] == "dev-db")
    out = _deploy_as(w, w.deployer, XE_SECRET_ID=dev_secret)
    assert out.returncode == 0, out.stdout + out.stderr
    # The Owner may attach another environment's Secret: Modal lets a lookup name any
    # environment the caller can read (modal.Secret.from_name(..., environment_name=...)).
    out = modal_cli(
        w.emu,
        "deploy",
        "-e",
        "dev",
        XE_APP,
        extra_env={"XE_SECRET_ID": w.prod_secret_id},
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# ---- item 2: a container acts as its deployment, never as the Owner -----------------------
def test_2_a_containers_own_client_is_not_the_workspace_owner(world: World) -> None:
    w = world
    out = _deploy_as(w, w.deployer)
    assert out.returncode == 0, out.stdout + out.stderr
    results = _fn(w, w.deployer, "escalate").remote("prod")
    assert results["create service user"].startswith("refused: "), results
    assert results["list prod secrets"].startswith("refused: "), results
    assert results["create environment"].startswith("refused: "), results
    # Its own environment stays usable: what a deployment may do, its container may do.
    assert results["own environment's secrets"].startswith("ALLOWED"), results
    names = [s.name for s in modal.Workspace.from_context().service_users.list()]
    assert "xe-evil" not in names
    assert "xe-env" not in {e["name"] for e in w.emu.state()["environments"]}


# ---- item 3: deleted, retired and unknown service-user tokens -----------------------------
def test_3_deleted_and_restarted_tokens_are_never_the_owner(tmp_path: Path) -> None:
    """An emulator in any-token mode (as `make up` ran it), with a state file, killed -9."""
    emu = EmulatorProcess(state_path=tmp_path / "state.sqlite3", token_id=None, runtime=False)
    emu.start()
    try:
        anyone = Token("ak-anyone", "as-anyone")  # any-token mode: taken as the Owner
        raw(emu, anyone, "EnvironmentCreate", api_pb2.EnvironmentCreateRequest(name="dev"))
        made = raw(emu, anyone, "ServiceUserCreate", api_pb2.ServiceUserCreateRequest(name="su1"))
        live = Token(made.token_id, made.token_secret)  # type: ignore[attr-defined]
        made = raw(emu, anyone, "ServiceUserCreate", api_pb2.ServiceUserCreateRequest(name="su2"))
        gone = Token(made.token_id, made.token_secret)  # type: ignore[attr-defined]
        raw(
            emu,
            anyone,
            "ServiceUserDelete",
            api_pb2.ServiceUserDeleteRequest(service_user_name="su2"),
        )

        def owner_only(who: Token) -> None:
            raw(emu, who, "ServiceUserCreate", api_pb2.ServiceUserCreateRequest(name="x-evil"))

        from grpclib import GRPCError, Status

        with pytest.raises(GRPCError) as err:  # the deleted (retired) token
            owner_only(gone)
        assert err.value.status == Status.UNAUTHENTICATED, err.value
        assert "su2" in str(err.value.message) and gone.token_secret not in str(err.value.message)
        with pytest.raises(GRPCError) as err:  # a live one is the service user, not the Owner
            owner_only(live)
        assert err.value.status == Status.PERMISSION_DENIED, err.value

        emu.kill()  # kill -9
        emu.start()
        with pytest.raises(GRPCError) as err:
            owner_only(live)
        assert err.value.status == Status.PERMISSION_DENIED, err.value  # still su1 after restart
        with pytest.raises(GRPCError) as err:
            owner_only(gone)
        assert err.value.status == Status.UNAUTHENTICATED, err.value
        # The service user survived the restart, and nothing was made with its token.
        listed = raw(emu, anyone, "ServiceUserList", Empty())
        assert [s.name for s in listed.service_users] == ["su1"]  # type: ignore[attr-defined]
        # A state reset forgets su1; its token, minted here, is refused, not promoted.
        emu.reset()
        with pytest.raises(GRPCError) as err:
            owner_only(live)
        assert err.value.status == Status.UNAUTHENTICATED, err.value
        assert "no longer knows" in str(err.value.message)
        mode = stat.S_IMODE(os.stat(tmp_path / "state.sqlite3").st_mode)
        assert mode == 0o600, oct(mode)  # item 6: the state file is the owner's alone
    finally:
        emu.close()


# ---- item 4: logs of another environment through a function call id ----------------------
def test_4_logs_by_function_call_id_show_only_that_calls_environment(world: World) -> None:
    w = world
    # The Owner runs the same app in prod; its line must stay in prod.
    out = modal_cli(w.emu, "deploy", "-e", "prod", XE_APP, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    prod_shout = modal.Function.from_name("xe", "shout", environment_name="prod")
    assert prod_shout.remote("PROD-ONLY-LINE") == "PROD-ONLY-LINE"
    wait_for(
        lambda: (
            "PROD-ONLY-LINE"
            in modal_cli(w.emu, "app", "logs", "-e", "prod", "xe", check=False, timeout=30).stdout
        ),
        30,
        what="the prod log line",
    )
    out = _deploy_as(w, w.deployer)
    assert out.returncode == 0, out.stdout + out.stderr
    call = _fn(w, w.deployer, "shout").spawn("DEV-LINE")
    assert call.get(timeout=60) == "DEV-LINE"

    async def read_logs() -> list[str]:
        channel = Channel("127.0.0.1", w.emu.port)
        lines: list[str] = []
        try:
            stub = ModalClientStub(channel)
            req = api_pb2.AppGetLogsRequest(function_call_id=call.object_id, timeout=3)
            md = {
                "x-modal-token-id": w.deployer.token_id,
                "x-modal-token-secret": w.deployer.token_secret,
            }
            async with stub.AppGetLogs.open(metadata=md) as stream:
                await stream.send_message(req, end=True)
                async for batch in stream:
                    lines += [item.data for item in batch.items]
        finally:
            channel.close()
        return lines

    from modal._utils.async_utils import synchronizer

    lines = wait_for(lambda: synchronizer.create_blocking(read_logs)(), 20, what="dev logs")
    text = "".join(lines)
    assert "PROD-ONLY-LINE" not in text, text
    assert "DEV-LINE" in text, text


# ---- item 5: idempotent answers are the caller's own ---------------------------------------
def test_5_an_idempotency_key_never_replays_another_callers_answer(world: World) -> None:
    w = world
    key = "shared-idempotency-key-1"
    prod = raw(
        w.emu,
        owner(w.emu),
        "SecretList",
        api_pb2.SecretListRequest(environment_name="prod"),
        **{"x-idempotency-key": key},
    )
    assert [i.label for i in prod.items] == ["prod-db"]  # type: ignore[attr-defined]
    dev = raw(
        w.emu,
        w.viewer,
        "SecretList",
        api_pb2.SecretListRequest(environment_name="dev"),
        **{"x-idempotency-key": key},
    )
    assert [i.label for i in dev.items] == []  # type: ignore[attr-defined]
    # The same caller retrying with its key still gets its first answer (the cache's purpose).
    modal.Secret.objects.create("dev-new", {"A": "b"}, environment_name="dev")
    again = raw(
        w.emu,
        w.viewer,
        "SecretList",
        api_pb2.SecretListRequest(environment_name="dev"),
        **{"x-idempotency-key": key},
    )
    assert [i.label for i in again.items] == []  # type: ignore[attr-defined]


# ---- item 6: the state file and the emulator's files are out of a container's reach -------
def test_6_a_container_cannot_read_the_state_file_or_other_containers_files(
    world: World,
) -> None:
    w = world
    assert w.emu.state_path is not None
    state_file = w.emu.state_path.resolve()
    mode = stat.S_IMODE(os.stat(state_file).st_mode)
    assert mode == 0o600, oct(mode)
    out = _deploy_as(w, w.deployer)
    assert out.returncode == 0, out.stdout + out.stderr
    # Another container runs at the same time: its socket (its identity) must not be
    # visible from the next one, nor the prod volume's files.
    assert _fn(w, w.deployer, "shout").remote("first") == "first"
    data_dir = state_file.with_name(state_file.name + ".d")
    containers = w.emu.containers()
    paths = [str(state_file), str(state_file) + "-wal", str(data_dir), str(data_dir / "volumes")]
    paths += sorted({str(Path(c["workdir"]).parent) for c in containers if c.get("workdir")})
    seen = _fn(w, w.deployer, "peek").remote(paths)
    if not any(c.get("mountns") for c in w.emu.containers()):
        pytest.skip("containers run without a mount namespace here (not root / no unshare)")
    others = {c["task_id"] for c in containers}  # all started before `peek`'s container
    assert others
    for path, what in seen.items():
        assert "SQLite" not in what, f"{path}: {what}"
        assert w.prod_volume_id not in what, f"{path}: {what}"
        assert not any(task in what for task in others), f"{path}: {what}"
    assert seen[str(state_file)] == "read 0 bytes", seen
