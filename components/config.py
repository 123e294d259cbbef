"""Typed stack configuration: `Pulumi.<stack>.yaml`'s keys as pydantic models.

`StackSettings` declares every key of the project's namespace once (its stack-file name as the
alias, its type, default, bounds and description); `ServiceInput` one entry of `services`
(its own keys; the rest are `serving.spec.ServingSpec`'s); the cross-field rules are model
validators. `parse_stack_config()` is the pure part (a map of raw config strings in, a
validated `StackConfig` out: the settings plus each service's spec, cost and health gate);
`load_stack_config()` is what `__main__.py` calls. Every error goes through one formatter
(components/config_errors.py): the real stack file, `file:line:col`, the key path, the value,
what is allowed, a "did you mean" for unknown keys. Secret values (HF token, alert webhook,
...) are never read into the model, only whether they are set: `load_stack_config()` returns
them separately as Pulumi secret Outputs.

Where defaults live: the scalar keys' defaults are the fields' defaults below, and Pulumi.yaml
declares the same (the CLI's schema needs them; a test checks they agree); the CPU / memory
rates default to components/cost.py's constants; every per-service default (`timeouts.
startup_s`, `scaling`, ...) is ServingSpec's (serving/spec.py), never repeated here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import pulumi
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    RootModel,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from components import cost
from components.api_keys import KEY_NAME
from components.config_errors import (
    ConfigError,
    PassesTo,
    Problem,
    RuleError,
    StackFile,
    allowed_keys,
    config_error,
    did_you_mean,
    path_text,
    problem_line,
    problems_from,
    rule,
    split_path,
    unknown_key_text,
)
from components.modal.defaults import GATE_TASK
from serving.prewarm import ScheduleError, extra_container_hours_per_month, parse_windows
from serving.sizing import cpu_request, memory_request_mib
from serving.spec import COMMIT_SHA_RE, GPU_TYPES, ServingSpec, canonical_gpu
from serving.weights import source_problems as weights_source_problems

__all__ = ["ConfigError"]  # re-exported: callers catch it from here

PROJECT = "modal-llm"  # the default namespace; programs use pulumi.get_project()
DEFAULT_APP_FILE = "serving/app.py"
HF_TOKEN_SECRET_NAME = "huggingface-token"  # noqa: S105 (a Modal secret name)
WEIGHTS_STORE_SECRET_NAME = "weights-store-credentials"  # noqa: S105 (a Modal secret name)
WEIGHTS_STORE_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# Provider keys (namespace `modal:`) that hold credentials: refused when stored in clear.
PROVIDER_SECRET_KEYS = ("modal:tokenSecret",)
# Where a Modal server counts as local (the emulator): the stand-in engine runs only there.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MODAL_SERVER_URL_KEY = "modal:serverUrl"  # components/modal/_base.py CONFIG_SERVER_URL

_ENV_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_SECRET: JsonDict = {"secret": True}  # json_schema_extra of a key whose value is never read


def _secret(key: str) -> Any:
    """A secret key of the stack file: the model holds whether it is set, never its value."""
    return Field(False, alias=key, json_schema_extra=_SECRET)


# ---- value types: how the CLI hands values over, and their shared rules ---------------------


def _cli_bool(value: Any) -> Any:
    """The CLI passes booleans as "true" / "false"; anything else stays for the strict check."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def _from_json(value: Any) -> Any:
    """Objects and lists reach the program as JSON text (pulumi.Config.get)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"is not valid structured config ({exc.msg}); write it as YAML in the stack file"
        ) from None


def _present(value: Any) -> bool:
    return value is not None and value != ""


def _marker(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _thresholds(value: list[int]) -> list[int]:
    """Whole percentages; the rule itself is the provider's (`threshold_problem`): one rule in
    one place (issue 14.6)."""
    from components.modal.spend_alert import MAX_THRESHOLD, threshold_problem

    if not value or any(threshold_problem(v / 100) for v in value):
        raise ValueError(
            f"must be a non-empty list of whole percentages of the budget between 1 and "
            f"{MAX_THRESHOLD * 100:g}, e.g. [50, 80, 100]"
        )
    return value


def _unique(value: list[str]) -> list[str]:
    if len(set(value)) != len(value):
        raise ValueError("must not name a key twice")
    return value


def _gpu_name(value: str) -> str:
    """Modal's spelling of a GPU name (case-insensitive): an unknown name is an error, never
    a silently unused new row of the price table."""
    name = canonical_gpu(value)
    if name is None:
        hint = did_you_mean(value, list(GPU_TYPES))
        raise ValueError(
            "is not a Modal GPU type, so this price would never be used"
            + (hint or f"; Modal's GPU types are: {', '.join(GPU_TYPES)}")
        )
    return name


CliBool = Annotated[StrictBool, BeforeValidator(_cli_bool)]
GpuName = Annotated[str, AfterValidator(_gpu_name)]
Present = Annotated[bool, BeforeValidator(_present)]
Marker = Annotated[StrictStr, BeforeValidator(_marker)]
Thresholds = Annotated[list[Annotated[int, Field(strict=True)]], AfterValidator(_thresholds)]


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # lax float takes true as 1.0: a price is never a boolean
        raise ValueError("must be a number, not a boolean")
    return value


Dollars = Annotated[float, Field(ge=0, allow_inf_nan=False), BeforeValidator(_not_bool)]


# ---- one service entry ------------------------------------------------------------------------


class ServiceInput(PassesTo, BaseModel):
    """One entry of `services`: its own keys here; every other key is a ServingSpec field."""

    model_config = ConfigDict(extra="allow", frozen=True, arbitrary_types_allowed=True)
    passes_to: ClassVar[type[BaseModel]] = ServingSpec
    #: ServingSpec fields the program fills in per service and stack: not set in config.
    not_passed: ClassVar[tuple[str, ...]] = ("volumes", "secrets", "require_pinned_revision")

    name: StrictStr = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
        description="lowercase letters, digits and dashes, 1-40 chars: the Modal app, volume "
        "and secret names",
    )
    gated: StrictBool = Field(
        False, description="true: the model is gated on Hugging Face and needs hfToken"
    )
    adopt: StrictBool = Field(
        False,
        description="true: take over this service's Modal app, volumes and key secret if they "
        "already exist",
    )
    #: Where ModelWeights fills `<name>-weights` from (serving/weights.py source map).
    weights: dict[str, Any] | None = Field(
        None, description="e.g. {kind: hf} or {kind: s3, bucket, prefix, revision}"
    )
    #: Scheduled pre-warm windows (serving/prewarm.py parse_windows checks them).
    warm_schedule: list[Any] = Field(
        default_factory=list, description="windows {cron, duration_minutes, min_containers}"
    )
    health_gate: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: gate when min_containers >= 1 or on the local stack"
    )
    #: What the served model does (issue 21.7): picks the health gate's smoke request
    #: (components/modal/_gate.py smoke_request). The Literal spells GATE_TASKS out for the
    #: type checker (tests/program/test_config_model.py holds them equal).
    task: Literal["chat", "completion", "embedding"] = Field(
        GATE_TASK, description="what the model serves: the health gate sends that kind of request"
    )

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: ModelWrapValidatorHandler[ServiceInput]) -> Any:
        """The entry's own problems and its unknown keys (not its own, not ServingSpec's)
        together, so one run names them all."""
        problems: list[Problem] = []
        allowed = allowed_keys(cls, ()) or []
        for key in data if isinstance(data, dict) else ():
            if key in cls.not_passed:
                pinned = "pinned" in key
                problems.append(
                    Problem(
                        (key,),
                        "is set by the program (per service and stack), not in config",
                        fix="Remove it from the stack file"
                        + (" and set requirePinnedRevision instead." if pinned else "."),
                    )
                )
            elif key not in allowed:
                problems.append(Problem((key,), unknown_key_text(key, allowed)))
        try:
            entry = handler(data)
        except ValidationError as exc:
            raise RuleError(*problems, *problems_from(exc, cls)) from None
        if problems:
            raise RuleError(*problems)
        return entry

    @model_validator(mode="after")
    def _weights_source(self) -> ServiceInput:
        if self.weights is not None:
            problems = weights_source_problems(self.source())
            if problems:
                raise rule(("weights",), ": " + "; ".join(problems))
        return self

    def spec_fields(self) -> dict[str, Any]:
        """The entry's ServingSpec keys (everything that is not a key of its own)."""
        return dict(self.model_extra or {})

    def source(self) -> dict[str, Any] | None:
        """`weights` as a ModelWeights source map: `kind: hf` takes `repo` and `revision` from
        the service's `model` and `revision` unless given; None when absent."""
        if self.weights is None:
            return None
        source = dict(self.weights)
        if source.get("kind") == "hf":
            source.setdefault("repo", self.spec_fields().get("model"))
            source.setdefault("revision", self.spec_fields().get("revision"))
        return source


