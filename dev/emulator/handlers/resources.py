"""Secrets and volumes RPCs."""

from __future__ import annotations

from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.errors import InvalidArgument
from emulator.handlers.base import Context, rpc
from emulator.handlers.convert import creation
from emulator.models.secrets import Secret
from emulator.models.volumes import Volume


def _secret_metadata(ctx: Context, secret: Secret) -> api_pb2.SecretMetadata:
    return api_pb2.SecretMetadata(
        name=secret.name or "",
        keys=secret.keys,
        environment_name=secret.env_name,
        creation_info=api_pb2.CreationInfo(
            created_at=secret.created_at, created_by=ctx.config.workspace
        ),
    )


@rpc
def SecretGetOrCreate(
    ctx: Context, req: api_pb2.SecretGetOrCreateRequest
) -> api_pb2.SecretGetOrCreateResponse:
    secret = ctx.state.secrets.get_or_create(
        req.deployment_name,
        req.environment_name,
        creation(req.object_creation_type),
        dict(req.env_dict),
        list(req.required_keys),
    )
    return api_pb2.SecretGetOrCreateResponse(
        secret_id=secret.id, metadata=_secret_metadata(ctx, secret)
    )


@rpc
def SecretGetInfo(ctx: Context, req: api_pb2.SecretGetInfoRequest) -> api_pb2.SecretGetInfoResponse:
    return api_pb2.SecretGetInfoResponse(
        metadata=_secret_metadata(ctx, ctx.state.secrets.get(req.secret_id))
    )


@rpc
def SecretUpdate(ctx: Context, req: api_pb2.SecretUpdateRequest) -> Empty:
    # An update whose value is unset removes the key (api.proto: "If not set, the key is removed").
    ctx.state.secrets.update(
        req.secret_id, {u.key: (u.value if u.HasField("value") else None) for u in req.updates}
    )
    return Empty()


@rpc
def SecretList(ctx: Context, req: api_pb2.SecretListRequest) -> api_pb2.SecretListResponse:
    env, secrets = ctx.state.secrets.list(
        req.environment_name, req.pagination.max_objects, req.pagination.created_before
    )
    return api_pb2.SecretListResponse(
        environment_name=env.name,
        items=[
            api_pb2.SecretListItem(
                label=s.name or "",
                created_at=s.created_at,
                environment_name=s.env_name,
                secret_id=s.id,
                metadata=_secret_metadata(ctx, s),
            )
            for s in secrets
        ],
    )


@rpc
def SecretDelete(ctx: Context, req: api_pb2.SecretDeleteRequest) -> Empty:
    ctx.state.secrets.delete(req.secret_id)
    return Empty()


_FS_VERSION: dict[int, api_pb2.VolumeFsVersion.ValueType] = {
    1: api_pb2.VOLUME_FS_VERSION_V1,
    2: api_pb2.VOLUME_FS_VERSION_V2,
}


def _requested_version(value: int) -> int:
    """The VolumeFS version a request names (0: none); unknown values are INVALID_ARGUMENT."""
    if value == api_pb2.VOLUME_FS_VERSION_UNSPECIFIED:
        return 0
    for number, proto in _FS_VERSION.items():
        if proto == value:
            return number
    raise InvalidArgument(f"Unknown VolumeFS version {value}; use V1 or V2.")


def _volume_metadata(ctx: Context, volume: Volume) -> api_pb2.VolumeMetadata:
    return api_pb2.VolumeMetadata(
        version=_FS_VERSION[volume.version],
        name=volume.name or "",
        creation_info=api_pb2.CreationInfo(
            created_at=volume.created_at, created_by=ctx.config.workspace
        ),
    )


@rpc
def VolumeGetOrCreate(
    ctx: Context, req: api_pb2.VolumeGetOrCreateRequest
) -> api_pb2.VolumeGetOrCreateResponse:
    volume = ctx.state.volumes.get_or_create(
        req.deployment_name,
        req.environment_name,
        creation(req.object_creation_type),
        _requested_version(req.version),
    )
    return api_pb2.VolumeGetOrCreateResponse(
        volume_id=volume.id,
        version=_FS_VERSION[volume.version],
        metadata=_volume_metadata(ctx, volume),
    )


@rpc
def VolumeGetById(ctx: Context, req: api_pb2.VolumeGetByIdRequest) -> api_pb2.VolumeGetByIdResponse:
    volume = ctx.state.volumes.get(req.volume_id)
    return api_pb2.VolumeGetByIdResponse(
        volume_id=volume.id, metadata=_volume_metadata(ctx, volume)
    )


@rpc
def VolumeList(ctx: Context, req: api_pb2.VolumeListRequest) -> api_pb2.VolumeListResponse:
    env, volumes = ctx.state.volumes.list(
        req.environment_name, req.pagination.max_objects, req.pagination.created_before
    )
    return api_pb2.VolumeListResponse(
        environment_name=env.name,
        items=[
            api_pb2.VolumeListItem(
                label=v.name or "",
                volume_id=v.id,
                created_at=v.created_at,
                metadata=_volume_metadata(ctx, v),
            )
            for v in volumes
        ],
    )


@rpc
def VolumeDelete(ctx: Context, req: api_pb2.VolumeDeleteRequest) -> Empty:
    ctx.state.volumes.delete(req.volume_id)
    return Empty()


@rpc
def VolumeRename(ctx: Context, req: api_pb2.VolumeRenameRequest) -> Empty:
    ctx.state.volumes.rename(req.volume_id, req.name)
    return Empty()


@rpc
def VolumeHeartbeat(ctx: Context, req: api_pb2.VolumeHeartbeatRequest) -> Empty:
    ctx.state.volumes.get(req.volume_id)
    return Empty()
