"""RPCs of the required set that no CLI/SDK flow in the other tests sends, over the socket.

Kept (issue 33 item 7): the release gate calls TaskList (components/modal/_gate.py; modal 1.6.4
modal/runner.py does too), the Volume provider VolumeGetById and a volume's version
(components/modal/volume.py; modal/volume.py `_Volume.from_name(version=)`).
"""

from __future__ import annotations

import base64
import json
import time

import modal
import pytest
from google.protobuf.empty_pb2 import Empty
from modal.exception import InvalidError, NotFoundError
from modal_proto import api_pb2

from tests.emulator.helpers import raw_rpc, raw_stream
from tests.harness.emulator import EmulatorProcess

MISSING_VOLUME = "vo-" + "z" * 22


def test_client_hello_and_auth_token_get(modal_env: EmulatorProcess) -> None:
    hello = raw_rpc("ClientHello", Empty())
    assert isinstance(hello, api_pb2.ClientHelloResponse)
    token = raw_rpc("AuthTokenGet", api_pb2.AuthTokenGetRequest()).token
    header, claims, _signature = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    assert payload["sub"] == "emu-workspace" and payload["exp"] > time.time()
    assert json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["typ"] == "JWT"
    assert modal_env.rpc_counts() == {"AuthTokenGet": 1, "ClientHello": 1}


def test_volume_get_by_id_and_heartbeat(modal_env: EmulatorProcess) -> None:
    modal.Volume.objects.create("weights")
    volume_id = modal.Volume.from_name("weights").hydrate().object_id
    got = raw_rpc("VolumeGetById", api_pb2.VolumeGetByIdRequest(volume_id=volume_id))
    assert (got.volume_id, got.metadata.name) == (volume_id, "weights")
    raw_rpc("VolumeHeartbeat", api_pb2.VolumeHeartbeatRequest(volume_id=volume_id))
    for method, request in (
        ("VolumeGetById", api_pb2.VolumeGetByIdRequest(volume_id=MISSING_VOLUME)),
        ("VolumeHeartbeat", api_pb2.VolumeHeartbeatRequest(volume_id=MISSING_VOLUME)),
    ):
        with pytest.raises(NotFoundError, match=MISSING_VOLUME):
            raw_rpc(method, request)
    with pytest.raises(InvalidError, match="Malformed volume id"):
        raw_rpc("VolumeGetById", api_pb2.VolumeGetByIdRequest(volume_id="st-notavolume"))


def test_task_list_is_empty_for_a_known_app_and_not_found_otherwise(
    modal_env: EmulatorProcess,
) -> None:
    app_id = modal.App.lookup("tasks", create_if_missing=True).app_id or ""
    assert list(raw_rpc("TaskList", api_pb2.TaskListRequest(app_id=app_id)).tasks) == []
    with pytest.raises(NotFoundError, match="ap-"):
        raw_rpc("TaskList", api_pb2.TaskListRequest(app_id="ap-" + "q" * 22))


def _volume(name: str, mode: int, version: int) -> api_pb2.VolumeGetOrCreateResponse:
    return raw_rpc(
        "VolumeGetOrCreate",
        api_pb2.VolumeGetOrCreateRequest(
            deployment_name=name,
            object_creation_type=mode,  # type: ignore[arg-type]
            version=version,  # type: ignore[arg-type]
        ),
    )


def test_volume_version_is_kept_and_checked(modal_env: EmulatorProcess) -> None:
    modal.Volume.objects.create("v1-vol", version=1)
    assert modal.Volume.from_name("v1-vol", version=1).hydrate().object_id  # the SDK checks too
    ifm = api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING
    got = _volume("v1-vol", ifm, api_pb2.VOLUME_FS_VERSION_UNSPECIFIED)
    assert got.version == got.metadata.version == api_pb2.VOLUME_FS_VERSION_V1
    with pytest.raises(InvalidError, match="has version v1, not v2"):
        _volume("v1-vol", ifm, api_pb2.VOLUME_FS_VERSION_V2)
    fresh = _volume("default-vol", ifm, api_pb2.VOLUME_FS_VERSION_UNSPECIFIED)
    assert fresh.version == api_pb2.VOLUME_FS_VERSION_V2
    with pytest.raises(InvalidError, match="OVERWRITE_IF_EXISTS is not supported for volumes"):
        _volume("v1-vol", api_pb2.OBJECT_CREATION_TYPE_CREATE_OVERWRITE_IF_EXISTS, 0)
    assert sorted(v["version"] for v in modal_env.state()["volumes"]) == [1, 2]


def _build(image: api_pb2.Image) -> tuple[str, str]:
    """(image id, Python version its build reports) through ImageGetOrCreate + join."""
    image_id = raw_rpc(
        "ImageGetOrCreate", api_pb2.ImageGetOrCreateRequest(image=image, builder_version="2025.06")
    ).image_id
    messages = raw_stream(
        "ImageJoinStreaming", api_pb2.ImageJoinStreamingRequest(image_id=image_id)
    )
    final = messages[-1]
    assert final.result.status == api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
    return image_id, final.metadata.python_version_info


def test_layered_images_inherit_the_python_version(modal_env: EmulatorProcess) -> None:
    base_id, base_python = _build(
        api_pb2.Image(dockerfile_commands=["FROM python:3.12.9-slim-bookworm"])
    )
    layer = api_pb2.Image(
        dockerfile_commands=["FROM base", "RUN pip install fastapi"],
        base_images=[api_pb2.BaseImage(image_id=base_id, docker_tag="base")],
    )
    _layer_id, layer_python = _build(layer)
    assert base_python == layer_python == "Python 3.12.9"
    cached = raw_rpc(
        "ImageGetOrCreate", api_pb2.ImageGetOrCreateRequest(image=layer, builder_version="2025.06")
    )
    assert cached.metadata.python_version_info == "Python 3.12.9"  # cache hit, same answer