# ---- gateway overflow (components/overflow.py renders it) -------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class InHouseInput(_Strict):
    """One in-house OpenAI-compatible server (vLLM, SGLang, ...) in front of a service."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
        description="lowercase letters, digits and dashes, 1-40 chars, unique in the stack; "
        "its API key is inHouseApiKeys.<name>",
    )
    api_base: str = Field(
        pattern=r"^https?://[^/\s]+",
        description="the http(s) URL of the in-house OpenAI-compatible server, e.g. "
        "http://10.0.0.5:8000/v1",
    )
    capacity: int = Field(
        ge=1,
        description="how many requests the endpoint serves at once before it saturates "
        "(e.g. its engine's max batch)",
    )
    model: (
        Annotated[
            str, Field(pattern=r"\S", description="omit it for the service's served model name")
        ]
        | None
    ) = None
    timeout_s: (
        Annotated[int, Field(ge=1, description="omit it for the service's timeouts.request_s")]
        | None
    ) = None


class OverflowInput(_Strict):
    """`gatewayOverflow.<service>`: the in-house tier LiteLLM tries before Modal."""

    in_house: Annotated[list[InHouseInput], Field(min_length=1)]
    cooldown_s: float = Field(
        5.0,
        ge=1,
        allow_inf_nan=False,
        description="seconds a saturated or failing in-house endpoint rests (0 would disable "
        "LiteLLM's cooldown and keep sending it work it refuses)",
    )
    allowed_fails: int = Field(1, ge=0, description="5xx/timeouts it may give per cooldown window")


# ---- the stack's keys -------------------------------------------------------------------------


class StackSettings(BaseModel):
    """Every key of the project's namespace in `Pulumi.<stack>.yaml`, declared once."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    environment: StrictStr = Field(
        pattern=_ENV_NAME,
        description="the Modal environment: letters, digits, '-' and '_', up to 64",
        examples=["dev"],
    )
    service_entries: Annotated[
        list[ServiceInput], BeforeValidator(_from_json), Field(min_length=1)
    ] = Field(
        alias="services",
        description="one entry per model, e.g. [{name: chat, engine: vllm, model: "
        "Qwen/Qwen2.5-0.5B-Instruct, gpu: L4}]",
    )
    adopt_environment: CliBool = Field(False, alias="adoptEnvironment")
    #: Managed mode (issue 23): the access stack owns the environment, its budget and the
    #: gateway's proxy token; this stack adopts the environment and takes the token
    #: "<wk-id>:<ws-secret>" from the secret proxyToken.
    managed_by_access_stack: CliBool = Field(False, alias="managedByAccessStack")
    protect_caches: CliBool = Field(False, alias="protectCaches")
    monthly_budget_usd: Dollars = Field(
        50, alias="monthlyBudgetUsd", description="USD a month; Modal's hard cap too"
    )
    allow_over_budget: CliBool = Field(False, alias="allowOverBudget")
    alert_thresholds_pct: Annotated[Thresholds, BeforeValidator(_from_json)] = Field(
        [50, 80, 100], alias="alertThresholdsPct"
    )
    require_pinned_revision: CliBool = Field(False, alias="requirePinnedRevision")
    api_key_names: Annotated[
        list[Annotated[StrictStr, Field(pattern=KEY_NAME.pattern)]],
        BeforeValidator(_from_json),
        Field(min_length=1),
        AfterValidator(_unique),
    ] = Field(["gateway"], alias="apiKeyNames", description="e.g. [gateway, ci]")
    api_key_rotation: Annotated[dict[str, Marker], BeforeValidator(_from_json)] = Field(
        default_factory=dict,
        alias="apiKeyRotation",
        description="API key name -> rotation marker (any text, e.g. a date)",
    )
    proxy_token_rotation: Marker = Field("", alias="proxyTokenRotation")
    app_file: StrictStr = Field(DEFAULT_APP_FILE, alias="appFile")
    #: CPU and memory are priced from the spec's requests (cost.py); this adds an allowance.
    cost_overhead_pct: Dollars = Field(0, alias="costOverheadPct", description="percent")
    #: dev/standin_engine.py instead of vLLM/SGLang (local stacks only).
    engine_standin: CliBool = Field(False, alias="engineStandin")
    gpu_prices: Annotated[dict[GpuName, Dollars], BeforeValidator(_from_json)] = Field(
        default_factory=lambda: dict(cost.GPU_PRICES_USD_PER_HOUR),
        alias="gpuPricesUsdPerHour",
        description="GPU name -> USD per GPU-hour, e.g. {H200: 4.54}",
    )
    # Per-stack overrides of components/cost.py's CPU and memory rates. Not declared in
    # Pulumi.yaml: the CLI's project schema has no number type, and a declared key without a
    # default is required; unset means cost.py's constant.
    cpu_usd_per_core_hour: Dollars = Field(
        cost.CPU_USD_PER_CORE_HOUR,
        alias="cpuPriceUsdPerCoreHour",
        description=f"USD per physical CPU core per hour; unset, it is Modal's rate "
        f"{cost.CPU_USD_PER_CORE_HOUR:g} from components/cost.py",
    )
    memory_usd_per_gib_hour: Dollars = Field(
        cost.MEMORY_USD_PER_GIB_HOUR,
        alias="memoryPriceUsdPerGibHour",
        description=f"USD per GiB of memory per hour; unset, it is Modal's rate "
        f"{cost.MEMORY_USD_PER_GIB_HOUR:g} from components/cost.py",
    )
    gateway_overflow: Annotated[dict[str, OverflowInput], BeforeValidator(_from_json)] = Field(
        default_factory=dict,
        alias="gatewayOverflow",
        description="service name -> {in_house: [{name, api_base, capacity}], cooldown_s, "
        "allowed_fails}",
    )
    # Secrets: whether each is set, never its value.
    has_hf_token: Present = _secret("hfToken")
    has_alert_webhook: Present = _secret("alertWebhookUrl")
    has_alert_watch_token: Present = _secret("alertWatchToken")
    has_in_house_keys: Present = _secret("inHouseApiKeys")
    #: Credentials of the private S3-compatible store services' `weights` come from (JSON map
    #: of WEIGHTS_STORE_ENV_KEYS), kept in the Modal secret WEIGHTS_STORE_SECRET_NAME.
    has_weights_store: Present = _secret("weightsStoreCredentials")
    has_proxy_token: Present = _secret("proxyToken")

    @field_validator("gpu_prices")
    @classmethod
    def _price_table(cls, value: dict[str, float]) -> dict[str, float]:
        """The built-in table (components/cost.py) with the stack's overrides applied."""
        return {**cost.GPU_PRICES_USD_PER_HOUR, **value}

    @property
    def alert_thresholds(self) -> list[float]:
        """Fractions of the budget, e.g. [0.5, 0.8, 1.0]."""
        return [v / 100 for v in sorted(set(self.alert_thresholds_pct))]

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> StackSettings:
        ctx = info.context or {}
        ns, stack = ctx.get("namespace", PROJECT), ctx.get("stack", "")
        problems = [
            *self._standin_rule(ns, stack, ctx.get("modal_server_url")),
            *self._managed_rules(ns, stack),
            *self._rotation_rule(ns),
            *self._service_rules(ns, stack),
            *self._overflow_rules(ns),
        ]
        if problems:
            raise RuleError(*problems)
        return self

    def _standin_rule(self, ns: str, stack: str, url: str | None) -> Iterator[Problem]:
        """engineStandin only where the Modal server is local: the stand-in answers every
        request with fixed text, which must never be what a real endpoint serves."""
        urls = [u.strip() for u in (url or "").split(",") if u.strip()]
        if not self.engine_standin or (
            urls and all(urlsplit(u).hostname in LOCAL_HOSTS for u in urls)
        ):
            return
        where = url or "Modal itself (modal:serverUrl is not set)"
        yield Problem(
            ("engineStandin",),
            f": stack {stack!r}: {ns}:engineStandin is true, but this stack's Modal server "
            f"is {where}, not a local one. The stand-in engine (dev/standin_engine.py) "
            "runs no model and answers with fixed text: it is only for a stack on the "
            "local emulator (modal:serverUrl: http://127.0.0.1:PORT, e.g. the local stack)",
            fix=f"To deploy the real engine here: pulumi config rm {ns}:engineStandin "
            f"--stack {stack}",
        )

    def _managed_rules(self, ns: str, stack: str) -> Iterator[Problem]:
        managed, key = self.managed_by_access_stack, "managedByAccessStack"
        if managed and not self.has_proxy_token:
            yield Problem(
                ("proxyToken",),
                f"is not set, but {ns}:{key} is true, so the gateway's proxy token comes "
                "from the access stack",
                fix=f"Set it from the access stack's credentials (docs/program.md, Access): "
                f"pulumi -C access stack output credentials --show-secrets --stack <access "
                f"stack> | jq -r '.<environment>.proxy_token' | pulumi config set --secret "
                f"{ns}:proxyToken --stack {stack}",
                secret=PROXY_TOKEN_KEY,
            )
        elif self.has_proxy_token and not managed:
            yield Problem(
                ("proxyToken",),
                f"is set, but {ns}:{key} is not true: this stack creates its own proxy token",
                fix=f"Either pulumi config set {ns}:{key} true (the access stack owns the "
                f"environment, budget and token), or pulumi config rm {ns}:proxyToken",
            )
        elif managed and self.proxy_token_rotation:
            yield Problem(
                ("proxyTokenRotation",),
                f"has no effect with {ns}:{key}: the access stack owns the proxy token",
                fix="Rotate it there (proxy_token_rotation of the environment in "
                f"modal-llm-access:environments), then set the new {ns}:proxyToken; and: "
                f"pulumi config rm {ns}:proxyTokenRotation",
            )

    def _rotation_rule(self, ns: str) -> Iterator[Problem]:
        for name in sorted(set(self.api_key_rotation) - set(self.api_key_names)):
            yield Problem(
                ("apiKeyRotation", name),
                f": {ns}:apiKeyRotation names key {name!r}, which is not in {ns}:apiKeyNames "
                f"{self.api_key_names!r}; rotation markers apply to those names"
                + unknown_key_text(name, self.api_key_names).removeprefix("is not a known key"),
                fix=f"Fix it with: pulumi config rm --path 'apiKeyRotation.{name}'",
            )

    def _service_rules(self, ns: str, stack: str) -> Iterator[Problem]:
        on = f" --stack {stack}" if stack else ""
        seen: set[str] = set()
        for i, entry in enumerate(self.service_entries):
            fields = entry.spec_fields()
            model, revision = fields.get("model"), fields.get("revision")
            if entry.name in seen:
                yield Problem(("services", i, "name"), "is used twice", entry.name)
            seen.add(entry.name)
            if entry.gated and not self.has_hf_token:
                yield Problem(
                    ("services", i, "gated"),
                    f"is true: the model {model!r} is gated on Hugging Face and its weights "
                    f"cannot be downloaded without a token, but {ns}:hfToken is not set",
                    fix="Accept the model's license on its Hugging Face page with the "
                    "account the token belongs to, then: pulumi config set --secret "
                    f"{ns}:hfToken hf_...{on}",
                    secret=HF_TOKEN_KEY,
                )
            pinned = isinstance(revision, str) and COMMIT_SHA_RE.match(revision)
            if self.require_pinned_revision and not pinned:
                yield Problem(
                    ("services", i, "revision"),
                    f"must be a full 40-hex commit sha: this stack sets "
                    f"{ns}:requirePinnedRevision, so the model {model!r} is "
                    "pinned (a branch or tag can move under you). Find it on the model's "
                    "Hugging Face page (Files and versions -> commit history)",
                    revision,
                )
            if "engine_standin" in fields and not self.engine_standin:
                yield Problem(
                    ("services", i, "engine_standin"),
                    "is set, but the stack does not run the stand-in engine",
                    fix=f"Set {ns}:engineStandin: true (local stacks only) or remove it.",
                )
            source = entry.source()
            repo = (entry.weights or {}).get("repo")
            if source is not None and source["kind"] == "hf" and repo not in (None, model):
                yield Problem(
                    ("services", i, "model"),
                    f"is {model!r}, but the service's weights volume is provisioned from "
                    f"{repo!r} (services[{i}].weights.repo): the engine would load "
                    f"{repo!r}'s files and report them as {model!r}",
                    fix="Name one model in both: correct the typo, or remove weights.repo "
                    "(it defaults to the model).",
                )
            if source is not None and source["kind"] == "s3" and not self.has_weights_store:
                yield Problem(
                    ("services", i, "weights"),
                    f"reads from an S3-compatible store, but {ns}:weightsStoreCredentials "
                    "is not set",
                    fix=f"Set the store's credentials (kept in the Modal secret "
                    f"{WEIGHTS_STORE_SECRET_NAME!r}): pulumi config set --secret "
                    f"{ns}:weightsStoreCredentials "
                    '\'{"AWS_ACCESS_KEY_ID": "...", "AWS_SECRET_ACCESS_KEY": "..."}\''
                    f"{on}",
                    secret=WEIGHTS_STORE_KEY,
                )

    def _overflow_rules(self, ns: str) -> Iterator[Problem]:
        """Each overflow names a service of the stack; endpoint names are unique in the stack
        (each has its own key); in-house keys only with endpoints to use them."""
        names = [e.name for e in self.service_entries]
        if self.has_in_house_keys and not self.gateway_overflow:
            yield Problem(
                ("inHouseApiKeys",),
                f"is set but {ns}:gatewayOverflow declares no in-house endpoint",
                fix=f"Remove it (pulumi config rm {ns}:inHouseApiKeys) or add the endpoints.",
            )
        seen: set[str] = set()
        for service, overflow in self.gateway_overflow.items():
            if service not in names:
                yield Problem(
                    ("gatewayOverflow", service),
                    f": no service named {service!r} in {ns}:services (names: "
                    f"{', '.join(sorted(names))}){did_you_mean(service, names)}",
                )
            for i, endpoint in enumerate(overflow.in_house):
                if endpoint.name in seen:
                    yield Problem(
                        ("gatewayOverflow", service, "in_house", i, "name"),
                        "is used twice; names are unique in the stack (each has its own key)",
                        endpoint.name,
                    )
                seen.add(endpoint.name)


