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

`parse_overflow()` validates the map against the stack's services (pure, testable alone);
`load_overflow()` reads both keys inside a Pulumi program, the keys only as a secret Output
(their names, which are endpoint names, are checked at once; values are never looked at).
`overflow_document()` renders the LiteLLM proxy config. What each LiteLLM setting does is the
behaviour of litellm 1.106.12 (the version the Makefile installs and the test runs), read in its
source; the module and function are named beside each setting below.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from components.config import OVERFLOW_KEY, OVERFLOW_SECRET_KEY, ConfigError, StackConfig
from components.gateway import GatewayTarget, api_base, litellm_entry

CONFIG_KEY = OVERFLOW_KEY
SECRET_KEY = OVERFLOW_SECRET_KEY
DEFAULT_COOLDOWN_S = 5.0
DEFAULT_ALLOWED_FAILS = 1
IN_HOUSE_ORDER = 1
MODAL_ORDER = 2
_ENDPOINT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_ENTRY_KEYS = {"in_house", "cooldown_s", "allowed_fails"}
_ENDPOINT_KEYS = {"name", "api_base", "capacity", "model", "timeout_s"}


@dataclass(frozen=True)
class InHouseEndpoint:
    """One in-house OpenAI-compatible server (vLLM, SGLang, ...) of a model."""

    name: str
    api_base: str
    capacity: int
    model: str
    timeout_s: int


@dataclass(frozen=True)
class ServiceOverflow:
    """The in-house tier in front of one Modal service (keyed by its served model name)."""

    service: str
    served_model_name: str
    in_house: tuple[InHouseEndpoint, ...]
    cooldown_s: float
    allowed_fails: int


@dataclass(frozen=True)
class OverflowPlan:
    """Every service's in-house tier plus the in-house keys (a secret Output), if any."""

    services: Mapping[str, ServiceOverflow]  # served model name -> overflow
    api_keys: pulumi.Output[Any] | None = None  # secret {endpoint name: key}


def _fix(ns: str, file: str, path: str) -> str:
    return (
        f"Fix {ns}:{CONFIG_KEY} in {file} "
        f"(or: pulumi config set --path '{CONFIG_KEY}{path}' <value>)."
    )


def _positive_int(value: Any, where: str, fix: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where} = {value!r} must be a whole number >= {minimum}. {fix}")
    return value


def _endpoint(
    ns: str, file: str, service: str, index: int, raw: Any, served: str, request_s: int
) -> InHouseEndpoint:
    path = f".{service}.in_house[{index}]"
    where = f"{ns}:{CONFIG_KEY}{path}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a map {{name, api_base, capacity}}; got {raw!r}")
    unknown = sorted(set(raw) - _ENDPOINT_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_ENDPOINT_KEYS))}. {_fix(ns, file, path)}"
        )
    name = raw.get("name")
    if not isinstance(name, str) or not _ENDPOINT_NAME.match(name):
        raise ConfigError(
            f"{where}.name = {name!r}: every in-house endpoint needs a name of lowercase "
            f"letters, digits and dashes (1-40 chars); its API key is {ns}:{SECRET_KEY}.<name>. "
            + _fix(ns, file, f"{path}.name")
        )
    base = raw.get("api_base")
    if not isinstance(base, str) or not re.match(r"^https?://[^/\s]+", base):
        raise ConfigError(
            f"{where}.api_base = {base!r} must be the http(s) URL of the in-house "
            f"OpenAI-compatible server, e.g. http://10.0.0.5:8000/v1. "
            + _fix(ns, file, f"{path}.api_base")
        )
    capacity = _positive_int(
        raw.get("capacity"),
        f"{where}.capacity",
        "Capacity is how many requests the endpoint serves at once before it saturates "
        "(e.g. its engine's max batch). " + _fix(ns, file, f"{path}.capacity"),
    )
    model = raw.get("model", served)
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(
            f"{where}.model = {model!r} must be the model name the in-house server serves "
            f"(omit it to use {served!r}). " + _fix(ns, file, f"{path}.model")
        )
    timeout_s = _positive_int(
        raw.get("timeout_s", request_s), f"{where}.timeout_s", _fix(ns, file, f"{path}.timeout_s")
    )
    return InHouseEndpoint(
        name=name, api_base=api_base(base), capacity=capacity, model=model, timeout_s=timeout_s
    )


