"""Dict RPCs: the minimum `modal.Dict` (modal 1.6.4 `modal/dict.py`) needs to name, read and
write a Dict: DictGetOrCreate (from_name / objects.create / ephemeral), DictGet, DictContains,
DictUpdate (`update`, `put`, `d[k] = v`), DictPop, DictLen, DictClear, DictDelete, DictHeartbeat
(ephemeral Dicts). DictList, DictContents (keys/values/items) and DictGetById are not served
(UNIMPLEMENTED naming the RPC, like every other RPC the emulator lacks)."""

from __future__ import annotations

from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.handlers.base import Context, rpc
from emulator.handlers.convert import creation
from emulator.models.dicts import Dict


def _metadata(ctx: Context, d: Dict) -> api_pb2.DictMetadata:
    return api_pb2.DictMetadata(
        name=d.name or "",
        creation_info=api_pb2.CreationInfo(
            created_at=d.created_at, created_by=ctx.config.workspace
        ),
    )


@rpc
def DictGetOrCreate(
    ctx: Context, req: api_pb2.DictGetOrCreateRequest
) -> api_pb2.DictGetOrCreateResponse:
    d = ctx.state.dicts.get_or_create(
        req.deployment_name, req.environment_name, creation(req.object_creation_type)
    )
    if req.data:
        ctx.state.dicts.update(d.id, [(e.key, e.value) for e in req.data], False)
    return api_pb2.DictGetOrCreateResponse(dict_id=d.id, metadata=_metadata(ctx, d))


@rpc
def DictHeartbeat(ctx: Context, req: api_pb2.DictHeartbeatRequest) -> Empty:
    ctx.state.dicts.get(req.dict_id)
    return Empty()


@rpc
def DictGet(ctx: Context, req: api_pb2.DictGetRequest) -> api_pb2.DictGetResponse:
    value = ctx.state.dicts.read(req.dict_id, req.key)
    if value is None:
        return api_pb2.DictGetResponse(found=False)
    return api_pb2.DictGetResponse(found=True, value=value)


@rpc
def DictContains(ctx: Context, req: api_pb2.DictContainsRequest) -> api_pb2.DictContainsResponse:
    return api_pb2.DictContainsResponse(
        found=ctx.state.dicts.read(req.dict_id, req.key) is not None
    )


@rpc
def DictUpdate(ctx: Context, req: api_pb2.DictUpdateRequest) -> api_pb2.DictUpdateResponse:
    created = ctx.state.dicts.update(
        req.dict_id, [(e.key, e.value) for e in req.updates], req.if_not_exists
    )
    return api_pb2.DictUpdateResponse(created=created)


@rpc
def DictPop(ctx: Context, req: api_pb2.DictPopRequest) -> api_pb2.DictPopResponse:
    value = ctx.state.dicts.pop(req.dict_id, req.key)
    if value is None:
        return api_pb2.DictPopResponse(found=False)
    return api_pb2.DictPopResponse(found=True, value=value)


@rpc
def DictLen(ctx: Context, req: api_pb2.DictLenRequest) -> api_pb2.DictLenResponse:
    return api_pb2.DictLenResponse(len=len(ctx.state.dicts.get(req.dict_id).data))


@rpc
def DictClear(ctx: Context, req: api_pb2.DictClearRequest) -> Empty:
    ctx.state.dicts.get(req.dict_id).data.clear()
    return Empty()


@rpc
def DictDelete(ctx: Context, req: api_pb2.DictDeleteRequest) -> Empty:
    ctx.state.dicts.delete(req.dict_id)
    return Empty()
