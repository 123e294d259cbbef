"""The serving components: what one stack creates on Modal, wired parent by parent.

- `ServingEnvironment` (one per stack): the Modal environment (created, or adopted when it
  already exists), the Hugging Face token secret (when the stack has one), the proxy-auth token
  scoped to that environment (what gateways send as Modal-Key/Modal-Secret), the spend alert
  (budget + thresholds) and, when the stack has an alert webhook, the spend watcher: the
  scheduled app watchers/spend_alerts.py, with the Modal secret only it mounts (the webhook URL
  and the watcher's own Modal token, when configured), which delivers the alerts.
  **Managed mode** (`modal-llm:managedByAccessStack: true`, issue 23): the access stack
  (access/, run by a workspace Owner or Manager) owns the environment, its budget and the proxy
  token. The environment is then adopted (never created or deleted here: retained on delete),
  no SpendAlert and no ProxyAuthToken are created, and the proxy token's id and secret come from
  the secret config `modal-llm:proxyToken`, so a deploy token that is only `contributor` in the
  environment is enough. The spend watcher takes the environment id from the Environment.
- `LLMService` (one per model in `services`): its named API keys (generated, kept only as
  Pulumi secrets), the Modal secret holding their sha256 digests for the serving proxy, the
  HF and engine cache volumes (protected and retained on delete when `protectCaches`), and the
  App deploying `serving/app.py` with the rendered ServingSpec.

Every Modal object takes the environment NAME as an Output of the Environment resource, so the
engine creates the environment first and deletes it last; the App also `depends_on` the
secrets and volumes it mounts (serving/app.py does not create volumes itself).

Key changes roll the containers: the serving proxy reads `SERVING_API_KEYS` only when a
container starts (after restore, with snapshots), so the App gets the sha256 of the digests
JSON as its extra env `SERVING_API_KEYS_SHA256`. Adding, removing or rotating a key changes it;
the App provider redeploys on an extra-env change, and serving/app.py puts the value into the
image ENV, so the deployed function definition changes and Modal replaces the containers (the
Secret keeps its id, so without that the deploy would be a no-op and old containers would keep
the old keys).

The stand-in engine (`modal-llm:engineStandin`, local stacks only) is part of the rendered spec
(`engine_standin`), so the App's `spec_json` input shows it in `pulumi preview --diff`; the
service also reports it as the `engine_standin` output.
No Modal calls here: only resources (components/modal/).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from typing import Any

import pulumi

from components.api_keys import ApiKey, ApiKeyArgs
from components.config import (
    HF_TOKEN_SECRET_NAME,
    WEIGHTS_STORE_ENV_KEYS,
    WEIGHTS_STORE_SECRET_NAME,
    ServiceSettings,
    StackConfig,
    StackSecrets,
    proxy_token_part,
    weights_volume_name,
)
from components.gateway import GatewayTarget
from components.modal.app import App, AppArgs
from components.modal.environment import Environment, EnvironmentArgs
from components.modal.model_weights import ModelWeights, ModelWeightsArgs
from components.modal.proxy_auth_token import ProxyAuthToken, ProxyAuthTokenArgs
from components.modal.secret import Secret, SecretArgs
from components.modal.spend_alert import SpendAlert, SpendAlertArgs, SpendWatch
from components.modal.volume import Volume, VolumeArgs
from components.model_name import ask_hub
from serving.spec import KEY_VERSION_ENV, SERVER_NAME

ENVIRONMENT_TYPE = "modal-llm:serving:ServingEnvironment"
SERVICE_TYPE = "modal-llm:serving:LLMService"
API_KEYS_ENV_VAR = "SERVING_API_KEYS"
HF_TOKEN_ENV_VAR = "HF_TOKEN"  # noqa: S105 (an env var name)
PREWARM_APP_FILE = "serving/prewarm_app.py"
# The stand-in engine (`modal-llm:engineStandin`): dev/standin_engine.py, one of the dev tools
# (`make setup` installs them), not part of the product. serving/app.py ships it by this name.
STANDIN_ENGINE_MODULE = "standin_engine"

# The spend watcher (watchers/spend_alerts.py, which must not import components/: the names it
# reads are repeated here, and tests/providers/test_spend_watch.py deploys it with these).
SPEND_WATCH_APP_FILE = "watchers/spend_alerts.py"
SPEND_WATCH_APP_NAME = "spend-watch"
SPEND_WATCH_SECRET_NAME = "spend-watch"  # noqa: S105 (a Modal secret name)
SPEND_WATCH_DICT_NAME = "spend-watch-alerted"
SPEND_WATCH_PERIOD_MINUTES = 15
SPEND_WEBHOOK_ENV = "SPEND_ALERT_WEBHOOK_URL"
SPEND_TOKEN_ID_ENV = "SPEND_WATCH_TOKEN_ID"  # noqa: S105 (an env var name)
SPEND_TOKEN_SECRET_ENV = "SPEND_WATCH_TOKEN_SECRET"  # noqa: S105 (an env var name)


@dataclass(frozen=True)
class AccessStackProxyToken:
    """The gateway's proxy token in managed mode: held by the access stack, read from the
    secret config `modal-llm:proxyToken`. Same two outputs as a `ProxyAuthToken`."""

    token_id: pulumi.Output[str]  # "wk-...": not a secret (a ProxyAuthToken's is plain too)
    token_secret: pulumi.Output[str]  # secret

    @classmethod
    def from_config(cls, token: pulumi.Output[str]) -> AccessStackProxyToken:
        return cls(
            token_id=pulumi.Output.unsecret(token.apply(lambda t: proxy_token_part(t, 0))),
            token_secret=pulumi.Output.secret(token.apply(lambda t: proxy_token_part(t, 1))),
        )


class ServingEnvironment(pulumi.ComponentResource):
    """The per-stack Modal objects every service shares."""

    environment: Environment
    environment_name: pulumi.Output[str]
    hf_token_secret: Secret | None
    weights_store_secret: Secret | None
    proxy_token: ProxyAuthToken | AccessStackProxyToken
    spend_alert: SpendAlert | None

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        secrets: StackSecrets,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(ENVIRONMENT_TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # An adopted environment (e.g. Modal's `main`) is never deleted by a destroy, and
        # neither is one holding retained caches (protectCaches): deleting an environment
        # deletes every volume in it (the provider refuses that too, naming what remains).
        # Managed mode adopts (the access stack created it), so it is never deleted here.
        managed = cfg.managed_by_access_stack
        self.environment = Environment(
            f"{name}-environment",
            EnvironmentArgs(name=cfg.environment, adopt=cfg.adopt_environment or managed),
            pulumi.ResourceOptions(
                parent=self,
                retain_on_delete=cfg.adopt_environment or cfg.protect_caches or managed,
            ),
        )
        self.environment_name = self.environment.name
        env = self.environment_name

        def stack_secret(resource: str, secret: str, values: Any) -> Secret:
            # An adopted environment may hold the secret already: claim it.
            args = SecretArgs(
                name=secret, values=values, environment=env, adopt=cfg.adopt_environment
            )
            return Secret(f"{name}-{resource}", args, child)

        self.hf_token_secret = None
        if secrets.hf_token is not None:
            self.hf_token_secret = stack_secret(
                "hf-token", HF_TOKEN_SECRET_NAME, {HF_TOKEN_ENV_VAR: secrets.hf_token}
            )
        # Credentials of the private S3-compatible weights store (services' `weights: {kind:
        # s3}`), for the ModelWeights function only; the serving containers never get them.
        self.weights_store_secret = None
        if secrets.weights_store_credentials is not None:
            self.weights_store_secret = stack_secret(
                "weights-store",
                WEIGHTS_STORE_SECRET_NAME,
                secrets.weights_store_credentials.apply(_weights_store_env),
            )

        self.spend_alert = None
        if managed:  # the access stack holds the token and the budget (a billing setting)
            if secrets.proxy_token is None:  # parse_stack_config refuses this first
                raise ValueError("managed mode needs the secret config modal-llm:proxyToken")
            self.proxy_token = AccessStackProxyToken.from_config(secrets.proxy_token)
        else:
            self.proxy_token = ProxyAuthToken(
                f"{name}-proxy-token",
                ProxyAuthTokenArgs(
                    name=f"{cfg.project}-{cfg.stack}-gateway",
                    environments=[env],
                    rotation=cfg.proxy_token_rotation,
                ),
                child,
            )
            self.spend_alert = SpendAlert(
                f"{name}-spend-alert",
                SpendAlertArgs(
                    environment=env,
                    monthly_budget_usd=cfg.monthly_budget_usd,
                    thresholds=cfg.alert_thresholds,
                ),
                child,
            )
        self.spend_watch_secret: Secret | None = None
        self.spend_watch: SpendWatch | None = None
        if secrets.alert_webhook_url is not None:
            # The spend watcher's secret: the webhook URL and, when configured, the watcher's
            # own Modal token; then the watcher app.
            values: dict[str, pulumi.Input[str]] = {
                SPEND_WEBHOOK_ENV: secrets.alert_webhook_url.apply(_checked_webhook)
            }
            token = secrets.alert_watch_token
            if token is not None:
                values[SPEND_TOKEN_ID_ENV] = token.apply(lambda t: _token_part(t, 0))
                values[SPEND_TOKEN_SECRET_ENV] = token.apply(lambda t: _token_part(t, 1))
            self.spend_watch_secret = stack_secret(
                "spend-watch-secret", SPEND_WATCH_SECRET_NAME, values
            )
            self._spend_watcher(name, cfg, env)
        outputs: dict[str, Any] = {
            "environment": env,
            "proxy_token_id": self.proxy_token.token_id,
        }
        if self.spend_alert is not None:
            outputs["spend_limit_usd"] = self.spend_alert.effective_limit_usd
        self.register_outputs(outputs)

    def _spend_watcher(self, name: str, cfg: StackConfig, env: pulumi.Output[str]) -> None:
        """The watcher app, after its secret (see watchers/spend_alerts.py for what a run
        does)."""
        assert self.spend_watch_secret is not None
        # The environment's id: from the SpendAlert (default mode), else from the Environment
        # (managed mode: the access stack holds the budget the watcher reads).
        env_id = (
            self.spend_alert.environment_id
            if self.spend_alert is not None
            else self.environment.environment_id
        )
        spec = pulumi.Output.all(env, env_id).apply(
            lambda a: json.dumps(
                {
                    "environment": a[0],
                    "environment_id": a[1],
                    "thresholds": cfg.alert_thresholds,
                    "secret": SPEND_WATCH_SECRET_NAME,
                    "dict": SPEND_WATCH_DICT_NAME,
                    "period_minutes": SPEND_WATCH_PERIOD_MINUTES,
                },
                sort_keys=True,
            )
        )
        self.spend_watch = SpendWatch(
            f"{name}-spend-watch",
            AppArgs(
                name=SPEND_WATCH_APP_NAME,
                environment=env,
                app_file=SPEND_WATCH_APP_FILE,
                spec_json=spec,
            ),
            pulumi.ResourceOptions(
                parent=self,
                depends_on=[
                    self.spend_watch_secret,
                    *([self.spend_alert] if self.spend_alert is not None else []),
                ],
            ),
        )


def _checked_webhook(url: str) -> str:
    if not url.startswith(("https://", "http://")):
        raise ValueError(  # never the value: the URL often embeds a token
            "modal-llm:alertWebhookUrl must be an http(s) URL; set it again with"
            " `pulumi config set --secret alertWebhookUrl https://...`"
        )
    return url


def _token_part(token: str, index: int) -> str:
    token_id, sep, token_secret = token.partition(":")
    if not sep or not token_id or not token_secret:
        raise ValueError(  # never the value: it is a credential
            "modal-llm:alertWatchToken must be '<token id>:<token secret>' of the spend"
            " watcher's service user (docs/providers.md, SpendAlert); set it again with"
            " `pulumi config set --secret alertWatchToken ak-...:as-...`"
        )
    return (token_id, token_secret)[index]


def _weights_store_env(text: str) -> dict[str, str]:
    """The store credentials (a JSON map) as the secret's env; errors never show a value."""
    try:
        values = json.loads(text)
    except ValueError:
        values = None
    if (
        not isinstance(values, dict)
        or not set(WEIGHTS_STORE_ENV_KEYS) <= set(values)
        or not all(isinstance(v, str) and v for v in values.values())
    ):
        raise ValueError(
            "modal-llm:weightsStoreCredentials must be a JSON map with non-empty "
            f"{' and '.join(WEIGHTS_STORE_ENV_KEYS)} (optionally AWS_SESSION_TOKEN): "
            "pulumi config set --secret modal-llm:weightsStoreCredentials "
            '\'{"AWS_ACCESS_KEY_ID": "...", "AWS_SECRET_ACCESS_KEY": "..."}\''
        )
    return {str(k): str(v) for k, v in values.items()}