def parse_overflow(
    raw: Any, cfg: StackConfig, *, key_names: Sequence[str] | None = None
) -> OverflowPlan:
    """Validate the `gatewayOverflow` map against the stack's services.

    `key_names`: the endpoint names present in the secret `inHouseApiKeys` map (None: the key
    is not set). Every endpoint needs its key there; a key no endpoint uses is an error too.
    """
    ns, file = cfg.project, f"Pulumi.{cfg.stack}.yaml"
    if raw is None or raw == {}:
        if key_names:
            raise ConfigError(
                f"{ns}:{SECRET_KEY} is set but {ns}:{CONFIG_KEY} declares no in-house endpoint. "
                f"Remove it (pulumi config rm {ns}:{SECRET_KEY}) or add the endpoints."
            )
        return OverflowPlan(services={})
    by_name = {s.name: s for s in cfg.services}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{ns}:{CONFIG_KEY} must be a map of service name -> {{in_house: [...]}}; "
            f"got {raw!r}. {_fix(ns, file, '')}"
        )
    services: dict[str, ServiceOverflow] = {}
    seen: set[str] = set()
    for service, entry in raw.items():
        where = f"{ns}:{CONFIG_KEY}.{service}"
        if service not in by_name:
            raise ConfigError(
                f"{where}: no service named {service!r} in {ns}:services (names: "
                f"{', '.join(sorted(by_name))}). " + _fix(ns, file, f".{service}")
            )
        settings = by_name[service]
        if not isinstance(entry, dict) or not isinstance(entry.get("in_house"), list):
            raise ConfigError(
                f"{where} must be a map with a non-empty list in_house: [{{name, api_base, "
                f"capacity}}]; got {entry!r}. " + _fix(ns, file, f".{service}.in_house")
            )
        unknown = sorted(set(entry) - _ENTRY_KEYS)
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(_ENTRY_KEYS))}. " + _fix(ns, file, f".{service}")
            )
        if not entry["in_house"]:
            raise ConfigError(
                f"{where}.in_house is empty. " + _fix(ns, file, f".{service}.in_house")
            )
        served = settings.spec.served_model_name
        endpoints = tuple(
            _endpoint(ns, file, service, i, e, served, settings.spec.timeouts.request_s)
            for i, e in enumerate(entry["in_house"])
        )
        for e in endpoints:
            if e.name in seen:
                raise ConfigError(
                    f"{where}: in-house endpoint name {e.name!r} is used twice; names are "
                    f"unique in the stack (each has its own key). " + _fix(ns, file, f".{service}")
                )
            seen.add(e.name)
        cooldown = entry.get("cooldown_s", DEFAULT_COOLDOWN_S)
        ok = isinstance(cooldown, int | float) and not isinstance(cooldown, bool)
        if not ok or not math.isfinite(cooldown) or cooldown < 1:
            raise ConfigError(
                f"{where}.cooldown_s = {cooldown!r} must be a number of seconds >= 1 (0 would "
                f"disable LiteLLM's cooldown of the in-house endpoint and keep sending it work "
                f"it refuses). " + _fix(ns, file, f".{service}.cooldown_s")
            )
        allowed = _positive_int(
            entry.get("allowed_fails", DEFAULT_ALLOWED_FAILS),
            f"{where}.allowed_fails",
            _fix(ns, file, f".{service}.allowed_fails"),
            minimum=0,
        )
        services[served] = ServiceOverflow(
            service=service,
            served_model_name=served,
            in_house=endpoints,
            cooldown_s=float(cooldown),
            allowed_fails=allowed,
        )
    present = set(key_names or ())
    missing = [n for n in sorted(seen) if n not in present]
    if missing:
        raise ConfigError(
            f"in-house endpoint(s) {', '.join(map(repr, missing))} of {ns}:{CONFIG_KEY} have no "
            f"API key. Set each one encrypted (a keyless server accepts any value): "
            f"pulumi config set --secret --path '{SECRET_KEY}.{missing[0]}' <key>"
        )
    extra = sorted(present - seen)
    if extra:
        raise ConfigError(
            f"{ns}:{SECRET_KEY} holds key(s) for {', '.join(map(repr, extra))}, which no "
            f"in-house endpoint of {ns}:{CONFIG_KEY} is named. Remove them: "
            f"pulumi config rm --path '{SECRET_KEY}.{extra[0]}'"
        )
    return OverflowPlan(services=services)


def load_overflow(cfg: StackConfig, config: pulumi.Config | None = None) -> OverflowPlan:
    """Read `gatewayOverflow` and the secret `inHouseApiKeys` of the current stack."""
    conf = config or pulumi.Config(cfg.project)
    ns = conf.name
    raw_text = conf.get(CONFIG_KEY)
    try:
        raw = json.loads(raw_text) if raw_text else None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{ns}:{CONFIG_KEY} is not valid structured config ({exc.msg}). Write it as YAML in "
            f"Pulumi.{pulumi.get_stack()}.yaml."
        ) from exc
    full_key = f"{ns}:{SECRET_KEY}"
    # The CLI hands a map that holds a `--secret --path` value to the program as one secret
    # key, decrypted (pulumi sdk/go/common/resource/config/value.go, unmarshalValue: an object
    # is secure when any leaf is, `c.secure = hasSecureValue(obj)`; Map.SecureKeys lists it).
    # So a leaf set WITHOUT --secret next to one set with it cannot be told apart here: the
    # docs say to set every key with --secret. Only the map's names are read here.
    secret_text = pulumi.runtime.get_config(full_key)
    key_names: list[str] | None = None
    if secret_text:
        # Same check as components/config.py does for its secret keys.
        is_secret = (
            pulumi.runtime.is_config_secret(full_key)
            or full_key in pulumi.runtime.get_config_secret_keys_env()
        )
        if not is_secret:
            raise ConfigError(
                f"{full_key} is stored in clear in Pulumi.{pulumi.get_stack()}.yaml. Remove it "
                f"(pulumi config rm {full_key}) and set each key encrypted: "
                f"pulumi config set --secret --path '{SECRET_KEY}.<endpoint name>' <key>"
            )
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
    plan = parse_overflow(raw, cfg, key_names=key_names)
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
    walk = len(overflow.in_house) - 1
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
    overflow: ServiceOverflow, endpoint: InHouseEndpoint, api_key: str
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
    fails = overflow.allowed_fails
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
            "cooldown_time": overflow.cooldown_s,
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
        for endpoint in overflow.in_house:
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
