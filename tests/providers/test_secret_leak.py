"""Secret-leak test: drive every secret-bearing resource through create, refresh, update,
replace, import, failure and delete, then scan everything an operator could see.

Scanned (tests/harness/provider_server.py `leak_surfaces`): outputs and checked inputs as the
engine keeps them, diff results, check failures, every error detail (tracebacks included), the
provider process's stdout/stderr, the decoded `__provider` blobs, the engine's stored state and
step log. Secrets: secret values, the proxy token secret, the webhook URL (with its token) and
the Modal token secret given as secret stack config. No `secret_outputs` are passed to the
harness here: the providers themselves must mark their secret outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from components.modal.secret import SecretProvider
from components.modal.spend_alert import SpendAlertProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    Engine,
    ProviderCallError,
    ProviderServer,
    Secret,
    iter_secret_strings,
    reveal,
    scan_for_leaks,
)
from tests.providers.helpers import Webhook, server_env

VALUE_1 = "sk-live-0123456789abcdef-first"
VALUE_2 = "sk-live-fedcba9876543210-second"
VALUE_3 = "hunter2-but-longer-value-3"


def test_no_secret_in_any_recorded_surface(emulator: EmulatorProcess, webhook: Webhook) -> None:
    env = {
        k: v
        for k, v in server_env(emulator).items()
        if k not in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
    }
    config = {
        "modal:tokenId": emulator.token_id,
        "modal:tokenSecret": Secret(emulator.token_secret),
    }
    assert emulator.token_secret
    secrets: list[str] = [VALUE_1, VALUE_2, VALUE_3, emulator.token_secret, webhook.url]
    secrets.append("hook-secret-123")
    with ProviderServer(env=env, config=config) as srv:
        eng = Engine(srv)
        sp, tp, bp = SecretProvider(), ProxyAuthTokenProvider(), SpendAlertProvider()

        def sec(name: str, **values: str) -> dict[str, object]:
            return {"name": name, "environment": "main", "values": Secret(values)}

        # Secret: create, refresh, update (a key removed), replace (rename), adopt, failure.
        eng.up("s", sp, sec("api-keys", A=VALUE_1, B=VALUE_2))
        eng.refresh("s")
        eng.preview("s", sp, sec("api-keys", A=VALUE_1, B=VALUE_2))
        eng.up("s", sp, sec("api-keys", A=VALUE_3))
        eng.up("s", sp, sec("api-keys-2", A=VALUE_3))
        sid = eng.states["s"].id
        adopted = Engine(srv)
        adopted.up("s-adopted", sp, {**sec("api-keys-2", A=VALUE_3), "adopt": True})
        assert adopted.states["s-adopted"].id == sid
        with pytest.raises(ProviderCallError):  # already exists: the values travel, not leak
            Engine(srv).up("dup", sp, sec("api-keys-2", A=VALUE_1))
        failures = srv.check(
            sp, {"name": "bad name", "environment": "main", "values": Secret({"1X": VALUE_2})}
        )
        assert failures.failures

        # ProxyAuthToken: secret output from creation, update, rotation (replace), refresh.
        eng.up("t", tp, {"name": "gw", "environments": ["main"], "rotation": ""})
        first = reveal(eng.states["t"].outputs["token_secret"])
        assert isinstance(eng.states["t"].outputs["token_secret"], Secret)  # marked by provider
        eng.up("t", tp, {"name": "gw-2", "environments": ["main"], "rotation": ""})
        eng.up("t", tp, {"name": "gw-2", "environments": ["main"], "rotation": "r2"})
        eng.refresh("t")
        second = reveal(eng.states["t"].outputs["token_secret"])
        secrets += [first, second]

        # SpendAlert over its thresholds (delivery is the spend watcher's: its webhook URL
        # travels only in a Secret, covered above; tests/providers/test_spend_watch.py checks
        # the watcher's logs and outputs).
        alert = {"environment": "main", "monthly_budget_usd": 10.0}
        eng.up("b", bp, alert)
        emulator.set_usage("main", 9)
        eng.refresh("b")
        eng.up("b", bp, alert)
        eng.up("b", bp, {**alert, "monthly_budget_usd": 20.0})

        for name in list(eng.states):
            eng.destroy(name)
        secrets += list(iter_secret_strings(config))

        surfaces = srv.leak_surfaces(eng)
        assert len(surfaces) > 20
        assert scan_for_leaks(surfaces, secrets) == []
        # The scan itself works: the requests (what the engine sends a provider that cannot
        # take secrets) do carry plaintext inputs.
        assert scan_for_leaks({"requests": srv.requests_text()}, [VALUE_1])


def test_bad_credentials_error_does_not_echo_the_token(emulator: EmulatorProcess) -> None:
    wrong = "as-this-is-a-wrong-token-secret-42"
    with ProviderServer(env=server_env(emulator, MODAL_TOKEN_SECRET=wrong)) as srv:
        with pytest.raises(ProviderCallError):
            srv.create(
                SecretProvider(),
                {"name": "x", "environment": "main", "values": Secret({"K": VALUE_1})},
            )
        assert scan_for_leaks(srv.leak_surfaces(), [wrong, VALUE_1]) == []


def test_scan_catches_a_leaky_provider() -> None:
    """Negative control: a provider that echoes a secret in an output and a log is caught."""
    from tests.providers.apps.leaky_provider import LeakyProvider

    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAL_")}
    with ProviderServer(env=env) as srv:
        eng = Engine(srv)
        eng.up("l", LeakyProvider(), {"password": Secret("pw-very-secret-987")})
        leaks = scan_for_leaks(srv.leak_surfaces(eng), ["pw-very-secret-987"])
        places = " ".join(leaks)
        assert "provider-logs" in places and "engine-state" in places and ":Create" in places


def test_app_deploy_failure_leaks_neither_extra_env_nor_token(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    """Review finding 20: an App whose deploy fails while printing a secret from `extra_env`
    and the Modal token secret (given only as secret stack config): the error and every
    other surface are scanned."""
    from components.modal.app import AppProvider
    from serving.spec import ServingSpec

    broken = tmp_path / "leaky_app.py"
    broken.write_text(
        "import os, sys\n"
        "import modal\n"
        "app = modal.App('leaky')\n"
        "print('boom', os.environ['LEAK_ME'], os.environ['MODAL_TOKEN_SECRET'], file=sys.stderr)\n"
        "os._exit(3)  # no result line: the provider quotes the stderr tail\n"
    )
    env = {
        k: v
        for k, v in server_env(emulator).items()
        if k not in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
    }
    config = {
        "modal:tokenId": emulator.token_id,
        "modal:tokenSecret": Secret(emulator.token_secret),
    }
    spec = ServingSpec.model_validate(
        {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": "q"}
    ).to_json()
    app = {
        "name": "leaky",
        "environment": "main",
        "app_file": str(broken),
        "spec_json": spec,
        "extra_env": Secret({"LEAK_ME": VALUE_1}),
    }
    with ProviderServer(env=env, config=config) as srv:
        eng = Engine(srv)
        with pytest.raises(ProviderCallError) as ei:
            eng.up("a", AppProvider(), app)
        msg = ei.value.details
        assert "deploy runner exited with 3" in msg and "boom [secret] [secret]" in msg
        surfaces = srv.leak_surfaces(eng)
        assert emulator.token_secret
        assert scan_for_leaks(surfaces, [VALUE_1, emulator.token_secret]) == []