def require_standin_engine(service: str) -> None:
    """A stack that runs the stand-in engine needs the dev tools installed: serving/app.py
    ships the module from this Python (modal's add_local_python_source finds it by import)."""
    if importlib.util.find_spec(STANDIN_ENGINE_MODULE) is None:
        raise pulumi.RunError(
            f"service {service!r}: modal-llm:engineStandin is true (the stand-in engine in "
            f"vLLM's/SGLang's place), but its module {STANDIN_ENGINE_MODULE!r} is not installed "
            f"in this Python ({sys.executable}): it is one of the dev tools (dev/), not part of "
            "the product. Run `make setup` (or `pip install -e ./dev`), or set "
            "modal-llm:engineStandin to false."
        )


def check_model_name(settings: ServiceSettings, cfg: StackConfig) -> str | None:
    """Ask the hub about the service's model (components/model_name.py): raise
    pulumi.RunError when it definitely does not exist there; return the line to show when
    it is not checked (or only doubtful), else None."""
    source = settings.weights_source
    if source is not None and source.get("kind") == "s3":
        return None  # the weights come from a private store: the name is no hub id
    spec, name = settings.spec, settings.name
    index = [s.name for s in cfg.services].index(name)
    where = (
        "when ModelWeights provisions the weights volume at `up`"
        if source is not None
        else "when the engine downloads the model at its first start (the health gate, or"
        " the first request, shows it)"
    )
    answer = ask_hub(spec.model, spec.revision, endpoint=source.get("endpoint") if source else None)
    if answer.verdict == "found":
        return None
    if answer.verdict == "unchecked":
        return (
            f"service {name}: model name not checked: {answer.detail}. A wrong name"
            f" ({spec.model!r}) fails a real deploy {where}."
        )
    text = (
        f"service {name}: {cfg.project}:services[{index}].model {spec.model!r}"
        f"{f' at revision {spec.revision!r}' if spec.revision else ''} is not on the Hugging"
        f" Face hub: {answer.endpoint} says {answer.detail}. A deploy would fail {where}."
    )
    if spec.engine_standin is not None:  # nothing loads the model here; a real stack would
        return text + " (The stand-in engine does not load it, so this stack still deploys.)"
    if answer.verdict == "no-repo" and cfg.has_hf_token:  # may be private: the stack's token
        return text + f" If it is private, check that {cfg.project}:hfToken can read it."
    raise pulumi.RunError(
        text + f" Correct services[{index}].model (or its revision) in the stack file; the"
        " model's page is " + f"{answer.endpoint}/{spec.model}."
    )


