"""A `pulumi preview --json` document as the REAL CLI prints it, for the review comment's tests.

Built by hand from the shape pulumi/pulumi writes (no Pulumi CLI runs here):
pkg/backend/display/json.go `ShowPreviewDigest` fills `display.PreviewDigest`
(sdk/pkg/display/json.go: `config`, `steps`, `diagnostics`, `duration` in nanoseconds,
`changeSummary`, `maybeCorrupt`); each `PreviewStep` has `op`, `urn`, `provider`, `oldState`,
`newState` (`apitype.ResourceV3` from `stack.SerializeResource` after `stateForJSONOutput`
replaced every secret by the string "[secret]"), `diffReasons` / `replaceReasons` (omitted when
empty) and `detailedDiff` (always present, `null` without a detailed diff). Same steps are left
out (`shouldShow`) except the root Stack, whose `oldState.outputs` are the stack's last outputs;
its `newState` has none (the digest ignores ResourceOutputsEvent). A replace is ONE `replace`
step unless `--show-replacement-steps`. Our dynamic providers return no detailed diff and no
changed keys (pulumi/dynamic/__main__.py Diff), so an update has neither `diffReasons` nor a
detailed diff. A protected resource the program would replace stops the preview with an error
diagnostic (pkg/resource/deploy/step_generator.go) and no step for it.

Values are what a dev stack of this project holds (Pulumi.dev.yaml: qwen-small on an L4 with
6 CPU cores and 12 GiB, worst case $860.57) and a PR that moves it to an A10G and renames the
environment.
"""

from __future__ import annotations

import copy
from typing import Any

STACK = "dev"
PROJECT = "modal-llm"
ROOT_URN = f"urn:pulumi:{STACK}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{STACK}"
ENV_PARENT = f"urn:pulumi:{STACK}::{PROJECT}::modal-llm:serving:ServingEnvironment::dev"
SVC_PARENT = f"urn:pulumi:{STACK}::{PROJECT}::modal-llm:serving:LLMService::qwen-small"
PROVIDER = (
    f"urn:pulumi:{STACK}::{PROJECT}::pulumi:providers:pulumi-python::default"
    "::4dabf181-9307-2939-515e-22adb298388d"
)
DYN = "pulumi-python:dynamic/"
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


def _urn(parent_type: str, type_: str, name: str) -> str:
    return f"urn:pulumi:{STACK}::{PROJECT}::{parent_type}${DYN}{type_}::{name}"


ENV_URN = _urn("modal-llm:serving:ServingEnvironment", "modal:Environment", "dev-environment")
APP_URN = _urn("modal-llm:serving:LLMService", "modal:App", "qwen-small-app")
VOL_URN = _urn("modal-llm:serving:LLMService", "modal:Volume", "qwen-small-hf-cache")
SECRET_URN = _urn("modal-llm:serving:LLMService", "modal:Secret", "qwen-small-api-keys")

OLD_OUTPUTS = {
    "all_api_keys": "[secret]",
    "api_keys": "[secret]",
    "endpoint_url": "https://acme--qwen-small-serving.modal.run",
    "environment": "dev",
    "gateway_config": "[secret]",
    "gateway_config_json": "[secret]",
    "monthly_budget_usd": 900,
    "monthly_cost_baseline_usd": 0,
    "monthly_cost_idle_usd": 0,
    "monthly_cost_worst_usd": 860.57,
    "proxy_token_id": "wk-AbCdEfGhIjKlMnOpQrStUv",
    "proxy_token_secret": "[secret]",
    "served_model_name": "qwen2.5-1.5b-instruct",
    "services": {
        "qwen-small": {
            "endpoint_url": "https://acme--qwen-small-serving.modal.run",
            "gpu": "L4",
            "gpu_count": 1,
            "min_containers": 0,
            "max_containers": 1,
            "monthly_cost_idle_usd": 0,
            "monthly_cost_worst_usd": 860.57,
        }
    },
}


def _spec(gpu: str) -> str:
    # The App's spec_json input is a JSON string (serving/spec.py renders it).
    return (
        '{"context_length": 8192, "engine": "vllm", "gpu": "' + gpu + '", "model": '
        '"Qwen/Qwen2.5-1.5B-Instruct", "scaling": {"max_containers": 1, "min_containers": 0}}'
    )


