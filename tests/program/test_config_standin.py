"""`modal-llm:engineStandin`: the stand-in engine chosen in the stack config.

The local stack sets it; the program renders it into each service's spec (`engine_standin`),
which the App's `spec_json` input carries (so `pulumi preview --diff` shows it) and the
service reports as an output. Any stack whose Modal server is not local is refused, naming the
stack, the key and what to do.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from components.config import ConfigError, parse_stack_config
from serving import render
from serving.spec import ServingSpec
from tests.program.runner import run_program, stack_config

SERVICE = {
    "name": "tiny", "engine": "vllm", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "gpu": "T4",
}  # fmt: skip


def parse(url: str | None, *, standin: bool = True, **service: Any) -> Any:
    values = {
        "environment": "local",
        "services": json.dumps([{**SERVICE, **service}]),
        "monthlyBudgetUsd": "1000",  # one T4 with its CPU and memory: $707.27 at worst
        "engineStandin": "true" if standin else "false",
    }
    return parse_stack_config(values, stack="mine", modal_server_url=url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8790", "http://localhost:1234", "http://[::1]:9"]
)
def test_standin_on_a_local_modal_goes_into_every_spec(url: str) -> None:
    cfg = parse(url)
    assert cfg.engine_standin is True
    spec = cfg.services[0].spec
    assert spec.engine_standin is not None and spec.engine_standin.fail is None
    assert render.launch_command(spec, 8001)[:4] == [
        "python3",
        "-m",
        "standin_engine",
        "--",
    ]
    assert render.launch_command(spec, 8001)[4:] == render.engine_command(
        spec, 8001
    )  # the real line, checked


def test_a_service_can_tell_its_standin_to_fail() -> None:
    spec = parse("http://127.0.0.1:8790", engine_standin={"fail": "never-ready"}).services[0].spec
    assert spec.engine_standin is not None and spec.engine_standin.fail == "never-ready"


@pytest.mark.parametrize(
    "url",
    [None, "https://api.modal.com", "http://10.0.0.5:8790", "http://127.0.0.1:1,https://x.io"],
)
def test_standin_is_refused_where_the_modal_server_is_not_local(url: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        parse(url)
    text = str(info.value)
    assert "stack 'mine'" in text and "modal-llm:engineStandin is true" in text
    assert (url or "modal:serverUrl is not set") in text
    assert "pulumi config rm modal-llm:engineStandin --stack mine" in text


def test_a_service_standin_setting_without_the_stack_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"services\[0\]\.engine_standin is set, but the stack"):
        parse("http://127.0.0.1:8790", standin=False, engine_standin={"fail": "start"})
    assert parse(None, standin=False).services[0].spec.engine_standin is None  # real engine


def app_spec(run: Any) -> ServingSpec:
    [app] = run.of_type("modal:App")
    return ServingSpec.from_json(app.inputs["spec_json"])


def test_the_local_stack_deploys_the_standin_and_says_so() -> None:
    run = run_program("local", *stack_config("local"))
    spec = app_spec(run)
    assert spec.engine_standin is not None  # in the App's spec_json input: the preview shows it
    assert '"engine_standin":{' in run.of_type("modal:App")[0].inputs["spec_json"]
    assert run.output("services")["tiny"]["engine_standin"] is True


def test_the_other_stacks_deploy_the_real_engine() -> None:
    for stack in ("dev", "prod"):
        config, keys = stack_config(stack)
        assert config["modal-llm:engineStandin"] == "false"  # Pulumi.yaml's default
        if stack == "prod":
            config["modal-llm:hfToken"] = "hf_test"
            keys = [*keys, "modal-llm:hfToken"]
        spec = app_spec(run_program(stack, config, keys))
        assert spec.engine_standin is None
        assert "engine_standin" not in spec.to_json()  # unchanged spec, unchanged digest


def test_standin_on_a_stack_pointed_at_real_modal_fails_the_program() -> None:
    config, keys = stack_config("local", {"modal:serverUrl": "https://api.modal.com"})
    with pytest.raises(pulumi.RunError) as info:
        run_program("local", config, keys)
    text = str(info.value)
    assert "stack 'local'" in text and "https://api.modal.com" in text
    assert "pulumi config rm modal-llm:engineStandin --stack local" in text