#: Each key of the stack file (its alias, else its name) -> its field.
KEY_FIELDS: dict[str, FieldInfo] = {f.alias or n: f for n, f in StackSettings.model_fields.items()}
#: Keys whose value stays a secret Output (only their presence is validated).
SECRET_KEYS = tuple(k for k, f in KEY_FIELDS.items() if f.json_schema_extra == _SECRET)
KNOWN_KEYS = frozenset(KEY_FIELDS)


def _alias(name: str) -> str:
    return str(StackSettings.model_fields[name].alias)


# Stack-file names of keys that other modules name in their messages (from the fields above).
OVERFLOW_KEY = _alias("gateway_overflow")
HF_TOKEN_KEY = _alias("has_hf_token")
OVERFLOW_SECRET_KEY = _alias("has_in_house_keys")
WEIGHTS_STORE_KEY = _alias("has_weights_store")
MANAGED_KEY = _alias("managed_by_access_stack")
PROXY_TOKEN_KEY = _alias("has_proxy_token")
#: The CPU / memory rate keys: key -> (default, unit), from the fields above.
RATE_KEYS: dict[str, tuple[float, str]] = {
    key: (float(f.default), str(f.description).partition(";")[0])
    for key, f in KEY_FIELDS.items()
    if key in ("cpuPriceUsdPerCoreHour", "memoryPriceUsdPerGibHour")
}
#: The keys' defaults (stack-file names), as the model holds them.
DEFAULTS: dict[str, Any] = {
    key: f.get_default(call_default_factory=True)
    for key, f in KEY_FIELDS.items()
    if not f.is_required()
}


