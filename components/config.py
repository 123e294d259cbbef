"""Typed stack configuration: reads `Pulumi.<stack>.yaml` values and fails early and clearly.

`load_stack_config()` is what `__main__.py` calls; `parse_stack_config()` is the pure part
(a map of raw config strings in, a validated `StackConfig` out) so it can be tested alone.
Every error names the config key, says what is wrong with the value, and gives the
`pulumi config set` command that fixes it. Secret values (HF token, alert webhook) are never
read into this model: `load_stack_config()` returns them separately as Pulumi secret Outputs.

Keys live in the project's namespace (the Pulumi project name, `modal-llm`); scalar keys are
declared with types and defaults in `Pulumi.yaml`, `services` is declared there untyped (Pulumi's
project schema has no object type), the optional maps `gpuPricesUsdPerHour` and
`apiKeyRotation` and the optional CPU / memory rates `cpuPriceUsdPerCoreHour` and
`memoryPriceUsdPerGibHour` (RATE_KEYS: the schema has no number type either) are documented in
docs/program.md.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pulumi
from pydantic import BaseModel, ConfigDict, ValidationError

from components import cost
from components.api_keys import KEY_NAME
from serving.prewarm import ScheduleError, extra_container_hours_per_month, parse_windows
from serving.sizing import cpu_request, memory_request_mib
from serving.spec import ServingSpec
from serving.weights import source_problems as weights_source_problems

PROJECT = "modal-llm"  # the default namespace; programs use pulumi.get_project()
DEFAULT_APP_FILE = "serving/app.py"
HF_TOKEN_SECRET_NAME = "huggingface-token"  # noqa: S105 (a Modal secret name)

# Defaults of the scalar keys; Pulumi.yaml declares the same defaults (a test checks it).
DEFAULTS: dict[str, Any] = {
    "adoptEnvironment": False,
    "managedByAccessStack": False,
    "protectCaches": False,
    "monthlyBudgetUsd": 50,
    "allowOverBudget": False,
    "alertThresholdsPct": [50, 80, 100],
    "requirePinnedRevision": False,
    "apiKeyNames": ["gateway"],
    "proxyTokenRotation": "",
    "appFile": DEFAULT_APP_FILE,
    "hfToken": "",  # secrets: "" means unset
    "alertWebhookUrl": "",
    "alertWatchToken": "",
    "costOverheadPct": 0,  # CPU and memory are priced from the spec's requests (cost.py)
    "engineStandin": False,
}
# Gateway overflow keys (a map and a secret map): parsed and validated by components/overflow.py.
OVERFLOW_KEY, OVERFLOW_SECRET_KEY = "gatewayOverflow", "inHouseApiKeys"
# Credentials of the private S3-compatible store services' `weights` come from (secret JSON map
# AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), kept in the Modal secret below.
WEIGHTS_STORE_KEY = "weightsStoreCredentials"
WEIGHTS_STORE_SECRET_NAME = "weights-store-credentials"  # noqa: S105 (a Modal secret name)
WEIGHTS_STORE_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# Managed mode (issue 23): the access stack (access/, run once by a workspace Owner or Manager)
# owns the environment, its budget and the gateway's proxy token; this stack adopts the
# environment and takes the token "<wk-id>:<ws-secret>" from this secret (default false).
MANAGED_KEY = "managedByAccessStack"
PROXY_TOKEN_KEY = "proxyToken"  # noqa: S105 (a config key name)
SECRET_KEYS = (
    "hfToken",
    "alertWebhookUrl",
    "alertWatchToken",
    OVERFLOW_SECRET_KEY,
    WEIGHTS_STORE_KEY,
    PROXY_TOKEN_KEY,
)
MAP_KEYS = ("gpuPricesUsdPerHour", "apiKeyRotation")
# Per-stack overrides of components/cost.py's CPU and memory rates (like gpuPricesUsdPerHour for
# the GPUs): key -> (default, unit). Not declared in Pulumi.yaml: the CLI's project schema has
# no number type (string, integer, boolean, array), an `integer` would refuse 0.05, and a
# declared key without a default is required; unset means cost.py's constant.
RATE_KEYS: dict[str, tuple[float, str]] = {
    "cpuPriceUsdPerCoreHour": (cost.CPU_USD_PER_CORE_HOUR, "USD per physical CPU core per hour"),
    "memoryPriceUsdPerGibHour": (cost.MEMORY_USD_PER_GIB_HOUR, "USD per GiB of memory per hour"),
}
KNOWN_KEYS = {"environment", "services", *MAP_KEYS} | set(DEFAULTS) | set(SECRET_KEYS)
KNOWN_KEYS |= set(RATE_KEYS)
KNOWN_KEYS |= {OVERFLOW_KEY, MANAGED_KEY}
# Provider keys (namespace `modal:`) that hold credentials: refused when stored in clear.
PROVIDER_SECRET_KEYS = ("modal:tokenSecret",)

_SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_ENV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# Fields the component fills in itself: users must not set them per service.
_MANAGED_SPEC_FIELDS = ("volumes", "secrets", "require_pinned_revision")
# Per-service keys that are not ServingSpec fields: consumed by the program (`weights` is the
# source the ModelWeights resource provisions; the spec gets the volume and path instead).
_SERVICE_ONLY_FIELDS = (
    "name",
    "gated",
    "adopt",
    "weights",
    "warm_schedule",
    "health_gate",
    "task",
)
# Per-service health gate policy (issue 11.3): see resolve_health_gate.
HEALTH_GATE_POLICIES = ("auto", "always", "never")
#: What the served model does (issue 21.7): it picks the health gate's smoke request
#: (components/modal/_gate.py smoke_request): a chat model answers /v1/chat/completions, a base
#: model without a chat template /v1/completions, an embedding model /v1/embeddings.
SERVICE_TASKS = ("chat", "completion", "embedding")
# Where a Modal server counts as local (the emulator): the stand-in engine runs only there.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MODAL_SERVER_URL_KEY = "modal:serverUrl"  # components/modal/_base.py CONFIG_SERVER_URL


class ConfigError(ValueError):
    """A stack config value is missing or invalid. The message says which key and how to fix."""


class ServiceSettings(BaseModel):
    """One model served by the stack: its name, rendered ServingSpec and cost estimate."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    spec: ServingSpec
    cost: cost.ServiceCost
    gated: bool = False
    #: Where ModelWeights fills `<name>-weights` from at `pulumi up` (serving/weights.py source
    #: map), or None: the engine downloads `model` at its first cold start.
    weights_source: dict[str, Any] | None = None
    #: Scheduled pre-warm windows (serving/prewarm.py), applied by `<name>-prewarm`; [] = none.
    warm_schedule: list[dict[str, Any]] = []
    #: Take over this service's Modal objects that already exist (its App, cache volumes,
    #: API-key secret) instead of failing with "already exists"; destroy leaves them.
    adopt: bool = False
    #: Health gate policy (`auto | always | never`) and what it resolved to for this stack.
    health_gate: str = "auto"
    gate_enabled: bool = False
    gate_reason: str = ""
    #: Upper bound of what one gated deploy costs (0 unless it cold-starts a container).
    gated_deploy_usd: float = 0.0
    #: What the model serves (SERVICE_TASKS): picks the health gate's smoke request.
    task: str = "chat"

    @property
    def gpus(self) -> tuple[str, ...]:
        return _gpu_tuple(self.spec.gpu)


