"""`Volume`: a named Modal Volume as a Pulumi resource (output `volume_id`, `vo-...`).

- Rename is an in-place update (`VolumeRename` keeps the id and the data).
- Environment change replaces (create-before-delete: the new volume exists first). Data is
  not copied. The provider never deletes except when the engine asks it to (destroy or a
  replacement the preview showed); protection/retention (`protect`, `retain_on_delete`) is
  the component's decision.
- Read (refresh/import by `vo-...` id): a deleted volume reads as gone; a rename behind
  Pulumi's back shows up as a changed `name` (the next `up` renames it back). Modal's volume
  metadata carries no environment, so read looks the live name up in the declared
  environment and fails unless that answers the same id: importing a volume into the wrong
  environment (whose next replace would delete it) is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from ._base import (
    IMPORT_HOWTO,
    ModalProvider,
    ModalProviderError,
    check_environment,
    check_name,
    environment_name,
    is_unknown,
)

TYPE_TOKEN = "pulumi-python:dynamic/modal:Volume"  # noqa: S105 (a Pulumi type token)


@dataclass
class VolumeArgs:
    """Inputs of a `Volume`."""

    name: pulumi.Input[str]
    environment: pulumi.Input[str]


class VolumeProvider(ModalProvider):
    kind = "Volume"
    type_token = TYPE_TOKEN

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, check_name(news, "name", "Volume") + check_environment(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        env = news.get("environment")
        replaces = ["environment"] if is_unknown(env) or olds.get("environment") != env else []
        renamed = is_unknown(news.get("name")) or olds.get("name") != news.get("name")
        return DiffResult(
            changes=bool(replaces) or renamed, replaces=replaces, delete_before_replace=False
        )

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        return f"'{props.get('name')}' in environment '{environment_name(props) or '<default>'}'"

    @staticmethod
    def _outputs(
        props: Mapping[str, Any], volume_id: str, name: str | None = None
    ) -> dict[str, Any]:
        return {
            "name": name if name is not None else props.get("name"),
            "environment": props.get("environment"),
            "volume_id": volume_id,
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        from modal import exception as mexc
        from modal_proto import api_pb2

        name, env = str(props["name"]), environment_name(props)

        async def go(client: Any) -> str:
            resp = await client._stub.VolumeGetOrCreate(
                api_pb2.VolumeGetOrCreateRequest(
                    deployment_name=name,
                    environment_name=env,
                    object_creation_type=api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS,
                    version=api_pb2.VOLUME_FS_VERSION_UNSPECIFIED,
                )
            )
            return str(resp.volume_id)

        volume_id = self.run(
            "create",
            self._target(props),
            go,
            hints={
                mexc.AlreadyExistsError: (
                    "A volume with this name already exists there: adopt it (and its data) with"
                    f" {IMPORT_HOWTO} (its vo-id: `modal volume list`), or choose another name."
                )
            },
            idempotent=False,
        )
        return CreateResult(volume_id, self._outputs(props, volume_id))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from modal_proto import api_pb2

        new_name = str(news["name"])

        async def go(client: Any) -> None:
            if olds.get("name") != new_name:
                await client._stub.VolumeRename(
                    api_pb2.VolumeRenameRequest(volume_id=id_, name=new_name)
                )

        self.run(f"rename to '{new_name}' of", f"{id_} ({self._target(olds)})", go)
        return UpdateResult(self._outputs(news, id_))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from modal import exception as mexc
        from modal_proto import api_pb2

        env = environment_name(props)

        async def go(client: Any) -> tuple[Any, str]:
            try:
                resp = await client._stub.VolumeGetById(api_pb2.VolumeGetByIdRequest(volume_id=id_))
            except mexc.NotFoundError:
                return None, ""
            try:  # is this id the volume of that name in the declared environment?
                found = await client._stub.VolumeGetOrCreate(
                    api_pb2.VolumeGetOrCreateRequest(
                        deployment_name=resp.metadata.name,
                        environment_name=env,
                        object_creation_type=api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED,
                    )
                )
            except mexc.NotFoundError:
                return resp, ""
            return resp, str(found.volume_id)

        resp, in_env = self.run("read", f"{id_} ({self._target(props)})", go)
        if resp is None:
            return ReadResult("", {})
        if in_env != id_:
            raise ModalProviderError(
                f"Volume {id_} ('{resp.metadata.name}'): read failed: it is not the volume of"
                f" that name in environment '{env or '<default>'}'"
                + (f" (that is {in_env})" if in_env else "")
                + ". Declare the environment the volume lives in (`modal volume list -e <env>`)"
                " and import again; a volume managed in the wrong environment would be deleted"
                " by its next replacement."
            )
        name = resp.metadata.name or props.get("name")
        outs = self._outputs(props, id_, name)
        return ReadResult(id_, outs, {"name": name, "environment": props.get("environment")})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from modal import exception as mexc
        from modal_proto import api_pb2

        async def go(client: Any) -> None:
            with contextlib.suppress(mexc.NotFoundError):
                await client._stub.VolumeDelete(api_pb2.VolumeDeleteRequest(volume_id=id_))

        self.run("delete", f"{id_} ({self._target(props)})", go)


class Volume(pulumi.dynamic.Resource, module="modal", name="Volume"):
    """A named Modal Volume. Output: `volume_id`."""

    name: pulumi.Output[str]
    environment: pulumi.Output[str]
    volume_id: pulumi.Output[str]

    def __init__(
        self, resource_name: str, args: VolumeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props: dict[str, Any] = {
            "name": args.name,
            "environment": args.environment,
            "volume_id": None,
        }
        super().__init__(VolumeProvider(), resource_name, props, opts)


__all__ = ["Volume", "VolumeArgs", "VolumeProvider"]