# ---- the validated configuration: the settings plus what follows from them --------------------


class ServiceSettings(ServiceInput):
    """One model served by the stack: its entry plus rendered ServingSpec, cost and gate."""

    spec: ServingSpec
    cost: cost.ServiceCost
    #: Where ModelWeights fills `<name>-weights` from at `pulumi up`, or None: the engine
    #: downloads `model` at its first cold start.
    weights_source: dict[str, Any] | None = None
    gate_enabled: bool = False
    gate_reason: str = ""
    #: Upper bound of what one gated deploy costs (0 unless it cold-starts a container).
    gated_deploy_usd: float = 0.0


class StackConfig(StackSettings):
    """The validated configuration of one stack."""

    project: str
    stack: str
    services: list[ServiceSettings]
    cost: cost.StackCost
    budget_warning: str | None = None
    #: Where the values came from: later checks (the in-house keys) name its lines too.
    stack_file: StackFile | None = None
    #: Preview only: secret keys a rule needs that are not set. The preview goes on with each
    #: one unknown (`unknown_secret()`); `up` refuses (`parse_stack_config(preview=False)`).
    unknown_secrets: tuple[str, ...] = ()
    #: One warning per key of `unknown_secrets`: what needs it and the command that sets it.
    secret_warnings: tuple[str, ...] = ()


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


