"""Container-side RPCs and function calls: what running containers and callers send.

Container side (served on each container's own unix socket, so `ctx.task_id` names it; the
sequence is the one measured in shared/reference/modal-container-runtime.md and served by
modal-labs/modal-client test/conftest.py's MockClientServicer): ContainerHello,
ContainerHeartbeat, FunctionGetInputs (long poll; a `kill_switch` item tells it to leave),
FunctionPutOutputs, TaskResult (import/enter failures), ContainerServerLifecycleReady
(`@app.server` after `@modal.enter`), ContainerCheckpoint, VolumeCommit/VolumeReload.

Caller side: FunctionMap (`.remote()`/`.spawn()` pipeline their one input; `.map()` follows
with FunctionPutInputs), FunctionGetOutputs (long poll), FunctionFinishInputs,
FunctionCallCancel; AppGetLogs (`modal app logs`, SDK log streaming), TaskList and
ContainerStop.

Without a runtime (`--no-runtime`), the caller-side RPCs answer FAILED_PRECONDITION saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.errors import EmulatorError, FailedPrecondition, InvalidArgument, NotFound
from emulator.handlers.base import Context, rpc

#: How long FunctionGetInputs holds a container's poll when no input waits.
INPUT_POLL_SECONDS = 2.0
MAX_OUTPUT_WAIT = 55.0


def _runtime(ctx: Context) -> Any:
    if ctx.runtime is None:
        raise FailedPrecondition(
            f"{ctx.method}: this emulator runs no containers (started with --no-runtime); "
            "restart it without that flag to call functions."
        )
    return ctx.runtime


# ---- container side -----------------------------------------------------------------------
@rpc
def ContainerHello(ctx: Context, req: Empty) -> Empty:
    return Empty()


@rpc
def ContainerHeartbeat(
    ctx: Context, req: api_pb2.ContainerHeartbeatRequest
) -> api_pb2.ContainerHeartbeatResponse:
    return api_pb2.ContainerHeartbeatResponse()


@rpc
def ContainerServerLifecycleReady(
    ctx: Context, req: api_pb2.ContainerServerLifecycleReadyRequest
) -> Empty:
    if ctx.runtime is not None and ctx.task_id:
        ctx.runtime.server_ready(ctx.task_id)
    return Empty()


@rpc
def TaskResult(ctx: Context, req: api_pb2.TaskResultRequest) -> Empty:
    if ctx.runtime is not None and ctx.task_id:
        ctx.runtime.task_result(ctx.task_id, req.result)
    return Empty()


@rpc
def ContainerCheckpoint(ctx: Context, req: api_pb2.ContainerCheckpointRequest) -> Empty:
    return Empty()  # no memory is snapshotted (docs/emulator.md)


@rpc
def VolumeCommit(ctx: Context, req: api_pb2.VolumeCommitRequest) -> api_pb2.VolumeCommitResponse:
    ctx.state.volumes.get(req.volume_id)
    # Volumes are shared directories: a write is visible to other containers at once.
    return api_pb2.VolumeCommitResponse(skip_reload=False)


@rpc
def VolumeReload(ctx: Context, req: api_pb2.VolumeReloadRequest) -> Empty:
    ctx.state.volumes.get(req.volume_id)
    return Empty()


@rpc
async def FunctionGetInputs(
    ctx: Context, req: api_pb2.FunctionGetInputsRequest
) -> api_pb2.FunctionGetInputsResponse:
    runtime = _runtime(ctx)
    container = runtime.container(ctx.task_id) if ctx.task_id else None
    if container is None:
        raise FailedPrecondition("FunctionGetInputs is only served to containers.")
    if container.state == "starting":
        container.state = "ready"
        container.ready_at = time.time()
        container.last_active = time.monotonic()
        runtime._log_info(
            container,
            f"container {container.task_id} ready "
            f"({container.ready_at - container.created_at:.2f} s after start)",
        )
        pool = runtime.pools.get(container.function_id)
        if pool is not None:
            pool.failures = 0
            pool.notify()
    deadline = time.monotonic() + INPUT_POLL_SECONDS
    while True:
        pool = runtime.pools.get(container.function_id)
        outdated = pool is None or pool.retired or pool.definition.id != container.definition_id
        if container.stop_requested or container.state != "ready" or outdated:
            # an old version's container takes no new input after a redeploy: it leaves
            # (running @exit) and new inputs wait for the new version's containers
            container.stop_requested = True
            return api_pb2.FunctionGetInputsResponse(
                inputs=[api_pb2.FunctionGetInputsItem(kill_switch=True)]
            )
        pending = runtime.calls.pop(container.function_id)
        if pending is not None:
            pending.task_id = container.task_id
            pending.started_at = time.time()
            container.in_flight += 1
            container.last_active = time.monotonic()
            return api_pb2.FunctionGetInputsResponse(
                inputs=[
                    api_pb2.FunctionGetInputsItem(
                        input_id=pending.input_id,
                        function_call_id=pending.call_id,
                        input=pending.input,
                        retry_count=pending.retry_count,
                        function_map_idx=pending.idx,
                    )
                ]
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return api_pb2.FunctionGetInputsResponse()
        event = runtime.calls.queue_event(container.function_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), remaining)


@rpc
def FunctionPutOutputs(ctx: Context, req: api_pb2.FunctionPutOutputsRequest) -> Empty:
    runtime = _runtime(ctx)
    container = runtime.container(ctx.task_id) if ctx.task_id else None
    for out in req.outputs:
        runtime.calls.complete(
            out.input_id,
            out.result,
            out.data_format,
            task_id=ctx.task_id,
            started_at=out.input_started_at,
            retry_count=out.retry_count,
        )
        if container is not None:
            container.in_flight = max(container.in_flight - 1, 0)
            container.last_active = time.monotonic()
    runtime.wake()
    return Empty()


def _call_of(ctx: Context, req: Any) -> Any:
    runtime = _runtime(ctx)
    call = runtime.calls.get(req.function_call_id)
    if call is None:
        raise NotFound(f"Function call {req.function_call_id!r} not found.")
    return call


@rpc
async def FunctionCallGetDataIn(
    ctx: Context, req: api_pb2.FunctionCallGetDataRequest
) -> AsyncIterator[api_pb2.DataChunk]:
    """What the caller sends a running call (a web request's body, as ASGI messages)."""
    call = _call_of(ctx, req)
    call.data_in_received(req.last_index)
    deadline = time.monotonic() + MAX_OUTPUT_WAIT
    while True:
        fresh = [c for c in call.data_in if c[0] > req.last_index]
        if fresh:
            for index, data_format, data in fresh:
                yield api_pb2.DataChunk(index=index, data_format=data_format, data=data)
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 or call.unfinished == 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call.changed.wait(), min(remaining, 5.0))


