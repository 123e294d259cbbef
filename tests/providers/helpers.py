"""Helpers shared by the provider tests: a webhook receiver and RPC-count arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess

#: Faster backoff for tests: failures must still go through every retry.
RETRY_ENV = {
    "MODAL_PROVIDER_RETRY_ATTEMPTS": "4",
    "MODAL_PROVIDER_RETRY_BASE_DELAY": "0.1",
    "MODAL_PROVIDER_ATTEMPT_TIMEOUT": "1.0",
    "MODAL_GATE_PROGRESS_S": "1",  # a health gate's progress line every second (default 5)
}


def modal_python(emu: EmulatorProcess, code: str, *args: str) -> Any:
    """Run `python -c code args` as a separate modal client of `emu` (as an operator would);
    the JSON on its last stdout line."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def server_env(emu: EmulatorProcess, **extra: str) -> dict[str, str]:
    """Env of a provider server pointed at `emu` (as if MODAL_* were exported for pulumi)."""
    return emu.subprocess_env({**RETRY_ENV, **extra})


class Webhook:
    """Records JSON POST bodies; `status` is what it answers."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if hook.status < 300:
                    hook.bodies.append(json.loads(body))
                self.send_response(hook.status)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/alerts?token=hook-secret-123"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


#: RPCs that only read (an allowlist: anything else, e.g. AppDeploy/FunctionCreate/
#: AppHeartbeat or a method added later, counts as state-changing).
READ_ONLY_RPCS = frozenset(
    {
        "AppDeploymentHistory",
        "AppGetByDeploymentName",
        "AppGetLayout",
        "AppGetLifecycle",
        "AppGetTags",  # the release records a refresh reads (modal 1.6.4 App.get_tags)
        "AppList",
        "AuthTokenGet",
        "BlobGet",
        "ClassGet",
        "ClientHello",
        "EnvironmentGetBudget",
        "EnvironmentList",
        "FunctionGet",
        "FunctionGetById",
        "FunctionGetSchedulingParams",
        "MountBatchedCheckExistence",
        "SecretGetInfo",
        "SecretList",
        "TaskList",
        "VolumeGetById",
        # Also a create (CREATE_FAIL_IF_EXISTS, _rpc.volume_create), but the Volume provider's
        # read looks up by name with it (OBJECT_CREATION_TYPE_UNSPECIFIED, _rpc.volume_lookup),
        # which every `up` now does first (Pulumi.yaml `options: refresh: always`); the
        # emulator counts by method only, so a create it made shows in the objects and the
        # plan ("+ create"), not here.
        "VolumeGetOrCreate",
        "VolumeList",
        "WebhookTokenEnvironmentList",
        "WebhookTokenList",
        "WebhookTokenListForEnvironment",
        "WorkspaceNameLookup",
    }
)


def mutating_calls(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """RPCs (by method) made between two rpc_counts() snapshots that can change state.

    Calls made by running containers (counted as `container:<Method>`: their input polls,
    heartbeats, the app's own calls) are not the client's and are left out."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {
        k: v
        for k, v in delta.items()
        if v and not k.startswith("container:") and k.rsplit("/", 1)[-1] not in READ_ONLY_RPCS
    }


def rpc_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {k: v for k, v in delta.items() if v}