def _fix(ns: str, stack: str, budget_hint: float | None) -> Callable[[Problem], str]:
    """The next step of a problem that has none of its own: the command that sets the key."""

    def fix(p: Problem) -> str:
        key = str(p.loc[0]) if p.loc else ""
        on = f" --stack {stack}" if stack else ""
        if len(p.loc) == 1 and "not a known key" in p.text:
            return f"Remove it with: pulumi config rm {ns}:{key}{on}"
        if key not in KNOWN_KEYS or p.text.startswith(":") or "not a known key" in p.text:
            return ""
        if len(p.loc) > 1:
            path = key + path_text(p.loc[1:])
            return f"Fix it in the stack file, or: pulumi config set --path '{path}' <value>{on}"
        info = KEY_FIELDS[key]
        if info.is_required():
            example = (info.examples or ["<value>"])[0]
            return f"Set it with: pulumi config set {ns}:{key} {example}{on}"
        value = default = DEFAULTS[key]
        if key == "monthlyBudgetUsd" and budget_hint is not None:
            value = max(budget_hint, default)  # one that passes the budget guard too
        whole = isinstance(value, float) and value.is_integer()
        shown = (
            f"{value:g}"
            if isinstance(value, float) and not whole
            else json.dumps(int(value) if whole else value)
        )
        return (
            f"Fix it with: pulumi config set {ns}:{key} {shown}{on}   (or pulumi config rm "
            f"{ns}:{key}{on} for the default)"
        )

    return fix


# ---- parsing ------------------------------------------------------------------------------------


