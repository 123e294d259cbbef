"""The Pulumi program under mocks, with each stack's real Pulumi.<stack>.yaml as config.

Checks what `pulumi up` would register (resources, parents, dependencies, protection), what it
exports (values, secretness, the gateway config), and the config errors a user can hit.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.output import Unknown
from pulumi.runtime import rpc

from components.config import DEFAULTS, HF_TOKEN_SECRET_NAME, PROJECT, StackSettings
from components.llm_service import (
    SPEND_WATCH_APP_FILE,
    SPEND_WATCH_APP_NAME,
    SPEND_WATCH_SECRET_NAME,
    SPEND_WEBHOOK_ENV,
)
from serving.spec import ServingSpec
from tests.program.runner import (
    PROJECT_ROOT,
    TEST_SECRETS,
    ProgramMocks,
    ProgramRun,
    Registration,
    run_program,
    stack_config,
)

STACKS = ("local", "dev", "prod")
NS = PROJECT + ":"
ENV_COMPONENT = "modal-llm:serving:ServingEnvironment"
SERVICE_COMPONENT = "modal-llm:serving:LLMService"
EXPECTED_OUTPUTS = {
    "monitoring_rules_yaml",
    "grafana_dashboard_json",
    "environment",
    "endpoint_url",
    "served_model_name",
    "proxy_token_id",
    "proxy_token_secret",
    "api_keys",
    "all_api_keys",
    "gateway_config",
    "gateway_config_json",
    "monthly_cost_idle_usd",
    "monthly_cost_baseline_usd",
    "monthly_cost_worst_usd",
    "monthly_budget_usd",
    "services",
}
SECRET_OUTPUTS = {
    "proxy_token_secret",
    "api_keys",
    "all_api_keys",
    "gateway_config",
    "gateway_config_json",
}


# The cost model as documented (components/cost.py, docs/program.md "Cost guard"), computed here:
# container $/h = (GPU $/h x gpu_count + cores x $0.04716 + GiB x $0.007992) x region
# x (1 + costOverheadPct / 100), x 730 h a month. The CPU and memory requests are the spec's
# derived ones (docs/serving.md "CPU and memory"): vLLM's defaults 6 cores / 12 GiB (4 API
# servers), with snapshot 3 / 6 GiB (1 API server); SGLang's defaults 4 / 8 GiB.
CPU_USD_PER_CORE_HOUR = 0.0000131 * 3600
MEMORY_USD_PER_GIB_HOUR = 0.00000222 * 3600
VLLM_DEFAULT = (6, 12)
VLLM_SNAPSHOT = (3, 6)
SGLANG_DEFAULT = (4, 8)


def month_usd(
    gpu_usd: float, cpu_mem: tuple[int, int], *, containers: int = 1, region: float = 1.0,
    overhead_pct: float = 0.0,
) -> float:  # fmt: skip
    cores, gib = cpu_mem
    hourly = gpu_usd + cores * CPU_USD_PER_CORE_HOUR + gib * MEMORY_USD_PER_GIB_HOUR
    return round(containers * hourly * region * (1 + overhead_pct / 100) * 730, 2)


def _stack_yaml(stack: str) -> dict[str, Any]:
    data = yaml.safe_load((PROJECT_ROOT / f"Pulumi.{stack}.yaml").read_text())
    config = data["config"]
    assert isinstance(config, dict)
    return config


def _with_secrets(stack: str, **overrides: Any) -> tuple[dict[str, str], list[str]]:
    """The stack's config plus the secrets a real stack sets with --secret (prod and dev)."""
    extra: dict[str, Any] = {}
    if stack != "local":
        extra = {f"{NS}hfToken": {"secure": "x"}, f"{NS}alertWebhookUrl": {"secure": "x"}}
    extra.update({NS + k: v for k, v in overrides.items()})
    return stack_config(stack, extra)


def _parent_type(run: ProgramRun, r: Registration) -> str:
    if r.parent.split("::")[2] == "pulumi:pulumi:Stack":
        return "stack"
    return run.by_urn(r.parent).type


