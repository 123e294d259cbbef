"""Gateway config rendering: the LiteLLM `model_list` entries (and a JSON form) for our services.

Pure helpers, no Pulumi resources: `__main__.py` feeds them resolved Output values inside an
`apply` and exports the result as a secret (it carries the API key and the proxy token).

Each service becomes one LiteLLM entry:
    model_name: <served model name>
    litellm_params:
      model: hosted_vllm/<served model name>   (OpenAI-compatible server, vLLM or SGLang)
      api_base: <endpoint>/v1
      api_key: <one of the service's API keys>
      extra_headers: {Modal-Key: <proxy token id>, Modal-Secret: <proxy token secret>}
      timeout: <cold start + longest request, seconds>
    model_info:
      disable_background_health_check: true
The timeout must let a request that lands on a cold container wait for the engine to start
(`timeouts.startup_s`) and then run its longest completion (`timeouts.request_s`): a shorter
gateway timeout would cut off exactly the first request after scale-to-zero.
Modal's web edge answers a request still running after 150 s with `303 See Other` to a result
URL (https://modal.com/docs/guide/webhook-timeouts); the gateway must follow it with a GET that
keeps the Modal-Key/Modal-Secret headers. LiteLLM does (tests/program/test_gateway_litellm.py);
httpx's default of 20 redirects covers 20 x 150 s = 50 min, more than the default timeout.
No health probe may reach a Modal service: each one would start a GPU (and keep it up for its
scale-down window). `model_info.disable_background_health_check` keeps it out of LiteLLM's
background loop and, with `general_settings.health_check_skip_disabled_background_models`
(components/overflow.py, which renders the full document), out of an on-demand GET /health.
The overflow form (in-house servers first, Modal on saturation) is components/overflow.py.
The gateway's own master key (LiteLLM refuses to start without one) is not part of this
output: it guards the gateway, not Modal, so scripts/gateway_config.py (`make gateway-config`)
adds it to the file it writes, generated once and kept across rewrites.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

MODAL_KEY_HEADER = "Modal-Key"
MODAL_SECRET_HEADER = "Modal-Secret"  # noqa: S105 (a header name)


@dataclass(frozen=True)
class GatewayTarget:
    """Everything needed to route one model through a gateway (values already resolved)."""

    served_model_name: str
    endpoint_url: str
    api_key: str
    proxy_token_id: str
    proxy_token_secret: str
    startup_timeout_s: int
    request_timeout_s: int


def gateway_timeout_s(startup_timeout_s: int, request_timeout_s: int) -> int:
    """Gateway-side timeout: a cold start followed by the longest allowed request."""
    return int(startup_timeout_s) + int(request_timeout_s)


def api_base(endpoint_url: str) -> str:
    """OpenAI-style base URL of a service: its endpoint with `/v1`, without a double slash."""
    base = endpoint_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def litellm_entry(target: GatewayTarget) -> dict[str, Any]:
    """One LiteLLM `model_list` entry for a service."""
    return {
        "model_name": target.served_model_name,
        "litellm_params": {
            "model": f"hosted_vllm/{target.served_model_name}",
            "api_base": api_base(target.endpoint_url),
            "api_key": target.api_key,
            "extra_headers": {
                MODAL_KEY_HEADER: target.proxy_token_id,
                MODAL_SECRET_HEADER: target.proxy_token_secret,
            },
            "timeout": gateway_timeout_s(target.startup_timeout_s, target.request_timeout_s),
        },
        # litellm 1.106.12 proxy/proxy_server.py drops these from its background health loop.
        "model_info": {"disable_background_health_check": True},
    }


def document_yaml(doc: dict[str, Any]) -> str:
    """A gateway document as YAML (the `gateway_config` stack output)."""
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def document_json(doc: dict[str, Any]) -> str:
    """A gateway document as JSON (the `gateway_config_json` output, for other gateways)."""
    return json.dumps(doc, indent=2, sort_keys=False)