def parse_stack_config(
    values: Mapping[str, str | None],
    *,
    stack: str,
    namespace: str = PROJECT,
    modal_server_url: str | None = None,
    stack_file: StackFile | None = None,
    preview: bool = False,
) -> StackConfig:
    """Validate raw config strings (keys without namespace) into a StackConfig.

    `values` holds what `pulumi.Config(namespace).get(key)` returns: strings, with objects and
    lists as JSON. Secret keys only need to be present (their values are not looked at).
    `modal_server_url` is the Modal server the providers will talk to (modal:serverUrl, else
    env MODAL_SERVER_URL); `engineStandin` is refused unless it is local. `stack_file` is where
    the values came from, for the error's `file:line:col` (default: the name alone).

    `preview` (a `pulumi preview`): a secret that a rule needs but that is not set (the HF
    token of a gated model, ...: the problems marked `secret`) is no error: the config is
    validated as if it were set, and the result lists it in `unknown_secrets` with one warning
    per key in `secret_warnings`. Without `preview` (`up`) those problems are errors.
    """
    ns = namespace
    where = stack_file or StackFile.of(stack)
    data = {k: v for k, v in values.items() if v is not None}
    ctx = {"namespace": ns, "stack": stack, "modal_server_url": modal_server_url}
    unknown: dict[str, list[Problem]] = {}
    try:
        try:
            settings = StackSettings.model_validate(data, context=ctx)
        except ValidationError as exc:
            needed = [p for p in problems_from(exc, StackSettings) if p.secret]
            if not preview or not needed:
                raise
            for p in needed:
                unknown.setdefault(p.secret, []).append(p)
            # As if each were set (only presence is validated); a problem left is an error.
            data = {**data, **{key: "<unknown>" for key in unknown}}
            settings = StackSettings.model_validate(data, context=ctx)
    except ValidationError as exc:
        problems = problems_from(exc, StackSettings)
        hint = None
        if any(p.loc == ("monthlyBudgetUsd",) for p in problems):
            hint = _budget_hint(data, ctx)
        raise config_error(
            problems, stack_file=where, namespace=ns, fix=_fix(ns, stack, hint)
        ) from None
    warnings = tuple(
        f"{ns}:{key} is not set: this preview goes on with it as an unknown secret (the plan "
        "is what `up` does once it is set), and `pulumi up` refuses until it is set. Needed by: "
        + " ".join(problem_line(p, stack_file=where, namespace=ns) for p in needs)
        for key, needs in unknown.items()
    )
    try:
        return _resolve(settings, ns, stack).model_copy(
            update={
                "stack_file": where,
                "unknown_secrets": tuple(unknown),
                "secret_warnings": warnings,
            }
        )
    except RuleError as exc:
        raise config_error(
            exc.problems, stack_file=where, namespace=ns, fix=_fix(ns, stack, None)
        ) from None


def _budget_hint(data: dict[str, Any], ctx: dict[str, Any]) -> float | None:
    """The smallest whole budget the stack's worst case fits in, when the rest is valid: a
    bad budget's fix then suggests a value that passes the budget guard as well."""
    rest = {k: v for k, v in data.items() if k not in ("monthlyBudgetUsd", "allowOverBudget")}
    try:
        settings = StackSettings.model_validate({**rest, "allowOverBudget": "true"}, context=ctx)
        cfg = _resolve(settings, str(ctx["namespace"]), str(ctx["stack"]))
    except (ValidationError, RuleError):
        return None
    return float(math.ceil(cfg.cost.worst_usd))


def _resolve(settings: StackSettings, ns: str, stack: str) -> StackConfig:
    """Each service's spec, cost and gate; the budget guard; the spec-level rules."""
    services = [_service(settings, ns, i, e) for i, e in enumerate(settings.service_entries)]
    for i, svc in enumerate(services):
        served = svc.spec.served_model_name
        if any(s.spec.served_model_name == served for s in services[:i]):
            raise RuleError(Problem(("services", i, "served_model_name"), "is used twice", served))
        for key in sorted(
            set(svc.spec.proxy.key_max_in_flight or {}) - set(settings.api_key_names)
        ):
            raise RuleError(
                Problem(
                    ("services", i, "proxy", "key_max_in_flight"),
                    f"names key {key!r}, which is not in {ns}:apiKeyNames "
                    f"{settings.api_key_names!r}: name one of those keys, or remove the entry",
                )
            )
    stack_cost = cost.StackCost(services=tuple(s.cost for s in services))
    try:
        warning = cost.check_budget(
            stack_cost,
            settings.monthly_budget_usd,
            allow_over_budget=settings.allow_over_budget,
            config_ns=ns,
        )
    except cost.BudgetExceeded as exc:
        raise RuleError(Problem(("monthlyBudgetUsd",), f": stack {stack!r}: {exc}")) from None
    fields = {name: getattr(settings, name) for name in StackSettings.model_fields}
    fields["adopt_environment"] = settings.adopt_environment or settings.managed_by_access_stack
    made = StackConfig.model_construct(
        **fields, project=ns, stack=stack, cost=stack_cost, budget_warning=warning
    )
    # `services` is also the alias of `service_entries`: set by field name, past the alias.
    return made.model_copy(update={"services": services})


