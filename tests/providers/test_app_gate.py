"""App health gate (issue 11 items 1-4, issue 21) on the live local runtime.

The App provider deploys tests/providers/apps/gate_app.py (a serving-shaped `@app.server`:
`/ready`, `/v1/completions` checking API keys against the digests in a Modal secret) to the
emulator, which runs it behind its edge with Modal's proxy auth. The gate calls the endpoint
as a gateway does, with the proxy token and an API key; a release that fails to start or
never gets ready, crash-loops or answers the smoke request 5xx is rolled back (`AppRollback`)
to the last version that passed its gate, re-checked with the smoke request, and the update
fails naming the resource, the reason, the rollback and the container's log tail; a failed
create leaves nothing deployed; after a key rotation the gate's smoke request uses the NEW
key, and the old one is refused. The smoke request follows the model's task.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from components.modal import AppProvider, ProxyAuthTokenProvider, SecretProvider, VolumeProvider
from components.modal._decide import deployment_tag
from components.modal._source import source_digest
from serving.spec import ServingSpec
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, Secret, scan_for_leaks
from tests.providers.helpers import rpc_delta

APP = AppProvider()
KEYS_SECRET = "gate-keys"
GATE_TIMEOUT_S = 8.0  # short, yet long enough for a good release to pass on a busy machine
# A failing release waits the whole gate before the rollback: shorter still (the rollback's
# own wait for the previous version gets the same bound). The provider server reports
# progress every MODAL_GATE_PROGRESS_S = 1 s in tests (tests/providers/helpers.py).
BAD_GATE_TIMEOUT_S = 4.0
OLD_KEY, NEW_KEY = "sk-gate-old-0123456789abcdef", "sk-gate-new-fedcba9876543210"
MODEL = "gate-model"


def digests(*keys: str) -> str:
    return json.dumps(
        {f"k{i}": "sha256:" + hashlib.sha256(k.encode()).hexdigest() for i, k in enumerate(keys)}
    )


class TestApp:
    """tests/providers/apps/gate_app.py: a serving-shaped app of our own (no project code)."""

    app_file = "tests/providers/apps/gate_app.py"
    # What the failing release's error must show, per failure mode (reason or log line).
    evidence = {
        "start": "engine: CUDA out of memory while loading the model",
        "never-ready": "GET /ready answered 503",
        "smoke-5xx": "answered 500",
    }

    def spec(self, fail: str = "", message: str = "pong") -> str:
        return json.dumps(
            {"keys_secret": KEYS_SECRET, "fail": fail, "min_containers": 1, "message": message},
            sort_keys=True,
        )

    def prepare(self, engine: Engine) -> None:
        pass


class ServingApp(TestApp):
    """serving/app.py itself with the stand-in engine (told to fail start-up or never get
    ready by its spec); needs the emulator to run the serving container (the LIVE work)."""

    app_file = "serving/app.py"
    # serving/app.py waits for the engine inside @enter, so the container is not ready and a
    # rolling deploy keeps the previous version's container serving meanwhile.
    evidence = {
        "start": "stand-in engine: failing start-up on purpose",
        "never-ready": "1 container(s) of the version it replaces still serve; v2's are not ready",
    }

    def _spec(self, fail: str = "", message: str = "pong") -> ServingSpec:
        return ServingSpec.model_validate(
            {
                "engine": "vllm",
                "model": "Qwen/Qwen3-0.6B",
                "served_model_name": MODEL,
                "scaling": {"min_containers": 1, "max_containers": 1},
                "timeouts": {"startup_s": 60, "request_s": 30},
                "secrets": {"api_keys": KEYS_SECRET},
                "volumes": {"hf_cache": "gate-hf", "engine_cache": "gate-engine"},
                "engine_standin": {"fail": fail or None},
                "extra_args": ["--seed", str(len(message))],
            }
        )

    def spec(self, fail: str = "", message: str = "pong") -> str:
        return self._spec(fail, message).to_json()

    def prepare(self, engine: Engine) -> None:
        vols = self._spec().volumes
        for name in (vols.hf_cache, vols.engine_cache):
            engine.up(f"vol-{name}", VolumeProvider(), {"name": name, "environment": "main"})


KINDS = [pytest.param(TestApp(), id="test-app"), pytest.param(ServingApp(), id="serving-app")]


class Stack:
    """The proxy token and key secret a gated App needs, made with the real providers."""

    def __init__(self, engine: Engine, kind: TestApp, key: str = OLD_KEY) -> None:
        self.engine = engine
        self.kind = kind
        kind.prepare(engine)
        engine.up("token", ProxyAuthTokenProvider(), {"name": "gate-gw", "environments": ["main"]})
        out = engine.states["token"].outputs
        self.token_id = str(out["token_id"])
        secret = out["token_secret"]
        self.token_secret = str(secret.value if isinstance(secret, Secret) else secret)
        self.set_keys(key)

    def set_keys(self, *keys: str) -> None:
        values = Secret({"SERVING_API_KEYS": digests(*keys)})
        self.engine.up(
            "keys", SecretProvider(), {"name": KEYS_SECRET, "environment": "main", "values": values}
        )

    def app(self, key: str = OLD_KEY, gate: bool = True, **kw: Any) -> dict[str, Any]:
        return {
            "name": "gate",
            "environment": "main",
            "app_file": self.kind.app_file,
            "spec_json": self.kind.spec(),
            "extra_env": {"SERVING_API_KEYS_SHA256": hashlib.sha256(key.encode()).hexdigest()},
            "health_gate": gate,
            "health_gate_timeout_s": GATE_TIMEOUT_S,
            "gate_token_id": self.token_id,
            "gate_token_secret": Secret(self.token_secret),
            "gate_api_key": Secret(key),
            "gate_model": MODEL,
            **kw,
        }

    def call(self, url: str, path: str, key: str | None = None) -> int:
        headers = {"Modal-Key": self.token_id, "Modal-Secret": self.token_secret}
        body = None
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
            headers["Content-Type"] = "application/json"
            if path == "/v1/chat/completions":
                msg = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                body = json.dumps({**msg, "max_tokens": 1}).encode()
            else:
                body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
        req = urllib.request.Request(url + path, data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)


@pytest.fixture
def stack(engine: Engine) -> Stack:
    return Stack(engine, TestApp())


@pytest.fixture(params=KINDS)
def any_stack(engine: Engine, request: pytest.FixtureRequest) -> Stack:
    """The gated app: our test app, and the serving app itself."""
    return Stack(engine, request.param)


def release_tag(stack: Stack, inputs: dict[str, Any]) -> str:
    spec = hashlib.sha256(str(inputs["spec_json"]).encode()).hexdigest()
    src = source_digest(stack.kind.app_file, PROJECT_ROOT, spec_json=str(inputs["spec_json"]))
    return deployment_tag(spec, src)


def records(emu: EmulatorProcess, name: str = "gate") -> dict[str, str]:
    """The release records on the app (its tags), as the real client reads them
    (`modal.App.lookup(...).get_tags()`, modal 1.6.4)."""
    from tests.providers.helpers import modal_python

    code = (
        "import json, sys, modal\n"
        "app = modal.App.lookup(sys.argv[1], environment_name='main')\n"
        "print(json.dumps(app.get_tags()))"
    )
    return dict(modal_python(emu, code, name))


def live_apps(emu: EmulatorProcess) -> list[str]:
    return [a["id"] for a in emu.state()["apps"] if a.get("state") != "stopped"]


def wait_no_containers(emu: EmulatorProcess, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        live = [c for c in emu.containers() if c["state"] not in ("stopped", "failed")]
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.2)


def test_check_needs_what_the_gate_sends(stack: Stack) -> None:
    inputs = stack.app()
    for key in ("gate_token_id", "gate_token_secret", "gate_api_key"):
        inputs.pop(key)
    failures = stack.engine.server.check(APP, inputs).failures
    assert {f[0] for f in failures} == {"gate_token_id", "gate_token_secret", "gate_api_key"}
    bad = stack.engine.server.check(APP, stack.app(health_gate_timeout_s=0)).failures
    assert [f[0] for f in bad] == ["health_gate_timeout_s"]
    # Gate off: nothing else is needed (the pre-issue-11 inputs keep working).
    assert stack.engine.server.check(APP, stack.app(gate=False)).failures == []


def test_good_release_passes_the_gate_and_records_versions(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    assert engine.up("a", APP, stack.app()) == "create"
    out = engine.states["a"].outputs
    assert out["gate_result"].startswith("passed: v1"), out["gate_result"]
    assert 0 < out["gate_seconds"] < GATE_TIMEOUT_S
    assert (out["version"], out["previous_version"], out["known_good_version"]) == (1, 0, 1)
    assert out["rollback_command"] == ""
    # The deploy was tagged with what it ships (`modal deploy --tag`), modal recorded the git
    # commit, and the gate's outcome is recorded on the app (its tags), not only in state.
    tag = release_tag(stack, stack.app())
    assert out["deployment_tag"] == tag
    versions = [v for v in emulator.state()["app_versions"] if v["app_id"] == out["app_id"]]
    assert [v["tag"] for v in versions] == [tag]
    assert len(out["commit"]) == 40 and versions[0]["commit_hash"] == out["commit"]
    assert records(emulator) == {"llm-iac.gate.v1": "passed"}
    assert "chat completion" in out["gate_result"]
    # No gate input is an output: the secrets stay in the (secret) inputs only.
    assert not {"gate_token_secret", "gate_api_key"} & set(out)
    assert stack.call(out["web_url"], "/v1/completions", OLD_KEY) == 200

    update = stack.app(spec_json=stack.kind.spec(message="pong-2"))
    assert engine.up("a", APP, update) == "update"
    out = engine.states["a"].outputs
    assert (out["version"], out["previous_version"], out["known_good_version"]) == (2, 1, 2)
    assert out["gate_result"].startswith("passed: v2")
    assert out["rollback_command"] == "modal app rollback gate v1 -e main"
    assert records(emulator) == {
        "llm-iac.gate.v1": "passed",
        "llm-iac.gate.v2": "passed",
    }

    # The gate policy alone changes: recorded, no deploy.
    before = emulator.rpc_counts()
    assert engine.up("a", APP, {**update, "health_gate": False}) == "update"
    assert "AppPublish" not in rpc_delta(before, emulator.rpc_counts())
    assert engine.states["a"].outputs["version"] == 2
    engine.destroy("a")
    assert live_apps(emulator) == []


# Lean: our test app's never-ready (the port answers, so Modal routes users to it and the
# rollback must replace its containers) and the serving app's two failure modes (its @enter
# waits for the engine, so the previous version keeps serving meanwhile).
BAD_RELEASES = [
    pytest.param(TestApp(), "never-ready", id="test-app-never-ready"),
    pytest.param(TestApp(), "smoke-5xx", id="test-app-smoke-5xx"),
    pytest.param(ServingApp(), "start", id="serving-app-start"),
    pytest.param(ServingApp(), "never-ready", id="serving-app-never-ready"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fail"), BAD_RELEASES)
def test_bad_release_is_rolled_back_and_the_update_fails(
    engine: Engine, emulator: EmulatorProcess, kind: TestApp, fail: str
) -> None:
    stack = Stack(engine, kind)
    engine.up("a", APP, stack.app())
    good = engine.states["a"].outputs
    url = good["web_url"]

    with pytest.raises(ProviderCallError) as err:
        engine.up(
            "a",
            APP,
            stack.app(
                spec_json=stack.kind.spec(fail=fail), health_gate_timeout_s=BAD_GATE_TIMEOUT_S
            ),
        )
    details = err.value.details
    assert "App 'gate' in environment 'main': update failed: v2 (tag spec." in details
    assert "did not pass the health gate" in details
    assert stack.kind.evidence[fail] in details  # the reason, or the container's own log line
    # Back to the last known-good version, re-checked with the smoke request (not /ready).
    assert "Rolled back to v1 (last known good), live as v3, which answered a one-token chat" in (
        details
    )
    assert "The container's last log lines:" in details
    for secret in (stack.token_secret, OLD_KEY):
        assert secret not in details and secret not in engine.server.logs()
    # Progress was reported while it waited (pulumi.log.info from the provider).
    progress = [line for line in engine.server.logs().splitlines() if "health gate waiting" in line]
    assert progress and all("latest container log: " in line for line in progress)
    assert any(
        "App 'gate' in environment 'main': health gate waiting for v2" in p for p in progress
    )

    # The previous version answers again, and the state still describes it.
    assert stack.call(url, "/ready") == 200
    assert stack.call(url, "/v1/completions", OLD_KEY) == 200
    assert engine.states["a"].outputs["version"] == 1
    assert engine.states["a"].outputs["spec_json"] == stack.kind.spec()
    history = [v["version"] for v in emulator.state()["app_versions"]]
    assert history == [1, 2, 3]  # v3 = the rollback, published as a new version
    assert records(emulator) == {
        "llm-iac.gate.v1": "passed",
        "llm-iac.gate.v2": "failed",
        "llm-iac.gate.v3": "passed",
    }
    engine.destroy("a")
    # Neither the proxy token secret nor the API key shows anywhere the operator can see
    # (state, diffs, outputs, errors, provider logs), though the gate sent both.
    assert scan_for_leaks(engine.server.leak_surfaces(engine), [stack.token_secret, OLD_KEY]) == []


@pytest.mark.slow
def test_failed_create_leaves_nothing_deployed(stack: Stack, emulator: EmulatorProcess) -> None:
    with pytest.raises(ProviderCallError) as err:
        stack.engine.up(
            "a",
            APP,
            stack.app(
                spec_json=stack.kind.spec(fail="start"), health_gate_timeout_s=BAD_GATE_TIMEOUT_S
            ),
        )
    details = err.value.details
    assert "App 'gate' in environment 'main': create failed: v1" in details
    assert "nothing of this release is left serving" in details
    assert "engine: CUDA out of memory while loading the model" in details
    assert "a" not in stack.engine.states
    assert live_apps(emulator) == []
    assert wait_no_containers(emulator) == []


def test_rotation_takes_effect_within_the_same_up(
    any_stack: Stack, emulator: EmulatorProcess
) -> None:
    stack = any_stack
    engine = stack.engine
    engine.up("a", APP, stack.app())
    url = engine.states["a"].outputs["web_url"]
    assert stack.call(url, "/v1/completions", OLD_KEY) == 200
    assert stack.call(url, "/v1/completions", NEW_KEY) == 403

    # One `up`: the key secret is updated, then the App redeploys (the key-digest version in
    # its extra env changed) and the gate's smoke request uses the NEW key.
    stack.set_keys(NEW_KEY)
    assert engine.up("a", APP, stack.app(key=NEW_KEY)) == "update"
    out = engine.states["a"].outputs
    assert out["gate_result"].startswith("passed: v2")
    assert stack.call(url, "/v1/completions", OLD_KEY) == 403
    assert stack.call(url, "/v1/completions", NEW_KEY) == 200
    engine.destroy("a")


# ---- the policy (issue 11.3): config → App input, and what the preview says ----------------


def _stack(services: list[dict[str, Any]], standin: bool = False) -> Any:
    from components.config import parse_stack_config

    values = {"environment": "dev", "services": json.dumps(services), "monthlyBudgetUsd": "5000"}
    if standin:
        values["engineStandin"] = "true"
    url = "http://127.0.0.1:8790" if standin else None
    return parse_stack_config(values, stack="t", modal_server_url=url)


def _svc(min_containers: int, **kw: Any) -> dict[str, Any]:
    return {
        "name": "svc",
        "engine": "vllm",
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "gpu": "L4",
        "scaling": {"min_containers": min_containers, "max_containers": 1},
        "timeouts": {"startup_s": 900, "request_s": 600},
        **kw,
    }


def test_policy_auto_always_never() -> None:
    from components import config

    warm = _stack([_svc(1)]).services[0]
    assert (warm.health_gate, warm.gate_enabled) == ("auto", True)
    cold = _stack([_svc(0)]).services[0]
    assert not cold.gate_enabled
    # The preview note says why and what a gated deploy would cost (L4 price, 900 s + 300 s).
    assert (
        "scale-to-zero" in cold.gate_reason and f"${cold.gated_deploy_usd:.2f}" in cold.gate_reason
    )
    per_hour = cold.cost.container_usd_per_hour
    assert cold.gated_deploy_usd == pytest.approx(per_hour * (900 + 300) / 3600, abs=0.01)
    assert cold.gated_deploy_usd > 0 and warm.gated_deploy_usd == 0
    assert _stack([_svc(0)], standin=True).services[0].gate_enabled  # local stack
    assert _stack([_svc(0, health_gate="always")]).services[0].gate_enabled
    assert not _stack([_svc(1, health_gate="never")]).services[0].gate_enabled
    with pytest.raises(config.ConfigError, match=r"services\[0\]\.health_gate = 'sometimes'"):
        _stack([_svc(1, health_gate="sometimes")])
    # The task picks the gate's smoke request; an unknown one is refused with the key's path.
    assert _stack([_svc(1, task="embedding")]).services[0].task == "embedding"
    assert _stack([_svc(1)]).services[0].task == "chat"
    with pytest.raises(config.ConfigError, match=r"services\[0\]\.task = 'vision'"):
        _stack([_svc(1, task="vision")])


def test_committed_stacks_gate_prod_and_local_not_dev() -> None:
    import yaml

    from components.config import parse_stack_config

    gates = {}
    for stack in ("local", "dev", "prod"):
        raw = yaml.safe_load((PROJECT_ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
        values = {
            k.split(":", 1)[1]: v if isinstance(v, str) else json.dumps(v)
            for k, v in raw.items()
            if k.startswith("modal-llm:")
        }
        values = {
            k: ("true" if v is True else "false" if v is False else v) for k, v in values.items()
        }
        if stack == "prod":
            values["hfToken"] = "<secret>"
        cfg = parse_stack_config(values, stack=stack, modal_server_url=raw.get("modal:serverUrl"))
        gates[stack] = [(s.health_gate, s.gate_enabled) for s in cfg.services]
    assert gates == {
        "local": [("auto", True)],
        "dev": [("auto", False)],
        "prod": [("always", True)],
    }


@pytest.mark.parametrize(("stack", "gated"), [("dev", False), ("prod", True), ("local", True)])
def test_program_wires_the_gate_and_preview_says_when_it_is_off(
    stack: str, gated: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The real program under mocks: the App gets the policy, the bound (startup + request
    timeout) and what the gate sends, the secrets as secrets; a service that is not gated
    is named in the preview's log with what gating would cost."""
    import logging

    from pulumi.runtime import rpc

    from tests.program.runner import run_program, stack_config

    extra: dict[str, Any] = {}
    if stack != "local":
        extra = {"modal-llm:hfToken": {"secure": "x"}}
    config, secret_keys = stack_config(stack, extra)
    with caplog.at_level(logging.INFO):
        run = run_program(stack, config, secret_keys, preview=True)
    (app,) = run.of_type("modal:App")
    inputs = app.inputs
    assert inputs["health_gate"] is gated
    timeouts = {"dev": 900 + 600, "prod": 1800 + 600, "local": 600 + 120}[stack]
    assert inputs["health_gate_timeout_s"] == timeouts
    assert str(inputs["gate_token_id"]).startswith("wk-")
    for key in ("gate_token_secret", "gate_api_key"):
        assert rpc.is_rpc_secret(inputs[key]), key  # a secret input, never plain
    (svc,) = run.output("services").values()
    assert inputs["gate_model"] == svc["served_model_name"]
    assert inputs["gate_task"] == "chat"  # the default task: a chat model's smoke request
    assert svc["health_gate_enabled"] is gated
    notes = [
        r.getMessage() for r in caplog.records if "health_gate: auto, NOT gated" in r.getMessage()
    ]
    if gated:
        assert notes == []
    else:
        # dev: one L4 with 6 CPU cores and 12 GiB for its 900 s startup + 120 s scale-down
        gate_usd = (0.80 + 6 * 0.0000131 * 3600 + 12 * 0.00000222 * 3600) * (900 + 120) / 3600
        assert len(notes) == 1 and f"up to ${gate_usd:.2f}" in notes[0], notes  # $0.33
    # The preview also says when the engine release was never served on a GPU here (not on
    # the local stack, whose stand-in engine runs no release at all).
    parser_only = [
        r.getMessage() for r in caplog.records if "recorded parser only" in r.getMessage()
    ]
    assert len(parser_only) == (0 if stack == "local" else 1), parser_only
    if parser_only:
        assert "engine vllm 0.33.0" in parser_only[0] and "docs/gpu.md" in parser_only[0]


