"""Issue 34, findings 4 and 6: what a preview shows without secrets, and which model names
are checked.

4. A preview (`pulumi preview`, the stand-in's `preview`: `pulumi.runtime.is_dry_run()`) of a
   stack whose rules need a secret that is not set goes on with that secret unknown (one
   warning per secret, naming the `pulumi config set --secret` command); `up` still refuses,
   naming the same command.
6. A model name is checked where it can be: against the weights source the service provisions
   (config, offline), against the hub when it answers; otherwise the run says it is unchecked.
   No test waits on the network: the hub is a local server or a port that refuses at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.output import Unknown
from pulumi.runtime import rpc

from components.config import ConfigError, parse_stack_config
from tests.program.runner import PROJECT_ROOT, ProgramMocks, run_program, stack_config

NS = "modal-llm:"
SCRIPT = PROJECT_ROOT / "scripts" / "offline_stack.py"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHA = "a" * 40


def _inputs_only(typ: str, name: str, inputs: Any) -> dict[str, Any]:
    """A first preview: no provider has run, so every provider output is unknown."""
    return {k: v for k, v in inputs.items() if k != "__provider"}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _error(stack: str, config: dict[str, str], keys: list[str], *, preview: bool) -> str:
    with pytest.raises(pulumi.RunError) as info:
        run_program(stack, config, keys, mocks=ProgramMocks(_inputs_only), preview=preview)
    return str(info.value)


# ---- finding 4: previews without secrets ---------------------------------------------------


def test_prod_previews_without_its_hf_token(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refuses at once
    caplog.set_level(logging.WARNING)
    run = run_program("prod", *stack_config("prod"), mocks=ProgramMocks(_inputs_only), preview=True)
    # The costs, as with the token.
    assert run.output("monthly_cost_worst_usd") > run.output("monthly_cost_idle_usd") > 0
    # The token secret is planned as `up` will create it once the token is set, its value
    # Pulumi's unknown, still marked secret.
    (secret,) = [r for r in run.of_type("modal:Secret") if r.inputs["name"] == "huggingface-token"]
    value = secret.inputs["values"]
    assert rpc.is_rpc_secret(value) or rpc.is_rpc_secret(value["HF_TOKEN"])
    token = rpc.unwrap_rpc_secret(value)
    token = rpc.unwrap_rpc_secret(token["HF_TOKEN"] if isinstance(token, dict) else token)
    assert isinstance(token, Unknown) or token == rpc.UNKNOWN
    (app,) = run.of_type("modal:App")
    assert json.loads(app.inputs["spec_json"])["secrets"]["hf_token"] == "huggingface-token"
    # One warning for the one missing secret, naming the command that sets it.
    about = [w for w in _warnings(caplog) if "hfToken" in w]
    assert len(about) == 1, _warnings(caplog)
    assert "pulumi config set --secret modal-llm:hfToken hf_... --stack prod" in about[0]
    assert "unknown" in about[0] and "services[0].gated" in about[0]


def test_up_without_the_token_still_refuses_naming_the_command() -> None:
    message = _error("prod", *stack_config("prod"), preview=False)
    assert "modal-llm:services[0].gated is true" in message
    assert "pulumi config set --secret modal-llm:hfToken hf_... --stack prod" in message


def test_other_needed_secrets_are_unknown_in_a_preview(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Managed mode without proxyToken and an S3 weights source without its credentials."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    caplog.set_level(logging.WARNING)
    config, keys = stack_config("dev")
    services = json.loads(config[NS + "services"])
    services[0]["weights"] = {"kind": "s3", "bucket": "models", "prefix": "q/v1/", "revision": "v1"}
    config[NS + "services"] = json.dumps(services)
    config[NS + "managedByAccessStack"] = "true"
    run = run_program("dev", config, keys, mocks=ProgramMocks(_inputs_only), preview=True)
    assert not run.of_type("modal:ProxyAuthToken")  # the access stack's token: unknown
    assert isinstance(run.outputs["proxy_token_id"], Unknown)
    assert [r for r in run.of_type("modal:Secret") if r.inputs["name"].startswith("weights-")]
    warned = _warnings(caplog)
    for key in ("proxyToken", "weightsStoreCredentials"):
        (line,) = [w for w in warned if f"modal-llm:{key} is not set" in w]
        assert f"pulumi config set --secret modal-llm:{key}" in line and "--stack dev" in line
    message = _error("dev", config, keys, preview=False)
    assert "modal-llm:proxyToken" in message and "weightsStoreCredentials" in message


def test_a_real_config_error_still_fails_a_preview() -> None:
    config, keys = stack_config("prod")
    config[NS + "monthlyBudgetUsd"] = "-1"
    message = _error("prod", config, keys, preview=True)
    assert "monthlyBudgetUsd" in message
    assert "hfToken" not in message  # a preview does not need it: not an error there


def test_make_plan_prod_works_offline(tmp_path: Path) -> None:
    """What `make plan STACK=prod` runs, on a checkout with no secret set and no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODAL_SERVER_URL")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # refuses at once: the hub is not reachable
    cmd = [sys.executable, str(SCRIPT), "preview", "--stack", "prod"]
    proc = subprocess.run(
        [*cmd, "--state", str(tmp_path / "prod.json")],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "prod-hf-token" in proc.stdout and "monthly_cost_worst_usd   : 13809.94" in proc.stdout
    assert "pulumi config set --secret modal-llm:hfToken hf_... --stack prod" in proc.stderr
    assert "model name not checked: the hub was not reachable" in proc.stderr


# ---- finding 6: model names ----------------------------------------------------------------


def _smol(**entry: Any) -> dict[str, str]:
    service = {"name": "chat", "engine": "vllm", "model": SMOL, "gpu": "L4", **entry}
    return {"environment": "dev", "monthlyBudgetUsd": "5000", "services": json.dumps([service])}


def test_model_differing_from_its_provisioned_weights_is_refused() -> None:
    """The weights volume is filled from weights.repo: a model name that differs is a typo
    in one of them (the engine would load one model and report the other)."""
    typo = SMOL[:-1]
    values = _smol(model=typo, revision=SHA, weights={"kind": "hf", "repo": SMOL})
    with pytest.raises(ConfigError) as info:
        parse_stack_config(values, stack="dev")
    text = str(info.value)
    assert f"'{typo}'" in text and f"'{SMOL}'" in text and "services[0].model" in text
    parse_stack_config(_smol(revision=SHA, weights={"kind": "hf", "repo": SMOL}), stack="dev")
    parse_stack_config(_smol(revision=SHA, weights={"kind": "hf"}), stack="dev")


class _Hub:
    """The hub's model-info API (`GET /api/models/<repo>[/revision/<rev>]`) for a few repos,
    answering as huggingface.co does (`X-Error-Code: RepoNotFound` / `RevisionNotFound`, read
    by huggingface_hub 2.4.0 utils/_http.py hf_raise_for_status)."""

    def __init__(self, repos: dict[str, str]) -> None:
        self.repos = repos
        self.asked: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.asked.append(self.path)
                parts = self.path.split("?")[0].strip("/").split("/")
                repo = "/".join(parts[2:4])
                rev = parts[5] if len(parts) > 5 else None
                if repo not in hub.repos:
                    self._send(404, "RepoNotFound", {"error": "Repository not found"})
                elif rev is not None and rev != hub.repos[repo]:
                    self._send(404, "RevisionNotFound", {"error": "Invalid rev id"})
                else:
                    self._send(200, "", {"id": repo, "sha": hub.repos[repo]})

            def _send(self, status: int, code: str, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hub requests allowed: huggingface_hub reads HF_HUB_OFFLINE once, at import
    (constants.py), so an earlier test's setting may linger in this process."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hub]:
    fake = _Hub({SMOL: SHA})
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    _online(monkeypatch)
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def _local(
    model: str, revision: str | None = None, *, hf_token: bool = False
) -> tuple[dict[str, str], list[str]]:
    config, keys = stack_config("dev", {NS + "hfToken": {"secure": "x"}} if hf_token else None)
    services = json.loads(config[NS + "services"])
    services[0]["model"] = model
    if revision is not None:
        services[0]["revision"] = revision
    config[NS + "services"] = json.dumps(services)
    config[NS + "monthlyBudgetUsd"] = "5000"  # another model may be sized larger
    return config, keys


def test_a_model_the_hub_does_not_know_is_refused(hub: _Hub) -> None:
    typo = SMOL[:-1]
    for preview in (True, False):
        message = _error("dev", *_local(typo), preview=preview)
        assert f"'{typo}'" in message and hub.url in message
        assert "services[0].model" in message
    message = _error("dev", *_local(SMOL, "b" * 40), preview=False)
    assert "revision" in message and "b" * 40 in message
    run_program("dev", *_local(SMOL, SHA), mocks=ProgramMocks(_inputs_only), preview=True)
    assert any(SMOL in p for p in hub.asked)


def test_a_missing_repo_is_a_warning_where_the_stacks_token_may_see_it(
    hub: _Hub, caplog: pytest.LogCaptureFixture
) -> None:
    """A private repo answers "not found" to a machine whose token cannot read it; the stack's
    HF token may. A missing revision of a repo the hub shows is an error all the same."""
    caplog.set_level(logging.WARNING)
    typo = SMOL[:-1]
    run_program("dev", *_local(typo, hf_token=True))
    (line,) = [w for w in _warnings(caplog) if f"'{typo}'" in w]
    assert "is not on the Hugging Face hub" in line and "hfToken can read it" in line
    message = _error("dev", *_local(SMOL, "b" * 40, hf_token=True), preview=False)
    assert "revision" in message and "b" * 40 in message


def test_unreachable_hub_says_the_name_is_not_checked(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: refuses at once
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    _online(monkeypatch)
    caplog.set_level(logging.INFO)
    run_program("dev", *_local(SMOL[:-1]), mocks=ProgramMocks(_inputs_only), preview=True)
    lines = [r.getMessage() for r in caplog.records if "model name not checked" in r.getMessage()]
    assert len(lines) == 1 and "the hub was not reachable" in lines[0], lines
    assert "download" in lines[0]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    caplog.clear()
    run_program("dev", *_local(SMOL[:-1]), mocks=ProgramMocks(_inputs_only), preview=True)
    lines = [r.getMessage() for r in caplog.records if "model name not checked" in r.getMessage()]
    assert len(lines) == 1 and "HF_HUB_OFFLINE" in lines[0], lines
