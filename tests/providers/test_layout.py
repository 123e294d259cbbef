"""Issue 9 item 4: the provider library stands alone and keeps its raw RPCs in one module."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.emulator import PROJECT_ROOT

MODULES = [
    "components.modal",
    "components.modal._base",
    "components.modal._rpc",
    "components.modal._deploy_runner",
    "components.modal.app",
    "components.modal.environment",
    "components.modal.environment_role",
    "components.modal.proxy_auth_token",
    "components.modal.secret",
    "components.modal.service_user",
    "components.modal.spend_alert",
    "components.modal.volume",
]


def test_components_modal_imports_nothing_from_serving() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'serving' or m.startswith('serving.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_raw_rpcs_only_in_the_rpc_module() -> None:
    """Each resource file holds its lifecycle only: no `client._stub.<Rpc>(...)` call outside
    components/modal/_rpc.py."""
    offenders = []
    for path in sorted((PROJECT_ROOT / "components" / "modal").glob("*.py")):
        if path.name == "_rpc.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "._stub." in line:
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []
