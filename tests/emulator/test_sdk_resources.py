"""The modal SDK in process against the emulator: creation types, scoping, paging, errors.

Kept (issue 33 item 7): the providers read NOT_FOUND as gone (components/modal/_base.py) and
list by environment; modal 1.6.4 modal/_grpc_client.py maps NOT_FOUND to NotFoundError. An RPC
the emulator lacks answers UNIMPLEMENTED, so a product test that needs one fails instead of
passing.
"""

from __future__ import annotations

import modal
import pytest
from modal.exception import (
    AlreadyExistsError,
    InvalidError,
    NotFoundError,
    UnimplementedError,
)
from modal_proto import api_pb2

from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess

FAIL = api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS
IFM = api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING
OVR = api_pb2.OBJECT_CREATION_TYPE_CREATE_OVERWRITE_IF_EXISTS


def _secret(
    name: str, mode: api_pb2.ObjectCreationType.ValueType, env: str = "", **values: str
) -> api_pb2.SecretGetOrCreateResponse:
    return raw_rpc(
        "SecretGetOrCreate",
        api_pb2.SecretGetOrCreateRequest(
            deployment_name=name, environment_name=env, object_creation_type=mode, env_dict=values
        ),
    )


def test_secret_creation_types(modal_env: EmulatorProcess) -> None:
    first = _secret("llm", FAIL, HF_TOKEN="a")
    assert first.secret_id.startswith("st-") and len(first.secret_id) == 25
    assert list(first.metadata.keys) == ["HF_TOKEN"]
    with pytest.raises(AlreadyExistsError, match="'llm' already exists"):
        _secret("llm", FAIL, HF_TOKEN="b")
    kept = _secret("llm", IFM, OTHER="c")  # create-if-missing keeps the existing content
    assert kept.secret_id == first.secret_id and list(kept.metadata.keys) == ["HF_TOKEN"]
    over = _secret("llm", OVR, X="1", Y="2")  # overwrite replaces the content, keeps the id
    assert over.secret_id == first.secret_id and list(over.metadata.keys) == ["X", "Y"]

    secret = modal.Secret.from_name("llm").hydrate()  # lookup (UNSPECIFIED)
    assert secret.object_id == first.secret_id
    secret.update({"Z": "3"})  # SecretUpdate merges keys
    info = raw_rpc("SecretGetInfo", api_pb2.SecretGetInfoRequest(secret_id=first.secret_id))
    assert list(info.metadata.keys) == ["X", "Y", "Z"]
    # An update without a value removes the key (the SDK only sends values; raw RPC does this).
    raw_rpc(
        "SecretUpdate",
        api_pb2.SecretUpdateRequest(
            secret_id=first.secret_id, updates=[api_pb2.SecretUpdateRequest.Update(key="Y")]
        ),
    )
    info = raw_rpc("SecretGetInfo", api_pb2.SecretGetInfoRequest(secret_id=first.secret_id))
    assert list(info.metadata.keys) == ["X", "Z"]

    with pytest.raises(NotFoundError, match="missing required key"):
        modal.Secret.from_name("llm", required_keys=["NOPE"]).hydrate()
    with pytest.raises(NotFoundError, match="'ghost' not found in environment 'main'"):
        modal.Secret.from_name("ghost").hydrate()
    modal.Secret.objects.delete("llm")
    with pytest.raises(NotFoundError):
        modal.Secret.from_name("llm").hydrate()


def test_environment_scoping_and_default(modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("staging")
    modal.Secret.objects.create("shared", {"K": "main"})
    modal.Secret.objects.create("shared", {"K": "staging"}, environment_name="staging")
    main_ids = {s.object_id for s in modal.Secret.objects.list()}
    staging_ids = {s.object_id for s in modal.Secret.objects.list(environment_name="staging")}
    assert len(main_ids) == 1 and len(staging_ids) == 1 and main_ids != staging_ids
    explicit = {s.object_id for s in modal.Secret.objects.list(environment_name="main")}
    assert explicit == main_ids  # "" and "main" are the same (default) environment
    with pytest.raises(NotFoundError, match="Environment 'nowhere' not found"):
        modal.Secret.objects.list(environment_name="nowhere")
    vol = modal.Volume.from_name("data", create_if_missing=True, environment_name="staging")
    vol.hydrate()
    assert vol.object_id.startswith("vo-")
    assert [v.name for v in modal.Volume.objects.list()] == []
    assert [v.name for v in modal.Volume.objects.list(environment_name="staging")] == ["data"]


def test_list_pagination_is_exact_across_pages(modal_env: EmulatorProcess) -> None:
    names = [f"s{i:03d}" for i in range(205)]
    for name in names:
        _secret(name, FAIL, K="v")
    listed = modal.Secret.objects.list()
    assert sorted(str(s.name) for s in listed) == names
    assert modal_env.rpc_counts()["SecretList"] == 3  # 100 + 100 + 5
    page = raw_rpc(
        "SecretList",
        api_pb2.SecretListRequest(pagination=api_pb2.ListPagination(max_objects=500)),
    )
    assert len(page.items) == 100  # the server caps a page at 100


def test_malformed_names_and_ids_are_invalid_argument(modal_env: EmulatorProcess) -> None:
    for bad in ("has space", "x" * 65, "semi;colon", ""):
        with pytest.raises(InvalidError):
            _secret(bad, FAIL, K="v")
        with pytest.raises(InvalidError):
            raw_rpc(
                "VolumeGetOrCreate",
                api_pb2.VolumeGetOrCreateRequest(deployment_name=bad, object_creation_type=IFM),
            )
    ok = "a" * 64
    assert _secret(ok, FAIL, K="v").secret_id  # 64 characters is the limit, inclusive
    assert _secret("a.b_c-D9", FAIL, K="v").secret_id
    with pytest.raises(InvalidError, match="Malformed secret id"):
        raw_rpc("SecretDelete", api_pb2.SecretDeleteRequest(secret_id="vo-123"))
    with pytest.raises(InvalidError, match="Malformed app id"):
        raw_rpc("AppGetLifecycle", api_pb2.AppGetLifecycleRequest(app_id="ap-short"))


def test_unknown_ids_are_not_found(modal_env: EmulatorProcess) -> None:
    ghost = "st-" + "A" * 22
    with pytest.raises(NotFoundError, match=ghost):
        raw_rpc("SecretDelete", api_pb2.SecretDeleteRequest(secret_id=ghost))
    with pytest.raises(NotFoundError):
        raw_rpc("VolumeDelete", api_pb2.VolumeDeleteRequest(volume_id="vo-" + "B" * 22))
    with pytest.raises(NotFoundError):
        raw_rpc("AppGetLifecycle", api_pb2.AppGetLifecycleRequest(app_id="ap-" + "C" * 22))
    with pytest.raises(NotFoundError):
        raw_rpc(
            "EnvironmentGetBudget",
            api_pb2.EnvironmentGetBudgetRequest(environment_id="en-" + "D" * 22),
        )


def test_unimplemented_methods_are_named(modal_env: EmulatorProcess) -> None:
    with pytest.raises(UnimplementedError, match="QueueGetOrCreate is not implemented"):
        raw_rpc("QueueGetOrCreate", api_pb2.QueueGetOrCreateRequest(deployment_name="q"))
    with pytest.raises(UnimplementedError, match="DictContents"):
        list(modal.Dict.from_name("d", create_if_missing=True).keys())
    assert modal_env.rpc_counts()["QueueGetOrCreate"] == 1
