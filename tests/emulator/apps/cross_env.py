"""An app a `dev` contributor deploys to try to reach `prod` (tests/emulator/test_32_boundaries.py).

XE_APP names the app; XE_SECRET_ID / XE_VOLUME_ID, when set, attach another environment's
Secret and Volume by object id (what the attacker knows from a listing or a log), the way the
modal client sends any attached object: its id in FunctionCreate (`secret_ids`,
`volume_mounts`). No project code.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

import modal
from modal_proto import api_pb2

app = modal.App(os.environ.get("XE_APP", "xe"), image=modal.Image.debian_slim())

_secret_id = os.environ.get("XE_SECRET_ID", "")
_volume_id = os.environ.get("XE_VOLUME_ID", "")


# Handles made from the bare ids, no lookup (a lookup by name or id would be checked on its
# own): the client then sends the ids as they are in FunctionCreate.
def _hydrated(cls: Any, object_id: str, metadata: Any) -> Any:
    return cls._new_hydrated(object_id, modal.Client.from_env(), metadata, skip_reload=True)


_secrets = [_hydrated(modal.Secret, _secret_id, None)] if _secret_id else []
_volumes: dict[str | PurePosixPath, modal.Volume | modal.CloudBucketMount] = (
    {"/stolen": _hydrated(modal.Volume, _volume_id, api_pb2.VolumeMetadata(name="stolen"))}
    if _volume_id
    else {}
)


@app.function(secrets=_secrets, volumes=_volumes)
def leak() -> dict[str, str]:
    """What the attached Secret and Volume expose inside the container."""
    out = {"DB_PASS": os.environ.get("DB_PASS", "<unset>")}
    if os.path.isdir("/stolen"):
        with open("/stolen/owned.txt", "a") as f:
            f.write("written from dev\n")
        out["volume"] = "written"
    return out


@app.function()
def escalate(prod_env: str) -> dict[str, str]:
    """The container's own client (no token in the container: it authenticates as the
    container) tries workspace management and another environment's objects."""
    results: dict[str, str] = {}

    def attempt(what: str, fn: Any) -> None:
        try:
            value = fn()
            results[what] = f"ALLOWED: {value!r}"[:200]
        except Exception as exc:  # what the emulator answered
            results[what] = f"refused: {type(exc).__name__}: {exc}"[:300]

    ws = modal.Workspace.from_context()
    attempt(
        "create service user", lambda: ws.service_users.create("xe-evil", expires_in=None).token_id
    )
    attempt(
        "list prod secrets",
        lambda: [s.name for s in modal.Secret.objects.list(environment_name=prod_env)],
    )
    attempt("create environment", lambda: modal.Environment.objects.create("xe-env"))
    attempt("own environment's secrets", lambda: [s.name for s in modal.Secret.objects.list()])
    return results


@app.function()
def shout(word: str) -> str:
    print(f"XE-LOG {word}", flush=True)
    return word


@app.function()
def peek(paths: list[str]) -> dict[str, str]:
    """Whether each host path can be read from inside the container."""
    out: dict[str, str] = {}
    for path in paths:
        try:
            if os.path.isdir(path):
                out[path] = "dir: " + ",".join(sorted(os.listdir(path)))[:200]
            else:
                with open(path, "rb") as f:
                    data = f.read(4096)
                sqlite = " (SQLite)" if data.startswith(b"SQLite format 3") else ""
                out[path] = f"read {len(data)} bytes{sqlite}"
        except OSError as exc:
            out[path] = f"refused: {type(exc).__name__}"
    return out