class StackConfig(BaseModel):
    """The validated configuration of one stack."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    project: str
    stack: str
    environment: str
    adopt_environment: bool
    protect_caches: bool
    monthly_budget_usd: float
    allow_over_budget: bool
    alert_thresholds: list[float]  # fractions of the budget, e.g. [0.5, 0.8, 1.0]
    require_pinned_revision: bool
    api_key_names: list[str]
    api_key_rotation: dict[str, str]
    proxy_token_rotation: str
    app_file: str
    has_hf_token: bool
    has_alert_webhook: bool
    has_weights_store: bool = False
    gpu_prices: dict[str, float]
    cost_overhead_pct: float
    #: The CPU and memory rates the cost figures use (RATE_KEYS: override, else cost.py's).
    cpu_usd_per_core_hour: float = cost.CPU_USD_PER_CORE_HOUR
    memory_usd_per_gib_hour: float = cost.MEMORY_USD_PER_GIB_HOUR
    services: list[ServiceSettings]
    cost: cost.StackCost
    budget_warning: str | None = None
    engine_standin: bool = False  # serving/standin_engine.py instead of vLLM/SGLang (local only)
    #: Managed mode (`managedByAccessStack`): the access stack owns the environment, its
    #: budget and the proxy token; this stack adopts the environment and creates neither a
    #: SpendAlert nor a ProxyAuthToken, so its deploy token needs no Owner's right.
    managed_by_access_stack: bool = False


@dataclass(frozen=True)
class StackSecrets:
    """Secret config values, kept as Pulumi secret Outputs (never plain strings)."""

    hf_token: pulumi.Output[str] | None
    alert_webhook_url: pulumi.Output[str] | None
    #: "<token id>:<token secret>" of the spend watcher's service user (viewer in the env)
    alert_watch_token: pulumi.Output[str] | None = None
    #: JSON map of the S3 store's credentials (WEIGHTS_STORE_ENV_KEYS), or None.
    weights_store_credentials: pulumi.Output[str] | None = None
    #: "<token id>:<token secret>" of the gateway's proxy token (managed mode only), or None.
    proxy_token: pulumi.Output[str] | None = None


def _gpu_tuple(gpu: str | list[str]) -> tuple[str, ...]:
    return (gpu,) if isinstance(gpu, str) else tuple(gpu)


def _key(ns: str, key: str) -> str:
    return f"{ns}:{key}"


class _Reader:
    """Typed access to raw config strings, raising ConfigError that names the key."""

    def __init__(self, values: Mapping[str, str | None], ns: str) -> None:
        self.values = values
        self.ns = ns

    def raw(self, key: str) -> str | None:
        return self.values.get(key)

    def string(self, key: str, *, required: bool = False, example: str = "") -> str | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise ConfigError(
                    f"{_key(self.ns, key)} is not set. Set it with: "
                    f"pulumi config set {_key(self.ns, key)} {example}".rstrip()
                )
            default = DEFAULTS.get(key)
            return default if isinstance(default, str) else None
        return value

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if value is None:
            return bool(DEFAULTS[key])
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(
            f"{_key(self.ns, key)} = {value!r} is not a boolean. Set it with: "
            f"pulumi config set {_key(self.ns, key)} true   (or false)"
        )

    def number(self, key: str, *, minimum: float = 0.0) -> float:
        value = self.raw(key)
        if value is None:
            return float(DEFAULTS[key])
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not number >= minimum:  # also rejects NaN
            raise ConfigError(
                f"{_key(self.ns, key)} = {value!r} must be a number >= {minimum:g}. "
                f"Set it with: pulumi config set {_key(self.ns, key)} {DEFAULTS[key]}"
            )
        return number

    def json_value(self, key: str, example: str) -> Any:
        value = self.raw(key)
        if value is None:
            return DEFAULTS.get(key)
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{_key(self.ns, key)} is not valid structured config ({exc.msg}). "
                f"Write it as YAML in Pulumi.<stack>.yaml, or e.g.: "
                f"pulumi config set --path '{key}{example}'"
            ) from exc


def _string_list(
    r: _Reader, key: str, pattern: re.Pattern[str], what: str, example: str
) -> list[str]:
    value = r.json_value(key, example)
    ok = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    if not ok:
        raise ConfigError(
            f"{_key(r.ns, key)} = {value!r} must be a non-empty list of {what}. "
            f"Set it in Pulumi.<stack>.yaml, e.g. {key}: {example}"
        )
    bad = [v for v in value if not pattern.match(v)]
    if bad or len(set(value)) != len(value):
        raise ConfigError(
            f"{_key(r.ns, key)}: {what} must be unique and match {pattern.pattern}; "
            f"got {value!r}. Example: {key}: {example}"
        )
    return list(value)


def _thresholds(r: _Reader) -> list[float]:
    """Whole percentages in config; the rule itself is the provider's (`threshold_problem`):
    one rule in one place (issue 14.6)."""
    from components.modal.spend_alert import MAX_THRESHOLD, threshold_problem

    key = "alertThresholdsPct"
    value = r.json_value(key, "[50, 80, 100]")
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(v, int) and not isinstance(v, bool) and threshold_problem(v / 100) is None
            for v in value
        )
    )
    if not ok:
        raise ConfigError(
            f"{_key(r.ns, key)} = {value!r} must be a non-empty list of whole percentages of "
            f"the budget between 1 and {MAX_THRESHOLD * 100:g}, e.g. {key}: [50, 80, 100]"
        )
    return [v / 100 for v in sorted(set(value))]


def _gpu_prices(r: _Reader) -> dict[str, float]:
    key = "gpuPricesUsdPerHour"
    value = r.json_value(key, ".H200 4.54")
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{_key(r.ns, key)} must be a map of GPU name to USD per GPU-hour, "
            f"e.g. {key}: {{H200: 4.54}}; got {value!r}"
        )
    try:
        return cost.price_table(value)
    except cost.UnknownGpuPrice as exc:
        raise ConfigError(f"{_key(r.ns, key)}: {exc}") from exc


def _rate(r: _Reader, key: str, stack: str) -> float:
    """`cpuPriceUsdPerCoreHour` / `memoryPriceUsdPerGibHour` (RATE_KEYS): a finite number >= 0,
    not a boolean, like a gpuPricesUsdPerHour entry; unset: components/cost.py's rate."""
    default, unit = RATE_KEYS[key]
    value = r.raw(key)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not (math.isfinite(number) and number >= 0):  # also rejects NaN; "true" is no float
        boolean = ", not a boolean" if value.strip().lower() in ("true", "false") else ""
        raise ConfigError(
            f"{_key(r.ns, key)} = {value!r} must be a number >= 0{boolean} ({unit}; unset, "
            f"it is Modal's rate {default:g} from components/cost.py). Fix it in "
            f"Pulumi.{stack}.yaml with: pulumi config set {_key(r.ns, key)} {default:g} "
            f"--stack {stack}   (or pulumi config rm {_key(r.ns, key)} --stack {stack} for the "
            f"default)"
        )
    return number


def _api_key_rotation(r: _Reader, key_names: list[str]) -> dict[str, str]:
    key = "apiKeyRotation"
    value = r.json_value(key, ".gateway 2026-12-01")
    if value is None:
        return {}
    ok = isinstance(value, dict) and all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value.values()
    )
    if not ok:
        raise ConfigError(
            f"{_key(r.ns, key)} must be a map of API key name to a rotation marker (any text, "
            f"e.g. a date), e.g. {key}: {{gateway: 2026-12-01}}; got {value!r}"
        )
    unknown = sorted(set(value) - set(key_names))
    if unknown:
        raise ConfigError(
            f"{_key(r.ns, key)} names key(s) {', '.join(map(repr, unknown))} that are not in "
            f"{_key(r.ns, 'apiKeyNames')} {key_names!r}; rotation markers apply to those names. "
            f"Fix it with: pulumi config rm --path '{key}.{unknown[0]}'"
        )
    return {str(k): str(v) for k, v in value.items()}


def _fix_hint(ns: str, path: str) -> str:
    return (
        f"Fix {ns}:services in Pulumi.<stack>.yaml "
        f"(or: pulumi config set --path 'services{path}' <value>)."
    )


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def weights_source(
    ns: str, index: int, entry: dict[str, Any], *, has_weights_store: bool
) -> dict[str, Any] | None:
    """The service's `weights` block as a ModelWeights source map (None when absent).

    `kind: hf` takes `repo` and `revision` from the service's `model` and `revision` unless
    given; `kind: s3` needs `bucket`, `prefix` and a `revision` label, and the stack secret
    `weightsStoreCredentials`."""
    where = f"{ns}:services[{index}].weights"
    block = entry.get("weights")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ConfigError(
            f"{where} must be a map, e.g. weights: {{kind: hf}} (the service's model at its "
            f"pinned revision) or {{kind: s3, bucket: b, prefix: models/x/v3/, revision: v3}}. "
            + _fix_hint(ns, f"[{index}].weights")
        )
    source = dict(block)
    if source.get("kind") == "hf":
        source.setdefault("repo", entry.get("model"))
        source.setdefault("revision", entry.get("revision"))
    problems = weights_source_problems(source)
    if problems:
        raise ConfigError(f"{where}: {'; '.join(problems)}. " + _fix_hint(ns, f"[{index}].weights"))
    if source["kind"] == "s3" and not has_weights_store:
        raise ConfigError(
            f"{where} reads from an S3-compatible store, but {ns}:{WEIGHTS_STORE_KEY} is not "
            f"set. Set the store's credentials (kept in the Modal secret "
            f"{WEIGHTS_STORE_SECRET_NAME!r}): pulumi config set --secret {ns}:{WEIGHTS_STORE_KEY} "
            '\'{"AWS_ACCESS_KEY_ID": "...", "AWS_SECRET_ACCESS_KEY": "..."}\''
        )
    return source


def _build_spec(
    ns: str,
    index: int,
    entry: dict[str, Any],
    *,
    has_hf_token: bool,
    require_pinned: bool,
    standin: bool = False,
) -> tuple[str, ServingSpec, bool]:
    where = f"{ns}:services[{index}]"
    name = entry.get("name")
    if not isinstance(name, str) or not _SERVICE_NAME.match(name):
        raise ConfigError(
            f"{where}.name = {name!r}: every service needs a name of lowercase letters, digits "
            f"and dashes (1-40 chars, used for the Modal app, volume and secret names). "
            + _fix_hint(ns, f"[{index}].name")
        )
    for field in _MANAGED_SPEC_FIELDS:
        if field in entry:
            raise ConfigError(
                f"{where}.{field} is set by the program (per service and stack), not in config. "
                f"Remove it from Pulumi.<stack>.yaml"
                + ("; set modal-llm:requirePinnedRevision instead." if "pinned" in field else ".")
            )
    gated = entry.get("gated", False)
    if not isinstance(gated, bool):
        raise ConfigError(
            f"{where}.gated = {gated!r} must be true or false (true: the model is gated on "
            f"Hugging Face and needs {ns}:hfToken). " + _fix_hint(ns, f"[{index}].gated")
        )
    if gated and not has_hf_token:
        raise ConfigError(
            f"{where}.gated is true: the model {entry.get('model')!r} is gated on Hugging Face "
            f"and its weights cannot be downloaded without a token, but {ns}:hfToken is not "
            f"set. Accept the model's license on its Hugging Face page with the account the "
            f"token belongs to, then: pulumi config set --secret {ns}:hfToken hf_..."
        )
    fields = {k: v for k, v in entry.items() if k not in _SERVICE_ONLY_FIELDS}
    fields.setdefault("served_model_name", name)

    revision = fields.get("revision")
    if require_pinned and not (isinstance(revision, str) and _COMMIT_SHA.match(revision)):
        raise ConfigError(
            f"{where}.revision = {revision!r}: this stack sets {ns}:requirePinnedRevision, so "
            f"the model {fields.get('model')!r} must be pinned to a full 40-hex commit sha "
            f"(a branch or tag can move under you). Find it on the model's Hugging Face page "
            f"(Files and versions -> commit history). " + _fix_hint(ns, f"[{index}].revision")
        )

    engine = fields.get("engine", "vllm")
    fields["volumes"] = {"hf_cache": f"{name}-hf-cache", "engine_cache": f"{name}-{engine}-cache"}
    block = entry.get("weights")
    if isinstance(block, dict) and isinstance(block.get("revision") or entry.get("revision"), str):
        # The engine loads the revision's directory on the service's weights volume.
        path = block.get("revision") or entry.get("revision")
        fields["weights"] = {"volume": weights_volume_name(name), "path": path}
    fields["secrets"] = {
        "hf_token": HF_TOKEN_SECRET_NAME if has_hf_token else None,
        "api_keys": f"{name}-api-keys",
    }
    fields["require_pinned_revision"] = require_pinned
    if "engine_standin" in fields and not standin:
        raise ConfigError(
            f"{where}.engine_standin is set, but the stack does not run the stand-in engine. "
            f"Set {ns}:engineStandin: true (local stacks only) or remove {where}.engine_standin."
        )
    if standin:  # {} = the plain stand-in; a service may add e.g. {fail: never-ready}
        fields["engine_standin"] = fields.get("engine_standin") or {}
    try:
        # JSON mode: nested models from plain dicts, exactly as the container reads the spec.
        spec = ServingSpec.model_validate_json(json.dumps(fields))
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(
            f"{where}{_format_loc(tuple(err['loc']))}: {err['msg'].removeprefix('Value error, ')}"
            for err in errors
        )
        first = _format_loc(tuple(errors[0]["loc"])) if errors else ""
        raise ConfigError(f"{problems}. " + _fix_hint(ns, f"[{index}]{first}")) from exc
    return name, spec, gated


def weights_volume_name(service: str) -> str:
    """The Modal volume ModelWeights fills for a service."""
    return f"{service}-weights"


def resolve_health_gate(
    policy: str, min_containers: int, local: bool, gated_deploy_usd: float
) -> tuple[bool, str]:
    """Whether a deploy of this service is health-gated, and why (issue 11.3).

    `always` / `never` say it. `auto` gates a service that keeps a container warm
    (`min_containers >= 1`: a deploy replaces warm containers anyway, so the gate costs
    nothing) and every service on the local stack (`local`: the emulator with the stand-in
    engine, `engineStandin`, which is refused unless the Modal server is local: no bill, and
    an engine that can start without a GPU); a scale-to-zero
    service on Modal is not gated, since the gate's smoke request would pay one cold start per
    deploy (`gated_deploy_usd`, an upper bound from components/cost.py).
    """
    if policy == "always":
        return True, "health_gate: always"
    if policy == "never":
        return False, (
            "health_gate: never (the deploy is not checked; a bad release is found by the"
            " first request)"
        )
    if min_containers >= 1:
        return True, "health_gate: auto, gated (min_containers >= 1 keeps a container warm)"
    if local:
        return True, "health_gate: auto, gated (local stack: a cold start costs nothing)"
    return False, (
        "health_gate: auto, NOT gated: a scale-to-zero service (min_containers 0) would pay one"
        f" cold start per deploy to be gated (up to ${gated_deploy_usd:.2f}: startup timeout +"
        " scale-down window of one container); set health_gate: always to gate it anyway"
    )


#: The schemes modal 1.6.4's client connects with (`modal/_utils/grpc_utils.py` create_channel:
#: http, https, unix; anything else raises "Unknown scheme" at the first call, which the
#: providers would then retry for minutes).
MODAL_URL_SCHEMES = ("http", "https", "unix")


def server_url_problem(url: str) -> str | None:
    """Why `url` (modal:serverUrl / MODAL_SERVER_URL) cannot reach a Modal server, or None.

    A comma-separated list is allowed (the client races them: create_channel_with_fallback);
    each entry must be http(s) with a host and a numeric port, or unix:PATH."""
    entries = [u.strip() for u in url.split(",")]
    for entry in entries:
        where = f"{entry!r}: " if len(entries) > 1 else ""
        parts = urlsplit(entry)
        if parts.scheme not in MODAL_URL_SCHEMES:
            return (
                f"{where}scheme {parts.scheme or '(none)'!r} is not one the Modal client"
                f" speaks ({', '.join(MODAL_URL_SCHEMES)})"
            )
        if parts.scheme == "unix":
            if not parts.path:
                return f"{where}a unix URL needs a socket path"
            continue
        if not parts.hostname:
            return f"{where}no host"
        try:
            port = parts.port
        except ValueError:
            return f"{where}port {parts.netloc.rpartition(':')[2]!r} is not a number (1-65535)"
        if port == 0:
            return f"{where}port 0 cannot be connected to"
    return None


def _check_standin_server(ns: str, stack: str, modal_server_url: str | None) -> None:
    """engineStandin only where the Modal server is local: the stand-in answers every request
    with fixed text, which must never be what a real endpoint serves."""
    urls = [u.strip() for u in (modal_server_url or "").split(",") if u.strip()]
    if urls and all(urlsplit(u).hostname in LOCAL_HOSTS for u in urls):
        return
    where = modal_server_url or "Modal itself (modal:serverUrl is not set)"
    raise ConfigError(
        f"stack {stack!r}: {ns}:engineStandin is true, but this stack's Modal server is "
        f"{where}, not a local one. The stand-in engine (serving/standin_engine.py) runs no "
        f"model and answers with fixed text: it is only for a stack on the local emulator "
        f"(modal:serverUrl: http://127.0.0.1:PORT, e.g. the local stack). To deploy the real "
        f"engine here: pulumi config rm {ns}:engineStandin --stack {stack}"
    )


def parse_stack_config(
    values: Mapping[str, str | None],
    *,
    stack: str,
    namespace: str = PROJECT,
    modal_server_url: str | None = None,
) -> StackConfig:
    """Validate raw config strings (keys without namespace) into a StackConfig.

    `values` holds what `pulumi.Config(namespace).get(key)` returns: strings, with objects and
    lists as JSON. Secret keys only need to be present (their values are not looked at).
    `modal_server_url` is the Modal server the providers will talk to (modal:serverUrl, else
    env MODAL_SERVER_URL); `engineStandin` is refused unless it is local.
    """
    ns = namespace
    unknown = sorted(set(values) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(f'{ns}:{k}' for k in unknown)}; known keys: "
            f"{', '.join(sorted(KNOWN_KEYS))}. Remove them with: pulumi config rm <key>"
        )
    r = _Reader(values, ns)
    environment = r.string("environment", required=True, example="dev")
    assert environment is not None
    if not _ENV_NAME.match(environment):
        raise ConfigError(
            f"{ns}:environment = {environment!r} is not a valid Modal environment name "
            f"(letters, digits, '-' and '_', up to 64). Set it with: "
            f"pulumi config set {ns}:environment dev"
        )
    require_pinned = r.boolean("requirePinnedRevision")
    standin = r.boolean("engineStandin")
    if standin:
        _check_standin_server(ns, stack, modal_server_url)
    has_hf_token = values.get("hfToken") is not None
    has_weights_store = values.get(WEIGHTS_STORE_KEY) is not None
    prices = _gpu_prices(r)
    cpu_rate = _rate(r, "cpuPriceUsdPerCoreHour", stack)
    memory_rate = _rate(r, "memoryPriceUsdPerGibHour", stack)
    overhead_pct = r.number("costOverheadPct")

    entries = r.json_value("services", "[0].model Qwen/Qwen2.5-0.5B-Instruct")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{ns}:services must be a non-empty list of services (one per model), e.g. in "
            f"Pulumi.<stack>.yaml: services: [{{name: chat, engine: vllm, model: "
            f"Qwen/Qwen2.5-0.5B-Instruct, gpu: L4}}]; got {entries!r}"
        )
    settings: list[ServiceSettings] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{ns}:services[{i}] must be a map; got {entry!r}")
        # The weights source first: its errors are clearer than the spec's about its path.
        source = weights_source(ns, i, entry, has_weights_store=has_weights_store)
        name, spec, gated = _build_spec(
            ns, i, entry, has_hf_token=has_hf_token, require_pinned=require_pinned,
            standin=standin,
        )  # fmt: skip
        if any(s.name == name for s in settings):
            raise ConfigError(f"{ns}:services[{i}].name {name!r} is used twice; names are unique")
        if any(s.spec.served_model_name == spec.served_model_name for s in settings):
            raise ConfigError(
                f"{ns}:services[{i}].served_model_name {spec.served_model_name!r} is used twice"
            )
        scaling = spec.scaling
        raw_windows = entry.get("warm_schedule")
        try:
            windows = parse_windows(raw_windows, max_containers=scaling.max_containers)
        except ScheduleError as exc:
            raise ConfigError(
                f"{ns}:services[{i}].{exc}. " + _fix_hint(ns, f"[{i}].warm_schedule")
            ) from None
        try:
            svc_cost = cost.service_cost(
                cost.ServiceCostInput(
                    name=name,
                    gpus=_gpu_tuple(spec.gpu),
                    gpu_count=spec.gpu_count,
                    min_containers=scaling.min_containers,
                    max_containers=scaling.max_containers,
                    buffer_containers=scaling.buffer_containers,
                    region=spec.region,
                    overhead_pct=overhead_pct,
                    warm_extra_hours=extra_container_hours_per_month(
                        windows, scaling.min_containers
                    ),
                    cpu_cores=cpu_request(spec),
                    memory_gib=memory_request_mib(spec) / 1024,
                    cpu_usd_per_core_hour=cpu_rate,
                    memory_usd_per_gib_hour=memory_rate,
                ),
                prices,
            )
        except cost.UnknownGpuPrice as exc:
            raise ConfigError(f"{ns}:services[{i}].gpu: {exc}") from exc
        adopt = entry.get("adopt", False)
        if not isinstance(adopt, bool):
            raise ConfigError(
                f"{ns}:services[{i}].adopt = {adopt!r} must be true or false (true: take over "
                f"this service's Modal app, volumes and key secret if they already exist). "
                + _fix_hint(ns, f"[{i}].adopt")
            )
        policy = entry.get("health_gate", "auto")
        if policy not in HEALTH_GATE_POLICIES:
            raise ConfigError(
                f"{ns}:services[{i}].health_gate = {policy!r} must be one of "
                f"{', '.join(HEALTH_GATE_POLICIES)} (auto: gate when min_containers >= 1 or on "
                f"the local stack). " + _fix_hint(ns, f"[{i}].health_gate")
            )
        task = entry.get("task", "chat")
        if task not in SERVICE_TASKS:
            raise ConfigError(
                f"{ns}:services[{i}].task = {task!r} must be one of {', '.join(SERVICE_TASKS)}"
                " (what the model serves: the health gate sends that kind of request). "
                + _fix_hint(ns, f"[{i}].task")
            )
        gate_usd = cost.gated_deploy_usd(
            svc_cost, spec.timeouts.startup_s, spec.scaling.scaledown_window_s
        )
        gate_on, gate_why = resolve_health_gate(policy, scaling.min_containers, standin, gate_usd)
        settings.append(
            ServiceSettings(
                name=name,
                spec=spec,
                cost=svc_cost,
                gated=gated,
                adopt=adopt,
                weights_source=source,
                warm_schedule=list(raw_windows or []),
                health_gate=policy,
                gate_enabled=gate_on,
                gate_reason=gate_why,
                gated_deploy_usd=gate_usd,
                task=task,
            )
        )

    stack_cost = cost.StackCost(services=tuple(s.cost for s in settings))
    budget = r.number("monthlyBudgetUsd")
    allow_over = r.boolean("allowOverBudget")
    try:
        warning = cost.check_budget(stack_cost, budget, allow_over_budget=allow_over, config_ns=ns)
    except cost.BudgetExceeded as exc:
        raise ConfigError(f"stack {stack!r}: {exc}") from exc

    app_file = r.string("appFile") or DEFAULT_APP_FILE
    key_names = _string_list(r, "apiKeyNames", KEY_NAME, "key names", "[gateway, ci]")
    for i, svc in enumerate(settings):  # a key's own in-flight limit names a key of the stack
        for key in sorted(set(svc.spec.proxy.key_max_in_flight or {}) - set(key_names)):
            raise ConfigError(
                f"{ns}:services[{i}].proxy.key_max_in_flight names key {key!r}, which is not "
                f"in {ns}:apiKeyNames {key_names!r}: name one of those keys, or remove the "
                "entry. " + _fix_hint(ns, f"[{i}].proxy.key_max_in_flight")
            )
    managed = _managed_mode(r, values, stack)
    return StackConfig(
        project=ns,
        stack=stack,
        environment=environment,
        adopt_environment=r.boolean("adoptEnvironment") or managed,
        protect_caches=r.boolean("protectCaches"),
        monthly_budget_usd=budget,
        allow_over_budget=allow_over,
        alert_thresholds=_thresholds(r),
        require_pinned_revision=require_pinned,
        api_key_names=key_names,
        api_key_rotation=_api_key_rotation(r, key_names),
        proxy_token_rotation=r.string("proxyTokenRotation") or "",
        app_file=app_file,
        has_hf_token=has_hf_token,
        has_alert_webhook=values.get("alertWebhookUrl") is not None,
        has_weights_store=has_weights_store,
        gpu_prices=prices,
        cost_overhead_pct=overhead_pct,
        cpu_usd_per_core_hour=cpu_rate,
        memory_usd_per_gib_hour=memory_rate,
        services=settings,
        cost=stack_cost,
        budget_warning=warning,
        engine_standin=standin,
        managed_by_access_stack=managed,
    )