def _service(settings: StackSettings, ns: str, i: int, entry: ServiceInput) -> ServiceSettings:
    name, at = entry.name, ("services", i)
    fields = entry.spec_fields()
    fields.setdefault("served_model_name", name)
    engine = fields.get("engine", "vllm")
    fields["volumes"] = {"hf_cache": f"{name}-hf-cache", "engine_cache": f"{name}-{engine}-cache"}
    source = entry.source()
    if source is not None:  # the engine loads the revision's directory on the weights volume
        fields["weights"] = {"volume": weights_volume_name(name), "path": source["revision"]}
    fields["secrets"] = {
        "hf_token": HF_TOKEN_SECRET_NAME if settings.has_hf_token else None,
        "api_keys": f"{name}-api-keys",
    }
    fields["require_pinned_revision"] = settings.require_pinned_revision
    if settings.engine_standin:  # {} = the plain stand-in; a service may add {fail: ...}
        fields["engine_standin"] = fields.get("engine_standin") or {}
    try:
        # JSON mode: nested models from plain dicts, exactly as the container reads the spec.
        spec = ServingSpec.model_validate_json(json.dumps(fields))
    except ValidationError as exc:
        raise RuleError(*problems_from(exc, StackSettings, prefix=at)) from None
    scaling = spec.scaling
    try:
        windows = parse_windows(entry.warm_schedule or None, max_containers=scaling.max_containers)
    except ScheduleError as exc:
        path, text = split_path(str(exc))
        raise RuleError(Problem((*at, *path), text)) from None
    try:
        svc_cost = cost.service_cost(
            cost.ServiceCostInput(
                name=name,
                gpus=tuple(spec.gpu_types),
                gpu_count=spec.gpu_count,
                min_containers=scaling.min_containers,
                max_containers=scaling.max_containers,
                buffer_containers=scaling.buffer_containers,
                region=spec.region,
                overhead_pct=settings.cost_overhead_pct,
                warm_extra_hours=extra_container_hours_per_month(windows, scaling.min_containers),
                cpu_cores=cpu_request(spec),
                memory_gib=memory_request_mib(spec) / 1024,
                cpu_usd_per_core_hour=settings.cpu_usd_per_core_hour,
                memory_usd_per_gib_hour=settings.memory_usd_per_gib_hour,
            ),
            settings.gpu_prices,
        )
    except cost.UnknownGpuPrice as exc:
        raise RuleError(Problem((*at, "gpu"), f": {exc}")) from None
    gate_usd = cost.gated_deploy_usd(svc_cost, spec.timeouts.startup_s, scaling.scaledown_window_s)
    gate_on, gate_why = resolve_health_gate(
        entry.health_gate, scaling.min_containers, settings.engine_standin, gate_usd
    )
    own = {k: getattr(entry, k) for k in ServiceInput.model_fields}
    return ServiceSettings.model_construct(
        **own,
        spec=spec,
        cost=svc_cost,
        weights_source=source,
        gate_enabled=gate_on,
        gate_reason=gate_why,
        gated_deploy_usd=gate_usd,
    )


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


def unknown_secret() -> pulumi.Output[str]:
    """A secret whose value this preview does not know, as Pulumi's own unknown: an Output
    with is_known False (pulumi 3.272.0 pulumi/output.py `Output.__init__`: `apply` callbacks
    do not run on it; `_OutputData` holds is_known) and is_secret True, which
    pulumi/runtime/rpc.py `serialize_property` sends as `rpc.UNKNOWN` inside the secret
    signature (`{sig: secret, value: UNKNOWN}`), so the engine plans it as an unknown secret
    input (shown `[secret]` / `output<unknown>`)."""

    async def resolved(value: Any) -> Any:
        return value

    return pulumi.Output(set(), resolved(None), resolved(False), resolved(True))


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
    stack_file: Path | None = None,
) -> tuple[StackConfig, StackSecrets]:
    """Read and validate the current stack's config (inside a Pulumi program or mocks).

    `stack_file`: the stack file the CLI read (`Pulumi.<stack>.yaml` beside the program), for
    the `file:line:col` of an error; its name is the real one whether or not it exists."""
    cfg = config or pulumi.Config(pulumi.get_project())
    ns, stack = cfg.name, pulumi.get_stack()
    where = StackFile(f"Pulumi.{stack}.yaml", stack_file)

    def refuse(key: str, text: str, fix: str) -> ConfigError:
        return config_error([Problem((key,), text, fix=fix)], stack_file=where, namespace=ns)

    values: dict[str, str | None] = {}
    for key in sorted(KNOWN_KEYS - set(SECRET_KEYS)):
        values[key] = cfg.get(key)
    present: dict[str, bool] = {}
    for key in SECRET_KEYS:
        full_key = f"{ns}:{key}"
        # Presence only: the value itself stays inside a secret Output.
        present[key] = bool(pulumi.runtime.get_config(full_key))
        if present[key] and not _is_secret(full_key):
            raise refuse(
                key,
                f"is stored in clear in Pulumi.{stack}.yaml",
                f"Remove it and set it encrypted: pulumi config rm {full_key} && "
                f"pulumi config set --secret {full_key} <value>",
            )
        values[key] = "<secret>" if present[key] else None
    for full_key in PROVIDER_SECRET_KEYS:
        if pulumi.runtime.get_config(full_key) and not _is_secret(full_key):
            raise refuse(
                full_key,
                f"is stored in clear in Pulumi.{stack}.yaml",
                f"Remove it and keep Modal credentials out of the stack file: pulumi config rm "
                f"{full_key}, then export MODAL_TOKEN_ID / MODAL_TOKEN_SECRET (CI: environment "
                f"secrets), or pulumi config set --secret {full_key} <value>",
            )
    # Keys this program does not know reach the model, which names them (a typo would
    # otherwise be silently ignored); their values are not shown.
    for full_key in _all_config_keys():
        prefix, _, key = str(full_key).partition(":")
        if prefix == ns and key not in values:
            values[key] = "<set>"
    # The server the providers use: modal:serverUrl, else env MODAL_SERVER_URL
    # (components/modal/_base.py reads them in the same order).
    server_url = pulumi.runtime.get_config(MODAL_SERVER_URL_KEY) or os.environ.get(
        "MODAL_SERVER_URL"
    )
    problem = server_url_problem(server_url) if server_url else None
    if problem:
        from_config = bool(pulumi.runtime.get_config(MODAL_SERVER_URL_KEY))
        raise config_error(
            [
                Problem(
                    (MODAL_SERVER_URL_KEY if from_config else "env MODAL_SERVER_URL",),
                    f": {problem}",
                    server_url,
                    fix=f"Fix it: pulumi config set {MODAL_SERVER_URL_KEY} http://127.0.0.1:8790 "
                    f"(the emulator), or pulumi config rm {MODAL_SERVER_URL_KEY} for Modal itself"
                    if from_config
                    else "Fix or unset the MODAL_SERVER_URL environment variable",
                )
            ],
            stack_file=where,
            namespace=ns,
        )
    parsed = parse_stack_config(
        {k: v for k, v in values.items() if v is not None},
        stack=stack,
        namespace=ns,
        modal_server_url=server_url,
        stack_file=where,
        # pulumi/runtime/settings.py is_dry_run: true under `pulumi preview` and under mocks
        # set with preview=True (the stand-in's preview, pulumi/runtime/mocks.py set_mocks).
        preview=pulumi.runtime.is_dry_run(),
    )
    warn = on_warning or pulumi.log.warn
    if parsed.budget_warning:
        warn(parsed.budget_warning)
    for text in parsed.secret_warnings:
        warn(text)

    def secret(key: str) -> pulumi.Output[str] | None:
        if key in parsed.unknown_secrets:
            return unknown_secret()
        return cfg.require_secret(key) if present[key] else None

    return parsed, StackSecrets(
        hf_token=secret("hfToken"),
        alert_webhook_url=secret("alertWebhookUrl"),
        alert_watch_token=secret("alertWatchToken"),
        weights_store_credentials=secret(WEIGHTS_STORE_KEY),
        proxy_token=secret(PROXY_TOKEN_KEY),
    )


