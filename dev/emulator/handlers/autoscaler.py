"""Runtime autoscaler overrides: `Function.update_autoscaler()` / `Function.autoscaler.update()`
/ `Server.update_autoscaler()` (FunctionUpdateSchedulingParams) and
`Function.autoscaler.settings()` (FunctionGetSchedulingParams), as modal 1.6.4 sends them
(modal/_functions.py `_update_autoscaler`, `_FunctionAutoscalerManager`).

An override is merged field by field over the deployed (decorator) settings and applies at
once: a higher `min_containers` starts containers, a lower one lets idle ones scale down. A
deploy that changes the function's definition drops it, as Modal documents ("Subsequent
deployments of the App containing this Function will reset the autoscaler back to its static
configuration"). Overrides live in the runtime's memory: an emulator restart forgets them.
"""

from __future__ import annotations

from modal_proto import api_pb2

from emulator.errors import InvalidArgument, NotFound
from emulator.handlers.base import Context, rpc
from emulator.handlers.containers import _runtime


def _check(settings: api_pb2.AutoscalerSettings) -> None:
    # The client's own checks (modal/_functions.py `_FunctionAutoscalerManager.update`).
    if settings.HasField("scaledown_window") and not 2 <= settings.scaledown_window <= 3600:
        raise InvalidArgument("scaledown_window must be between 2 and 3600 (inclusive)")


@rpc
def FunctionUpdateSchedulingParams(
    ctx: Context, req: api_pb2.FunctionUpdateSchedulingParamsRequest
) -> api_pb2.FunctionUpdateSchedulingParamsResponse:
    runtime = _runtime(ctx)
    settings = api_pb2.AutoscalerSettings()
    settings.CopyFrom(req.settings)
    if req.warm_pool_size_override and not settings.HasField("min_containers"):
        settings.min_containers = req.warm_pool_size_override  # the older field
    _check(settings)
    try:
        current = runtime.update_autoscaler(req.function_id, settings)
    except KeyError:
        raise NotFound(
            f"Function {req.function_id!r} is not deployed: deploy its app before updating its"
            " autoscaler."
        ) from None
    return api_pb2.FunctionUpdateSchedulingParamsResponse(current_settings=current)


@rpc
def FunctionGetSchedulingParams(
    ctx: Context, req: api_pb2.FunctionGetSchedulingParamsRequest
) -> api_pb2.FunctionGetSchedulingParamsResponse:
    runtime = _runtime(ctx)
    pool = runtime.pools.get(req.function_id)
    if pool is None or pool.retired:
        raise NotFound(f"Function {req.function_id!r} is not deployed.")
    static = runtime.static_autoscaler(pool)
    return api_pb2.FunctionGetSchedulingParamsResponse(
        autoscaler_configuration=api_pb2.AutoscalerConfiguration(
            settings=runtime.effective_autoscaler(pool),
            default_settings=static,
            static_settings=static,
            override_settings=pool.override,
        )
    )