def _managed_mode(r: _Reader, values: Mapping[str, str | None], stack: str) -> bool:
    """`managedByAccessStack` (default false), checked against the keys it changes."""
    ns, raw = r.ns, values.get(MANAGED_KEY)
    if raw is not None and raw.lower() not in ("true", "false"):
        raise ConfigError(
            f"{ns}:{MANAGED_KEY} = {raw!r} is not a boolean. Set it with: "
            f"pulumi config set {ns}:{MANAGED_KEY} true   (or false)"
        )
    managed = raw is not None and raw.lower() == "true"
    has_token = values.get(PROXY_TOKEN_KEY) is not None
    if managed and not has_token:
        raise ConfigError(
            f"stack {stack!r}: {ns}:{MANAGED_KEY} is true, so the gateway's proxy token comes "
            f"from the access stack, but {ns}:{PROXY_TOKEN_KEY} is not set. Set it from the "
            f"access stack's credentials (docs/program.md, Access): pulumi -C access stack "
            f"output credentials --show-secrets --stack <access stack> | jq -r "
            f"'.<environment>.proxy_token' | pulumi config set --secret {ns}:{PROXY_TOKEN_KEY} "
            f"--stack {stack}"
        )
    if has_token and not managed:
        raise ConfigError(
            f"stack {stack!r}: {ns}:{PROXY_TOKEN_KEY} is set, but {ns}:{MANAGED_KEY} is not "
            f"true: this stack creates its own proxy token. Either pulumi config set "
            f"{ns}:{MANAGED_KEY} true (the access stack owns the environment, budget and token), "
            f"or pulumi config rm {ns}:{PROXY_TOKEN_KEY}"
        )
    if managed and values.get("proxyTokenRotation"):
        raise ConfigError(
            f"stack {stack!r}: {ns}:proxyTokenRotation has no effect with {ns}:{MANAGED_KEY}: "
            f"the access stack owns the proxy token. Rotate it there (proxy_token_rotation of "
            f"the environment in modal-llm-access:environments), then set the new "
            f"{ns}:{PROXY_TOKEN_KEY}; and: pulumi config rm {ns}:proxyTokenRotation"
        )
    return managed


def proxy_token_part(token: str, index: int) -> str:
    """Part `index` of "<wk-id>:<ws-secret>" (0: id, 1: secret); the error never shows it."""
    token_id, sep, token_secret = token.partition(":")
    if not sep or not token_id.startswith("wk-") or not token_secret.startswith("ws-"):
        raise ValueError(
            f"{PROJECT}:{PROXY_TOKEN_KEY} must be '<token id>:<token secret>' of the gateway's"
            " proxy token ('wk-...:ws-...', the access stack's credentials output); set it"
            f" again with `pulumi config set --secret {PROXY_TOKEN_KEY} wk-...:ws-...`"
        )
    return (token_id, token_secret)[index]


def _is_secret(full_key: str) -> bool:
    # Under `pulumi up` the secret keys arrive in env PULUMI_CONFIG_SECRET_KEYS; under mocks
    # (and the automation API) through set_all_config.
    return (
        pulumi.runtime.is_config_secret(full_key)
        or full_key in pulumi.runtime.get_config_secret_keys_env()
    )


def _all_config_keys() -> set[str]:
    # Same two sources: PULUMI_CONFIG (a JSON object) under the CLI, set_all_config otherwise.
    return {str(k) for k in pulumi.runtime.config.CONFIG.get()} | {
        str(k) for k in pulumi.runtime.get_config_env()
    }


def load_stack_config(
    config: pulumi.Config | None = None,
    *,
    on_warning: Callable[[str], None] | None = None,
) -> tuple[StackConfig, StackSecrets]:
    """Read and validate the current stack's config (inside a Pulumi program or mocks)."""
    cfg = config or pulumi.Config(pulumi.get_project())
    ns = cfg.name
    values: dict[str, str | None] = {}
    for key in sorted(KNOWN_KEYS - set(SECRET_KEYS)):
        values[key] = cfg.get(key)
    present: dict[str, bool] = {}
    for key in SECRET_KEYS:
        full_key = f"{ns}:{key}"
        # Presence only: the value itself stays inside a secret Output.
        present[key] = bool(pulumi.runtime.get_config(full_key))
        if present[key] and not _is_secret(full_key):
            raise ConfigError(
                f"{full_key} is stored in clear in Pulumi.{pulumi.get_stack()}.yaml. Remove it "
                f"and set it encrypted: pulumi config rm {full_key} && "
                f"pulumi config set --secret {full_key} <value>"
            )
        values[key] = "<secret>" if present[key] else None
    for full_key in PROVIDER_SECRET_KEYS:
        if pulumi.runtime.get_config(full_key) and not _is_secret(full_key):
            raise ConfigError(
                f"{full_key} is stored in clear in Pulumi.{pulumi.get_stack()}.yaml. Remove it "
                f"and keep Modal credentials out of the stack file: pulumi config rm {full_key}, "
                f"then export MODAL_TOKEN_ID / MODAL_TOKEN_SECRET (CI: environment secrets), or "
                f"pulumi config set --secret {full_key} <value>"
            )
    # Surface keys this program does not know (a typo would otherwise be silently ignored).
    for full_key in _all_config_keys():
        prefix, _, key = str(full_key).partition(":")
        if prefix == ns and key not in values:
            values[key] = "<set>"
    # The server the providers use: modal:serverUrl, else env MODAL_SERVER_URL
    # (components/modal/_base.py reads them in the same order).
    server_url = pulumi.runtime.get_config(MODAL_SERVER_URL_KEY) or os.environ.get(
        "MODAL_SERVER_URL"
    )
    if server_url:
        problem = server_url_problem(server_url)
        if problem:
            from_config = bool(pulumi.runtime.get_config(MODAL_SERVER_URL_KEY))
            fix = (
                f"Fix it in Pulumi.{pulumi.get_stack()}.yaml: pulumi config set "
                f"{MODAL_SERVER_URL_KEY} http://127.0.0.1:8790 (the emulator), or pulumi config "
                f"rm {MODAL_SERVER_URL_KEY} for Modal itself"
                if from_config
                else "Fix or unset the MODAL_SERVER_URL environment variable"
            )
            source = MODAL_SERVER_URL_KEY if from_config else "env MODAL_SERVER_URL"
            raise ConfigError(f"{source} = {server_url!r}: {problem}. {fix}.")
    parsed = parse_stack_config(
        {k: v for k, v in values.items() if v is not None},
        stack=pulumi.get_stack(),
        namespace=ns,
        modal_server_url=server_url,
    )
    if parsed.budget_warning:
        (on_warning or pulumi.log.warn)(parsed.budget_warning)
    return parsed, StackSecrets(
        hf_token=cfg.require_secret("hfToken") if present["hfToken"] else None,
        alert_webhook_url=(
            cfg.require_secret("alertWebhookUrl") if present["alertWebhookUrl"] else None
        ),
        alert_watch_token=(
            cfg.require_secret("alertWatchToken") if present["alertWatchToken"] else None
        ),
        weights_store_credentials=(
            cfg.require_secret(WEIGHTS_STORE_KEY) if present[WEIGHTS_STORE_KEY] else None
        ),
        proxy_token=cfg.require_secret(PROXY_TOKEN_KEY) if present[PROXY_TOKEN_KEY] else None,
    )


