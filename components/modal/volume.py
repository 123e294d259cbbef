"""`Volume`: a named Modal Volume as a Pulumi resource (output `volume_id`, `vo-...`).

- Rename is an in-place update (`VolumeRename` keeps the id and the data).
- Environment change replaces (create-before-delete: the new volume exists first). Data is
  not copied. The provider never deletes except when the engine asks it to (destroy or a
  replacement the preview showed); protection/retention (`protect`, `retain_on_delete`) is
  the component's decision.
- Create sends `VolumeGetOrCreate(CREATE_FAIL_IF_EXISTS)` with one idempotency key for all
  attempts (see `_rpc`); "already exists" answered to a retry of a create that was sent is
  the volume it made. An existing volume of that name is refused unless `adopt=True`: then
  it is claimed with its data (`adopted` recorded) and destroy leaves it in place.
- A create whose answer was lost (issue 32 item 10: engine, emulator or network killed after
  Modal made the volume) is taken as this resource's own by the next create: a volume carries
  no tag or label (modal_proto 1.6.4 `VolumeGetOrCreateRequest`: name, environment, creation
  type, app id, version, create options; no file API in the emulator for a marker file), so
  before the create a *pending record* is written (`_rpc.pending_begin`: a secret named after
  the resource's `owner` mark, in the volume's environment) and dropped once the create
  answered. A volume of that name created at or after a pending record of THIS resource that
  names it is the one that create made (same id, deleted on destroy); any other is a
  stranger's and refused as before. An environment's delete removes the volumes its stack's
  pending records name (see Environment).
- Read (refresh by `vo-...` id): a deleted volume reads as gone; a rename behind Pulumi's
  back shows up as a changed `name` (the next `up` renames it back). Modal's volume metadata
  carries no environment, so read looks the live name up in the declared environment. When
  that environment no longer exists (renamed out of band), the environments are searched
  for this id and the one holding it is reported as drift (like Secret). When the declared
  environment exists but holds another volume of that name (or none), read fails: managing
  the volume under the wrong environment would delete it at its next replacement.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import (
    ADOPT_HOWTO,
    ModalProvider,
    ModalProviderError,
    environment_name,
    environment_problems,
    object_name,
    owner_of,
)
from ._schema import Schema, SchemaResource, flag, output, owner, replaces, updates


class VolumeArgs(Schema):
    """Inputs of a `Volume` (keywords), then what it outputs."""

    name: pulumi.Input[str] = updates(check=object_name("Volume"))  # a rename keeps the data
    environment: pulumi.Input[str] = replaces(check=environment_problems)
    adopt: pulumi.Input[bool] = flag(default=False)
    owner: str = owner()
    volume_id: str = output()
    adopted: bool = output()


class VolumeProvider(ModalProvider):
    SCHEMA = VolumeArgs.SCHEMA

    def create(self, props: dict[str, Any]) -> CreateResult:
        from modal import exception as mexc

        args = VolumeArgs.from_props(props)
        name, env, adopt = str(args.name), environment_name(props), bool(args.adopt)
        owner = args.owner or ""
        memo: dict[str, Any] = {"key": _rpc.idempotency_key()}  # one key for every attempt

        async def go(client: Any) -> tuple[str, bool]:
            if owner and "pending" not in memo:
                existing = await _rpc.volume_lookup(client, name, env)
                if existing is not None and await _claimed(client, owner, env, name, existing):
                    await _rpc.pending_end(client, owner, env)
                    return existing, False  # our own lost create: deleted on destroy
                if existing is None:
                    await _rpc.pending_begin(client, owner, env, PENDING_KIND, name)
                    memo["pending"] = True
            if adopt:
                existing = await _rpc.volume_lookup(client, name, env)
                if existing is not None:
                    await _rpc.pending_end(client, owner, env)
                    return existing, True  # claimed with its data
            try:
                volume_id = await _rpc.create_once(
                    memo,
                    lambda: _rpc.volume_create(client, name, env, memo["key"]),
                    lambda: _rpc.volume_lookup(client, name, env),
                )
            except mexc.AlreadyExistsError:  # a stranger's, made since we looked: no record
                await _rpc.pending_end(client, owner, env)
                raise
            await _rpc.pending_end(client, owner, env)
            return volume_id, False

        volume_id, adopted = self.run(
            "create",
            self._target(props),
            go,
            hints={
                mexc.AlreadyExistsError: (
                    "A volume with this name already exists there and it is not this"
                    " resource's (no pending create of this resource names it): take it over"
                    " with its data"
                    f" ({ADOPT_HOWTO}; the serving stack: `adopt: true` on the service), delete"
                    " it (`modal volume delete`), or choose another name."
                )
            },
            idempotent=False,
            keyed=True,
            resumable=bool(owner),
        )
        return CreateResult(
            volume_id, self.SCHEMA.outputs(props, volume_id=volume_id, adopted=adopted)
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        new_name = str(news["name"])

        async def go(client: Any) -> None:
            if olds.get("name") != new_name:
                await _rpc.volume_rename(client, id_, new_name)

        self.run(f"rename to '{new_name}' of", f"{id_} ({self._target(olds)})", go)
        return UpdateResult(self.SCHEMA.outputs(news, olds, volume_id=id_))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        env = environment_name(props)

        async def go(client: Any) -> tuple[Any, str, str | None]:
            """(volume, id of that name in the declared env, live env if it moved)."""
            resp = await _rpc.volume_get(client, id_)
            if resp is None:
                return None, "", None
            in_env = await _rpc.volume_lookup(client, resp.metadata.name, env)
            if in_env is not None or not env:
                return resp, in_env or "", None
            if await _rpc.environment_find(client, "name", env) is not None:
                return resp, "", None  # the environment exists but does not hold it
            # The declared environment is gone (e.g. renamed out of band): where is it now?
            for item in await _rpc.environment_list(client):
                with contextlib.suppress(mexc.NotFoundError):
                    if any(vid == id_ for _, vid in await _rpc.volume_list(client, item.name)):
                        return resp, id_, item.name
            return resp, "", None

        from modal import exception as mexc

        resp, in_env, moved_to = self.run("read", f"{id_} ({self._target(props)})", go)
        if resp is None:
            return ReadResult("", {})
        if in_env != id_:
            raise ModalProviderError(
                f"Volume {id_} ('{resp.metadata.name}'): read failed: it is not the volume of"
                f" that name in environment '{env or '<default>'}'"
                + (f" (that is {in_env})" if in_env else "")
                + ". Declare the environment the volume lives in (`modal volume list -e <env>`);"
                " a volume managed in the wrong environment would be deleted by its next"
                " replacement."
            )
        live = {
            **props,
            "name": resp.metadata.name or props.get("name"),
            "environment": moved_to if moved_to is not None else props.get("environment"),
        }
        outs = self.SCHEMA.outputs(live, props, volume_id=id_)
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        if props.get("adopted"):
            return  # released, not deleted: it existed before Pulumi adopted it

        owner = owner_of(props)
        env = environment_name(props)

        async def go(client: Any) -> None:
            await _rpc.volume_delete(client, id_)  # already gone: deleting is done
            # a record an interrupted create left (gone env: nothing to drop)
            await _rpc.pending_end(client, owner, env)

        self.run("delete", f"{id_} ({self._target(props)})", go)


#: The pending record's name for a volume (`_rpc.pending_begin`).
PENDING_KIND = "volume"


async def _claimed(client: Any, owner: str, env: str, name: str, volume_id: str) -> bool:
    """A pending record of this resource names this volume, made at or after the record
    (`VolumeGetById` metadata.creation_info.created_at)."""
    resp = await _rpc.volume_get(client, volume_id)
    if resp is None:
        return False
    pending = await _rpc.pending_get(client, owner, env)
    created = float(resp.metadata.creation_info.created_at)
    return _rpc.pending_claims(pending, PENDING_KIND, name, created)


class Volume(SchemaResource[VolumeArgs], module="modal", name="Volume"):
    """A named Modal Volume. Outputs: every field of `VolumeArgs` (`volume_id`, ...)."""

    PROVIDER = VolumeProvider


__all__ = ["Volume", "VolumeArgs", "VolumeProvider"]
