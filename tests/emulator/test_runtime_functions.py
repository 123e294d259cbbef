"""Plain functions with real containers, through the in-process SDK: `.remote()`, `.map()`,
`.spawn()`, classes, secrets, errors, volumes, nested calls, schedules; idempotent retries.

Kept (issue 33 item 7): ModelWeights spawns its download and writes the volume the serving
container reads (components/modal/model_weights.py, serving/weights_app.py); modal 1.6.4
modal/_functions.py `_Function.remote`, `spawn`.
"""

from __future__ import annotations

import asyncio
import time

import modal
import pytest
from grpclib.client import Channel
from modal_proto import api_pb2
from modal_proto.api_grpc import ModalClientStub

from tests.emulator.helpers import modal_cli
from tests.emulator.runtime_support import FUNCS_APP, app_id, wait_for
from tests.harness.emulator import EmulatorProcess


def _deploy(emu: EmulatorProcess) -> None:
    modal.Secret.objects.create("rt-secret", {"RT_SECRET": "s3cr3t-value"})
    modal_cli(emu, "deploy", FUNCS_APP)


def test_remote_map_spawn_class_secret_and_errors(rt: EmulatorProcess) -> None:
    _deploy(rt)
    square = modal.Function.from_name("rt-funcs", "square")
    assert square.remote(7) == 49  # a cold start
    assert list(square.map(range(6))) == [0, 1, 4, 9, 16, 25]
    call = square.spawn(9)
    assert call.get(timeout=60) == 81

    who = modal.Function.from_name("rt-funcs", "whoami").remote()
    assert who["MODAL_IS_REMOTE"] == "1" and who["cwd"] == "/root"
    assert who["MODAL_TOKEN_ID"] == "<unset>"  # no credentials reach a container
    assert who["MODAL_TASK_ID"].startswith("ta-")
    assert modal.Function.from_name("rt-funcs", "secret_value").remote() == "s3cr3t-value"

    with pytest.raises(ValueError, match="bad input on purpose"):
        modal.Function.from_name("rt-funcs", "boom").remote("bad input on purpose")

    assert modal.Function.from_name("rt-funcs", "calls_other").remote(3) == 10  # 3*3 + 1
    counter = modal.Cls.from_name("rt-funcs", "Counter")
    assert counter().add.remote(5) == 105  # @enter ran before the method

    # Each function has its own container(s); the secret value never shows in the state.
    aid = app_id(rt, "rt-funcs")
    assert len({c["function_id"] for c in rt.containers() if c["app_id"] == aid}) >= 6
    assert "s3cr3t-value" not in str(rt.state())


def test_a_volume_write_is_seen_by_another_container(rt: EmulatorProcess) -> None:
    _deploy(rt)
    modal.Function.from_name("rt-funcs", "write_file").remote("f.txt", "shared!")
    assert modal.Function.from_name("rt-funcs", "read_file").remote("f.txt") == "shared!"


def test_a_schedule_fires_from_the_control_endpoint(rt: EmulatorProcess) -> None:
    _deploy(rt)
    call_id = rt.run_schedule("rt-funcs", "ticker")
    assert call_id.startswith("fc-")
    fc = modal.FunctionCall.from_id(call_id)
    assert fc.get(timeout=60) is None
    out = modal_cli(rt, "app", "logs", "rt-funcs").stdout
    assert "tick at " in out


async def _with_key(emu: EmulatorProcess, method: str, request: object, key: str) -> object:
    channel = Channel("127.0.0.1", emu.port)
    try:
        stub = ModalClientStub(channel)
        metadata = {
            "x-modal-token-id": str(emu.token_id),
            "x-modal-token-secret": str(emu.token_secret),
            "x-modal-client-type": str(api_pb2.CLIENT_TYPE_CLIENT),
            "x-idempotency-key": key,
        }
        return await getattr(stub, method)(request, metadata=metadata)
    finally:
        channel.close()


def test_a_retried_request_with_the_same_idempotency_key_runs_once(rt: EmulatorProcess) -> None:
    first = asyncio.run(
        _with_key(rt, "WebhookTokenCreate", api_pb2.WebhookTokenCreateRequest(name="t"), "k-1")
    )
    again = asyncio.run(
        _with_key(rt, "WebhookTokenCreate", api_pb2.WebhookTokenCreateRequest(name="t"), "k-1")
    )
    other = asyncio.run(
        _with_key(rt, "WebhookTokenCreate", api_pb2.WebhookTokenCreateRequest(name="t"), "k-2")
    )
    assert again == first  # the same token (and secret) answered twice
    assert other.token_id != first.token_id  # type: ignore[attr-defined]
    assert len(rt.state()["proxy_tokens"]) == 2
    # Errors are replayed too: the second try of a failing create fails the same way.
    req = api_pb2.SecretGetOrCreateRequest(
        deployment_name="s",
        object_creation_type=api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS,
        env_dict={"A": "1"},
    )
    made = asyncio.run(_with_key(rt, "SecretGetOrCreate", req, "k-3"))
    assert asyncio.run(_with_key(rt, "SecretGetOrCreate", req, "k-3")) == made
    with pytest.raises(Exception, match="already exists"):
        asyncio.run(_with_key(rt, "SecretGetOrCreate", req, "k-4"))


def test_a_crashing_function_container_fails_its_inputs(rt: EmulatorProcess) -> None:
    _deploy(rt)
    # Kill the container in the middle of an input: the call fails instead of hanging.
    slow = modal.Function.from_name("rt-funcs", "slow")
    call = slow.spawn(30)
    aid = app_id(rt, "rt-funcs")
    busy = wait_for(
        lambda: [c for c in rt.live_containers(aid) if c["in_flight"]], 30, what="a busy container"
    )
    import os
    import signal

    os.kill(int(busy[0]["pid"]), signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(Exception, match="exited unexpectedly"):
        call.get(timeout=30)
    assert time.monotonic() - started < 20
    assert slow.remote(0) == "done"  # a new container takes the next call


def test_a_redeploy_after_a_secret_update_restarts_containers(rt: EmulatorProcess) -> None:
    """Equal definitions but an updated secret: not a no-op (containers read secrets at start)."""
    _deploy(rt)
    read = modal.Function.from_name("rt-funcs", "secret_value")
    assert read.remote() == "s3cr3t-value"
    unchanged = modal_cli(rt, "deploy", FUNCS_APP).stdout
    assert "Deployment skipped: no changes detected" in unchanged
    modal_cli(rt, "secret", "create", "rt-secret", "RT_SECRET=rotated", "--force")
    redeployed = modal_cli(rt, "deploy", FUNCS_APP).stdout
    assert "Deployment skipped" not in redeployed
    assert read.remote() == "rotated"  # the first call after the deploy: the new container