@rpc
def FunctionCallPutDataOut(ctx: Context, req: api_pb2.FunctionCallPutDataRequest) -> Empty:
    """What a running call streams back (generator items, a web response's ASGI messages)."""
    call = _call_of(ctx, req)
    known = {c[0] for c in call.data_out}
    for chunk in req.data_chunks:
        if chunk.index in known:
            continue  # a retried put
        data = chunk.data
        if chunk.data_blob_id:
            data = ctx.state.blobs.get(chunk.data_blob_id)
        call.data_out.append((chunk.index, chunk.data_format, data))
    call.data_out.sort(key=lambda c: c[0])
    call.notify()
    return Empty()


@rpc
def FunctionGetDynamicConcurrency(
    ctx: Context, req: api_pb2.FunctionGetDynamicConcurrencyRequest
) -> api_pb2.FunctionGetDynamicConcurrencyResponse:
    return api_pb2.FunctionGetDynamicConcurrencyResponse(concurrency=req.max_concurrency)


# ---- caller side -------------------------------------------------------------------------
def _put(
    ctx: Context, call: Any, items: list[api_pb2.FunctionPutInputsItem]
) -> list[api_pb2.FunctionPutInputsResponseItem]:
    runtime = ctx.runtime
    out = []
    for item in items:
        pending = runtime.calls.add_input(call, item.idx, item.input)
        out.append(
            api_pb2.FunctionPutInputsResponseItem(
                idx=item.idx, input_id=pending.input_id, input_jwt=pending.input_id
            )
        )
    runtime.wake()
    return out


