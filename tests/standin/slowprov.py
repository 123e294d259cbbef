"""A dynamic provider that takes its time, to check how the engine stand-in drives long calls
(the calls' deadlines and `customTimeouts`).

Served by the SDK's real dynamic-provider server like any provider of the project (an
importable module, so dill pickles it by reference). One input: `sleep`, the seconds Create and
Update sleep before answering.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult


class SlowProvider(ResourceProvider):
    type_token = "pulumi-python:dynamic/test:Slow"

    def create(self, props: dict[str, Any]) -> CreateResult:
        time.sleep(float(props.get("sleep") or 0))
        return CreateResult("s-" + uuid.uuid4().hex[:8], dict(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        time.sleep(float(news.get("sleep") or 0))
        return UpdateResult(dict(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class Slow(pulumi.dynamic.Resource, module="test", name="Slow"):
    """The resource a test program registers."""

    def __init__(
        self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(SlowProvider(), name, {"label": name, **props}, opts)