def real_preview() -> dict[str, Any]:
    """PR: qwen-small L4 -> A10G (App update), environment renamed (retained Environment
    replaced; the protected cache volume would be replaced too: the preview stops on it)."""
    env_old = {
        "__provider": "[secret]",
        "adopt": False,
        "force_delete": False,
        "name": "dev",
    }
    app_old = {
        "__provider": "[secret]",
        "environment": "dev",
        "extra_env": {"SERVING_API_KEYS_SHA256": "f86d8c19603e6cd3"},
        "name": "qwen-small",
        "spec_json": _spec("L4"),
    }
    steps: list[dict[str, Any]] = [
        {
            "op": "same",
            "urn": ROOT_URN,
            "oldState": {
                "urn": ROOT_URN,
                "custom": False,
                "type": "pulumi:pulumi:Stack",
                "outputs": OLD_OUTPUTS,
                "created": "2026-11-20T10:00:00.000000000Z",
                "modified": "2026-11-26T09:00:00.000000000Z",
            },
            "newState": {"urn": ROOT_URN, "custom": False, "type": "pulumi:pulumi:Stack"},
            "detailedDiff": None,
        },
        {
            "op": "replace",
            "urn": ENV_URN,
            "provider": PROVIDER,
            "oldState": {
                "urn": ENV_URN,
                "custom": True,
                "id": "en-8h2kQ0uN3sXyZ",
                "type": f"{DYN}modal:Environment",
                "inputs": env_old,
                "outputs": {**env_old, "environment_id": "en-8h2kQ0uN3sXyZ", "web_suffix": ""},
                "parent": ENV_PARENT,
                "retainOnDelete": True,
                "provider": PROVIDER,
            },
            "newState": {
                "urn": ENV_URN,
                "custom": True,
                "type": f"{DYN}modal:Environment",
                "inputs": {**env_old, "name": "dev-b"},
                "parent": ENV_PARENT,
                "retainOnDelete": True,
                "provider": PROVIDER,
            },
            "replaceReasons": ["name"],
            "detailedDiff": None,
        },
        {
            "op": "update",
            "urn": APP_URN,
            "provider": PROVIDER,
            "oldState": {
                "urn": APP_URN,
                "custom": True,
                "id": "ap-7TfQm2",
                "type": f"{DYN}modal:App",
                "inputs": app_old,
                "outputs": {**app_old, "app_id": "ap-7TfQm2", "version": 3},
                "parent": SVC_PARENT,
                "provider": PROVIDER,
            },
            "newState": {
                "urn": APP_URN,
                "custom": True,
                "id": "ap-7TfQm2",
                "type": f"{DYN}modal:App",
                "inputs": {
                    **app_old,
                    "environment": UNKNOWN,
                    "spec_json": _spec("A10G"),
                },
                "parent": SVC_PARENT,
                "provider": PROVIDER,
            },
            "detailedDiff": None,
        },
        {
            "op": "update",
            "urn": SECRET_URN,
            "provider": PROVIDER,
            "oldState": {
                "urn": SECRET_URN,
                "custom": True,
                "id": "st-1",
                "type": f"{DYN}modal:Secret",
                "inputs": {
                    "__provider": "[secret]",
                    "name": "qwen-small-api-keys",
                    "values": "[secret]",
                },
                "parent": SVC_PARENT,
            },
            "newState": {
                "urn": SECRET_URN,
                "custom": True,
                "id": "st-1",
                "type": f"{DYN}modal:Secret",
                "inputs": {
                    "__provider": "[secret]",
                    "name": "qwen-small-api-keys",
                    "values": "[secret]",
                },
                "parent": SVC_PARENT,
            },
            "diffReasons": ["values"],
            "detailedDiff": None,
        },
    ]
    return {
        "config": {
            "modal-llm:environment": "dev-b",
            "modal-llm:hfToken": "[secret]",
            "modal-llm:monthlyBudgetUsd": "1000",
        },
        "steps": steps,
        "diagnostics": [
            {
                "urn": VOL_URN,
                "prefix": "error: ",
                "message": (
                    f'error: unable to replace resource "{VOL_URN}"\nas it is currently marked'
                    " for protection. To unprotect the resource, remove the `protect` flag from"
                    " the resource in your Pulumi program and run `pulumi up`\n"
                ),
                "severity": "error",
            }
        ],
        "duration": 4211000000,
        "changeSummary": {"replace": 1, "same": 9, "update": 2},
    }


def with_replacement_steps() -> dict[str, Any]:
    """The same preview with `--show-replacement-steps`: the replace's two halves instead."""
    doc = copy.deepcopy(real_preview())
    steps = doc["steps"]
    replace = next(s for s in steps if s["op"] == "replace")
    create = {**copy.deepcopy(replace), "op": "create-replacement"}
    delete = {**copy.deepcopy(replace), "op": "delete-replaced"}
    index = steps.index(replace)
    steps[index : index + 1] = [create, delete]
    return doc
