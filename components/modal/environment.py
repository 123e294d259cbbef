"""`Environment`: a Modal environment as a Pulumi resource (id and output `environment_id`).

- Create makes a new environment; with `adopt=True` an existing one of that name is taken
  over instead of failing (and created if missing). Create is transactional: if setting the
  web suffix fails (e.g. the suffix is taken), an environment created by this call is deleted
  again before the error is raised, so a rerun is not blocked by "already exists". An adopted
  environment is *released*, not deleted, on destroy: Pulumi did not create it (output
  `adopted` records this).
- `web_suffix` updates in place (`EnvironmentUpdate`); `None` means "leave Modal's value"
  (the live value is reported in the `web_suffix` output). A `name` change replaces: every
  Secret/Volume/App takes the environment *name* as input, and their environment change is a
  replace, which would collide with the objects an in-place rename had moved along.
- Delete refuses while apps are deployed in the environment, naming them, unless
  `force_delete=True` (Modal deletes everything scoped to an environment with it).
- Read (refresh/import by `en-...` id) looks the id up in `EnvironmentList`: missing → gone;
  a suffix changed behind Pulumi's back shows as drift.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from ._base import (
    IMPORT_HOWTO,
    ModalProvider,
    ModalProviderError,
    check_environment,
    is_unknown,
)

TYPE_TOKEN = "pulumi-python:dynamic/modal:Environment"  # noqa: S105 (a Pulumi type token)


@dataclass
class EnvironmentArgs:
    """Inputs of an `Environment`."""

    name: pulumi.Input[str]
    web_suffix: pulumi.Input[str] | None = None
    adopt: pulumi.Input[bool] = False
    force_delete: pulumi.Input[bool] = False


def _valid_suffix(value: str) -> bool:
    from modal._utils.name_utils import is_valid_subdomain_label

    return bool(value) and len(value) <= 32 and is_valid_subdomain_label(value)


class EnvironmentProvider(ModalProvider):
    kind = "Environment"
    type_token = TYPE_TOKEN

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_environment(news, "name")
        suffix = news.get("web_suffix")
        if (
            suffix is not None
            and not is_unknown(suffix)
            and not (isinstance(suffix, str) and _valid_suffix(suffix))
        ):
            failures.append(
                CheckFailure(
                    "web_suffix",
                    f"web suffix {suffix!r} is invalid: 1-32 lowercase letters, digits and inner"
                    " '-' (it becomes part of web URLs)",
                )
            )
        for flag in ("adopt", "force_delete"):
            v = news.get(flag)
            if v is not None and not is_unknown(v) and not isinstance(v, bool):
                failures.append(CheckFailure(flag, f"{flag} must be true or false"))
        news = dict(news)
        for flag in ("adopt", "force_delete"):
            if not is_unknown(news.get(flag)):
                news[flag] = bool(news.get(flag) or False)
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = (
            ["name"] if is_unknown(news.get("name")) or olds.get("name") != news.get("name") else []
        )
        changes = bool(replaces)
        suffix = news.get("web_suffix")
        if suffix is not None and (is_unknown(suffix) or suffix != olds.get("web_suffix")):
            changes = True
        for flag in ("adopt", "force_delete"):
            new = news.get(flag)
            if is_unknown(new) or bool(new or False) != bool(olds.get(flag) or False):
                changes = True
        return DiffResult(changes=changes, replaces=replaces, delete_before_replace=False)

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        return f"'{props.get('name')}'"

    @staticmethod
    async def _find(client: Any, field: str, value: str) -> Any:
        """The listed environment whose `field` ("name"/"environment_id") is `value`, or None."""
        from google.protobuf.empty_pb2 import Empty

        resp = await client._stub.EnvironmentList(Empty())
        for item in resp.items:
            if getattr(item, field) == value:
                return item
        return None

    @staticmethod
    def _outputs(props: Mapping[str, Any], item: Any, adopted: bool) -> dict[str, Any]:
        return {
            "name": item.name,
            "web_suffix": item.webhook_suffix,
            "adopt": bool(props.get("adopt") or False),
            "force_delete": bool(props.get("force_delete") or False),
            "environment_id": item.environment_id,
            "adopted": adopted,
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        from google.protobuf.wrappers_pb2 import StringValue
        from modal import exception as mexc
        from modal_proto import api_pb2

        name = str(props["name"])
        adopt = bool(props.get("adopt") or False)
        suffix = props.get("web_suffix")

        async def go(client: Any) -> tuple[Any, bool]:
            adopted = False
            existing = await self._find(client, "name", name) if adopt else None
            if existing is None:
                await client._stub.EnvironmentCreate(api_pb2.EnvironmentCreateRequest(name=name))
            else:
                adopted = True
            if suffix is not None:
                try:
                    await client._stub.EnvironmentUpdate(
                        api_pb2.EnvironmentUpdateRequest(
                            current_name=name, web_suffix=StringValue(value=suffix)
                        )
                    )
                except BaseException:
                    if not adopted:  # undo our own create; never delete an adopted env
                        with contextlib.suppress(Exception):
                            await client._stub.EnvironmentDelete(
                                api_pb2.EnvironmentDeleteRequest(name=name)
                            )
                    raise
            item = await self._find(client, "name", name)
            if item is None:
                raise mexc.NotFoundError(f"environment {name!r} vanished right after creation")
            return item, adopted

        item, adopted = self.run(
            "create",
            self._target(props),
            go,
            hints={
                mexc.AlreadyExistsError: (
                    "An environment with this name (or this web suffix) already exists: set"
                    " adopt=True to manage the existing environment, import it with"
                    f" {IMPORT_HOWTO} (its en-id: `modal environment list`), or pick another"
                    " name/suffix."
                )
            },
            idempotent=False,
        )
        return CreateResult(item.environment_id, self._outputs(props, item, adopted))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from google.protobuf.wrappers_pb2 import StringValue
        from modal import exception as mexc
        from modal_proto import api_pb2

        name = str(news["name"])
        suffix = news.get("web_suffix")

        async def go(client: Any) -> Any:
            if suffix is not None and suffix != olds.get("web_suffix"):
                await client._stub.EnvironmentUpdate(
                    api_pb2.EnvironmentUpdateRequest(
                        current_name=name, web_suffix=StringValue(value=suffix)
                    )
                )
            item = await self._find(client, "environment_id", id_)
            if item is None:
                raise mexc.NotFoundError(f"environment {id_} not found")
            return item

        item = self.run(
            "update",
            f"{self._target(news)} ({id_})",
            go,
            hints={
                mexc.AlreadyExistsError: (
                    "That web suffix is used by another environment: pick another."
                )
            },
        )
        return UpdateResult(self._outputs(news, item, bool(olds.get("adopted") or False)))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        async def go(client: Any) -> Any:
            return await self._find(client, "environment_id", id_)

        item = self.run("read", f"{id_} ({self._target(props)})", go)
        if item is None:
            return ReadResult("", {})
        adopted = bool(props.get("adopted") or False)
        outs = self._outputs(props, item, adopted)
        inputs: dict[str, Any] = {
            "name": item.name,
            "adopt": bool(props.get("adopt") or False),
            "force_delete": bool(props.get("force_delete") or False),
        }
        if props.get("web_suffix") is not None:
            inputs["web_suffix"] = item.webhook_suffix
        return ReadResult(id_, outs, inputs)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from modal import exception as mexc
        from modal_proto import api_pb2

        name = str(props.get("name"))
        force = bool(props.get("force_delete") or False)
        if props.get("adopted"):
            return  # released, not deleted: Pulumi adopted it, it did not create it

        async def go(client: Any) -> list[str]:
            item = await self._find(client, "environment_id", id_)
            if item is None:
                return []
            apps = await client._stub.AppList(api_pb2.AppListRequest(environment_name=item.name))
            deployed = [
                a.description or a.name or a.app_id
                for a in apps.apps
                if a.state == api_pb2.APP_STATE_DEPLOYED
            ]
            if deployed and not force:
                return deployed
            with contextlib.suppress(mexc.NotFoundError):
                await client._stub.EnvironmentDelete(
                    api_pb2.EnvironmentDeleteRequest(name=item.name)
                )
            return []

        blocking = self.run("delete", f"{self._target(props)} ({id_})", go)
        if blocking:
            raise ModalProviderError(
                f"Environment '{name}' ({id_}): delete refused: apps are still deployed in it:"
                f" {', '.join(sorted(blocking))}. Stop them first (`modal app stop <name> -e"
                f" {name}`, or destroy their App resources), or set force_delete=True to delete"
                " the environment with everything in it."
            )


class Environment(pulumi.dynamic.Resource, module="modal", name="Environment"):
    """A Modal environment. Outputs: `environment_id`, `web_suffix` (live), `adopted`."""

    name: pulumi.Output[str]
    web_suffix: pulumi.Output[str]
    adopt: pulumi.Output[bool]
    force_delete: pulumi.Output[bool]
    environment_id: pulumi.Output[str]
    adopted: pulumi.Output[bool]

    def __init__(
        self, resource_name: str, args: EnvironmentArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props: dict[str, Any] = {
            "name": args.name,
            "web_suffix": args.web_suffix,
            "adopt": args.adopt,
            "force_delete": args.force_delete,
            "environment_id": None,
            "adopted": None,
        }
        super().__init__(EnvironmentProvider(), resource_name, props, opts)


__all__ = ["Environment", "EnvironmentArgs", "EnvironmentProvider"]
