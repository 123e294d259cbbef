"""End to end: the real program, every dynamic resource driven through the provider server into
the Modal emulator, in the order the Pulumi SDK registers them.

The mocks answer each registration by running the engine's steps for it (Check, then Diff
against the previous run's state, then Create/Update) through `python -m pulumi.dynamic` with
the `__provider` blob the program serialized, and hand the provider's real outputs back to the
program. The SDK registers a resource only once its inputs and `depends_on` resolved, so this is
dependency order, and dependents see real ids, names, digests and URLs.

Run for `local` as committed and for `dev` with its secrets: up -> the same program again
changes nothing (zero mutating RPCs) -> one serving setting changed updates only the App ->
one API key rotated replaces that key, updates the digest secret and redeploys the App (the
proxy reads keys at container start) -> destroy in reverse order leaves the emulator empty
(its `main` environment only, no app in any state: the App is stopped first, and goes with
its environment).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pulumi
import pytest
import yaml
from pulumi.runtime import rpc

from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderServer, Secret, reveal, scan_for_leaks
from tests.program.runner import (
    PROJECT,
    ProgramRun,
    run_program,
    stack_config,
    to_harness,
    to_program,
)
from tests.providers.helpers import mutating_calls, server_env

pytestmark = pytest.mark.slow
# local as committed; dev with the secrets a real dev stack sets (HF token, alert webhook).
CASES = {
    "local": ({}, 9, "tiny"),
    "dev": (
        {f"{PROJECT}:hfToken": {"secure": "x"}, f"{PROJECT}:alertWebhookUrl": {"secure": "x"}},
        12,  # + the spend watcher and its secret (a webhook is set)
        "qwen-small",
    ),
}


class ProviderMocks(pulumi.runtime.Mocks):
    """Mocks whose answers come from the real providers (through `Engine` + provider server)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lock = threading.Lock()  # the SDK registers from executor threads
        self.order: list[str] = []  # first registration order = creation order
        self.steps: dict[str, str] = {}
        self.types: dict[str, str] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        if not args.custom:
            return None, {}
        inputs = dict(args.inputs)
        blob = rpc.unwrap_rpc_secret(inputs.pop("__provider"))
        with self.lock:
            step = self.engine.up(args.name, blob, to_harness(inputs))
            self.steps[args.name] = step
            self.types[args.name] = args.typ
            if args.name not in self.order:
                self.order.append(args.name)
            state = self.engine.states[args.name]
            return state.id, to_program(state.outputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None

    def new_run(self) -> None:
        self.steps = {}


@dataclass
class Deployment:
    stack: str
    mocks: ProviderMocks
    config: dict[str, str]
    secret_keys: list[str]

    def up(self, config: dict[str, str] | None = None) -> ProgramRun:
        self.mocks.new_run()
        return run_program(self.stack, config or self.config, self.secret_keys, mocks=self.mocks)


@pytest.fixture(params=sorted(CASES))
def deployment(request: pytest.FixtureRequest, emulator: EmulatorProcess) -> Iterator[Deployment]:
    stack = request.param
    extra = {**CASES[stack][0], "modal:serverUrl": emulator.url}
    config, secret_keys = stack_config(stack, extra)
    server_config = {k: Secret(v) if k in secret_keys else v for k, v in config.items()}
    server = ProviderServer(
        env=server_env(emulator), config=server_config, project=PROJECT, stack=stack
    ).start()
    try:
        yield Deployment(stack, ProviderMocks(Engine(server)), config, secret_keys)
    finally:
        server.close()


def _modal_objects(emu: EmulatorProcess) -> dict[str, list[str]]:
    state = emu.state()
    return {
        "environments": sorted(e["name"] for e in state["environments"]),
        "secrets": sorted(s["name"] for s in state["secrets"]),
        "volumes": sorted(v["name"] for v in state["volumes"]),
        "apps": sorted(a["name"] for a in state["apps"] if a.get("state") != "stopped"),
        "stopped_apps": sorted(a["name"] for a in state["apps"] if a.get("state") == "stopped"),
    }


def test_up_noop_update_destroy(emulator: EmulatorProcess, deployment: Deployment) -> None:
    d, mocks = deployment, deployment.mocks
    _, count, svc = CASES[d.stack]
    env_name = d.config[f"{PROJECT}:environment"]
    engine = d.mocks.engine

    # ---- up: everything created, each after what it depends on -----------------------------
    run = d.up()
    custom = [r for r in run.resources if r.custom]
    assert set(mocks.steps.values()) == {"create"} and len(mocks.steps) == len(custom) == count
    position = {name: i for i, name in enumerate(mocks.order)}
    name_of = {r.urn: r.name for r in custom}
    for r in custom:
        for dep in r.dependencies:
            if dep in name_of:
                assert position[name_of[dep]] < position[r.name], f"{r.name} before {dep}"
    hf_secret = ["huggingface-token"] if d.stack == "dev" else []
    watch = ["spend-watch"] if d.stack == "dev" else []  # secret and app, when a webhook is set
    assert _modal_objects(emulator) == {
        "environments": sorted([env_name, "main"]),
        "secrets": sorted([f"{svc}-api-keys", *hf_secret, *watch]),
        "volumes": [f"{svc}-hf-cache", f"{svc}-vllm-cache"],
        "apps": sorted([svc, *watch]),
        "stopped_apps": [],
    }
    app_state = engine.states[f"{svc}-app"]
    assert run.output("endpoint_url") == app_state.outputs["web_url"]
    assert run.output("environment") == env_name
    gateway = yaml.safe_load(run.output("gateway_config"))["model_list"][0]["litellm_params"]
    token = engine.states[f"{env_name}-proxy-token"].outputs
    assert gateway["extra_headers"] == {
        "Modal-Key": token["token_id"],
        "Modal-Secret": reveal(token["token_secret"]),
    }
    assert gateway["api_base"] == app_state.outputs["web_url"] + "/v1"
    assert engine.states[f"{svc}-api-keys"].outputs["key_names"] == ["SERVING_API_KEYS"]
    first_keys = run.output("api_keys")

    # ---- the same program again: no change, no mutating RPC ---------------------------------
    before = emulator.rpc_counts()
    again = d.up()
    assert set(mocks.steps.values()) == {"same"}, mocks.steps
    assert mutating_calls(before, emulator.rpc_counts()) == {}
    assert again.output("api_keys") == first_keys
    assert again.output("gateway_config") == run.output("gateway_config")

    # ---- one serving setting changed: only the App updates ----------------------------------
    services = json.loads(d.config[f"{PROJECT}:services"])
    services[0]["scaling"]["scaledown_window_s"] = 90
    version = app_state.outputs["version"]
    changed_config = {**d.config, f"{PROJECT}:services": json.dumps(services)}
    d.up(changed_config)
    assert {n: s for n, s in mocks.steps.items() if s != "same"} == {f"{svc}-app": "update"}
    assert engine.states[f"{svc}-app"].outputs["version"] == version + 1
    assert engine.states[f"{svc}-app"].id == app_state.id

    # ---- one API key rotated: new key, new digests in Modal, the App redeployed -------------
    # (the serving proxy reads SERVING_API_KEYS at container start: without the redeploy a
    # warm container would keep accepting the revoked key)
    rotated = d.up({**changed_config, f"{PROJECT}:apiKeyRotation": json.dumps({"gateway": "r1"})})
    assert {n: s for n, s in mocks.steps.items() if s != "same"} == {
        f"{svc}-key-gateway": "replace",
        f"{svc}-api-keys": "update",
        f"{svc}-app": "update",
    }
    assert engine.states[f"{svc}-app"].outputs["version"] == version + 2
    new_keys = rotated.output("api_keys")
    assert new_keys["gateway"] != first_keys["gateway"]
    assert {k: v for k, v in new_keys.items() if k != "gateway"} == {
        k: v for k, v in first_keys.items() if k != "gateway"
    }
    first_keys = {**first_keys, **new_keys}

    # No secret in anything an operator sees (the state keeps them encrypted).
    secrets = [*first_keys.values(), run.output("api_keys")["gateway"]]
    secrets.append(reveal(token["token_secret"]))
    secrets += [d.config[k] for k in d.secret_keys]
    assert scan_for_leaks(engine.server.leak_surfaces(engine), secrets) == []

    # ---- destroy in reverse creation order: nothing left ------------------------------------
    for name in reversed(mocks.order):
        engine.destroy(name)
        if name == f"{svc}-app":  # the App's delete stops it (Modal keeps stopped apps)
            objects = _modal_objects(emulator)
            assert svc not in objects["apps"] and svc in objects["stopped_apps"]
    assert engine.states == {}
    assert _modal_objects(emulator) == {
        "environments": ["main"],
        "secrets": [],
        "volumes": [],
        "apps": [],
        "stopped_apps": [],  # deleting the environment took the stopped App with it
    }
