"""The gRPC dispatch layer over a real socket: crash logging, UNIMPLEMENTED, auth, coverage.

Kept (issue 33 item 7): REQUIRED is what the product calls (components/modal/_rpc.py); a call
without credentials must fail as on Modal, where the client raises AuthError (modal 1.6.4
modal/client.py) and tests/providers/test_32_read_without_credentials.py relies on it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.server import Server
from modal_proto import api_pb2
from modal_proto.api_grpc import ModalClientStub

import emulator.handlers  # noqa: F401  (registers the handlers)
from emulator.handlers.base import REGISTRY, RpcCounter, ServerConfig, build_servicer, rpc_names
from emulator.models import State
from emulator.store import Store

#: The minimal set of the reference page plus history and rollback.
REQUIRED = set(
    [
        "SecretGetOrCreate",
        "SecretGetInfo",
        "SecretUpdate",
        "SecretList",
        "SecretDelete",
        "VolumeGetOrCreate",
        "VolumeGetById",
        "VolumeList",
        "VolumeDelete",
        "VolumeRename",
        "VolumeHeartbeat",
        "WorkspaceNameLookup",
        "WebhookTokenCreate",
        "WebhookTokenUpdate",
        "WebhookTokenList",
        "WebhookTokenListForEnvironment",
        "WebhookTokenEnvironmentAdd",
        "WebhookTokenEnvironmentRemove",
        "WebhookTokenDelete",
        "EnvironmentGetOrCreate",
        "EnvironmentCreate",
        "EnvironmentList",
        "EnvironmentUpdate",
        "EnvironmentDelete",
        "EnvironmentSetBudget",
        "EnvironmentGetBudget",
        "AppGetByDeploymentName",
        "AppCreate",
        "AppGetOrCreate",
        "AppGetLayout",
        "AppHeartbeat",
        "AppClientDisconnect",
        "AppPublish",
        "AppList",
        "AppStop",
        "AppGetLifecycle",
        "TaskList",
        "ImageGetOrCreate",
        "ImageJoinStreaming",
        "MountBatchedCheckExistence",
        "MountPutFile",
        "MountGetOrCreate",
        "BlobCreate",
        "BlobGet",
        "FunctionPrecreate",
        "FunctionCreate",
        "ClassCreate",
        "FunctionGet",
        "ClassGet",
        "ClientHello",
        "AuthTokenGet",
        "AppDeploymentHistory",
        "AppRollback",
        "WebhookTokenEnvironmentList",  # our ProxyAuthToken read (the client itself never calls it)
    ]
)


def test_every_required_rpc_is_implemented() -> None:
    assert len(REQUIRED) == 54
    assert set(REGISTRY) >= REQUIRED
    assert set(REGISTRY) <= set(rpc_names())
    assert len(rpc_names()) > 250  # everything else answers UNIMPLEMENTED


def _call(method: str, request: Any, metadata: dict[str, str] | None = None) -> GRPCError:
    async def run() -> GRPCError:
        state = State(Store(None), "ws")
        config = ServerConfig("ws", "http://127.0.0.1:1", token_id="ak-1", token_secret="as-1")
        server = Server([build_servicer(state, config, RpcCounter())])
        await server.start("127.0.0.1", 0)
        port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        channel = Channel("127.0.0.1", port)
        try:
            stub = ModalClientStub(channel)
            md = (
                metadata
                if metadata is not None
                else {
                    "x-modal-token-id": "ak-1",
                    "x-modal-token-secret": "as-1",
                }
            )
            with pytest.raises(GRPCError) as info:
                await getattr(stub, method)(request, metadata=md, timeout=10)
            return info.value
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(run())


def test_unimplemented_names_the_method_and_auth_is_checked_first() -> None:
    err = _call("SandboxCreate", api_pb2.SandboxCreateRequest())
    assert err.status == Status.UNIMPLEMENTED
    assert "SandboxCreate is not implemented" in (err.message or "")
    err = _call("SecretList", api_pb2.SecretListRequest(), metadata={})
    assert err.status == Status.UNAUTHENTICATED
    err = _call(
        "SecretList",
        api_pb2.SecretListRequest(),
        metadata={"x-modal-token-id": "ak-1", "x-modal-token-secret": "nope"},
    )
    assert err.status == Status.UNAUTHENTICATED