# ---- the access stack (access/, issue 23): environments, budgets, identities ----------------

ACCESS_PROJECT = "modal-llm-access"
ACCESS_KEY = "environments"
#: Roles an identity may have in its environment; `none`: a service user with no role at all
#: (it may call nothing but ClientHello: the preview identity).
IDENTITY_ROLES = ("contributor", "viewer", "none")
_ACCESS_ENV_FIELDS = (
    "name",
    "monthly_budget_usd",
    "alert_thresholds_pct",
    "adopt",
    "proxy_token_rotation",
    "identities",
)
_IDENTITY_FIELDS = ("name", "role", "rotation", "expires_in_days")
_IDENTITY_NAME = re.compile(r"^[A-Za-z0-9_-]{1,56}$")


class Identity(BaseModel):
    """One service user of an environment and its role there."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: str  # IDENTITY_ROLES
    rotation: str = ""
    expires_in_days: int | None = None


class AccessEnvironment(BaseModel):
    """One environment the access stack owns: budget, gateway token, identities."""

    model_config = ConfigDict(frozen=True)

    name: str
    monthly_budget_usd: float
    alert_thresholds: list[float]  # fractions of the budget
    adopt: bool = False
    proxy_token_rotation: str = ""
    identities: list[Identity] = []


def yaml_line(stack_file: Path | None, full_key: str, path: tuple[int | str, ...]) -> int | None:
    """1-based line of `full_key` → `path` (list indexes, map keys) in a stack file, or of the
    deepest part of it that exists; None when the file cannot be read."""
    import yaml

    if stack_file is None:
        return None
    try:
        root = yaml.compose(stack_file.read_text())
    except (OSError, yaml.YAMLError):
        return None

    def child(node: Any, part: int | str) -> Any:
        if isinstance(node, yaml.MappingNode):
            return next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            return node.value[part] if 0 <= part < len(node.value) else None
        return None

    node = child(root, "config")
    if node is None:
        return None
    node = child(node, full_key)
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        node = child(node, part) if node is not None else None
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def parse_access_config(
    raw: str | None,
    *,
    stack: str,
    namespace: str = ACCESS_PROJECT,
    stack_file: Path | None = None,
) -> list[AccessEnvironment]:
    """Validate `<namespace>:environments` (its JSON, as the CLI hands it to the program).

    Every error names the path (`environments[0].identities[1].role`), the line of the stack
    file it is on when `stack_file` is given, what is wrong and how to fix it."""
    key = f"{namespace}:{ACCESS_KEY}"
    shown = stack_file.name if stack_file is not None else f"Pulumi.{stack}.yaml"

    def fail(path: tuple[int | str, ...], what: str) -> ConfigError:
        line = yaml_line(stack_file, key, path)
        where = key + _format_loc(path)
        at = f" ({shown} line {line})" if line else ""
        return ConfigError(
            f"{where}{at}: {what}. Fix it in {shown} (docs/program.md, 'Access: identities and"
            " the one-time bootstrap')."
        )

    if raw is None:
        raise ConfigError(
            f"{key} is not set: list the environments this stack owns, e.g. in {shown}:"
            f" {key}: [{{name: dev, monthly_budget_usd: 700, identities: [{{name: dev-deploy,"
            " role: contributor}]}]"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise fail((), f"is not valid structured config ({exc.msg})") from None
    if not isinstance(value, list) or not value:
        raise fail((), "must be a non-empty list of environments")
    out: list[AccessEnvironment] = []
    seen_envs: set[str] = set()
    seen_ids: dict[str, tuple[int, int]] = {}
    for i, env in enumerate(value):
        if not isinstance(env, dict):
            raise fail((i,), f"must be a map {{name, monthly_budget_usd, identities}}; got {env!r}")
        unknown = sorted(set(env) - set(_ACCESS_ENV_FIELDS))
        if unknown:
            raise fail(
                (i, unknown[0]),
                f"unknown field(s) {', '.join(unknown)}; an environment has"
                f" {', '.join(_ACCESS_ENV_FIELDS)}",
            )
        name = env.get("name")
        if not isinstance(name, str) or not _ENV_NAME.match(name) or name.startswith("en-"):
            raise fail(
                (i, "name"),
                f"{name!r} is not a valid Modal environment name (letters, digits, '-' and"
                " '_', up to 64, not starting with 'en-')",
            )
        if name in seen_envs:
            raise fail((i, "name"), f"environment {name!r} is listed twice")
        seen_envs.add(name)
        budget = env.get("monthly_budget_usd")
        if (
            isinstance(budget, bool)
            or not isinstance(budget, int | float)
            or not budget >= 0
            or budget != budget
        ):
            raise fail(
                (i, "monthly_budget_usd"),
                f"{budget!r} must be a number of dollars >= 0 (the environment's hard cap on"
                " Modal)",
            )
        path_t: tuple[int | str, ...] = (i, "alert_thresholds_pct")
        thresholds = _access_thresholds(env.get("alert_thresholds_pct"), path_t, fail)
        adopt = env.get("adopt", False)
        if not isinstance(adopt, bool):
            raise fail((i, "adopt"), f"{adopt!r} must be true or false")
        rotation = env.get("proxy_token_rotation", "")
        if isinstance(rotation, bool) or not isinstance(rotation, str | int):
            raise fail((i, "proxy_token_rotation"), "must be a rotation marker (text, e.g. a date)")
        idents = env.get("identities", [])
        if not isinstance(idents, list):
            raise fail((i, "identities"), "must be a list of {name, role}")
        identities: list[Identity] = []
        for j, ident in enumerate(idents):
            identities.append(_identity(ident, (i, "identities", j), fail, seen_ids))
        out.append(
            AccessEnvironment(
                name=name,
                monthly_budget_usd=float(budget),
                alert_thresholds=thresholds,
                adopt=adopt,
                proxy_token_rotation=str(rotation),
                identities=identities,
            )
        )
    return out


def _access_thresholds(
    value: Any,
    path: tuple[int | str, ...],
    fail: Callable[[tuple[int | str, ...], str], ConfigError],
) -> list[float]:
    from components.modal.spend_alert import MAX_THRESHOLD, threshold_problem

    if value is None:
        return [0.5, 0.8, 1.0]
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(v, int) and not isinstance(v, bool) and threshold_problem(v / 100) is None
            for v in value
        )
    )
    if not ok:
        raise fail(
            path,
            f"{value!r} must be a non-empty list of whole percentages of the budget between 1"
            f" and {MAX_THRESHOLD * 100:g}, e.g. [50, 80, 100]",
        )
    return [v / 100 for v in sorted(set(value))]


def _identity(
    ident: Any,
    path: tuple[int | str, ...],
    fail: Callable[[tuple[int | str, ...], str], ConfigError],
    seen: dict[str, tuple[int, int]],
) -> Identity:
    if not isinstance(ident, dict):
        raise fail(
            path, f"must be a map {{name, role, rotation?, expires_in_days?}}; got {ident!r}"
        )
    unknown = sorted(set(ident) - set(_IDENTITY_FIELDS))
    if unknown:
        raise fail(
            (*path, unknown[0]),
            f"unknown field(s) {', '.join(unknown)}; an identity has {', '.join(_IDENTITY_FIELDS)}",
        )
    name = ident.get("name")
    if not isinstance(name, str) or not _IDENTITY_NAME.match(name):
        raise fail(
            (*path, "name"),
            f"{name!r} is not a valid service user name (1-56 of a-z A-Z 0-9 - _; a rotation"
            " appends -<n>)",
        )
    if name in seen:
        i, j = seen[name]
        raise fail(
            (*path, "name"),
            f"{name!r} is already environments[{i}].identities[{j}]: service users are"
            " workspace-wide, so each name is used once",
        )
    seen[name] = (int(path[0]), int(path[2]))
    role = ident.get("role")
    if role not in IDENTITY_ROLES:
        raise fail(
            (*path, "role"),
            f"{role!r} must be one of {', '.join(IDENTITY_ROLES)} (contributor: read and write"
            " in this environment, e.g. CI's deploy; viewer: read only, e.g. the spend watcher;"
            " none: may call nothing, e.g. a preview)",
        )
    rotation = ident.get("rotation", "")
    if isinstance(rotation, bool) or not isinstance(rotation, str | int):
        raise fail((*path, "rotation"), "must be a rotation marker (text, e.g. a date)")
    days = ident.get("expires_in_days")
    if days is not None and (isinstance(days, bool) or not isinstance(days, int) or days < 1):
        raise fail((*path, "expires_in_days"), f"{days!r} must be a whole number of days >= 1")
    return Identity(name=name, role=role, rotation=str(rotation), expires_in_days=days)


def load_access_config(stack_file: Path | None = None) -> list[AccessEnvironment]:
    """The access stack's `environments` (inside its Pulumi program)."""
    cfg = pulumi.Config(pulumi.get_project())
    return parse_access_config(
        cfg.get(ACCESS_KEY), stack=pulumi.get_stack(), namespace=cfg.name, stack_file=stack_file
    )