@rpc
def FunctionMap(ctx: Context, req: api_pb2.FunctionMapRequest) -> api_pb2.FunctionMapResponse:
    runtime = _runtime(ctx)
    pool = runtime.pool_for(req.function_id)
    if pool.settings.kind == "server":
        raise InvalidArgument(
            f"Function {req.function_id} is an @app.server: it takes HTTP requests at its URL, "
            "not .remote() calls."
        )
    call = runtime.calls.create(req.function_id)
    pipelined = _put(ctx, call, list(req.pipelined_inputs))
    return api_pb2.FunctionMapResponse(
        function_call_id=call.id,
        pipelined_inputs=pipelined,
        function_call_jwt=call.id,
        max_inputs_outstanding=1000,
    )


@rpc
def FunctionPutInputs(
    ctx: Context, req: api_pb2.FunctionPutInputsRequest
) -> api_pb2.FunctionPutInputsResponse:
    runtime = _runtime(ctx)
    call = runtime.calls.get(req.function_call_id)
    if call is None:
        raise NotFound(f"Function call {req.function_call_id!r} not found.")
    return api_pb2.FunctionPutInputsResponse(inputs=_put(ctx, call, list(req.inputs)))


def _entry(last_entry_id: str) -> int:
    head = last_entry_id.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


@rpc
async def FunctionGetOutputs(
    ctx: Context, req: api_pb2.FunctionGetOutputsRequest
) -> api_pb2.FunctionGetOutputsResponse:
    runtime = _runtime(ctx)
    call = runtime.calls.get(req.function_call_id)
    if call is None:
        raise NotFound(f"Function call {req.function_call_id!r} not found.")
    after = _entry(req.last_entry_id)
    deadline = time.monotonic() + min(max(req.timeout, 0.0), MAX_OUTPUT_WAIT)
    while True:
        found = [
            o
            for o in call.outputs
            if o.entry > after and (not req.end_idx or req.start_idx <= o.item.idx <= req.end_idx)
        ]
        if req.max_values > 0:
            found = found[: req.max_values]
        if found or time.monotonic() >= deadline:
            break
        event = call.changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(deadline - time.monotonic(), 0.0))
    last = max((o.entry for o in found), default=after)
    if req.clear_on_success and found:
        ids = {id(o) for o in found}
        call.outputs = [o for o in call.outputs if id(o) not in ids]
    return api_pb2.FunctionGetOutputsResponse(
        outputs=[o.item for o in found],
        idxs=[o.item.idx for o in found],
        last_entry_id=f"{last}-0",
        num_unfinished_inputs=call.unfinished,
    )


@rpc
def FunctionFinishInputs(ctx: Context, req: api_pb2.FunctionFinishInputsRequest) -> Empty:
    return Empty()


@rpc
def FunctionRetryInputs(
    ctx: Context, req: api_pb2.FunctionRetryInputsRequest
) -> api_pb2.FunctionRetryInputsResponse:
    runtime = _runtime(ctx)
    jwts = []
    for item in req.inputs:
        pending = runtime.calls.by_input.get(item.input_jwt)
        if pending is None:
            raise NotFound(f"Input {item.input_jwt!r} not found.")
        call = runtime.calls.get(pending.call_id)
        if call is not None:
            call.finished.discard(pending.input_id)
        runtime.calls.requeue(pending)
        jwts.append(pending.input_id)
    runtime.wake()
    return api_pb2.FunctionRetryInputsResponse(input_jwts=jwts)