def _plain(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return _plain(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# ---- Pulumi.yaml and the stack files --------------------------------------------------------


def test_project_file_declares_every_scalar_setting_as_the_cli_requires() -> None:
    project = yaml.safe_load((PROJECT_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == PROJECT
    assert project["runtime"] == {
        "name": "python",
        "options": {"toolchain": "pip", "virtualenv": ".venv"},
    }
    schema = project["config"]
    # The CLI's project schema (sdk/go/common/workspace/project.json): type, when given, is one
    # of these, arrays need items, a default must match its type; there is no object type, so
    # structured keys are declared untyped (description only).
    python_types = {"string": str, "integer": int, "boolean": bool, "array": list}
    for key, decl in schema.items():
        assert set(decl) <= {"type", "description", "default", "items", "secret"}, key
        assert decl.get("description"), f"{key} needs a description"
        if "type" not in decl:
            # Untyped: no default (how the CLI encodes an object default is unverified), so
            # the key is required, which only suits keys every stack sets.
            assert "default" not in decl, key
            for stack in STACKS:
                assert NS + key in _stack_yaml(stack), f"{stack} lacks required {key}"
            continue
        assert decl["type"] in python_types, key
        if decl["type"] == "array":
            assert decl["items"]["type"] in {"string", "integer", "boolean"}, key
        if "default" in decl:
            assert isinstance(decl["default"], python_types[decl["type"]]), key
    # Pulumi.yaml's defaults, as the CLI hands them over, make the same settings as the model's
    # own defaults (components/config.py StackSettings): one set of defaults, stated twice only
    # because the CLI needs them in Pulumi.yaml.
    defaults = {k: d["default"] for k, d in schema.items() if "default" in d}
    assert set(defaults) <= set(DEFAULTS)
    least = {"environment": "x", "services": [{"name": "a", "engine": "vllm", "model": "o/m"}]}
    cli = {k: v if isinstance(v, str) else json.dumps(v) for k, v in defaults.items()}
    keys = {StackSettings.model_fields[n].alias or n: n for n in StackSettings.model_fields}
    with_project = StackSettings.model_validate({**least, **cli})
    without = StackSettings.model_validate(least)
    for key in defaults:
        assert getattr(with_project, keys[key]) == getattr(without, keys[key]), key
    assert "default" not in schema["environment"], "every stack must name its environment"
    assert "type" not in schema["services"] and "default" not in schema["services"]


@pytest.mark.parametrize("stack", STACKS)
def test_stack_file_holds_no_secret_in_clear(stack: str) -> None:
    config = _stack_yaml(stack)
    for key, value in config.items():
        assert key.startswith((NS, "modal:")), f"{key}: unknown namespace"
        secret_keys = {"hfToken", "alertWebhookUrl", "alertWatchToken", "tokenSecret"}
        if key.rsplit(":", 1)[1] in secret_keys:
            assert isinstance(value, dict) and set(value) == {"secure"}, f"{key} in clear"


# ---- each stack under mocks ------------------------------------------------------------------


@pytest.fixture(scope="module", params=STACKS)
def stack_run(request: pytest.FixtureRequest) -> tuple[str, ProgramRun]:
    stack = request.param
    config, secret_keys = _with_secrets(stack)
    return stack, run_program(stack, config, secret_keys)


def test_resources_created(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    config = _stack_yaml(stack)
    services = config[NS + "services"]
    key_names = config.get(NS + "apiKeyNames", DEFAULTS["apiKeyNames"])
    n = len(services)
    counts = {t: len(run.of_type(t)) for t in {r.short_type for r in run.resources}}
    assert counts == {
        ENV_COMPONENT: 1,
        SERVICE_COMPONENT: n,
        "modal:Environment": 1,
        # api-keys (+ HF token and the spend watcher's secret where a webhook is set)
        "modal:Secret": n + (0 if stack == "local" else 2),
        "modal:Volume": 2 * n,
        "modal:ProxyAuthToken": 1,
        "modal:SpendAlert": 1,
        "modal:App": n,
        "llm:ApiKey": n * len(key_names),
        **({} if stack == "local" else {"modal:SpendWatch": 1}),
    }


def test_parents_and_environment_wiring(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    env_name = _stack_yaml(stack)[NS + "environment"]
    (env,) = run.of_type("modal:Environment")
    assert env.inputs["name"] == env_name
    assert env.inputs["adopt"] is False
    for r in run.resources:
        if r.short_type in (ENV_COMPONENT, SERVICE_COMPONENT):
            assert _parent_type(run, r) == "stack", r.name
        elif r.short_type in (
            "modal:Environment",
            "modal:ProxyAuthToken",
            "modal:SpendAlert",
            "modal:SpendWatch",
        ):
            assert _parent_type(run, r) == ENV_COMPONENT, r.name
        elif r.short_type == "modal:Secret" and r.inputs["name"] in (
            HF_TOKEN_SECRET_NAME,
            SPEND_WATCH_SECRET_NAME,
        ):
            assert _parent_type(run, r) == ENV_COMPONENT
        else:
            assert _parent_type(run, r) == SERVICE_COMPONENT, r.name
        # Every Modal object lives in the stack's environment, created first by the engine.
        if "environment" in r.inputs:
            assert r.inputs["environment"] == env_name, r.name
            assert env.urn in r.property_dependencies["environment"], r.name
            assert env.urn in r.dependencies, r.name
    (token,) = run.of_type("modal:ProxyAuthToken")
    assert token.inputs["environments"] == [env_name]
    assert env.urn in token.dependencies


def test_app_wiring_and_rendered_spec(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    services = _stack_yaml(stack)[NS + "services"]
    hf = [s for s in run.of_type("modal:Secret") if s.inputs["name"] == HF_TOKEN_SECRET_NAME]
    for entry, app in zip(services, run.of_type("modal:App"), strict=True):
        spec = ServingSpec.from_json(app.inputs["spec_json"])
        assert app.inputs["name"] == entry["name"]
        assert app.inputs["app_file"] == "serving/app.py"
        assert spec.model == entry["model"]
        assert spec.served_model_name == entry["served_model_name"]
        assert spec.require_pinned_revision is (stack == "prod")
        # The App mounts exactly the volumes and secrets this service created, after them.
        siblings = [r for r in run.resources if r.parent == app.parent and r is not app]
        vols = {r.inputs["name"]: r.urn for r in siblings if r.short_type == "modal:Volume"}
        assert set(vols) == {spec.volumes.hf_cache, spec.volumes.engine_cache}
        (keys_secret,) = [r for r in siblings if r.short_type == "modal:Secret"]
        assert keys_secret.inputs["name"] == spec.secrets.api_keys
        assert spec.secrets.hf_token == (HF_TOKEN_SECRET_NAME if hf else None)
        wanted = {*vols.values(), keys_secret.urn, *(s.urn for s in hf)}
        assert wanted <= set(app.dependencies)


def test_api_key_digests_feed_the_proxy_secret(stack_run: tuple[str, ProgramRun]) -> None:
    _, run = stack_run
    for app in run.of_type("modal:App"):
        siblings = [r for r in run.resources if r.parent == app.parent]
        keys = [r for r in siblings if r.short_type == "llm:ApiKey"]
        assert keys and all(k.additional_secret_outputs == ["key"] for k in keys)
        (secret,) = [r for r in siblings if r.short_type == "modal:Secret"]
        digests = json.loads(_plain(secret.inputs["values"])["SERVING_API_KEYS"])
        assert digests == {k.inputs["name"]: k.outputs["digest"] for k in keys}
        assert {k.urn for k in keys} <= set(secret.dependencies)


def test_cache_volume_protection(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    for vol in run.of_type("modal:Volume"):
        assert vol.protect is (stack == "prod"), vol.name
        assert vol.retain_on_delete is (stack == "prod"), vol.name
    for r in run.resources:
        if r.short_type != "modal:Volume":
            assert not r.protect, r.name


def test_spend_alert_and_hf_secret(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    config = _stack_yaml(stack)
    (alert,) = run.of_type("modal:SpendAlert")
    assert alert.inputs["monthly_budget_usd"] == config[NS + "monthlyBudgetUsd"]
    pct = config.get(NS + "alertThresholdsPct", DEFAULTS["alertThresholdsPct"])
    assert alert.inputs["thresholds"] == [p / 100 for p in pct]
    hf = [s for s in run.of_type("modal:Secret") if s.inputs["name"] == HF_TOKEN_SECRET_NAME]
    assert "webhook_url" not in alert.inputs  # the SpendAlert never posts (issue 14 item 7)
    watch_secret = [
        s for s in run.of_type("modal:Secret") if s.inputs["name"] == SPEND_WATCH_SECRET_NAME
    ]
    if stack == "local":
        assert not hf and not watch_secret and not run.of_type("modal:SpendWatch")
    else:
        assert rpc.is_rpc_secret(hf[0].inputs["values"]), "HF token must reach Modal as secret"
        assert _plain(hf[0].inputs["values"]) == {"HF_TOKEN": TEST_SECRETS[NS + "hfToken"]}
        # The webhook reaches Modal only inside the watcher's secret, as a secret.
        assert rpc.is_rpc_secret(watch_secret[0].inputs["values"])
        assert _plain(watch_secret[0].inputs["values"]) == {
            SPEND_WEBHOOK_ENV: TEST_SECRETS[NS + "alertWebhookUrl"]
        }
        (watch,) = run.of_type("modal:SpendWatch")
        assert watch.inputs["app_file"] == SPEND_WATCH_APP_FILE
        assert watch.inputs["name"] == SPEND_WATCH_APP_NAME
        assert watch_secret[0].urn in watch.dependencies and alert.urn in watch.dependencies
        spec = json.loads(watch.inputs["spec_json"])
        assert spec["thresholds"] == alert.inputs["thresholds"]
        assert spec["secret"] == SPEND_WATCH_SECRET_NAME
        assert spec["environment"] == config[NS + "environment"]


def test_outputs(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    config = _stack_yaml(stack)
    services = config[NS + "services"]
    key_names = config.get(NS + "apiKeyNames", DEFAULTS["apiKeyNames"])
    assert set(run.outputs) == EXPECTED_OUTPUTS
    for name in EXPECTED_OUTPUTS:
        assert run.is_secret(name) is (name in SECRET_OUTPUTS), name
    first = services[0]
    assert run.output("environment") == config[NS + "environment"]
    assert run.output("endpoint_url") == f"https://mock-workspace--{first['name']}.modal.run"
    assert run.output("served_model_name") == first["served_model_name"]
    assert run.output("proxy_token_id").startswith("wk-")
    assert run.output("proxy_token_secret").startswith("ws-")
    assert set(run.output("api_keys")) == set(key_names)
    assert run.output("monthly_budget_usd") == config[NS + "monthlyBudgetUsd"]
    # (GPU + CPU + memory) $/h x 730 h; costOverheadPct defaults to 0
    expected = {
        "local": (0.0, month_usd(0.59, VLLM_DEFAULT)),  # 1 x T4, 6 cores, 12 GiB
        "dev": (0.0, month_usd(0.80, VLLM_DEFAULT)),  # 1 x L4
        # 1 (idle) / 4 (worst) x H200 with snapshot: 3 cores, 6 GiB
        "prod": (month_usd(4.54, VLLM_SNAPSHOT), month_usd(4.54, VLLM_SNAPSHOT, containers=4)),
    }[stack]
    assert expected == {"local": (0.0, 707.27), "dev": (0.0, 860.57)}.get(
        stack, (3452.49, 13809.94)
    )
    assert (run.output("monthly_cost_idle_usd"), run.output("monthly_cost_worst_usd")) == expected
    assert run.output("monthly_cost_baseline_usd") == expected[0]  # no buffer containers
    assert expected[1] <= run.output("monthly_budget_usd")
    summary = run.output("services")[first["name"]]
    assert summary["endpoint_url"] == run.output("endpoint_url")
    assert summary["served_model_name"] == first["served_model_name"]
    assert summary["monthly_cost_worst_usd"] == expected[1]
    # one container's requests and its $/h by part, shown in every preview
    cores, gib = VLLM_SNAPSHOT if stack == "prod" else VLLM_DEFAULT
    assert (summary["cpu_cores"], summary["memory_gib"]) == (cores, gib)
    gpu_usd = {"local": 0.59, "dev": 0.80, "prod": 4.54}[stack]
    assert summary["container_usd_per_hour"] == {
        "gpu": gpu_usd,
        "cpu": round(cores * CPU_USD_PER_CORE_HOUR, 4),
        "memory": round(gib * MEMORY_USD_PER_GIB_HOUR, 4),
        "total": round(gpu_usd + cores * CPU_USD_PER_CORE_HOUR + gib * MEMORY_USD_PER_GIB_HOUR, 4),
    }
    # Which engine release, and how far it is verified: the committed stacks pin the image
    # releases, which only their recorded parsers checked (docs/gpu.md ran vLLM 0.26.0).
    engine = first.get("engine", "vllm")
    assert summary["engine_release"] == {"vllm": "vllm 0.33.0", "sglang": "sglang 0.5.23"}[engine]
    assert summary["engine_verified"] == "parser"


def test_gateway_config_routes_through_modal_proxy_auth(stack_run: tuple[str, ProgramRun]) -> None:
    stack, run = stack_run
    services = _stack_yaml(stack)[NS + "services"]
    doc = yaml.safe_load(run.output("gateway_config"))
    assert doc == json.loads(run.output("gateway_config_json"))
    (entry,) = doc["model_list"]
    params = entry["litellm_params"]
    first = services[0]
    assert entry["model_name"] == first["served_model_name"]
    assert params["model"] == f"hosted_vllm/{first['served_model_name']}"
    assert params["api_base"] == run.output("endpoint_url") + "/v1"
    gateway_key = _stack_yaml(stack).get(NS + "apiKeyNames", DEFAULTS["apiKeyNames"])[0]
    assert params["api_key"] == run.output("api_keys")[gateway_key]
    assert params["extra_headers"] == {
        "Modal-Key": run.output("proxy_token_id"),
        "Modal-Secret": run.output("proxy_token_secret"),
    }
    # A cold request waits for the engine to start, then runs its longest completion.
    assert params["timeout"] == first["timeouts"]["startup_s"] + first["timeouts"]["request_s"]


def test_no_secret_value_outside_secrets(stack_run: tuple[str, ProgramRun]) -> None:
    _, run = stack_run
    secret_values = set(TEST_SECRETS.values())
    secret_values |= set(run.output("api_keys").values())
    secret_values.add(run.output("proxy_token_secret"))
    plain_outputs = json.dumps({k: v for k, v in run.outputs.items() if k not in SECRET_OUTPUTS})
    for value in secret_values:
        assert value not in plain_outputs
    for r in run.resources:
        visible = {k: v for k, v in r.inputs.items() if not rpc.is_rpc_secret(v)}
        text = json.dumps(visible, default=str)
        for value in secret_values:
            assert value not in text, f"{r.name} carries a secret value in a plain input"


# ---- several models in one stack -------------------------------------------------------------


def test_two_services_in_one_stack() -> None:
    services = [
        *_stack_yaml("dev")[NS + "services"],
        {"name": "coder", "engine": "sglang", "model": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
         "gpu": ["L4", "A10"], "scaling": {"max_containers": 1}},
    ]  # fmt: skip
    config, secret_keys = _with_secrets("dev", services=services, monthlyBudgetUsd=2000)
    run = run_program("dev", config, secret_keys)
    assert len(run.of_type("modal:App")) == 2
    assert len(run.of_type("modal:Environment")) == 1
    assert set(run.output("services")) == {"qwen-small", "coder"}
    assert set(run.output("all_api_keys")) == {"qwen-small", "coder"}
    models = [e["model_name"] for e in yaml.safe_load(run.output("gateway_config"))["model_list"]]
    assert models == ["qwen2.5-1.5b-instruct", "coder"]
    # Priced at the dearer GPU of the preference list (A10 $1.10/h > L4 $0.80/h).
    assert run.output("services")["coder"]["gpu"] == "A10"
    # qwen-small: L4 with vLLM's defaults; coder: A10 with SGLang's
    both = month_usd(0.80, VLLM_DEFAULT) + month_usd(1.10, SGLANG_DEFAULT)
    assert run.output("monthly_cost_worst_usd") == pytest.approx(both)
    assert run.output("served_model_name") == "qwen2.5-1.5b-instruct"  # the first service
    # Per-service facts for every service, not only the first.
    for svc in ("qwen-small", "coder"):
        assert run.output("services")[svc]["endpoint_url"].endswith(f"--{svc}.modal.run")


def test_adopt_and_cache_retention_wiring() -> None:
    """Issue 9.3: `adopt: true` on a service reaches its App, volumes and key secret (what can
    pre-exist); adoptEnvironment covers the environment and the stack's HF token secret.
    Issue 14.3: with protectCaches the environment is retained too (deleting it would delete
    the retained volumes). The App gets the spec's digest from the validated ServingSpec."""
    services = [{**_stack_yaml("dev")[NS + "services"][0], "adopt": True}]
    config, secret_keys = _with_secrets(
        "dev", services=services, adoptEnvironment=True, protectCaches=True
    )
    run = run_program("dev", config, secret_keys)
    (env,) = run.of_type("modal:Environment")
    assert env.inputs["adopt"] is True and env.retain_on_delete
    for r in run.resources:
        if r.short_type in ("modal:App", "modal:Volume", "modal:Secret"):
            assert r.inputs["adopt"] is True, r.name
    (app,) = run.of_type("modal:App")
    assert app.inputs["spec_digest"] == ServingSpec.from_json(app.inputs["spec_json"]).digest()
    bad = [{**services[0], "adopt": "yes"}]
    message = _error("dev", *_with_secrets("dev", services=bad))
    assert "modal-llm:services[0].adopt = 'yes' must be true or false" in message


# ---- config errors ---------------------------------------------------------------------------


def _error(stack: str, config: dict[str, str], secret_keys: list[str]) -> str:
    with pytest.raises(pulumi.RunError) as info:
        run_program(stack, config, secret_keys)
    return str(info.value)


def test_bad_gpu_is_named_with_the_known_ones() -> None:
    services = _stack_yaml("prod")[NS + "services"]
    services[0]["gpu"] = "H900"
    message = _error("prod", *_with_secrets("prod", services=services))
    assert "modal-llm:services[0].gpu" in message
    assert "unknown GPU 'H900'" in message
    assert "H200" in message and "services[0].gpu" in message


def test_prod_requires_a_pinned_revision() -> None:
    services = _stack_yaml("prod")[NS + "services"]
    del services[0]["revision"]
    message = _error("prod", *_with_secrets("prod", services=services))
    assert "modal-llm:services[0].revision = None" in message
    assert "requirePinnedRevision" in message and "40-hex commit sha" in message
    services[0]["revision"] = "main"
    message = _error("prod", *_with_secrets("prod", services=services))
    assert "services[0].revision = 'main'" in message


def test_budget_exceeded_says_by_how_much_and_which_knob() -> None:
    message = _error("prod", *_with_secrets("prod", monthlyBudgetUsd=10000))
    worst = month_usd(4.54, VLLM_SNAPSHOT, containers=4)  # $13,809.94
    assert f"worst-case monthly cost ${worst:,.2f} exceeds modal-llm:monthlyBudgetUsd" in message
    assert f"by ${worst - 10000:,.2f}" in message
    hourly = 4.54 + 3 * CPU_USD_PER_CORE_HOUR + 6 * MEMORY_USD_PER_GIB_HOUR
    assert (
        f"4 x (1 x H200 $4.54/h + 3 CPU cores x $0.04716/h + 6 GiB x $0.007992/h = "
        f"${hourly:.4f}/h) x 730 h = ${worst:,.2f}"
    ) in message
    # one container-month is $3,452.49: two fit in $10,000
    assert "services[0].scaling.max_containers <= 2 would fit" in message
    assert "pulumi config set modal-llm:monthlyBudgetUsd 13810" in message
    assert "allowOverBudget true" in message


def test_allow_over_budget_deploys_and_still_reports_cost() -> None:
    config, keys = _with_secrets("prod", monthlyBudgetUsd=10000, allowOverBudget=True)
    run = run_program("prod", config, keys)
    assert run.output("monthly_cost_worst_usd") == month_usd(4.54, VLLM_SNAPSHOT, containers=4)
    assert run.output("monthly_budget_usd") == 10000


def test_secret_in_clear_is_refused() -> None:
    config, secret_keys = _with_secrets("dev")
    secret_keys.remove(NS + "hfToken")
    message = _error("dev", config, secret_keys)
    assert "modal-llm:hfToken is stored in clear" in message
    assert TEST_SECRETS[NS + "hfToken"] not in message
    assert "pulumi config set --secret modal-llm:hfToken" in message


def test_unknown_key_and_missing_environment() -> None:
    config, keys = _with_secrets("dev", monthlyBudgetUSD=5)
    message = _error("dev", config, keys)
    assert (
        "modal-llm:monthlyBudgetUSD is not a known key; did you mean 'monthlyBudgetUsd'?" in message
    )
    assert "pulumi config rm modal-llm:monthlyBudgetUSD" in message
    config, keys = _with_secrets("dev")
    del config[NS + "environment"]
    message = _error("dev", config, keys)
    assert "modal-llm:environment is not set" in message
    assert "pulumi config set modal-llm:environment" in message


def test_config_delivered_the_way_the_cli_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `pulumi up` config and secret keys arrive in env PULUMI_CONFIG(_SECRET_KEYS)."""
    config, secret_keys = _with_secrets("dev")
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(config))
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", json.dumps(secret_keys))
    run = run_program("dev", {}, [])
    assert run.output("environment") == "dev"
    (hf,) = [s for s in run.of_type("modal:Secret") if s.inputs["name"] == HF_TOKEN_SECRET_NAME]
    assert rpc.is_rpc_secret(hf.inputs["values"])
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({**config, NS + "typoKey": "1"}))
    assert "modal-llm:typoKey is not a known key" in _error("dev", {}, [])
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", "[]")
    assert "modal-llm:hfToken is stored in clear" in _error("dev", {}, [])


def test_preview_of_a_new_stack_still_shows_the_cost() -> None:
    """In a first preview no provider has run: every provider output is unknown."""

    def inputs_only(typ: str, name: str, inputs: Any) -> dict[str, Any]:
        return {k: v for k, v in inputs.items() if k != "__provider"}

    config, keys = _with_secrets("prod")
    run = run_program("prod", config, keys, mocks=ProgramMocks(inputs_only), preview=True)
    assert run.output("monthly_cost_worst_usd") == month_usd(4.54, VLLM_SNAPSHOT, containers=4)
    assert run.output("monthly_cost_idle_usd") == month_usd(4.54, VLLM_SNAPSHOT)
    assert len(run.of_type("modal:App")) == 1
    # Values that only exist after `up` are unknown, as `pulumi preview` shows them.
    assert isinstance(run.outputs["endpoint_url"], Unknown)
    assert isinstance(rpc.unwrap_rpc_secret(run.outputs["gateway_config"]), Unknown)


def test_adopted_environment_is_never_deleted() -> None:
    config, keys = _with_secrets("dev", environment="main", adoptEnvironment=True)
    run = run_program("dev", config, keys)
    (env,) = run.of_type("modal:Environment")
    assert env.inputs["name"] == "main" and env.inputs["adopt"] is True
    assert env.retain_on_delete is True


# ---- the stack files exactly as committed (no test secrets added) ---------------------------


def test_each_stack_as_committed() -> None:
    """local and dev deploy as committed; prod refuses until its HF token is set (Gemma is
    gated), naming the command that sets it."""
    for stack in ("local", "dev"):
        run = run_program(stack, *stack_config(stack))
        assert not [
            s for s in run.of_type("modal:Secret") if s.inputs["name"] == "huggingface-token"
        ]
        (alert,) = run.of_type("modal:SpendAlert")
        assert alert.inputs.get("webhook_url") is None
    message = _error("prod", *stack_config("prod"))
    assert "modal-llm:services[0].gated is true" in message
    assert "'google/gemma-3-27b-it'" in message
    assert "pulumi config set --secret modal-llm:hfToken" in message


def test_gated_flag_is_not_a_spec_field_and_is_typed() -> None:
    services = _stack_yaml("prod")[NS + "services"]
    config, keys = _with_secrets("prod")
    run = run_program("prod", config, keys)
    (app,) = run.of_type("modal:App")
    assert "gated" not in json.loads(app.inputs["spec_json"])
    services[0]["gated"] = "yes"
    message = _error("prod", *_with_secrets("prod", services=services))
    assert "services[0].gated = 'yes' must be true or false" in message


def test_modal_token_secret_in_clear_is_refused() -> None:
    config, keys = _with_secrets("dev")
    config["modal:tokenSecret"] = "as-clear-text-token-0123"
    message = _error("dev", config, keys)
    assert "modal:tokenSecret is stored in clear in Pulumi.dev.yaml" in message
    assert "as-clear-text-token-0123" not in message
    assert "pulumi config rm modal:tokenSecret" in message
    run_program("dev", config, [*keys, "modal:tokenSecret"])  # set with --secret: accepted


# ---- API keys: a change rolls the App; rotation from config ---------------------------------


def _app_keys_hash(run: ProgramRun) -> str:
    (app,) = run.of_type("modal:App")
    value = app.inputs["extra_env"]["SERVING_API_KEYS_SHA256"]
    assert isinstance(value, str) and len(value) == 64
    return value


def test_api_key_change_changes_the_app_inputs() -> None:
    """The proxy reads SERVING_API_KEYS at container start only: a key change must redeploy."""
    run = run_program("dev", *_with_secrets("dev"))
    (secret,) = [r for r in run.of_type("modal:Secret") if r.name.endswith("-api-keys")]
    digests = _plain(secret.inputs["values"])["SERVING_API_KEYS"]
    assert _app_keys_hash(run) == hashlib.sha256(digests.encode()).hexdigest()
    (app,) = run.of_type("modal:App")
    assert not rpc.is_rpc_secret(app.inputs["extra_env"])  # a hash of digests, not a secret
    fewer = run_program("dev", *_with_secrets("dev", apiKeyNames=["gateway"]))
    assert _app_keys_hash(fewer) != _app_keys_hash(run)


def test_api_key_rotation_from_config() -> None:
    run = run_program("dev", *_with_secrets("dev", apiKeyRotation={"ci": "2026-12-01"}))
    rotation = {k.inputs["name"]: k.inputs["rotation"] for k in run.of_type("llm:ApiKey")}
    assert rotation == {"gateway": "", "ci": "2026-12-01"}
    message = _error("dev", *_with_secrets("dev", apiKeyRotation={"gatewy": "x"}))
    assert "modal-llm:apiKeyRotation names key 'gatewy'" in message
    assert "did you mean 'gateway'?" in message
    assert "['gateway', 'ci']" in message


# ---- cost guard knobs -------------------------------------------------------------------------


def test_price_override_keys_are_modal_gpu_names() -> None:
    run = run_program("dev", *_with_secrets("dev", gpuPricesUsdPerHour={"l4": 0.7}))
    assert run.output("monthly_cost_worst_usd") == month_usd(0.7, VLLM_DEFAULT)
    message = _error("dev", *_with_secrets("dev", gpuPricesUsdPerHour={"L-4": 1.0}))
    assert "gpuPricesUsdPerHour.L-4 = 'L-4' is not a Modal GPU type" in message
    assert "did you mean 'L4'?" in message


def test_region_pinning_and_overhead_are_priced() -> None:
    services = _stack_yaml("dev")[NS + "services"]
    services[0]["region"] = "us-east"  # narrow region: x1.75 on GPU, CPU and memory
    run = run_program(
        "dev", *_with_secrets("dev", services=services, costOverheadPct=15, monthlyBudgetUsd=3000)
    )
    expected = month_usd(0.80, VLLM_DEFAULT, region=1.75, overhead_pct=15)
    assert run.output("monthly_cost_worst_usd") == pytest.approx(expected, abs=0.01)
    assert run.output("services")["qwen-small"]["region"] == "us-east"
    services[0]["region"] = "us"  # broad region: x1.5
    run = run_program("dev", *_with_secrets("dev", services=services, monthlyBudgetUsd=3000))
    expected = month_usd(0.80, VLLM_DEFAULT, region=1.5)  # the default overhead is 0
    assert run.output("monthly_cost_worst_usd") == pytest.approx(expected, abs=0.01)


def test_cpu_and_memory_overrides_are_priced() -> None:
    """A service's own cpu / memory_gib are what the cost model prices."""
    services = _stack_yaml("dev")[NS + "services"]
    services[0]["cpu"] = 10
    services[0]["memory_gib"] = 40
    run = run_program("dev", *_with_secrets("dev", services=services, monthlyBudgetUsd=3000))
    assert run.output("monthly_cost_worst_usd") == month_usd(0.80, (10, 40))
    summary = run.output("services")["qwen-small"]
    assert (summary["cpu_cores"], summary["memory_gib"]) == (10, 40)


def test_buffer_containers_in_the_baseline_not_the_idle_figure() -> None:
    services = _stack_yaml("prod")[NS + "services"]
    services[0]["scaling"]["buffer_containers"] = 1
    run = run_program("prod", *_with_secrets("prod", services=services))
    assert run.output("monthly_cost_idle_usd") == month_usd(4.54, VLLM_SNAPSHOT)
    assert run.output("monthly_cost_baseline_usd") == month_usd(4.54, VLLM_SNAPSHOT, containers=2)


def test_project_defaults_reach_the_program_as_the_cli_sends_them() -> None:
    """The CLI merges Pulumi.yaml defaults into the config: booleans as "true"/"false", arrays
    as JSON, the empty secret defaults as plain "" (which must not count as a clear secret)."""
    config, secret_keys = stack_config("local")
    assert config[NS + "protectCaches"] == "false"
    assert config[NS + "alertThresholdsPct"] == "[50, 80, 100]"
    assert config[NS + "costOverheadPct"] == "0"
    assert config[NS + "hfToken"] == "" and NS + "hfToken" not in secret_keys
    run = run_program("local", config, secret_keys)
    assert not [s for s in run.of_type("modal:Secret") if s.inputs["name"] == "huggingface-token"]


def test_namespace_is_the_project_name() -> None:
    """Renaming the project in Pulumi.yaml renames the config namespace: keys follow it."""
    config, secret_keys = stack_config("dev")
    renamed = {k.replace(NS, "my-llms:", 1): v for k, v in config.items()}
    run = run_program("dev", renamed, secret_keys, project="my-llms")
    assert run.output("environment") == "dev"
    (token,) = run.of_type("modal:ProxyAuthToken")
    assert token.inputs["name"] == "my-llms-dev-gateway"


def test_spend_watch_token_reaches_only_the_watchers_secret() -> None:
    """Issue 14 item 7: `alertWatchToken` (`<id>:<secret>` of a viewer service user) lands in
    the `spend-watch` secret only; malformed values fail without echoing them."""
    from pulumi_standin.values import Secret as Plain

    token = "ak-watch0123:as-watchsecret0123"
    run = run_program("dev", *_with_secrets("dev", alertWatchToken=Plain(token)))
    (watch_secret,) = [
        s for s in run.of_type("modal:Secret") if s.inputs["name"] == SPEND_WATCH_SECRET_NAME
    ]
    assert _plain(watch_secret.inputs["values"]) == {
        SPEND_WEBHOOK_ENV: TEST_SECRETS[NS + "alertWebhookUrl"],
        "SPEND_WATCH_TOKEN_ID": "ak-watch0123",
        "SPEND_WATCH_TOKEN_SECRET": "as-watchsecret0123",
    }
    others = [r for r in run.resources if r.urn != watch_secret.urn]
    assert "as-watchsecret0123" not in json.dumps([r.inputs for r in others], default=str)
    for key, bad, expected in (
        ("alertWatchToken", "no-colon-secret", "must be '<token id>:<token secret>'"),
        ("alertWebhookUrl", "ftp://h/tok-123", "must be an http(s) URL"),
    ):
        with pytest.raises((pulumi.RunError, ValueError)) as info:
            run_program("dev", *_with_secrets("dev", **{key: Plain(bad)}))
        assert f"{key} {expected}" in str(info.value) and bad not in str(info.value)
