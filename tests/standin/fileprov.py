"""A dynamic provider whose "cloud" is a directory, to watch the engine stand-in's step order.

Served by the SDK's real dynamic-provider server like any provider of the project (it lives in
an importable module, so dill pickles it by reference). Each object is `<dir>/<id>.json`;
every call appends "<method> <label> <id>" to `<dir>/log`; a file `<dir>/fail-<method>-<label>`
makes that call raise. Inputs: `dir`, `label`, anything else; `replace_on` lists the keys whose
change forces a replace, `dbr` asks for delete-before-replace, `token` comes back as a secret
output, `read_inputs=False` makes Read answer without inputs.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pulumi.dynamic import (
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)
from pulumi.runtime.rpc import wrap_rpc_secret


def _call(props: dict[str, Any], method: str, id_: str) -> Path:
    root = Path(props["dir"])
    with open(root / "log", "a") as fh:
        fh.write(f"{method} {props['label']} {id_}\n")
    if (root / f"fail-{method}-{props['label']}").exists():
        raise RuntimeError(f"{method} of {props['label']} failed (as the test asked)")
    return root


def _outs(props: dict[str, Any]) -> dict[str, Any]:
    outs = dict(props)
    if "token" in outs:
        outs["token"] = wrap_rpc_secret(outs["token"])
    return outs


class FileProvider(ResourceProvider):
    type_token = "pulumi-python:dynamic/test:File"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = {k for k in set(olds) | set(news) if k != "__provider"}
        changed = sorted(k for k in keys if olds.get(k) != news.get(k))
        replaces = [k for k in changed if k in (news.get("replace_on") or [])]
        return DiffResult(
            changes=bool(changed), replaces=replaces, delete_before_replace=bool(news.get("dbr"))
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        id_ = "f-" + uuid.uuid4().hex[:8]
        root = _call(props, "create", id_)
        (root / f"{id_}.json").write_text(json.dumps(props))
        return CreateResult(id_, _outs(props))

    def update(self, id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        root = _call(news, "update", id)
        (root / f"{id}.json").write_text(json.dumps(news))
        return UpdateResult(_outs(news))

    def delete(self, id: str, props: dict[str, Any]) -> None:
        root = _call(props, "delete", id)
        (root / f"{id}.json").unlink()

    def read(self, id: str, props: dict[str, Any]) -> ReadResult:
        root = _call(props, "read", id)
        path = root / f"{id}.json"
        if not path.exists():
            return ReadResult("", {})
        live = json.loads(path.read_text())
        if props.get("read_inputs") is False:
            return ReadResult(id, _outs(live))
        return ReadResult(id, _outs(live), live)
