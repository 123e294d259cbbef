"""Small protobuf <-> model conversions shared by the handler modules."""

from __future__ import annotations

from modal_proto import api_pb2

from emulator.errors import InvalidArgument
from emulator.models.common import Creation

_CREATION: dict[int, Creation] = {
    api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED: Creation.LOOKUP,
    api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING: Creation.IF_MISSING,
    api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS: Creation.FAIL_IF_EXISTS,
    api_pb2.OBJECT_CREATION_TYPE_CREATE_OVERWRITE_IF_EXISTS: Creation.OVERWRITE,
    api_pb2.OBJECT_CREATION_TYPE_ANONYMOUS_OWNED_BY_APP: Creation.ANONYMOUS,
    api_pb2.OBJECT_CREATION_TYPE_EPHEMERAL: Creation.ANONYMOUS,
}


def creation(value: int) -> Creation:
    try:
        return _CREATION[value]
    except KeyError:
        raise InvalidArgument(f"Unknown object_creation_type {value}.") from None


def create_if_missing(rpc_name: str, value: int) -> bool:
    """For RPCs that only look up or create-if-missing: True to create; other modes rejected."""
    mode = creation(value)
    if mode not in (Creation.LOOKUP, Creation.IF_MISSING):
        raise InvalidArgument(f"{rpc_name} supports lookup or create-if-missing only.")
    return mode is Creation.IF_MISSING


def app_state_to_model(value: int) -> str:
    if value == api_pb2.APP_STATE_UNSPECIFIED:
        raise InvalidArgument("app_state is unspecified.")
    try:
        return api_pb2.AppState.Name(value).removeprefix("APP_STATE_").lower()
    except ValueError:
        raise InvalidArgument(f"Unknown app_state {value}.") from None


def app_state_to_proto(state: str) -> int:
    return api_pb2.AppState.Value("APP_STATE_" + state.upper())


def namespace_name(value: int) -> str:
    names: dict[int, str] = {
        api_pb2.DEPLOYMENT_NAMESPACE_GLOBAL: "global",
        api_pb2.DEPLOYMENT_NAMESPACE_WORKSPACE: "workspace",
    }
    return names.get(value, "workspace")
