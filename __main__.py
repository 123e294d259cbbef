"""The Pulumi program: validate the stack config, build the services, export their outputs.

One `ServingEnvironment` per stack (environment, HF token secret, proxy-auth token, spend
alert) and one `LLMService` per entry of `modal-llm:services`. Outputs: docs/program.md
("Outputs"). The top-level per-service names of the design contract (`endpoint_url`,
`served_model_name`, `api_keys`) describe the FIRST service only; with several services read
`services` (every service's endpoint, model, costs) and `all_api_keys`. Stack-wide outputs
(environment, proxy token, gateway configs, cost totals) cover every service.
"""

from pathlib import Path

import pulumi

from components.config import ConfigError, load_stack_config
from components.gateway import document_json, document_yaml
from components.llm_service import LLMService, ServingEnvironment
from components.monitoring import monitoring_outputs
from components.overflow import gateway_document, load_overflow

try:
    cfg, secrets = load_stack_config(
        stack_file=Path(__file__).with_name(f"Pulumi.{pulumi.get_stack()}.yaml")
    )
    overflow = load_overflow(cfg)  # in-house endpoints the gateway tries before Modal
except ConfigError as exc:
    raise pulumi.RunError(f"invalid stack config: {exc}") from None

shared = ServingEnvironment(cfg.environment, cfg, secrets)
services = [LLMService(settings, cfg, shared) for settings in cfg.services]
targets = pulumi.Output.all(*[s.gateway_target(cfg.api_key_names[0]) for s in services])
gateway = gateway_document(targets, overflow)  # secret: API keys, proxy token, in-house keys
first = services[0]  # the design's single-service outputs; see `services` for all of them

pulumi.export("environment", shared.environment_name)
pulumi.export("endpoint_url", first.endpoint_url)
pulumi.export("served_model_name", first.served_model_name)
pulumi.export("proxy_token_id", shared.proxy_token.token_id)
pulumi.export("proxy_token_secret", pulumi.Output.secret(shared.proxy_token.token_secret))
pulumi.export("api_keys", first.plain_api_keys())
pulumi.export("all_api_keys", pulumi.Output.secret({s.name: s.plain_api_keys() for s in services}))
pulumi.export("gateway_config", pulumi.Output.secret(gateway.apply(document_yaml)))
pulumi.export("gateway_config_json", pulumi.Output.secret(gateway.apply(document_json)))
pulumi.export("monthly_cost_idle_usd", cfg.cost.idle_usd)
pulumi.export("monthly_cost_baseline_usd", cfg.cost.baseline_usd)
pulumi.export("monthly_cost_worst_usd", cfg.cost.worst_usd)
pulumi.export("monthly_budget_usd", cfg.monthly_budget_usd)
pulumi.export("services", {s.name: s.summary() for s in services})
# Alert rules and a Grafana dashboard for the team's monitoring (docs/monitoring.md); not secret.
names = [s.name for s in cfg.services]
watch = monitoring_outputs(names, pulumi.get_stack(), cfg.environment, cfg.alert_thresholds)
for output_name, text in watch.items():
    pulumi.export(output_name, text)
