"""Deploy RPCs: images (built as streamed logs then SUCCESS), mounts, blobs, functions, classes.

What the client needs from the answers (see docs/emulator.md and the reference traces):
FunctionCreate echoes the definition with its web URL(s) filled in, returns
`function_data.ranked_functions` and a handle with `definition_id`; `@app.server` functions
get their URL in `handle_metadata._experimental_flash_urls`; unchanged images are answered as
already built so a redeploy streams no build.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from modal_proto import api_pb2

from emulator.errors import InvalidArgument
from emulator.handlers.base import Context, rpc
from emulator.handlers.convert import creation, namespace_name
from emulator.ids import new_id
from emulator.models.apps import App
from emulator.models.artifacts import Image, MountFile
from emulator.models.common import Creation
from emulator.models.functions import FunctionSpec, check_function_spec
from emulator.urls import WebUrl

SUCCESS = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
DEFAULT_BUILDER_VERSION = "2025.06"
#: Reported for images whose Python version nothing names (e.g. a bare registry image).
DEFAULT_PYTHON = "3.11.12"


def _now_ts() -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts


# ---- images ---------------------------------------------------------------------------------
def _image_metadata(image: Image, builder_version: str) -> api_pb2.ImageMetadata:
    python = image.python_version or DEFAULT_PYTHON
    return api_pb2.ImageMetadata(
        python_version_info=f"Python {python}",
        workdir="/root",
        libc_version_info="glibc 2.36",
        image_builder_version=builder_version or DEFAULT_BUILDER_VERSION,
    )


@rpc
def ImageGetOrCreate(
    ctx: Context, req: api_pb2.ImageGetOrCreateRequest
) -> api_pb2.ImageGetOrCreateResponse:
    for base in req.image.base_images:
        ctx.state.images.get(base.image_id)
    if req.image.context_mount_id:
        ctx.state.mounts.check_exists(req.image.context_mount_id)
    for secret_id in req.image.secret_ids:
        ctx.state.secrets.get(secret_id)
    definition = b"|".join(
        [
            req.image.SerializeToString(deterministic=True),
            req.builder_version.encode(),
            str(req.namespace).encode(),
        ]
    )
    image = ctx.state.images.get_or_create(
        definition,
        list(req.image.dockerfile_commands),
        req.force_build or req.ignore_cache,
        [base.image_id for base in req.image.base_images],
        req.image.context_mount_id,
    )
    resp = api_pb2.ImageGetOrCreateResponse(image_id=image.id)
    if image.built:
        resp.result.status = SUCCESS
        resp.metadata.CopyFrom(_image_metadata(image, req.builder_version))
    return resp


@rpc
async def ImageJoinStreaming(
    ctx: Context, req: api_pb2.ImageJoinStreamingRequest
) -> AsyncIterator[api_pb2.ImageJoinStreamingResponse]:
    image = ctx.state.images.get(req.image_id)
    if not image.built or req.include_logs_for_finished:
        logs = [
            api_pb2.TaskLogs(
                data=f"[emulator] image {image.id} is not built (containers run on the "
                "emulator's Python); its steps:\n",
                file_descriptor=api_pb2.FILE_DESCRIPTOR_INFO,
                timestamp=time.time(),
            )
        ]
        logs += [
            api_pb2.TaskLogs(
                data=f"  {cmd}\n",
                file_descriptor=api_pb2.FILE_DESCRIPTOR_STDOUT,
                timestamp=time.time(),
            )
            for cmd in image.commands
        ]
        yield api_pb2.ImageJoinStreamingResponse(task_logs=logs, entry_id="1")
        image = ctx.state.images.mark_built(image.id)
    yield api_pb2.ImageJoinStreamingResponse(
        result=api_pb2.GenericResult(status=SUCCESS),
        entry_id="2",
        eof=True,
        metadata=_image_metadata(image, DEFAULT_BUILDER_VERSION),
    )


# ---- mounts and blobs -----------------------------------------------------------------------
@rpc
def MountBatchedCheckExistence(
    ctx: Context, req: api_pb2.MountBatchedCheckExistenceRequest
) -> api_pb2.MountBatchedCheckExistenceResponse:
    return api_pb2.MountBatchedCheckExistenceResponse(
        missing_sha256_hex_hashes=ctx.state.mounts.missing(list(req.sha256_hex_hashes)),
        checked_at=_now_ts(),
    )


@rpc
def MountPutFile(ctx: Context, req: api_pb2.MountPutFileRequest) -> api_pb2.MountPutFileResponse:
    data = req.data if req.HasField("data") else None
    blob_id = req.data_blob_id if req.HasField("data_blob_id") else None
    exists = ctx.state.mounts.put_file(req.sha256_hex, data, blob_id)
    return api_pb2.MountPutFileResponse(exists=exists, checked_at=_now_ts())


@rpc
def MountGetOrCreate(
    ctx: Context, req: api_pb2.MountGetOrCreateRequest
) -> api_pb2.MountGetOrCreateResponse:
    if req.files or not req.deployment_name:
        files = [
            MountFile(f.filename, f.sha256_hex, f.mode if f.HasField("mode") else 0o644)
            for f in req.files
        ]
        mount = ctx.state.mounts.get_or_create_from_files(files)
    else:
        create = creation(req.object_creation_type) is not Creation.LOOKUP
        mount = ctx.state.mounts.get_or_create_named(
            req.deployment_name, namespace_name(req.namespace), create
        )
    return api_pb2.MountGetOrCreateResponse(
        mount_id=mount.id,
        handle_metadata=api_pb2.MountHandleMetadata(content_checksum_sha256_hex=mount.checksum),
    )


@rpc
def BlobCreate(ctx: Context, req: api_pb2.BlobCreateRequest) -> api_pb2.BlobCreateResponse:
    blob_id = ctx.state.blobs.create(req.content_md5, req.content_sha256_base64, req.content_length)
    resp = api_pb2.BlobCreateResponse(blob_id=blob_id, blob_ids=[blob_id])
    resp.upload_urls.items.append(f"{ctx.config.http_url}/blobs/{blob_id}")
    return resp


@rpc
def BlobGet(ctx: Context, req: api_pb2.BlobGetRequest) -> api_pb2.BlobGetResponse:
    ctx.state.blobs.get(req.blob_id)
    return api_pb2.BlobGetResponse(download_url=f"{ctx.config.http_url}/blobs/{req.blob_id}")


# ---- functions and classes ------------------------------------------------------------------
def _url(ctx: Context, app: App, function_name: str, webhook: api_pb2.WebhookConfig) -> WebUrl:
    return ctx.state.web_url(app, function_name, webhook.requested_suffix, webhook.ephemeral_suffix)


def _method_handles(
    ctx: Context, app: App, methods: dict[str, api_pb2.MethodDefinition]
) -> dict[str, api_pb2.FunctionHandleMetadata]:
    out = {}
    for name, md in methods.items():
        handle = api_pb2.FunctionHandleMetadata(
            function_name=md.function_name,
            function_type=md.function_type,
            is_method=True,
            use_method_name=name,
            function_schema=md.function_schema,
            supported_input_formats=md.supported_input_formats,
            supported_output_formats=md.supported_output_formats,
            app_id=app.id,
        )
        if md.webhook_config.type != api_pb2.WEBHOOK_TYPE_UNSPECIFIED:
            handle.web_url = _url(ctx, app, md.function_name, md.webhook_config).url
        out[name] = handle
    return out


@rpc
def FunctionPrecreate(
    ctx: Context, req: api_pb2.FunctionPrecreateRequest
) -> api_pb2.FunctionPrecreateResponse:
    app = ctx.state.apps.get(req.app_id)
    record = ctx.state.apps.precreate_function(app.id, req.function_name, req.existing_function_id)
    handle = api_pb2.FunctionHandleMetadata(
        function_name=req.function_name,
        function_type=req.function_type,
        function_schema=req.function_schema,
        supported_input_formats=req.supported_input_formats,
        supported_output_formats=req.supported_output_formats,
        app_id=app.id,
    )
    if req.webhook_config.type != api_pb2.WEBHOOK_TYPE_UNSPECIFIED:
        handle.web_url = _url(ctx, app, req.function_name, req.webhook_config).url
    for name, mh in _method_handles(ctx, app, dict(req.method_definitions)).items():
        handle.method_handle_metadata[name].CopyFrom(mh)
    return api_pb2.FunctionPrecreateResponse(function_id=record.id, handle_metadata=handle)


def _copy_common_fields(src: Message, dst: Message) -> None:
    """Copy every field `dst` shares (same name, same type) with `src`."""
    src_fields = src.DESCRIPTOR.fields_by_name
    for field in dst.DESCRIPTOR.fields:
        other = src_fields.get(field.name)
        if other is None or other.type != field.type or other.label != field.label:
            continue
        if field.message_type is not None and (
            other.message_type is None
            or other.message_type.full_name != field.message_type.full_name
        ):
            continue
        value = getattr(src, field.name)
        if field.label == field.LABEL_REPEATED:
            target = getattr(dst, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for key in value:
                    if isinstance(value[key], Message):
                        target[key].CopyFrom(value[key])
                    else:
                        target[key] = value[key]
            else:
                target.extend(value)
        elif field.message_type is not None:
            if src.HasField(field.name):
                getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _spec(fn: api_pb2.Function) -> FunctionSpec:
    gpu = fn.resources.gpu_config
    scaling = fn.autoscaler_settings
    has_scaling = fn.HasField("autoscaler_settings")
    min_containers = (
        scaling.min_containers
        if has_scaling and scaling.HasField("min_containers")
        else (fn.warm_pool_size or None)
    )
    max_containers = (
        scaling.max_containers
        if has_scaling and scaling.HasField("max_containers")
        else (fn.concurrency_limit or None)
    )
    return FunctionSpec(
        name=fn.function_name,
        gpu_type=gpu.gpu_type,
        gpu_count=gpu.count,
        min_containers=min_containers,
        max_containers=max_containers,
        max_concurrent_inputs=fn.max_concurrent_inputs,
        target_concurrent_inputs=float(fn.target_concurrent_inputs),
    )


def _decorate(
    ctx: Context, app: App, fn: api_pb2.Function, claims: list[str] | None = None
) -> list[str]:
    """Fill in web URLs on a function definition; returns its flash (server) URLs.

    `claims` collects the endpoints' identities (Modal's URLs, also when the edge's local URL
    is what the definition shows): ownership and collisions are decided on those.
    """
    claims = [] if claims is None else claims
    if fn.webhook_config.type != api_pb2.WEBHOOK_TYPE_UNSPECIFIED:
        url = _url(ctx, app, fn.function_name, fn.webhook_config)
        claims.append(url.identity)
        fn.web_url = url.url
        fn.web_url_info.CopyFrom(
            api_pb2.WebUrlInfo(truncated=url.truncated, has_unique_hash=url.has_unique_hash)
        )
    for md in fn.method_definitions.values():
        if md.webhook_config.type != api_pb2.WEBHOOK_TYPE_UNSPECIFIED:
            url = _url(ctx, app, md.function_name, md.webhook_config)
            claims.append(url.identity)
            md.web_url = url.url
            md.web_url_info.CopyFrom(
                api_pb2.WebUrlInfo(truncated=url.truncated, has_unique_hash=url.has_unique_hash)
            )
    flash: list[str] = []
    if fn.is_server:
        server_url = _url(ctx, app, fn.function_name, api_pb2.WebhookConfig())
        claims.append(server_url.identity)
        flash = [server_url.url]
        del fn.flash_service_urls[:]
        fn.flash_service_urls.extend(flash)
    return flash


def _check_references(ctx: Context, fn: api_pb2.Function) -> None:
    ctx.state.check_function_references(
        fn.image_id,
        list(fn.mount_ids),
        list(fn.secret_ids),
        [vm.volume_id for vm in fn.volume_mounts],
    )


@rpc
def FunctionCreate(
    ctx: Context, req: api_pb2.FunctionCreateRequest
) -> api_pb2.FunctionCreateResponse:
    app = ctx.state.apps.get(req.app_id)
    function_data = api_pb2.FunctionData()
    flash: list[str] = []
    claims: list[str] = []
    if req.HasField("function"):
        fn = api_pb2.Function()
        fn.CopyFrom(req.function)
        check_function_spec(_spec(fn))
        _check_references(ctx, fn)
        flash = _decorate(ctx, app, fn, claims)
        _copy_common_fields(fn, function_data)
        function_data.ranked_functions.add(rank=0, function=fn)
        tag = fn.function_name
        first = fn
    elif req.HasField("function_data") and req.function_data.ranked_functions:
        function_data.CopyFrom(req.function_data)
        for ranked in function_data.ranked_functions:
            check_function_spec(_spec(ranked.function))
            _check_references(ctx, ranked.function)
            flash = _decorate(ctx, app, ranked.function, claims)
        first = function_data.ranked_functions[0].function
        function_data.web_url = first.web_url
        function_data.web_url_info.CopyFrom(first.web_url_info)
        for name, md in first.method_definitions.items():
            function_data.method_definitions[name].CopyFrom(md)
        del function_data.flash_service_urls[:]
        function_data.flash_service_urls.extend(flash)
        tag = function_data.function_name or first.function_name
    else:
        raise InvalidArgument(
            "FunctionCreate needs `function` or `function_data` with at least one ranked function."
        )
    record = ctx.state.apps.precreate_function(app.id, tag, req.existing_function_id)
    ctx.state.apps.claim_web_urls(app.id, record.id, sorted(set(claims)))
    definition_id = new_id("definition")
    handle = api_pb2.FunctionHandleMetadata(
        function_name=tag,
        function_type=first.function_type,
        web_url=first.web_url,
        definition_id=definition_id,
        class_parameter_info=first.class_parameter_info,
        function_schema=first.function_schema,
        supported_input_formats=first.supported_input_formats,
        supported_output_formats=first.supported_output_formats,
        app_id=app.id,
        _experimental_flash_urls=flash,
    )
    for name, mh in _method_handles(ctx, app, dict(first.method_definitions)).items():
        handle.method_handle_metadata[name].CopyFrom(mh)
    ctx.state.apps.save_definition(
        definition_id,
        record.id,
        function_data.SerializeToString(deterministic=True),
        handle.SerializeToString(deterministic=True),
    )
    # `function` echoes the (first) definition: the CLI prints URLs and auth from it.
    return api_pb2.FunctionCreateResponse(
        function_id=record.id, handle_metadata=handle, function_data=function_data, function=first
    )


@rpc
def FunctionGet(ctx: Context, req: api_pb2.FunctionGetRequest) -> api_pb2.FunctionGetResponse:
    _app, definition = ctx.state.apps.lookup_function(
        req.app_name, req.environment_name, req.object_tag, req.app_version
    )
    handle = api_pb2.FunctionHandleMetadata.FromString(definition.handle)
    data = api_pb2.FunctionData.FromString(definition.data)
    return api_pb2.FunctionGetResponse(
        function_id=definition.function_id, handle_metadata=handle, function=data
    )


@rpc
def ClassCreate(ctx: Context, req: api_pb2.ClassCreateRequest) -> api_pb2.ClassCreateResponse:
    class_id = ctx.state.apps.create_class(req.app_id, req.existing_class_id)
    return api_pb2.ClassCreateResponse(
        class_id=class_id, handle_metadata=api_pb2.ClassHandleMetadata()
    )


@rpc
def ClassGet(ctx: Context, req: api_pb2.ClassGetRequest) -> api_pb2.ClassGetResponse:
    _app, class_id = ctx.state.apps.lookup_class(
        req.app_name, req.environment_name, req.object_tag, req.app_version
    )
    return api_pb2.ClassGetResponse(
        class_id=class_id, handle_metadata=api_pb2.ClassHandleMetadata()
    )


@rpc
def FunctionGetById(
    ctx: Context, req: api_pb2.FunctionGetByIdRequest
) -> api_pb2.FunctionGetByIdResponse:
    definition = ctx.state.apps.deployed_definition(req.function_id)
    return api_pb2.FunctionGetByIdResponse(
        handle_metadata=api_pb2.FunctionHandleMetadata.FromString(definition.handle),
        function=api_pb2.FunctionData.FromString(definition.data),
    )