# ---- the access stack (access/, issue 23): environments, budgets, identities ----------------

ACCESS_PROJECT = "modal-llm-access"
ACCESS_KEY = "environments"
#: Roles an identity may have in its environment; `none`: a service user with no role at all
#: (it may call nothing but ClientHello: the preview identity).
IdentityRole = Literal["contributor", "viewer", "none"]


class Identity(_Strict):
    """One service user of an environment and its role there."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,56}$",
        description="a service user name: 1-56 of a-z A-Z 0-9 - _; a rotation appends -<n>",
    )
    role: IdentityRole = Field(
        description="contributor: read and write in this environment, e.g. CI's deploy; "
        "viewer: read only, e.g. the spend watcher; none: may call nothing, e.g. a preview"
    )
    rotation: Marker = ""
    expires_in_days: Annotated[int, Field(ge=1, description="days")] | None = None


def _environment_name(value: str) -> str:
    if value.startswith("en-"):
        raise ValueError("must not start with 'en-' (Modal's environment ids do)")
    return value


class AccessEnvironment(_Strict):
    """One environment the access stack owns: budget, gateway token, identities."""

    name: Annotated[
        str,
        Field(
            pattern=_ENV_NAME,
            description="a Modal environment name: letters, digits, '-' and '_', up to 64",
        ),
        AfterValidator(_environment_name),
    ]
    monthly_budget_usd: float = Field(
        ge=0, allow_inf_nan=False, description="the environment's hard cap"
    )
    alert_thresholds_pct: Thresholds = [50, 80, 100]
    adopt: bool = False
    proxy_token_rotation: Marker = ""
    identities: list[Identity] = []

    @property
    def alert_thresholds(self) -> list[float]:
        """Fractions of the budget."""
        return [v / 100 for v in sorted(set(self.alert_thresholds_pct))]


class AccessEnvironments(RootModel[list[AccessEnvironment]]):
    """`environments` of the access stack: each environment and identity name used once."""

    root: Annotated[list[AccessEnvironment], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> AccessEnvironments:
        envs: set[str] = set()
        ids: dict[str, tuple[int, int]] = {}
        for i, env in enumerate(self.root):
            if env.name in envs:
                raise rule((i, "name"), "is listed twice", env.name)
            envs.add(env.name)
            for j, ident in enumerate(env.identities):
                if ident.name in ids:
                    a, b = ids[ident.name]
                    raise rule(
                        (i, "identities", j, "name"),
                        f"is already environments[{a}].identities[{b}]: service users are "
                        "workspace-wide, so each name is used once",
                        ident.name,
                    )
                ids[ident.name] = (i, j)
        return self


def parse_access_config(
    raw: str | None,
    *,
    stack: str,
    namespace: str = ACCESS_PROJECT,
    stack_file: Path | None = None,
) -> list[AccessEnvironment]:
    """Validate `<namespace>:environments` (its JSON, as the CLI hands it to the program)."""
    where = StackFile(f"Pulumi.{stack}.yaml", stack_file)
    example = (
        "[{name: dev, monthly_budget_usd: 700, identities: [{name: dev-deploy, role: "
        "contributor}]}]"
    )
    problems: list[Problem]
    if raw is None:
        problems = [Problem((), f"is not set: list the environments, e.g. {example}")]
    else:
        try:
            return AccessEnvironments.model_validate(_from_json(raw)).root
        except ValidationError as exc:
            problems = problems_from(exc, AccessEnvironments)
        except ValueError as exc:  # not JSON
            problems = [Problem((), str(exc))]
    problems = [Problem((ACCESS_KEY, *p.loc), p.text, p.given, p.fix) for p in problems]
    raise config_error(problems, stack_file=where, namespace=namespace)


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