@rpc
def FunctionCallCancel(ctx: Context, req: api_pb2.FunctionCallCancelRequest) -> Empty:
    runtime = _runtime(ctx)
    call = runtime.calls.get(req.function_call_id)
    if call is None:
        raise NotFound(f"Function call {req.function_call_id!r} not found.")
    queue = runtime.calls.queue(call.function_id)
    for pending in [p for p in queue if p.call_id == call.id]:
        queue.remove(pending)
        runtime.calls.complete(
            pending.input_id,
            api_pb2.GenericResult(
                status=api_pb2.GenericResult.GENERIC_STATUS_TERMINATED,
                exception="cancelled by FunctionCallCancel",
            ),
            api_pb2.DATA_FORMAT_PICKLE,
        )
    return Empty()


# ---- containers and logs -----------------------------------------------------------------
@rpc
def TaskList(ctx: Context, req: api_pb2.TaskListRequest) -> api_pb2.TaskListResponse:
    if req.app_id:
        app = ctx.state.apps.get(req.app_id)
        apps = {app.id: app}
    else:
        _env, listed = ctx.state.apps.list(req.environment_name)
        apps = {a.id: a for a in listed}
    if ctx.runtime is None:
        return api_pb2.TaskListResponse()
    tasks = [
        api_pb2.TaskStats(
            task_id=c.task_id,
            app_id=c.app_id,
            app_description=apps[c.app_id].description,
            started_at=c.ready_at or 0.0,
            enqueued_at=c.created_at,
        )
        for c in ctx.runtime.tasks.values()
        if c.alive and c.app_id in apps
    ]
    return api_pb2.TaskListResponse(tasks=tasks)


@rpc
async def ContainerStop(
    ctx: Context, req: api_pb2.ContainerStopRequest
) -> api_pb2.ContainerStopResponse:
    runtime = _runtime(ctx)
    if runtime.container(req.task_id) is None:
        raise NotFound(f"Container {req.task_id!r} not found.")
    if req.task_id == ctx.task_id:
        runtime._spawn_stop(runtime.container(req.task_id))  # a container stopping itself
    else:
        await runtime.stop_task(req.task_id)
    return api_pb2.ContainerStopResponse()


@rpc
async def AppGetLogs(
    ctx: Context, req: api_pb2.AppGetLogsRequest
) -> AsyncIterator[api_pb2.TaskLogsBatch]:
    app = ctx.state.apps.get(req.app_id) if req.app_id else None
    if ctx.runtime is None:
        yield api_pb2.TaskLogsBatch(app_done=True)
        return
    logs = ctx.runtime.logs
    after = _entry(req.last_entry_id)
    deadline = time.monotonic() + min(max(req.timeout, 0.0), MAX_OUTPUT_WAIT)
    function_id = _function_of_scope(ctx, req)
    while True:
        entries = [
            e
            for e in _visible(ctx, logs.since(after, req.app_id, function_id, req.task_id))
            if not req.file_descriptor or e.fd == req.file_descriptor
        ]
        if entries:
            for e in entries:
                yield api_pb2.TaskLogsBatch(
                    task_id=e.task_id,
                    function_id=e.function_id,
                    entry_id=f"{e.entry_id}-0",
                    items=[
                        api_pb2.TaskLogs(
                            data=e.data,
                            timestamp=e.timestamp,
                            file_descriptor=e.fd,
                            container_id=e.task_id,
                        )
                    ],
                )
            return
        if app is not None:
            app = ctx.state.apps.get(app.id)
            if app.state == "stopped" and not ctx.runtime.tasks_of_app(app.id):
                yield api_pb2.TaskLogsBatch(app_done=True)
                return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        await logs.wait(min(remaining, 1.0))


def _in_range(ts: float, since: Any, until: Any) -> bool:
    lo = since.seconds + since.nanos / 1e9 if since.seconds or since.nanos else 0.0
    hi = until.seconds + until.nanos / 1e9 if until.seconds or until.nanos else float("inf")
    return lo <= ts < hi


