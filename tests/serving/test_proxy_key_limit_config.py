"""Issue 32 item 14: a key's own in-flight limit comes from the stack config.

``services[i].proxy.key_max_in_flight: {NAME: N}`` in ``Pulumi.<stack>.yaml`` -> the spec's
``proxy.key_max_in_flight`` (serving/spec.py, what the container reads) -> the proxy's
command line ``--key-max-in-flight NAME=N`` (serving/engine.py ``proxy_command``) -> the
proxy's admission, which refuses that key's request over N (test_proxy_fairness.py, over
real HTTP; here the running proxy process too)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from components.config import ConfigError, parse_stack_config
from serving.proxy.__main__ import build_parser
from serving.render import proxy_command
from serving.spec import ServingSpec, SpecError
from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import ALICE, BOB
from tests.serving.test_proxy_fairness import assert_refused_naming, chat, hold_stream
from tests.serving.test_proxy_workers import ProxyProcess

SERVICE: dict[str, Any] = {
    "name": "tiny", "engine": "vllm", "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gpu": "T4", "scaling": {"min_containers": 0, "max_containers": 1},
}  # fmt: skip


def parse(service: dict[str, Any], keys: list[str]) -> Any:
    values = {
        "environment": "mine",
        "services": json.dumps([service]),
        "monthlyBudgetUsd": "100000",
        "apiKeyNames": json.dumps(keys),
    }
    return parse_stack_config(values, stack="mine")


def test_a_key_limit_in_the_stack_config_reaches_the_proxy_command_line() -> None:
    service = {**SERVICE, "proxy": {"max_in_flight": 64, "key_max_in_flight": {"ci": 8}}}
    spec = parse(service, ["gateway", "ci"]).services[0].spec
    assert spec.proxy.key_max_in_flight == {"ci": 8}
    # The container reads the spec from its JSON: the limit survives the round trip.
    assert ServingSpec.from_json(spec.to_json()).proxy.key_max_in_flight == {"ci": 8}
    cmd = proxy_command(spec, python="python3")
    assert cmd[cmd.index("--key-max-in-flight") + 1] == "ci=8"
    parsed = build_parser().parse_args(cmd[3:])  # the real proxy CLI takes it
    assert parsed.key_max_in_flight == [("ci", 8)] and parsed.max_in_flight == 64


def test_without_key_limits_the_spec_and_its_digest_are_unchanged() -> None:
    spec = parse(SERVICE, ["gateway"]).services[0].spec
    assert spec.proxy.key_max_in_flight is None
    assert "key_max_in_flight" not in spec.to_json()  # specs from before keep their digest
    assert "--key-max-in-flight" not in proxy_command(spec)


@pytest.mark.parametrize(
    ("limits", "expect"),
    [
        ({"nobody": 4}, "names key 'nobody', which is not in modal-llm:apiKeyNames"),
        ({"ci": 0}, "key_max_in_flight.ci = 0 must be a number >= 1"),
        ({"ci": 65}, "ci (65) is above proxy.max_in_flight (64)"),
    ],
)
def test_a_bad_key_limit_is_a_config_error_naming_it(limits: dict[str, int], expect: str) -> None:
    service = {**SERVICE, "proxy": {"max_in_flight": 64, "key_max_in_flight": limits}}
    with pytest.raises(ConfigError) as caught:
        parse(service, ["gateway", "ci"])
    assert expect in str(caught.value)
    assert "key_max_in_flight" in str(caught.value)


def test_the_spec_refuses_a_limit_that_is_no_key_name() -> None:
    base = json.loads(parse(SERVICE, ["gateway"]).services[0].spec.to_json())
    base["proxy"]["key_max_in_flight"] = {"not a name": 2}
    with pytest.raises(SpecError, match="is not an API key name"):
        ServingSpec.from_json(json.dumps(base))


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="--workers needs SO_REUSEPORT")
def test_the_proxy_process_honours_the_flag(tmp_path: Path, stub_engine: StubEngine) -> None:
    """``python -m serving.proxy --key-max-in-flight bob=1 --workers 2``: bob's second request
    is refused by whichever worker takes it, while alice still gets slots."""
    proxy = ProxyProcess(
        stub_engine.url, tmp_path / "proxy.log", "--workers", "2", "--max-in-flight", "4",
        "--key-max-in-flight", "bob=1",
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        proxy.wait_ready(2)
        held.append(hold_stream(proxy.port, BOB))
        for _ in range(4):  # over new connections: either worker
            refused = chat(proxy.port, BOB)
            assert_refused_naming(refused, "bob", BOB)
            assert refused.json()["error"]["code"] == "key_at_limit"
        assert chat(proxy.port, ALICE).status == 200
        started = [e for e in proxy.lines() if e.get("event") == "proxy_starting"]
        assert started[0]["key_max_in_flight"] == {"bob": 1}
    finally:
        for sock in held:
            sock.close()
        proxy.kill()
