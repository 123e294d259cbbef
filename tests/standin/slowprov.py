"""A dynamic provider that takes its time, reports progress and fails on request, to check how
the engine stand-in drives long calls, shows what a provider prints, and reports its errors.

Served by the SDK's real dynamic-provider server like any provider of the project (an
importable module, so dill pickles it by reference). Inputs:
- `sleep`: seconds Create/Update sleep before answering;
- `progress`: lines reported while they wait, one every `sleep / len(progress)` seconds, each
  through `pulumi.log.info` (what the App's health gate uses: stderr in the provider process)
  and the last one also printed to stdout;
- `done`: a line printed to stdout just before the call answers;
- `fail_lines`: when set, Create/Update raise `SlowProviderError` with a first line and that
  many lines after it, `depth` frames deep (a long traceback).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult


class SlowProviderError(Exception):
    """What the test provider raises when asked to fail."""


def error_message(label: str, lines: int) -> str:
    """The message `SlowProviderError` carries: a first line, then `lines` numbered lines."""
    body = "\n".join(f"  detail {i:02d} of {label}: what the provider saw" for i in range(lines))
    return f"Slow '{label}': the release failed the health gate; rolled back to v3\n{body}"


def _deep(depth: int, message: str) -> None:
    if depth <= 0:
        raise SlowProviderError(message)
    _deep(depth - 1, message)


def _work(props: dict[str, Any]) -> None:
    progress = list(props.get("progress") or [])
    sleep = float(props.get("sleep") or 0)
    step = sleep / len(progress) if progress else sleep
    for i, line in enumerate(progress):
        pulumi.log.info(f"Slow '{props['label']}': {line}")
        if i == len(progress) - 1:
            print(f"stdout: {line}", flush=True)
        time.sleep(step)
    if not progress:
        time.sleep(sleep)
    if props.get("fail_lines"):
        lines = int(props["fail_lines"])
        _deep(int(props.get("depth") or 30), error_message(props["label"], lines))
    if props.get("done"):
        print(f"stdout: {props['done']}", flush=True)


class SlowProvider(ResourceProvider):
    type_token = "pulumi-python:dynamic/test:Slow"

    def create(self, props: dict[str, Any]) -> CreateResult:
        _work(props)
        return CreateResult("s-" + uuid.uuid4().hex[:8], dict(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        _work(news)
        return UpdateResult(dict(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class Slow(pulumi.dynamic.Resource, module="test", name="Slow"):
    """The resource a test program registers."""

    def __init__(
        self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(SlowProvider(), name, {"label": name, **props}, opts)
