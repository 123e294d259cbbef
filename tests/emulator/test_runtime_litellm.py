"""LiteLLM (a real gateway client library) reaches a deployed `@app.server` at its URL as
printed, with Modal's proxy-auth headers: no DNS, no hosts file, no rewriting.

LiteLLM lives in its own venv (`.venv/litellm`, as `make test` installs it); skipped without.

Kept (issue 33 item 7): the gateway (components/gateway.py) calls the printed URL with Modal's
proxy-auth headers; modal 1.6.4 modal/_partial_function.py `requires_proxy_auth` (Modal-Key /
Modal-Secret).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.emulator.runtime_support import deploy_server, proxy_token
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess

pytestmark = [pytest.mark.litellm]
LITELLM_PYTHON = PROJECT_ROOT / ".venv/litellm/bin/python"

CLIENT = """
import json, sys
import litellm
url, key, secret = sys.argv[1:4]
resp = litellm.completion(
    model="openai/rt",
    api_base=url + "/v1",
    api_key="unused-by-this-server",
    extra_headers={"Modal-Key": key, "Modal-Secret": secret},
    messages=[{"role": "user", "content": "ping through the edge"}],
)
print(json.dumps({"content": resp.choices[0].message.content}))
"""


def test_litellm_calls_the_printed_url(rt: EmulatorProcess) -> None:
    if not LITELLM_PYTHON.exists():
        pytest.skip("LiteLLM is not installed in .venv/litellm (make test installs it)")
    url, _ = deploy_server(rt)  # proxy auth on, as @app.server defaults to
    token = proxy_token()
    done = subprocess.run(
        [str(LITELLM_PYTHON), "-c", CLIENT, url, *token],
        capture_output=True,
        text=True,
        timeout=120,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert json.loads(last) == {"content": "echo: ping through the edge"}
    # without the proxy-auth headers the same call is refused at the edge (401)
    bad = subprocess.run(
        [str(LITELLM_PYTHON), "-c", CLIENT, url, token[0], "ws-" + "x" * 22],
        capture_output=True,
        text=True,
        timeout=120,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert bad.returncode != 0 and "invalid credentials for proxy authorization" in bad.stderr