# ---- the smoke request follows the model's task (issue 21.7) --------------------------------


@pytest.mark.parametrize(
    ("task", "route", "words"),
    [
        ("completion", "/v1/completions", "a one-token completion"),
        ("embedding", "/v1/embeddings", "an embedding"),
    ],
)
def test_the_smoke_request_follows_the_task(
    stack: Stack, emulator: EmulatorProcess, task: str, route: str, words: str
) -> None:
    engine = stack.engine
    assert engine.up("a", APP, stack.app(gate_task=task)) == "create"
    out = engine.states["a"].outputs
    assert out["gate_result"].startswith(f"passed: v1 answered /ready and {words} in ")
    assert out["gate_task"] == task
    # The container's own access log (`modal app logs`): the gate's request took that route.
    import subprocess
    import sys

    logs = subprocess.run(
        [sys.executable, "-m", "modal", "app", "logs", "gate", "-e", "main"],
        env=emulator.subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    posted = [line for line in logs.splitlines() if '"POST /v1/' in line]
    assert posted and all(route in line for line in posted), logs[-2000:]
    engine.destroy("a")


def test_check_refuses_an_unknown_task(stack: Stack) -> None:
    failures = stack.engine.server.check(APP, stack.app(gate_task="vision")).failures
    assert [f[0] for f in failures] == ["gate_task"]


def test_custom_timeouts_bound_the_release() -> None:
    """Pulumi's customTimeouts (Go durations, as the engine parses them) become the App's
    `custom_timeouts` input in seconds; the gate gets half of the step's limit, the
    rollback's re-check the rest."""
    import pulumi

    from components.modal._decide import Policy, policy
    from components.modal.app import custom_timeouts_s, duration_s
    from components.modal.defaults import ROLLBACK_MARGIN_S

    assert duration_s("30m") == 1800 and duration_s("1h30m") == 5400 and duration_s("45s") == 45
    with pytest.raises(ValueError, match="not a duration"):
        duration_s("10 minutes")
    assert custom_timeouts_s(pulumi.CustomTimeouts(create="20m", update="1h")) == {
        "create": 1200.0,
        "update": 3600.0,
    }
    assert custom_timeouts_s(None) == {}

    def release(action: str, **props: Any) -> Policy:
        base = {"name": "gate", "environment": "main", "health_gate": True}
        digests = {"spec_digest": "a" * 64, "source_digest": "b" * 64}
        return policy({**base, **props}, action, digests)

    # The rollback (with its re-check of the known-good version) gets the fixed, printed
    # rollback margin, not the gate's budget again (issue 32 item 13)...
    plain = release("update", health_gate_timeout_s=720.0)
    assert (plain.gate_deadline, plain.rollback_margin) == (720.0, ROLLBACK_MARGIN_S)
    bounded = release("update", health_gate_timeout_s=720.0, custom_timeouts={"update": 600})
    assert (bounded.gate_deadline, bounded.rollback_margin) == (300.0, ROLLBACK_MARGIN_S)
    short = release("update", health_gate_timeout_s=4.0)
    assert (short.gate_deadline, short.rollback_margin) == (4.0, ROLLBACK_MARGIN_S)
    # ...unless customTimeouts bound the step tighter.
    tight = release("update", health_gate_timeout_s=4.0, custom_timeouts={"update": 40})
    assert (tight.gate_deadline, tight.rollback_margin) == (4.0, 15.0)
    # Only the step's own limit counts: a create limit does not bound an update.
    other = release("update", health_gate_timeout_s=720.0, custom_timeouts={"create": 60})
    assert other.gate_deadline == 720.0
