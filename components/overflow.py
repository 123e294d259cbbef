"""Gateway spillover: in-house servers first, Modal on saturation, back in-house when load falls.

Config (namespace `modal-llm:`, reference in docs/program.md "Gateway overflow"):

    gatewayOverflow:            # service name -> its in-house tier
      chat:
        in_house:
          - name: rack-a        # [a-z0-9-], unique in the stack; key: inHouseApiKeys.rack-a
            api_base: http://10.0.0.5:8000/v1
            capacity: 16        # requests it serves at once before it saturates
            model: qwen-7b      # optional: the in-house server's model name (default: served name)
            timeout_s: 120      # optional: default the service's timeouts.request_s
        cooldown_s: 5           # optional: how long a saturated/failing in-house endpoint rests
        allowed_fails: 1        # optional: 5xx/timeouts it may give per cooldown window
    inHouseApiKeys:   # SECRET: pulumi config set --secret --path 'inHouseApiKeys.rack-a' KEY
                      # (or one secret JSON string: the program receives both forms as JSON)

The map is declared and validated with the rest of the stack config (components/config.py
OverflowInput: its keys, bounds and rules, one error formatter); `parse_overflow()` turns it
into plans and checks them against the in-house keys' names (pure, testable alone);
`load_overflow()` reads the secret keys inside a Pulumi program, only as a secret Output
(their names, which are endpoint names, are checked at once; values are never looked at).
`overflow_document()` renders the LiteLLM proxy config. What each LiteLLM setting does is the
behaviour of litellm 1.106.12 (the version the Makefile installs and the test runs), read in its
source; the module and function are named beside each setting below.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from components.config import (
    OVERFLOW_KEY,
    OVERFLOW_SECRET_KEY,
    ConfigError,
    InHouseInput,
    OverflowInput,
    StackConfig,
)
from components.config_errors import Problem, StackFile, config_error
from components.gateway import GatewayTarget, api_base, litellm_entry

CONFIG_KEY = OVERFLOW_KEY
SECRET_KEY = OVERFLOW_SECRET_KEY
IN_HOUSE_ORDER = 1
MODAL_ORDER = 2


@dataclass(frozen=True)
class ServiceOverflow:
    """The in-house tier in front of one Modal service (keyed by its served model name): the
    service's `gatewayOverflow` entry, each endpoint's `model`, `timeout_s` and `api_base`
    filled in."""

    service: str
    served_model_name: str
    tier: OverflowInput


@dataclass(frozen=True)
class OverflowPlan:
    """Every service's in-house tier plus the in-house keys (a secret Output), if any."""

    services: Mapping[str, ServiceOverflow]  # served model name -> overflow
    api_keys: pulumi.Output[Any] | None = None  # secret {endpoint name: key}


def parse_overflow(cfg: StackConfig, *, key_names: Sequence[str] | None = None) -> OverflowPlan:
    """The stack's validated `gatewayOverflow` (components/config.py OverflowInput) as plans,
    checked against the in-house keys.

    `key_names`: the endpoint names present in the secret `inHouseApiKeys` map (None: the key
    is not set). Every endpoint needs its key there; a key no endpoint uses is an error too.
    """
    ns, by_name = cfg.project, {s.name: s for s in cfg.services}
    services: dict[str, ServiceOverflow] = {}
    for service, entry in cfg.gateway_overflow.items():
        spec = by_name[service].spec  # the model's rule: every overflow names a service
        served = spec.served_model_name
        endpoints = [
            e.model_copy(
                update={
                    "api_base": api_base(e.api_base),
                    "model": e.model or served,
                    "timeout_s": e.timeout_s or spec.timeouts.request_s,
                }
            )
            for e in entry.in_house
        ]
        tier = entry.model_copy(update={"in_house": endpoints})
        services[served] = ServiceOverflow(service, served, tier)
    seen = {e.name for o in services.values() for e in o.tier.in_house}
    present = set(key_names or ())
    problems = [
        Problem(
            ("inHouseApiKeys", name),
            f": in-house endpoint {name!r} of {ns}:{CONFIG_KEY} has no API key",
            fix=f"Set each one encrypted (a keyless server accepts any value): pulumi config "
            f"set --secret --path '{SECRET_KEY}.{name}' <key>",
        )
        for name in sorted(seen - present)
    ] + [
        Problem(
            ("inHouseApiKeys", name),
            f": {ns}:{SECRET_KEY} holds a key for {name!r}, which no in-house endpoint of "
            f"{ns}:{CONFIG_KEY} is named",
            fix=f"Remove it: pulumi config rm --path '{SECRET_KEY}.{name}'",
        )
        for name in sorted(present - seen)
    ]
    if problems:
        where = cfg.stack_file or StackFile.of(cfg.stack)
        raise config_error(problems, stack_file=where, namespace=ns)
    return OverflowPlan(services=services)