def _function_of_scope(ctx: Context, req: Any) -> str:
    """The function whose logs the request asks for: its `function_id`, or the function of
    its `function_call_id` (logs carry no input ids here, so a call's scope is its function's
    containers, never wider). Before, a request with only a `function_call_id` was not
    filtered at all and returned every environment's lines (issue 32 item 4)."""
    call_id = str(getattr(req, "function_call_id", "") or "")
    if not call_id:
        return str(req.function_id)
    call = ctx.runtime.calls.get(call_id) if ctx.runtime is not None else None
    if call is None:
        raise NotFound(
            f"Function call {call_id!r} not found (finished calls are kept only while their "
            "results are; ask by app_id or function_id instead)."
        )
    if req.function_id and req.function_id != call.function_id:
        raise InvalidArgument(
            f"function_call_id {call_id!r} is a call of function {call.function_id}, not of "
            f"function_id {req.function_id!r}; send one of them."
        )
    return str(call.function_id)


def _visible(ctx: Context, entries: list[Any]) -> list[Any]:
    """Only the lines of apps in environments where the caller may read (the Owner: all)."""
    if ctx.identity is None:
        return entries
    readable: dict[str, bool] = {}
    kept = []
    for e in entries:
        if e.app_id not in readable:
            try:
                readable[e.app_id] = ctx.may_read(ctx.state.apps.get(e.app_id).env_id)
            except EmulatorError:  # the app is gone: its lines are nobody's to read now
                readable[e.app_id] = False
        if readable[e.app_id]:
            kept.append(e)
    return kept


def _matching(ctx: Context, req: Any) -> list[Any]:
    if ctx.runtime is None:
        return []
    ctx.state.apps.get(req.app_id)
    entries = _visible(
        ctx, ctx.runtime.logs.since(0, req.app_id, _function_of_scope(ctx, req), req.task_id)
    )
    return [
        e
        for e in entries
        if _in_range(e.timestamp, req.since, req.until)
        and (not req.source or e.fd == req.source)
        and (not req.search_text or req.search_text in e.data)
    ]


@rpc
def AppCountLogs(ctx: Context, req: api_pb2.AppCountLogsRequest) -> api_pb2.AppCountLogsResponse:
    """Per-bucket counts of container output (what `modal app logs` asks first)."""
    width = max(req.bucket_secs, 1)
    buckets: dict[int, api_pb2.AppCountLogsResponse.LogBucket] = {}
    for e in _matching(ctx, req):
        start = int(e.timestamp // width * width)
        bucket = buckets.get(start)
        if bucket is None:
            bucket = api_pb2.AppCountLogsResponse.LogBucket()
            bucket.bucket_start_at.FromSeconds(start)
            buckets[start] = bucket
        if e.fd == 1:
            bucket.stdout_logs += 1
        elif e.fd == 2:
            bucket.stderr_logs += 1
        else:
            bucket.system_logs += 1
    return api_pb2.AppCountLogsResponse(
        app_id=req.app_id, buckets=[buckets[k] for k in sorted(buckets)]
    )


@rpc
def AppFetchLogs(ctx: Context, req: api_pb2.AppFetchLogsRequest) -> api_pb2.AppFetchLogsResponse:
    """Container output in a time range (`modal app logs` without --follow)."""
    entries = _matching(ctx, req)
    if req.limit:
        entries = entries[-req.limit :]
    return api_pb2.AppFetchLogsResponse(
        batches=[
            api_pb2.TaskLogsBatch(
                task_id=e.task_id,
                function_id=e.function_id,
                entry_id=f"{e.entry_id}-0",
                items=[
                    api_pb2.TaskLogs(
                        data=e.data,
                        timestamp=e.timestamp,
                        file_descriptor=e.fd,
                        container_id=e.task_id,
                    )
                ],
            )
            for e in entries
        ]
    )