def access_next_steps(environments: list[AccessEnvironment], stack: str) -> str:
    """Where each credential of the access stack goes: commands, run from the repository root,
    that pipe it from the secret output `credentials` to its place (no secret in this text;
    `pulumi config set` and `gh secret set` read the value from stdin)."""
    lines = [
        "Each credential is in the secret output `credentials`. From the repository root, these"
        " move each one where it is used without printing it (needs jq; gh for GitHub):",
        f"  c() {{ pulumi -C access stack output credentials --show-secrets --stack {stack}"
        ' | jq -er "$1"; }',
    ]
    for env in environments:
        e = env.name
        at = f'.["{e}"]'
        lines += [
            f"[{e}] service stack {e} (managed mode) and GitHub environment {e}:",
            f"  pulumi config set {PROJECT}:{MANAGED_KEY} true --stack {e}",
            f"  c '{at}.proxy_token' | pulumi config set --secret {PROJECT}:{PROXY_TOKEN_KEY}"
            f" --stack {e}   # the gateway's proxy token",
        ]
        for ident in env.identities:
            token = f"c '{at}.identities[\"{ident.name}\"]'"
            if ident.role == "contributor":
                lines += [
                    f"  {token} | cut -d: -f1 | gh secret set MODAL_TOKEN_ID --env {e}"
                    f"   # {ident.name}: contributor in {e}, CI's pulumi up",
                    f"  {token} | cut -d: -f2 | gh secret set MODAL_TOKEN_SECRET --env {e}",
                ]
            elif ident.role == "viewer":
                lines.append(
                    f"  {token} | pulumi config set --secret {PROJECT}:alertWatchToken --stack"
                    f" {e}   # {ident.name}: viewer in {e}, the spend watcher reads usage"
                )
            else:
                lines.append(
                    f"  # {ident.name}: no role, may call nothing; CI's previews need no Modal"
                    f" token at all (a preview never calls Modal): {token}"
                )
    lines.append(
        "After a rotation, move the new token the same way; the old one works until the new one"
        " is used, then `pulumi -C access up --refresh` revokes it."
    )
    return "\n".join(lines)