def load_overflow(cfg: StackConfig, config: pulumi.Config | None = None) -> OverflowPlan:
    """The stack's overflow plan, with the secret `inHouseApiKeys` as a secret Output.

    load_stack_config has validated `gatewayOverflow` and refused a clear-text
    `inHouseApiKeys`. The CLI hands a map that holds a `--secret --path` value to the program
    as one secret key, decrypted (pulumi sdk/go/common/resource/config/value.go,
    unmarshalValue: an object is secure when any leaf is, `c.secure = hasSecureValue(obj)`;
    Map.SecureKeys lists it). So a leaf set WITHOUT --secret next to one set with it cannot be
    told apart here: the docs say to set every key with --secret. Only the map's names are
    read here, never its values."""
    conf = config or pulumi.Config(cfg.project)
    full_key = f"{conf.name}:{SECRET_KEY}"
    secret_text = pulumi.runtime.get_config(full_key)
    key_names: list[str] | None = None
    if secret_text:
        try:
            names = json.loads(secret_text)
        except json.JSONDecodeError:
            names = None
        if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
            raise ConfigError(
                f"{full_key} must be a map of in-house endpoint name -> API key, set with: "
                f"pulumi config set --secret --path '{SECRET_KEY}.<endpoint name>' <key>"
            )
        key_names = sorted(names)
        del names
    plan = parse_overflow(cfg, key_names=key_names)
    if not plan.services:
        return plan
    return OverflowPlan(services=plan.services, api_keys=conf.require_secret_object(SECRET_KEY))


# ---- rendering ---------------------------------------------------------------------------------


def retry_policy(overflow: ServiceOverflow) -> dict[str, int]:
    """LiteLLM `RetryPolicy` for an overflow model group (router_settings.model_group_retry_policy).

    litellm/router_utils/get_retry_from_policy.py picks the count by exception type. A retry
    runs the pick again (router.py, async_get_healthy_deployments: cooled-down deployments are
    filtered out, then get_order_filtered_deployments keeps the lowest `order` left), and with
    healthy deployments left it does not sleep (router.py `_time_to_sleep_before_retry`). So
    `len(in_house) - 1` retries walk the other in-house endpoints; after that the order-based
    fallback (router.py `async_function_with_fallbacks_common_utils`, "ORDER-BASED FALLBACKS")
    sends the request to the next `order`, Modal. Timeouts are never retried: the in-house
    timeout has been spent already (the fallback goes to Modal), and on Modal one covers a
    cold start plus the longest request. Client errors (400/401/content policy) are final.
    """
    walk = len(overflow.tier.in_house) - 1
    return {
        "RateLimitErrorRetries": walk,
        "InternalServerErrorRetries": walk,
        "ServiceUnavailableErrorRetries": walk,
        "TimeoutErrorRetries": 0,
        "BadRequestErrorRetries": 0,
        "AuthenticationErrorRetries": 0,
        "ContentPolicyViolationErrorRetries": 0,
        "NotFoundErrorRetries": 0,
        "DefaultRetries": walk,
    }


def in_house_entry(
    overflow: ServiceOverflow, endpoint: InHouseInput, api_key: str
) -> dict[str, Any]:
    """The LiteLLM deployment of one in-house endpoint: first in line, capped, quick to rest.

    - `order: 1` (litellm/utils.py get_order_filtered_deployments): the lowest order among the
      deployments not in cooldown serves; Modal has order 2.
    - `max_parallel_requests: capacity` (router_utils/client_initalization_utils.py
      MaxParallelRequestsLimit): LiteLLM counts requests in flight to the endpoint and answers
      a 429 RateLimitError itself, without waiting, when it is full; the fallback then sends the
      request to Modal. The count is per LiteLLM process: with several gateway replicas the
      in-house 429 is the signal that remains.
    - `model_info.cooldown_time` (router.py deployment_callback_on_failure: deployment config
      first, then a Retry-After header, then the router default): how long the endpoint rests
      after it saturates or fails; during that time every request goes to Modal, and after it
      traffic drains back in-house.
    - `model_info.allowed_fails_policy` (router_utils/cooldown_handlers.py, deployment-level
      policy first): an in-house 429 rests the endpoint at once (0 allowed); 5xx and timeouts
      `allowed_fails` times per cooldown window before it rests.
    """
    fails = overflow.tier.allowed_fails
    return {
        "model_name": overflow.served_model_name,
        "litellm_params": {
            "model": f"hosted_vllm/{endpoint.model}",
            "api_base": endpoint.api_base,
            "api_key": api_key,
            "timeout": endpoint.timeout_s,
            "order": IN_HOUSE_ORDER,
            "max_parallel_requests": endpoint.capacity,
        },
        "model_info": {
            "id": f"{overflow.served_model_name}/in-house/{endpoint.name}",
            "cooldown_time": overflow.tier.cooldown_s,
            "allowed_fails_policy": {
                "RateLimitErrorAllowedFails": 0,
                "TimeoutErrorAllowedFails": fails,
                "InternalServerErrorAllowedFails": fails,
                "ServiceUnavailableErrorAllowedFails": fails,
                "BadGatewayErrorAllowedFails": fails,
            },
        },
    }


def modal_overflow_entry(target: GatewayTarget) -> dict[str, Any]:
    """The Modal deployment of an overflow group: second in line, never rested, never probed.

    - `order: 2`: it serves only what the in-house tier cannot (see in_house_entry).
    - `model_info.cooldown_time: 0`: router_utils/cooldown_handlers.py `_should_run_cooldown_
      logic` skips cooldown when the time is 0. Modal is the last tier: a rested Modal would
      turn spillover into errors (RouterRateLimitError "no deployments available"), and a
      slow first answer after scale-to-zero is a cold start, not a dead backend.
    - the timeout stays a cold start plus the longest request (components/gateway.py), and the
      Modal-Key/Modal-Secret headers come from the plain entry.
    - `model_info.disable_background_health_check` (set in the plain entry too): no health
      probe ever reaches Modal, each one would start a GPU.
    """
    entry = litellm_entry(target)
    entry["litellm_params"]["order"] = MODAL_ORDER
    entry["model_info"] = {
        "id": f"{target.served_model_name}/modal",
        **entry.get("model_info", {}),
        "cooldown_time": 0,
    }
    return entry


# general_settings of the LiteLLM proxy (litellm/proxy/_types.py ConfigGeneralSettings). Nothing
# may reach a Modal service but client traffic: every request there starts (or keeps up) a GPU.
# - `disable_model_info_refresh`: without it the proxy GETs `<api_base>/v1/models` of every
#   hosted_vllm/openai deployment at start-up and every 300 s (proxy_server.py schedules
#   `refresh_model_info`, llms/openai_like/model_info.py MODEL_INFO_REFRESH_SECONDS), which on
#   Modal is a cold start at every gateway restart and a container that never scales to zero
#   whenever scaledown_window_s >= 300. Seen in tests/program/test_gateway_overflow.py.
# - `background_health_checks: false`: proxy_server.py starts its health loop only when true;
#   said explicitly so that merging this into a config that turns it on is visible.
# - `health_check_skip_disabled_background_models`: an on-demand GET /health skips the
#   deployments with `model_info.disable_background_health_check` (proxy/health_check.py),
#   i.e. Modal. Point load balancers at /health/liveliness, never at /health.
GENERAL_SETTINGS: dict[str, Any] = {
    "disable_model_info_refresh": True,
    "background_health_checks": False,
    "health_check_skip_disabled_background_models": True,
}


def overflow_document(
    targets: Sequence[GatewayTarget],
    plan: OverflowPlan,
    api_keys: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The LiteLLM proxy config: an overflow group per service with an in-house tier, the plain
    Modal entry for the others, and the router/general settings spillover needs."""
    model_list: list[dict[str, Any]] = []
    retry: dict[str, dict[str, int]] = {}
    for target in targets:
        overflow = plan.services.get(target.served_model_name)
        if overflow is None:
            model_list.append(litellm_entry(target))
            continue
        keys = api_keys or {}
        for endpoint in overflow.tier.in_house:
            if endpoint.name not in keys:
                raise ConfigError(
                    f"in-house endpoint {endpoint.name!r} has no API key in {SECRET_KEY}: "
                    f"pulumi config set --secret --path '{SECRET_KEY}.{endpoint.name}' <key>"
                )
            model_list.append(in_house_entry(overflow, endpoint, keys[endpoint.name]))
        model_list.append(modal_overflow_entry(target))
        retry[overflow.served_model_name] = retry_policy(overflow)
    doc: dict[str, Any] = {"model_list": model_list}
    if retry:
        doc["router_settings"] = {"model_group_retry_policy": retry}
    doc["general_settings"] = dict(GENERAL_SETTINGS)
    return doc


def gateway_document(
    targets: pulumi.Output[list[GatewayTarget]], plan: OverflowPlan
) -> pulumi.Output[dict[str, Any]]:
    """The `gateway_config` document as a secret Output (it carries every key it routes with)."""
    if plan.api_keys is None:
        return pulumi.Output.secret(targets.apply(lambda t: overflow_document(t, plan, None)))
    return pulumi.Output.secret(
        pulumi.Output.all(targets, plan.api_keys).apply(
            lambda v: overflow_document(v[0], plan, v[1])
        )
    )
