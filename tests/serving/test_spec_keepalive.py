"""The engine keeps idle connections longer than the proxy's pool does (issue 24).

The proxy drops an idle engine connection after its pool's idle lifetime; the engine's HTTP
server (uvicorn in both engines) drops it after its keep-alive timeout, 5 s by default. If the
engine's is the shorter, its close can race the proxy's next request on that connection, and
a pool kept shorter than 5 s to avoid that reopens hundreds of connections at once after any
pause (the TTFT tail measured on one H100: docs/gpu.md). So the spec sets the engine's
keep-alive above the proxy's lifetime, through the variable each engine reads.
"""

from __future__ import annotations

import inspect

import pytest

from serving import render
from serving.proxy.__main__ import build_parser
from serving.proxy.upstream import UpstreamClient
from serving.render import ENGINE_KEEPALIVE_ENV, ENGINE_KEEPALIVE_S
from tests.serving.test_spec import make

MARGIN_S = 10  # room for a request written just before the proxy's own expiry check


def proxy_pool_idle_s() -> float:
    """What the proxy started as the container starts it keeps idle engine connections for:
    its `--upstream-idle-s` default, or its pool's own default where it has no such flag."""
    for action in build_parser()._actions:
        if "--upstream-idle-s" in action.option_strings:
            return float(action.default)
    default = inspect.signature(UpstreamClient).parameters["idle_ttl_s"].default
    return float(default)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_keepalive_outlasts_the_proxy_pool(engine: str) -> None:
    env = render.engine_env(make(engine=engine))
    assert env[ENGINE_KEEPALIVE_ENV[engine]] == str(ENGINE_KEEPALIVE_S)
    assert int(env[ENGINE_KEEPALIVE_ENV[engine]]) >= proxy_pool_idle_s() + MARGIN_S


def test_keepalive_variables_are_each_engines_own() -> None:
    assert ENGINE_KEEPALIVE_ENV == {
        "vllm": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",  # vllm/envs.py (int seconds)
        "sglang": "SGLANG_TIMEOUT_KEEP_ALIVE",  # sglang/srt/environ.py (EnvInt)
    }
    env = render.engine_env(make(engine="vllm"))
    assert "SGLANG_TIMEOUT_KEEP_ALIVE" not in env
    assert "VLLM_HTTP_TIMEOUT_KEEP_ALIVE" not in render.engine_env(make(engine="sglang"))