class LLMService(pulumi.ComponentResource):
    """One served model: keys, key-digest secret, cache volumes and the deployed App."""

    api_keys: dict[str, ApiKey]
    api_keys_secret: Secret
    hf_cache: Volume
    engine_cache: Volume
    weights_volume: Volume | None
    weights: ModelWeights | None
    app: App
    prewarm: App | None
    endpoint_url: pulumi.Output[str]

    def __init__(
        self,
        settings: ServiceSettings,
        cfg: StackConfig,
        shared: ServingEnvironment,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = settings.name
        spec = settings.spec
        if spec.engine_standin is not None:
            require_standin_engine(name)
        unchecked = check_model_name(settings, cfg)
        super().__init__(SERVICE_TYPE, name, None, opts)
        if unchecked is not None:  # shown by `pulumi preview` and `up`
            log = pulumi.log.info if spec.engine_standin is not None else pulumi.log.warn
            log(unchecked, resource=self)
        env = shared.environment_name
        self.settings = settings
        self.shared = shared

        self.api_keys = {
            key_name: ApiKey(
                f"{name}-key-{key_name}",
                ApiKeyArgs(name=key_name, rotation=cfg.api_key_rotation.get(key_name, "")),
                pulumi.ResourceOptions(parent=self),
            )
            for key_name in cfg.api_key_names
        }
        digests = pulumi.Output.all(*[k.digest for k in self.api_keys.values()]).apply(
            lambda ds: json.dumps(dict(zip(self.api_keys, ds, strict=True)), sort_keys=True)
        )
        self.api_keys_secret = Secret(
            f"{name}-api-keys",
            SecretArgs(
                name=spec.secrets.api_keys,
                values={API_KEYS_ENV_VAR: digests},
                environment=env,
                adopt=settings.adopt,
            ),
            pulumi.ResourceOptions(parent=self),
        )

        def cache(resource: str, volume: str) -> Volume:
            # protectCaches: protected, and retained on delete
            protect = cfg.protect_caches
            opts = pulumi.ResourceOptions(parent=self, protect=protect, retain_on_delete=protect)
            args = VolumeArgs(name=volume, environment=env, adopt=settings.adopt)
            return Volume(f"{name}-{resource}", args, opts)

        self.hf_cache = cache("hf-cache", spec.volumes.hf_cache)
        self.engine_cache = cache("engine-cache", spec.volumes.engine_cache)

        mounted: list[pulumi.Resource] = [self.api_keys_secret, self.hf_cache, self.engine_cache]
        if shared.hf_token_secret is not None:
            mounted.append(shared.hf_token_secret)

        # Weights provisioned at `up` (issue 12.1): the volume, then ModelWeights fills it with
        # the pinned revision; the App deploys after it (a new revision re-provisions, then
        # redeploys: the spec's weights.path names the revision).
        self.weights_volume = self.weights = None
        source = settings.weights_source
        if source is not None:
            self.weights_volume = cache("weights-volume", weights_volume_name(name))
            needs: list[pulumi.Resource] = [self.weights_volume]
            fetch_secrets: list[str] = []
            store = (
                shared.hf_token_secret if source["kind"] == "hf" else shared.weights_store_secret
            )
            if store is not None:
                needs.append(store)
                fetch_secrets.append(
                    HF_TOKEN_SECRET_NAME if source["kind"] == "hf" else WEIGHTS_STORE_SECRET_NAME
                )
            self.weights = ModelWeights(
                f"{name}-weights",
                ModelWeightsArgs(
                    app_name=f"{name}-weights",
                    environment=env,
                    volume=self.weights_volume.name,
                    source=source,
                    secrets=fetch_secrets,
                ),
                pulumi.ResourceOptions(parent=self, depends_on=needs),
            )
            mounted += [self.weights_volume, self.weights]
        self.app = App(
            f"{name}-app",
            AppArgs(
                name=name,
                environment=env,
                app_file=cfg.app_file,
                # The spec is validated here (a ServingSpec); the App takes it rendered, with
                # its digest (components/modal never imports serving/).
                spec_json=spec.to_json(),
                spec_digest=spec.digest(),
                adopt=settings.adopt,
                # Not secret: a hash of hashes of random keys. Changes whenever a key does.
                extra_env={
                    # serving/app.py bakes it into the image ENV: a key change changes the
                    # deployed definition
                    KEY_VERSION_ENV: digests.apply(lambda d: hashlib.sha256(d.encode()).hexdigest())
                },
                # Health gate (issue 11): after each deploy, the App calls the endpoint as a
                # gateway does, with the stack's proxy token and this service's first API
                # key (after a rotation: the new key), or rolls back.
                health_gate=settings.gate_enabled,
                health_gate_timeout_s=float(spec.timeouts.startup_s + spec.timeouts.request_s),
                gate_token_id=shared.proxy_token.token_id,
                gate_token_secret=shared.proxy_token.token_secret,
                gate_api_key=next(iter(self.api_keys.values())).key,
                gate_model=spec.served_model_name,
                gate_task=settings.task,
            ),
            # customTimeouts given to the service bound its release (gate + rollback).
            pulumi.ResourceOptions(
                parent=self,
                depends_on=mounted,
                custom_timeouts=opts.custom_timeouts if opts else None,
            ),
        )
        # Scheduled pre-warm (issue 12.3): a Cron function in the environment raises the
        # server's min_containers during each window and restores it after. Deployed after the
        # App; its config (windows, base, target) is its "spec", so a change redeploys it.
        self.prewarm = None
        if settings.warm_schedule:
            prewarm_config = {
                "target_app": name,
                "server": SERVER_NAME,
                "base_min_containers": spec.scaling.min_containers,
                "windows": settings.warm_schedule,
            }
            self.prewarm = App(
                f"{name}-prewarm",
                AppArgs(
                    name=f"{name}-prewarm",
                    environment=env,
                    app_file=PREWARM_APP_FILE,
                    spec_json=json.dumps(prewarm_config, sort_keys=True, separators=(",", ":")),
                    adopt=settings.adopt,
                ),
                pulumi.ResourceOptions(parent=self, depends_on=[self.app]),
            )
        release = spec.engine_release
        if release.verified != "gpu" and spec.engine_standin is None:
            # Shown by `pulumi preview` and `up`: what the engine release was checked against.
            pulumi.log.info(
                f"service {name}: engine {spec.engine} {spec.engine_version} is verified against"
                f" its recorded parser only, not yet served on a GPU by this project"
                f" ({release.evidence}; GPU-verified releases: docs/gpu.md)",
                resource=self,
            )
        if not settings.gate_enabled:
            # Shown by `pulumi preview` and `up`: what is not checked, and what checking costs.
            pulumi.log.info(f"service {name}: {settings.gate_reason}", resource=self)
        self.endpoint_url = self.app.web_url
        self.register_outputs(
            {
                "endpoint_url": self.endpoint_url,
                "served_model_name": spec.served_model_name,
                "app_id": self.app.app_id,
                "engine_standin": spec.engine_standin is not None,
            }
        )

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def served_model_name(self) -> str:
        return self.settings.spec.served_model_name

    def summary(self) -> dict[str, Any]:
        """The non-secret facts about this service (the `services` stack output)."""
        c = self.settings.cost
        return {
            "endpoint_url": self.endpoint_url,
            "served_model_name": self.served_model_name,
            "app_id": self.app.app_id,
            # True: dev/standin_engine.py answers (fixed text, no model), local stacks only
            "engine_standin": self.settings.spec.engine_standin is not None,
            # The engine release and how far this project has verified it (serving/spec.py
            # ENGINE_RELEASES): "gpu" = served on a real GPU (docs/gpu.md), "parser" = only
            # its flags were checked against the release's recorded parser.
            "engine_release": f"{self.settings.spec.engine} {self.settings.spec.engine_version}",
            "engine_verified": self.settings.spec.engine_release.verified,
            "gpu": c.gpu,
            "gpu_count": c.gpu_count,
            "min_containers": c.min_containers,
            "max_containers": c.max_containers,
            "region": self.settings.spec.region,
            "monthly_cost_idle_usd": c.idle_usd,
            "monthly_cost_baseline_usd": c.baseline_usd,
            "monthly_cost_worst_usd": c.worst_usd,
            # One container's requests and what each part costs an hour (components/cost.py:
            # region multiplier included; `total` also has costOverheadPct), so a preview shows
            # the CPU and memory beside the GPU.
            "cpu_cores": c.cpu_cores,
            "memory_gib": c.memory_gib,
            "container_usd_per_hour": {
                "gpu": round(c.gpu_usd_per_hour, 4),
                "cpu": round(c.cpu_usd_per_hour, 4),
                "memory": round(c.memory_usd_per_hour, 4),
                "total": round(c.container_usd_per_hour, 4),
            },
            # The unit rates those parts are priced at, before the region multiplier: the GPU
            # table's row (or gpuPricesUsdPerHour), the CPU and memory rates (cost.py's, or
            # cpuPriceUsdPerCoreHour / memoryPriceUsdPerGibHour).
            "prices_usd_per_hour": {
                "gpu": round(c.gpu_price_usd_per_hour, 6),
                "cpu_core": round(c.cpu_usd_per_core_hour, 6),
                "memory_gib": round(c.memory_usd_per_gib_hour, 6),
            },
            **(
                {"warm_schedule": self.settings.warm_schedule, "monthly_cost_warm_usd": c.warm_usd}
                if self.settings.warm_schedule
                else {}
            ),
            **(
                {"weights": {"revision": self.weights.revision, "digest": self.weights.digest}}
                if self.weights is not None
                else {}
            ),
            # Health gate (issue 11.3): policy, whether deploys are gated, and why.
            "health_gate": self.settings.health_gate,
            "health_gate_enabled": self.settings.gate_enabled,
            "health_gate_reason": self.settings.gate_reason,
            "gated_deploy_cost_usd": self.settings.gated_deploy_usd,
            "deployed_version": self.app.version,
            "previous_version": self.app.previous_version,
            "known_good_version": self.app.known_good_version,
            "deployment_tag": self.app.deployment_tag,
            "gate_result": self.app.gate_result,
            "commit": self.app.commit,
            "rollback_command": self.app.rollback_command,
        }

    def plain_api_keys(self) -> pulumi.Output[dict[str, str]]:
        """{key name: key}, a secret Output (the keys exist nowhere else)."""
        names = list(self.api_keys)
        return pulumi.Output.secret(
            pulumi.Output.all(*[k.key for k in self.api_keys.values()]).apply(
                lambda keys: dict(zip(names, keys, strict=True))
            )
        )

    def gateway_target(self, key_name: str) -> pulumi.Output[GatewayTarget]:
        """What a gateway needs to reach this service with the key `key_name` (secret)."""
        shared = self.shared
        timeouts = self.settings.spec.timeouts
        served = self.served_model_name

        def build(values: list[Any]) -> GatewayTarget:
            endpoint, key, token_id, token_secret = values
            return GatewayTarget(
                served_model_name=served,
                endpoint_url=endpoint,
                api_key=key,
                proxy_token_id=token_id,
                proxy_token_secret=token_secret,
                startup_timeout_s=timeouts.startup_s,
                request_timeout_s=timeouts.request_s,
            )

        return pulumi.Output.secret(
            pulumi.Output.all(
                self.endpoint_url,
                self.api_keys[key_name].key,
                shared.proxy_token.token_id,
                shared.proxy_token.token_secret,
            ).apply(build)
        )
