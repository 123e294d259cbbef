"""What ends up in the `__provider` blob, and how the Resource classes register.

The blob is made by the SDK's own `serialize_provider` (dill, by reference for importable
classes). It must stay tiny and hold no client, channel, credential or configuration, also
after the provider was configured and used in this process.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import dill
import pulumi
import pytest
from pulumi.dynamic import Config, ConfigureRequest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc

from components.modal import (
    App,
    AppArgs,
    AppProvider,
    Environment,
    EnvironmentArgs,
    EnvironmentProvider,
    ProxyAuthToken,
    ProxyAuthTokenArgs,
    ProxyAuthTokenProvider,
    Secret,
    SecretArgs,
    SecretProvider,
    SpendAlert,
    SpendAlertArgs,
    SpendAlertProvider,
    Volume,
    VolumeArgs,
    VolumeProvider,
)
from components.modal._base import ModalProvider
from tests.harness.emulator import EmulatorProcess

PROVIDERS = [
    AppProvider,
    EnvironmentProvider,
    ProxyAuthTokenProvider,
    SecretProvider,
    SpendAlertProvider,
    VolumeProvider,
]


@pytest.mark.parametrize("cls", PROVIDERS, ids=lambda c: c.__name__)
def test_blob_is_a_small_reference_without_state(cls: type[ModalProvider]) -> None:
    p = cls()
    blob = serialize_provider(p)
    raw = base64.b64decode(blob)
    assert len(raw) < 200, len(raw)
    assert cls.__module__.encode() in raw and cls.__name__.encode() in raw
    assert type(dill.loads(raw)) is cls
    # Configured with secret credentials (what the provider server does): still nothing inside.
    cfg = {"modal:tokenId": "ak-cfg-id", "modal:tokenSecret": "as-cfg-secret-xyz"}
    p.configure(ConfigureRequest(Config(cfg, "modal-llm-iac")))
    assert p.credentials().token_secret == "as-cfg-secret-xyz"
    assert "as-cfg-secret-xyz" not in repr(p.credentials())
    assert serialize_provider(p) == blob


def test_blob_unchanged_after_real_calls(modal_env: EmulatorProcess) -> None:
    p = SecretProvider()
    blob = serialize_provider(p)
    created = p.create({"name": "s", "environment": "main", "values": {"K": "v"}})
    assert created.id.startswith("st-")
    p.read(created.id, {"name": "s", "environment": "main", "values": {"K": "v"}})
    raw = base64.b64decode(serialize_provider(p))
    assert serialize_provider(p) == blob
    assert modal_env.token_secret
    for needle in (b"grpc", b"_Client", b"Channel", modal_env.token_secret.encode()):
        assert needle not in raw


class _Recorder(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[Any] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        return f"{args.name}-id", dict(args.inputs)

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


def test_resources_register_with_their_type_tokens() -> None:
    # pulumi.runtime.test needs a current event loop; a test that ran asyncio.run() before
    # (e.g. tests/emulator/test_dispatch.py) leaves none in the main thread.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    rec = _Recorder()
    pulumi.runtime.set_mocks(rec, project="modal-llm-iac", stack="test", preview=False)

    @pulumi.runtime.test
    def program() -> pulumi.Output[Any]:
        made: list[pulumi.Resource] = [
            Environment("env", EnvironmentArgs(name="dev")),
            Secret("sec", SecretArgs(name="k", values={"A": "x"}, environment="dev")),
            Volume("vol", VolumeArgs(name="v", environment="dev")),
            ProxyAuthToken("tok", ProxyAuthTokenArgs(name="gw", environments=["dev"])),
            SpendAlert("bud", SpendAlertArgs(environment="dev", monthly_budget_usd=10)),
            App(
                "app",
                AppArgs(name="a", environment="dev", app_file="x.py", spec_json="{}"),
            ),
        ]
        return pulumi.Output.all(*[r.urn for r in made])

    program()
    by_name = {r.name: r for r in rec.resources}
    assert {n: r.typ for n, r in by_name.items()} == {
        "env": "pulumi-python:dynamic/modal:Environment",
        "sec": "pulumi-python:dynamic/modal:Secret",
        "vol": "pulumi-python:dynamic/modal:Volume",
        "tok": "pulumi-python:dynamic/modal:ProxyAuthToken",
        "bud": "pulumi-python:dynamic/modal:SpendAlert",
        "app": "pulumi-python:dynamic/modal:App",
    }
    for r in rec.resources:
        assert "__provider" in r.inputs
    values = by_name["sec"].inputs["values"]
    assert rpc.is_rpc_secret(values) and rpc.unwrap_rpc_secret(values) == {"A": "x"}
    assert rpc.is_rpc_secret(by_name["sec"].inputs["__provider"])
    assert by_name["bud"].inputs["thresholds"] == [0.5, 0.8, 1.0]
    assert by_name["tok"].inputs["rotation"] == ""
